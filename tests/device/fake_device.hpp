#pragma once
// Device buffers and streams of the fake CUDA runtime (fake_cudart_streams.cpp) for thread-rank
// tests: RAII, with T_CHECK (Catch2 assertions are not thread-safe; rank threads throw).
#include <cstddef>
#include <ringfence/types.hpp>
#include <vector>

#include "support/thread_ranks.hpp"

extern "C" {
int cudaMalloc(void**, std::size_t);
int cudaFree(void*);
int cudaMemcpy(void*, const void*, std::size_t, int);
int cudaStreamCreate(void**);
int cudaStreamDestroy(void*);
}

namespace ringfence::test {

/// `bytes` of device memory on the fake (host memory the fake calls device memory).
struct DeviceBuffer {
  static constexpr int kHostToDevice = 1, kDeviceToHost = 2;
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit DeviceBuffer(std::size_t n) : bytes(n) { T_CHECK(cudaMalloc(&p, n) == 0); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  /// Copies `n` bytes from host memory in (cudaMemcpy).
  void put(const void* host, std::size_t n) { T_CHECK(cudaMemcpy(p, host, n, kHostToDevice) == 0); }
  /// The first `n` bytes (cudaMemcpy).
  std::vector<std::byte> get(std::size_t n) const {
    std::vector<std::byte> v(n);
    T_CHECK(cudaMemcpy(v.data(), p, n, kDeviceToHost) == 0);
    return v;
  }
};

/// A stream of the fake (a thread), destroyed at scope exit.
struct Stream {
  void* s = nullptr;
  Stream() { T_CHECK(cudaStreamCreate(&s) == 0); }
  ~Stream() { cudaStreamDestroy(s); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  CudaStream handle() const { return CudaStream{s}; }
};

}  // namespace ringfence::test
