#pragma once
// What the device-region tests share (device_regions_test.cpp, device_regions_health_test.cpp):
// options for thread ranks over the fake CUDA runtime and kernel module, the device transports,
// and one checked in-place allreduce.
#include <dlfcn.h>

#include <chrono>
#include <cstdint>
#include <ringfence/ringfence.hpp>
#include <ringfence/transports/cuda_ipc.hpp>
#include <string>
#include <vector>

#include "fake_device.hpp"
#include "support/catch.hpp"
#include "support/thread_ranks.hpp"
#include "support/verifiable.hpp"

extern "C" {
int cudaStreamSynchronize(void*);
int cudaMemcpyAsync(void*, const void*, std::size_t, int, void*);
int cudaSetDevice(int);
void fake_cuda_hold(void*, int);
void fake_cuda_slow_copies(int, int, unsigned);
}

namespace ringfence::test::regions {

inline CommOptions options(DeviceRegionsMode mode = DeviceRegionsMode::On, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  CommOptions o;
  o.host_id = "thread-host";
  o.timeout = timeout;
  o.chunk_bytes = 4096;
  o.cuda_runtime = RINGFENCE_FAKE_CUDART_PATH;
  o.cuda_kernels = RINGFENCE_FAKE_KERNELS_PATH;
  o.device_regions = mode;
  o.checksum = false;  // device regions verify no checksums yet (docs/device.md)
  return o;
}

// shm and tcp for the host lanes, then the two device transports.
inline TransportRegistry with_device_transports() {
  TransportRegistry r = builtin_transports();
  r.add(std::string(transports::cuda_ipc::kNvlinkName), transports::cuda_ipc::make_nvlink_transport);
  r.add(std::string(transports::cuda_ipc::kPcieName), transports::cuda_ipc::make_pcie_transport);
  return r;
}

// Agreements every 2 collectives, pair 1-2 judged on the fake NVML's device 0, link 1 (the
// tests' FakeNvmlState decides what its counters say).
inline CommOptions nvml_mapped_options() {
  CommOptions o = options();
  o.health_agree_every = 2;
  o.health_agree_min_interval = std::chrono::microseconds(0);  // by count only: these agreements fall at set calls
  o.health.nvml_library = RINGFENCE_FAKE_NVML_PATH;
  o.health_interval = std::chrono::milliseconds(0);
  o.health_link_map = "1-2=nvml:0:1";
  return o;
}

// One stream-ordered int32 sum allreduce in place on `buf` (verifiable inputs), waited for:
// the number of wrong elements.
inline std::size_t allreduce_in_place_wrong(Communicator& comm, Stream& stream, DeviceBuffer& buf, std::size_t count) {
  std::vector<std::int32_t> host(count);
  test::fill_input(DataType::Int32, ReduceOp::Sum, comm.rank(), comm.size(), host.data(), count);
  buf.put(host.data(), count * sizeof(std::int32_t));
  comm.allreduce(buf.p, buf.p, count, DataType::Int32, ReduceOp::Sum, stream.handle());
  T_CHECK(cudaStreamSynchronize(stream.s) == 0);
  return test::count_wrong(DataType::Int32, ReduceOp::Sum, comm.size(), buf.get(count * sizeof(std::int32_t)).data(), count);
}

inline unsigned long kernel_launches() {
  void* h = ::dlopen(RINGFENCE_FAKE_KERNELS_PATH, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return 0;
  auto* f = reinterpret_cast<unsigned long (*)()>(::dlsym(h, "fake_kernels_launches"));
  return f != nullptr ? f() : 0;
}

// Forgets which devices' kernels the fake module loaded (fake_kernels.cpp: lazy loading), so the
// next communicator setup or launch loads them again, whatever ran earlier in this process.
inline void unload_kernels() {
  void* h = ::dlopen(RINGFENCE_FAKE_KERNELS_PATH, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(h != nullptr);
  auto* f = reinterpret_cast<void (*)()>(::dlsym(h, "fake_kernels_unload"));
  REQUIRE(f != nullptr);
  f();
}


}  // namespace ringfence::test::regions
