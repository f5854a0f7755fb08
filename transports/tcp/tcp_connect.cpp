// Connection setup of the tcp transport: the listening socket, the hello handshake that carries
// the job's secret, and dialing (lower rank) or accepting (higher rank) a peer's sockets.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <ringfence/error.hpp>
#include <ringfence/log.hpp>
#include <string>
#include <vector>

#include "tcp_transport.hpp"

namespace ringfence::transports::tcp::detail {
namespace {

constexpr std::size_t kSecretBytes = 16;

struct Hello {
  std::uint32_t magic = kHelloMagic;
  std::int32_t from_rank = -1;
  std::int32_t to_rank = -1;
  std::int32_t socket = 0;
  std::int32_t sockets = 1;
  std::uint32_t header_bytes = sizeof(FrameHeader);  // same frame layout on both ends
  std::array<std::uint8_t, kSecretBytes> secret{};
};

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

  static std::string held_note(std::uint64_t held) {
    return held ? fmt::format(" ({} more refused connections were not logged)", held) : std::string();
  }

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
          if (std::uint64_t held = 0; log && throttle_.allow(held))
            log->warn("tcp: refused a connection from {} to rank {}: {}{}", it->from, self,
                      h.magic != kHelloMagic            ? "not a ringfence hello"
                      : h.secret != address_.secret     ? "wrong secret (not from this job)"
                      : h.to_rank != self               ? "addressed to another rank"
                                                        : "bad hello (rank, socket count or frame layout)",
                      held_note(held));
          ::close(it->fd);
        }
        it = greeting_.erase(it);
      } else if (closed || stale) {
        ++refused;
        if (std::uint64_t held = 0; log && throttle_.allow(held))
          log->warn("tcp: refused a connection from {} to rank {}: {} (no secret){}", it->from, self,
                    closed ? "it closed before a complete hello" : "no complete hello within 10 s", held_note(held));
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
  LogThrottle throttle_;  // refusals are strangers' doing: a few lines per 10 s, then a count
  std::vector<Accepted> accepted_;
};

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
    // A peer in this very process (ncclCommInitAll: several ranks per process) is closed by the
    // same program, perhaps right after us on the same thread: the linger must not wait for it.
    link->set_same_process(peer_.pid == t_.self().pid && peer_.host_id == t_.self().host_id);
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

}  // namespace

std::unique_ptr<ListenHandle> TcpTransport::listen() {
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

std::unique_ptr<PendingLink> TcpTransport::connect(ListenHandle& local, const PeerInfo& peer, std::span<const std::byte> address) {
  auto* listen = dynamic_cast<TcpListen*>(&local);
  RINGFENCE_EXPECTS(listen != nullptr, "rank {}: tcp: connect needs this transport's listen handle", self_.rank);
  RINGFENCE_EXPECTS(peer.rank != self_.rank, "rank {}: tcp: no link to ourselves", self_.rank);
  return std::make_unique<TcpPending>(*this, *listen, peer, decode_address(address));
}

}  // namespace ringfence::transports::tcp::detail
