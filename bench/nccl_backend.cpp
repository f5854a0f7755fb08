// --backend nccl for the <collective>_perf programs; see nccl_backend.hpp.
#include "nccl_backend.hpp"

#include <dlfcn.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <ringfence/ringfence.hpp>
#include <stdexcept>
#include <string>

namespace ringfence::bench {
namespace {

// Resolves `name` in `handle` into `out`; false when missing.
template <class F>
bool bind(void* handle, const char* name, F& out) {
  out = reinterpret_cast<F>(::dlsym(handle, name));
  return out != nullptr;
}

// The CUDA runtime calls the device-buffer mode needs (typed by the installed headers).
struct Cuda {
  decltype(&::cudaGetDeviceCount) get_device_count = nullptr;
  decltype(&::cudaSetDevice) set_device = nullptr;
  cudaError_t (*malloc)(void**, std::size_t) = nullptr;  // cudaMalloc (overloaded in C++: spelled out)
  decltype(&::cudaFree) free = nullptr;
  decltype(&::cudaMemcpy) memcpy = nullptr;
  decltype(&::cudaStreamSynchronize) stream_synchronize = nullptr;
  decltype(&::cudaGetErrorString) error_string = nullptr;
  int devices = 0;

  // Loads libcudart and counts devices; the reason when there is none.
  std::string load() {
    void* h = nullptr;
    for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"})
      if ((h = ::dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    if (h == nullptr) return "no CUDA runtime library (libcudart.so.13/.12/.11.0)";
    if (!bind(h, "cudaGetDeviceCount", get_device_count) || !bind(h, "cudaSetDevice", set_device) ||
        !bind(h, "cudaMalloc", malloc) || !bind(h, "cudaFree", free) || !bind(h, "cudaMemcpy", memcpy) ||
        !bind(h, "cudaStreamSynchronize", stream_synchronize) || !bind(h, "cudaGetErrorString", error_string))
      return "the CUDA runtime library lacks a function the benchmark needs";
    const cudaError_t err = get_device_count(&devices);
    if (err != cudaSuccess) return std::string("cudaGetDeviceCount: ") + error_string(err);
    if (devices <= 0) return "cudaGetDeviceCount found no device";
    return {};
  }
  void check(cudaError_t err, const char* what) const {
    if (err != cudaSuccess) throw std::runtime_error(std::string(what) + " failed: " + error_string(err));
  }
};

// The NCCL entry points the benchmark calls.
struct Nccl {
  decltype(&::ncclGetVersion) get_version = nullptr;
  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&::ncclCommDestroy) comm_destroy = nullptr;
  decltype(&::ncclGetErrorString) error_string = nullptr;
  decltype(&::ncclGetLastError) last_error = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  decltype(&::ncclReduce) reduce = nullptr;
  decltype(&::ncclAlltoAll) all_to_all = nullptr;  // NCCL 2.28 and later; else grouped send/recv
  decltype(&::ncclSend) send = nullptr;
  decltype(&::ncclRecv) recv = nullptr;
  decltype(&::ncclGroupStart) group_start = nullptr;
  decltype(&::ncclGroupEnd) group_end = nullptr;
  ncclComm_t comm = nullptr;

  std::string load(const std::string& library) {
    void* h = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return std::string("cannot load ") + library + ": " + ::dlerror();
    if (!bind(h, "ncclGetVersion", get_version) || !bind(h, "ncclGetUniqueId", get_unique_id) ||
        !bind(h, "ncclCommInitRank", comm_init_rank) || !bind(h, "ncclCommDestroy", comm_destroy) ||
        !bind(h, "ncclGetErrorString", error_string) || !bind(h, "ncclGetLastError", last_error) ||
        !bind(h, "ncclAllReduce", all_reduce) || !bind(h, "ncclReduceScatter", reduce_scatter) ||
        !bind(h, "ncclAllGather", all_gather) || !bind(h, "ncclBroadcast", broadcast) || !bind(h, "ncclReduce", reduce) ||
        !bind(h, "ncclSend", send) || !bind(h, "ncclRecv", recv) || !bind(h, "ncclGroupStart", group_start) ||
        !bind(h, "ncclGroupEnd", group_end))
      return library + " lacks an NCCL function the benchmark needs (NCCL 2.7 or later)";
    bind(h, "ncclAlltoAll", all_to_all);
    return {};
  }
  void check(ncclResult_t r, const char* what) const {
    if (r != ncclSuccess)
      throw std::runtime_error(std::string(what) + " failed: " + error_string(r) + ": " + last_error(comm));
  }
};

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::Int8: return ncclInt8;
    case DataType::Uint8: return ncclUint8;
    case DataType::Int32: return ncclInt32;
    case DataType::Uint32: return ncclUint32;
    case DataType::Int64: return ncclInt64;
    case DataType::Uint64: return ncclUint64;
    case DataType::Float16: return ncclFloat16;
    case DataType::BFloat16: return ncclBfloat16;
    case DataType::Float32: return ncclFloat32;
    case DataType::Float64: return ncclFloat64;
  }
  return ncclNumTypes;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Prod: return ncclProd;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Avg: return ncclAvg;
  }
  return ncclNumOps;
}

}  // namespace

int run_nccl_perf(Collective c, const PerfArgs& args_in, const std::string& program, int launcher_rank) {
  PerfArgs args = args_in;
  if (!args.memory_set) args.memory = MemoryMode::Device;
  const bool talk = launcher_rank == 0;
  // Reasons to skip are printed by every rank: the launcher may stop the others as soon as the
  // first one exits, before rank 0 has written its line.
  if (args.memory == MemoryMode::Alloc) {
    if (talk) std::fprintf(stderr, "%s: --backend nccl: --memory alloc is not offered (use --memory device, or --memory user with the ringfence shim)\n", program.c_str());
    return 2;
  }
  const bool device = args.memory == MemoryMode::Device;
  Cuda cuda;
  if (device) {
    const std::string why = cuda.load();
    if (!why.empty()) {
      std::printf("# %s --backend nccl: no CUDA device (%s); NCCL needs a GPU for device buffers: skipped (exit 77)\n",
                    program.c_str(), why.c_str());
      return 77;
    }
  }
  Nccl nccl;
  if (const std::string why = nccl.load(args.nccl_library); !why.empty()) {
    std::printf("# %s --backend nccl: %s: skipped (exit 77)\n", program.c_str(), why.c_str());
    return 77;
  }

  // Bootstrap: rank, size and rank 0's unique id through a ringfence communicator.
  Communicator boot = Communicator::from_env();
  const Environment env = Environment::from_process();
  const LaunchInfo launch = detect_launch(env);
  if (device) cuda.check(cuda.set_device(launch.local_rank % cuda.devices), "cudaSetDevice");
  ncclUniqueId id{};
  if (boot.rank() == 0) nccl.check(nccl.get_unique_id(&id), "ncclGetUniqueId");
  boot.broadcast(&id, &id, sizeof id, DataType::Uint8, 0);
  nccl.check(nccl.comm_init_rank(&nccl.comm, boot.size(), id, boot.rank()), "ncclCommInitRank");
  int version = 0;
  nccl.check(nccl.get_version(&version), "ncclGetVersion");

  cudaStream_t stream = nullptr;  // the default stream (host mode: the shim requires NULL)
  Backend b;
  b.name = "NCCL " + std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
           std::to_string(version % 100) + " (" + args.nccl_library + ")";
  b.rank = boot.rank();
  b.size = boot.size();
  b.allreduce = [&](const void* s, void* r, std::size_t n, DataType t, ReduceOp op) {
    nccl.check(nccl.all_reduce(s, r, n, nccl_type(t), nccl_op(op), nccl.comm, stream), "ncclAllReduce");
  };
  b.reduce_scatter = [&](const void* s, void* r, std::size_t n, DataType t, ReduceOp op) {
    nccl.check(nccl.reduce_scatter(s, r, n, nccl_type(t), nccl_op(op), nccl.comm, stream), "ncclReduceScatter");
  };
  b.all_gather = [&](const void* s, void* r, std::size_t n, DataType t) {
    nccl.check(nccl.all_gather(s, r, n, nccl_type(t), nccl.comm, stream), "ncclAllGather");
  };
  b.broadcast = [&](const void* s, void* r, std::size_t n, DataType t, int root) {
    nccl.check(nccl.broadcast(s, r, n, nccl_type(t), root, nccl.comm, stream), "ncclBroadcast");
  };
  b.reduce = [&](const void* s, void* r, std::size_t n, DataType t, ReduceOp op, int root) {
    nccl.check(nccl.reduce(s, r, n, nccl_type(t), nccl_op(op), root, nccl.comm, stream), "ncclReduce");
  };
  if (nccl.all_to_all != nullptr) {
    b.all_to_all = [&](const void* s, void* r, std::size_t n, DataType t) {
      nccl.check(nccl.all_to_all(s, r, n, nccl_type(t), nccl.comm, stream), "ncclAlltoAll");
    };
  } else {  // NCCL before 2.28: grouped send/recv, as nccl-tests does
    b.all_to_all = [&](const void* s, void* r, std::size_t n, DataType t) {
      const std::size_t block = n * size_of(t);
      nccl.check(nccl.group_start(), "ncclGroupStart");
      for (int p = 0; p < b.size; ++p) {
        const std::size_t at = static_cast<std::size_t>(p) * block;
        nccl.check(nccl.send(static_cast<const char*>(s) + at, n, nccl_type(t), p, nccl.comm, stream), "ncclSend");
        nccl.check(nccl.recv(static_cast<char*>(r) + at, n, nccl_type(t), p, nccl.comm, stream), "ncclRecv");
      }
      nccl.check(nccl.group_end(), "ncclGroupEnd");
    };
  }
  b.send_recv = [&](const void* s, void* r, std::size_t n, DataType t, int to, int from) {
    nccl.check(nccl.group_start(), "ncclGroupStart");
    nccl.check(nccl.send(s, n, nccl_type(t), to, nccl.comm, stream), "ncclSend");
    nccl.check(nccl.recv(r, n, nccl_type(t), from, nccl.comm, stream), "ncclRecv");
    nccl.check(nccl.group_end(), "ncclGroupEnd");
  };
  b.in_place_unsupported = [](Collective k) {
    return k == Collective::AllToAll || k == Collective::SendRecv ? std::string("the send and receive buffers must not overlap")
                                                                  : std::string();
  };
  b.host_allreduce = [&boot](const void* s, void* r, std::size_t n, DataType t, ReduceOp op) { boot.allreduce(s, r, n, t, op); };
  if (device) {
    b.synchronize = [&] { cuda.check(cuda.stream_synchronize(stream), "cudaStreamSynchronize"); };
    b.barrier = [&] {
      cuda.check(cuda.stream_synchronize(stream), "cudaStreamSynchronize");
      boot.barrier();
    };
    b.alloc = [&](std::size_t bytes) {
      void* p = nullptr;
      cuda.check(cuda.malloc(&p, bytes), "cudaMalloc");
      return p;
    };
    b.free = [&](void* p) { cuda.check(cuda.free(p), "cudaFree"); };
    b.upload = [&](void* dev, const void* host, std::size_t bytes) {
      cuda.check(cuda.memcpy(dev, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    };
    b.download = [&](void* host, const void* dev, std::size_t bytes) {
      cuda.check(cuda.memcpy(host, dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    };
  } else {
    b.barrier = [&boot] { boot.barrier(); };
  }
  b.notes.push_back(std::string("nccl backend: ") + (device ? "device buffers (cudaMalloc), device " +
                                                                  std::to_string(launch.local_rank % cuda.devices) + " of " +
                                                                  std::to_string(cuda.devices)
                                                            : std::string("host buffers, NULL stream (the ringfence shim only)")) +
                    "; bootstrap and the driver's own reductions through ringfence");
  int code = 1;
  try {
    code = run_perf(c, args, b);
  } catch (...) {
    nccl.comm_destroy(nccl.comm);
    throw;
  }
  nccl.check(nccl.comm_destroy(nccl.comm), "ncclCommDestroy");
  return code;
}

}  // namespace ringfence::bench
