#include "dmabuf.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <ringfence/error.hpp>

namespace ringfence::transports::ibverbs::detail {
namespace {
constexpr int kDmaBufFd = 1;  // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
}  // namespace

CudaDmaBuf::CudaDmaBuf(const std::string& path) : library_(path.empty() ? "libcuda.so.1" : path) {
  void* h = ::dlopen(library_.c_str(), RTLD_NOW | RTLD_LOCAL);  // never closed: MRs outlive us
  if (h == nullptr) {
    const char* e = ::dlerror();
    why_not_ = fmt::format("cannot load the CUDA driver {} ({})", library_, e != nullptr ? e : "unknown error");
    return;
  }
  auto* init = reinterpret_cast<int (*)(unsigned)>(::dlsym(h, "cuInit"));
  mem_get_handle_ = reinterpret_cast<decltype(mem_get_handle_)>(::dlsym(h, "cuMemGetHandleForAddressRange"));
  get_error_string_ = reinterpret_cast<decltype(get_error_string_)>(::dlsym(h, "cuGetErrorString"));
  if (init == nullptr || mem_get_handle_ == nullptr) {
    why_not_ = fmt::format("{} lacks cuInit or cuMemGetHandleForAddressRange (CUDA 11.7 or later is needed for dma-buf)", library_);
    return;
  }
  if (const int err = init(0); err != 0) why_not_ = fmt::format("cuInit failed in {} (CUresult {})", library_, err);
}

int CudaDmaBuf::export_pages(const PageSpan& span) const {
  RINGFENCE_EXPECTS(usable(), "dma-buf export unusable: {}", why_not_);
  int fd = -1;
  const int err = mem_get_handle_(&fd, static_cast<unsigned long long>(span.start), span.length, kDmaBufFd, 0);
  if (err != 0) {
    const char* text = nullptr;
    if (get_error_string_ != nullptr) (void)get_error_string_(err, &text);
    throw CudaError(fmt::format("cuMemGetHandleForAddressRange({:#x}, {} bytes, dma-buf) failed: {} (CUresult {}; device memory "
                                "from cudaMalloc, an NVIDIA open kernel module r515+ and Linux 5.12+ are needed)",
                                span.start, span.length, text != nullptr ? text : "unknown error", err),
                    err);
  }
  return fd;
}

}  // namespace ringfence::transports::ibverbs::detail
