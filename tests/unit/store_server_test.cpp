// Unit tests of the TCP store server's defences ([store]): clients without the job token,
// garbage and oversized frames, silent connections, connection limits and floods, a stopped
// store. Helpers in support/raw_store_client.hpp.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <ringfence/error.hpp>
#include <ringfence/store.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/captured_log.hpp"
#include "support/catch.hpp"
#include "support/raw_store_client.hpp"

using namespace store_test;

TEST_CASE("TcpStoreServer refuses connections without the job token and logs them with their address", "[store]") {
  const auto token = make_token(10);
  ringfence::test::CapturedLog log(ringfence::LogLevel::Info);
  ringfence::TcpStoreServer server(token, "127.0.0.1", 0, {}, log.get());
  // "ip:port" of our end of `fd`: the address the server must name.
  auto local_address = [](int fd) {
    sockaddr_in me{};
    socklen_t len = sizeof(me);
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0);
    return "127.0.0.1:" + std::to_string(ntohs(me.sin_port));
  };
  std::string from, why;
  int fd = connect_raw(server.port());
  from = local_address(fd);
  SECTION("wrong token") {
    send_raw(fd, hello_frame(make_token(11)));
    why = "wrong job token";
  }
  SECTION("no token: a hello without one") {
    send_raw(fd, wire::encode_request(wire::Op::Hello, {}, {}));
    why = "wrong job token";
  }
  SECTION("no token: the first request is not a hello") {
    send_raw(fd, wire::encode_request(wire::Op::Get, "k", {}));
    why = "first request is not a hello";
  }
  CHECK(read_response(fd).reply == static_cast<std::uint8_t>(wire::Reply::Denied));
  bool closed = false;
  read_until_closed(fd, closed);
  CHECK(closed);
  ::close(fd);
  CHECK(server.refused() == 1);
  CHECK(log.has_line(2s, "refusing connection from " + from + ": " + why));
  // A client with the token is served and not logged as refused.
  fd = connect_raw(server.port());
  from = local_address(fd);
  send_raw(fd, hello_frame(token));
  CHECK(read_response(fd).reply == static_cast<std::uint8_t>(wire::Reply::Ok));
  ::close(fd);
  CHECK(server.refused() == 1);
  CHECK_FALSE(log.has_line(0s, "refusing connection from " + from + ":"));
}

TEST_CASE("TcpStoreServer closes connections sending garbage or oversized frames", "[store]") {
  const auto token = make_token(6);
  ringfence::TcpStoreServerOptions options;
  options.max_value_bytes = 4096;
  ringfence::TcpStoreServer server(token, "127.0.0.1", 0, options);
  ringfence::TcpStoreClient good("127.0.0.1", server.port(), token, 1000ms);
  good.set("before", to_bytes("1"));

  SECTION("garbage before the hello") {
    int fd = connect_raw(server.port());
    const std::string http = "GET / HTTP/1.0\r\n\r\n";
    send_raw(fd, std::as_bytes(std::span(http.data(), http.size())));
    bool closed = false;
    Bytes reply = read_until_closed(fd, closed);
    ::close(fd);
    CHECK(closed);
    REQUIRE(reply.size() == sizeof(wire::ResponseHeader));
    wire::ResponseHeader h{};
    std::memcpy(&h, reply.data(), sizeof(h));
    CHECK(h.magic == wire::kMagic);
    CHECK(h.reply == static_cast<std::uint8_t>(wire::Reply::BadRequest));
  }
  SECTION("oversized header after a valid hello") {
    int fd = connect_raw(server.port());
    send_raw(fd, hello_frame(token));
    CHECK(read_response(fd).reply == static_cast<std::uint8_t>(wire::Reply::Ok));
    send_raw(fd, raw_header(wire::kMagic, static_cast<std::uint8_t>(wire::Op::Set), 1, 0xfffffff0u));
    bool closed = false;
    Bytes reply = read_until_closed(fd, closed);
    ::close(fd);
    CHECK(closed);
    REQUIRE(reply.size() == sizeof(wire::ResponseHeader));
    CHECK(static_cast<std::uint8_t>(reply[4]) == static_cast<std::uint8_t>(wire::Reply::BadRequest));
  }
  SECTION("client value over the server's limit") {
    ringfence::TcpStoreClient c("127.0.0.1", server.port(), token, 1000ms);
    CHECK_THROWS_AS(c.set("big", Bytes(4097)), ringfence::Error);
  }
  CHECK(eventually([&] { return server.refused() == 1; }));
  CHECK(server.refused() == 1);
  // The server keeps serving its other clients, old and new.
  CHECK(to_string(good.get("before", 0ms)) == "1");
  ringfence::TcpStoreClient fresh("127.0.0.1", server.port(), token, 1000ms);
  CHECK(to_string(fresh.get("before", 0ms)) == "1");
  CHECK_THROWS_AS(fresh.get("big", 0ms), ringfence::TimeoutError);  // the oversized set stored nothing
}

TEST_CASE("TcpStoreServer closes a connection that never says hello", "[store]") {
  const auto token = make_token(7);
  ringfence::TcpStoreServerOptions options;
  options.hello_timeout = 200ms;
  ringfence::TcpStoreServer server(token, "127.0.0.1", 0, options);
  const auto start = Clock::now();
  int fd = connect_raw(server.port());
  bool closed = false;
  Bytes got = read_until_closed(fd, closed);
  const auto waited = elapsed_ms(start);
  ::close(fd);
  CHECK(closed);
  CHECK(got.empty());
  CHECK(waited >= 180);
  CHECK(waited < 1000);
  CHECK(server.refused() == 1);
}

TEST_CASE("TcpStoreServer enforces max_connections against authenticated clients", "[store]") {
  const auto token = make_token(8);
  ringfence::TcpStoreServerOptions options;
  options.max_connections = 1;
  ringfence::TcpStoreServer server(token, "127.0.0.1", 0, options);
  ringfence::TcpStoreClient first("127.0.0.1", server.port(), token, 1000ms);
  // Every slot holds an authenticated client: the newcomer is refused, retries until its
  // deadline, and then says so.
  const auto start = Clock::now();
  CHECK_THROWS_AS(ringfence::TcpStoreClient("127.0.0.1", server.port(), token, 500ms), ringfence::TimeoutError);
  CHECK(elapsed_ms(start) >= 450);
  CHECK(server.refused() >= 1);
  first.set("still", to_bytes("works"));
  CHECK(to_string(first.get("still", 0ms)) == "works");
}

TEST_CASE("TcpStoreServer under a flood of silent connections still lets the job in, and logs a few lines", "[store][flood]") {
  const auto token = make_token(12);
  ringfence::test::CapturedLog log(ringfence::LogLevel::Warn);
  ringfence::TcpStoreServer server(token, "127.0.0.1", 0, {}, log.get());  // the defaults: 4096 slots
  // 4,200 connections that never say hello: more than the server's slots.
  std::vector<int> flood;
  for (int i = 0; i < 4200; ++i) flood.push_back(connect_raw(server.port()));
  CHECK(eventually([&] { return server.refused() >= 104; }));
  // A rank arriving now gets in at once (the oldest silent connection makes room), well inside
  // a setup deadline.
  const auto start = Clock::now();
  ringfence::TcpStoreClient rank("127.0.0.1", server.port(), token, 5000ms);
  rank.set("k", to_bytes("v"));
  CHECK(to_string(rank.get("k", 0ms)) == "v");
  // Under 1 s: sooner than the server's hello timeout would free a slot, so the oldest silent
  // connection was closed for it. ASan's build makes the 4,200 accepts several times slower
  // (1,077 ms seen on a loaded 2-core VM), so there only "well inside the deadline" is checked.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  CHECK(elapsed_ms(start) < 3000);
#else
  CHECK(elapsed_ms(start) < 1000);
#endif
  for (int fd : flood) ::close(fd);
  // Thousands of refusals, a handful of lines: three per 10 s, the next one with the count.
  const std::string text = log.text();
  std::size_t lines = 0;
  for (std::size_t at = text.find("refusing connection"); at != std::string::npos; at = text.find("refusing connection", at + 1))
    ++lines;
  INFO(text);
  CHECK(lines >= 1);
  CHECK(lines <= 4);
}

TEST_CASE("TcpStoreClient reports an unreachable or stopped store", "[store]") {
  const auto token = make_token(9);
  SECTION("nothing listening: TimeoutError naming host:port") {
    const std::uint16_t port = ringfence::get_unique_id("127.0.0.1").port();  // free, not listening
    const auto start = Clock::now();
    try {
      ringfence::TcpStoreClient c("127.0.0.1", port, token, 150ms);
      FAIL("connected to a port nobody listens on");
    } catch (const ringfence::TimeoutError& e) {
      CHECK_THAT(e.what(), Catch::Contains("127.0.0.1:" + std::to_string(port)) && Catch::Contains("150 ms"));
    }
    CHECK(elapsed_ms(start) >= 140);
    CHECK(elapsed_ms(start) < 800);
  }
  SECTION("server started after the client: the client retries") {
    const std::uint16_t port = ringfence::get_unique_id("127.0.0.1").port();
    std::unique_ptr<ringfence::TcpStoreServer> server;
    std::thread starter([&] {
      std::this_thread::sleep_for(60ms);
      server = std::make_unique<ringfence::TcpStoreServer>(token, "127.0.0.1", port);
    });
    ringfence::TcpStoreClient c("127.0.0.1", port, token, 2000ms);
    starter.join();
    CHECK(c.add("x", 2) == 2);
  }
  SECTION("server stopped: PeerUnreachableError") {
    ringfence::TcpStoreServer server(token, "127.0.0.1", 0);
    ringfence::TcpStoreClient c("127.0.0.1", server.port(), token, 1000ms);
    c.set("a", to_bytes("b"));
    server.stop();
    server.stop();  // idempotent
    CHECK_THROWS_AS(c.get("a", 100ms), ringfence::PeerUnreachableError);
    CHECK_THROWS_AS(c.set("a", to_bytes("c")), ringfence::PeerUnreachableError);
  }
  SECTION("unresolvable host: InvalidUsage") {
    CHECK_THROWS_AS(ringfence::TcpStoreClient("no-such-host.invalid", 1, token, 200ms), ringfence::Error);
  }
}

TEST_CASE("TcpStoreServer reports an address it cannot bind", "[store]") {
  const auto token = make_token(10);
  ringfence::TcpStoreServer first(token, "127.0.0.1", 0);
  CHECK_THROWS_AS(ringfence::TcpStoreServer(token, "127.0.0.1", first.port()), ringfence::SystemError);
}

// ---------------------------------------------------------------------------------------------
// UniqueId
// ---------------------------------------------------------------------------------------------

TEST_CASE("UniqueId round trips host, port and token", "[store]") {
  const auto token = make_token(11);
  const auto id = ringfence::UniqueId::make("node-17.cluster", 29500, token);
  CHECK(id.host() == "node-17.cluster");
  CHECK(id.port() == 29500);
  CHECK(id.token() == token);
  // The longest host that fits, and one byte more.
  const std::string longest(103, 'h');
  CHECK(ringfence::UniqueId::make(longest, 1, token).host() == longest);
  CHECK_THROWS_AS(ringfence::UniqueId::make(longest + "h", 1, token), ringfence::InvalidUsage);
  CHECK_THROWS_AS(ringfence::UniqueId::make("", 1, token), ringfence::InvalidUsage);
  CHECK_THROWS_AS(ringfence::UniqueId{}.host(), ringfence::InvalidUsage);
}

TEST_CASE("get_unique_id picks a usable port and a fresh random token", "[store]") {
  const auto a = ringfence::get_unique_id();
  const auto b = ringfence::get_unique_id("127.0.0.1");
  CHECK(a.host() == "127.0.0.1");
  CHECK(a.port() != 0);
  CHECK(a.token() != b.token());
  CHECK(a.token() != ringfence::JobToken{});
  // The id's port can host the store, and a client using the id's token gets in.
  ringfence::TcpStoreServer server(a.token(), a.host(), a.port());
  ringfence::TcpStoreClient c(a.host(), a.port(), a.token(), 1000ms);
  CHECK(c.add("n", 1) == 1);
  CHECK(ringfence::random_token() != ringfence::random_token());
}
