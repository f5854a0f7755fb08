// The CUDA runtime as the shim sees it: loaded lazily with dlopen (the shim links no CUDA
// library), asked only whether a pointer is device memory and which device is current. Without
// the library, a driver or a device every pointer is host memory and there is no device.
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "cuda_runtime.hpp"

#include <cstddef>
#include <type_traits>

#include <ringfence/detail/cuda_api.hpp>
#if __has_include(<cuda.h>)
#include <cuda.h>  // declarations only: the driver's cuStreamWaitValue32 against ours
#endif

// The core's own CUDA declarations (include/ringfence/detail/cuda_api.hpp, used without CUDA headers) against the
// real header: same values, and the same signatures with handles (cudaStream_t, cudaEvent_t)
// passed as void*.
namespace ringfence::detail {
static_assert(kCudaSuccess == cudaSuccess);
static_assert(kCudaErrorNotReady == cudaErrorNotReady);
static_assert(kCudaMemcpyDefault == cudaMemcpyDefault);
static_assert(kCudaHostAllocPortable == cudaHostAllocPortable);
static_assert(kCudaHostAllocMapped == cudaHostAllocMapped);
static_assert(std::is_same_v<decltype(&::cudaHostGetDevicePointer), cudaError_t (*)(void**, void*, unsigned int)>);
static_assert(std::is_same_v<decltype(&::cudaGetDriverEntryPointByVersion),
                             cudaError_t (*)(const char*, void**, unsigned int, unsigned long long, cudaDriverEntryPointQueryResult*)>);
static_assert(sizeof(cudaDriverEntryPointQueryResult) == sizeof(int) && cudaDriverEntryPointSuccess == 0);
#if __has_include(<cuda.h>)
static_assert(kCuStreamWaitValueGeq == CU_STREAM_WAIT_VALUE_GEQ);
static_assert(std::is_same_v<CUdeviceptr, unsigned long long> && sizeof(CUresult) == sizeof(int) && std::is_pointer_v<CUstream>);
static_assert(std::is_same_v<decltype(&::cuStreamWaitValue32), CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int)>);
#endif
static_assert(kCudaEventDisableTiming == cudaEventDisableTiming);
static_assert(std::is_pointer_v<cudaStream_t> && std::is_pointer_v<cudaEvent_t>);
static_assert(sizeof(cudaError_t) == sizeof(int) && sizeof(cudaMemcpyKind) == sizeof(int));
static_assert(std::is_same_v<decltype(&::cudaGetDeviceCount), cudaError_t (*)(int*)>);
static_assert(std::is_same_v<decltype(&::cudaMemcpyAsync), cudaError_t (*)(void*, const void*, std::size_t, cudaMemcpyKind, cudaStream_t)>);
static_assert(std::is_same_v<decltype(&::cudaLaunchHostFunc), cudaError_t (*)(cudaStream_t, cudaHostFn_t, void*)>);
static_assert(std::is_same_v<decltype(&::cudaHostAlloc), cudaError_t (*)(void**, std::size_t, unsigned int)>);
static_assert(std::is_same_v<decltype(&::cudaFreeHost), cudaError_t (*)(void*)>);
static_assert(std::is_same_v<decltype(&::cudaEventCreateWithFlags), cudaError_t (*)(cudaEvent_t*, unsigned int)>);
static_assert(std::is_same_v<decltype(&::cudaEventRecord), cudaError_t (*)(cudaEvent_t, cudaStream_t)>);
static_assert(std::is_same_v<decltype(&::cudaEventQuery), cudaError_t (*)(cudaEvent_t)>);
static_assert(std::is_same_v<decltype(&::cudaEventDestroy), cudaError_t (*)(cudaEvent_t)>);
static_assert(std::is_same_v<decltype(&::cudaGetErrorString), const char* (*)(cudaError_t)>);
// The CUDA IPC transports' part (transports/cuda_ipc).
static_assert(kCudaStreamNonBlocking == cudaStreamNonBlocking);
static_assert(kCudaIpcMemLazyEnablePeerAccess == cudaIpcMemLazyEnablePeerAccess);
static_assert(kCudaErrorPeerAccessAlreadyEnabled == cudaErrorPeerAccessAlreadyEnabled);
static_assert(kCudaMemoryTypeDevice == cudaMemoryTypeDevice && kCudaMemoryTypeManaged == cudaMemoryTypeManaged);
static_assert(sizeof(CudaIpcHandle) == sizeof(cudaIpcMemHandle_t) && kCudaIpcHandleBytes == CUDA_IPC_HANDLE_SIZE);
static_assert(sizeof(CudaPointerAttributes) == sizeof(cudaPointerAttributes));
static_assert(offsetof(CudaPointerAttributes, type) == offsetof(cudaPointerAttributes, type));
static_assert(offsetof(CudaPointerAttributes, device) == offsetof(cudaPointerAttributes, device));
static_assert(offsetof(CudaPointerAttributes, device_pointer) == offsetof(cudaPointerAttributes, devicePointer));
static_assert(offsetof(CudaPointerAttributes, host_pointer) == offsetof(cudaPointerAttributes, hostPointer));
static_assert(std::is_same_v<decltype(&::cudaGetDevice), cudaError_t (*)(int*)>);
static_assert(std::is_same_v<decltype(&::cudaMalloc), cudaError_t (*)(void**, std::size_t)>);
static_assert(std::is_same_v<decltype(&::cudaFree), cudaError_t (*)(void*)>);
static_assert(std::is_same_v<decltype(&::cudaMemcpy), cudaError_t (*)(void*, const void*, std::size_t, cudaMemcpyKind)>);
static_assert(std::is_same_v<decltype(&::cudaPointerGetAttributes), cudaError_t (*)(cudaPointerAttributes*, const void*)>);
static_assert(std::is_same_v<decltype(&::cudaDeviceCanAccessPeer), cudaError_t (*)(int*, int, int)>);
static_assert(std::is_same_v<decltype(&::cudaDeviceEnablePeerAccess), cudaError_t (*)(int, unsigned int)>);
static_assert(std::is_same_v<decltype(&::cudaIpcGetMemHandle), cudaError_t (*)(cudaIpcMemHandle_t*, void*)>);
static_assert(std::is_same_v<decltype(&::cudaIpcOpenMemHandle), cudaError_t (*)(void**, cudaIpcMemHandle_t, unsigned int)>);
static_assert(std::is_same_v<decltype(&::cudaIpcCloseMemHandle), cudaError_t (*)(void*)>);
static_assert(std::is_same_v<decltype(&::cudaStreamCreateWithFlags), cudaError_t (*)(cudaStream_t*, unsigned int)>);
static_assert(std::is_same_v<decltype(&::cudaStreamDestroy), cudaError_t (*)(cudaStream_t)>);
static_assert(std::is_same_v<decltype(&::cudaStreamSynchronize), cudaError_t (*)(cudaStream_t)>);
static_assert(std::is_same_v<decltype(&::cudaEventElapsedTime), cudaError_t (*)(float*, cudaEvent_t, cudaEvent_t)>);
static_assert(std::is_same_v<decltype(&::cudaStreamWaitEvent), cudaError_t (*)(cudaStream_t, cudaEvent_t, unsigned int)>);
}  // namespace ringfence::detail

namespace ringfence::nccl {
namespace {

// The CUDA runtime's functions we call, typed by the installed cuda_runtime.h.
struct Runtime {
  decltype(&::cudaGetDeviceCount) get_device_count = nullptr;
  decltype(&::cudaGetDevice) get_device = nullptr;
  decltype(&::cudaPointerGetAttributes) pointer_attributes = nullptr;
  decltype(&::cudaGetErrorString) error_string = nullptr;
  decltype(&::cudaSetDevice) set_device = nullptr;  // optional
  bool usable = false;   // loaded, and at least one device answered
  std::string why_not;   // when not usable
};

template <class F>
bool bind(void* handle, const char* name, F& out) {
  out = reinterpret_cast<F>(::dlsym(handle, name));
  return out != nullptr;
}

Runtime load() {
  Runtime rt;
  void* handle = nullptr;
  std::string tried;
  for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"}) {
    handle = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) break;
    tried += std::string(tried.empty() ? "" : ", ") + name;
  }
  if (handle == nullptr) {
    rt.why_not = "no CUDA runtime library (tried " + tried + ")";
    return rt;
  }
  if (!bind(handle, "cudaGetDeviceCount", rt.get_device_count) || !bind(handle, "cudaGetDevice", rt.get_device) ||
      !bind(handle, "cudaPointerGetAttributes", rt.pointer_attributes) ||
      !bind(handle, "cudaGetErrorString", rt.error_string)) {
    rt.why_not = "the CUDA runtime library lacks cudaGetDeviceCount, cudaGetDevice, cudaPointerGetAttributes or cudaGetErrorString";
    return rt;
  }
  bind(handle, "cudaSetDevice", rt.set_device);
  int count = 0;
  const cudaError_t err = rt.get_device_count(&count);
  if (err != cudaSuccess) {
    rt.why_not = std::string("cudaGetDeviceCount failed: ") + rt.error_string(err);
  } else if (count <= 0) {
    rt.why_not = "cudaGetDeviceCount found no device";
  } else {
    rt.usable = true;
  }
  return rt;  // the library stays loaded (never dlclose'd) either way
}

const Runtime& runtime() {
  static std::once_flag once;
  static Runtime rt;
  std::call_once(once, [] { rt = load(); });
  return rt;
}

}  // namespace

bool cuda_device_present() noexcept { return runtime().usable; }

std::string cuda_absent_reason() { return runtime().why_not; }

int current_device() noexcept {
  const Runtime& rt = runtime();
  if (!rt.usable) return -1;
  int device = -1;
  return rt.get_device(&device) == cudaSuccess ? device : -1;
}

std::string set_current_device(int device) {
  const Runtime& rt = runtime();
  if (!rt.usable) return "no usable CUDA runtime (" + rt.why_not + ")";
  if (rt.set_device == nullptr) return "the CUDA runtime library lacks cudaSetDevice";
  if (device < 0) return "no device (" + std::to_string(device) + ")";
  const cudaError_t err = rt.set_device(device);
  return err == cudaSuccess ? std::string() : "cudaSetDevice(" + std::to_string(device) + ") failed: " + rt.error_string(err);
}

PointerKind pointer_kind(const void* ptr, int* device) noexcept {
  const Runtime& rt = runtime();
  if (!rt.usable || ptr == nullptr) return PointerKind::Host;
  cudaPointerAttributes attr{};
  if (rt.pointer_attributes(&attr, ptr) != cudaSuccess) return PointerKind::Host;  // unknown to CUDA
  if (device != nullptr) *device = attr.device;
  switch (attr.type) {
    case cudaMemoryTypeDevice: return PointerKind::Device;
    case cudaMemoryTypeManaged: return PointerKind::Managed;
    default: return PointerKind::Host;  // unregistered or page-locked host memory
  }
}

}  // namespace ringfence::nccl
