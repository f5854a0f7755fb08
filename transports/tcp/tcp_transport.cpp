// TCP transport. Control plane (listen, connect, registration) may block and throw; the Link
// data path is noexcept and allocation-free: a write sends a frame header and the payload from
// the caller's buffer (sendmsg, no copy on our side), a signal sends a small frame. One progress
// thread per transport (started with the first link) reads every socket with epoll and places
// payloads straight into registered memory, checking every length and offset first; a thread
// waiting on a link reads that link itself, and keeps it for a while (see wait_reading).
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/futex.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <ringfence/error.hpp>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/transport_util.hpp>
#include <ringfence/transports/tcp.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tcp_frame.hpp"

namespace ringfence::transports::tcp {

InterfaceFilter parse_interface_filter(std::string_view text) {
  InterfaceFilter f;
  if (!text.empty() && text.front() == '^') f.exclude = true, text.remove_prefix(1);
  if (!text.empty() && text.front() == '=') f.exact = true, text.remove_prefix(1);
  while (!text.empty()) {
    const auto comma = text.find(',');
    const std::string_view name = text.substr(0, comma);
    RINGFENCE_EXPECTS(!name.empty(), "RINGFENCE_SOCKET_IFNAME: empty interface name in '{}'", text);
    f.names.emplace_back(name);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
  }
  return f;
}

bool interface_matches(const InterfaceFilter& filter, std::string_view name) noexcept {
  if (filter.names.empty()) return true;
  bool hit = false;
  for (const auto& n : filter.names) hit |= filter.exact ? name == n : name.starts_with(n);
  return filter.exclude ? !hit : hit;
}

std::optional<Interface> choose_interface(const std::vector<Interface>& candidates, const InterfaceFilter& filter) {
  if (!filter.names.empty()) {
    for (const auto& c : candidates)
      if (interface_matches(filter, c.name)) return c;
    return std::nullopt;
  }
  for (const auto& c : candidates)
    if (!c.loopback) return c;
  for (const auto& c : candidates)
    if (c.loopback) return c;
  return std::nullopt;
}

std::vector<Interface> host_interfaces() {
  std::vector<Interface> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) throw SystemError(fmt::format("tcp: getifaddrs failed: {}", std::strerror(errno)), errno);
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    out.push_back(Interface{i->ifa_name, text, (i->ifa_flags & IFF_LOOPBACK) != 0});
  }
  ::freeifaddrs(list);
  return out;
}

namespace {

using frame::FrameHeader;
using frame::FrameType;
using frame::kFrameMagic;
using frame::kHelloMagic;
using frame::SignalFrame;
constexpr int kMaxSockets = static_cast<int>(frame::kMaxSockets);
constexpr std::size_t kSecretBytes = 16;
static_assert(frame::kFlagBytes == sizeof(SignalFlag) && frame::kFlagAlign == alignof(SignalFlag));

struct Hello {
  std::uint32_t magic = kHelloMagic;
  std::int32_t from_rank = -1;
  std::int32_t to_rank = -1;
  std::int32_t socket = 0;
  std::int32_t sockets = 1;
  std::uint32_t header_bytes = sizeof(FrameHeader);  // same frame layout on both ends
  std::array<std::uint8_t, kSecretBytes> secret{};
};

using transport_util::bump;

void tune_socket(int fd, int buffer_bytes) noexcept {
  const int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (buffer_bytes > 0) {
    (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof buffer_bytes);
    (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof buffer_bytes);
  }
}

// Listen address as it travels through the store: "a.b.c.d:port" NUL secret[16].
struct Address {
  std::string host;
  std::uint16_t port = 0;
  std::array<std::uint8_t, kSecretBytes> secret{};
};

Bytes encode_address(const Address& a) {
  const std::string text = fmt::format("{}:{}", a.host, a.port);
  Bytes out(text.size() + 1 + kSecretBytes);
  std::memcpy(out.data(), text.data(), text.size());
  std::memcpy(out.data() + text.size() + 1, a.secret.data(), kSecretBytes);
  return out;
}

Address decode_address(std::span<const std::byte> bytes) {
  RINGFENCE_EXPECTS(bytes.size() > kSecretBytes + 1 && bytes.size() < 128, "tcp: malformed listen address ({} bytes)", bytes.size());
  const std::size_t text_len = bytes.size() - kSecretBytes - 1;
  const std::string text(reinterpret_cast<const char*>(bytes.data()), text_len);
  RINGFENCE_EXPECTS(bytes[text_len] == std::byte{0}, "tcp: malformed listen address");
  const auto colon = text.rfind(':');
  RINGFENCE_EXPECTS(colon != std::string::npos && colon > 0, "tcp: malformed listen address '{}'", text);
  Address a;
  a.host = text.substr(0, colon);
  const long port = std::strtol(text.c_str() + colon + 1, nullptr, 10);
  RINGFENCE_EXPECTS(port > 0 && port < 65536, "tcp: malformed port in listen address '{}'", text);
  a.port = static_cast<std::uint16_t>(port);
  std::memcpy(a.secret.data(), bytes.data() + text_len + 1, kSecretBytes);
  return a;
}

// A registered local region: the progress thread writes into it.
struct RegionEntry {
  std::byte* base = nullptr;
  std::size_t bytes = 0;
  bool live = false;
};

class TcpTransport;
class TcpLink;

struct LocalRegion final : MemoryRegion::Impl {
  TcpTransport* owner = nullptr;
  std::uint32_t id = 0;
  std::size_t bytes = 0;
  Bytes key() const override;
  ~LocalRegion() override;
};

struct Remote final : RemoteRegion::Impl {
  std::uint32_t id = 0;
};

Bytes encode_region_key(std::uint32_t id, std::uint64_t bytes) {
  Bytes out(16);
  const std::uint32_t magic = kFrameMagic;
  std::memcpy(out.data(), &magic, 4);
  std::memcpy(out.data() + 4, &id, 4);
  std::memcpy(out.data() + 8, &bytes, 8);
  return out;
}

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
  std::atomic<std::uint32_t> broken_code_{0};
  LinkStats stats_;
  transport_util::CompletionQueue<> queue_;
  std::vector<Rx> rx_;
};

// ---- listening and connecting --------------------------------------------------------------
class TcpListen final : public ListenHandle {
 public:
  TcpListen(int fd, Address address) : fd_(fd), address_(std::move(address)) {}
  ~TcpListen() override {
    for (auto& a : accepted_) ::close(a.fd);
    if (fd_ >= 0) ::close(fd_);
  }
  Bytes address() const override { return encode_address(address_); }

  // A connection accepted and greeted, waiting for its link.
  struct Accepted {
    int fd = -1;
    int from = -1;
    int socket = 0;
    int sockets = 1;
  };
  // A connection accepted whose hello has not fully arrived.
  struct Greeting {
    int fd = -1;
    std::string from;  // the remote address, "ip:port", for log lines
    Hello hello;
    std::size_t got = 0;
    std::chrono::steady_clock::time_point since;
  };

  // Accepts what is pending and reads hellos; connections with a wrong secret, wrong rank or
  // garbage are closed and logged. Never blocks.
  void pump(int self, const Logger* log, std::uint64_t& refused) {
    for (;;) {
      sockaddr_in sa{};
      socklen_t len = sizeof sa;
      const int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&sa), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) break;
      char ip[INET_ADDRSTRLEN] = "?";
      if (sa.sin_family == AF_INET) ::inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
      greeting_.push_back(Greeting{fd, fmt::format("{}:{}", ip, ntohs(sa.sin_port)), {}, 0, std::chrono::steady_clock::now()});
    }
    for (auto it = greeting_.begin(); it != greeting_.end();) {
      auto* raw = reinterpret_cast<std::byte*>(&it->hello);
      const ssize_t n = ::recv(it->fd, raw + it->got, sizeof(Hello) - it->got, MSG_DONTWAIT);
      const bool closed = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
      const bool stale = std::chrono::steady_clock::now() - it->since > std::chrono::seconds(10);
      if (n > 0) it->got += static_cast<std::size_t>(n);
      if (it->got == sizeof(Hello)) {
        const Hello& h = it->hello;
        const bool ok = h.magic == kHelloMagic && h.secret == address_.secret && h.to_rank == self && h.from_rank >= 0 &&
                        h.socket >= 0 && h.sockets >= 1 && h.sockets <= kMaxSockets && h.socket < h.sockets &&
                        h.header_bytes == sizeof(FrameHeader);
        if (ok) {
          accepted_.push_back(Accepted{it->fd, h.from_rank, h.socket, h.sockets});
        } else {
          ++refused;
          if (log)
            log->warn("tcp: refused a connection from {} to rank {}: {}", it->from, self,
                      h.magic != kHelloMagic            ? "not a ringfence hello"
                      : h.secret != address_.secret     ? "wrong secret (not from this job)"
                      : h.to_rank != self               ? "addressed to another rank"
                                                        : "bad hello (rank, socket count or frame layout)");
          ::close(it->fd);
        }
        it = greeting_.erase(it);
      } else if (closed || stale) {
        ++refused;
        if (log)
          log->warn("tcp: refused a connection from {} to rank {}: {} (no secret)", it->from, self,
                    closed ? "it closed before a complete hello" : "no complete hello within 10 s");
        ::close(it->fd);
        it = greeting_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Takes the connections from `from` when all of them arrived (as many as the dialer said it
  // opens); empty otherwise.
  std::vector<int> claim(int from) {
    int sockets = 0;
    for (const auto& a : accepted_)
      if (a.from == from) sockets = a.sockets;
    if (sockets == 0) return {};
    std::vector<int> fds(static_cast<std::size_t>(sockets), -1);
    int have = 0;
    for (const auto& a : accepted_)
      if (a.from == from && a.socket < sockets && a.sockets == sockets) fds[static_cast<std::size_t>(a.socket)] = a.fd, ++have;
    if (have < sockets) return {};
    accepted_.erase(std::remove_if(accepted_.begin(), accepted_.end(), [&](const Accepted& a) { return a.from == from; }),
                    accepted_.end());
    return fds;
  }

  const Address& local() const noexcept { return address_; }

 private:
  int fd_;
  Address address_;
  std::vector<Greeting> greeting_;
  std::vector<Accepted> accepted_;
};

// ---- the transport -------------------------------------------------------------------------
class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(const TransportContext& ctx)
      : self_(ctx.self),
        options_(ctx.options ? ctx.options->tcp : TcpOptions{}),
        timeout_(ctx.options ? ctx.options->timeout : std::chrono::milliseconds(60000)),
        log_(ctx.log) {
    RINGFENCE_EXPECTS(options_.sockets >= 1 && options_.sockets <= kMaxSockets, "rank {}: RINGFENCE_TCP_SOCKETS must be in [1, {}] (got {})",
                      self_.rank, kMaxSockets, options_.sockets);
    filter_ = parse_interface_filter(options_.interfaces);
  }
  ~TcpTransport() override {
    stop();
    close_lingering();
  }

  std::string_view name() const noexcept override { return kName; }
  // The receiving side reads each payload from its socket into the registered region, so a
  // user buffer is as cheap a destination as staging and saves the copy out of it.
  bool cheap_user_writes() const noexcept override { return true; }

  Reachability can_reach(const PeerInfo&, const PeerInfo&) const override {
    Reachability r;
    r.ok = true;
    r.bandwidth_gbps = 1.25;  // a 10 GbE port; loopback is faster
    r.latency_us = 20.0;
    r.min_chunk_bytes = options_.chunk_bytes;  // each chunk costs a hand-off to the receiving thread
    return r;
  }

  MemoryRegion register_memory(void* ptr, std::size_t bytes, MemoryKind kind) override {
    RINGFENCE_EXPECTS(kind == MemoryKind::Host, "tcp: cannot register {} memory", to_string(kind));
    RINGFENCE_EXPECTS(ptr != nullptr || bytes == 0, "tcp: register_memory(nullptr, {})", bytes);
    std::lock_guard lock(regions_mutex_);
    std::uint32_t id = 0;
    while (id < regions_.size() && regions_[id].live) ++id;
    if (id == regions_.size()) regions_.push_back({});
    regions_[id] = RegionEntry{static_cast<std::byte*>(ptr), bytes, true};
    auto impl = std::make_unique<LocalRegion>();
    impl->owner = this;
    impl->id = id;
    impl->bytes = bytes;
    return MemoryRegion(std::move(impl), ptr, bytes, kind);
  }

  void deregister(std::uint32_t id) noexcept {
    std::lock_guard lock(regions_mutex_);
    if (id < regions_.size()) regions_[id] = RegionEntry{};
  }

  RemoteRegion import_region(std::span<const std::byte> key) override {
    RINGFENCE_EXPECTS(key.size() == 16, "tcp: malformed region key ({} bytes)", key.size());
    std::uint32_t magic = 0, id = 0;
    std::uint64_t bytes = 0;
    std::memcpy(&magic, key.data(), 4);
    std::memcpy(&id, key.data() + 4, 4);
    std::memcpy(&bytes, key.data() + 8, 8);
    RINGFENCE_EXPECTS(magic == kFrameMagic, "tcp: malformed region key (magic)");
    auto remote = std::make_unique<Remote>();
    remote->id = id;
    return RemoteRegion(std::move(remote), bytes);
  }

  std::unique_ptr<ListenHandle> listen() override {
    const std::vector<Interface> all = host_interfaces();
    const auto chosen = choose_interface(all, filter_);
    if (!chosen) {
      std::string names;
      for (const auto& i : all) names += (names.empty() ? "" : ", ") + i.name;
      throw InvalidUsage(fmt::format("rank {}: tcp: no up IPv4 interface matches RINGFENCE_SOCKET_IFNAME='{}' (have: {})", self_.rank,
                                     options_.interfaces, names));
    }
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) throw SystemError(fmt::format("rank {}: tcp: socket failed: {}", self_.rank, std::strerror(errno)), errno);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    ::inet_pton(AF_INET, chosen->address.c_str(), &sa.sin_addr);
    sa.sin_port = 0;
    socklen_t len = sizeof sa;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd, 256) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
      const int err = errno;
      ::close(fd);
      throw SystemError(fmt::format("rank {}: tcp: cannot listen on {} ({}): {}", self_.rank, chosen->address, chosen->name,
                                    std::strerror(err)),
                        err);
    }
    Address a;
    a.host = chosen->address;
    a.port = ntohs(sa.sin_port);
    std::random_device rd;
    for (auto& b : a.secret) b = static_cast<std::uint8_t>(rd());
    if (log_) log_->info("tcp: listening on {}:{} ({})", a.host, a.port, chosen->name);
    return std::make_unique<TcpListen>(fd, std::move(a));
  }

  std::unique_ptr<PendingLink> connect(ListenHandle& local, const PeerInfo& peer, std::span<const std::byte> address) override;

  // ---- progress thread ----
  void add_link(TcpLink* link) {
    std::lock_guard lock(links_mutex_);
    if (!thread_.joinable()) start();
    links_.push_back(link);
    for (std::size_t s = 0; s < link->fds().size(); ++s)
      if (!watch_socket(*link, s))
        throw SystemError(fmt::format("rank {}: tcp: epoll_ctl failed: {}", self_.rank, std::strerror(errno)), errno);
  }
  // Puts socket `s` of `link` into the progress thread's epoll set.
  bool watch_socket(TcpLink& link, std::size_t s) noexcept {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = (static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(&link)) << 3) | s;
    return ::epoll_ctl(epoll_, EPOLL_CTL_ADD, link.fds()[s], &ev) == 0;
  }
  void remove_link(TcpLink* link) noexcept {
    std::lock_guard lock(links_mutex_);
    for (int fd : link->fds()) (void)::epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
    links_.erase(std::remove(links_.begin(), links_.end(), link), links_.end());
  }

  // A closing link's sockets: our last bytes may still sit in the peer's receive queue, and a
  // close() while data arrives makes the kernel answer with a reset, which throws those bytes
  // away at the peer. So: send FIN now, and keep reading (discarding) until the peer closes too
  // or the linger deadline passes when the transport goes (see ~TcpTransport).
  // `abandoned`: the link's communicator failed (its peer may be dead or stopped and never
  // close): linger only kShortLinger, so destroying a failed communicator does not wait on it.
  void linger(const std::vector<int>& fds, bool abandoned) noexcept {
    std::lock_guard lock(linger_mutex_);
    for (int fd : fds) {
      (void)::shutdown(fd, SHUT_WR);
      lingering_.push_back(Lingering{fd, abandoned});
    }
  }

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
  const TcpOptions& options() const noexcept { return options_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }

 private:
  void start() {
    epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
    wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (epoll_ < 0 || wake_ < 0) throw SystemError(fmt::format("rank {}: tcp: epoll/eventfd failed: {}", self_.rank, std::strerror(errno)), errno);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = 0;
    ::epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_, &ev);
    thread_ = std::thread([this] { progress(); });
  }
  // Reads and discards until every lingering socket saw the peer's FIN (or an error), at most
  // kLinger; then closes them.
  void close_lingering() noexcept {
    std::lock_guard lock(linger_mutex_);
    const auto start = std::chrono::steady_clock::now();
    std::vector<pollfd> open;
    std::vector<bool> abandoned;
    for (const Lingering& l : lingering_) open.push_back(pollfd{l.fd, POLLIN, 0}), abandoned.push_back(l.abandoned);
    char sink[65536];
    while (!open.empty() && std::chrono::steady_clock::now() < start + kLinger) {
      (void)::poll(open.data(), open.size(), 50);
      const bool short_over = std::chrono::steady_clock::now() >= start + kShortLinger;
      for (std::size_t i = 0; i < open.size();) {
        ssize_t n = 1;
        while (n > 0) n = ::recv(open[i].fd, sink, sizeof sink, MSG_DONTWAIT);
        const bool done = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) || (abandoned[i] && short_over);
        if (done) {
          open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
          abandoned.erase(abandoned.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          ++i;
        }
      }
    }
    for (const Lingering& l : lingering_) ::close(l.fd);
    lingering_.clear();
  }
  static constexpr auto kLinger = std::chrono::seconds(10);
  static constexpr auto kShortLinger = std::chrono::milliseconds(250);

  void wake_progress() noexcept {
    const std::uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof one);
  }
  void stop() noexcept {
    if (thread_.joinable()) {
      stopping_.store(true, std::memory_order_release);
      wake_progress();
      thread_.join();
    }
    if (epoll_ >= 0) ::close(epoll_);
    if (wake_ >= 0) ::close(wake_);
    epoll_ = wake_ = -1;
  }

  void progress() noexcept {
    epoll_event events[64];
    constexpr int kKeepIdleMs = static_cast<int>(std::chrono::milliseconds(kKeepIdle).count());
    bool looking = false;  // some link is kept: wake up to take it back once idle
    // stop() sets the flag before it writes the wake-up counter, so once the thread read the
    // counter (whoever's write it took) the flag is seen here.
    while (!stopping_.load(std::memory_order_acquire)) {
      const int n = ::epoll_wait(epoll_, events, 64, looking ? kKeepIdleMs : -1);
      if (n < 0 && errno != EINTR) return;
      std::lock_guard lock(links_mutex_);  // links stay alive while we use them
      for (int i = 0; i < n; ++i) {
        if (events[i].data.u64 == 0) {  // stop, or a link was kept (wait_reading)
          std::uint64_t count;
          (void)!::read(wake_, &count, sizeof count);
          continue;
        }
        auto* link = reinterpret_cast<TcpLink*>(static_cast<std::uintptr_t>(events[i].data.u64 >> 3));
        const auto s = static_cast<std::size_t>(events[i].data.u64 & 7);
        if (std::find(links_.begin(), links_.end(), link) == links_.end()) continue;  // removed meanwhile
        std::unique_lock rx(link->rx_mutex, std::try_to_lock);
        if (!rx.owns_lock()) continue;  // its waiting thread reads it (and took it out of the epoll set)
        drain_socket(*link, s);
      }
      looking = take_back_idle();
    }
  }

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
  TcpOptions options_;
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
    bool abandoned;  // its communicator failed: linger kShortLinger only
  };
  std::vector<Lingering> lingering_;  // sockets of closed links (see linger)
};

Bytes LocalRegion::key() const { return encode_region_key(id, bytes); }
LocalRegion::~LocalRegion() {
  if (owner) owner->deregister(id);
}

Status TcpLink::wait(SignalFlag& flag, std::uint32_t target, std::chrono::nanoseconds max) noexcept {
  RINGFENCE_TRY(flush());
  if (reached(flag.value.load(std::memory_order_acquire), target)) return Status::ok();
  if (state_ == LinkState::Fenced) return Status(ErrorCode::Fenced);
  if (const Status b = broken(); !b.is_ok()) return b;
  return transport_.wait_reading(*this, flag, target, max);
}

TcpLink::~TcpLink() {
  (void)flush();
  transport_.remove_link(this);
  transport_.linger(fds_, abandon_);
}

// Lower rank dials, higher rank accepts. Both sides end with `sockets` greeted connections.
class TcpPending final : public PendingLink {
 public:
  TcpPending(TcpTransport& t, TcpListen& listen, const PeerInfo& peer, Address remote)
      : t_(t), listen_(listen), peer_(peer), remote_(std::move(remote)), sockets_(t.options().sockets),
        dial_(t.self().rank < peer.rank) {
    if (dial_) fds_.assign(static_cast<std::size_t>(sockets_), -1), sent_.assign(static_cast<std::size_t>(sockets_), 0);
  }
  ~TcpPending() override {
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
  }

  Status try_finish(std::unique_ptr<Link>& out) noexcept override {
    try {
      return dial_ ? dial(out) : accept(out);
    } catch (const std::exception& e) {
      if (t_.log()) t_.log()->error("tcp: connecting to rank {}: {}", peer_.rank, e.what());
      return Status(ErrorCode::System);
    }
  }

 private:
  Status accept(std::unique_ptr<Link>& out) {
    listen_.pump(t_.self().rank, t_.log(), t_.refused_counter());
    std::vector<int> fds = listen_.claim(peer_.rank);
    if (fds.empty()) return Status(ErrorCode::InProgress);
    return finish(std::move(fds), out);
  }

  Status dial(std::unique_ptr<Link>& out) {
    bool all = true;
    for (std::size_t s = 0; s < fds_.size(); ++s) {
      if (sent_[s] == sizeof(Hello)) continue;
      all = false;
      if (fds_[s] < 0) {
        fds_[s] = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fds_[s] < 0) throw SystemError(fmt::format("socket failed: {}", std::strerror(errno)), errno);
        tune_socket(fds_[s], t_.options().buffer_bytes);
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_port = htons(remote_.port);
        if (::inet_pton(AF_INET, remote_.host.c_str(), &sa.sin_addr) != 1)
          throw InvalidUsage(fmt::format("rank {} published a bad address '{}'", peer_.rank, remote_.host));
        if (::connect(fds_[s], reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 && errno != EINPROGRESS) {
          retry(s);
          continue;
        }
      }
      pollfd p{fds_[s], POLLOUT, 0};
      if (::poll(&p, 1, 0) <= 0) continue;  // still connecting
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fds_[s], SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {  // refused or reset: try again (the deadline is the caller's)
        retry(s);
        continue;
      }
      Hello h;
      h.from_rank = t_.self().rank;
      h.to_rank = peer_.rank;
      h.socket = static_cast<std::int32_t>(s);
      h.sockets = sockets_;
      h.secret = remote_.secret;
      const auto* raw = reinterpret_cast<const std::byte*>(&h);
      const ssize_t n = ::send(fds_[s], raw + sent_[s], sizeof(Hello) - sent_[s], MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) sent_[s] += static_cast<std::size_t>(n);
      else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) retry(s);
    }
    if (!all) {
      for (std::size_t s = 0; s < fds_.size(); ++s)
        if (sent_[s] != sizeof(Hello)) return Status(ErrorCode::InProgress);
    }
    std::vector<int> fds = std::move(fds_);
    fds_.clear();
    return finish(std::move(fds), out);
  }

  void retry(std::size_t s) noexcept {
    ::close(fds_[s]);
    fds_[s] = -1;
    sent_[s] = 0;
  }

  Status finish(std::vector<int> fds, std::unique_ptr<Link>& out) {
    for (int fd : fds) tune_socket(fd, t_.options().buffer_bytes);
    auto link = std::make_unique<TcpLink>(t_, t_.self().rank, peer_.rank, std::move(fds), t_.timeout(),
                                          t_.options().stripe_min_bytes);
    t_.add_link(link.get());
    out = std::move(link);
    return Status::ok();
  }

  TcpTransport& t_;
  TcpListen& listen_;
  PeerInfo peer_;
  Address remote_;
  int sockets_;
  bool dial_;
  std::vector<int> fds_;
  std::vector<std::size_t> sent_;
};

std::unique_ptr<PendingLink> TcpTransport::connect(ListenHandle& local, const PeerInfo& peer, std::span<const std::byte> address) {
  auto* listen = dynamic_cast<TcpListen*>(&local);
  RINGFENCE_EXPECTS(listen != nullptr, "rank {}: tcp: connect needs this transport's listen handle", self_.rank);
  RINGFENCE_EXPECTS(peer.rank != self_.rank, "rank {}: tcp: no link to ourselves", self_.rank);
  return std::make_unique<TcpPending>(*this, *listen, peer, decode_address(address));
}

}  // namespace

std::unique_ptr<Transport> make_transport(const TransportContext& context) { return std::make_unique<TcpTransport>(context); }

}  // namespace ringfence::transports::tcp
