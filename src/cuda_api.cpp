#include <ringfence/detail/cuda_api.hpp>

#include <dlfcn.h>
#include <fmt/format.h>

namespace ringfence::detail {
namespace {

template <class F>
bool bind(void* handle, const char* name, F& out) {
  out = reinterpret_cast<F>(::dlsym(handle, name));
  return out != nullptr;
}

// cuStreamWaitValue32 through the runtime: cudaGetDriverEntryPointByVersion (CUDA 12.5 and
// later) for the 12.0 entry point, else cudaGetDriverEntryPoint (12.0-12.4: the runtime's own
// version's, v1 or v2, both with this signature). Both functions or neither.
void bind_stream_wait_value(void* handle, CudaApi& api) {
  using ByVersion = int (*)(const char*, void**, unsigned, unsigned long long, int*);
  using Latest = int (*)(const char*, void**, unsigned long long, int*);
  ByVersion by_version = nullptr;
  Latest latest = nullptr;
  const bool have_entry = bind(handle, "cudaGetDriverEntryPointByVersion", by_version) || bind(handle, "cudaGetDriverEntryPoint", latest);
  if (!have_entry || !bind(handle, "cudaHostGetDevicePointer", api.host_get_device_pointer)) {
    api.host_get_device_pointer = nullptr;
    return;
  }
  void* fn = nullptr;
  int found = -1;  // cudaDriverEntryPointQueryResult: 0 = found
  const int err = by_version != nullptr ? by_version("cuStreamWaitValue32", &fn, kCuStreamWaitValueVersion, 0, &found)
                                        : latest("cuStreamWaitValue32", &fn, 0, &found);
  if (err == kCudaSuccess && found == 0 && fn != nullptr) {
    api.stream_wait_value32 = reinterpret_cast<decltype(api.stream_wait_value32)>(fn);
  } else {
    api.host_get_device_pointer = nullptr;
  }
}

}  // namespace

std::string CudaApi::describe(const char* call, int err) const {
  const char* text = error_string != nullptr ? error_string(err) : nullptr;
  return fmt::format("{} failed: {} (code {})", call, text != nullptr ? text : "unknown error", err);
}

CudaApi load_cuda_api(const std::string& path) {
  CudaApi api;
  void* handle = nullptr;
  std::string tried;
  auto attempt = [&](const char* name) {
    if (handle != nullptr) return;
    handle = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      api.library = name;
    } else {
      tried += fmt::format("{}{}", tried.empty() ? "" : ", ", name);
    }
  };
  if (!path.empty()) {
    attempt(path.c_str());
  } else {
    for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"}) attempt(name);
  }
  if (handle == nullptr) {
    api.why_not = fmt::format("no CUDA runtime library (tried {})", tried);
    return api;
  }
  // cudaMemcpyAsync and cudaLaunchHostFunc are the default-stream-semantics entry points (not
  // the _ptsz ones), as a program compiled without --default-stream per-thread calls them.
  if (!bind(handle, "cudaGetDeviceCount", api.get_device_count) || !bind(handle, "cudaGetErrorString", api.error_string) || !bind(handle, "cudaMemcpyAsync", api.memcpy_async) ||
      !bind(handle, "cudaLaunchHostFunc", api.launch_host_func) || !bind(handle, "cudaHostAlloc", api.host_alloc) ||
      !bind(handle, "cudaFreeHost", api.free_host) || !bind(handle, "cudaEventCreateWithFlags", api.event_create) ||
      !bind(handle, "cudaEventRecord", api.event_record) || !bind(handle, "cudaEventQuery", api.event_query) ||
      !bind(handle, "cudaEventDestroy", api.event_destroy)) {
    api.why_not = fmt::format("{} lacks one of cudaGetDeviceCount, cudaGetErrorString, "
                              "cudaMemcpyAsync, cudaLaunchHostFunc, cudaHostAlloc, cudaFreeHost, cudaEventCreateWithFlags, "
                              "cudaEventRecord, cudaEventQuery, cudaEventDestroy",
                              api.library);
    return api;
  }
  {
    std::string missing;
    auto optional = [&](const char* name, auto& out) {
      if (!bind(handle, name, out)) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", name);
    };
    optional("cudaGetDevice", api.get_device);
    optional("cudaMalloc", api.malloc);
    optional("cudaFree", api.free);
    optional("cudaMemcpy", api.memcpy);
    optional("cudaPointerGetAttributes", api.pointer_attributes);
    optional("cudaDeviceCanAccessPeer", api.device_can_access_peer);
    optional("cudaDeviceEnablePeerAccess", api.device_enable_peer_access);
    optional("cudaIpcGetMemHandle", api.ipc_get_mem_handle);
    optional("cudaIpcOpenMemHandle", api.ipc_open_mem_handle);
    optional("cudaIpcCloseMemHandle", api.ipc_close_mem_handle);
    optional("cudaStreamCreateWithFlags", api.stream_create);
    optional("cudaStreamDestroy", api.stream_destroy);
    optional("cudaStreamSynchronize", api.stream_synchronize);
    optional("cudaStreamWaitEvent", api.stream_wait_event);
    api.ipc = missing.empty();
    if (!api.ipc) api.ipc_why_not = fmt::format("{} lacks {}", api.library, missing);
    bind(handle, "cudaDeviceGetPCIBusId", api.device_get_pci_bus_id);  // optional, outside `ipc`
    bind(handle, "cudaSetDevice", api.set_device);                       // optional, outside `ipc`
    bind(handle, "cudaEventElapsedTime", api.event_elapsed_time);        // optional, outside `ipc`
  }
  bind_stream_wait_value(handle, api);
  int count = 0;
  const int err = api.get_device_count(&count);
  if (err != kCudaSuccess) {
    api.why_not = fmt::format("{} (from {}; is an NVIDIA driver installed?)", api.describe("cudaGetDeviceCount", err), api.library);
  } else if (count <= 0) {
    api.why_not = fmt::format("cudaGetDeviceCount found no device (from {})", api.library);
  } else {
    api.usable = true;
  }
  return api;  // the library stays loaded (never dlclose'd): streams may still call into it
}

}  // namespace ringfence::detail
