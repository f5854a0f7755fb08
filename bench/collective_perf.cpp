// <collective>_perf: nccl-tests-compatible benchmarks of ringfence's collectives. One source,
// compiled once per collective (RINGFENCE_PERF_COLLECTIVE names the enumerator):
//
//   build/bin/ringfence-run -n 4 build/bin/all_reduce_perf -b 8 -e 64M -f 4 -d all -o all
//   build/bin/ringfence-run -n 4 build/bin/reduce_scatter_perf -b 8 -e 64M -f 4 -d all -o all
//   build/bin/ringfence-run -n 4 build/bin/broadcast_perf -b 8 -e 64M -f 4 -r 1
//   build/bin/ringfence-run -n 4 build/bin/all_reduce_perf -b 8 -e 64M -f 4 --backend nccl   (NCCL, GPU)
//
// The table, flags and checks are shared with the mpi_*_perf programs (perf_common.hpp); this
// file only wires a ringfence Communicator into the driver.
#include <cstdio>
#include <exception>
#include <ringfence/ringfence.hpp>
#include <ringfence/transports/cuda_ipc.hpp>
#include <string>
#include <vector>

#include "cuda_rt.hpp"
#include "perf_common.hpp"
#if RINGFENCE_PERF_WITH_NCCL
#include "nccl_backend.hpp"
#endif

#ifndef RINGFENCE_PERF_COLLECTIVE
#define RINGFENCE_PERF_COLLECTIVE AllReduce
#endif

namespace {

namespace rf = ringfence;
namespace bench = ringfence::bench;

constexpr bench::Collective kCollective = bench::Collective::RINGFENCE_PERF_COLLECTIVE;

// The launcher's rank, read before the communicator exists so that only rank 0 prints help
// and usage errors. Falls back to 0 (a plain, unlaunched run).
int launcher_rank() {
  const rf::Environment env = rf::Environment::from_process();
  for (const char* name : {"RINGFENCE_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"}) {
    if (const auto v = env.get(name)) {
      try {
        return std::stoi(*v);
      } catch (const std::exception&) {
        return 0;
      }
    }
  }
  return 0;
}

// "peer:transport" of each of rank 0's links, plus the options that shape the data path.
std::vector<std::string> describe(const rf::Communicator& comm) {
  const rf::CommOptions& o = comm.options();
  std::vector<std::string> notes;
  notes.push_back("ringfence options: chunk_bytes " + std::to_string(o.chunk_bytes) + " slots " + std::to_string(o.slots) +
                  " timeout_ms " + std::to_string(o.timeout.count()));
  if (comm.rank() == 0) {
    std::string links = "rank 0 links:";
    for (const rf::LinkInfo& l : comm.links()) links += " " + std::to_string(l.peer) + ":" + l.transport;
    notes.push_back(links);
  }
  return notes;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string program = std::string(bench::collective_name(kCollective)) + "_perf";
  int rank = launcher_rank();
  const bench::ParseOutcome parsed = bench::parse_args(argc, argv, program.c_str(), rank == 0);
  if (!parsed.args) return parsed.exit_code;
  try {
    if (parsed.args->backend == "nccl") {
#if RINGFENCE_PERF_WITH_NCCL
      return bench::run_nccl_perf(kCollective, *parsed.args, program, rank);
#else
      if (rank == 0) std::printf("# %s --backend nccl: built without nccl.h: skipped (exit 77)\n", program.c_str());
      return 77;
#endif
    }
    // --memory device also registers the GPU transports (nvlink, pcie), so the stream-ordered calls
    // may run on device regions (docs/device.md; RINGFENCE_DEVICE_REGIONS=off: host-staged).
    rf::Communicator comm = [&] {
      if (parsed.args->memory != bench::MemoryMode::Device) return rf::Communicator::from_env();
      const rf::Environment env = rf::Environment::from_process();
      rf::TransportRegistry registry = rf::builtin_transports();
      registry.add(std::string(rf::transports::cuda_ipc::kNvlinkName), rf::transports::cuda_ipc::make_nvlink_transport);
      registry.add(std::string(rf::transports::cuda_ipc::kPcieName), rf::transports::cuda_ipc::make_pcie_transport);
      return rf::Communicator::from_launch(rf::detect_launch(env), registry, rf::CommOptions::from_env(env));
    }();
    rank = comm.rank();
    bench::Backend backend;
    backend.name = std::string("ringfence ") + rf::kVersionString;
    backend.rank = comm.rank();
    backend.size = comm.size();
    backend.allreduce = [&comm](const void* send, void* recv, std::size_t count, rf::DataType type, rf::ReduceOp op) {
      comm.allreduce(send, recv, count, type, op);
    };
    backend.reduce_scatter = [&comm](const void* send, void* recv, std::size_t count, rf::DataType type, rf::ReduceOp op) {
      comm.reduce_scatter(send, recv, count, type, op);
    };
    backend.all_gather = [&comm](const void* send, void* recv, std::size_t count, rf::DataType type) {
      comm.allgather(send, recv, count, type);
    };
    backend.broadcast = [&comm](const void* send, void* recv, std::size_t count, rf::DataType type, int root) {
      comm.broadcast(send, recv, count, type, root);
    };
    backend.reduce = [&comm](const void* send, void* recv, std::size_t count, rf::DataType type, rf::ReduceOp op, int root) {
      comm.reduce(send, recv, count, type, op, root);
    };
    backend.all_to_all = [&comm](const void* send, void* recv, std::size_t count, rf::DataType type) {
      comm.alltoall(send, recv, count, type);
    };
    backend.send_recv = [&comm](const void* send, void* recv, std::size_t count, rf::DataType type, int to, int from) {
      comm.group_start();
      comm.send(send, count, type, to);
      comm.recv(recv, count, type, from);
      comm.group_end();
    };
    backend.in_place_unsupported = [](bench::Collective c) {
      return c == bench::Collective::AllToAll || c == bench::Collective::SendRecv
                 ? std::string("the send and receive buffers must not overlap")
                 : std::string();
    };
    backend.barrier = [&comm] { comm.barrier(); };
    backend.set_timeout = [&comm](std::chrono::milliseconds t) { comm.set_timeout(t); };
    backend.alloc = [&comm](std::size_t bytes) { return comm.alloc(bytes); };
    backend.free = [&comm](void* ptr) { comm.free(ptr); };
    backend.notes = describe(comm);
    // --memory device: CUDA buffers and the stream-ordered calls (device regions or host-staged,
    // docs/device.md) on one stream per rank; ranks share GPUs round-robin. Skipped (77)
    // without a usable runtime.
    rf::tools::CudaRt cuda;
    void* stream = nullptr;
    if (parsed.args->memory == bench::MemoryMode::Device) {
      if (const std::string why = cuda.load(comm.options().cuda_runtime); !why.empty()) {
        if (rank == 0) std::printf("# %s --memory device: %s: skipped (exit 77)\n", program.c_str(), why.c_str());
        return 77;
      }
      cuda.check(cuda.set_device(comm.rank() % cuda.devices), "cudaSetDevice");
      cuda.check(cuda.stream_create(&stream), "cudaStreamCreate");
      const rf::CudaStream s{stream};
      backend.host_allreduce = backend.allreduce;
      backend.allreduce = [&comm, s](const void* send, void* recv, std::size_t count, rf::DataType type, rf::ReduceOp op) {
        comm.allreduce(send, recv, count, type, op, s);
      };
      backend.reduce_scatter = [&comm, s](const void* send, void* recv, std::size_t count, rf::DataType type, rf::ReduceOp op) {
        comm.reduce_scatter(send, recv, count, type, op, s);
      };
      backend.all_gather = [&comm, s](const void* send, void* recv, std::size_t count, rf::DataType type) {
        comm.allgather(send, recv, count, type, s);
      };
      backend.broadcast = [&comm, s](const void* send, void* recv, std::size_t count, rf::DataType type, int root) {
        comm.broadcast(send, recv, count, type, root, s);
      };
      backend.reduce = [&comm, s](const void* send, void* recv, std::size_t count, rf::DataType type, rf::ReduceOp op, int root) {
        comm.reduce(send, recv, count, type, op, root, s);
      };
      backend.all_to_all = [&comm, s](const void* send, void* recv, std::size_t count, rf::DataType type) {
        comm.alltoall(send, recv, count, type, s);
      };
      backend.send_recv = nullptr;  // send/recv take host memory only
      backend.synchronize = [&cuda, stream] { cuda.check(cuda.stream_sync(stream), "cudaStreamSynchronize"); };
      backend.alloc = [&cuda](std::size_t bytes) {
        void* p = nullptr;
        cuda.check(cuda.malloc_(&p, bytes), "cudaMalloc");
        return p;
      };
      backend.free = [&cuda](void* p) { cuda.check(cuda.free_(p), "cudaFree"); };
      backend.upload = [&cuda](void* dev, const void* host, std::size_t bytes) {
        cuda.check(cuda.memcpy_(dev, host, bytes, rf::tools::CudaRt::kHostToDevice), "cudaMemcpy");
      };
      backend.download = [&cuda](void* host, const void* dev, std::size_t bytes) {
        cuda.check(cuda.memcpy_(host, dev, bytes, rf::tools::CudaRt::kDeviceToHost), "cudaMemcpy");
      };
      backend.notes.push_back("device memory: stream-ordered calls (docs/device.md)");
    }
    const int rc = bench::run_perf(kCollective, *parsed.args, backend);
    if (stream != nullptr && rank == 0) std::printf("# device path: %s\n", comm.device_path().c_str());
    if (stream != nullptr) cuda.check(cuda.stream_destroy(stream), "cudaStreamDestroy");
    return rc;
  } catch (const rf::Error& e) {
    std::fprintf(stderr, "%s: rank %d: ringfence error (%s): %s\n", program.c_str(), rank,
                 std::string(rf::to_string(e.code())).c_str(), e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: %s\n", program.c_str(), rank, e.what());
  }
  return 1;
}
