#pragma once
/// \file cuda_runtime.hpp
/// The few CUDA runtime questions the NCCL shim asks, answered through a libcudart loaded with
/// dlopen on first use (libcudart.so.13, .12, .11.0, then libcudart.so). Without the library,
/// a driver or a device the answers degrade: no device, every pointer is host memory.

#include <cuda_runtime_api.h>

#include <string>

namespace ringfence::nccl {

/// What the CUDA runtime says a pointer is.
enum class PointerKind {
  Host,     ///< host memory (plain, page-locked, or unknown to CUDA)
  Device,   ///< device memory (cudaMalloc, cuMem*)
  Managed,  ///< managed memory (accessible from the host)
};

/// True when the runtime loaded and reported at least one device.
bool cuda_device_present() noexcept;
/// Why `cuda_device_present()` is false ("no CUDA runtime library (...)", "cudaGetDeviceCount
/// failed: ..."); empty when it is true.
std::string cuda_absent_reason();
/// The device current on this thread (cudaGetDevice), or -1 when there is none.
int current_device() noexcept;
/// Makes `device` current on this thread (cudaSetDevice). Returns why it could not (no
/// runtime, no cudaSetDevice, `device` < 0, or the call's CUDA error), empty when it did.
std::string set_current_device(int device);
/// The kind of `ptr`; `device` (optional) receives the owning device of device memory.
PointerKind pointer_kind(const void* ptr, int* device = nullptr) noexcept;

}  // namespace ringfence::nccl
