#pragma once
// The CUDA runtime functions the host-staged device path calls, loaded with dlopen (ringfence
// links no CUDA library and includes no CUDA header: the declarations below are our own, like
// the NVML source's; src/nccl/cuda_runtime.cpp, built against the installed cuda_runtime_api.h
// where one exists, checks the constants and signatures at compile time). Loaded per user (a
// DeviceStager), never unloaded. Under include/ringfence/detail/ (internal, not API, may change
// freely) because the CUDA IPC transports share these declarations with the core and a
// transport must not reach into the core's private src/.
#include <cstddef>
#include <string>

namespace ringfence::detail {

inline constexpr int kCudaSuccess = 0;
inline constexpr int kCudaErrorNotReady = 600;    ///< cudaErrorNotReady (cudaEventQuery: not yet)
inline constexpr unsigned kCudaEventDisableTiming = 2;
inline constexpr int kCudaMemcpyDefault = 4;      ///< cudaMemcpyDefault: direction from the pointers
inline constexpr unsigned kCudaHostAllocPortable = 1;
inline constexpr unsigned kCudaHostAllocMapped = 2;
inline constexpr unsigned kCuStreamWaitValueGeq = 0;  ///< CU_STREAM_WAIT_VALUE_GEQ: (int32_t)(*addr - value) >= 0
/// The driver API version whose cuStreamWaitValue32 we call (the _v2 entry point, CUDA 12.0).
inline constexpr unsigned kCuStreamWaitValueVersion = 12000;
inline constexpr unsigned kCudaStreamNonBlocking = 1;
inline constexpr unsigned kCudaIpcMemLazyEnablePeerAccess = 1;
inline constexpr int kCudaErrorPeerAccessAlreadyEnabled = 704;
inline constexpr int kCudaMemoryTypeDevice = 2;    ///< cudaMemoryTypeDevice
inline constexpr int kCudaMemoryTypeManaged = 3;   ///< cudaMemoryTypeManaged
inline constexpr std::size_t kCudaIpcHandleBytes = 64;

/// cudaIpcMemHandle_t: 64 opaque bytes, passed by value.
struct CudaIpcHandle {
  char reserved[kCudaIpcHandleBytes];
};
/// cudaPointerAttributes (CUDA 11 and later layout).
struct CudaPointerAttributes {
  int type = 0;  ///< cudaMemoryType: 0 unregistered host, 1 host, 2 device, 3 managed
  int device = 0;
  void* device_pointer = nullptr;
  void* host_pointer = nullptr;
  long reserved[8] = {};
};

/// The loaded functions. `usable` is false when the library, a symbol, a driver or a device is
/// missing; `why_not` then says which.
struct CudaApi {
  using HostFn = void (*)(void*);
  int (*get_device_count)(int*) = nullptr;
  const char* (*error_string)(int) = nullptr;
  int (*memcpy_async)(void*, const void*, std::size_t, int, void*) = nullptr;
  int (*launch_host_func)(void*, HostFn, void*) = nullptr;
  int (*host_alloc)(void**, std::size_t, unsigned) = nullptr;
  int (*free_host)(void*) = nullptr;
  int (*event_create)(void**, unsigned) = nullptr;  ///< cudaEventCreateWithFlags
  int (*event_record)(void*, void*) = nullptr;      ///< cudaEventRecord(event, stream)
  int (*event_query)(void*) = nullptr;              ///< cudaEventQuery
  int (*event_destroy)(void*) = nullptr;            ///< cudaEventDestroy
  /// The driver's cuStreamWaitValue32(stream, device address, value, flags), found through
  /// cudaGetDriverEntryPointByVersion, or cudaGetDriverEntryPoint where the runtime lacks it
  /// (CUDA 12.0-12.4), so no libcuda is linked or opened by name: a stream
  /// operation that holds the stream until a 32-bit word in mapped pinned memory reaches a
  /// value. Optional: null when the runtime or driver lacks it (DeviceStager then holds the
  /// stream with a host function). Returns a CUresult (0: enqueued).
  int (*stream_wait_value32)(void*, unsigned long long, unsigned, unsigned) = nullptr;
  /// cudaHostGetDevicePointer(device pointer, host pointer, 0): optional, with
  /// `stream_wait_value32`.
  int (*host_get_device_pointer)(void**, void*, unsigned) = nullptr;
  bool usable = false;
  std::string why_not;
  std::string library;  ///< the file dlopen found

  /// The CUDA IPC transports' functions (transports/cuda_ipc): bound when present, `ipc` says
  /// whether all were; `ipc_why_not` names the missing ones. The staged path needs none.
  int (*get_device)(int*) = nullptr;
  int (*malloc)(void**, std::size_t) = nullptr;
  int (*free)(void*) = nullptr;
  int (*memcpy)(void*, const void*, std::size_t, int) = nullptr;
  int (*pointer_attributes)(CudaPointerAttributes*, const void*) = nullptr;
  int (*device_can_access_peer)(int*, int, int) = nullptr;
  int (*device_enable_peer_access)(int, unsigned) = nullptr;
  int (*ipc_get_mem_handle)(CudaIpcHandle*, void*) = nullptr;
  int (*ipc_open_mem_handle)(void**, CudaIpcHandle, unsigned) = nullptr;
  int (*ipc_close_mem_handle)(void*) = nullptr;
  int (*stream_create)(void**, unsigned) = nullptr;  ///< cudaStreamCreateWithFlags
  int (*stream_destroy)(void*) = nullptr;
  int (*stream_synchronize)(void*) = nullptr;
  int (*stream_wait_event)(void*, void*, unsigned) = nullptr;
  /// cudaDeviceGetPCIBusId(char* out, int len, int device): optional, outside `ipc` (the
  /// communicator finds its GPU in NVML with it, `CommOptions::kHealthGpuFromCuda`).
  int (*device_get_pci_bus_id)(char*, int, int) = nullptr;
  /// cudaSetDevice: optional, outside `ipc` (the device lane's calls run on the progress thread,
  /// which must make the lane's device current before it launches kernels).
  int (*set_device)(int) = nullptr;
  /// cudaEventElapsedTime(float* ms, start, end): optional, outside `ipc` (the CUDA IPC links
  /// time their copies with it for the health layer's bandwidth evidence).
  int (*event_elapsed_time)(float*, void*, void*) = nullptr;
  bool ipc = false;
  std::string ipc_why_not;

  /// "cudaFoo failed: <error string> (code N)".
  std::string describe(const char* call, int err) const;
};

/// Loads the CUDA runtime: `path` when not empty, else libcudart.so.13, .12, .11.0, then
/// libcudart.so (found through the usual loader search, LD_LIBRARY_PATH included). Never throws.
CudaApi load_cuda_api(const std::string& path);

}  // namespace ringfence::detail
