#pragma once
// The tcp transport's wire format and its receive side as pure code (no sockets, no threads,
// no allocation, no exceptions), so the transport and the fuzz target
// (tests/fuzz/fuzz_tcp_frame.cpp) run the same parser:
//
// - `FrameReader` (one per socket) parses a peer's byte stream: it says where the next bytes
//   must go (`buffer()`: the rest of a frame header inside the reader, or the rest of a payload
//   inside its registered region) and validates every header before it hands out a payload
//   destination: magic, socket, type, region id, offset and length against the registration.
//   A malformed frame stops it for good (`buffer()` is empty from then on).
// - `SignalOrder` (one per link) applies a signal only once the write frames it follows (per
//   socket) were applied, keeping a bounded queue of early signals.
//
// Frames use host byte order: both ends run the same build, which the hello checks.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>

namespace ringfence::transports::tcp::frame {

inline constexpr std::uint32_t kFrameMagic = 0x31544652;  // "RFT1"
inline constexpr std::uint32_t kHelloMagic = 0x48544652;  // "RFTH"
inline constexpr std::size_t kMaxSockets = 8;
// A signal's target (SignalFlag; tcp_link.hpp checks that these match).
inline constexpr std::size_t kFlagBytes = 64;
inline constexpr std::size_t kFlagAlign = 64;

enum class FrameType : std::uint8_t { Write = 1, Signal = 2 };

// Every frame starts with this header. Write frames are followed by `length` payload bytes for
// `offset` of region `region`; signal frames continue with `writes_before` (SignalFrame).
struct FrameHeader {
  std::uint32_t magic = kFrameMagic;
  FrameType type = FrameType::Write;
  std::uint8_t socket = 0;
  std::uint16_t pad = 0;
  std::uint32_t region = 0;
  std::uint32_t value = 0;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};
static_assert(sizeof(FrameHeader) == 32);
// A signal: store `header.value` into the flag at `header.offset` of `header.region` once
// `writes_before[s]` write frames arrived on each socket s.
struct SignalFrame {
  FrameHeader header;
  std::uint32_t writes_before[kMaxSockets] = {};
};
static_assert(sizeof(SignalFrame) == 64);

// A registered region as the reader sees it.
struct Region {
  std::byte* base = nullptr;
  std::size_t bytes = 0;
};

// What one `FrameReader::advance` completed.
enum class Step : std::uint8_t {
  NeedMore,   // no frame completed: read more into buffer()
  Write,      // a write frame completed: its payload is in place
  Signal,     // a signal frame completed: flag(), value(), writes_before()
  Malformed,  // the stream is bad (error() says why); nothing more is accepted
};

class FrameReader {
 public:
  explicit FrameReader(std::size_t socket = 0) noexcept : socket_(socket) {}

  // Where the next bytes of the stream go: the rest of a payload (inside its registered
  // region, already validated) or the rest of a header (inside this reader). Never empty
  // unless the stream is malformed.
  std::span<std::byte> buffer() noexcept {
    if (error_) return {};
    if (remaining_ > 0) return {dst_, remaining_};
    return {head_.data() + got_, wanted() - got_};
  }

  // `n` bytes of the stream were placed into buffer() (at most its size). `lookup(id)`
  // returns the live registration of region `id` as std::optional<Region> (nullopt: unknown).
  template <class Lookup>
  Step advance(std::size_t n, Lookup&& lookup) noexcept {
    if (error_) return Step::Malformed;
    if (remaining_ > 0) {
      if (n > remaining_) return fail("more bytes than asked for");
      dst_ += n;
      remaining_ -= n;
      return remaining_ == 0 ? Step::Write : Step::NeedMore;
    }
    if (n > wanted() - got_) return fail("more bytes than asked for");
    const bool header_was_complete = got_ >= sizeof(FrameHeader);
    got_ += n;
    if (got_ < sizeof(FrameHeader)) return Step::NeedMore;
    FrameHeader h;
    std::memcpy(&h, head_.data(), sizeof h);
    if (!header_was_complete) {  // the header just completed: check it before anything else
      if (h.magic != kFrameMagic || h.socket != socket_) return fail("a frame with a bad header");
      if (h.type == FrameType::Write) {
        const std::optional<Region> r = lookup(h.region);
        if (!r) return fail("a write into an unknown region");
        if (h.offset > r->bytes || h.length > r->bytes - h.offset) return fail("a write outside its region");
        got_ = 0;
        if (h.length == 0) return Step::Write;
        dst_ = r->base + h.offset;
        remaining_ = h.length;
        return Step::NeedMore;
      }
      if (h.type != FrameType::Signal) return fail("a frame of unknown type");
    }
    if (got_ < sizeof(SignalFrame)) return Step::NeedMore;
    got_ = 0;
    const std::optional<Region> r = lookup(h.region);
    if (!r) return fail("a signal into an unknown region");
    if (h.offset % kFlagAlign != 0 || h.offset > r->bytes || r->bytes - h.offset < kFlagBytes)
      return fail("a signal outside its region");
    if (reinterpret_cast<std::uintptr_t>(r->base + h.offset) % kFlagAlign != 0) return fail("a signal to a misaligned flag");
    flag_ = r->base + h.offset;
    value_ = h.value;
    std::memcpy(writes_before_.data(), head_.data() + sizeof(FrameHeader), sizeof writes_before_);
    return Step::Signal;
  }

  // After Step::Signal: the flag to store into, the value, and the write counts it follows.
  std::byte* flag() const noexcept { return flag_; }
  std::uint32_t value() const noexcept { return value_; }
  const std::array<std::uint32_t, kMaxSockets>& writes_before() const noexcept { return writes_before_; }

  // True inside a frame (part of a header or payload read): the stream must not end here.
  bool mid_frame() const noexcept { return got_ > 0 || remaining_ > 0; }
  // Bytes of the current frame still missing (header, or payload): for error messages.
  std::size_t missing() const noexcept { return remaining_ > 0 ? remaining_ : got_ > 0 ? wanted() - got_ : 0; }
  bool malformed() const noexcept { return error_ != nullptr; }
  // Why the stream is malformed (a static string), nullptr when it is not.
  const char* error() const noexcept { return error_; }

 private:
  std::size_t wanted() const noexcept {
    if (got_ < sizeof(FrameHeader)) return sizeof(FrameHeader);
    return sizeof(SignalFrame);  // a header already accepted with more to come is a signal's
  }
  Step fail(const char* why) noexcept {
    error_ = why;
    remaining_ = 0;
    dst_ = nullptr;
    return Step::Malformed;
  }

  std::array<std::byte, sizeof(SignalFrame)> head_{};
  std::size_t got_ = 0;           // header bytes read
  std::byte* dst_ = nullptr;      // payload destination
  std::size_t remaining_ = 0;     // payload bytes still to read
  std::size_t socket_;
  const char* error_ = nullptr;
  std::byte* flag_ = nullptr;
  std::uint32_t value_ = 0;
  std::array<std::uint32_t, kMaxSockets> writes_before_{};
};

// Orders a link's signals after the writes they follow. `apply(flag, value)` stores a signal.
class SignalOrder {
 public:
  // Signals that may arrive ahead of their writes; an honest peer stays far below (the engine
  // keeps a handful of signals in flight per link).
  static constexpr std::size_t kMaxDeferred = 256;

  explicit SignalOrder(std::size_t sockets = 1) noexcept : sockets_(sockets < kMaxSockets ? sockets : kMaxSockets) {}

  // A write frame completed on socket `s`: applies the queued signals now due, in arrival order.
  template <class Apply>
  void write_done(std::size_t s, Apply&& apply) noexcept {
    if (s < sockets_) ++applied_[s];
    release(apply);
  }
  // A signal arrived: applied now when its writes have landed (and no earlier signal waits),
  // else queued. False when the queue is full: the peer is not following the protocol.
  template <class Apply>
  bool signal(std::byte* flag, std::uint32_t value, const std::array<std::uint32_t, kMaxSockets>& writes_before, Apply&& apply) noexcept {
    if (count_ == kMaxDeferred) return false;
    Pending& p = queue_[count_++];
    p.flag = flag;
    p.value = value;
    p.writes_before = writes_before;
    release(apply);
    return true;
  }
  std::size_t deferred() const noexcept { return count_; }
  std::uint32_t applied(std::size_t s) const noexcept { return s < sockets_ ? applied_[s] : 0; }

 private:
  struct Pending {
    std::byte* flag = nullptr;
    std::uint32_t value = 0;
    std::array<std::uint32_t, kMaxSockets> writes_before{};
  };
  bool ready(const Pending& p) const noexcept {
    for (std::size_t s = 0; s < sockets_; ++s)
      if (static_cast<std::int32_t>(applied_[s] - p.writes_before[s]) < 0) return false;
    return true;
  }
  template <class Apply>
  void release(Apply& apply) noexcept {
    std::size_t k = 0;
    while (k < count_ && ready(queue_[k])) {
      apply(queue_[k].flag, queue_[k].value);
      ++k;
    }
    if (k == 0) return;
    for (std::size_t i = k; i < count_; ++i) queue_[i - k] = queue_[i];
    count_ -= k;
  }

  std::size_t sockets_;
  std::array<std::uint32_t, kMaxSockets> applied_{};
  std::array<Pending, kMaxDeferred> queue_{};
  std::size_t count_ = 0;
};

}  // namespace ringfence::transports::tcp::frame
