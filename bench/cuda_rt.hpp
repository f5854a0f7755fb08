#pragma once
// The CUDA runtime calls a benchmark or test program makes itself (device buffers, a stream,
// copies), loaded with dlopen and declared here (no CUDA header, no CUDA link): the programs
// build everywhere and run on the real runtime, or on the fake of tests/device in CI.
#include <dlfcn.h>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace ringfence::tools {

struct CudaRt {
  int (*get_device_count)(int*) = nullptr;
  int (*set_device)(int) = nullptr;
  int (*malloc_)(void**, std::size_t) = nullptr;
  int (*free_)(void*) = nullptr;
  int (*memcpy_)(void*, const void*, std::size_t, int) = nullptr;
  int (*stream_create)(void**) = nullptr;
  int (*stream_create_flags)(void**, unsigned) = nullptr;  ///< cudaStreamCreateWithFlags (optional)
  int (*stream_destroy)(void*) = nullptr;
  int (*stream_sync)(void*) = nullptr;
  const char* (*error_string)(int) = nullptr;
  int (*device_sync)() = nullptr;                      ///< cudaDeviceSynchronize
  int (*host_alloc)(void**, std::size_t, unsigned) = nullptr;  ///< cudaHostAlloc (optional)
  int (*free_host)(void*) = nullptr;                   ///< cudaFreeHost (optional)
  int devices = 0;

  static constexpr int kHostToDevice = 1;  ///< cudaMemcpyHostToDevice
  static constexpr int kDeviceToHost = 2;  ///< cudaMemcpyDeviceToHost
  static constexpr int kDeviceToDevice = 3;  ///< cudaMemcpyDeviceToDevice
  static constexpr unsigned kStreamNonBlocking = 1;  ///< cudaStreamNonBlocking

  /// Loads `path` (empty: libcudart.so.13, .12, .11.0, libcudart.so) and counts devices.
  /// Returns why the runtime is unusable, or "" when it is.
  std::string load(const std::string& path) {
    void* h = nullptr;
    if (!path.empty()) {
      h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    } else {
      for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"})
        if (h == nullptr) h = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    }
    if (h == nullptr) return path.empty() ? "no CUDA runtime library (libcudart.so.13/.12/.11.0)" : "cannot load " + path;
    bind(h, "cudaGetDeviceCount", get_device_count);
    bind(h, "cudaSetDevice", set_device);
    bind(h, "cudaMalloc", malloc_);
    bind(h, "cudaFree", free_);
    bind(h, "cudaMemcpy", memcpy_);
    bind(h, "cudaStreamCreate", stream_create);
    bind(h, "cudaStreamCreateWithFlags", stream_create_flags);
    bind(h, "cudaStreamDestroy", stream_destroy);
    bind(h, "cudaStreamSynchronize", stream_sync);
    bind(h, "cudaGetErrorString", error_string);
    bind(h, "cudaDeviceSynchronize", device_sync);
    bind(h, "cudaHostAlloc", host_alloc);
    bind(h, "cudaFreeHost", free_host);
    if (!get_device_count || !set_device || !malloc_ || !free_ || !memcpy_ || !stream_create || !stream_destroy || !stream_sync ||
        !error_string || !device_sync)
      return "the CUDA runtime library lacks a function this program needs";
    if (const int err = get_device_count(&devices); err != 0) return std::string("cudaGetDeviceCount: ") + error_string(err);
    if (devices <= 0) return "no CUDA device";
    return "";
  }

  /// Throws std::runtime_error "<what> failed: <error string>" for a failed call.
  void check(int err, const char* what) const {
    if (err != 0) throw std::runtime_error(std::string(what) + " failed: " + error_string(err));
  }

 private:
  template <class F>
  static void bind(void* h, const char* name, F& f) {
    f = reinterpret_cast<F>(::dlsym(h, name));
  }
};

}  // namespace ringfence::tools
