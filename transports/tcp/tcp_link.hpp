#pragma once
// The tcp transport's link (TcpLink): its sender side's data path (write, signal, poll, fence,
// inline: it is hot) and the per-socket receive state that the transport's readers use.
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <ringfence/error.hpp>
#include <ringfence/transport.hpp>
#include <ringfence/transport_util.hpp>
#include <span>
#include <vector>

#include "tcp_frame.hpp"
#include "tcp_regions.hpp"

namespace ringfence::transports::tcp::detail {

using frame::FrameHeader;
using frame::FrameType;
using frame::kFrameMagic;
using frame::kHelloMagic;
using frame::SignalFrame;
inline constexpr int kMaxSockets = static_cast<int>(frame::kMaxSockets);
static_assert(frame::kFlagBytes == sizeof(SignalFlag) && frame::kFlagAlign == alignof(SignalFlag));

using transport_util::bump;

// Receive bounce buffer per socket: a payload rest at least this large is read straight into its
// region instead (no copy), anything smaller (headers, signals, keys, fingerprints) through it.
inline constexpr std::size_t kRxBounceBytes = 4096;
// Writes up to this long are copied into the link's send buffer (kTxPendingBytes) and leave with
// the next frame on socket 0, usually the signal that announces them: one sendmsg (and one trip
// through the TCP stack) for both.
inline constexpr std::size_t kCoalesceBytes = 1024;
inline constexpr std::size_t kTxPendingBytes = 4096;

// ---- the link ------------------------------------------------------------------------------
// Sender side (the thread driving the link): write/signal/poll/wait. Receiver side (the
// transport's progress thread): the per-socket parse state below, the deferred signals, and
// `broken_` (read by the sender side).
class TcpLink final : public Link {
 public:
  TcpLink(TcpTransport& transport, int self, int peer, std::vector<int> fds, std::chrono::milliseconds timeout,
          std::size_t stripe_min)
      : order(fds.size()), transport_(transport), self_(self), peer_(peer), fds_(std::move(fds)), timeout_(timeout),
        stripe_min_(stripe_min) {
    rx_.reserve(fds_.size());
    for (std::size_t s = 0; s < fds_.size(); ++s) rx_.push_back(Rx{frame::FrameReader(s), false});
  }
  ~TcpLink() override;
  /// The peer is a rank of this same process: its sockets linger without holding up the close.
  void set_same_process(bool same) noexcept { same_process_ = same; }

  Status write(const WriteOp& op) noexcept override {
    RINGFENCE_TRY(check_usable());
    if (RINGFENCE_UNLIKELY(peer_gone())) return drop(op.wr_id);
    const auto* dst = static_cast<const Remote*>(op.dst ? op.dst->impl() : nullptr);
    if (RINGFENCE_UNLIKELY(!dst || !op.src || !transport_util::write_in_bounds(op)))
      return fail(ErrorCode::InvalidUsage);
    if (!queue_.has_room()) return Status(ErrorCode::InProgress);
    const auto* src = static_cast<const std::byte*>(op.src);
    auto header = [&](std::size_t s, std::size_t lo, std::size_t hi) noexcept {
      FrameHeader h;
      h.type = FrameType::Write;
      h.socket = static_cast<std::uint8_t>(s);
      h.region = dst->id;
      h.offset = op.dst_offset + lo;
      h.length = hi - lo;
      return h;
    };
    if (op.bytes <= kCoalesceBytes && pending_len_ + sizeof(FrameHeader) + op.bytes <= pending_.size()) {
      // Small: into the send buffer, out with the next frame on socket 0.
      const FrameHeader h = header(0, 0, op.bytes);
      std::memcpy(pending_.data() + pending_len_, &h, sizeof h);
      if (op.bytes > 0) std::memcpy(pending_.data() + pending_len_ + sizeof h, src, op.bytes);
      pending_len_ += sizeof h + op.bytes;
      ++writes_sent_[0];
    } else {
      const std::size_t sockets = fds_.size();
      const std::size_t parts = op.bytes >= 2 * stripe_min_ && sockets > 1 ? std::min(sockets, op.bytes / stripe_min_) : 1;
      for (std::size_t p = 0; p < parts; ++p) {
        const std::size_t lo = op.bytes * p / parts, hi = op.bytes * (p + 1) / parts;
        const std::size_t s = parts > 1 ? p : next_socket_++ % sockets;
        FrameHeader h = header(s, lo, hi);
        iovec iov[2] = {{&h, sizeof h}, {const_cast<std::byte*>(src + lo), hi - lo}};
        RINGFENCE_TRY(send_all(s, iov, 2));
        ++writes_sent_[s];
      }
    }
    bump(stats_.writes, 1);
    bump(stats_.bytes_written, op.bytes);
    queue_.push(op.wr_id, Status::ok());
    return Status::ok();
  }

  Status signal(const SignalOp& op) noexcept override {
    RINGFENCE_TRY(check_usable());
    if (RINGFENCE_UNLIKELY(peer_gone())) return drop(op.wr_id);
    const auto* dst = static_cast<const Remote*>(op.dst ? op.dst->impl() : nullptr);
    if (RINGFENCE_UNLIKELY(!dst || !transport_util::flag_in_bounds(op)))
      return fail(ErrorCode::InvalidUsage);
    if (!queue_.has_room()) return Status(ErrorCode::InProgress);
    SignalFrame f;
    f.header.type = FrameType::Signal;
    f.header.socket = 0;
    f.header.region = dst->id;
    f.header.value = op.value;
    f.header.offset = op.offset;
    for (std::size_t s = 0; s < fds_.size(); ++s) f.writes_before[s] = writes_sent_[s];
    iovec iov{&f, sizeof f};
    RINGFENCE_TRY(send_all(0, &iov, 1));
    bump(stats_.signals, 1);
    queue_.push(op.wr_id, Status::ok());
    return Status::ok();
  }

  Status poll(std::span<Completion> out, std::size_t& n) noexcept override {
    n = 0;
    RINGFENCE_TRY(flush());
    queue_.pop(out, n);
    return Status::ok();
  }

  // The waiting thread reads this link's sockets itself (see TcpTransport::wait_reading): no
  // hand-off from the progress thread for the data it waits for.
  Status wait(SignalFlag& flag, std::uint32_t target, std::chrono::nanoseconds max) noexcept override;

  void fence(FenceReason why) noexcept override {
    // Writes that completed to the caller but wait in the send buffer still go out (they were
    // accepted before the fence), unless the communicator failed.
    if (why != FenceReason::Error) (void)flush();
    pending_len_ = 0;
    state_ = why == FenceReason::Shutdown ? LinkState::Closed : LinkState::Fenced;
    if (why == FenceReason::Error) abandon_ = true;  // the communicator failed: a short goodbye only
  }
  // A health fence only stops use: the connections stay up, so the link can resume.
  bool can_reopen() const noexcept override { return broken_code_.load(std::memory_order_acquire) == 0; }
  void reopen() noexcept override {
    if (state_ == LinkState::Fenced) state_ = LinkState::Up;
  }
  LinkState state() const noexcept override { return state_.load(std::memory_order_relaxed); }
  int peer() const noexcept override { return peer_; }
  const LinkStats& stats() const noexcept override { return stats_; }

  // ---- receiver side (progress thread only) ----
  struct Rx {
    frame::FrameReader reader;  // parses this socket's stream (tcp_frame.hpp)
    bool closed = false;        // the peer closed this socket (everything before it was read)
    int lowat = 1;              // SO_RCVLOWAT now set on the socket
    // Headers and small payloads are read kRxBounceBytes at a time into here and fed to the
    // reader (one recv for many small frames); the rest of a large payload goes straight into
    // its region.
    std::array<std::byte, kRxBounceBytes> bounce{};
  };
  // Held by whoever reads the sockets: the progress thread (try_lock, per event) or the thread
  // waiting on this link (which takes the sockets out of the progress thread's epoll meanwhile).
  std::mutex rx_mutex;
  // Guarded by rx_mutex. True while the sockets are out of the progress thread's epoll set:
  // during a wait, and after it until `kept_until` (see TcpTransport::wait_reading), so that a
  // thread waiting on the link again soon reads the next frames itself, with no epoll_ctl and no
  // wake-up of the progress thread in between.
  bool kept = false;
  std::chrono::steady_clock::time_point kept_until{};
  const std::vector<int>& fds() const noexcept { return fds_; }
  std::vector<Rx>& rx() noexcept { return rx_; }
  int self() const noexcept { return self_; }
  void add_wait_ns(std::uint64_t ns) noexcept { bump(stats_.wait_ns, ns); }
  // Signals wait here until the writes they follow were applied.
  frame::SignalOrder order;

  // Marks the link broken (progress thread or sender); the first reason wins.
  void mark_broken(ErrorCode code) noexcept {
    std::uint32_t expected = 0;
    broken_code_.compare_exchange_strong(expected, static_cast<std::uint32_t>(code), std::memory_order_acq_rel);
  }
  Status broken() const noexcept {
    const std::uint32_t c = broken_code_.load(std::memory_order_acquire);
    return c == 0 ? Status::ok() : Status(static_cast<ErrorCode>(c));
  }

 private:
  Status check_usable() const noexcept {
    if (RINGFENCE_UNLIKELY(state_ == LinkState::Fenced || state_ == LinkState::Closed)) return Status(ErrorCode::Fenced);
    const Status b = broken();
    return b.is_ok() || b.code() == ErrorCode::PeerUnreachable ? Status::ok() : b;
  }
  // The peer closed its end (it finished, or died). Writes and signals to it complete without
  // effect, as with shared memory into a departed peer's segment: a peer that left needs nothing
  // more from us (typically the last credit of a call it already finished); waits on it fail.
  bool peer_gone() const noexcept {
    return broken_code_.load(std::memory_order_acquire) == static_cast<std::uint32_t>(ErrorCode::PeerUnreachable);
  }
  Status drop(std::uint64_t wr_id) noexcept {
    if (!queue_.has_room()) return Status(ErrorCode::InProgress);
    queue_.push(wr_id, Status::ok());
    return Status::ok();
  }
  Status fail(ErrorCode code, int native = 0) noexcept {
    stats_.errors.fetch_add(1, std::memory_order_relaxed);
    return Status(code, native);
  }

  // Sends what waits in the send buffer (small writes), if anything and the link is up (a fence
  // sends or drops it first, so a fenced link holds nothing).
  Status flush() noexcept {
    return pending_len_ == 0 || state_ != LinkState::Up ? Status::ok() : send_all(0, nullptr, 0);
  }

  // Sends every byte of `iov` on socket `s`, waiting for room (the peer's progress thread
  // drains its sockets whatever its owner does, taking back within kKeepIdle plus one epoll
  // timeout those a past wait kept, so room comes unless the peer is gone or stopped): bounded by the communicator
  // timeout. On socket 0 the send buffer goes first, in
  // the same sendmsg.
  Status send_all(std::size_t s, iovec* caller_iov, int caller_count) noexcept {
    iovec all[4];
    iovec* iov = caller_iov;
    int count = caller_count;
    if (s == 0 && pending_len_ > 0) {
      all[0] = iovec{pending_.data(), pending_len_};
      for (int i = 0; i < caller_count && i < 3; ++i) all[i + 1] = caller_iov[i];
      iov = all;
      count = std::min(caller_count, 3) + 1;
      pending_len_ = 0;  // sent below, or dropped with the link (broken, or the peer gone)
    }
    const int fd = fds_[s];
    std::chrono::steady_clock::time_point deadline{};
    while (count > 0) {
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = static_cast<std::size_t>(count);
      const ssize_t n = ::sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          if (peer_gone()) return Status::ok();
          if (const Status b = broken(); !b.is_ok()) return fail(b.code());
          const auto now = std::chrono::steady_clock::now();
          if (deadline == std::chrono::steady_clock::time_point{}) deadline = now + timeout_;
          if (now >= deadline) return fail(ErrorCode::Timeout);
          pollfd p{fd, POLLOUT, 0};
          (void)::poll(&p, 1, 20);
          continue;
        }
        mark_broken(ErrorCode::PeerUnreachable);  // closed or reset by the peer: see peer_gone()
        return Status::ok();
      }
      auto left = static_cast<std::size_t>(n);
      while (count > 0 && left >= iov->iov_len) {
        left -= iov->iov_len;
        ++iov;
        --count;
      }
      if (count > 0) {
        iov->iov_base = static_cast<std::byte*>(iov->iov_base) + left;
        iov->iov_len -= left;
      }
    }
    return Status::ok();
  }

  TcpTransport& transport_;
  int self_;
  int peer_;
  std::vector<int> fds_;
  std::chrono::milliseconds timeout_;
  std::size_t stripe_min_;
  std::uint32_t writes_sent_[kMaxSockets] = {};
  std::size_t next_socket_ = 0;
  std::array<std::byte, kTxPendingBytes> pending_{};  // small write frames not sent yet (socket 0)
  std::size_t pending_len_ = 0;
  std::atomic<LinkState> state_{LinkState::Up};  // read by links() from other threads
  bool abandon_ = false;  // fenced with FenceReason::Error: the destructor lingers briefly
  bool same_process_ = false;  // the peer lives in this process (see TcpTransport::linger)
  std::atomic<std::uint32_t> broken_code_{0};
  LinkStats stats_;
  transport_util::CompletionQueue<> queue_;
  std::vector<Rx> rx_;
};

}  // namespace ringfence::transports::tcp::detail
