#pragma once
/// \file transport_util.hpp
/// Building blocks for transports whose signals land in local memory (shm, tcp): a fixed-size
/// completion queue, and the flag wait / flag store pair built on futexes; and a base for
/// transport decorators. Data plane only:
/// noexcept, allocation-free. Futex calls are not FUTEX_PRIVATE: flags may live in memory
/// shared between processes.

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <memory>
#include <ringfence/transport.hpp>
#include <span>

namespace ringfence::transport_util {

/// A connection that was complete when `Transport::connect` returned (shm, ibverbs): the first
/// `try_finish` hands the link over; a second one is `InvalidUsage`.
class ReadyPendingLink final : public PendingLink {
 public:
  /// Wraps the connected `link`.
  explicit ReadyPendingLink(std::unique_ptr<Link> link) noexcept : link_(std::move(link)) {}
  /// Ok with the link the first time, InvalidUsage after.
  Status try_finish(std::unique_ptr<Link>& out) noexcept override {
    if (!link_) return Status(ErrorCode::InvalidUsage);
    out = std::move(link_);
    return Status::ok();
  }

 private:
  std::unique_ptr<Link> link_;
};

/// Base of a transport decorator (fault injection, instrumentation): every call goes to the
/// wrapped transport. A subclass overrides what it changes, typically `connect`, to wrap the
/// links it hands out.
class ForwardingTransport : public Transport {
 public:
  /// Wraps `inner`.
  explicit ForwardingTransport(std::unique_ptr<Transport> inner) noexcept : inner_(std::move(inner)) {}
  std::string_view name() const noexcept override { return inner_->name(); }
  Reachability can_reach(const PeerInfo& self, const PeerInfo& peer) const override { return inner_->can_reach(self, peer); }
  void* allocate(std::size_t bytes, MemoryKind kind) override { return inner_->allocate(bytes, kind); }
  bool deallocate(void* ptr) noexcept override { return inner_->deallocate(ptr); }
  const TransportTraits& traits() const noexcept override { return inner_->traits(); }
  MemoryRegion register_memory(void* ptr, std::size_t bytes, MemoryKind kind) override {
    return inner_->register_memory(ptr, bytes, kind);
  }
  RemoteRegion import_region(std::span<const std::byte> peer_key) override { return inner_->import_region(peer_key); }
  std::unique_ptr<ListenHandle> listen() override { return inner_->listen(); }
  std::unique_ptr<PendingLink> connect(ListenHandle& local, const PeerInfo& peer, std::span<const std::byte> address) override {
    return inner_->connect(local, peer, address);
  }

 protected:
  /// The wrapped transport.
  Transport& inner() const noexcept { return *inner_; }

 private:
  std::unique_ptr<Transport> inner_;
};

/// futex(2) on a 32-bit word (shared, not private).
inline long futex(std::atomic<std::uint32_t>* addr, int op, std::uint32_t val, const timespec* ts) noexcept {
  return syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(addr), op, val, ts, nullptr, 0);
}

/// A pause for spin loops.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// Adds to a counter that has one writer (the thread driving the link) and relaxed readers: a
/// plain load + store avoids a locked read-modify-write on every operation.
inline void bump(std::atomic<std::uint64_t>& c, std::uint64_t by) noexcept {
  c.store(c.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
}

/// Stores `value` into `flag` (seq_cst: it also releases every earlier write to the reader)
/// and wakes sleepers when there are any. Pairs with `wait_flag`.
inline void store_flag(SignalFlag& flag, std::uint32_t value) noexcept {
  // seq_cst store + seq_cst load of `waiters` pairs with the waiter's seq_cst increment and
  // re-check (Dekker): either we see the sleeper and wake it, or it sees the new value.
  flag.value.store(value, std::memory_order_seq_cst);
  if (flag.waiters.load(std::memory_order_seq_cst) != 0) futex(&flag.value, FUTEX_WAKE, INT_MAX, nullptr);
}

/// Flags stored with a plain release store whose sleepers are not woken yet
/// (SignalOp::defer_wake): `flush` wakes them. The store needs no fence (the flag's line is
/// published while the signaller goes on); the fence in `flush` pairs with the waiter's
/// increment and re-check as `store_flag`'s does, only later. A few distinct flags per link.
class DeferredWakes {
 public:
  /// Stores `value` into `flag` and remembers it; false (nothing stored) when full: then use
  /// store_flag.
  bool store(SignalFlag& flag, std::uint32_t value) noexcept {
    std::size_t i = 0;
    while (i < n_ && flags_[i] != &flag) ++i;
    if (i == n_) {
      if (n_ == kMax) return false;
      flags_[n_++] = &flag;
    }
    flag.value.store(value, std::memory_order_release);
    return true;
  }
  /// Wakes the sleepers of every remembered flag.
  void flush() noexcept {
    if (n_ == 0) return;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    for (std::size_t i = 0; i < n_; ++i)
      if (flags_[i]->waiters.load(std::memory_order_relaxed) != 0) futex(&flags_[i]->value, FUTEX_WAKE, INT_MAX, nullptr);
    n_ = 0;
  }

 private:
  static constexpr std::size_t kMax = 8;
  SignalFlag* flags_[kMax] = {};
  std::size_t n_ = 0;
};

/// `Link::wait` for flags stored with `store_flag`: spins `spin` polls (calling `sched_yield`
/// every `yield_every` polls when that is > 0, so more ranks than cores do not starve each
/// other; with a core per rank a yield is only a system call that delays noticing the flag),
/// then asks `peer_status()` (Ok to go on
/// sleeping, an error to return at once, e.g. PeerUnreachable), then sleeps on the futex for at
/// most min(max, 20 ms), so a broken peer is noticed within one slice. Time spent waiting is
/// added to `wait_ns`, yields counted in `yields`. Returns Ok when `target` was reached,
/// InProgress when not yet.
template <class PeerStatus>
Status wait_flag(SignalFlag& flag, std::uint32_t target, std::chrono::nanoseconds max, int spin, int yield_every,
                 std::atomic<std::uint64_t>& wait_ns, std::atomic<std::uint64_t>& yields, PeerStatus&& peer_status) noexcept {
  // A flag already up is no wait: no clock read (the clock took 8-12 % of the samples of a
  // 2-rank 64 B sendrecv, docs/small-exchanges.md).
  if (reached(flag.value.load(std::memory_order_acquire), target)) return Status::ok();
  const auto start = std::chrono::steady_clock::now();
  auto account = [&] { bump(wait_ns, static_cast<std::uint64_t>((std::chrono::steady_clock::now() - start).count())); };
  for (int i = 0, until_yield = yield_every; i < spin; ++i) {
    if (reached(flag.value.load(std::memory_order_acquire), target)) return account(), Status::ok();
    cpu_relax();
    if (yield_every > 0 && --until_yield == 0) {
      sched_yield();
      bump(yields, 1);
      until_yield = yield_every;
    }
  }
  if (const Status s = peer_status(); !s.is_ok()) return s;
  constexpr auto kSlice = std::chrono::milliseconds(20);
  const auto slice = std::min<std::chrono::nanoseconds>(max, kSlice);
  flag.waiters.fetch_add(1, std::memory_order_seq_cst);
  const std::uint32_t seen = flag.value.load(std::memory_order_seq_cst);
  if (!reached(seen, target)) {
    timespec ts{static_cast<time_t>(slice.count() / 1000000000), static_cast<long>(slice.count() % 1000000000)};
    futex(&flag.value, FUTEX_WAIT, seen, &ts);
  }
  flag.waiters.fetch_sub(1, std::memory_order_seq_cst);
  account();
  return reached(flag.value.load(std::memory_order_acquire), target) ? Status::ok() : Status(ErrorCode::InProgress);
}

/// Completions of operations that finish inside the call that starts them, handed out by
/// `Link::poll` in order. One producer and consumer: the thread driving the link.
template <std::size_t N = 256>
class CompletionQueue {
 public:
  /// True when another completion fits (else the operation returns InProgress).
  bool has_room() const noexcept { return head_ - tail_ < N; }
  /// Appends one completion (check `has_room` first).
  void push(std::uint64_t wr_id, Status s) noexcept { queue_[head_++ % N] = Completion{wr_id, s}; }
  /// Moves up to `out.size()` completions into `out[0..n)`.
  void pop(std::span<Completion> out, std::size_t& n) noexcept {
    n = 0;
    while (n < out.size() && tail_ != head_) out[n++] = queue_[tail_++ % N];
  }

 private:
  Completion queue_[N];
  std::size_t head_ = 0, tail_ = 0;
};

/// The SPI's bounds rule for a write: a destination region, and `bytes` at `dst_offset` inside
/// it (overflow-safe). Transports refuse a write that breaks it with InvalidUsage.
inline bool write_in_bounds(const WriteOp& op) noexcept {
  return op.dst != nullptr && op.dst_offset <= op.dst->size() && op.bytes <= op.dst->size() - op.dst_offset;
}

/// The SPI's placement rule for a signal: a whole, 64-aligned SignalFlag inside the region.
inline bool flag_in_bounds(const SignalOp& op) noexcept {
  return op.dst != nullptr && op.offset % alignof(SignalFlag) == 0 && op.offset <= op.dst->size() &&
         op.dst->size() - op.offset >= sizeof(SignalFlag);
}

/// The SPI's placement rule for the bytes a signal carries (SignalOp::with): none, or at most
/// kSignalCarriesMaxBytes inside the region.
inline bool carried_in_bounds(const SignalOp& op) noexcept {
  if (op.with_bytes == 0) return true;
  return op.with != nullptr && op.with_bytes <= kSignalCarriesMaxBytes && op.with_offset <= op.dst->size() &&
         op.with_bytes <= op.dst->size() - op.with_offset;
}

/// Stores the bytes a signal carries (`n` <= kSignalCarriesMaxBytes) at `to`: at most two
/// fixed-size moves, where a memcpy of a run-time length would be a library call per signal.
inline void store_carried(std::byte* to, const void* from, std::uint32_t n) noexcept {
  const auto* f = static_cast<const std::byte*>(from);
  if (n >= 8) {  // two 8-byte moves, overlapping when n < 16
    std::uint64_t a, b;
    std::memcpy(&a, f, 8);
    std::memcpy(&b, f + n - 8, 8);
    std::memcpy(to, &a, 8);
    std::memcpy(to + n - 8, &b, 8);
  } else {
    for (std::uint32_t i = 0; i < n; ++i) to[i] = f[i];
  }
}

}  // namespace ringfence::transport_util
