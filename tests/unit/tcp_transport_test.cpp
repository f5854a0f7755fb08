// The tcp transport against the SPI contract over loopback: connection set-up with its secret,
// striped writes and signals ordered after them, waiting, a peer that leaves, malformed frames
// (fenced, nothing written), strangers refused; and the interface filter.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <numeric>
#include <ringfence/error.hpp>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/transports/tcp.hpp>
#include <thread>
#include <vector>

#include "support/catch.hpp"

using namespace ringfence;
using namespace ringfence::transports;

namespace {

CommOptions loopback_options(int sockets) {
  CommOptions o;
  o.tcp.interfaces = "lo";
  o.tcp.sockets = sockets;
  o.tcp.stripe_min_bytes = 4096;
  o.timeout = std::chrono::seconds(5);
  o.shm.spin_count = 10;
  return o;
}

// Two tcp transports in one process (ranks 0 and 1), connected: a.link writes into b's memory.
struct Pair {
  CommOptions options;
  Logger log;
  std::unique_ptr<Transport> a, b;
  std::unique_ptr<Link> a_to_b, b_to_a;
  explicit Pair(int sockets = 2) : options(loopback_options(sockets)) {
    const PeerInfo pa{0, "ha", 1}, pb{1, "hb", 2};
    a = tcp::make_transport(TransportContext{pa, 2, &options, &log});
    b = tcp::make_transport(TransportContext{pb, 2, &options, &log});
    auto la = a->listen(), lb = b->listen();
    auto pa_pending = a->connect(*la, pb, lb->address());
    auto pb_pending = b->connect(*lb, pa, la->address());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!a_to_b || !b_to_a) {
      if (!a_to_b) {
        const Status s = pa_pending->try_finish(a_to_b);
        REQUIRE((s.is_ok() || s.in_progress()));
      }
      if (!b_to_a) {
        const Status s = pb_pending->try_finish(b_to_a);
        REQUIRE((s.is_ok() || s.in_progress()));
      }
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
};

Status wait_for(Link& link, SignalFlag& flag, std::uint32_t target) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    const Status s = link.wait(flag, target, std::chrono::milliseconds(20));
    if (!s.in_progress()) return s;
    if (std::chrono::steady_clock::now() > deadline) return Status(ErrorCode::Timeout);
  }
}

}  // namespace

TEST_CASE("tcp: interface filters follow NCCL_SOCKET_IFNAME", "[tcp]") {
  const std::vector<tcp::Interface> host = {{"lo", "127.0.0.1", true}, {"docker0", "172.17.0.1", false}, {"eth0", "10.0.0.5", false},
                                            {"eth1", "10.1.0.5", false}};
  REQUIRE(tcp::choose_interface(host, tcp::parse_interface_filter(""))->name == "docker0");  // first non-loopback
  REQUIRE(tcp::choose_interface(host, tcp::parse_interface_filter("eth"))->name == "eth0");
  REQUIRE(tcp::choose_interface(host, tcp::parse_interface_filter("^docker,lo"))->name == "eth0");
  REQUIRE(tcp::choose_interface(host, tcp::parse_interface_filter("=eth1"))->name == "eth1");
  REQUIRE_FALSE(tcp::choose_interface(host, tcp::parse_interface_filter("=eth")));  // exact: no match
  REQUIRE(tcp::choose_interface({{"lo", "127.0.0.1", true}}, tcp::parse_interface_filter(""))->name == "lo");
  REQUIRE_FALSE(tcp::choose_interface(host, tcp::parse_interface_filter("ib")));
  REQUIRE_THROWS_AS(tcp::parse_interface_filter("eth,,ib"), InvalidUsage);
  CommOptions o = loopback_options(1);
  o.tcp.interfaces = "no-such-interface";
  Logger log;
  auto t = tcp::make_transport(TransportContext{PeerInfo{0, "h", 1}, 2, &o, &log});
  REQUIRE_THROWS_WITH(t->listen(), Catch::Contains("RINGFENCE_SOCKET_IFNAME='no-such-interface'"));
}

TEST_CASE("tcp: striped writes land at their offsets and the signal comes after them", "[tcp][conformance]") {
  const int sockets = GENERATE(1, 2, 3);
  Pair p(sockets);
  std::vector<std::byte> mem(1 << 20);
  SignalFlag flag;
  auto data_region = p.b->register_memory(mem.data(), mem.size(), MemoryKind::Host);
  auto flag_region = p.b->register_memory(&flag, sizeof flag, MemoryKind::Host);
  const RemoteRegion dst = p.a->import_region(data_region.key());
  const RemoteRegion fdst = p.a->import_region(flag_region.key());
  std::vector<std::uint32_t> src(200000);
  std::iota(src.begin(), src.end(), 1u);
  for (std::uint32_t round = 1; round <= 20; ++round) {
    const std::size_t bytes = (round % 4 == 0 ? src.size() : 1000 * round) * sizeof(std::uint32_t);
    src[0] = round;
    REQUIRE(p.a_to_b->write(WriteOp{src.data(), nullptr, &dst, 64, bytes, round}).is_ok());
    REQUIRE(p.a_to_b->signal(SignalOp{&fdst, 0, round, 100 + round}).is_ok());
    REQUIRE(wait_for(*p.b_to_a, flag, round).is_ok());
    // The signal is visible only after the whole write (all its stripes) landed.
    REQUIRE(std::memcmp(mem.data() + 64, src.data(), bytes) == 0);
    Completion done[4];
    std::size_t n = 0;
    REQUIRE(p.a_to_b->poll(done, n).is_ok());
    REQUIRE(n == 2);
    REQUIRE(done[0].wr_id == round);
    REQUIRE(done[1].wr_id == 100 + round);
  }
  REQUIRE(p.a_to_b->stats().bytes_written > 0);
  // Out of bounds of the imported region: refused locally, nothing sent.
  REQUIRE(p.a_to_b->write(WriteOp{src.data(), nullptr, &dst, mem.size() - 4, 8, 1}).code() == ErrorCode::InvalidUsage);
}

TEST_CASE("tcp: a peer that leaves: writes to it complete without effect, waits on it fail", "[tcp][conformance]") {
  Pair p(2);
  SignalFlag flag;
  auto flag_region = p.a->register_memory(&flag, sizeof flag, MemoryKind::Host);
  const RemoteRegion fdst = p.b->import_region(flag_region.key());
  p.b_to_a.reset();  // rank 1 closes its end
  const Status s = wait_for(*p.a_to_b, flag, 1);
  REQUIRE(s.code() == ErrorCode::PeerUnreachable);
  SignalFlag remote_flag;
  auto rf = p.b->register_memory(&remote_flag, sizeof remote_flag, MemoryKind::Host);
  const RemoteRegion dst = p.a->import_region(rf.key());
  REQUIRE(p.a_to_b->signal(SignalOp{&dst, 0, 7, 1}).is_ok());  // dropped: the peer left
}

TEST_CASE("tcp: a malformed frame fences the link and writes nothing; strangers are refused", "[tcp][hostile]") {
  CommOptions o = loopback_options(1);
  Logger log;
  auto t = tcp::make_transport(TransportContext{PeerInfo{1, "h", 2}, 2, &o, &log});
  auto listen = t->listen();
  const Bytes address = listen->address();
  // The address is "ip:port\0secret[16]".
  const std::string text(reinterpret_cast<const char*>(address.data()));
  const auto colon = text.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<std::uint16_t>(std::stoi(text.substr(colon + 1))));
  ::inet_pton(AF_INET, text.substr(0, colon).c_str(), &sa.sin_addr);
  auto dial = [&] {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
    return fd;
  };
  // The hello layout: magic, from, to, socket, sockets, header bytes, secret.
  struct Hello {
    std::uint32_t magic = 0x48544652;
    std::int32_t from = 0, to = 1, socket = 0, sockets = 1;
    std::uint32_t header_bytes = 32;
    std::uint8_t secret[16] = {};
  } hello;
  std::memcpy(hello.secret, address.data() + text.size() + 1, 16);

  // A stranger with a wrong secret is refused: no link appears.
  {
    Hello bad = hello;
    bad.secret[3] ^= 1;
    const int fd = dial();
    REQUIRE(::send(fd, &bad, sizeof bad, 0) == static_cast<ssize_t>(sizeof bad));
    auto pending = t->connect(*listen, PeerInfo{0, "h", 1}, address);
    std::unique_ptr<Link> link;
    for (int i = 0; i < 50; ++i) {
      REQUIRE(pending->try_finish(link).in_progress());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    char c;
    REQUIRE(::recv(fd, &c, 1, 0) <= 0);  // closed on us
    ::close(fd);
  }
  // The real peer (the test, as rank 0) connects; then sends a write past its region's end.
  const int fd = dial();
  REQUIRE(::send(fd, &hello, sizeof hello, 0) == static_cast<ssize_t>(sizeof hello));
  auto pending = t->connect(*listen, PeerInfo{0, "h", 1}, address);
  std::unique_ptr<Link> link;
  for (int i = 0; i < 500 && !link; ++i) {
    const Status s = pending->try_finish(link);
    REQUIRE((s.is_ok() || s.in_progress()));
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  REQUIRE(link);
  std::vector<std::byte> mem(64, std::byte{0x5a});
  SignalFlag flag;
  auto region = t->register_memory(mem.data(), mem.size(), MemoryKind::Host);
  auto flag_region = t->register_memory(&flag, sizeof flag, MemoryKind::Host);
  struct Header {
    std::uint32_t magic = 0x31544652;
    std::uint8_t type = 1, socket = 0;
    std::uint16_t pad = 0;
    std::uint32_t region = 0, value = 0;
    std::uint64_t offset = 0, length = 0;
  } h;
  std::uint32_t key_id = 0;
  std::memcpy(&key_id, region.key().data() + 4, 4);
  h.region = key_id;
  h.offset = 60;
  h.length = 100;  // 60 + 100 > 64
  std::vector<std::byte> frame(sizeof h + 100, std::byte{0x11});
  std::memcpy(frame.data(), &h, sizeof h);
  REQUIRE(::send(fd, frame.data(), frame.size(), 0) == static_cast<ssize_t>(frame.size()));
  const Status s = wait_for(*link, flag, 1);
  REQUIRE(s.code() == ErrorCode::Fenced);
  for (std::byte b : mem) REQUIRE(b == std::byte{0x5a});
  ::close(fd);
}
