#pragma once
// Test helpers for the bootstrap store's tests (store_test.cpp, store_server_test.cpp): raw
// loopback sockets that speak (or mis-speak) the store's wire protocol, and bounded waits.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ringfence/store.hpp>
#include <span>
#include <thread>

#include "catch.hpp"

namespace store_test {

using namespace std::chrono_literals;
using ringfence::Bytes;
using ringfence::to_bytes;
using ringfence::to_string;
namespace wire = ringfence::store_wire;
using Clock = std::chrono::steady_clock;

inline long long elapsed_ms(Clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count();
}

inline ringfence::JobToken make_token(std::uint8_t seed) {
  ringfence::JobToken t{};
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::uint8_t>(seed + i * 7);
  return t;
}

inline Bytes hello_frame(const ringfence::JobToken& token) {
  return wire::encode_request(wire::Op::Hello, {}, std::as_bytes(std::span(token)));
}

inline Bytes raw_header(std::uint32_t magic, std::uint8_t op, std::uint16_t key_len, std::uint32_t value_len) {
  wire::RequestHeader h{magic, op, 0, key_len, value_len};
  Bytes out(sizeof(h));
  std::memcpy(out.data(), &h, sizeof(h));
  return out;
}

/// A blocking loopback socket with a 2 s receive timeout, so a broken server fails the test
/// instead of hanging it.
inline int connect_raw(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  return fd;
}

inline void send_raw(int fd, std::span<const std::byte> data) {
  REQUIRE(::send(fd, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size()));
}

/// Reads until the peer closes. `closed` is false when the 2 s receive timeout hit instead.
inline Bytes read_until_closed(int fd, bool& closed) {
  Bytes out;
  std::byte buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      out.insert(out.end(), buf, buf + n);
      continue;
    }
    closed = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
    return out;
  }
}

inline wire::ResponseHeader read_response(int fd) {
  wire::ResponseHeader h{};
  std::size_t got = 0;
  while (got < sizeof(h)) {
    ssize_t n = ::recv(fd, reinterpret_cast<char*>(&h) + got, sizeof(h) - got, 0);
    REQUIRE(n > 0);
    got += static_cast<std::size_t>(n);
  }
  return h;
}

/// Waits (bounded) until `pred` holds; server-side counters are updated on the server thread.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = 1000ms) {
  const auto deadline = Clock::now() + limit;
  while (!pred()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

}  // namespace store_test
