// The copy bandwidths the device path is measured against (scripts/device-check.sh prints them
// next to all_reduce_perf --memory device): device-to-device cudaMemcpy, and pinned host <-> device
// (the host-staged stream-ordered calls cross PCIe twice per call). Bytes copied per second
// (a device-to-device copy reads and writes each byte: its memory traffic is twice that).
//   device_memcpy_bw [MiB] [ITERS]   default 256 MiB, 20 copies; CUDA runtime from
//                                    RINGFENCE_CUDART's value given as the third argument, else
//                                    libcudart.so.13/.12/...
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda_rt.hpp"

int main(int argc, char** argv) {
  const std::size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 256;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 20;
  const std::string path = argc > 3 ? argv[3] : "";
  ringfence::tools::CudaRt cuda;
  if (const std::string why = cuda.load(path); !why.empty()) {
    std::printf("# device_memcpy_bw: %s: skipped (exit 77)\n", why.c_str());
    return 77;
  }
  try {
    const std::size_t bytes = mib << 20;
    void *a = nullptr, *b = nullptr, *h = nullptr;
    cuda.check(cuda.malloc_(&a, bytes), "cudaMalloc");
    cuda.check(cuda.malloc_(&b, bytes), "cudaMalloc");
    const bool pinned = cuda.host_alloc != nullptr && cuda.free_host != nullptr;
    if (pinned) cuda.check(cuda.host_alloc(&h, bytes, 0), "cudaHostAlloc");
    auto measure = [&](void* dst, const void* src, int kind) {
      for (int i = 0; i < 2; ++i) cuda.check(cuda.memcpy_(dst, src, bytes, kind), "cudaMemcpy");  // warm-up
      cuda.check(cuda.device_sync(), "cudaDeviceSynchronize");
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) cuda.check(cuda.memcpy_(dst, src, bytes, kind), "cudaMemcpy");
      cuda.check(cuda.device_sync(), "cudaDeviceSynchronize");
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return static_cast<double>(bytes) * iters / s / 1e9;
    };
    const double d2d = measure(b, a, ringfence::tools::CudaRt::kDeviceToDevice);
    std::printf("device-to-device cudaMemcpy  %6zu MiB x %d: %8.1f GB/s (memory traffic %.1f GB/s)\n", mib, iters, d2d, 2 * d2d);
    if (pinned) {
      std::printf("pinned host -> device       %6zu MiB x %d: %8.1f GB/s\n", mib, iters,
                  measure(a, h, ringfence::tools::CudaRt::kHostToDevice));
      std::printf("device -> pinned host       %6zu MiB x %d: %8.1f GB/s\n", mib, iters,
                  measure(h, a, ringfence::tools::CudaRt::kDeviceToHost));
      cuda.check(cuda.free_host(h), "cudaFreeHost");
    }
    cuda.check(cuda.free_(a), "cudaFree");
    cuda.check(cuda.free_(b), "cudaFree");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "device_memcpy_bw: %s\n", e.what());
    return 1;
  }
  return 0;
}
