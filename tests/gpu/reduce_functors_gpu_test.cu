// The reduction functors are shared by host and device (include/ringfence/reduce_ops.hpp).
// This test runs every (dtype, op) on the GPU and compares each element bit for bit with the
// host kernels (src/reduce.cpp: the vectorised AVX2/F16C loops the CPU engine uses), over
// random bit patterns (so infinities, denormals and NaNs occur) and exact small integers.
// Any NaN equals any NaN (NaN payloads differ between x86 and the GPU by design); every other
// value must match exactly. Exits 77 without a usable GPU (CTest: skipped).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <ringfence/reduce_ops.hpp>

#include "reduce_kernels.cuh"
#include <vector>

namespace rf = ringfence;

namespace {

template <class T, class Op>
__global__ void apply(T* dst, const T* a, const T* b, std::size_t n, Op op) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    dst[i] = op(a[i], b[i]);
}

template <class T>
bool is_nan(T v) {
  if constexpr (std::is_same_v<T, rf::Half> || std::is_same_v<T, rf::BFloat16>) {
    const float f = rf::to_float(v);
    return f != f;
  } else if constexpr (std::is_floating_point_v<T>) {
    return v != v;
  } else {
    return false;
  }
}

#define CHECK_CUDA(call)                                                                        \
  do {                                                                                          \
    const cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));                   \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

// Elements [off, n) of `got` against `want` (NaN equals NaN); prints the first few.
template <class T>
std::size_t mismatches(const char* name, const std::vector<T>& got, const std::vector<T>& want, const std::vector<T>& a,
                       const std::vector<T>& b, std::size_t off);

// Runs `op` on the GPU over (a, b) and compares with the host kernel `host`. Returns mismatches.
template <class T, class Op>
std::size_t compare(const char* name, const std::vector<T>& a, const std::vector<T>& b, Op op, rf::CombineFn host, int divisor,
                    rf::DataType type, rf::ReduceOp rop, bool finish) {
  const std::size_t n = a.size();
  std::vector<T> want(n), got(n);
  host(want.data(), a.data(), b.data(), n, divisor);
  T *da = nullptr, *db = nullptr, *dd = nullptr;
  CHECK_CUDA(cudaMalloc(&da, n * sizeof(T)));
  CHECK_CUDA(cudaMalloc(&db, n * sizeof(T)));
  CHECK_CUDA(cudaMalloc(&dd, n * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(da, a.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(db, b.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  // Three device paths, each compared with the host: the plain functor kernel, and the
  // vectorised kernels of reduce_kernels.cuh aligned (offset 0) and misaligned (offset 1
  // element: scalar head and tail around the 16-byte packs).
  std::size_t bad = 0;
  for (int path = 0; path < 3; ++path) {
    const std::size_t off = path == 2 ? 1 : 0;
    CHECK_CUDA(cudaMemset(dd, 0, n * sizeof(T)));
    if (path == 0) {
      apply<<<256, 256>>>(dd, da, db, n, op);
      CHECK_CUDA(cudaGetLastError());
    } else {
      CHECK_CUDA(rf::cuda::launch_combine(type, rop, finish, divisor, dd + off, da + off, db + off, n - off, nullptr));
    }
    CHECK_CUDA(cudaMemcpy(got.data(), dd, n * sizeof(T), cudaMemcpyDeviceToHost));
    const std::string label = std::string(name) + (path == 0 ? "" : path == 1 ? " vec16" : " vec16+1");
    bad += mismatches(label.c_str(), got, want, a, b, off);
  }
  CHECK_CUDA(cudaFree(da));
  CHECK_CUDA(cudaFree(db));
  CHECK_CUDA(cudaFree(dd));
  std::printf("%-22s %zu elements x 3 device paths, %zu mismatches\n", name, n, bad);
  return bad;
}

template <class T>
std::size_t mismatches(const char* name, const std::vector<T>& got, const std::vector<T>& want, const std::vector<T>& a,
                       const std::vector<T>& b, std::size_t off) {
  const std::size_t n = got.size();
  std::size_t bad = 0;
  for (std::size_t i = off; i < n; ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) == 0) continue;
    if (is_nan(got[i]) && is_nan(want[i])) continue;
    if (bad++ < 3) {
      std::uint64_t g = 0, w = 0, x = 0, y = 0;
      std::memcpy(&g, &got[i], sizeof(T));
      std::memcpy(&w, &want[i], sizeof(T));
      std::memcpy(&x, &a[i], sizeof(T));
      std::memcpy(&y, &b[i], sizeof(T));
      std::printf("  %s element %zu: a=%#llx b=%#llx gpu=%#llx host=%#llx\n", name, i, static_cast<unsigned long long>(x),
                  static_cast<unsigned long long>(y), static_cast<unsigned long long>(g), static_cast<unsigned long long>(w));
    }
  }
  return bad;
}

template <rf::DataType D>
std::size_t run_type(std::mt19937_64& rng) {
  using T = typename rf::StorageOf<D>::type;
  constexpr std::size_t n = 1 << 20;
  std::vector<T> a(n), b(n);
  for (std::size_t i = 0; i < n; ++i) {
    // Half the elements random bits, half small exact integers.
    if (i % 2 == 0) {
      std::uint64_t x = rng(), y = rng();
      std::memcpy(&a[i], &x, sizeof(T));
      std::memcpy(&b[i], &y, sizeof(T));
    } else {
      a[i] = rf::detail::store<T>(static_cast<typename rf::detail::ComputeOf<T>::type>(rng() % 100));
      b[i] = rf::detail::store<T>(static_cast<typename rf::detail::ComputeOf<T>::type>(rng() % 100));
    }
  }
  const std::string t(rf::to_string(D));
  std::size_t bad = 0;
  const int divisor = 7;
  bad += compare((t + "/sum").c_str(), a, b, rf::SumOp<T>{}, rf::host_reducer(D, rf::ReduceOp::Sum).combine, divisor, D, rf::ReduceOp::Sum, false);
  bad += compare((t + "/prod").c_str(), a, b, rf::ProdOp<T>{}, rf::host_reducer(D, rf::ReduceOp::Prod).combine, divisor, D, rf::ReduceOp::Prod, false);
  bad += compare((t + "/min").c_str(), a, b, rf::MinOp<T>{}, rf::host_reducer(D, rf::ReduceOp::Min).combine, divisor, D, rf::ReduceOp::Min, false);
  bad += compare((t + "/max").c_str(), a, b, rf::MaxOp<T>{}, rf::host_reducer(D, rf::ReduceOp::Max).combine, divisor, D, rf::ReduceOp::Max, false);
  bad += compare((t + "/avg-final").c_str(), a, b, rf::SumDivOp<T>{divisor}, rf::host_reducer(D, rf::ReduceOp::Avg).finish, divisor, D, rf::ReduceOp::Avg, true);
  return bad;
}

}  // namespace

int main() {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("no usable GPU (%s): skipping\n", e == cudaSuccess ? "0 devices" : cudaGetErrorString(e));
    return 77;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("GPU 0: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  std::mt19937_64 rng(42);
  std::size_t bad = 0;
  bad += run_type<rf::DataType::Int8>(rng);
  bad += run_type<rf::DataType::Uint8>(rng);
  bad += run_type<rf::DataType::Int32>(rng);
  bad += run_type<rf::DataType::Uint32>(rng);
  bad += run_type<rf::DataType::Int64>(rng);
  bad += run_type<rf::DataType::Uint64>(rng);
  bad += run_type<rf::DataType::Float16>(rng);
  bad += run_type<rf::DataType::BFloat16>(rng);
  bad += run_type<rf::DataType::Float32>(rng);
  bad += run_type<rf::DataType::Float64>(rng);
  std::printf("%s: %zu mismatches in total\n", bad ? "FAILED" : "OK", bad);
  return bad ? 1 : 0;
}
