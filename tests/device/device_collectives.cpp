// Stream-ordered collectives on CUDA memory, across processes (one rank per process, several
// ranks may share a GPU): every dtype x op for allreduce (out of place and in place), and
// reduce_scatter, allgather, broadcast, reduce, alltoall, checked exactly (integer-valued
// inputs, tests/support/verifiable.hpp). Run by ringfence-run; the CUDA runtime is the one the
// communicator loads (RINGFENCE_CUDART, else libcudart.so.13/.12/...): the real one on a GPU
// machine (tests/gpu), the fake with threads for streams in CI (tests/device). Exits 77 when no
// CUDA runtime, driver or device is usable.
//   device_collectives [COUNT]   elements per rank and call (default 4099: not a multiple of anything)
#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <ringfence/ringfence.hpp>
#include <string>
#include <vector>

#include "support/verifiable.hpp"

using namespace ringfence;

namespace {

// The CUDA runtime calls this test makes itself (allocation, streams, copies).
struct Cuda {
  int (*get_device_count)(int*) = nullptr;
  int (*set_device)(int) = nullptr;
  int (*malloc_)(void**, std::size_t) = nullptr;
  int (*free_)(void*) = nullptr;
  int (*memcpy_)(void*, const void*, std::size_t, int) = nullptr;
  int (*stream_create)(void**) = nullptr;
  int (*stream_destroy)(void*) = nullptr;
  int (*stream_sync)(void*) = nullptr;
  const char* (*error_string)(int) = nullptr;
  std::string why_not;
};

template <class F>
void bind(void* h, const char* name, F& f) {
  f = reinterpret_cast<F>(::dlsym(h, name));
}

Cuda load(const std::string& path) {
  Cuda c;
  void* h = nullptr;
  if (!path.empty()) h = ::dlopen(path.c_str(), RTLD_NOW);
  for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"})
    if (h == nullptr && path.empty()) h = ::dlopen(name, RTLD_NOW);
  if (h == nullptr) {
    c.why_not = "no CUDA runtime library";
    return c;
  }
  bind(h, "cudaGetDeviceCount", c.get_device_count);
  bind(h, "cudaSetDevice", c.set_device);
  bind(h, "cudaMalloc", c.malloc_);
  bind(h, "cudaFree", c.free_);
  bind(h, "cudaMemcpy", c.memcpy_);
  bind(h, "cudaStreamCreate", c.stream_create);
  bind(h, "cudaStreamDestroy", c.stream_destroy);
  bind(h, "cudaStreamSynchronize", c.stream_sync);
  bind(h, "cudaGetErrorString", c.error_string);
  int n = 0;
  if (!c.get_device_count || !c.set_device || !c.malloc_ || !c.free_ || !c.memcpy_ || !c.stream_create || !c.stream_destroy ||
      !c.stream_sync || !c.error_string) {
    c.why_not = "the CUDA runtime library lacks a function this test needs";
  } else if (const int err = c.get_device_count(&n); err != 0) {
    c.why_not = fmt::format("cudaGetDeviceCount: {}", c.error_string(err));
  } else if (n <= 0) {
    c.why_not = "no CUDA device";
  }
  return c;
}

void check(const Cuda& c, int err, const char* what) {
  if (err != 0) throw std::runtime_error(fmt::format("{} failed: {}", what, c.error_string(err)));
}

constexpr int kToDevice = 1, kToHost = 2;  // cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost

}  // namespace

int main(int argc, char** argv) {
  const std::size_t count = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 4099;
  Communicator comm = Communicator::from_env();
  const int rank = comm.rank(), n = comm.size();
  const Cuda cuda = load(comm.options().cuda_runtime);
  if (!cuda.why_not.empty()) {
    std::printf("rank %d: skipped: %s\n", rank, cuda.why_not.c_str());
    return 77;
  }
  int devices = 0;
  check(cuda, cuda.get_device_count(&devices), "cudaGetDeviceCount");
  check(cuda, cuda.set_device(rank % devices), "cudaSetDevice");  // ranks share GPUs when n > devices
  void* stream = nullptr;
  check(cuda, cuda.stream_create(&stream), "cudaStreamCreate");
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
  const Status err = comm.async_error();
  if (!err.is_ok()) {
    std::printf("rank %d: async_error: %s\n", rank, std::string(to_string(err.code())).c_str());
    ++failures;
  }
  std::printf("rank %d: %d stream-ordered checks, %d failed, %zu staging bytes\n", rank, checks, failures,
              comm.device_staging_bytes());
  check(cuda, cuda.free_(dsend), "cudaFree");
  check(cuda, cuda.free_(drecv), "cudaFree");
  check(cuda, cuda.stream_destroy(stream), "cudaStreamDestroy");
  if (failures == 0 && rank == 0) std::printf("device collectives exact\n");
  return failures == 0 ? 0 : 1;
}
