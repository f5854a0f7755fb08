#pragma once
// The tcp transport (TcpTransport). Its control plane is declared here and defined in
// tcp_transport.cpp, tcp_regions.cpp, tcp_connect.cpp and tcp_progress.cpp; its receive path
// (wait_reading, drain_socket and their helpers: hot) is inline here.
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <ringfence/error.hpp>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/transport.hpp>
#include <ringfence/transport_util.hpp>
#include <ringfence/transports/tcp.hpp>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include "tcp_frame.hpp"
#include "tcp_link.hpp"
#include "tcp_regions.hpp"

namespace ringfence::transports::tcp::detail {

// ---- the transport -------------------------------------------------------------------------
class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(const TransportContext& ctx);
  ~TcpTransport() override;

  std::string_view name() const noexcept override { return kName; }
  // The receiving side reads each payload from its socket into the registered region, so a
  // user buffer is as cheap a destination as staging and saves the copy out of it.
  const TransportTraits& traits() const noexcept override {
    static const TransportTraits kTraits{.cheap_user_writes = true, .speed_spread = 10.0};
    return kTraits;
  }

  Reachability can_reach(const PeerInfo&, const PeerInfo&) const override {
    Reachability r;
    r.ok = true;
    r.bandwidth_gbps = 1.25;  // a 10 GbE port; loopback is faster
    r.latency_us = 20.0;
    r.min_chunk_bytes = options_.chunk_bytes;  // each chunk costs a hand-off to the receiving thread
    return r;
  }

  MemoryRegion register_memory(void* ptr, std::size_t bytes, MemoryKind kind) override;
  void deregister(std::uint32_t id) noexcept;
  RemoteRegion import_region(std::span<const std::byte> key) override;
  std::unique_ptr<ListenHandle> listen() override;
  std::unique_ptr<PendingLink> connect(ListenHandle& local, const PeerInfo& peer, std::span<const std::byte> address) override;

  // ---- progress thread ----
  void add_link(TcpLink* link);
  // Puts socket `s` of `link` into the progress thread's epoll set.
  bool watch_socket(TcpLink& link, std::size_t s) noexcept {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = (static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(&link)) << 3) | s;
    return ::epoll_ctl(epoll_, EPOLL_CTL_ADD, link.fds()[s], &ev) == 0;
  }
  void remove_link(TcpLink* link) noexcept;
  void linger(const std::vector<int>& fds, bool abandoned, bool same_process) noexcept;

  // Link::wait: the calling thread reads the link's sockets itself until `flag` reaches
  // `target`, the link breaks, or min(max, 20 ms) passed; the progress thread leaves the link
  // alone meanwhile (its sockets are out of the epoll set), so nothing is handed over.
  //
  // The sockets stay out of the epoll set for kKeepIdle after the wait: a collective waits on
  // its links every few microseconds, and frames that arrive between two waits (a credit, the
  // next call's fingerprint) would each wake the progress thread, which reads them and hands
  // them over; the next wait reads them instead. The progress thread takes idle links back
  // (take_back_idle), so frames are never left unread for longer than kKeepIdle plus one epoll
  // timeout (a peer blocked sending to us, because we are blocked sending to it, waits that long
  // at most; handing the sockets back at once from such a sender measured no faster, even with
  // 208 KiB socket buffers, and was dropped).
  Status wait_reading(TcpLink& link, SignalFlag& flag, std::uint32_t target, std::chrono::nanoseconds max) noexcept {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::min<std::chrono::nanoseconds>(max, std::chrono::milliseconds(20));
    const auto spin_until = start + std::chrono::microseconds(options_.spin_us);
    const std::size_t sockets = link.fds().size();
    Status result(ErrorCode::InProgress);
    {
      std::lock_guard lock(link.rx_mutex);  // the progress thread holds it only while it drains
      if (!link.kept) {
        for (std::size_t s = 0; s < sockets; ++s)
          if (!link.rx()[s].closed) (void)::epoll_ctl(epoll_, EPOLL_CTL_DEL, link.fds()[s], nullptr);
        link.kept = true;
        // The progress thread may sleep without a timeout (it kept no link when it last
        // looked): wake it so that it starts looking for idle ones. Once per keeping, which
        // happens after an idle spell, not per wait.
        wake_progress();
      }
      pollfd fds[kMaxSockets];
      for (;;) {
        for (std::size_t s = 0; s < sockets; ++s) drain_socket(link, s);
        if (reached(flag.value.load(std::memory_order_acquire), target)) {
          result = Status::ok();
          break;
        }
        if (const Status b = link.broken(); !b.is_ok()) {
          result = b;
          break;
        }
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline) break;
        if (now < spin_until) {
          sched_yield();
          continue;
        }
        nfds_t k = 0;
        for (std::size_t s = 0; s < sockets; ++s)
          if (!link.rx()[s].closed) fds[k++] = pollfd{link.fds()[s], POLLIN, 0};
        const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
        const timespec ts{static_cast<time_t>(left / 1000000000), static_cast<long>(left % 1000000000)};
        (void)::ppoll(fds, k, &ts, nullptr);
      }
      link.kept_until = std::chrono::steady_clock::now() + kKeepIdle;
    }
    link.add_wait_ns(static_cast<std::uint64_t>((std::chrono::steady_clock::now() - start).count()));
    return result;
  }

  // Puts the sockets of a kept link back into the progress thread's epoll set (nothing more is
  // read from a link fenced as malformed, or from an ended socket). Needs link.rx_mutex.
  void return_sockets(TcpLink& link) noexcept {
    link.kept = false;
    if (link.broken().code() != ErrorCode::Fenced)
      for (std::size_t s = 0; s < link.fds().size(); ++s)
        if (!link.rx()[s].closed) (void)watch_socket(link, s);
  }
  // How long a link's sockets stay with the thread that last waited on it.
  static constexpr auto kKeepIdle = std::chrono::milliseconds(2);

  std::uint64_t refused() const noexcept { return refused_; }
  std::uint64_t& refused_counter() noexcept { return refused_; }
  const Logger* log() const noexcept { return log_; }
  const PeerInfo& self() const noexcept { return self_; }
  const Options& options() const noexcept { return options_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }

 private:
  void start();
  void close_lingering() noexcept;
  static constexpr auto kLinger = std::chrono::seconds(10);
  static constexpr auto kShortLinger = std::chrono::milliseconds(250);

  void wake_progress() noexcept {
    const std::uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof one);
  }
  void stop() noexcept;
  void progress() noexcept;

  // Takes back the sockets of links nobody waited on for kKeepIdle (a link being waited on
  // holds its rx_mutex, so try_lock skips it); what arrived meanwhile makes the level-triggered
  // epoll report them at once. True while some link stays kept. Needs links_mutex_.
  bool take_back_idle() noexcept {
    const auto now = std::chrono::steady_clock::now();
    bool kept = false;
    for (TcpLink* link : links_) {
      std::unique_lock rx(link->rx_mutex, std::try_to_lock);
      if (!rx.owns_lock()) {
        kept = true;  // being waited on (or given back right now): look again later
      } else if (link->kept && now >= link->kept_until) {
        return_sockets(*link);
      } else {
        kept = kept || link->kept;
      }
    }
    return kept;
  }

  // Reads what socket `s` of `link` has: headers into the reader, payloads straight into their
  // registered region (the reader validated the header first). Returns when the socket would
  // block or the link broke.
  void drain_socket(TcpLink& link, std::size_t s) noexcept {
    TcpLink::Rx& rx = link.rx()[s];
    const int fd = link.fds()[s];
    auto lookup = [this](std::uint32_t id) noexcept -> std::optional<frame::Region> {
      std::lock_guard lock(regions_mutex_);
      if (id >= regions_.size() || !regions_[id].live) return std::nullopt;
      return frame::Region{regions_[id].base, regions_[id].bytes};
    };
    auto apply = [](std::byte* flag, std::uint32_t v) noexcept { transport_util::store_flag(*reinterpret_cast<SignalFlag*>(flag), v); };
    // Feeds `n` bytes just placed in reader.buffer() to the reader; false when the link broke.
    auto step = [&](std::size_t n) noexcept {
      switch (rx.reader.advance(n, lookup)) {
        case frame::Step::NeedMore: return true;
        case frame::Step::Write: link.order.write_done(s, apply); return true;
        case frame::Step::Signal:
          if (!link.order.signal(rx.reader.flag(), rx.reader.value(), rx.reader.writes_before(), apply)) {
            malformed(link, "more early signals than fit");
            return false;
          }
          return true;
        case frame::Step::Malformed: malformed(link, rx.reader.error()); return false;
      }
      return false;
    };
    for (int rounds = 0; rounds < 64; ++rounds) {
      // A malformed frame stops all reading; a peer that closed one socket may still have
      // bytes in flight on the others, which are read to their end.
      if (link.broken().code() == ErrorCode::Fenced || rx.closed) return;
      const std::span<std::byte> into = rx.reader.buffer();
      const bool direct = into.size() >= kRxBounceBytes;  // the rest of a large payload: no copy
      const std::span<std::byte> to = direct ? into : std::span<std::byte>(rx.bounce);
      const ssize_t n = ::recv(fd, to.data(), to.size(), MSG_DONTWAIT);
      if (!consumed(link, rx, n)) {
        if (!rx.closed) set_lowat(link, s);
        return;
      }
      const auto got = static_cast<std::size_t>(n);
      if (direct) {
        if (!step(got)) return;
      } else {
        // The frames in the bounce buffer, in order, each part copied to where the reader wants
        // it (a header into the reader; a payload, once its header passed the checks, into its
        // region). A reader that wants nothing is malformed, and step() reports it.
        for (std::size_t at = 0; at < got;) {
          const std::span<std::byte> want = rx.reader.buffer();
          const std::size_t k = std::min(want.size(), got - at);
          if (k > 0) std::memcpy(want.data(), rx.bounce.data() + at, k);
          at += k;
          if (!step(k) || k == 0) return;
        }
      }
      if (got < to.size()) {  // a short read: the socket is empty for now (epoll and ppoll say when not)
        set_lowat(link, s);
        return;
      }
    }
  }

  // Wakes for socket `s` only once the bytes the reader waits for are there (up to kMaxLowat),
  // not for every segment of a large payload. They come for sure (a sender sends whole frames),
  // or the socket ends, which wakes anyway.
  static void set_lowat(TcpLink& link, std::size_t s) noexcept {
    TcpLink::Rx& rx = link.rx()[s];
    const std::size_t want = rx.reader.buffer().size();
    const int lowat = want >= kMinLowat ? static_cast<int>(std::min(want, kMaxLowat)) : 1;
    if (lowat == rx.lowat) return;
    if (::setsockopt(link.fds()[s], SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof lowat) == 0) rx.lowat = lowat;
  }
  static constexpr std::size_t kMinLowat = 64 * 1024, kMaxLowat = 256 * 1024;

  // n bytes came from recv: false when nothing is there now, or when the socket ended. The
  // link is gone once every socket ended in order (the peer closed: everything it sent was
  // read) or one failed (a reset: what was in flight is lost).
  bool consumed(TcpLink& link, TcpLink::Rx& rx, ssize_t n) noexcept {
    if (n > 0) return true;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
    const int err = n < 0 ? errno : 0;
    rx.closed = true;
    if (rx.reader.mid_frame()) {  // a truncated frame: part of it may already be in place
      if (link.broken().is_ok() && log_)
        log_->error("tcp: the connection from rank {} ended inside a frame ({} bytes of it missing: a truncated frame; {}): link fenced",
                    link.peer(), rx.reader.missing(), err == 0 ? "end of stream" : std::strerror(err));
      link.mark_broken(ErrorCode::Fenced);
      for (int fd : link.fds()) (void)::epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
      return false;
    }
    // An ended socket stays readable (EOF) for epoll: stop watching it, or the loop would spin.
    const auto index = static_cast<std::size_t>(&rx - link.rx().data());
    (void)::epoll_ctl(epoll_, EPOLL_CTL_DEL, link.fds()[index], nullptr);
    bool all = true;
    for (const auto& other : link.rx()) all &= other.closed;
    if (err != 0 || all) {
      if (link.broken().is_ok() && log_)
        log_->info("tcp: the connection from rank {} closed ({})", link.peer(), err == 0 ? "end of stream" : std::strerror(err));
      link.mark_broken(ErrorCode::PeerUnreachable);
    }
    return false;
  }

  void malformed(TcpLink& link, const char* what) noexcept {
    if (log_) log_->error("tcp: rank {} sent {}: link fenced, nothing of that frame written", link.peer(), what);
    link.mark_broken(ErrorCode::Fenced);
    for (int fd : link.fds()) (void)::epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);  // read nothing more from it
  }

  PeerInfo self_;
  Options options_;
  std::chrono::milliseconds timeout_;
  const Logger* log_;
  InterfaceFilter filter_;
  std::mutex regions_mutex_;
  std::vector<RegionEntry> regions_;
  std::mutex links_mutex_;
  std::vector<TcpLink*> links_;
  int epoll_ = -1, wake_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  std::uint64_t refused_ = 0;
  std::mutex linger_mutex_;
  struct Lingering {
    int fd;
    bool abandoned;     // its communicator failed: linger kShortLinger only
    bool same_process;  // the peer is in this process: linger in the background
  };
  static void linger_then_close(std::vector<Lingering> sockets) noexcept;
  std::vector<Lingering> lingering_;  // sockets of closed links (see linger)
};

}  // namespace ringfence::transports::tcp::detail
