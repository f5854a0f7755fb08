#pragma once
// GPUDirect RDMA for the ibverbs transport: CUDA device memory exported as a dma-buf file
// descriptor (cuMemGetHandleForAddressRange) for ibv_reg_dmabuf_mr, the upstream path that
// needs no nvidia-peermem module (NVIDIA open kernel modules r515+, Linux 5.12+, rdma-core 34+).
// The CUDA driver (libcuda.so.1) is dlopen'ed with our own declarations, like the runtime in
// include/ringfence/detail/cuda_api.hpp: nothing here needs a CUDA header, and no CUDA type appears. Internal to the
// transport and its tests.
#include <cstddef>
#include <cstdint>
#include <string>

namespace ringfence::transports::ibverbs::detail {

/// Whole pages covering a byte range: what a dma-buf export and its registration take.
struct PageSpan {
  std::uintptr_t start = 0;  ///< first page (aligned down)
  std::size_t length = 0;    ///< bytes to the end of the last page (aligned up)
};

/// The pages covering [ptr, ptr + bytes); `page` is a power of two. Overflow-safe: a range that
/// wraps the address space gives length 0.
constexpr PageSpan page_span(std::uintptr_t ptr, std::size_t bytes, std::size_t page) noexcept {
  const std::uintptr_t mask = static_cast<std::uintptr_t>(page) - 1;
  const std::uintptr_t start = ptr & ~mask;
  if (bytes > UINTPTR_MAX - ptr || ptr + bytes > UINTPTR_MAX - mask) return PageSpan{start, 0};
  const std::uintptr_t end = (ptr + bytes + mask) & ~mask;
  return PageSpan{start, static_cast<std::size_t>(end - start)};
}

/// The CUDA driver's dma-buf export, loaded on construction. Thread-safe after construction.
class CudaDmaBuf {
 public:
  /// Loads `path` (empty: libcuda.so.1) and calls cuInit(0). Never throws: `usable()` says
  /// whether it worked, `why_not()` why not.
  explicit CudaDmaBuf(const std::string& path = {});
  /// True when the driver and its export entry point are there.
  bool usable() const noexcept { return why_not_.empty(); }
  /// Why the export cannot be used (empty when it can).
  const std::string& why_not() const noexcept { return why_not_; }
  /// A dma-buf fd for `span` (the caller closes it). Throws `CudaError` naming the call, the
  /// range and the driver's message.
  int export_pages(const PageSpan& span) const;

 private:
  int (*mem_get_handle_)(void*, unsigned long long, std::size_t, int, unsigned long long) = nullptr;
  int (*get_error_string_)(int, const char**) = nullptr;
  std::string library_;
  std::string why_not_;
};

}  // namespace ringfence::transports::ibverbs::detail
