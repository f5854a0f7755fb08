// Fuzz target: the tcp transport's receive side (transports/tcp/tcp_frame.hpp), fed a peer's
// byte streams as sockets would deliver them, without sockets. Input: byte 0 picks the socket
// count (1-3); then records [control][bytes], control = socket (low 2 bits) and piece length
// ((control >> 2) + 1, 1-64 bytes), so frames are split anywhere and sockets interleave.
// Registered regions: 0 (256 B), 1 (128 B, two flags), 2 (deregistered), 3 (empty).
// Invariants besides "no crash":
// - every byte goes into the reader's own header buffer or inside a registered region (checked
//   before the copy; guard bytes around each region must stay intact);
// - a malformed frame stops that reader for good (empty buffer, Malformed from then on);
// - a signal lands on an aligned flag inside a region, and only once the writes it follows
//   (counted independently here) completed on every socket; early signals stay bounded;
// - no heap allocation while parsing (counted), and the parser state is fixed-size.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <optional>
#include <type_traits>

#include "tcp_frame.hpp"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RF_FUZZ_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define RF_FUZZ_ASAN 1
#endif

namespace frame = ringfence::transports::tcp::frame;

namespace {

#define CHECK_OR_TRAP(cond) \
  do {                      \
    if (!(cond)) __builtin_trap(); \
  } while (0)

// Heap allocations made by this thread while `counting` is set.
thread_local bool counting = false;
thread_local std::size_t allocations = 0;

}  // namespace

#ifdef RF_FUZZ_ASAN
#if __has_include(<sanitizer/allocator_interface.h>)
#include <sanitizer/allocator_interface.h>
#else
// GCC ships no allocator_interface.h, but its libasan exports the hook installer.
extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void*, std::size_t),
                                                         void (*free_hook)(const volatile void*));
#endif
namespace {
void on_malloc(const volatile void*, std::size_t) {
  if (counting) ++allocations;
}
void on_free(const volatile void*) {}
[[maybe_unused]] const int hooks_installed = __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free);
}  // namespace
#else
// Without a sanitizer's hooks: count through the global operator new (the parser would have
// to use it, or malloc, to grow; it has no other way to hold more memory).
void* operator new(std::size_t n) {
  if (counting) ++allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace {

static_assert(std::is_trivially_copyable_v<frame::FrameReader> && std::is_trivially_copyable_v<frame::SignalOrder>,
              "the parser's state is plain fixed-size data: it cannot own heap memory");
static_assert(sizeof(frame::FrameReader) <= 256 && sizeof(frame::SignalOrder) <= 64 * 1024);

constexpr std::size_t kGuard = 64;
constexpr std::byte kGuardByte{0xa5};

struct Memory {
  alignas(64) std::byte data0[kGuard + 256 + kGuard];
  alignas(64) std::byte data1[kGuard + 128 + kGuard];
  Memory() {
    std::memset(data0, 0xa5, sizeof data0);
    std::memset(data1, 0xa5, sizeof data1);
  }
  std::byte* region0() { return data0 + kGuard; }
  std::byte* region1() { return data1 + kGuard; }
  std::optional<frame::Region> lookup(std::uint32_t id) {
    switch (id) {
      case 0: return frame::Region{region0(), 256};
      case 1: return frame::Region{region1(), 128};
      case 3: return frame::Region{nullptr, 0};
      default: return std::nullopt;  // 2: deregistered; others: never registered
    }
  }
  // Which region [p, p + n) lies in: 0 or 1, -1 when in none.
  int inside(const std::byte* p, std::size_t n) {
    auto in = [&](const std::byte* base, std::size_t bytes) {
      return std::greater_equal<>{}(p, base) && std::less_equal<>{}(p + n, base + bytes) && n <= bytes;
    };
    return in(region0(), 256) ? 0 : in(region1(), 128) ? 1 : -1;
  }
  bool guards_intact() const {
    auto intact = [](const std::byte* b, std::size_t n) { return std::all_of(b, b + n, [](std::byte x) { return x == kGuardByte; }); };
    return intact(data0, kGuard) && intact(data0 + kGuard + 256, kGuard) && intact(data1, kGuard) && intact(data1 + kGuard + 128, kGuard);
  }
};

// A model of what SignalOrder must do: signals in arrival order, each applied exactly when the
// writes it follows (counted here, independently) have completed.
struct Expected {
  std::byte* flag = nullptr;
  std::uint32_t value = 0;
  std::array<std::uint32_t, frame::kMaxSockets> writes_before{};
};

struct Harness {
  Memory mem;
  std::size_t sockets;
  std::array<frame::FrameReader, 3> readers{frame::FrameReader(0), frame::FrameReader(1), frame::FrameReader(2)};
  frame::SignalOrder order;
  std::array<std::uint32_t, frame::kMaxSockets> writes_seen{};
  std::array<Expected, frame::SignalOrder::kMaxDeferred> expected{};
  std::size_t expected_count = 0;
  bool stopped = false;  // a malformed frame (or a full signal queue) stops the link

  explicit Harness(std::size_t n) : sockets(n), order(n) {}

  bool landed(const Expected& e) const {
    for (std::size_t k = 0; k < sockets; ++k)
      if (static_cast<std::int32_t>(writes_seen[k] - e.writes_before[k]) < 0) return false;
    return true;
  }
  // SignalOrder's apply: must be the oldest pending signal, and its writes must have landed.
  void apply(std::byte* flag, std::uint32_t value) {
    CHECK_OR_TRAP(expected_count > 0);
    const Expected& e = expected[0];
    CHECK_OR_TRAP(e.flag == flag && e.value == value && landed(e));
    CHECK_OR_TRAP(mem.inside(flag, frame::kFlagBytes) >= 0);
    CHECK_OR_TRAP(reinterpret_cast<std::uintptr_t>(flag) % frame::kFlagAlign == 0);
    std::memcpy(flag, &value, sizeof value);
    std::copy(expected.begin() + 1, expected.begin() + static_cast<std::ptrdiff_t>(expected_count), expected.begin());
    --expected_count;
  }
  // After each step nothing due may be left waiting.
  void check_order() const {
    CHECK_OR_TRAP(order.deferred() == expected_count);
    CHECK_OR_TRAP(expected_count == 0 || !landed(expected[0]));
  }

  // Feeds one piece of the stream of socket `s`, as recv would deliver it.
  void feed(std::size_t s, const std::uint8_t* bytes, std::size_t n) {
    frame::FrameReader& r = readers[s];
    auto lookup = [this](std::uint32_t id) { return mem.lookup(id); };
    auto apply_fn = [this](std::byte* flag, std::uint32_t value) { apply(flag, value); };
    while (n > 0 && !stopped) {
      const std::span<std::byte> into = r.buffer();
      CHECK_OR_TRAP(!into.empty());
      const bool in_reader = std::greater_equal<>{}(into.data(), reinterpret_cast<std::byte*>(&r)) &&
                             std::less_equal<>{}(into.data() + into.size(), reinterpret_cast<std::byte*>(&r + 1));
      CHECK_OR_TRAP(in_reader || mem.inside(into.data(), into.size()) >= 0);
      const std::size_t take = std::min(n, into.size());
      std::memcpy(into.data(), bytes, take);  // recv
      bytes += take;
      n -= take;
      switch (r.advance(take, lookup)) {
        case frame::Step::NeedMore: CHECK_OR_TRAP(!r.malformed()); break;
        case frame::Step::Write:
          ++writes_seen[s];
          order.write_done(s, apply_fn);
          break;
        case frame::Step::Signal:
          if (expected_count == expected.size()) {
            CHECK_OR_TRAP(!order.signal(r.flag(), r.value(), r.writes_before(), apply_fn));  // full: refused
            stopped = true;
            return;
          }
          expected[expected_count++] = Expected{r.flag(), r.value(), r.writes_before()};
          CHECK_OR_TRAP(order.signal(r.flag(), r.value(), r.writes_before(), apply_fn));
          break;
        case frame::Step::Malformed:
          CHECK_OR_TRAP(r.malformed() && r.error() != nullptr);
          CHECK_OR_TRAP(r.buffer().empty());
          CHECK_OR_TRAP(r.advance(1, lookup) == frame::Step::Malformed);  // stays stopped
          stopped = true;
          return;
      }
      check_order();
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  Harness h(static_cast<std::size_t>(data[0] % 3) + 1);
  std::size_t i = 1;
  counting = true;
  allocations = 0;
  while (i < size && !h.stopped) {
    const std::uint8_t control = data[i++];
    const std::size_t s = (control & 3u) % h.sockets;
    const std::size_t len = std::min<std::size_t>((control >> 2) + 1, size - i);
    h.feed(s, data + i, len);
    i += len;
  }
  counting = false;
  CHECK_OR_TRAP(allocations == 0);
  CHECK_OR_TRAP(h.mem.guards_intact());
  for (std::size_t s = 0; s < h.sockets; ++s) CHECK_OR_TRAP(h.order.applied(s) == h.writes_seen[s]);
  return 0;
}
