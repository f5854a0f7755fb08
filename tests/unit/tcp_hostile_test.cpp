// The tcp transport against hostile peers over loopback, spoken to over raw sockets:
// connections without the job's secret refused and logged with their address, malformed and
// truncated frames fencing the link with a clear error and writing nothing.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <ringfence/error.hpp>
#include <ringfence/fault.hpp>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/transports/tcp.hpp>
#include <thread>
#include <vector>

#include "support/captured_log.hpp"
#include "support/catch.hpp"
#include "support/tcp_pair.hpp"

using namespace ringfence;
using namespace ringfence::transports;
using namespace tcp_test;

namespace {

// Rank 1's transport listening, and the test playing rank 0 (or a stranger) over raw sockets:
// the hello and frame layouts are spelled out here on purpose, so a change to the wire format
// shows up in this test.
struct RawPeer {
  CommOptions options = loopback_options(1);
  test::CapturedLog log{LogLevel::Info, 1};
  std::unique_ptr<Transport> t;
  std::unique_ptr<ListenHandle> listen;
  Bytes address;
  sockaddr_in sa{};
  // The hello layout: magic, from, to, socket, sockets, header bytes, secret.
  struct Hello {
    std::uint32_t magic = 0x48544652;
    std::int32_t from = 0, to = 1, socket = 0, sockets = 1;
    std::uint32_t header_bytes = 32;
    std::uint8_t secret[16] = {};
  } hello;
  struct Header {
    std::uint32_t magic = 0x31544652;
    std::uint8_t type = 1, socket = 0;
    std::uint16_t pad = 0;
    std::uint32_t region = 0, value = 0;
    std::uint64_t offset = 0, length = 0;
  };

  RawPeer() {
    t = tcp::make_transport(TransportContext{PeerInfo{1, "h", 2}, 2, &options, log.get()});
    listen = t->listen();
    address = listen->address();
    // The address is "ip:port\0secret[16]".
    const std::string text(reinterpret_cast<const char*>(address.data()));
    const auto colon = text.rfind(':');
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<std::uint16_t>(std::stoi(text.substr(colon + 1))));
    ::inet_pton(AF_INET, text.substr(0, colon).c_str(), &sa.sin_addr);
    std::memcpy(hello.secret, address.data() + text.size() + 1, 16);
  }
  int dial() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0);
    return fd;
  }
  // "ip:port" of our end of `fd`, as the transport sees the remote address.
  static std::string local_address(int fd) {
    sockaddr_in me{};
    socklen_t len = sizeof me;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0);
    char ip[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &me.sin_addr, ip, sizeof ip);
    return std::string(ip) + ":" + std::to_string(ntohs(me.sin_port));
  }
  static void send_bytes(int fd, const void* data, std::size_t n) {
    REQUIRE(::send(fd, data, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n));
  }
  // Our side as rank 0, with the right secret: the link rank 1 gets.
  std::unique_ptr<Link> connect_as_rank0(int fd) {
    send_bytes(fd, &hello, sizeof hello);
    auto pending = t->connect(*listen, PeerInfo{0, "h", 1}, address);
    std::unique_ptr<Link> link;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!link) {
      const Status s = pending->try_finish(link);
      REQUIRE((s.is_ok() || s.in_progress()));
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return link;
  }
  // Rank 0's link stays pending for a while: the connection on `fd` was not taken.
  void require_no_link() {
    auto pending = t->connect(*listen, PeerInfo{0, "h", 1}, address);
    std::unique_ptr<Link> link;
    for (int i = 0; i < 50; ++i) {
      REQUIRE(pending->try_finish(link).in_progress());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    REQUIRE_FALSE(link);
  }
  static bool closed_on_us(int fd) {
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char c;
    return ::recv(fd, &c, 1, 0) == 0;
  }
};

// Rank 0 connected over raw sockets, with 64 bytes (0x5a) and a flag registered at rank 1, and a
// frame header aimed at those 64 bytes: what the frame tests below damage.
struct FramedTarget {
  RawPeer p;
  int fd = p.dial();
  std::unique_ptr<Link> link = p.connect_as_rank0(fd);
  std::vector<std::byte> mem = std::vector<std::byte>(64, std::byte{0x5a});
  SignalFlag flag;
  MemoryRegion region = p.t->register_memory(mem.data(), mem.size(), MemoryKind::Host);
  MemoryRegion flag_region = p.t->register_memory(&flag, sizeof flag, MemoryKind::Host);
  RawPeer::Header h = [this] {
    RawPeer::Header header;
    std::memcpy(&header.region, region.key().data() + 4, 4);
    return header;
  }();
  ~FramedTarget() { ::close(fd); }
};

}  // namespace

TEST_CASE("tcp: connections without the job's secret are refused and logged with their address", "[tcp][hostile]") {
  RawPeer p;
  SECTION("wrong secret") {
    RawPeer::Hello bad = p.hello;
    bad.secret[3] ^= 1;
    const int fd = p.dial();
    const std::string from = RawPeer::local_address(fd);
    RawPeer::send_bytes(fd, &bad, sizeof bad);
    p.require_no_link();
    REQUIRE(RawPeer::closed_on_us(fd));
    ::close(fd);
    REQUIRE(p.log.has_line(std::chrono::seconds(0), "refused a connection from " + from + " to rank 1:", "wrong secret"));
  }
  SECTION("no secret: the connection ends before its hello") {
    const int fd = p.dial();
    const std::string from = RawPeer::local_address(fd);
    RawPeer::send_bytes(fd, &p.hello, 12);  // the start of a hello, without the secret
    ::shutdown(fd, SHUT_WR);
    p.require_no_link();
    REQUIRE(RawPeer::closed_on_us(fd));
    ::close(fd);
    REQUIRE(p.log.has_line(std::chrono::seconds(0), "refused a connection from " + from + " to rank 1:", "no secret"));
  }
  // The right secret still gets through, and is not logged as refused.
  const int fd = p.dial();
  const std::string from = RawPeer::local_address(fd);
  REQUIRE(p.connect_as_rank0(fd));
  REQUIRE_FALSE(p.log.has_line(std::chrono::seconds(0), "refused a connection from " + from + " "));
  ::close(fd);
}

TEST_CASE("tcp: a malformed frame fences the link with a clear error and writes nothing", "[tcp][hostile]") {
  FramedTarget t;
  auto& [p, fd, link, mem, flag, region, flag_region, h] = t;
  std::string why;
  SECTION("past the region's end") {
    h.offset = 60;
    h.length = 100;  // 60 + 100 > 64
    why = "a write outside its region";
  }
  SECTION("an oversize length") {
    h.offset = 0;
    h.length = std::uint64_t{1} << 62;
    why = "a write outside its region";
  }
  SECTION("offset + length wraps around") {
    h.offset = 8;
    h.length = ~std::uint64_t{0} - 4;
    why = "a write outside its region";
  }
  SECTION("an unknown region") {
    h.region = 977;
    h.length = 8;
    why = "a write into an unknown region";
  }
  SECTION("bad magic") {
    h.magic = 0x12345678;
    h.length = 8;
    why = "a frame with a bad header";
  }
  std::vector<std::byte> frame(sizeof h + 100, std::byte{0x11});
  std::memcpy(frame.data(), &h, sizeof h);
  RawPeer::send_bytes(fd, frame.data(), frame.size());
  const Status s = wait_for(*link, flag, 1);
  REQUIRE(s.code() == ErrorCode::Fenced);
  for (std::byte b : mem) REQUIRE(b == std::byte{0x5a});
  REQUIRE(p.log.has_line(std::chrono::seconds(0), "rank 0 sent " + why, "link fenced"));
  // The link stays broken: writes on it fail rather than pretend.
  REQUIRE(link->write(WriteOp{mem.data(), nullptr, nullptr, 0, 0, 1}).code() == ErrorCode::Fenced);
}

TEST_CASE("tcp: a truncated frame fences the link with a clear error", "[tcp][hostile]") {
  FramedTarget t;
  auto& [p, fd, link, mem, flag, region, flag_region, h] = t;
  h.length = 48;
  std::vector<std::byte> frame(sizeof h + 48, std::byte{0x11});
  std::memcpy(frame.data(), &h, sizeof h);
  std::size_t cut = 0, missing = 0;
  SECTION("inside the header") { cut = 20, missing = 12; }
  SECTION("inside the payload") { cut = sizeof h + 10, missing = 38; }
  RawPeer::send_bytes(fd, frame.data(), cut);
  ::shutdown(fd, SHUT_WR);  // the stream ends mid-frame
  const Status s = wait_for(*link, flag, 1);
  REQUIRE(s.code() == ErrorCode::Fenced);  // not a peer that left in order
  REQUIRE(p.log.has_line(std::chrono::seconds(0), "the connection from rank 0 ended inside a frame",
                         "(" + std::to_string(missing) + " bytes of it missing: a truncated frame"));
}
