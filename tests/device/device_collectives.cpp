// Stream-ordered collectives on CUDA memory, across processes (one rank per process, several
// ranks may share a GPU): every dtype x op for allreduce (out of place and in place), and
// reduce_scatter, allgather, broadcast, reduce, alltoall, a group of send/recv, checked exactly (integer-valued
// inputs, tests/support/verifiable.hpp). Run by ringfence-run; the CUDA runtime is the one the
// communicator loads (RINGFENCE_CUDART, else libcudart.so.13/.12/...): the real one on a GPU
// machine (tests/gpu), the fake with threads for streams in CI (tests/device). Exits 77 when no
// CUDA runtime, driver or device is usable.
//   device_collectives [--nonblocking-stream] [--device-transports] [COUNT]
//     COUNT: elements per rank and call (default 4099: not a multiple of anything)
//     --nonblocking-stream: the calls' stream is made with cudaStreamNonBlocking (default: a
//       blocking stream, cudaStreamCreate, which synchronises with the legacy default stream)
//     --device-transports: the communicator also gets the nvlink and pcie transports, so the
//       collectives may run on device regions (docs/device.md; RINGFENCE_DEVICE_REGIONS=on makes
//       it a requirement), and the program fails unless they did.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <ringfence/ringfence.hpp>
#include <ringfence/transports/cuda_ipc.hpp>
#include <string>
#include <vector>

#include "cuda_rt.hpp"
#include "support/verifiable.hpp"

using namespace ringfence;

namespace {
using Cuda = tools::CudaRt;
void check(const Cuda& c, int err, const char* what) { c.check(err, what); }
constexpr int kToDevice = Cuda::kHostToDevice, kToHost = Cuda::kDeviceToHost;
}  // namespace

int main(int argc, char** argv) {
  int arg = 1;
  const bool nonblocking = argc > arg && std::string(argv[arg]) == "--nonblocking-stream";
  arg += nonblocking;
  const bool device_transports = argc > arg && std::string(argv[arg]) == "--device-transports";
  arg += device_transports;
  const std::size_t count = argc > arg ? std::strtoull(argv[arg], nullptr, 10) : 4099;
  Communicator comm = [&] {
    if (!device_transports) return Communicator::from_env();
    const Environment env = Environment::from_process();
    TransportRegistry registry = builtin_transports();
    registry.add(std::string(transports::cuda_ipc::kNvlinkName), transports::cuda_ipc::make_nvlink_transport);
    registry.add(std::string(transports::cuda_ipc::kPcieName), transports::cuda_ipc::make_pcie_transport);
    return Communicator::from_launch(detect_launch(env), registry, CommOptions::from_env(env));
  }();
  const int rank = comm.rank(), n = comm.size();
  Cuda cuda;
  if (const std::string why = cuda.load(comm.options().cuda_runtime); !why.empty()) {
    std::printf("rank %d: skipped: %s\n", rank, why.c_str());
    return 77;
  }
  check(cuda, cuda.set_device(rank % cuda.devices), "cudaSetDevice");  // ranks share GPUs when n > devices
  void* stream = nullptr;
  if (nonblocking && cuda.stream_create_flags == nullptr) throw std::runtime_error("the CUDA runtime lacks cudaStreamCreateWithFlags");
  check(cuda, nonblocking ? cuda.stream_create_flags(&stream, Cuda::kStreamNonBlocking) : cuda.stream_create(&stream), "cudaStreamCreate");
  const std::size_t max_bytes = count * 8 * static_cast<std::size_t>(n);
  void *dsend = nullptr, *drecv = nullptr;
  check(cuda, cuda.malloc_(&dsend, max_bytes), "cudaMalloc");
  check(cuda, cuda.malloc_(&drecv, max_bytes), "cudaMalloc");
  std::vector<std::byte> host(max_bytes), back(max_bytes);
  int checks = 0, failures = 0;
  auto report = [&](const std::string& what, std::size_t wrong) {
    ++checks;
    if (wrong == 0) return;
    ++failures;
    std::printf("rank %d: %s: %zu wrong elements\n", rank, what.c_str(), wrong);
  };
  const CudaStream s{stream};
  for (int t = 0; t < kNumDataTypes; ++t) {
    const auto type = static_cast<DataType>(t);
    const std::size_t esize = size_of(type);
    for (int o = 0; o < kNumReduceOps; ++o) {
      const auto op = static_cast<ReduceOp>(o);
      for (bool in_place : {false, true}) {
        test::fill_input(type, op, rank, n, host.data(), count);
        check(cuda, cuda.memcpy_(dsend, host.data(), count * esize, kToDevice), "cudaMemcpy");
        void* out = in_place ? dsend : drecv;
        comm.allreduce(dsend, out, count, type, op, s);
        check(cuda, cuda.stream_sync(stream), "cudaStreamSynchronize");
        check(cuda, cuda.memcpy_(back.data(), out, count * esize, kToHost), "cudaMemcpy");
        report(fmt::format("allreduce {} {}{}", to_string(type), to_string(op), in_place ? " in place" : ""),
               test::count_wrong(type, op, n, back.data(), count));
      }
    }
  }
  // The other collectives: float32 sum / int32 max, several calls in flight before one sync.
  for (auto [type, op] : {std::pair{DataType::Float32, ReduceOp::Sum}, std::pair{DataType::Int32, ReduceOp::Max}}) {
    const std::size_t esize = size_of(type);
    const std::size_t whole = count * static_cast<std::size_t>(n);
    // reduce_scatter: every rank contributes the whole vector, keeps block `rank`.
    test::fill_input(type, op, rank, n, host.data(), whole);
    check(cuda, cuda.memcpy_(dsend, host.data(), whole * esize, kToDevice), "cudaMemcpy");
    comm.reduce_scatter(dsend, drecv, count, type, op, s);
    check(cuda, cuda.stream_sync(stream), "cudaStreamSynchronize");
    check(cuda, cuda.memcpy_(back.data(), drecv, count * esize, kToHost), "cudaMemcpy");
    report(fmt::format("reduce_scatter {}", to_string(type)),
           test::count_wrong(type, op, n, back.data(), count, count * static_cast<std::size_t>(rank)));
    // allgather: block r holds rank r's values (the Sum input of rank r), checked per block.
    test::fill_input(type, ReduceOp::Sum, rank, n, host.data(), count);
    check(cuda, cuda.memcpy_(dsend, host.data(), count * esize, kToDevice), "cudaMemcpy");
    comm.allgather(dsend, drecv, count, type, s);
    check(cuda, cuda.stream_sync(stream), "cudaStreamSynchronize");
    check(cuda, cuda.memcpy_(back.data(), drecv, whole * esize, kToHost), "cudaMemcpy");
    std::size_t wrong = 0;
    std::vector<std::byte> want(count * esize);
    for (int r = 0; r < n; ++r) {
      test::fill_input(type, ReduceOp::Sum, r, n, want.data(), count);
      wrong += std::memcmp(want.data(), back.data() + static_cast<std::size_t>(r) * count * esize, count * esize) != 0;
    }
    report(fmt::format("allgather {}", to_string(type)), wrong);
    // broadcast from rank n-1 and reduce to rank 0, issued back to back, one sync.
    const int root = n - 1;
    test::fill_input(type, op, rank, n, host.data(), count);
    check(cuda, cuda.memcpy_(dsend, host.data(), count * esize, kToDevice), "cudaMemcpy");
    comm.reduce(dsend, drecv, count, type, op, 0, s);
    void* dbcast = static_cast<std::byte*>(drecv) + count * esize;
    comm.broadcast(dsend, dbcast, count, type, root, s);
    check(cuda, cuda.stream_sync(stream), "cudaStreamSynchronize");
    if (rank == 0) {
      check(cuda, cuda.memcpy_(back.data(), drecv, count * esize, kToHost), "cudaMemcpy");
      report(fmt::format("reduce {} to rank 0", to_string(type)), test::count_wrong(type, op, n, back.data(), count));
    }
    check(cuda, cuda.memcpy_(back.data(), dbcast, count * esize, kToHost), "cudaMemcpy");
    test::fill_input(type, op, root, n, want.data(), count);
    report(fmt::format("broadcast {} from rank {}", to_string(type), root), std::memcmp(want.data(), back.data(), count * esize) != 0);
    // alltoall: block j of rank r is the Sum input of rank r at offset j*count.
    test::fill_input(type, ReduceOp::Sum, rank, n, host.data(), whole);
    check(cuda, cuda.memcpy_(dsend, host.data(), whole * esize, kToDevice), "cudaMemcpy");
    comm.alltoall(dsend, drecv, count, type, s);
    check(cuda, cuda.stream_sync(stream), "cudaStreamSynchronize");
    check(cuda, cuda.memcpy_(back.data(), drecv, whole * esize, kToHost), "cudaMemcpy");
    wrong = 0;
    for (int r = 0; r < n; ++r) {
      test::fill_input(type, ReduceOp::Sum, r, n, want.data(), count, count * static_cast<std::size_t>(rank));
      wrong += std::memcmp(want.data(), back.data() + static_cast<std::size_t>(r) * count * esize, count * esize) != 0;
    }
    report(fmt::format("alltoall {}", to_string(type)), wrong);
  }
  // send/recv: every rank sends block k of its Sum input to rank + k (k = 1..n-1) and receives
  // from rank - k, all in one group on the stream (a pipeline-parallel pattern).
  {
    const DataType type = DataType::Float32;
    const std::size_t esize = size_of(type), whole = count * static_cast<std::size_t>(n);
    test::fill_input(type, ReduceOp::Sum, rank, n, host.data(), whole);
    check(cuda, cuda.memcpy_(dsend, host.data(), whole * esize, kToDevice), "cudaMemcpy");
    comm.group_start();
    for (int k = 1; k < n; ++k) {
      const int to = (rank + k) % n, from = (rank + n - k) % n;
      comm.send(static_cast<std::byte*>(dsend) + static_cast<std::size_t>(k) * count * esize, count, type, to, s);
      comm.recv(static_cast<std::byte*>(drecv) + static_cast<std::size_t>(k) * count * esize, count, type, from, s);
    }
    comm.group_end();
    check(cuda, cuda.stream_sync(stream), "cudaStreamSynchronize");
    check(cuda, cuda.memcpy_(back.data(), drecv, whole * esize, kToHost), "cudaMemcpy");
    std::size_t wrong = 0;
    std::vector<std::byte> want(count * esize);
    for (int k = 1; k < n; ++k) {
      test::fill_input(type, ReduceOp::Sum, (rank + n - k) % n, n, want.data(), count, static_cast<std::size_t>(k) * count);
      wrong += std::memcmp(want.data(), back.data() + static_cast<std::size_t>(k) * count * esize, count * esize) != 0;
    }
    report("send/recv group float32", wrong);
  }
  const Status err = comm.async_error();
  if (!err.is_ok()) {
    std::printf("rank %d: async_error: %s\n", rank, std::string(to_string(err.code())).c_str());
    ++failures;
  }
  const std::string path = comm.device_path();
  if (device_transports && (path != "device regions" || comm.device_staging_bytes() != 0)) {
    std::printf("rank %d: the calls did not all run on device regions: %s, %zu staging bytes\n", rank, path.c_str(),
                comm.device_staging_bytes());
    ++failures;
  }
  std::printf("rank %d: %d stream-ordered checks, %d failed, %zu staging bytes, %s\n", rank, checks, failures,
              comm.device_staging_bytes(), path.c_str());
  check(cuda, cuda.free_(dsend), "cudaFree");
  check(cuda, cuda.free_(drecv), "cudaFree");
  check(cuda, cuda.stream_destroy(stream), "cudaStreamDestroy");
  if (failures == 0 && rank == 0) std::printf("device collectives exact\n");
  return failures == 0 ? 0 : 1;
}
