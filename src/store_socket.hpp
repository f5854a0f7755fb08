#pragma once
// Socket helpers of the TCP store (store_server.cpp, store.cpp): an owning descriptor, address
// resolution, binding, and the job-token comparison. Control plane: may throw SystemError.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ringfence/error.hpp>
#include <ringfence/store.hpp>
#include <span>
#include <string>
#include <utility>

#include "store_detail.hpp"

namespace ringfence::detail {

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

inline std::string errno_text(int err) { return std::strerror(err); }

/// Milliseconds left until `deadline`, clamped to [0, INT_MAX] for poll().
inline int remaining_ms(Clock::time_point deadline) noexcept {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 0x7fffffff ? 0x7fffffff : static_cast<int>(left);
}


/// Resolves an IPv4 address. Returns the getaddrinfo code (0 on success).
inline int resolve_ipv4(const std::string& host, std::uint16_t port, bool passive, sockaddr_in& out) {
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

inline std::string gai_text(int rc) { return rc == EAI_SYSTEM ? errno_text(errno) : ::gai_strerror(rc); }

/// Binds a listening-capable IPv4 socket on `host:port`; throws SystemError.
inline Fd bind_socket(const std::string& host, std::uint16_t port, int type_flags) {
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

inline std::uint16_t bound_port(int fd, const std::string& host) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw SystemError(fmt::format("getsockname() on store socket for {}: {}", host, errno_text(errno)), errno);
  return ntohs(addr.sin_port);
}

inline std::span<const std::byte> token_bytes(const JobToken& token) noexcept { return std::as_bytes(std::span(token)); }

/// Compares without an early exit, so response timing does not reveal how much of a guessed
/// token was right.
inline bool token_equals(const JobToken& token, std::span<const std::byte> candidate) noexcept {
  if (candidate.size() != token.size()) return false;
  unsigned diff = 0;
  for (std::size_t i = 0; i < token.size(); ++i) diff |= token[i] ^ std::to_integer<unsigned>(candidate[i]);
  return diff == 0;
}

}  // namespace ringfence::detail

namespace ringfence {
// The store's two files (store.cpp, store_server.cpp) use these unqualified; this header is
// private to them.
using detail::bind_socket;
using detail::bound_port;
using detail::Clock;
using detail::deadline_after;
using detail::errno_text;
using detail::Fd;
using detail::gai_text;
using detail::get_i64;
using detail::put_i64;
using detail::remaining_ms;
using detail::resolve_ipv4;
using detail::token_bytes;
using detail::token_equals;
using detail::wrapping_add;
}  // namespace ringfence
