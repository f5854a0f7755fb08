#pragma once
// Device buffers and streams of the fake CUDA runtime (fake_cudart_streams.cpp) for thread-rank
// tests: RAII, with T_CHECK (Catch2 assertions are not thread-safe; rank threads throw).
#include <fmt/format.h>

#include <chrono>
#include <cstddef>
#include <ringfence/communicator.hpp>
#include <ringfence/options.hpp>
#include <ringfence/types.hpp>
#include <stdexcept>
#include <vector>

#include "support/thread_ranks.hpp"
#include "support/verifiable.hpp"

extern "C" {
int cudaMalloc(void**, std::size_t);
int cudaFree(void*);
int cudaMemcpy(void*, const void*, std::size_t, int);
int cudaStreamCreate(void**);
int cudaStreamDestroy(void*);
int cudaStreamSynchronize(void*);
}

namespace ringfence::test {

/// Thread ranks on one host whose stream-ordered calls are host-staged over the fake runtime:
/// 4 KiB chunks, so the test sizes cross several.
inline CommOptions staged_options(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  CommOptions o;
  o.host_id = "thread-host";
  o.timeout = timeout;
  o.chunk_bytes = 4096;
  o.cuda_runtime = RINGFENCE_FAKE_CUDART_PATH;
  return o;
}

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

/// Stream-ordered allreduce of `count` elements on device memory for every dtype × op, out of
/// place and in place, each waited for and checked exactly (verifiable.hpp inputs); throws
/// naming the first wrong one.
inline void allreduce_every_type_and_op(Communicator& comm, const Stream& stream, std::size_t count) {
  const int n = comm.size();
  DeviceBuffer send(count * 8), recv(count * 8);
  std::vector<std::byte> host(count * 8);
  for (int t = 0; t < kNumDataTypes; ++t)
    for (int o = 0; o < kNumReduceOps; ++o)
      for (bool in_place : {false, true}) {
        const auto type = static_cast<DataType>(t);
        const auto op = static_cast<ReduceOp>(o);
        fill_input(type, op, comm.rank(), n, host.data(), count);
        send.put(host.data(), count * size_of(type));
        comm.allreduce(send.p, in_place ? send.p : recv.p, count, type, op, stream.handle());
        T_CHECK(cudaStreamSynchronize(stream.s) == 0);
        const std::vector<std::byte> got = (in_place ? send : recv).get(count * size_of(type));
        if (count_wrong(type, op, n, got.data(), count) != 0)
          throw std::runtime_error(fmt::format("rank {}: allreduce {} {}{}: wrong elements", comm.rank(), to_string(type), to_string(op),
                                               in_place ? " in place" : ""));
      }
}

}  // namespace ringfence::test
