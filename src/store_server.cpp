// The TCP store's server: one thread, non-blocking sockets, authenticated and bounded frames.
// Never throws on its thread.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <ringfence/error.hpp>
#include <optional>
#include <ringfence/log.hpp>
#include <ringfence/store.hpp>
#include <utility>

#include "store_detail.hpp"
#include "store_socket.hpp"

namespace ringfence {

// ---------------------------------------------------------------------------------------------
// TcpStoreServer
// ---------------------------------------------------------------------------------------------

namespace {

// A connection stops reading new requests while this much response data is unsent, so a
// client that pipelines Gets without reading cannot make the server buffer without bound.
constexpr std::size_t kMaxPendingOutput = 4u << 20;
// Bytes read from a socket per wakeup.
constexpr std::size_t kReadChunk = 64u << 10;
// How long a connection being closed may take to drain its last reply (BadRequest, Denied).
constexpr std::chrono::milliseconds kCloseLinger{1000};
// Pause before retrying accept() after running out of descriptors (avoids a busy loop while
// the listening socket stays readable).
constexpr std::chrono::milliseconds kAcceptBackoff{100};
// Connections accepted per wakeup before the server polls its other connections again.
constexpr int kAcceptBurst = 256;

struct Connection {
  Connection(Fd f, std::size_t max_value, Clock::time_point hello_deadline, std::string peer_name)
      : fd(std::move(f)), parser(max_value), deadline(hello_deadline), peer(std::move(peer_name)) {}
  Fd fd;
  store_wire::RequestParser parser;
  Clock::time_point deadline;  // hello deadline until authenticated; linger deadline once closing
  std::string peer;            // "ip:port"
  Clock::time_point opened = Clock::now();
  bool authenticated = false;
  bool closing = false;  // close once `out` is flushed (or at `deadline`)
  Bytes in;              // received bytes not yet parsed (kept while output is backed up)
  std::size_t in_off = 0;
  Bytes out;  // unsent response bytes
  std::size_t out_off = 0;

  std::size_t pending_out() const noexcept { return out.size() - out_off; }
  bool has_input() const noexcept { return in_off < in.size(); }
};

// "ip" of "ip:port".
std::string_view address_of(std::string_view peer) noexcept { return peer.substr(0, peer.rfind(':')); }

}  // namespace

struct TcpStoreServer::Impl {
  JobToken token;
  TcpStoreServerOptions options;
  std::optional<Logger> own_log;  // a copy: the caller's logger may end before the server does
  const Logger* log = nullptr;     // &*own_log, or null
  std::string name;  // host:port, for log lines
  Fd listen_fd;
  Fd wake_fd;
  std::atomic<std::uint64_t> refused{0};
  std::atomic<bool> stopping{false};
  std::mutex stop_mutex;
  std::thread thread;
  // Only the server thread touches the fields below.
  std::map<std::string, Bytes, std::less<>> values;
  std::vector<std::unique_ptr<Connection>> conns;
  Clock::time_point accept_paused_until{};
  LogThrottle throttle;  // refusals and evictions are strangers' doing: a few lines per 10 s

  void run() noexcept;
  void serve_once();
  void accept_all();
  std::size_t live_connections() const;
  bool evict_oldest_unauthenticated(std::string_view address);
  void warn_refusal(std::string_view peer, std::string_view why);
  void on_readable(Connection& c);
  void process_input(Connection& c);
  void handle_frame(Connection& c);
  void flush(Connection& c);
  void reply(Connection& c, store_wire::Reply code, std::span<const std::byte> value = {});
  void refuse(Connection& c, store_wire::Reply code, std::string_view why);
};

void TcpStoreServer::Impl::reply(Connection& c, store_wire::Reply code, std::span<const std::byte> value) {
  store_wire::ResponseHeader header{};
  header.magic = store_wire::kMagic;
  header.reply = static_cast<std::uint8_t>(code);
  header.value_len = static_cast<std::uint32_t>(value.size());
  if (c.out_off == c.out.size()) {
    c.out.clear();
    c.out_off = 0;
  }
  const auto* h = reinterpret_cast<const std::byte*>(&header);
  c.out.insert(c.out.end(), h, h + sizeof(header));
  c.out.insert(c.out.end(), value.begin(), value.end());
}

void TcpStoreServer::Impl::refuse(Connection& c, store_wire::Reply code, std::string_view why) {
  refused.fetch_add(1, std::memory_order_relaxed);
  warn_refusal(c.peer, why);
  reply(c, code);
  c.closing = true;
  c.deadline = Clock::now() + kCloseLinger;
  c.in.clear();
  c.in_off = 0;
}

void TcpStoreServer::Impl::handle_frame(Connection& c) {
  using store_wire::Op;
  using store_wire::Reply;
  const Op op = c.parser.op();
  if (!c.authenticated) {
    if (op != Op::Hello || !token_equals(token, c.parser.value())) {
      refuse(c, Reply::Denied, op == Op::Hello ? "wrong job token" : "first request is not a hello");
      return;
    }
    c.authenticated = true;
    reply(c, Reply::Ok);
    return;
  }
  switch (op) {
    case Op::Hello:
      // A repeated hello is harmless when it carries the same token.
      if (!token_equals(token, c.parser.value())) {
        refuse(c, Reply::Denied, "wrong job token in a repeated hello");
        return;
      }
      reply(c, Reply::Ok);
      return;
    case Op::Set: {
      auto value = c.parser.value();
      auto it = values.find(c.parser.key());
      if (it == values.end())
        values.emplace(std::string(c.parser.key()), Bytes(value.begin(), value.end()));
      else
        it->second.assign(value.begin(), value.end());
      reply(c, Reply::Ok);
      return;
    }
    case Op::Get: {
      auto it = values.find(c.parser.key());
      if (it == values.end())
        reply(c, Reply::NotFound);
      else
        reply(c, Reply::Ok, it->second);
      return;
    }
    case Op::Add: {
      // Semantic errors (not a counter, bad delta size) keep the connection: the stream is intact.
      if (c.parser.value().size() != 8) {
        reply(c, Reply::BadRequest);
        return;
      }
      auto it = values.find(c.parser.key());
      if (it == values.end()) it = values.emplace(std::string(c.parser.key()), Bytes(8, std::byte{0})).first;
      if (it->second.size() != 8) {
        reply(c, Reply::BadRequest);
        return;
      }
      put_i64(it->second, wrapping_add(get_i64(it->second), get_i64(c.parser.value())));
      reply(c, Reply::Ok, it->second);
      return;
    }
  }
  refuse(c, Reply::BadRequest, "unknown op");
}

void TcpStoreServer::Impl::process_input(Connection& c) {
  while (!c.closing && c.has_input() && c.pending_out() < kMaxPendingOutput) {
    std::span<const std::byte> in(c.in.data() + c.in_off, c.in.size() - c.in_off);
    const std::size_t before = in.size();
    auto result = c.parser.feed(in);
    c.in_off += before - in.size();
    if (result == store_wire::ParseResult::Malformed) {
      refuse(c, store_wire::Reply::BadRequest, fmt::format("malformed request ({})", c.parser.error()));
      return;
    }
    if (result == store_wire::ParseResult::Frame) handle_frame(c);
  }
  if (!c.has_input()) {
    c.in.clear();
    c.in_off = 0;
  }
}

void TcpStoreServer::Impl::on_readable(Connection& c) {
  c.in.resize(kReadChunk);
  c.in_off = 0;
  ssize_t n;
  do {
    n = ::recv(c.fd.get(), c.in.data(), c.in.size(), 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    c.in.clear();
    return;
  }
  if (n <= 0) {
    // Peer closed (or reset). Not counted as refused: a client whose connect() timed out on its
    // side but completed on ours closes exactly like this.
    c.in.clear();
    if (!c.authenticated && log) log->debug("store {}: {} closed before authenticating", name, c.peer);
    c.fd.reset();
    return;
  }
  c.in.resize(static_cast<std::size_t>(n));
  process_input(c);
}

void TcpStoreServer::Impl::flush(Connection& c) {
  while (c.pending_out() > 0) {
    ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_off, c.pending_out(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      c.fd.reset();  // peer gone
      return;
    }
    c.out_off += static_cast<std::size_t>(n);
  }
  c.out.clear();
  c.out_off = 0;
}

std::size_t TcpStoreServer::Impl::live_connections() const {
  std::size_t n = 0;
  for (const auto& c : conns) n += c->fd.valid() ? 1 : 0;
  return n;
}

// Closes the unauthenticated connection (from `address`, when not empty) open the longest.
bool TcpStoreServer::Impl::evict_oldest_unauthenticated(std::string_view address) {
  Connection* oldest = nullptr;
  for (const auto& c : conns) {
    if (!c->fd.valid() || c->authenticated || c->closing) continue;
    if (!address.empty() && address_of(c->peer) != address) continue;
    if (!oldest || c->opened < oldest->opened) oldest = c.get();
  }
  if (!oldest) return false;
  refused.fetch_add(1, std::memory_order_relaxed);
  warn_refusal(oldest->peer, "closed unauthenticated to make room for a newer connection");
  oldest->fd.reset();
  return true;
}

void TcpStoreServer::Impl::warn_refusal(std::string_view peer, std::string_view why) {
  if (std::uint64_t held = 0; log && throttle.allow(held))
    log->warn("store {}: refusing connection from {}: {}{}", name, peer, why,
              held ? fmt::format(" ({} more refusals were not logged)", held) : std::string());
}

void TcpStoreServer::Impl::accept_all() {
  int accepted = 0;
  for (;;) {
    sockaddr_in addr{};
    socklen_t len = sizeof(addr);
    int fd = ::accept4(listen_fd.get(), reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors (a flood of silent connections may hold them all): closing the oldest
      // unauthenticated one frees one for the connection waiting; only when there is none left
      // to close does the server pause accepting.
      if ((errno == EMFILE || errno == ENFILE) && evict_oldest_unauthenticated({})) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        if (log) log->warn("store {}: accept() failed: {}; pausing accepts", name, errno_text(errno));
        accept_paused_until = Clock::now() + kAcceptBackoff;
      }
      return;  // EAGAIN or an error we cannot act on
    }
    Fd conn_fd(fd);
    char ip[INET_ADDRSTRLEN] = "?";
    ::inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof(ip));
    std::string peer = fmt::format("{}:{}", ip, ntohs(addr.sin_port));
    // Full (overall, or of this address's unauthenticated connections): make room by closing the
    // oldest connection that has not authenticated, so a flood of silent connections can delay
    // a rank by one round trip at most instead of locking it out. Only when every slot holds an
    // authenticated client is the newcomer refused.
    const std::string_view address = address_of(peer);
    std::size_t same_address = 0;
    for (const auto& c : conns)
      if (c->fd.valid() && !c->authenticated && !c->closing && address_of(c->peer) == address) ++same_address;
    const bool address_full = same_address >= options.max_unauthenticated_per_address;
    if (address_full || live_connections() >= options.max_connections) {
      if (!evict_oldest_unauthenticated(address_full ? address : std::string_view())) {
        refused.fetch_add(1, std::memory_order_relaxed);
        warn_refusal(peer, fmt::format("{} authenticated connections open", conns.size()));
        continue;  // conn_fd closes
      }
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    conns.push_back(std::make_unique<Connection>(std::move(conn_fd), options.max_value_bytes,
                                                 Clock::now() + options.hello_timeout, std::move(peer)));
    // A ringfence client sends its hello right after connecting: read it now, so that it is
    // authenticated before the silent connections of a flood accepted after it push it out.
    Connection& added = *conns.back();
    on_readable(added);
    if (added.fd.valid() && added.pending_out() > 0) flush(added);
    // Back to poll() now and then, so hellos that arrived on earlier connections are read
    // before a long backlog of new ones is accepted.
    if (++accepted >= kAcceptBurst) return;
  }
}

void TcpStoreServer::Impl::serve_once() {
  const auto now = Clock::now();
  // Expire connections that did not authenticate in time, or that could not drain their last reply.
  for (auto& c : conns) {
    if (!c->fd.valid() || now < c->deadline) continue;
    if (c->closing) {
      c->fd.reset();
    } else if (!c->authenticated) {
      refused.fetch_add(1, std::memory_order_relaxed);
      warn_refusal(c->peer, fmt::format("no hello within {} ms", options.hello_timeout.count()));
      c->fd.reset();
    }
  }
  std::erase_if(conns, [](const auto& c) { return !c->fd.valid(); });

  std::vector<pollfd> fds;
  fds.reserve(conns.size() + 2);
  fds.push_back({wake_fd.get(), POLLIN, 0});
  const bool accepting = now >= accept_paused_until;
  fds.push_back({accepting ? listen_fd.get() : -1, POLLIN, 0});
  auto wake_at = Clock::time_point::max();
  if (!accepting) wake_at = accept_paused_until;
  for (auto& c : conns) {
    short events = 0;
    if (!c->closing && !c->has_input() && c->pending_out() < kMaxPendingOutput) events |= POLLIN;
    if (c->pending_out() > 0) events |= POLLOUT;
    fds.push_back({c->fd.get(), events, 0});
    if (!c->authenticated || c->closing) wake_at = std::min(wake_at, c->deadline);
  }
  const int timeout = wake_at == Clock::time_point::max() ? -1 : std::max(1, remaining_ms(wake_at));
  int n = ::poll(fds.data(), fds.size(), timeout);
  if (n < 0) {
    if (errno == EINTR) return;
    if (log) log->error("store {}: poll() failed: {}", name, errno_text(errno));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return;
  }
  if (stopping.load(std::memory_order_acquire)) return;
  if (fds[1].fd >= 0 && (fds[1].revents & POLLIN)) accept_all();
  // `conns` may have grown in accept_all; only the first fds.size() - 2 entries were polled.
  for (std::size_t i = 2; i < fds.size(); ++i) {
    Connection& c = *conns[i - 2];
    const short ev = fds[i].revents;
    if (ev == 0 || !c.fd.valid()) continue;
    if (ev & POLLOUT) flush(c);
    if (c.fd.valid() && (ev & (POLLIN | POLLHUP | POLLERR)) && !c.closing && !c.has_input()) on_readable(c);
    if (c.fd.valid() && (ev & POLLNVAL)) c.fd.reset();
    // Output drained: resume requests held back by backpressure.
    if (c.fd.valid() && c.has_input()) process_input(c);
    if (c.fd.valid() && c.pending_out() > 0) flush(c);
    if (c.fd.valid() && c.closing && c.pending_out() == 0) {
      ::shutdown(c.fd.get(), SHUT_WR);
      c.fd.reset();
    }
    // A closing connection that is still readable (peer keeps sending) must not spin poll.
    if (c.fd.valid() && c.closing && (ev & (POLLHUP | POLLERR))) c.fd.reset();
  }
}

void TcpStoreServer::Impl::run() noexcept {
  while (!stopping.load(std::memory_order_acquire)) {
    try {
      serve_once();
    } catch (const std::exception& e) {
      // Out of memory or similar: keep serving the other clients rather than dying silently.
      if (log) log->error("store {}: {}", name, e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } catch (...) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  conns.clear();
}

TcpStoreServer::TcpStoreServer(const JobToken& token, const std::string& bind_host, std::uint16_t port,
                               TcpStoreServerOptions options, const Logger* log)
    : impl_(std::make_unique<Impl>()) {
  RINGFENCE_EXPECTS(options.max_value_bytes <= 0xffffffffu, "TcpStoreServerOptions::max_value_bytes {} exceeds 4 GiB",
                    options.max_value_bytes);
  Impl& impl = *impl_;
  impl.token = token;
  impl.options = options;
  if (log) {
    impl.own_log = *log;
    impl.log = &*impl.own_log;
  }
  impl.listen_fd = bind_socket(bind_host, port, SOCK_NONBLOCK);
  if (::listen(impl.listen_fd.get(), SOMAXCONN) != 0)
    throw SystemError(fmt::format("listen() on store address {}:{}: {}", bind_host, port, errno_text(errno)), errno);
  port_ = bound_port(impl.listen_fd.get(), bind_host);
  impl.name = fmt::format("{}:{}", bind_host, port_);
  impl.wake_fd = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl.wake_fd.valid())
    throw SystemError(fmt::format("eventfd() for store {}: {}", impl.name, errno_text(errno)), errno);
  impl.thread = std::thread([&impl] { impl.run(); });
}

TcpStoreServer::~TcpStoreServer() { stop(); }

std::uint64_t TcpStoreServer::refused() const noexcept {
  return impl_ ? impl_->refused.load(std::memory_order_relaxed) : 0;
}

void TcpStoreServer::stop() noexcept {
  if (!impl_) return;
  std::lock_guard lock(impl_->stop_mutex);
  impl_->stopping.store(true, std::memory_order_release);
  if (impl_->thread.joinable()) {
    std::uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(impl_->wake_fd.get(), &one, sizeof(one));
    try {
      impl_->thread.join();
    } catch (...) {
    }
  }
  impl_->conns.clear();
  impl_->listen_fd.reset();
  impl_->wake_fd.reset();
}

}  // namespace ringfence
