// One suite over every transport the CPU can run (gloo's tests parameterised over its
// transports): the SPI contract of include/ringfence/transport.hpp checked identically on shm,
// tcp (loopback), the fault decorator (over shm, with a rule that never fires), the CUDA IPC
// transports nvlink and pcie over the fake CUDA runtime (tests/device/fake_cudart_streams.cpp:
// "device" memory is host-addressable shared memory, copies are delayed threads), and, when it is
// built, ibverbs over the fake libibverbs (tests/support/fake_verbs.cpp: one InfiniBand port, RC
// queue pairs within this process, RDMA writes done by memcpy after the HCA's key, range and
// queue pair state checks). Each case runs once per transport (GENERATE). Transport-specific
// behaviour (striping, CMA, peer access, hostile frames) stays in the transports' own tests; a
// real HCA is exercised by tests/ib.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <memory>
#include <ringfence/error.hpp>
#include <ringfence/fault.hpp>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/transports/cuda_ipc.hpp>
#include <ringfence/transports/shm.hpp>
#include <ringfence/transports/tcp.hpp>
#ifdef RINGFENCE_FAKE_VERBS_PATH
#include <ringfence/transports/ibverbs.hpp>
#endif
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/completions.hpp"

using namespace ringfence;

namespace {

// The transports under test, by the name the suite reports.
const std::vector<std::string> kTransports = {"shm", "tcp", "fault(shm)", "nvlink", "pcie",
#ifdef RINGFENCE_FAKE_VERBS_PATH
                                              "ibverbs",
#endif
};

bool is_device(const std::string& t) { return t == "nvlink" || t == "pcie"; }

// Two ranks of one process (0 and 1), a transport each, and a link each way.
struct Pair {
  std::string kind;
  CommOptions options;
  Logger log;
  PeerInfo info_a{0, "conformance-host", static_cast<std::int32_t>(::getpid())};
  PeerInfo info_b{1, "conformance-host", static_cast<std::int32_t>(::getpid())};
  // Memory for transports without an allocator, 64-aligned like every staging area and flag
  // block the engine hands a transport (a SignalFlag sits on its own cache line). Declared
  // before the transports and links so that it outlives them: a late frame may still land.
  struct AlignedFree {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  std::vector<std::unique_ptr<std::byte, AlignedFree>> heap;
  std::unique_ptr<Transport> a, b;
  std::unique_ptr<ListenHandle> la, lb;
  std::unique_ptr<Link> a_to_b, b_to_a;

  explicit Pair(std::string k) : kind(std::move(k)) {
    options.transport_settings["RINGFENCE_SHM_SPIN"] = "10";
    options.transport_settings["RINGFENCE_SOCKET_IFNAME"] = "lo";
    options.cuda_runtime = RINGFENCE_FAKE_CUDART_PATH;
#ifdef RINGFENCE_FAKE_VERBS_PATH
    options.transport_settings["RINGFENCE_IB_LIBRARY"] = RINGFENCE_FAKE_VERBS_PATH;
#endif
    a = make(info_a);
    b = make(info_b);
    la = a->listen();
    lb = b->listen();
    // Both ends call connect (the transport decides who dials) and poll until both are up.
    auto pa = a->connect(*la, info_b, lb->address());
    auto pb = b->connect(*lb, info_a, la->address());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!a_to_b || !b_to_a) {
      if (!a_to_b) {
        const Status s = pa->try_finish(a_to_b);
        REQUIRE_FALSE(s.is_error());
      }
      if (!b_to_a) {
        const Status s = pb->try_finish(b_to_a);
        REQUIRE_FALSE(s.is_error());
      }
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  std::unique_ptr<Transport> make(const PeerInfo& self) {
    const TransportContext ctx{self, 2, &options, &log};
    if (kind == "shm") return transports::shm::make_transport(ctx);
    if (kind == "tcp") return transports::tcp::make_transport(ctx);
    if (kind == "nvlink") return transports::cuda_ipc::make_nvlink_transport(ctx);
    if (kind == "pcie") return transports::cuda_ipc::make_pcie_transport(ctx);
#ifdef RINGFENCE_FAKE_VERBS_PATH
    if (kind == "ibverbs") return transports::ibverbs::make_transport(ctx);
#endif
    // A rule on every link that never fires: the decorator wraps the link and must forward
    // every operation unchanged.
    return make_fault_transport(transports::shm::make_transport(ctx), parse_fault_spec("flip:rate=0,link=*"), self.rank);
  }

  // Zeroed memory of `t` for data (device memory for the device transports) or flags (host).
  std::byte* memory(Transport& t, std::size_t bytes, MemoryKind kind) {
    auto* p = static_cast<std::byte*>(t.allocate(bytes, kind));
    if (!p) {
      p = static_cast<std::byte*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
      REQUIRE(p != nullptr);
      heap.emplace_back(p);
    }
    std::memset(p, 0, bytes);  // the fake runtime's device memory is host-addressable
    return p;
  }
  MemoryKind data_kind() const { return is_device(kind) ? MemoryKind::Device : MemoryKind::Host; }

  // What the write cases use: `src_bytes` of a's data memory (registered), `dst_bytes` of b's
  // data memory and a 4 KiB flag block of b (host memory, `flag_bytes` of it registered), both
  // imported by a. Zeroed.
  struct Buffers {
    std::byte *src, *dst, *flags;
    MemoryRegion src_reg, dst_reg, flag_reg;
    RemoteRegion rdst, rflags;
  };
  Buffers buffers(std::size_t src_bytes, std::size_t dst_bytes, std::size_t flag_bytes) {
    Buffers x{memory(*a, src_bytes, data_kind()), memory(*b, dst_bytes, data_kind()), memory(*b, 4096, MemoryKind::Host), {}, {}, {}, {}, {}};
    x.src_reg = a->register_memory(x.src, src_bytes, data_kind());
    x.dst_reg = b->register_memory(x.dst, dst_bytes, data_kind());
    x.flag_reg = b->register_memory(x.flags, flag_bytes, MemoryKind::Host);
    x.rdst = a->import_region(x.dst_reg.key());
    x.rflags = a->import_region(x.flag_reg.key());
    return x;
  }

  // Waits until `flag` (written by a over a_to_b) reaches `target`, bounded by 10 s: the
  // receiver waits on its link while the sender's link is polled, since a transport may deliver
  // only through its sender's progress (nvlink and pcie store a signal behind their copies).
  bool delivered(SignalFlag& flag, std::uint32_t target) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      Completion c[8];
      std::size_t n = 0;
      if (!a_to_b->poll(c, n).is_ok()) return false;
      const Status s = b_to_a->wait(flag, target, std::chrono::milliseconds(1));
      if (s.is_ok()) return true;
      if (s.is_error()) return false;
    }
    return false;
  }
};

}  // namespace

TEST_CASE("conformance: both ends connect, are up and name their peer", "[conformance]") {
  const std::string kind = GENERATE(from_range(kTransports));
  INFO("transport " << kind);
  Pair p(kind);
  CHECK(p.a_to_b->state() == LinkState::Up);
  CHECK(p.b_to_a->state() == LinkState::Up);
  CHECK(p.a_to_b->peer() == 1);
  CHECK(p.b_to_a->peer() == 0);
  CHECK(p.a->can_reach(p.info_a, p.info_b).ok);
  CHECK_FALSE(p.a->name().empty());
}

TEST_CASE("conformance: a signal is seen only after the writes before it, and completions carry their ids in order",
          "[conformance]") {
  const std::string kind = GENERATE(from_range(kTransports));
  INFO("transport " << kind);
  Pair p(kind);
  const std::size_t bytes = 300 * 1024 + 77;  // several chunks, stripes and bounce slots, odd tail
  auto [src, dst, flags, src_reg, dst_reg, flag_reg, rdst, rflags] = p.buffers(bytes, bytes + 128, 4096);
  for (std::size_t i = 0; i < bytes; ++i) src[i] = static_cast<std::byte>(i * 29 + 3);
  REQUIRE(rdst.size() == bytes + 128);

  REQUIRE(p.a_to_b->write(WriteOp{src, &src_reg, &rdst, 64, bytes, 7}).is_ok());
  REQUIRE(p.a_to_b->write(WriteOp{src, &src_reg, &rdst, 0, 16, 8}).is_ok());  // a second, small write
  REQUIRE(p.a_to_b->signal(SignalOp{&rflags, 128, 1, 9}).is_ok());
  auto& flag = *reinterpret_cast<SignalFlag*>(flags + 128);
  // The sender's progress may be what delivers (tcp sends in poll, nvlink stores behind copies).
  std::vector<Completion> done;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (flag.value.load(std::memory_order_acquire) < 1 && std::chrono::steady_clock::now() < deadline) {
    Completion c[8];
    std::size_t n = 0;
    REQUIRE(p.a_to_b->poll(c, n).is_ok());
    done.insert(done.end(), c, c + n);
    (void)p.b_to_a->wait(flag, 1, std::chrono::milliseconds(1));
  }
  REQUIRE(flag.value.load(std::memory_order_acquire) == 1);
  // Every byte written before the signal is there.
  CHECK(std::memcmp(dst + 64, src, bytes) == 0);
  CHECK(std::memcmp(dst, src, 16) == 0);
  CHECK(std::all_of(dst + 16, dst + 64, [](std::byte b) { return b == std::byte{0}; }));
  CHECK(std::all_of(dst + 64 + bytes, dst + bytes + 128, [](std::byte b) { return b == std::byte{0}; }));
  const auto rest = test::collect_completions(*p.a_to_b, 3 - done.size());
  done.insert(done.end(), rest.begin(), rest.end());
  REQUIRE(done.size() == 3);
  CHECK(done[0].wr_id == 7);
  CHECK(done[1].wr_id == 8);
  CHECK(done[2].wr_id == 9);
  CHECK(std::all_of(done.begin(), done.end(), [](const Completion& c) { return c.status.is_ok(); }));
  CHECK(p.a_to_b->stats().bytes_written.load() == bytes + 16);
  CHECK(p.a_to_b->stats().writes.load() == 2);
  CHECK(p.a_to_b->stats().signals.load() == 1);
  // Signals count up: a later, larger value is seen too.
  REQUIRE(p.a_to_b->signal(SignalOp{&rflags, 128, 5, 10}).is_ok());
  CHECK(p.delivered(flag, 5));
}

TEST_CASE("conformance: a wait that is not satisfied returns InProgress after its slice", "[conformance]") {
  const std::string kind = GENERATE(from_range(kTransports));
  INFO("transport " << kind);
  Pair p(kind);
  std::byte* flags = p.memory(*p.b, 4096, MemoryKind::Host);
  auto& flag = *reinterpret_cast<SignalFlag*>(flags);
  const auto start = std::chrono::steady_clock::now();
  const Status s = p.b_to_a->wait(flag, 1, std::chrono::milliseconds(2));
  CHECK(s.in_progress());
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));  // bounded by its slice, not forever
}

TEST_CASE("conformance: out-of-bounds and misaligned operations are refused, counted, and write nothing", "[conformance]") {
  const std::string kind = GENERATE(from_range(kTransports));
  INFO("transport " << kind);
  Pair p(kind);
  auto [src, dst, flags, src_reg, dst_reg, flag_reg, rdst, rflags] = p.buffers(4096, 1024, 128);
  std::memset(src, 0x5a, 4096);
  CHECK(p.a_to_b->write(WriteOp{src, &src_reg, &rdst, 1000, 100, 1}).code() == ErrorCode::InvalidUsage);       // past the end
  CHECK(p.a_to_b->write(WriteOp{src, &src_reg, &rdst, SIZE_MAX - 8, 16, 2}).code() == ErrorCode::InvalidUsage);  // wraps
  CHECK(p.a_to_b->signal(SignalOp{&rflags, 96, 1, 3}).code() == ErrorCode::InvalidUsage);  // the flag would cross the end
  CHECK(p.a_to_b->signal(SignalOp{&rflags, 8, 1, 4}).code() == ErrorCode::InvalidUsage);   // misaligned
  CHECK(p.a_to_b->stats().errors.load() == 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(std::all_of(dst, dst + 1024, [](std::byte b) { return b == std::byte{0}; }));
  // Exactly to the end is in bounds.
  REQUIRE(p.a_to_b->write(WriteOp{src, &src_reg, &rdst, 1000, 24, 5}).is_ok());
  REQUIRE(p.a_to_b->signal(SignalOp{&rflags, 64, 1, 6}).is_ok());
  auto& flag = *reinterpret_cast<SignalFlag*>(flags + 64);
  REQUIRE(p.delivered(flag, 1));
  CHECK(std::memcmp(dst + 1000, src, 24) == 0);
}

TEST_CASE("conformance: fence is idempotent and later operations fail as Fenced", "[conformance]") {
  const std::string kind = GENERATE(from_range(kTransports));
  INFO("transport " << kind);
  Pair p(kind);
  auto [src, dst, flags, src_reg, dst_reg, flag_reg, rdst, rflags] = p.buffers(256, 256, 128);
  p.a_to_b->fence(FenceReason::User);
  p.a_to_b->fence(FenceReason::User);  // idempotent
  CHECK(p.a_to_b->state() == LinkState::Fenced);
  CHECK(p.a_to_b->write(WriteOp{src, &src_reg, &rdst, 0, 64, 1}).code() == ErrorCode::Fenced);
  CHECK(p.a_to_b->signal(SignalOp{&rflags, 0, 1, 2}).code() == ErrorCode::Fenced);
}

TEST_CASE("conformance: malformed region keys are refused with InvalidUsage", "[conformance]") {
  const std::string kind = GENERATE(from_range(kTransports));
  INFO("transport " << kind);
  Pair p(kind);
  const std::vector<std::byte> garbage(7, std::byte{0x42});
  CHECK_THROWS_AS(p.a->import_region(garbage), InvalidUsage);
  CHECK_THROWS_AS(p.a->import_region(std::span<const std::byte>()), InvalidUsage);
  std::byte* dst = p.memory(*p.b, 512, p.data_kind());
  MemoryRegion reg = p.b->register_memory(dst, 512, p.data_kind());
  Bytes key = reg.key();
  REQUIRE_FALSE(key.empty());
  key.resize(key.size() - 1);  // truncated
  CHECK_THROWS_AS(p.a->import_region(key), InvalidUsage);
}
