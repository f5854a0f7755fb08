// NCCL shim: versions, errors, unique ids, communicator life cycle and queries, memory.
// See docs/nccl-compat.md for every entry point's status.
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <ringfence/env.hpp>
#include <ringfence/error.hpp>
#include <ringfence/transports/cuda_ipc.hpp>
#include <ringfence/transports/tcp.hpp>
#include <ringfence/version.hpp>
#include <set>
#include <thread>

#include "../env_nccl.hpp"
#include "cuda_runtime.hpp"
#include "shim.hpp"

namespace rf = ringfence;
using rf::nccl::ShimError;
using rf::nccl::check_comm;
using rf::nccl::fail;
using rf::nccl::guarded;

namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(rf::UniqueId::bytes), "ncclUniqueId and ringfence::UniqueId differ in size");

constexpr std::size_t kMemAlignment = 4096;  // NCCL_WIN_REQUIRED_ALIGNMENT

// Stores hosted by this process for the ids it made (ncclGetUniqueId), until a communicator of
// this process made from the id takes ownership (then they live as long as it and its children).
std::mutex g_hosted_mutex;
std::map<rf::JobToken, std::shared_ptr<rf::TcpStoreServer>> g_hosted;

// ncclMemAlloc's allocations (ncclMemFree refuses other pointers).
std::mutex g_alloc_mutex;
std::set<void*> g_allocations;

std::shared_ptr<rf::TcpStoreServer> take_hosted(const rf::JobToken& token) {
  std::lock_guard lock(g_hosted_mutex);
  auto it = g_hosted.find(token);
  if (it == g_hosted.end()) return nullptr;
  auto server = std::move(it->second);
  g_hosted.erase(it);
  return server;
}

// The address other hosts reach this one at: RINGFENCE_SOCKET_IFNAME, else NCCL_SOCKET_IFNAME
// (same syntax; env_options put it in the tcp settings), else the first up non-loopback IPv4
// interface, else loopback.
std::string bootstrap_address(const rf::CommOptions& options) {
  const std::string filter_text = rf::transports::tcp::Options::from(&options).interfaces;
  const auto filter = rf::transports::tcp::parse_interface_filter(filter_text);
  const auto chosen = rf::transports::tcp::choose_interface(rf::transports::tcp::host_interfaces(), filter);
  if (!chosen)
    throw ShimError(ncclSystemError, fmt::format("no up IPv4 interface matches '{}' (RINGFENCE_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)", filter_text));
  return chosen->address;
}

rf::UniqueId decode_id(const ncclUniqueId& id) {
  rf::UniqueId u;
  std::memcpy(u.bytes.data(), id.internal, u.bytes.size());
  std::string host;
  try {
    host = u.host();
  } catch (const rf::Error&) {
    throw ShimError(ncclInvalidArgument, "commId was not made by ncclGetUniqueId of the ringfence shim (bad magic)");
  }
  if (host.empty() || u.port() == 0) throw ShimError(ncclInvalidArgument, "commId names no store address");
  return u;
}

rf::TransportRegistry shim_transports() {
  rf::TransportRegistry r = rf::builtin_transports();
  r.add(std::string(rf::transports::cuda_ipc::kNvlinkName), rf::transports::cuda_ipc::make_nvlink_transport);
  r.add(std::string(rf::transports::cuda_ipc::kPcieName), rf::transports::cuda_ipc::make_pcie_transport);
  return r;
}

// Options from the environment: RINGFENCE_* first, then the NCCL_* variables that map onto them
// (docs/nccl-compat.md). Rank 0 (`log_rank`; -1 logs nothing) says once per communicator which
// NCCL variables took effect (info) and which were ignored (warn). A malformed value is an
// invalid argument.
rf::CommOptions env_options(int log_rank) {
  try {
    const rf::Environment env = rf::Environment::from_process();
    rf::CommOptions options = rf::CommOptions::from_env(env);
    const rf::TransportRegistry transports = shim_transports();
    const rf::NcclEnvironmentReport report = rf::apply_nccl_environment(env, options, transports.names());
    if (log_rank == 0) {
      const rf::Logger log = rf::make_logger(options.log_level, 0, options.log_file, options.log_timestamps);
      for (const auto& line : report.applied) log.info("nccl shim: {}", line);
      for (const auto& line : report.ignored) log.warn("nccl shim: {}", line);
      rf::warn_unknown_variables(log, env, transports.setting_variables(), "nccl shim: ");
    }
    return options;
  } catch (const rf::InvalidUsage& e) {
    throw ShimError(ncclInvalidArgument, fmt::format("bad environment: {}", e.what()));
  }
}

void check_config(const ncclConfig_t* config) {
  if (config == nullptr) return;
  if (config->magic != 0xcafebeef)
    throw ShimError(ncclInvalidArgument, "config was not initialised with NCCL_CONFIG_INITIALIZER (bad magic)");
  // blocking=0 is accepted: calls still complete before they return (ncclSuccess, never
  // ncclInProgress). The other fields tune NCCL's GPU kernels and have no meaning here.
}

// The transports of a communicator ncclCommInitRank* makes: shm and tcp, which the host lanes
// take (shm reaches every rank of the host first), then nvlink and pcie, which only the device
// lane picks: with them, collectives on device buffers run on device regions (docs/device.md)
// where every rank can, else they stage through pinned host memory as before.
// ncclCommInitAll keeps the built-in ones (staged): its ranks share one process and one calling
// thread, and the device lane's first call waits for every rank's answer, which a thread that
// issues the ranks' calls one after another outside a group would never let come.

// Creates a communicator of `nranks` through the store named by `id` (queued when in a group).
ncclResult_t init_rank(const char* call, ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank, const ncclConfig_t* config) {
  return guarded(call, nullptr, [&] {
    if (out == nullptr) throw ShimError(ncclInvalidArgument, "comm (the output pointer) is NULL");
    *out = nullptr;
    if (nranks < 1) throw ShimError(ncclInvalidArgument, fmt::format("nranks {} is less than 1", nranks));
    if (rank < 0 || rank >= nranks) throw ShimError(ncclInvalidArgument, fmt::format("rank {} is out of range [0, {})", rank, nranks));
    check_config(config);
    const rf::UniqueId uid = decode_id(id);
    auto c = std::make_unique<ncclComm>();
    c->rank = rank;
    c->size = nranks;
    c->device = rf::nccl::current_device();
    c->device_checked = c->device >= 0;
    c->options = env_options(rank);
    c->server = take_hosted(uid.token());
    auto make = [uid, nranks, call, target = c.get()] {
      ncclComm& comm = *target;
      auto store = std::make_shared<rf::TcpStoreClient>(uid.host(), uid.port(), uid.token(), comm.options.timeout);
      comm.comm = std::make_unique<rf::Communicator>(std::move(store), comm.rank, nranks, shim_transports(), comm.options);
      rf::nccl::logger(comm.rank).info("nccl shim: {}: rank {} of {} joined through {}:{}", call, comm.rank, nranks, uid.host(), uid.port());
    };
    if (rf::nccl::in_group()) {
      rf::nccl::enqueue(rf::nccl::PendingInit{call, c.get(), c.get(), make});
    } else {
      make();
    }
    *out = c.release();
    return ncclSuccess;
  });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Versions and errors
// ---------------------------------------------------------------------------------------------

extern "C" ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return fail("ncclGetVersion", nullptr, ncclInvalidArgument, "version is NULL");
  *version = NCCL_VERSION_CODE;  // the NCCL API this shim implements (the nccl.h it was compiled with)
  return ncclSuccess;
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclGetVersion, (int* version));

extern "C" const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (see ncclGetLastError or RINGFENCE_LOG=info)";
    case ncclSystemError: return "unhandled system error (see ncclGetLastError or RINGFENCE_LOG=info)";
    case ncclInternalError: return "internal error (see ncclGetLastError)";
    case ncclInvalidArgument: return "invalid argument (see ncclGetLastError)";
    case ncclInvalidUsage: return "invalid usage (see ncclGetLastError)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}
RINGFENCE_NCCL_PROFILING_ALIAS(const char*, ncclGetErrorString, (ncclResult_t result));

extern "C" const char* ncclGetLastError(ncclComm_t comm) { return rf::nccl::last_error_of(comm); }
RINGFENCE_NCCL_PROFILING_ALIAS(const char*, ncclGetLastError, (ncclComm_t comm));

extern "C" void ncclResetDebugInit() {}  // the log level is read once; nothing to reset
extern "C" void pncclResetDebugInit() {}

// ---------------------------------------------------------------------------------------------
// Unique ids and communicator creation
// ---------------------------------------------------------------------------------------------

extern "C" ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  return guarded("ncclGetUniqueId", nullptr, [&] {
    if (uniqueId == nullptr) throw ShimError(ncclInvalidArgument, "uniqueId is NULL");
    const rf::CommOptions options = env_options(-1);
    const std::string address = bootstrap_address(options);
    const rf::JobToken token = rf::random_token();
    // This process hosts the store now (the port is bound at once, so no other process can
    // take it before rank 0 joins), on every interface; the id names the chosen address.
    static const rf::Logger store_log = rf::nccl::logger();
    auto server = std::make_shared<rf::TcpStoreServer>(token, "0.0.0.0", 0, rf::TcpStoreServerOptions{}, &store_log);
    const rf::UniqueId id = rf::UniqueId::make(address, server->port(), token);
    {
      std::lock_guard lock(g_hosted_mutex);
      g_hosted.emplace(token, std::move(server));
    }
    std::memcpy(uniqueId->internal, id.bytes.data(), sizeof uniqueId->internal);
    rf::nccl::logger().info("nccl shim: ncclGetUniqueId: hosting the bootstrap store at {}:{}", address, id.port());
    return ncclSuccess;
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * uniqueId));

extern "C" ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return init_rank("ncclCommInitRank", comm, nranks, commId, rank, nullptr);
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclCommInitRank, (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank));

extern "C" ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config) {
  return init_rank("ncclCommInitRankConfig", comm, nranks, commId, rank, config);
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclCommInitRankConfig,
                               (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config));

extern "C" ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
                                                 ncclConfig_t* config) {
  // NCCL spreads the bootstrap over nId roots; here the first id's store serves every rank
  // (every rank passes the same ids; the first is made by rank 0).
  if (nId < 1 || commIds == nullptr)
    return fail("ncclCommInitRankScalable", nullptr, ncclInvalidArgument, fmt::format("nId {} with commIds {}", nId, static_cast<void*>(commIds)));
  return init_rank("ncclCommInitRankScalable", newcomm, nranks, commIds[0], myrank, config);
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclCommInitRankScalable,
                               (ncclComm_t * newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds, ncclConfig_t* config));

extern "C" ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  return guarded("ncclCommInitAll", nullptr, [&] {
    if (comms == nullptr) throw ShimError(ncclInvalidArgument, "comms is NULL");
    if (ndev < 1) throw ShimError(ncclInvalidArgument, fmt::format("ndev {} is less than 1", ndev));
    for (int i = 0; i < ndev; ++i) comms[i] = nullptr;
    if (devlist != nullptr)
      for (int i = 0; i < ndev; ++i)
        for (int j = 0; j < i; ++j)
          if (devlist[i] == devlist[j])
            throw ShimError(ncclInvalidUsage, fmt::format("devlist[{}] and devlist[{}] are both device {}", j, i, devlist[i]));
    const rf::CommOptions options = env_options(0);
    auto store = std::make_shared<rf::InProcessStore>();
    std::vector<std::unique_ptr<ncclComm>> made(static_cast<std::size_t>(ndev));
    std::vector<ncclResult_t> results(static_cast<std::size_t>(ndev), ncclSuccess);
    std::vector<std::thread> threads;
    for (int r = 0; r < ndev; ++r) {
      auto& c = made[static_cast<std::size_t>(r)];
      c = std::make_unique<ncclComm>();
      c->rank = r;
      c->size = ndev;
      c->device = devlist != nullptr ? devlist[r] : r;
      c->options = options;
    }
    // The ranks of one communicator in one process: built side by side over an in-process store.
    for (int r = 0; r < ndev; ++r)
      threads.emplace_back([&, r] {
        ncclComm& c = *made[static_cast<std::size_t>(r)];
        results[static_cast<std::size_t>(r)] = guarded("ncclCommInitAll", &c, [&] {
          c.comm = std::make_unique<rf::Communicator>(store, r, ndev, shim_transports(), c.options);
          return ncclSuccess;
        });
      });
    for (auto& t : threads) t.join();
    for (ncclResult_t r : results)
      if (r != ncclSuccess) return r;  // every made communicator is destroyed with `made`
    for (int r = 0; r < ndev; ++r) comms[r] = made[static_cast<std::size_t>(r)].release();
    return ncclSuccess;
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclCommInitAll, (ncclComm_t * comms, int ndev, const int* devlist));

// ---------------------------------------------------------------------------------------------
// Life cycle
// ---------------------------------------------------------------------------------------------

extern "C" ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return guarded("ncclCommFinalize", comm, [&] {
    ncclComm& c = check_comm("ncclCommFinalize", comm);
    if (c.comm) c.comm->synchronize();  // nothing is queued (calls complete before they return)
    c.finalized = true;
    return ncclSuccess;
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclCommFinalize, (ncclComm_t comm));

extern "C" ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  return guarded("ncclCommDestroy", comm, [&] {
    ncclComm& c = check_comm("ncclCommDestroy", comm);
    if (rf::nccl::init_pending(&c))
      throw ShimError(ncclInvalidUsage, fmt::format("rank {}: the communicator's init is queued in this thread's group", c.rank));
    c.magic = 0;
    delete &c;  // ~Communicator closes links without waiting long for peers, never throws
    return ncclSuccess;
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclCommDestroy, (ncclComm_t comm));

extern "C" ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  return guarded("ncclCommAbort", comm, [&] {
    ncclComm& c = check_comm("ncclCommAbort", comm);
    if (rf::nccl::init_pending(&c))
      throw ShimError(ncclInvalidUsage, fmt::format("rank {}: the communicator's init is queued in this thread's group", c.rank));
    if (c.comm) c.comm->abort();
    c.magic = 0;
    delete &c;
    return ncclSuccess;
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclCommAbort, (ncclComm_t comm));

extern "C" ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  (void)revokeFlags;
  return fail("ncclCommRevoke", comm, ncclInvalidUsage,
              "not supported by the ringfence shim (use ncclCommAbort, or ncclCommShrink with NCCL_SHRINK_ABORT)");
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int revokeFlags));

extern "C" ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                                       ncclConfig_t* config, int shrinkFlags) {
  return guarded("ncclCommShrink", comm, [&] {
    ncclComm& c = check_comm("ncclCommShrink", comm);
    if (newcomm == nullptr) throw ShimError(ncclInvalidArgument, "newcomm is NULL");
    *newcomm = nullptr;
    if (excludeRanksCount < 0 || (excludeRanksCount > 0 && excludeRanksList == nullptr))
      throw ShimError(ncclInvalidArgument, fmt::format("excludeRanksList {} with excludeRanksCount {}", static_cast<void*>(excludeRanksList),
                                                       excludeRanksCount));
    if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)
      throw ShimError(ncclInvalidArgument, fmt::format("shrinkFlags {:#x} (expected NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT)", shrinkFlags));
    check_config(config);
    rf::Communicator& parent = rf::nccl::live("ncclCommShrink", c);
    if (shrinkFlags == NCCL_SHRINK_ABORT) parent.abort();  // end the parent's work first
    std::vector<int> exclude(excludeRanksList, excludeRanksList + excludeRanksCount);
    auto n = std::make_unique<ncclComm>();
    n->options = c.options;
    n->comm = std::make_unique<rf::Communicator>(parent.shrink(exclude, c.options));
    n->rank = n->comm->rank();
    n->size = n->comm->size();
    n->device = c.device;
    n->device_checked = c.device_checked;
    n->server = c.server;
    *newcomm = n.release();
    return ncclSuccess;
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclCommShrink,
                               (ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                                ncclConfig_t* config, int shrinkFlags));

// ---------------------------------------------------------------------------------------------
// Queries
// ---------------------------------------------------------------------------------------------

extern "C" ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  return guarded("ncclCommGetAsyncError", comm, [&] {
    ncclComm& c = check_comm("ncclCommGetAsyncError", comm);
    if (asyncError == nullptr) throw ShimError(ncclInvalidArgument, "asyncError is NULL");
    if (c.comm) *asyncError = rf::nccl::result_of(c.comm->async_error().code());
    else if (c.init_error != ncclSuccess) *asyncError = c.init_error;
    else *asyncError = ncclInProgress;  // init queued in a group that has not ended
    return ncclSuccess;
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t * asyncError));

extern "C" ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return guarded("ncclCommCount", comm, [&] {
    ncclComm& c = check_comm("ncclCommCount", comm);
    if (count == nullptr) throw ShimError(ncclInvalidArgument, "count is NULL");
    if (c.size <= 0) throw ShimError(ncclInvalidUsage, "the communicator's split is queued in a group that has not ended");
    *count = c.size;
    return ncclSuccess;
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int* count));

extern "C" ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return guarded("ncclCommUserRank", comm, [&] {
    ncclComm& c = check_comm("ncclCommUserRank", comm);
    if (rank == nullptr) throw ShimError(ncclInvalidArgument, "rank is NULL");
    if (c.size <= 0) throw ShimError(ncclInvalidUsage, "the communicator's split is queued in a group that has not ended");
    *rank = c.rank;
    return ncclSuccess;
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int* rank));

extern "C" ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return guarded("ncclCommCuDevice", comm, [&] {
    ncclComm& c = check_comm("ncclCommCuDevice", comm);
    if (device == nullptr) throw ShimError(ncclInvalidArgument, "device is NULL");
    *device = c.device;
    return ncclSuccess;
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int* device));

// ---------------------------------------------------------------------------------------------
// Memory and registration
// ---------------------------------------------------------------------------------------------

extern "C" ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  return guarded("ncclMemAlloc", nullptr, [&] {
    if (ptr == nullptr) throw ShimError(ncclInvalidArgument, "ptr is NULL");
    *ptr = nullptr;
    if (size == 0) return ncclSuccess;  // like cudaMalloc(&p, 0)
    const std::size_t rounded = (size + kMemAlignment - 1) / kMemAlignment * kMemAlignment;
    if (rounded < size) throw ShimError(ncclInvalidArgument, fmt::format("size {} overflows", size));
    void* p = std::aligned_alloc(kMemAlignment, rounded);
    if (p == nullptr) throw ShimError(ncclSystemError, fmt::format("out of host memory for {} bytes", size));
    std::lock_guard lock(g_alloc_mutex);
    g_allocations.insert(p);
    *ptr = p;
    return ncclSuccess;
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclMemAlloc, (void** ptr, size_t size));

extern "C" ncclResult_t ncclMemFree(void* ptr) {
  if (ptr == nullptr) return ncclSuccess;  // like cudaFree(NULL)
  {
    std::lock_guard lock(g_alloc_mutex);
    if (g_allocations.erase(ptr) == 1) {
      std::free(ptr);
      return ncclSuccess;
    }
  }
  return fail("ncclMemFree", nullptr, ncclInvalidArgument, fmt::format("{} was not returned by ncclMemAlloc (or was freed already)", ptr));
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclMemFree, (void* ptr));

extern "C" ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  return guarded("ncclCommRegister", comm, [&] {
    ncclComm& c = check_comm("ncclCommRegister", comm);
    if (handle == nullptr) throw ShimError(ncclInvalidArgument, "handle is NULL");
    *handle = nullptr;
    if (buff == nullptr || size == 0)
      throw ShimError(ncclInvalidArgument, fmt::format("buff {} with size {}", buff, size));
    (void)rf::nccl::check_buffer("ncclCommRegister", c, "buff", buff, size);
    // ringfence registers buffers lazily (on first use, cached), so the handle only records the
    // range; it must be deregistered before the communicator is destroyed, as in NCCL. Device
    // memory too: the stream-ordered calls stage it, so registration is only a hint there.
    auto reg = std::make_unique<ncclComm::Registration>(ncclComm::Registration{buff, size});
    void* h = reg.get();
    std::lock_guard lock(c.mutex);
    c.registrations.emplace(h, std::move(reg));
    *handle = h;
    return ncclSuccess;
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclCommRegister, (const ncclComm_t comm, void* buff, size_t size, void** handle));

extern "C" ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  return guarded("ncclCommDeregister", comm, [&] {
    ncclComm& c = check_comm("ncclCommDeregister", comm);
    std::lock_guard lock(c.mutex);
    if (handle == nullptr || c.registrations.erase(handle) != 1)
      throw ShimError(ncclInvalidArgument, fmt::format("handle {} was not returned by ncclCommRegister on this communicator", handle));
    return ncclSuccess;
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void* handle));

// ---------------------------------------------------------------------------------------------
// Not supported: symmetric windows and custom reduction operators
// ---------------------------------------------------------------------------------------------

extern "C" ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags) {
  (void)buff, (void)size, (void)winFlags;
  if (win != nullptr) *win = nullptr;
  return fail("ncclCommWindowRegister", comm, ncclInvalidUsage, "symmetric memory windows are not supported by the ringfence shim");
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclCommWindowRegister,
                               (ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags));

extern "C" ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  (void)win;
  return fail("ncclCommWindowDeregister", comm, ncclInvalidUsage, "symmetric memory windows are not supported by the ringfence shim");
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win));

extern "C" ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                                 ncclScalarResidence_t residence, ncclComm_t comm) {
  (void)op, (void)scalar, (void)datatype, (void)residence;
  return fail("ncclRedOpCreatePreMulSum", comm, ncclInvalidUsage, "custom reduction operators are not supported by the ringfence shim");
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclRedOpCreatePreMulSum,
                               (ncclRedOp_t * op, void* scalar, ncclDataType_t datatype, ncclScalarResidence_t residence,
                                ncclComm_t comm));

extern "C" ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  return fail("ncclRedOpDestroy", comm, ncclInvalidUsage,
              fmt::format("op {}: custom reduction operators are not supported by the ringfence shim", static_cast<int>(op)));
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm));

// ---------------------------------------------------------------------------------------------
// Split: Communicator::split, queued inside a group like the inits
// ---------------------------------------------------------------------------------------------

extern "C" ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  return guarded("ncclCommSplit", comm, [&] {
    ncclComm& parent = rf::nccl::check_usable("ncclCommSplit", comm);
    if (newcomm == nullptr) throw ShimError(ncclInvalidArgument, "newcomm is NULL");
    *newcomm = nullptr;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
      throw ShimError(ncclInvalidArgument, fmt::format("rank {}: color {} is negative (use NCCL_SPLIT_NOCOLOR)", parent.rank, color));
    check_config(config);
    // Every rank takes part (the colours travel in a collective); NCCL_SPLIT_NOCOLOR gets NULL.
    std::unique_ptr<ncclComm> child;
    if (color != NCCL_SPLIT_NOCOLOR) {
      child = std::make_unique<ncclComm>();
      child->options = parent.options;
      child->device = parent.device;
      child->device_checked = parent.device_checked;
      child->server = parent.server;  // the parent's store (if this process hosts it) serves the child
    }
    auto make = [&parent, target = child.get(), color, key] {
      std::optional<rf::Communicator> made = rf::nccl::live("ncclCommSplit", parent).split(color, key, parent.options);
      if (target == nullptr) return;
      if (!made) throw ShimError(ncclInternalError, fmt::format("rank {}: split with color {} made no communicator", parent.rank, color));
      target->comm = std::make_unique<rf::Communicator>(std::move(*made));
      target->rank = target->comm->rank();
      target->size = target->comm->size();
    };
    if (rf::nccl::in_group()) {  // rank and size are known once the group ends
      rf::nccl::enqueue(rf::nccl::PendingInit{"ncclCommSplit", child.get(), &parent, make, true});
    } else {
      make();
    }
    *newcomm = child.release();
    return ncclSuccess;
  });
}
RINGFENCE_NCCL_PROFILING_ALIAS(ncclResult_t, ncclCommSplit, (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config));
