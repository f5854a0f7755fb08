// The TCP store (server and client) and UniqueId; InProcessStore and the wire format are in
// store_wire.cpp. Everything here is control plane: it may block, allocate and throw (except the
// server thread and destructors, which never throw).

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
#include <ringfence/log.hpp>
#include <ringfence/store.hpp>
#include <utility>

#include "store_detail.hpp"

namespace ringfence {
using detail::deadline_after;
using detail::get_i64;
using detail::put_i64;
using detail::wrapping_add;

// The wire format is little-endian. Headers are copied to and from the packed structs with
// memcpy, which is only correct on a little-endian host (every platform ringfence targets).
static_assert(std::endian::native == std::endian::little, "store wire format assumes a little-endian host");

namespace {

using Clock = std::chrono::steady_clock;

/// Owning file descriptor.
class Fd {
 public:
  Fd() noexcept = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  int release() noexcept { return std::exchange(fd_, -1); }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

std::string errno_text(int err) { return std::strerror(err); }

/// Milliseconds left until `deadline`, clamped to [0, INT_MAX] for poll().
int remaining_ms(Clock::time_point deadline) noexcept {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 0x7fffffff ? 0x7fffffff : static_cast<int>(left);
}


/// Resolves an IPv4 address. Returns the getaddrinfo code (0 on success).
int resolve_ipv4(const std::string& host, std::uint16_t port, bool passive, sockaddr_in& out) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* result = nullptr;
  const char* node = host.empty() ? nullptr : host.c_str();
  int rc = ::getaddrinfo(node, nullptr, &hints, &result);
  if (rc != 0) return rc;
  std::memcpy(&out, result->ai_addr, sizeof(out));
  out.sin_port = htons(port);
  ::freeaddrinfo(result);
  return 0;
}

std::string gai_text(int rc) { return rc == EAI_SYSTEM ? errno_text(errno) : ::gai_strerror(rc); }

/// Binds a listening-capable IPv4 socket on `host:port`; throws SystemError.
Fd bind_socket(const std::string& host, std::uint16_t port, int type_flags) {
  sockaddr_in addr{};
  if (int rc = resolve_ipv4(host, port, true, addr); rc != 0)
    throw SystemError(fmt::format("cannot resolve store bind address '{}': {}", host, gai_text(rc)), EINVAL);
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | type_flags, 0));
  if (!fd.valid())
    throw SystemError(fmt::format("socket() for store on {}:{}: {}", host, port, errno_text(errno)), errno);
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0)
    throw SystemError(fmt::format("cannot bind store address {}:{}: {}", host, port, errno_text(errno)), errno);
  return fd;
}

std::uint16_t bound_port(int fd, const std::string& host) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw SystemError(fmt::format("getsockname() on store socket for {}: {}", host, errno_text(errno)), errno);
  return ntohs(addr.sin_port);
}

std::span<const std::byte> token_bytes(const JobToken& token) noexcept { return std::as_bytes(std::span(token)); }

/// Compares without an early exit, so response timing does not reveal how much of a guessed
/// token was right.
bool token_equals(const JobToken& token, std::span<const std::byte> candidate) noexcept {
  if (candidate.size() != token.size()) return false;
  unsigned diff = 0;
  for (std::size_t i = 0; i < token.size(); ++i) diff |= token[i] ^ std::to_integer<unsigned>(candidate[i]);
  return diff == 0;
}




}  // namespace


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

struct Connection {
  Connection(Fd f, std::size_t max_value, Clock::time_point hello_deadline, std::string peer_name)
      : fd(std::move(f)), parser(max_value), deadline(hello_deadline), peer(std::move(peer_name)) {}
  Fd fd;
  store_wire::RequestParser parser;
  Clock::time_point deadline;  // hello deadline until authenticated; linger deadline once closing
  std::string peer;
  bool authenticated = false;
  bool closing = false;  // close once `out` is flushed (or at `deadline`)
  Bytes in;              // received bytes not yet parsed (kept while output is backed up)
  std::size_t in_off = 0;
  Bytes out;  // unsent response bytes
  std::size_t out_off = 0;

  std::size_t pending_out() const noexcept { return out.size() - out_off; }
  bool has_input() const noexcept { return in_off < in.size(); }
};

}  // namespace

struct TcpStoreServer::Impl {
  JobToken token;
  TcpStoreServerOptions options;
  const Logger* log;
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

  void run() noexcept;
  void serve_once();
  void accept_all();
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
  if (log) log->warn("store {}: refusing connection from {}: {}", name, c.peer, why);
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

void TcpStoreServer::Impl::accept_all() {
  for (;;) {
    sockaddr_in addr{};
    socklen_t len = sizeof(addr);
    int fd = ::accept4(listen_fd.get(), reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
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
    if (conns.size() >= options.max_connections) {
      refused.fetch_add(1, std::memory_order_relaxed);
      if (log) log->warn("store {}: refusing connection from {}: {} connections open", name, peer, conns.size());
      continue;  // conn_fd closes
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    conns.push_back(std::make_unique<Connection>(std::move(conn_fd), options.max_value_bytes,
                                                 Clock::now() + options.hello_timeout, std::move(peer)));
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
      if (log)
        log->warn("store {}: closing connection from {}: no hello within {} ms", name, c->peer,
                  options.hello_timeout.count());
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
  impl.log = log;
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

// ---------------------------------------------------------------------------------------------
// TcpStoreClient
// ---------------------------------------------------------------------------------------------

namespace {

// Responses larger than this are treated as a protocol error rather than allocated.
constexpr std::size_t kMaxResponseBytes = std::size_t{1} << 30;

/// Non-blocking connect bounded by `deadline`. Returns the connected socket or an invalid Fd
/// with `err` set.
Fd try_connect(const sockaddr_in& addr, Clock::time_point deadline, int& err) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) {
    err = errno;
    return {};
  }
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
  if (errno != EINPROGRESS && errno != EINTR) {
    err = errno;
    return {};
  }
  pollfd p{fd.get(), POLLOUT, 0};
  int n;
  do {
    n = ::poll(&p, 1, remaining_ms(deadline));
  } while (n < 0 && errno == EINTR);
  if (n <= 0) {
    err = n == 0 ? ETIMEDOUT : errno;
    return {};
  }
  int so_error = 0;
  socklen_t len = sizeof(so_error);
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) so_error = errno;
  if (so_error != 0) {
    err = so_error;
    return {};
  }
  return fd;
}

}  // namespace

TcpStoreClient::TcpStoreClient(const std::string& host, std::uint16_t port, const JobToken& token,
                               std::chrono::milliseconds timeout)
    : io_timeout_(timeout), peer_(fmt::format("{}:{}", host, port)) {
  const auto deadline = deadline_after(timeout);
  auto backoff = std::chrono::milliseconds(5);
  std::string last_error = "no attempt";
  for (;;) {
    sockaddr_in addr{};
    int rc = resolve_ipv4(host, port, false, addr);
    if (rc == 0) {
      int err = 0;
      Fd fd = try_connect(addr, deadline, err);
      if (fd.valid()) {
        int one = 1;
        ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        fd_ = fd.release();
        break;
      }
      last_error = errno_text(err);
    } else if (rc == EAI_AGAIN) {
      last_error = gai_text(rc);  // resolver temporarily unavailable: retry
    } else {
      throw InvalidUsage(fmt::format("cannot resolve store host '{}': {}", host, gai_text(rc)));
    }
    if (Clock::now() >= deadline)
      throw TimeoutError(fmt::format("could not connect to store at {} within {} ms (last error: {})", peer_,
                                     timeout.count(), last_error));
    // The server may simply not be up yet: retry with a short, growing pause.
    std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(backoff, deadline - Clock::now()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
  }
  store_wire::Reply reply{};
  try {
    request(store_wire::Op::Hello, {}, token_bytes(token), reply);
  } catch (...) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    throw;
  }
  if (reply != store_wire::Reply::Ok) {
    ::close(fd_);
    fd_ = -1;
    if (reply == store_wire::Reply::Denied) throw InvalidUsage(fmt::format("store at {} refused the job token", peer_));
    throw InvalidUsage(fmt::format("store at {} rejected the hello (reply {})", peer_, static_cast<int>(reply)));
  }
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

Bytes TcpStoreClient::request(store_wire::Op op, std::string_view key, std::span<const std::byte> value,
                              store_wire::Reply& reply) {
  if (fd_ < 0)
    throw PeerUnreachableError(fmt::format("connection to store at {} was closed after an earlier error", peer_));
  const Bytes frame = store_wire::encode_request(op, key, value);
  const auto deadline = deadline_after(io_timeout_);

  auto wait = [&](short events, const char* what) {
    pollfd p{fd_, events, 0};
    for (;;) {
      int n = ::poll(&p, 1, remaining_ms(deadline));
      if (n > 0) return;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        throw SystemError(fmt::format("poll() on store connection to {}: {}", peer_, errno_text(errno)), errno);
      throw TimeoutError(fmt::format("store at {} did not {} within {} ms", peer_, what, io_timeout_.count()));
    }
  };
  auto closed = [&](int err) -> PeerUnreachableError {
    return PeerUnreachableError(err == 0 ? fmt::format("store at {} closed the connection", peer_)
                                         : fmt::format("store connection to {} failed: {}", peer_, errno_text(err)));
  };
  auto recv_exact = [&](std::byte* dst, std::size_t len) {
    std::size_t got = 0;
    while (got < len) {
      ssize_t n = ::recv(fd_, dst + got, len - got, 0);
      if (n > 0) {
        got += static_cast<std::size_t>(n);
      } else if (n == 0) {
        throw closed(0);
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        wait(POLLIN, "reply");
      } else if (errno != EINTR) {
        throw closed(errno);
      }
    }
  };

  try {
    std::size_t sent = 0;
    while (sent < frame.size()) {
      ssize_t n = ::send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<std::size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        wait(POLLOUT, "accept the request");
      } else if (n < 0 && errno != EINTR) {
        throw closed(errno);
      }
    }
    store_wire::ResponseHeader header{};
    recv_exact(reinterpret_cast<std::byte*>(&header), sizeof(header));
    if (header.magic != store_wire::kMagic || header.value_len > kMaxResponseBytes)
      throw Error(ErrorCode::Fatal, fmt::format("store at {} sent a malformed response (magic {:#x}, {} value bytes)",
                                                peer_, header.magic, header.value_len));
    Bytes out(header.value_len);
    recv_exact(out.data(), out.size());
    reply = static_cast<store_wire::Reply>(header.reply);
    return out;
  } catch (...) {
    // The stream is no longer in step with the server; later requests fail fast.
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

void TcpStoreClient::set(std::string_view key, std::span<const std::byte> value) {
  store_wire::Reply reply{};
  {
    std::lock_guard lock(mutex_);
    request(store_wire::Op::Set, key, value, reply);
  }
  if (reply != store_wire::Reply::Ok)
    throw InvalidUsage(fmt::format("store at {} rejected set of key '{}' ({} value bytes; reply {})", peer_, key,
                                   value.size(), static_cast<int>(reply)));
}

Bytes TcpStoreClient::get(std::string_view key, std::chrono::milliseconds timeout) {
  const auto deadline = deadline_after(timeout);
  auto backoff = std::chrono::milliseconds(1);
  for (;;) {
    store_wire::Reply reply{};
    Bytes value;
    {
      std::lock_guard lock(mutex_);
      value = request(store_wire::Op::Get, key, {}, reply);
    }
    if (reply == store_wire::Reply::Ok) return value;
    if (reply != store_wire::Reply::NotFound)
      throw InvalidUsage(
          fmt::format("store at {} rejected get of key '{}' (reply {})", peer_, key, static_cast<int>(reply)));
    const auto now = Clock::now();
    if (now >= deadline)
      throw TimeoutError(
          fmt::format("store key '{}' was not set within {} ms (store at {})", key, timeout.count(), peer_));
    std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(50));
  }
}

std::int64_t TcpStoreClient::add(std::string_view key, std::int64_t delta) {
  Bytes delta_bytes;
  put_i64(delta_bytes, delta);
  store_wire::Reply reply{};
  Bytes value;
  {
    std::lock_guard lock(mutex_);
    value = request(store_wire::Op::Add, key, delta_bytes, reply);
  }
  if (reply != store_wire::Reply::Ok || value.size() != 8)
    throw InvalidUsage(fmt::format("store at {} rejected add on key '{}' (not a 64-bit counter; reply {})", peer_, key,
                                   static_cast<int>(reply)));
  return get_i64(value);
}

// ---------------------------------------------------------------------------------------------
// UniqueId
// ---------------------------------------------------------------------------------------------

// Layout: [0,4) magic "RFU1" LE, [4,6) port LE, [6,8) zero, [8,24) token, [24,128) host, NUL-terminated.
namespace {
constexpr std::uint32_t kUniqueIdMagic = 0x31554652u;
constexpr std::size_t kIdPortOffset = 4;
constexpr std::size_t kIdTokenOffset = 8;
constexpr std::size_t kIdHostOffset = 24;
constexpr std::size_t kIdMaxHost = 128 - kIdHostOffset - 1;
}  // namespace

UniqueId UniqueId::make(const std::string& host, std::uint16_t port, const JobToken& token) {
  RINGFENCE_EXPECTS(!host.empty() && host.size() <= kIdMaxHost, "UniqueId host '{}' must be 1..{} characters (got {})",
                    host, kIdMaxHost, host.size());
  RINGFENCE_EXPECTS(host.find('\0') == std::string::npos, "UniqueId host contains a NUL character");
  UniqueId id;
  std::memcpy(id.bytes.data(), &kUniqueIdMagic, 4);
  std::memcpy(id.bytes.data() + kIdPortOffset, &port, 2);
  std::memcpy(id.bytes.data() + kIdTokenOffset, token.data(), token.size());
  std::memcpy(id.bytes.data() + kIdHostOffset, host.data(), host.size());
  return id;
}

std::string UniqueId::host() const {
  std::uint32_t magic = 0;
  std::memcpy(&magic, bytes.data(), 4);
  RINGFENCE_EXPECTS(magic == kUniqueIdMagic, "UniqueId is not valid (bad magic {:#x}); was it made by get_unique_id()?",
                    magic);
  const char* start = reinterpret_cast<const char*>(bytes.data() + kIdHostOffset);
  const std::size_t len = ::strnlen(start, kIdMaxHost);
  return std::string(start, len);
}

std::uint16_t UniqueId::port() const noexcept {
  std::uint16_t port = 0;
  std::memcpy(&port, bytes.data() + kIdPortOffset, 2);
  return port;
}

JobToken UniqueId::token() const noexcept {
  JobToken token{};
  std::memcpy(token.data(), bytes.data() + kIdTokenOffset, token.size());
  return token;
}

UniqueId get_unique_id(const std::string& host) {
  // The port is free now but not reserved; rank 0 binds it again with SO_REUSEADDR. A race with
  // another process taking it in between is possible, which is why ringfence-run hosts its
  // own store instead.
  Fd fd = bind_socket(host, 0, 0);
  const std::uint16_t port = bound_port(fd.get(), host);
  return UniqueId::make(host, port, random_token());
}

JobToken random_token() {
  JobToken token{};
  std::size_t got = 0;
  while (got < token.size()) {
    ssize_t n = ::getrandom(token.data() + got, token.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SystemError(fmt::format("getrandom() for the job token: {}", errno_text(errno)), errno);
    }
    got += static_cast<std::size_t>(n);
  }
  return token;
}

PrefixStore::PrefixStore(std::shared_ptr<Store> inner, std::string prefix) : inner_(std::move(inner)), prefix_(std::move(prefix)) {
  RINGFENCE_EXPECTS(inner_ != nullptr, "PrefixStore: inner store must not be null");
}
std::string PrefixStore::key(std::string_view k) const {
  std::string out = prefix_;
  out += k;
  return out;
}
void PrefixStore::set(std::string_view k, std::span<const std::byte> value) { inner_->set(key(k), value); }
Bytes PrefixStore::get(std::string_view k, std::chrono::milliseconds timeout) { return inner_->get(key(k), timeout); }
std::int64_t PrefixStore::add(std::string_view k, std::int64_t delta) { return inner_->add(key(k), delta); }

}  // namespace ringfence
