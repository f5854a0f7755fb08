#include "device_kernels.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

namespace ringfence::detail {

DeviceKernels load_device_kernels(const std::string& path) {
  DeviceKernels k;
  void* handle = nullptr;
  std::string tried;
  auto attempt = [&](const std::string& name) {
    if (handle != nullptr) return;
    handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      k.library = name;
    } else {
      const char* e = ::dlerror();
      tried += fmt::format("{}{} ({})", tried.empty() ? "" : ", ", name, e != nullptr ? e : "not found");
    }
  };
  if (!path.empty()) {
    attempt(path);
  } else {
    Dl_info info{};
    if (::dladdr(reinterpret_cast<const void*>(&load_device_kernels), &info) != 0 && info.dli_fname != nullptr) {
      std::string dir = info.dli_fname;
      const auto slash = dir.rfind('/');
      dir = slash == std::string::npos ? std::string(".") : dir.substr(0, slash);
      attempt(dir + "/" + kKernelsLibrary);
      attempt(dir + "/../lib/" + kKernelsLibrary);
    }
    attempt(kKernelsLibrary);
  }
  if (handle == nullptr) {
    k.why_not = fmt::format("no device kernel module (tried {})", tried);
    return k;
  }
  auto* version = reinterpret_cast<int (*)()>(::dlsym(handle, "ringfence_kernels_abi_version"));
  k.combine = reinterpret_cast<decltype(k.combine)>(::dlsym(handle, "ringfence_kernels_combine"));
  k.preload = reinterpret_cast<decltype(k.preload)>(::dlsym(handle, "ringfence_kernels_preload"));
  if (version == nullptr || k.combine == nullptr) {
    k.why_not = fmt::format("{} lacks ringfence_kernels_abi_version or ringfence_kernels_combine", k.library);
    k.combine = nullptr;
    k.preload = nullptr;
    return k;
  }
  if (const int v = version(); v != kKernelsAbiVersion || k.preload == nullptr) {
    k.why_not = fmt::format("{} speaks kernel interface version {}{}, this library {}", k.library, v,
                            k.preload == nullptr ? " (no ringfence_kernels_preload)" : "", kKernelsAbiVersion);
    k.combine = nullptr;
    k.preload = nullptr;
    return k;
  }
  k.usable = true;
  return k;
}

}  // namespace ringfence::detail
