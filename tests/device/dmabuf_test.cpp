// GPUDirect RDMA's export step (transports/ibverbs/dmabuf.hpp): the page span around a buffer,
// and the CUDA driver's dma-buf export, here from the fake runtime (whose device allocations are
// shared-memory segments, so the fd it gives can be mapped and read back). The registration
// itself (ibv_reg_dmabuf_mr) needs an HCA: tests/ib.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <ringfence/error.hpp>
#include <vector>

#include "dmabuf.hpp"
#include "support/catch.hpp"

extern "C" {
int cudaMalloc(void**, std::size_t);
int cudaFree(void*);
int cudaMemcpy(void*, const void*, std::size_t, int);
}

using namespace ringfence;
using ringfence::transports::ibverbs::detail::CudaDmaBuf;
using ringfence::transports::ibverbs::detail::page_span;
using ringfence::transports::ibverbs::detail::PageSpan;

TEST_CASE("dmabuf: the page span covers the range with whole pages", "[dmabuf]") {
  STATIC_REQUIRE(page_span(0x1234, 1, 4096).start == 0x1000);
  STATIC_REQUIRE(page_span(0x1234, 1, 4096).length == 4096);
  STATIC_REQUIRE(page_span(0x1000, 4096, 4096).length == 4096);     // exactly one page
  STATIC_REQUIRE(page_span(0x1fff, 2, 4096).length == 8192);        // straddles a boundary
  STATIC_REQUIRE(page_span(0x200000, 0x200001, 0x10000).length == 0x210000);
  STATIC_REQUIRE(page_span(UINTPTR_MAX - 10, 100, 4096).length == 0);  // wraps: refused
  STATIC_REQUIRE(page_span(UINTPTR_MAX - 4000, 10, 4096).length == 0);  // its last page would wrap
}

TEST_CASE("dmabuf: no driver, or a driver without the export, is reported, not thrown", "[dmabuf]") {
  const CudaDmaBuf none("/nonexistent/libcuda.so.1");
  REQUIRE_FALSE(none.usable());
  REQUIRE_THAT(none.why_not(), Catch::Contains("cannot load the CUDA driver /nonexistent/libcuda.so.1"));
  REQUIRE_THROWS_WITH(none.export_pages(PageSpan{0x1000, 4096}), Catch::Contains("dma-buf export unusable"));
  const CudaDmaBuf libc("libc.so.6");  // loads, lacks the entry points
  REQUIRE_THAT(libc.why_not(), Catch::Contains("lacks cuInit or cuMemGetHandleForAddressRange"));
}

TEST_CASE("dmabuf: the export of the pages around a device buffer maps to that buffer's bytes", "[dmabuf]") {
  const CudaDmaBuf dmabuf(RINGFENCE_FAKE_CUDART_PATH);
  REQUIRE(dmabuf.usable());
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t bytes = 3 * page + 100;
  void* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, bytes) == 0);
  std::vector<std::uint8_t> pattern(bytes);
  for (std::size_t i = 0; i < bytes; ++i) pattern[i] = static_cast<std::uint8_t>(i * 13 + 5);
  REQUIRE(cudaMemcpy(dev, pattern.data(), bytes, 1) == 0);

  // A buffer in the middle of the allocation: from byte page + 10, 2 pages long.
  const auto base = reinterpret_cast<std::uintptr_t>(dev);
  const PageSpan span = page_span(base + page + 10, 2 * page, page);
  REQUIRE(span.start == base + page);
  REQUIRE(span.length == 3 * page);
  const int fd = dmabuf.export_pages(span);
  REQUIRE(fd >= 0);
  void* m = ::mmap(nullptr, span.length, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(span.start - base));
  ::close(fd);
  REQUIRE(m != MAP_FAILED);
  REQUIRE(std::memcmp(m, pattern.data() + page, bytes - page) == 0);
  ::munmap(m, span.length);

  // Ranges the driver refuses: not whole pages, past the allocation.
  REQUIRE_THROWS_WITH(dmabuf.export_pages(PageSpan{base + 10, page}),
                      Catch::Contains("cuMemGetHandleForAddressRange") && Catch::Contains("invalid argument (fake)") &&
                          Catch::Contains("CUresult 1"));
  REQUIRE_THROWS_AS(dmabuf.export_pages(PageSpan{base, 8 * page}), CudaError);
  REQUIRE(cudaFree(dev) == 0);
}
