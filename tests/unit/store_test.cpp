// Unit tests of the bootstrap stores ([store]): bytes helpers, the in-process store, the wire
// parser and the TCP store's client; the server's defences against bad clients are in
// store_server_test.cpp, the launcher's in launcher_test.cpp.

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

// ---------------------------------------------------------------------------------------------
// Bytes helpers and InProcessStore
// ---------------------------------------------------------------------------------------------

TEST_CASE("to_bytes and to_string round trip, including NUL bytes", "[store]") {
  const std::string text("a\0b\xff", 4);
  Bytes b = to_bytes(text);
  REQUIRE(b.size() == 4);
  CHECK(b[1] == std::byte{0});
  CHECK(b[3] == std::byte{0xff});
  CHECK(to_string(b) == text);
  CHECK(to_bytes("").empty());
}

TEST_CASE("InProcessStore set, get, overwrite and add", "[store]") {
  ringfence::InProcessStore store;
  store.set("k", to_bytes("v1"));
  CHECK(to_string(store.get("k", 0ms)) == "v1");
  store.set("k", to_bytes("second"));
  CHECK(to_string(store.get("k", 0ms)) == "second");
  CHECK(store.add("n", 5) == 5);
  CHECK(store.add("n", -7) == -2);
  CHECK(store.get("n", 0ms).size() == 8);
  CHECK_THROWS_AS(store.add("k", 1), ringfence::InvalidUsage);
  CHECK_THROWS_AS(store.set(std::string(ringfence::kMaxStoreKeyBytes + 1, 'x'), to_bytes("v")),
                  ringfence::InvalidUsage);
}

TEST_CASE("InProcessStore get waits for a set from another thread", "[store]") {
  ringfence::InProcessStore store;
  const auto start = Clock::now();
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    store.set("late", to_bytes("here"));
  });
  Bytes got = store.get("late", 2000ms);
  setter.join();
  CHECK(to_string(got) == "here");
  CHECK(elapsed_ms(start) >= 40);
}

TEST_CASE("InProcessStore add is atomic across threads", "[store]") {
  ringfence::InProcessStore store;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) store.add("count", 1);
    });
  for (auto& t : threads) t.join();
  CHECK(store.add("count", 0) == 4000);
}

TEST_CASE("InProcessStore get times out naming the key and the timeout", "[store]") {
  ringfence::InProcessStore store;
  const auto start = Clock::now();
  try {
    store.get("never-set", 60ms);
    FAIL("get returned without the key being set");
  } catch (const ringfence::TimeoutError& e) {
    CHECK(e.code() == ringfence::ErrorCode::Timeout);
    CHECK_THAT(e.what(), Catch::Contains("never-set") && Catch::Contains("60 ms"));
  }
  CHECK(elapsed_ms(start) >= 55);
  CHECK(elapsed_ms(start) < 1000);
}

// ---------------------------------------------------------------------------------------------
// Wire format
// ---------------------------------------------------------------------------------------------

TEST_CASE("RequestParser assembles a frame fed byte by byte", "[store]") {
  const Bytes frame = wire::encode_request(wire::Op::Set, "key/1", to_bytes("value!"));
  REQUIRE(frame.size() == sizeof(wire::RequestHeader) + 5 + 6);
  wire::RequestParser parser(1024);
  for (std::size_t i = 0; i < frame.size(); ++i) {
    std::span<const std::byte> in(&frame[i], 1);
    const auto result = parser.feed(in);
    CHECK(in.empty());
    if (i + 1 < frame.size()) {
      REQUIRE(result == wire::ParseResult::NeedMore);
    } else {
      REQUIRE(result == wire::ParseResult::Frame);
    }
  }
  CHECK(parser.op() == wire::Op::Set);
  CHECK(parser.key() == "key/1");
  CHECK(to_string(parser.value()) == "value!");
}

TEST_CASE("RequestParser splits two frames sent back to back", "[store]") {
  Bytes stream = wire::encode_request(wire::Op::Get, "first", {});
  const Bytes second = wire::encode_request(wire::Op::Add, "second", to_bytes("12345678"));
  stream.insert(stream.end(), second.begin(), second.end());
  wire::RequestParser parser(1024);
  std::span<const std::byte> in(stream);
  REQUIRE(parser.feed(in) == wire::ParseResult::Frame);
  CHECK(parser.op() == wire::Op::Get);
  CHECK(parser.key() == "first");
  CHECK(parser.value().empty());
  CHECK(in.size() == second.size());
  REQUIRE(parser.feed(in) == wire::ParseResult::Frame);
  CHECK(parser.op() == wire::Op::Add);
  CHECK(parser.key() == "second");
  CHECK(to_string(parser.value()) == "12345678");
  CHECK(in.empty());
  // A header-only frame (empty key and value) completes without further input.
  const Bytes empty = wire::encode_request(wire::Op::Get, "", {});
  std::span<const std::byte> in2(empty);
  REQUIRE(parser.feed(in2) == wire::ParseResult::Frame);
  CHECK(parser.key().empty());
}

TEST_CASE("RequestParser reports a truncated frame as NeedMore", "[store]") {
  const Bytes frame = wire::encode_request(wire::Op::Set, "k", to_bytes("abcdef"));
  wire::RequestParser parser(1024);
  std::span<const std::byte> part(frame.data(), frame.size() - 2);
  CHECK(parser.feed(part) == wire::ParseResult::NeedMore);
  CHECK(part.empty());
  std::span<const std::byte> header_only(frame.data(), 5);
  wire::RequestParser parser2(1024);
  CHECK(parser2.feed(header_only) == wire::ParseResult::NeedMore);
  CHECK(parser2.error().empty());
  std::span<const std::byte> rest(frame.data() + frame.size() - 2, 2);
  REQUIRE(parser.feed(rest) == wire::ParseResult::Frame);
  CHECK(to_string(parser.value()) == "abcdef");
}

TEST_CASE("RequestParser rejects bad headers before reading the body", "[store]") {
  wire::RequestParser parser(1024);
  Bytes header;
  std::string expected;
  SECTION("bad magic") {
    header = raw_header(0x20544547u /* "GET " */, 2, 0, 0);
    expected = "magic";
  }
  SECTION("unknown op") {
    header = raw_header(wire::kMagic, 9, 0, 0);
    expected = "op";
  }
  SECTION("op zero") {
    header = raw_header(wire::kMagic, 0, 0, 0);
    expected = "op";
  }
  SECTION("oversized key") {
    header = raw_header(wire::kMagic, 2, ringfence::kMaxStoreKeyBytes + 1, 0);
    expected = "key";
  }
  SECTION("oversized value") {
    // 4 GiB - 1: a parser that sized its buffer from the header would throw bad_alloc or
    // take gigabytes here; this one must say Malformed after the 12 header bytes.
    header = raw_header(wire::kMagic, 2, 1, 0xffffffffu);
    expected = "value";
  }
  SECTION("value one byte over the limit") {
    header = raw_header(wire::kMagic, 2, 0, 1025);
    expected = "value";
  }
  Bytes stream = header;
  stream.resize(stream.size() + 64, std::byte{'x'});
  std::span<const std::byte> in(stream);
  REQUIRE(parser.feed(in) == wire::ParseResult::Malformed);
  CHECK(in.size() == 64);  // nothing consumed past the header
  CHECK_THAT(std::string(parser.error()), Catch::Contains(expected));
  // The failure is sticky: the stream cannot be resynchronised.
  const Bytes good = wire::encode_request(wire::Op::Get, "k", {});
  std::span<const std::byte> next(good);
  CHECK(parser.feed(next) == wire::ParseResult::Malformed);
}

TEST_CASE("RequestParser accepts a value exactly at the limit", "[store]") {
  wire::RequestParser parser(16);
  const Bytes frame = wire::encode_request(wire::Op::Set, "k", Bytes(16, std::byte{7}));
  std::span<const std::byte> in(frame);
  REQUIRE(parser.feed(in) == wire::ParseResult::Frame);
  CHECK(parser.value().size() == 16);
}

TEST_CASE("encode_request rejects keys over the limit", "[store]") {
  CHECK_THROWS_AS(wire::encode_request(wire::Op::Get, std::string(ringfence::kMaxStoreKeyBytes + 1, 'k'), {}),
                  ringfence::InvalidUsage);
  CHECK(wire::encode_request(wire::Op::Get, std::string(ringfence::kMaxStoreKeyBytes, 'k'), {}).size() ==
        sizeof(wire::RequestHeader) + ringfence::kMaxStoreKeyBytes);
}

// ---------------------------------------------------------------------------------------------
// TCP store
// ---------------------------------------------------------------------------------------------

TEST_CASE("TcpStore set, get and add round trip", "[store]") {
  const auto token = make_token(1);
  ringfence::TcpStoreServer server(token, "127.0.0.1", 0);
  REQUIRE(server.port() != 0);
  ringfence::TcpStoreClient a("127.0.0.1", server.port(), token, 1000ms);
  ringfence::TcpStoreClient b("localhost", server.port(), token, 1000ms);
  a.set("addr/0", to_bytes("hello"));
  CHECK(to_string(b.get("addr/0", 100ms)) == "hello");
  b.set("addr/0", to_bytes(""));
  CHECK(a.get("addr/0", 100ms).empty());
  CHECK(a.add("counter", 3) == 3);
  CHECK(b.add("counter", 4) == 7);
  CHECK(a.add("counter", -10) == -3);
  const Bytes big(100000, std::byte{0x5a});
  a.set("big", big);
  CHECK(b.get("big", 100ms) == big);
  // Add on a non-counter is refused, but the connection stays usable.
  CHECK_THROWS_AS(a.add("addr/0", 1), ringfence::InvalidUsage);
  CHECK(a.add("counter", 1) == -2);
  CHECK(server.refused() == 0);
}

TEST_CASE("TcpStoreClient get waits for a value set later by another client", "[store]") {
  const auto token = make_token(2);
  ringfence::TcpStoreServer server(token, "127.0.0.1", 0);
  ringfence::TcpStoreClient waiter("127.0.0.1", server.port(), token, 1000ms);
  std::thread setter([&] {
    ringfence::TcpStoreClient c("127.0.0.1", server.port(), token, 1000ms);
    std::this_thread::sleep_for(80ms);
    c.set("late", to_bytes("value"));
  });
  const auto start = Clock::now();
  Bytes got = waiter.get("late", 2000ms);
  setter.join();
  CHECK(to_string(got) == "value");
  CHECK(elapsed_ms(start) >= 70);
  CHECK(elapsed_ms(start) < 1000);
}

TEST_CASE("TcpStoreClient get times out naming the key", "[store]") {
  const auto token = make_token(3);
  ringfence::TcpStoreServer server(token, "127.0.0.1", 0);
  ringfence::TcpStoreClient c("127.0.0.1", server.port(), token, 1000ms);
  const auto start = Clock::now();
  try {
    c.get("missing/key", 100ms);
    FAIL("get returned a key that was never set");
  } catch (const ringfence::TimeoutError& e) {
    CHECK_THAT(e.what(), Catch::Contains("missing/key") && Catch::Contains("100 ms"));
  }
  CHECK(elapsed_ms(start) >= 95);
  CHECK(elapsed_ms(start) < 600);
  // The connection is still good after a timed-out wait.
  c.set("missing/key", to_bytes("now"));
  CHECK(to_string(c.get("missing/key", 0ms)) == "now");
}

TEST_CASE("TcpStoreClient with the wrong token is refused", "[store]") {
  const auto token = make_token(4);
  ringfence::TcpStoreServer server(token, "127.0.0.1", 0);
  CHECK(server.refused() == 0);
  try {
    ringfence::TcpStoreClient bad("127.0.0.1", server.port(), make_token(5), 1000ms);
    FAIL("a client with the wrong token was accepted");
  } catch (const ringfence::InvalidUsage& e) {
    CHECK_THAT(e.what(), Catch::Contains("refused the job token") &&
                             Catch::Contains("127.0.0.1:" + std::to_string(server.port())));
  }
  CHECK(server.refused() == 1);
  // A raw connection whose first frame is not a hello is denied too.
  int fd = connect_raw(server.port());
  send_raw(fd, wire::encode_request(wire::Op::Set, "k", to_bytes("v")));
  CHECK(read_response(fd).reply == static_cast<std::uint8_t>(wire::Reply::Denied));
  bool closed = false;
  read_until_closed(fd, closed);
  CHECK(closed);
  ::close(fd);
  CHECK(eventually([&] { return server.refused() == 2; }));
  // The right token still works.
  ringfence::TcpStoreClient good("127.0.0.1", server.port(), token, 1000ms);
  good.set("k", to_bytes("v"));
  CHECK(to_string(good.get("k", 0ms)) == "v");
}
