// Fault-injection decorator. A corrupting write is issued in pieces that do not overlap: the
// bytes up to a flipped one, a one-byte write of the flipped byte, and so on. So it works over
// any transport without a scratch copy of the payload, whatever order the transport applies
// writes in; every piece but the last carries an internal id, and those completions are
// filtered out of poll().
#include <charconv>
#include <cmath>
#include <cstring>
#include <ringfence/error.hpp>
#include <ringfence/fault.hpp>
#include <ringfence/transport_util.hpp>
#include <string>
#include <thread>

namespace ringfence {
namespace {

constexpr std::uint64_t kInternalId = 1ull << 63;

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

template <class T>
T parse_number(std::string_view rule, std::string_view key, std::string_view text) {
  T v{};
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size())
    throw InvalidUsage(fmt::format("RINGFENCE_FAULT rule '{}': {}='{}' is not a number", rule, key, text));
  return v;
}

FaultRule parse_rule(std::string_view rule) {
  FaultRule r;
  const auto colon = rule.find(':');
  const std::string_view kind = trim(rule.substr(0, colon));
  if (kind == "flip") r.kind = FaultKind::Flip;
  else if (kind == "drop") r.kind = FaultKind::Drop;
  else if (kind == "delay") r.kind = FaultKind::Delay;
  else if (kind == "stall") r.kind = FaultKind::Stall;
  else if (kind == "throttle") r.kind = FaultKind::Throttle;
  else if (kind == "close") r.kind = FaultKind::Close;
  else if (kind == "hold") r.kind = FaultKind::Hold;
  else throw InvalidUsage(fmt::format("RINGFENCE_FAULT rule '{}': unknown kind '{}' (flip, drop, delay, stall, throttle, close, hold)", rule, kind));
  std::string_view fields = colon == std::string_view::npos ? std::string_view{} : rule.substr(colon + 1);
  while (!fields.empty()) {
    const auto comma = fields.find(',');
    const std::string_view field = trim(fields.substr(0, comma));
    fields = comma == std::string_view::npos ? std::string_view{} : fields.substr(comma + 1);
    if (field.empty()) continue;
    const auto eq = field.find('=');
    if (eq == std::string_view::npos)
      throw InvalidUsage(fmt::format("RINGFENCE_FAULT rule '{}': field '{}' is not key=value", rule, field));
    const std::string_view key = field.substr(0, eq), value = field.substr(eq + 1);
    if (key == "link") {
      if (value == "*") {
        r.rank_a = r.rank_b = -1;
      } else {
        const auto dash = value.find('-');
        if (dash == std::string_view::npos)
          throw InvalidUsage(fmt::format("RINGFENCE_FAULT rule '{}': link='{}' must be A-B or *", rule, value));
        r.rank_a = parse_number<int>(rule, key, value.substr(0, dash));
        r.rank_b = parse_number<int>(rule, key, value.substr(dash + 1));
        if (r.rank_a < 0 || r.rank_b < 0 || r.rank_a == r.rank_b)
          throw InvalidUsage(fmt::format("RINGFENCE_FAULT rule '{}': link='{}' needs two different ranks", rule, value));
      }
    } else if (key == "rate") {
      r.rate = parse_number<double>(rule, key, value);
      if (!(r.rate >= 0.0 && r.rate <= 1.0))
        throw InvalidUsage(fmt::format("RINGFENCE_FAULT rule '{}': rate={} must be in [0, 1]", rule, value));
    } else if (key == "after") {
      r.after = parse_number<std::uint64_t>(rule, key, value);
    } else if (key == "for_ms") {
      r.for_ms = std::chrono::milliseconds(parse_number<std::uint32_t>(rule, key, value));
      if (r.for_ms.count() == 0) throw InvalidUsage(fmt::format("RINGFENCE_FAULT rule '{}': for_ms={} must be positive", rule, value));
    } else if (key == "at_ms") {
      r.at_ms = std::chrono::milliseconds(parse_number<std::uint32_t>(rule, key, value));
    } else if (key == "until") {
      r.until = parse_number<std::uint64_t>(rule, key, value);
      if (r.until == 0) throw InvalidUsage(fmt::format("RINGFENCE_FAULT rule '{}': until={} must be positive", rule, value));
    } else if (key == "us") {
      r.delay = std::chrono::microseconds(parse_number<std::uint32_t>(rule, key, value));
    } else if (key == "ms") {
      r.stall = std::chrono::milliseconds(parse_number<std::uint32_t>(rule, key, value));
    } else if (key == "mbps") {
      r.mbps = parse_number<double>(rule, key, value);
      if (!(r.mbps > 0.0)) throw InvalidUsage(fmt::format("RINGFENCE_FAULT rule '{}': mbps={} must be positive", rule, value));
    } else if (key == "transport") {
      if (value.empty()) throw InvalidUsage(fmt::format("RINGFENCE_FAULT rule '{}': transport= needs a transport name", rule));
      r.transport = std::string(value);
    } else if (key == "seed") {
      r.seed = parse_number<std::uint64_t>(rule, key, value);
    } else {
      throw InvalidUsage(fmt::format("RINGFENCE_FAULT rule '{}': unknown field '{}'", rule, key));
    }
  }
  if (r.until != 0 && r.until <= r.after)
    throw InvalidUsage(fmt::format("RINGFENCE_FAULT rule '{}': until={} must be greater than after={}", rule, r.until, r.after));
  return r;
}

// splitmix64: small, fast, good enough to place faults.
struct Rng {
  std::uint64_t state;
  std::uint64_t next() noexcept {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() noexcept { return (static_cast<double>(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
};

class FaultLink final : public Link {
 public:
  FaultLink(std::unique_ptr<Link> inner, std::vector<FaultRule> rules, int self)
      : inner_(std::move(inner)), peer_(inner_->peer()), rules_(std::move(rules)), started_(rules_.size()) {
    std::uint64_t seed = 0;
    for (const auto& r : rules_) seed = seed * 31 + r.seed;
    const int lo = std::min(self, inner_->peer()), hi = std::max(self, inner_->peer());
    rng_.state = seed ^ (static_cast<std::uint64_t>(lo) << 32 | static_cast<std::uint64_t>(hi)) ^ (self == lo ? 0 : 0x5555);
    for (const auto& r : rules_) {
      if (r.kind == FaultKind::Flip) flip_rate_ = std::max(flip_rate_, r.rate);
      if (r.kind == FaultKind::Hold) hold_ = std::max(hold_, r.stall);
    }
    next_flip_ = draw_gap();
  }

  Status write(const WriteOp& op) noexcept override {
    if (closed_) return Status(ErrorCode::PeerUnreachable);
    ++ops_;
    for (const auto& r : rules_) {
      if (!applies(r)) continue;
      if (r.kind == FaultKind::Close && ops_ == r.after + 1) {
        close_inner();
        return Status(ErrorCode::PeerUnreachable);
      }
      if (r.kind == FaultKind::Delay && r.delay.count() > 0) std::this_thread::sleep_for(r.delay);
      if (r.kind == FaultKind::Stall && ops_ == r.after + 1) std::this_thread::sleep_for(r.stall);
      if (r.kind == FaultKind::Throttle && r.mbps > 0.0)
        std::this_thread::sleep_for(std::chrono::nanoseconds(static_cast<std::int64_t>(static_cast<double>(op.bytes) * 1e3 / r.mbps)));
    }
    for (const auto& r : rules_)
      if (r.kind == FaultKind::Drop && applies(r) && r.rate > 0.0 && rng_.uniform() < r.rate &&
          lost_head_ - lost_tail_ < kLostRing) {
        lost_[lost_head_++ % kLostRing] = op.wr_id;  // reported as done, never written
        ++dropped_;
        return Status::ok();
      }
    if (flip_rate_ <= 0.0 || !flip_active()) return inner_->write(op);
    if (next_flip_ >= static_cast<double>(op.bytes)) {  // no flip in this write
      next_flip_ -= static_cast<double>(op.bytes);
      return inner_->write(op);
    }
    // Flips at byte positions next_flip_, next_flip_ + gap, ... within this write (at most
    // kMaxFlipsPerWrite, so the extra writes cannot overrun a completion queue). The write goes
    // out in pieces that do not overlap: the bytes before a flip, the flipped byte, and so on.
    // A flipped byte written over the intact one afterwards could land first on a transport
    // that does not order writes (tcp stripes them over sockets), and the corruption would be
    // lost. Only the last piece carries the caller's id.
    const auto* src = static_cast<const std::byte*>(op.src);
    std::size_t done = 0;
    // A piece of the source keeps its registration (it covers every part of `src`); a flipped
    // byte lives in corrupt_, which has none.
    auto piece = [&](const void* from, const MemoryRegion* region, std::size_t at, std::size_t len, bool last) noexcept {
      return inner_->write(WriteOp{from, region, op.dst, op.dst_offset + at, len, last ? op.wr_id : kInternalId | op.wr_id});
    };
    int flips = 0;
    while (next_flip_ < static_cast<double>(op.bytes) && flips++ < kMaxFlipsPerWrite) {
      const auto k = static_cast<std::size_t>(next_flip_);
      if (k > done) RINGFENCE_TRY(piece(src + done, op.src_region, done, k - done, false));
      std::uint8_t& b = corrupt_[corrupt_next_++ % kCorruptRing];
      b = static_cast<std::uint8_t>(static_cast<std::uint8_t>(src[k]) ^ (1u << (rng_.next() & 7)));
      done = k + 1;
      RINGFENCE_TRY(piece(&b, nullptr, k, 1, done == op.bytes));
      ++flips_;
      next_flip_ += 1 + draw_gap();
    }
    if (done < op.bytes) RINGFENCE_TRY(piece(src + done, op.src_region, done, op.bytes - done, true));
    next_flip_ = next_flip_ < static_cast<double>(op.bytes) ? draw_gap() : next_flip_ - static_cast<double>(op.bytes);
    return Status::ok();
  }
  Status signal(const SignalOp& op_in) noexcept override {
    if (closed_) return Status(ErrorCode::PeerUnreachable);
    const SignalOp op = damage_carried(op_in);
    if (hold_.count() == 0) return inner_->signal(op);
    if (held_head_ - held_tail_ == kHeldRing) {  // full: make room, then queue behind the others
      release_held(true);
      if (held_head_ - held_tail_ == kHeldRing) return Status(ErrorCode::InProgress);
    }
    held_[held_head_++ % kHeldRing] = Held{op, std::chrono::steady_clock::now() + hold_};
    return Status::ok();
  }
  void flush_wakes() noexcept override {
    if (!closed_) inner_->flush_wakes();
  }
  Status poll(std::span<Completion> out, std::size_t& n) noexcept override {
    if (!closed_) release_held(false);
    n = 0;
    while (n < out.size() && lost_tail_ != lost_head_) out[n++] = Completion{lost_[lost_tail_++ % kLostRing], Status::ok()};
    if (closed_) return Status::ok();
    for (;;) {
      std::size_t got = 0;
      const std::size_t base = n;
      RINGFENCE_TRY(inner_->poll(out.subspan(base), got));
      for (std::size_t i = 0; i < got; ++i) {
        const Completion c = out[base + i];
        if ((c.wr_id & kInternalId) && c.status.is_ok()) continue;  // our extra one-byte writes
        out[n++] = Completion{c.wr_id & ~kInternalId, c.status};
      }
      if (got == 0 || n == out.size() || base == out.size()) return Status::ok();
    }
  }
  Status wait(SignalFlag& flag, std::uint32_t target, std::chrono::nanoseconds max) noexcept override {
    if (closed_) return Status(ErrorCode::PeerUnreachable);
    const auto start = std::chrono::steady_clock::now();
    for (;;) {  // held signals are released from here too, in slices while any is held
      release_held(false);
      const bool holding = held_head_ != held_tail_;
      const auto left = max - (std::chrono::steady_clock::now() - start);
      const auto slice = holding ? std::min<std::chrono::nanoseconds>(left, std::chrono::microseconds(200)) : left;
      const Status s = inner_->wait(flag, target, slice.count() > 0 ? slice : std::chrono::nanoseconds(0));
      if (!s.in_progress() || !holding || std::chrono::steady_clock::now() - start >= max) return s;
    }
  }
  void fence(FenceReason why) noexcept override {
    if (!closed_) inner_->fence(why);
  }
  bool can_reopen() const noexcept override { return !closed_ && inner_->can_reopen(); }
  void reopen() noexcept override {
    if (!closed_) inner_->reopen();
  }
  LinkState state() const noexcept override { return closed_.load(std::memory_order_relaxed) ? LinkState::Closed : inner_->state(); }
  int peer() const noexcept override { return peer_; }
  const LinkStats& stats() const noexcept override { return closed_ ? closed_stats_ : inner_->stats(); }

 private:
  static constexpr std::size_t kCorruptRing = 256;
  static constexpr int kMaxFlipsPerWrite = 32;  // at most 64 extra pieces per write
  static constexpr std::size_t kLostRing = 64;
  static constexpr std::size_t kHeldRing = 64;
  static constexpr std::size_t kCarriedRing = 2 * kHeldRing;

  // Bytes a signal carries (SignalOp::with: a chunk's trailer) are written bytes like any
  // other: flips reach them at the same rate, in a copy (the caller's bytes stay as they were,
  // as a flipped write's source does). A copy lives until kCarriedRing more were made: longer
  // than a held signal waits (kHeldRing).
  SignalOp damage_carried(SignalOp op) noexcept {
    if (op.with_bytes == 0 || op.with_bytes > kSignalCarriesMaxBytes || flip_rate_ <= 0.0 || !flip_active()) return op;
    const auto n = static_cast<double>(op.with_bytes);
    if (next_flip_ >= n) {
      next_flip_ -= n;
      return op;
    }
    std::uint8_t* copy = carried_[carried_next_++ % kCarriedRing];
    std::memcpy(copy, op.with, op.with_bytes);
    while (next_flip_ < n) {
      copy[static_cast<std::size_t>(next_flip_)] ^= static_cast<std::uint8_t>(1u << (rng_.next() & 7));
      ++flips_;
      next_flip_ += 1 + draw_gap();
    }
    next_flip_ -= n;
    op.with = copy;
    return op;
  }

  // `hold`: passes held signals to the inner link in order, those due (or all, `all`).
  void release_held(bool all) noexcept {
    const auto now = std::chrono::steady_clock::now();
    while (held_tail_ != held_head_) {
      const Held& h = held_[held_tail_ % kHeldRing];
      if (!all && h.due > now) return;
      if (!inner_->signal(h.op).is_ok()) return;  // InProgress: later; an error shows on the next operation
      ++held_tail_;
    }
  }

  // True when the current write (number ops_) lies in the rule's window: after its first `after`
  // writes, up to write `until`, and within `for_ms` of the first write it acted on.
  bool applies(const FaultRule& r) noexcept {
    if (ops_ <= r.after || (r.until != 0 && ops_ > r.until)) return false;
    if (r.at_ms.count() > 0 && std::chrono::steady_clock::now() - created_ < r.at_ms) return false;
    if (r.for_ms.count() == 0) return true;
    const auto now = std::chrono::steady_clock::now();
    auto& start = started_[static_cast<std::size_t>(&r - rules_.data())];
    if (start == std::chrono::steady_clock::time_point{}) start = now;
    return now - start < r.for_ms;
  }
  bool flip_active() noexcept {
    for (const auto& r : rules_)
      if (r.kind == FaultKind::Flip && applies(r)) return true;
    return false;
  }
  // Bytes until the next corrupted byte: geometric with parameter flip_rate_.
  double draw_gap() noexcept {
    if (flip_rate_ <= 0.0) return 1e300;
    if (flip_rate_ >= 1.0) return 0.0;
    return std::floor(std::log(rng_.uniform()) / std::log1p(-flip_rate_));
  }

  // `close`: the connection goes away (the inner link is destroyed: sockets closed, as when a
  // cable is pulled or a process closes its end); from now on every operation fails with
  // PeerUnreachable. Its counters are kept for observers. (Not safe against links() on another
  // thread at the same moment: that may still be reading the inner link. A fault-injection
  // limit: no test watches links() while a close rule fires.)
  void close_inner() noexcept {
    const LinkStats& in = inner_->stats();
    auto copy = [](std::atomic<std::uint64_t>& to, const std::atomic<std::uint64_t>& from) { to.store(from.load()); };
    copy(closed_stats_.bytes_written, in.bytes_written);
    copy(closed_stats_.writes, in.writes);
    copy(closed_stats_.signals, in.signals);
    copy(closed_stats_.errors, in.errors);
    copy(closed_stats_.retries, in.retries);
    copy(closed_stats_.wait_ns, in.wait_ns);
    copy(closed_stats_.timeouts, in.timeouts);
    closed_ = true;
    inner_.reset();
  }

  std::unique_ptr<Link> inner_;
  int peer_ = -1;
  std::atomic<bool> closed_{false};
  LinkStats closed_stats_;
  std::vector<FaultRule> rules_;
  std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();  // at_ms counts from here
  std::vector<std::chrono::steady_clock::time_point> started_;  // per rule: first write it acted on (for_ms)
  Rng rng_{};
  double flip_rate_ = 0.0;
  double next_flip_ = 0.0;
  std::uint64_t ops_ = 0;
  std::uint64_t flips_ = 0;
  std::uint8_t corrupt_[kCorruptRing] = {};
  std::uint64_t lost_[kLostRing] = {};
  std::size_t lost_head_ = 0, lost_tail_ = 0;
  std::uint64_t dropped_ = 0;
  struct Held {
    SignalOp op;
    std::chrono::steady_clock::time_point due;
  };
  Held held_[kHeldRing] = {};
  std::size_t held_head_ = 0, held_tail_ = 0;
  std::chrono::milliseconds hold_{0};  // `hold` rule: how long each signal is held (0 = none)
  std::size_t corrupt_next_ = 0;
  std::uint8_t carried_[kCarriedRing][kSignalCarriesMaxBytes] = {};  // damaged copies of carried bytes
  std::size_t carried_next_ = 0;
};

class FaultPending final : public PendingLink {
 public:
  FaultPending(std::unique_ptr<PendingLink> inner, std::vector<FaultRule> rules, int self)
      : inner_(std::move(inner)), rules_(std::move(rules)), self_(self) {}
  Status try_finish(std::unique_ptr<Link>& out) noexcept override {
    std::unique_ptr<Link> link;
    const Status s = inner_->try_finish(link);
    if (!s.is_ok()) return s;
    std::vector<FaultRule> mine;
    try {
      for (const auto& r : rules_)
        if (r.matches(self_, link->peer())) mine.push_back(r);
      out = mine.empty() ? std::move(link) : std::make_unique<FaultLink>(std::move(link), std::move(mine), self_);
    } catch (...) {
      return Status(ErrorCode::Fatal);
    }
    return Status::ok();
  }

 private:
  std::unique_ptr<PendingLink> inner_;
  std::vector<FaultRule> rules_;
  int self_;
};

class FaultTransport final : public transport_util::ForwardingTransport {
 public:
  FaultTransport(std::unique_ptr<Transport> inner, std::vector<FaultRule> rules, int self)
      : ForwardingTransport(std::move(inner)), rules_(std::move(rules)), self_(self), traits_(this->inner().traits()) {
    // Fault links read and flip payloads on the host (FaultLink::write): no device memory
    // through them, so no device lane over a transport with fault rules.
    traits_.writes_device_memory = false;
  }
  const TransportTraits& traits() const noexcept override { return traits_; }
  std::unique_ptr<PendingLink> connect(ListenHandle& local, const PeerInfo& peer, std::span<const std::byte> address) override {
    return std::make_unique<FaultPending>(inner().connect(local, peer, address), rules_, self_);
  }

 private:
  std::vector<FaultRule> rules_;
  int self_;
  TransportTraits traits_;
};

}  // namespace

std::vector<FaultRule> parse_fault_spec(std::string_view text) {
  std::vector<FaultRule> rules;
  while (!text.empty()) {
    const auto semi = text.find(';');
    const std::string_view rule = trim(text.substr(0, semi));
    text = semi == std::string_view::npos ? std::string_view{} : text.substr(semi + 1);
    if (!rule.empty()) rules.push_back(parse_rule(rule));
  }
  for (const auto& r : rules)
    if (r.kind == FaultKind::Throttle && !(r.mbps > 0.0))
      throw InvalidUsage("RINGFENCE_FAULT: a throttle rule needs mbps=<megabytes per second>");
    else if (r.kind == FaultKind::Hold && r.stall.count() <= 0)
      throw InvalidUsage("RINGFENCE_FAULT: a hold rule needs ms=<milliseconds> (> 0)");
  return rules;
}

std::unique_ptr<Transport> make_fault_transport(std::unique_ptr<Transport> inner, std::vector<FaultRule> rules,
                                                int self_rank) {
  // A transport no rule names stays itself (its device memory included: a device lane may use it).
  std::erase_if(rules, [&](const FaultRule& r) { return !r.transport.empty() && r.transport != inner->name(); });
  if (rules.empty()) return inner;
  return std::make_unique<FaultTransport>(std::move(inner), std::move(rules), self_rank);
}

}  // namespace ringfence
