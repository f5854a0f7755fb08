// NCCL shim internals: error mapping and bookkeeping, argument checks, and the per-thread group
// queue with its execution at the outermost ncclGroupEnd. See shim.hpp and docs/nccl-compat.md.
#include <cstring>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>
#include <new>
#include <ringfence/env.hpp>
#include <ringfence/error.hpp>
#include <string_view>
#include <thread>

#include "../comm/arg_checks.hpp"
#include "cuda_runtime.hpp"
#include "shim.hpp"

namespace ringfence::nccl {
namespace {

// This thread's last failure (ncclGetLastError(NULL)).
thread_local std::string t_last_error;

LogLevel level_from_env() noexcept {
  try {
    const Environment env = Environment::from_process();
    if (auto v = env.get("RINGFENCE_LOG"))
      if (auto l = parse_log_level(*v)) return *l;
    if (auto v = env.get("NCCL_DEBUG")) {
      std::string s = *v;
      std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
      if (s == "INFO") return LogLevel::Info;
      if (s == "TRACE") return LogLevel::Trace;
    }
  } catch (...) {
  }
  return LogLevel::Warn;
}

// ---- group state (per thread, like NCCL's) ----
struct GroupState {
  int depth = 0;
  std::vector<PendingInit> inits;
  std::vector<PendingOp> ops;
  ncclResult_t error = ncclSuccess;  // first argument error raised inside the group
};
thread_local GroupState t_group;

// What a task of ncclGroupEnd ended with: its code and the failure it recorded on its thread.
struct Outcome {
  ncclResult_t code = ncclSuccess;
  std::string message;
};

// Runs `tasks` concurrently (one thread each) when there are several, inline when one. A
// worker thread first makes the GPU of task i's communicator current (`comms[i]->device`, as its
// caller had it at init; a null communicator or -1 leaves it): what a communicator builds there
// (its transports, the device lane of stream-ordered calls) belongs to that GPU. When that fails
// for a device the runtime reported at init (`device_checked`: the GPU is gone since), the task
// does not run: it ends with ncclUnhandledCudaError naming the GPU, and a pending init records
// it as its failure. (A ncclCommInitAll devlist entry is not checked: those communicators stage
// through host memory, and without a runtime any list is accepted.) Inline, the caller's device
// stays.
std::vector<Outcome> run_all(const std::vector<std::function<ncclResult_t()>>& tasks, const std::vector<ncclComm*>& comms) {
  std::vector<Outcome> out(tasks.size());
  auto one = [&](std::size_t i) {
    out[i].code = tasks[i]();
    if (out[i].code != ncclSuccess) out[i].message = t_last_error;  // the worker's thread-local
  };
  if (tasks.size() == 1) {
    one(0);
    return out;
  }
  std::vector<std::thread> threads;
  threads.reserve(tasks.size());
  for (std::size_t i = 0; i < tasks.size(); ++i)
    threads.emplace_back([&, i] {
      ncclComm* c = i < comms.size() ? comms[i] : nullptr;
      if (c != nullptr && c->device >= 0) {
        const ncclResult_t code = guarded("ncclGroupEnd", c, [&] {
          const std::string why = set_current_device(c->device);
          if (why.empty() || !c->device_checked) return ncclSuccess;
          return fail("ncclGroupEnd", c, ncclUnhandledCudaError,
                      fmt::format("rank {}: cannot make GPU {} (the communicator's device) current on the group's worker thread: {}",
                                  c->rank, c->device, why));
        });
        if (code != ncclSuccess) {
          if (!c->comm && c->init_error == ncclSuccess) c->init_error = code;  // a pending init or split
          out[i].code = code;
          out[i].message = t_last_error;
          return;
        }
      }
      one(i);
    });
  for (auto& t : threads) t.join();
  return out;
}

// The queued operations of one communicator: collectives in issue order, then every transfer as
// one ringfence group (which completes any pattern without deadlock).
ncclResult_t run_ops(ncclComm& comm, const std::vector<PendingOp*>& ops) {
  for (PendingOp* op : ops) {
    if (op->kind != PendingOp::Kind::Collective) continue;
    const ncclResult_t r = guarded(op->call, &comm, [&] {
      op->run(live(op->call, comm));
      return ncclSuccess;
    });
    if (r != ncclSuccess) return r;
  }
  const bool any_p2p = std::any_of(ops.begin(), ops.end(), [](const PendingOp* op) { return op->kind != PendingOp::Kind::Collective; });
  if (!any_p2p) return ncclSuccess;
  return guarded("ncclGroupEnd", &comm, [&] {
    Communicator& c = live("ncclGroupEnd", comm);
    c.group_start();
    try {
      for (PendingOp* op : ops) {
        if (op->kind == PendingOp::Kind::Collective) continue;
        const bool is_send = op->kind == PendingOp::Kind::Send;
        transfer(c, is_send, is_send ? const_cast<void*>(op->send) : op->recv, op->count, op->type, op->peer, op->staged, op->stream);
      }
    } catch (...) {
      try {
        c.group_end();  // leave the group; the transfers queued so far are dropped or fail
      } catch (...) {
      }
      throw;
    }
    c.group_end();
    return ncclSuccess;
  });
}

}  // namespace

ncclResult_t result_of(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::Ok: return ncclSuccess;
    case ErrorCode::InProgress: return ncclInProgress;
    case ErrorCode::InvalidUsage: return ncclInvalidUsage;
    case ErrorCode::System:
    case ErrorCode::Ibv: return ncclSystemError;
    case ErrorCode::Cuda: return ncclUnhandledCudaError;
    case ErrorCode::Transient:
    case ErrorCode::Timeout:
    case ErrorCode::PeerUnreachable:
    case ErrorCode::Fenced: return ncclRemoteError;
    case ErrorCode::Aborted: return ncclInvalidUsage;
    case ErrorCode::Fatal: return ncclInternalError;
  }
  return ncclInternalError;
}

Logger logger(int rank) noexcept {
  static const LogLevel level = level_from_env();
  return Logger(level, rank);
}

ncclResult_t fail(const char* call, ncclComm* comm, ncclResult_t code, const std::string& reason) noexcept {
  try {
    std::string message = fmt::format("{}: {} ({})", call, reason, ncclGetErrorString(code));
    logger(comm != nullptr ? comm->rank : -1).warn("nccl shim: {}", message);
    if (comm != nullptr && comm->magic == ncclComm::kMagic) {
      std::lock_guard lock(comm->mutex);
      comm->last_error = message;
    }
    t_last_error = std::move(message);
  } catch (...) {  // out of memory while reporting: the code still goes back
  }
  return code;
}

ncclResult_t guarded(const char* call, ncclComm* comm, const std::function<ncclResult_t()>& body) noexcept {
  try {
    return body();
  } catch (const ShimError& e) {
    return fail(call, comm, e.code(), e.what());
  } catch (const Error& e) {
    return fail(call, comm, result_of(e.code()), fmt::format("ringfence {} error: {}", to_string(e.code()), e.what()));
  } catch (const std::bad_alloc&) {
    return fail(call, comm, ncclSystemError, "out of memory");
  } catch (const std::exception& e) {
    return fail(call, comm, ncclInternalError, e.what());
  } catch (...) {
    return fail(call, comm, ncclInternalError, "unknown exception");
  }
}

const char* last_error_of(ncclComm* comm) noexcept {
  // Copied into a thread-local buffer: the communicator's string may change on another thread.
  thread_local std::string copy;
  try {
    if (comm != nullptr && comm->magic == ncclComm::kMagic) {
      std::lock_guard lock(comm->mutex);
      copy = comm->last_error;
    } else {
      copy = t_last_error;
    }
  } catch (...) {
    return "";
  }
  return copy.c_str();
}

ncclComm& check_comm(const char* call, ncclComm_t comm) {
  (void)call;
  if (comm == nullptr) throw ShimError(ncclInvalidArgument, "comm is NULL");
  if (comm->magic != ncclComm::kMagic)
    throw ShimError(ncclInvalidArgument, fmt::format("comm {} is not a live communicator (destroyed?)", static_cast<void*>(comm)));
  return *comm;
}

ncclComm& check_usable(const char* call, ncclComm_t comm) {
  ncclComm& c = check_comm(call, comm);
  if (c.finalized) throw ShimError(ncclInvalidUsage, fmt::format("rank {}: the communicator was finalized (ncclCommFinalize)", c.rank));
  if (!c.comm && !init_pending(&c)) {
    if (c.init_error != ncclSuccess)
      throw ShimError(c.init_error, fmt::format("rank {}: the communicator's init failed ({})", c.rank, ncclGetErrorString(c.init_error)));
    throw ShimError(ncclInvalidUsage, fmt::format("rank {}: the communicator is not initialised (its ncclGroupEnd has not run)", c.rank));
  }
  return c;
}

Communicator& live(const char* call, ncclComm& comm) {
  (void)call;
  if (comm.comm) return *comm.comm;
  if (comm.init_error != ncclSuccess)
    throw ShimError(comm.init_error, fmt::format("rank {}: the communicator's init failed ({})", comm.rank, ncclGetErrorString(comm.init_error)));
  throw ShimError(ncclInvalidUsage, fmt::format("rank {}: the communicator is not initialised", comm.rank));
}

DataType data_type(const char* call, const ncclDataType_t& datatype) {
  (void)call;
  // A C caller may pass any int; in C++ a value outside the enum's range is undefined behaviour
  // to load as ncclDataType_t (UBSan: "load of value 99"), so read the bytes as an int.
  int type = 0;
  static_assert(sizeof type == sizeof datatype);
  std::memcpy(&type, &datatype, sizeof type);
  switch (type) {
    case ncclInt8: return DataType::Int8;
    case ncclUint8: return DataType::Uint8;
    case ncclInt32: return DataType::Int32;
    case ncclUint32: return DataType::Uint32;
    case ncclInt64: return DataType::Int64;
    case ncclUint64: return DataType::Uint64;
    case ncclFloat16: return DataType::Float16;
    case ncclFloat32: return DataType::Float32;
    case ncclFloat64: return DataType::Float64;
    case ncclBfloat16: return DataType::BFloat16;
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      throw ShimError(ncclInvalidUsage, fmt::format("datatype {} (float8) is not supported by the ringfence shim", type));
    default: break;
  }
  throw ShimError(ncclInvalidArgument, fmt::format("invalid datatype {}", type));
}

ReduceOp reduce_op(const char* call, ncclRedOp_t op) {
  (void)call;
  switch (op) {
    case ncclSum: return ReduceOp::Sum;
    case ncclProd: return ReduceOp::Prod;
    case ncclMax: return ReduceOp::Max;
    case ncclMin: return ReduceOp::Min;
    case ncclAvg: return ReduceOp::Avg;
    default: break;
  }
  throw ShimError(ncclInvalidArgument,
                  fmt::format("invalid reduction op {} (the shim creates no custom ops: ncclRedOpCreatePreMulSum is not supported)",
                              static_cast<int>(op)));
}

std::size_t bytes_of(const char* call, const char* what, std::size_t count, DataType type) {
  (void)call;
  // The communicator's own rule (arg_checks.hpp), as ncclInvalidArgument.
  const std::optional<std::size_t> bytes = ringfence::detail::checked_bytes(count, type);
  if (!bytes) throw ShimError(ncclInvalidArgument, fmt::format("{} {} overflows the address space", what, count));
  return *bytes;
}

bool check_buffer(const char* call, const ncclComm& comm, const char* what, const void* ptr, std::size_t bytes) {
  (void)call;
  if (ptr == nullptr) {
    if (bytes > 0) throw ShimError(ncclInvalidArgument, fmt::format("rank {}: {} is NULL with {} bytes to move", comm.rank, what, bytes));
    return false;
  }
  return pointer_kind(ptr) != PointerKind::Host;
}

void transfer(Communicator& c, bool is_send, void* buf, std::size_t count, DataType type, int peer, bool staged, CudaStream stream) {
  if (is_send) {
    staged ? c.send(buf, count, type, peer, stream) : c.send(buf, count, type, peer);
  } else {
    staged ? c.recv(buf, count, type, peer, stream) : c.recv(buf, count, type, peer);
  }
}

void check_rank_arg(const char* call, const ncclComm& comm, const char* what, int value) {
  (void)call;
  if (comm.size <= 0) return;  // a split queued in this group: ringfence checks it when it runs
  if (value < 0 || value >= comm.size)
    throw ShimError(ncclInvalidArgument, fmt::format("rank {}: {} {} is out of range [0, {})", comm.rank, what, value, comm.size));
}

// ---- groups ----

bool in_group() noexcept { return t_group.depth > 0; }
void enqueue(PendingOp op) { t_group.ops.push_back(std::move(op)); }
void enqueue(PendingInit init) { t_group.inits.push_back(std::move(init)); }
bool init_pending(const ncclComm* comm) noexcept {
  return std::any_of(t_group.inits.begin(), t_group.inits.end(), [comm](const PendingInit& i) { return i.created == comm; });
}
void note_group_error(ncclResult_t code) noexcept {
  if (t_group.depth > 0 && t_group.error == ncclSuccess) t_group.error = code;
}

ncclResult_t group_start() noexcept {
  ++t_group.depth;
  return ncclSuccess;
}

ncclResult_t group_end() noexcept {
  if (t_group.depth == 0) return fail("ncclGroupEnd", nullptr, ncclInvalidUsage, "ncclGroupEnd without a matching ncclGroupStart");
  if (--t_group.depth > 0) return ncclSuccess;
  GroupState g = std::move(t_group);
  t_group = GroupState{};
  Outcome first;  // the first failure, reported to this thread's ncclGetLastError too
  auto keep = [&first](const std::vector<Outcome>& outcomes) {
    for (const Outcome& o : outcomes)
      if (first.code == ncclSuccess && o.code != ncclSuccess) first = o;
  };
  const ncclResult_t r = guarded("ncclGroupEnd", nullptr, [&] {
    // 1. Communicator creations, side by side (ranks of one communicator in one thread): first
    //    the inits, then the splits (whose parents may be among those inits).
    for (const bool splits : {false, true}) {
      std::vector<std::function<ncclResult_t()>> tasks;
      std::vector<ncclComm*> comms;
      for (PendingInit& p : g.inits) {
        if (p.from_parent != splits) continue;
        comms.push_back(p.created);
        tasks.emplace_back([&p] {
          const ncclResult_t code = guarded(p.call, p.report, [&] {
            p.make();
            return ncclSuccess;
          });
          if (code != ncclSuccess && p.created != nullptr) p.created->init_error = code;
          return code;
        });
      }
      if (!tasks.empty()) keep(run_all(tasks, comms));
    }
    // 2. An argument error inside the group drops its operations (as NCCL does).
    if (g.error != ncclSuccess) {
      if (!g.ops.empty())
        logger().warn("nccl shim: ncclGroupEnd: {} queued operation(s) dropped after an argument error in the group", g.ops.size());
      return g.error;
    }
    // 3. Operations per communicator, communicators side by side.
    std::vector<ncclComm*> comms;
    std::map<ncclComm*, std::vector<PendingOp*>> by_comm;
    for (PendingOp& op : g.ops) {
      auto [it, fresh] = by_comm.try_emplace(op.comm);
      if (fresh) comms.push_back(op.comm);
      it->second.push_back(&op);
    }
    std::vector<std::function<ncclResult_t()>> tasks;
    for (ncclComm* c : comms) tasks.emplace_back([c, &ops = by_comm.at(c)] { return run_ops(*c, ops); });
    if (!tasks.empty()) keep(run_all(tasks, comms));
    return first.code;
  });
  if (r != ncclSuccess && first.code != ncclSuccess && !first.message.empty()) t_last_error = first.message;
  return r;
}

}  // namespace ringfence::nccl
