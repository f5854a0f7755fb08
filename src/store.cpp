// The TCP store's client, UniqueId and PrefixStore (the server is store_server.cpp; InProcessStore
// and the wire format are store_wire.cpp). Control plane: may block, allocate and throw (except
// destructors, which never throw).

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
#include "store_socket.hpp"

namespace ringfence {

// The wire format is little-endian. Headers are copied to and from the packed structs with
// memcpy, which is only correct on a little-endian host (every platform ringfence targets).
static_assert(std::endian::native == std::endian::little, "store wire format assumes a little-endian host");

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
        // A server under a flood of silent connections may close ours before reading the hello
        // (it makes room by closing the oldest unauthenticated ones): connect again.
        if (hello(token)) return;
        last_error = "the store closed the connection before answering the hello";
      } else {
        last_error = errno_text(err);
      }
    } else if (rc == EAI_AGAIN) {
      last_error = gai_text(rc);  // resolver temporarily unavailable: retry
    } else {
      throw InvalidUsage(fmt::format("cannot resolve store host '{}': {}", host, gai_text(rc)));
    }
    if (Clock::now() >= deadline)
      throw TimeoutError(fmt::format("could not connect to store at {} within {} ms (last error: {})", peer_,
                                     timeout.count(), last_error));
    // The server may simply not be up yet, or full: retry with a short, growing pause.
    std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(backoff, deadline - Clock::now()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
  }
}

// Authenticates the connection in fd_. True when the server accepted the token; false when the
// connection was lost on the way (fd_ closed; the caller connects again). Throws InvalidUsage
// when the server refused the token or the hello.
bool TcpStoreClient::hello(const JobToken& token) {
  store_wire::Reply reply{};
  try {
    request(store_wire::Op::Hello, {}, token_bytes(token), reply);
  } catch (const PeerUnreachableError&) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    return false;
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
  return true;
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
  // The port is free now but not reserved; rank 0 binds it again with SO_REUSEADDR. It is taken
  // from below Linux's default ephemeral range (32768-60999), as the launcher-derived ports are:
  // there no outgoing connection of another process is handed it in between (a port 0 bind
  // lands in the ephemeral range, which any connect() may take). Only when none of a few tries
  // binds does it fall back to a kernel-chosen port. ringfence-run hosts its own store instead.
  const JobToken token = random_token();
  std::uint32_t pick = 0;
  std::memcpy(&pick, token.data(), sizeof pick);
  for (int attempt = 0; attempt < 16; ++attempt) {
    const auto port = static_cast<std::uint16_t>(20000 + (pick + static_cast<std::uint32_t>(attempt) * 7919u) % 12000u);
    try {
      Fd fd = bind_socket(host, port, 0);
      return UniqueId::make(host, port, token);
    } catch (const SystemError& e) {
      if (e.native() != EADDRINUSE) throw;
    }
  }
  Fd fd = bind_socket(host, 0, 0);
  return UniqueId::make(host, bound_port(fd.get(), host), token);
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
