// Conformance of the ibverbs transport on real hardware: two transports in one process (ranks 0
// and 1 of a 2-rank job) on the same active HCA port, connected by RC queue pairs through the
// port's loopback. Checks exact bytes of registered and unregistered (staged) writes, a signal
// ordered after them, completion ids, out-of-bounds writes refused before posting, and fence
// idempotence with later operations refused. With a GPU too: GPUDirect RDMA, a registered host
// buffer written into device memory registered by dma-buf and back out of it (the GPU part is
// reported skipped, and the host part still judged, without a CUDA runtime or device). Exits
// 77 (CTest: skipped) without an HCA.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ringfence/error.hpp>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/transports/ibverbs.hpp>
#include <thread>
#include <vector>

#include "cuda_rt.hpp"

using namespace ringfence;
namespace ib = ringfence::transports::ibverbs;

namespace {

int failures = 0;
#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                            \
    }                                                                        \
  } while (0)

// Polls `link` until `count` completions arrived (or 10 s passed); returns them.
std::vector<Completion> drain(Link& link, std::size_t count) {
  std::vector<Completion> got;
  Completion buf[8];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (got.size() < count && std::chrono::steady_clock::now() < deadline) {
    std::size_t n = 0;
    if (!link.poll(buf, n).is_ok()) break;
    got.insert(got.end(), buf, buf + n);
  }
  return got;
}

}  // namespace

int main() {
  const CommOptions options = CommOptions::from_env();  // RINGFENCE_IB_HCA etc. (src/env.cpp)
  Logger log(LogLevel::Info);
  const PeerInfo p0{0, "loopback", 1}, p1{1, "loopback", 2};
  auto a = ib::make_transport(TransportContext{p0, 2, &options, &log});
  auto b = ib::make_transport(TransportContext{p1, 2, &options, &log});
  const Reachability r = a->can_reach(p0, p1);
  if (!r.ok) {
    std::printf("SKIP: no usable HCA: %s\n", r.reason.c_str());
    return 77;
  }
  std::printf("ibverbs loopback: %.1f GB/s expected\n", r.bandwidth_gbps);
  try {
    auto la = a->listen(), lb = b->listen();
    auto pa = a->connect(*la, p1, lb->address());
    auto pb = b->connect(*lb, p0, la->address());
    std::unique_ptr<Link> ab, ba;
    CHECK(pa->try_finish(ab).is_ok());
    CHECK(pb->try_finish(ba).is_ok());
    if (!ab || !ba) return 1;

    // b's memory: 1 MiB of data and a signal flag; a's registered source.
    constexpr std::size_t kBytes = 1 << 20;
    std::vector<std::byte> dst(kBytes, std::byte{0});
    SignalFlag flag;
    std::vector<std::byte> src(kBytes);
    for (std::size_t i = 0; i < kBytes; ++i) src[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);
    std::vector<std::byte> unregistered(4096);
    for (std::size_t i = 0; i < unregistered.size(); ++i) unregistered[i] = static_cast<std::byte>(255 - (i & 0xff));

    MemoryRegion dst_mr = b->register_memory(dst.data(), dst.size(), MemoryKind::Host);
    MemoryRegion flag_mr = b->register_memory(&flag, sizeof flag, MemoryKind::Host);
    MemoryRegion src_mr = a->register_memory(src.data(), src.size(), MemoryKind::Host);
    const RemoteRegion rdst = a->import_region(dst_mr.key());
    const RemoteRegion rflag = a->import_region(flag_mr.key());
    CHECK(rdst.size() == kBytes);

    // Registered write of the first 768 KiB, a staged write of 4 KiB at the end, then a signal.
    CHECK(ab->write(WriteOp{src.data(), &src_mr, &rdst, 0, 768 * 1024, 11}).is_ok());
    CHECK(ab->write(WriteOp{unregistered.data(), nullptr, &rdst, kBytes - 4096, 4096, 12}).is_ok());
    CHECK(ab->signal(SignalOp{&rflag, 0, 1, 13}).is_ok());
    // Out of bounds: refused before posting.
    CHECK(ab->write(WriteOp{src.data(), &src_mr, &rdst, kBytes - 8, 16, 14}).code() == ErrorCode::InvalidUsage);
    CHECK(ab->write(WriteOp{src.data(), &src_mr, &rdst, SIZE_MAX - 4, 16, 15}).code() == ErrorCode::InvalidUsage);
    CHECK(ab->signal(SignalOp{&rflag, sizeof flag, 2, 16}).code() == ErrorCode::InvalidUsage);

    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    Status w(ErrorCode::InProgress);
    while (w.in_progress() && std::chrono::steady_clock::now() < deadline) w = ba->wait(flag, 1, std::chrono::milliseconds(20));
    CHECK(w.is_ok());
    CHECK(std::memcmp(dst.data(), src.data(), 768 * 1024) == 0);
    CHECK(std::memcmp(dst.data() + kBytes - 4096, unregistered.data(), 4096) == 0);
    bool untouched = true;
    for (std::size_t i = 768 * 1024; i < kBytes - 4096; ++i) untouched &= dst[i] == std::byte{0};
    CHECK(untouched);

    const auto done = drain(*ab, 3);
    CHECK(done.size() == 3);
    for (std::size_t i = 0; i < done.size(); ++i) {
      CHECK(done[i].wr_id == 11 + i);
      CHECK(done[i].status.is_ok());
    }
    CHECK(ab->stats().writes.load() == 2);
    CHECK(ab->stats().signals.load() == 1);
    CHECK(ab->stats().bytes_written.load() == 768 * 1024 + 4096);
    CHECK(ab->stats().errors.load() == 3);  // the three refused operations above

    // GPUDirect RDMA over b -> a: a registered host source written into a's device memory
    // (registered by dma-buf), a signal after it, the bytes read back with cudaMemcpy.
    tools::CudaRt cuda;
    if (const std::string why = cuda.load(options.cuda_runtime); !why.empty()) {
      std::printf("GPUDirect RDMA part skipped: %s\n", why.c_str());
    } else {
      constexpr std::size_t kDev = 256 * 1024 + 4;
      void* dev = nullptr;
      cuda.check(cuda.malloc_(&dev, kDev), "cudaMalloc");
      std::vector<std::byte> zeros(kDev, std::byte{0}), back(kDev);
      cuda.check(cuda.memcpy_(dev, zeros.data(), kDev, tools::CudaRt::kHostToDevice), "cudaMemcpy");
      MemoryRegion dev_mr = a->register_memory(dev, kDev, MemoryKind::Device);
      MemoryRegion src_b = b->register_memory(src.data(), src.size(), MemoryKind::Host);
      SignalFlag flag_a;
      MemoryRegion flag_a_mr = a->register_memory(&flag_a, sizeof flag_a, MemoryKind::Host);
      const RemoteRegion rdev = b->import_region(dev_mr.key());
      const RemoteRegion rflag_a = b->import_region(flag_a_mr.key());
      CHECK(rdev.size() == kDev);
      CHECK(ba->write(WriteOp{src.data() + 12, &src_b, &rdev, 0, kDev, 30}).is_ok());
      CHECK(ba->signal(SignalOp{&rflag_a, 0, 1, 31}).is_ok());
      Status g(ErrorCode::InProgress);
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (g.in_progress() && std::chrono::steady_clock::now() < until) g = ab->wait(flag_a, 1, std::chrono::milliseconds(20));
      CHECK(g.is_ok());
      cuda.check(cuda.memcpy_(back.data(), dev, kDev, tools::CudaRt::kDeviceToHost), "cudaMemcpy");
      CHECK(std::memcmp(back.data(), src.data() + 12, kDev) == 0);
      CHECK(drain(*ba, 2).size() == 2);
      std::printf("GPUDirect RDMA: %zu bytes host -> device by dma-buf registration exact\n", kDev);
      dev_mr = MemoryRegion();
      cuda.check(cuda.free_(dev), "cudaFree");
    }

    // Fence: idempotent, later operations refused, state Fenced.
    ab->fence(FenceReason::User);
    ab->fence(FenceReason::User);
    CHECK(ab->state() == LinkState::Fenced);
    CHECK(ab->write(WriteOp{src.data(), &src_mr, &rdst, 0, 64, 20}).code() == ErrorCode::Fenced);
    CHECK(ab->signal(SignalOp{&rflag, 0, 2, 21}).code() == ErrorCode::Fenced);
    std::size_t n = 0;
    Completion c[4];
    CHECK(ab->poll(c, n).is_ok());
    CHECK(n == 0);
    CHECK(ba->state() == LinkState::Up);

  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  if (failures) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("ibverbs loopback conformance: OK\n");
  return 0;
}
