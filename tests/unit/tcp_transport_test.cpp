// The tcp transport against the SPI contract over loopback: striped writes and signals ordered
// after them, small writes batched, waiting (a kept link, links served while one waits), a peer
// that leaves, the spin setting; and the interface filter. Hostile peers (strangers, malformed
// and truncated frames) are in tcp_hostile_test.cpp.
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
  o.transport_settings["RINGFENCE_SOCKET_IFNAME"] = "no-such-interface";
  Logger log;
  auto t = tcp::make_transport(TransportContext{PeerInfo{0, "h", 1}, 2, &o, &log});
  REQUIRE_THROWS_WITH(t->listen(), Catch::Contains("RINGFENCE_SOCKET_IFNAME='no-such-interface'"));
}

TEST_CASE("tcp: striped writes land at their offsets and the signal comes after them", "[tcp][conformance]") {
  const int sockets = GENERATE(1, 2, 3);
  Pair p(sockets);
  Target t(p, 1 << 20);
  auto& [mem, flag, data_region, flag_region, dst, fdst] = t;
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

TEST_CASE("tcp: injected bit flips all arrive, though striped writes land in any order", "[tcp][fault]") {
  // The fault decorator corrupts a write by sending it in pieces around each flipped byte. Sent
  // as the intact write plus a one-byte write of the flipped byte, the flip would travel on
  // socket 0 while the stripes travel on others, and could land first and be overwritten. One
  // socket keeps every frame in order: with the same rules (same seed, same ranks, so the same
  // flips) the striped link must deliver exactly the bytes the one-socket link delivers.
  const char* spec = "flip:rate=2e-4,seed=5";
  const int sockets = GENERATE(2, 3);
  Pair ordered(1, spec), p(sockets, spec);
  Target want(ordered, 1 << 16), t(p, 1 << 16);
  std::vector<std::byte> src(t.mem.size());
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 13 + 5);
  std::size_t flipped = 0;
  for (std::uint32_t round = 1; round <= 20; ++round) {
    INFO("round " << round);
    for (auto [pair, target] : {std::pair{&ordered, &want}, std::pair{&p, &t}}) {
      std::fill(target->mem.begin(), target->mem.end(), std::byte{0});
      REQUIRE(pair->a_to_b->write(WriteOp{src.data(), nullptr, &target->dst, 0, src.size(), round}).is_ok());
      REQUIRE(pair->a_to_b->signal(SignalOp{&target->fdst, 0, round, 100 + round}).is_ok());
      REQUIRE(wait_for(*pair->b_to_a, target->flag, round).is_ok());
      // One completion for the write (its pieces' are internal), one for the signal.
      Completion done[8];
      std::size_t n = 0;
      REQUIRE(pair->a_to_b->poll(done, n).is_ok());
      REQUIRE(n == 2);
      REQUIRE(done[0].wr_id == round);
      REQUIRE(done[1].wr_id == 100 + round);
    }
    // About 13 flips per 64 KiB write, one bit each, every one of them delivered.
    std::size_t differ = 0, multi_bit = 0, not_as_ordered = 0;
    for (std::size_t i = 0; i < src.size(); ++i) {
      const auto x = static_cast<unsigned>(want.mem[i] ^ src[i]);
      multi_bit += (x & (x - 1)) != 0;
      differ += x != 0;
      not_as_ordered += t.mem[i] != want.mem[i];
    }
    REQUIRE(multi_bit == 0);
    REQUIRE(differ > 0);
    REQUIRE(not_as_ordered == 0);
    flipped += differ;
  }
  REQUIRE(flipped > 100);  // 20 x 65536 bytes at 2e-4: about 262
}

TEST_CASE("tcp: small writes leave with the next frame, several per read, and poll, fence and close send them too",
          "[tcp][conformance]") {
  const int sockets = GENERATE(1, 2, 3);
  Pair p(sockets);
  Target t(p, 1 << 16);
  auto& [mem, flag, data_region, flag_region, dst, fdst] = t;
  std::vector<std::byte> src(mem.size());
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 7 + 3);
  // Sizes around the send buffer's limit (1 KiB) and the receive bounce buffer (4 KiB), back to
  // back before one signal: small frames share reads, large payload rests are read in place.
  const std::size_t sizes[] = {0, 1, 31, 1024, 1025, 4095, 4096, 4097, 8, 1000, 1000, 1000, 1000, 1000, 12000};
  std::uint64_t id = 0;
  std::size_t at = 0;
  for (std::size_t bytes : sizes) {
    REQUIRE(p.a_to_b->write(WriteOp{src.data() + at, nullptr, &dst, at, bytes, ++id}).is_ok());
    at += bytes;
  }
  REQUIRE(p.a_to_b->signal(SignalOp{&fdst, 0, 1, ++id}).is_ok());
  REQUIRE(wait_for(*p.b_to_a, flag, 1).is_ok());
  REQUIRE(std::memcmp(mem.data(), src.data(), at) == 0);
  // Every write completed (in order) as it was accepted, the signal after them.
  Completion done[32];
  std::size_t n = 0;
  REQUIRE(p.a_to_b->poll(done, n).is_ok());
  REQUIRE(n == id);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(done[i].wr_id == i + 1);

  // Without a signal after them, small writes still arrive: poll() sends them, and so do a
  // health fence and closing the link. The receiver reads its sockets inside wait() (which
  // orders its view of the memory after the progress thread's), until the bytes are there.
  auto arrives = [&](std::size_t offset, std::size_t bytes) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < deadline) {
      (void)p.b_to_a->wait(flag, 1000, std::chrono::milliseconds(5));
      if (std::memcmp(mem.data() + offset, src.data() + offset, bytes) == 0) return true;
    }
    return false;
  };
  std::fill(src.begin(), src.end(), std::byte{0x5a});
  REQUIRE(p.a_to_b->write(WriteOp{src.data(), nullptr, &dst, 0, 100, ++id}).is_ok());
  REQUIRE(p.a_to_b->poll(done, n).is_ok());
  REQUIRE(arrives(0, 100));
  REQUIRE(p.a_to_b->write(WriteOp{src.data() + 100, nullptr, &dst, 100, 100, ++id}).is_ok());
  p.a_to_b->fence(FenceReason::HealthPolicy);
  REQUIRE(arrives(100, 100));
  p.a_to_b->reopen();
  REQUIRE(p.a_to_b->write(WriteOp{src.data() + 200, nullptr, &dst, 200, 100, ++id}).is_ok());
  p.a_to_b.reset();
  REQUIRE(arrives(200, 100));
}

TEST_CASE("tcp: while a thread waits on one link (reading it itself), other links are still served", "[tcp][conformance]") {
  // Three ranks in one process, fully connected. Rank 1 waits on its link to rank 0 (nothing
  // comes); meanwhile rank 2 writes more than the socket buffers hold into rank 1 and signals:
  // the write must complete and the signal land without rank 1 waiting on that link.
  CommOptions options = loopback_options(2);
  options.transport_settings["RINGFENCE_TCP_BUFFER_BYTES"] = "256K";
  Logger log;
  std::unique_ptr<Transport> t[3];
  std::unique_ptr<ListenHandle> l[3];
  std::unique_ptr<Link> link[3][3];
  const PeerInfo peer[3] = {{0, "h", 1}, {1, "h", 2}, {2, "h", 3}};
  for (int r = 0; r < 3; ++r) {
    t[r] = tcp::make_transport(TransportContext{peer[r], 3, &options, &log});
    l[r] = t[r]->listen();
  }
  for (int i = 0; i < 3; ++i)
    for (int j = i + 1; j < 3; ++j) {
      auto pi = t[i]->connect(*l[i], peer[j], l[j]->address());
      auto pj = t[j]->connect(*l[j], peer[i], l[i]->address());
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!link[i][j] || !link[j][i]) {
        for (auto [pending, out] : {std::pair{pi.get(), &link[i][j]}, std::pair{pj.get(), &link[j][i]}})
          if (!*out) {
            const Status st = pending->try_finish(*out);
            REQUIRE((st.is_ok() || st.in_progress()));
          }
        REQUIRE(std::chrono::steady_clock::now() < deadline);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  std::vector<std::byte> mem(8 << 20);
  SignalFlag from0, from2;
  auto mem_region = t[1]->register_memory(mem.data(), mem.size(), MemoryKind::Host);
  auto flag_region = t[1]->register_memory(&from2, sizeof from2, MemoryKind::Host);
  auto unused_region = t[1]->register_memory(&from0, sizeof from0, MemoryKind::Host);
  const RemoteRegion dst = t[2]->import_region(mem_region.key());
  const RemoteRegion fdst = t[2]->import_region(flag_region.key());
  std::vector<std::byte> src(mem.size());
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 31 + 7);
  std::atomic<bool> sent{false};
  Status send_status;
  std::thread rank2([&] {
    send_status = link[2][1]->write(WriteOp{src.data(), nullptr, &dst, 0, src.size(), 1});
    if (send_status.is_ok()) send_status = link[2][1]->signal(SignalOp{&fdst, 0, 1, 2});
    sent = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!reached(from2.value.load(std::memory_order_acquire), 1) && std::chrono::steady_clock::now() < deadline)
    REQUIRE(link[1][0]->wait(from0, 1, std::chrono::milliseconds(5)).in_progress());
  rank2.join();
  REQUIRE(sent);
  REQUIRE(send_status.is_ok());
  REQUIRE(reached(from2.value.load(std::memory_order_acquire), 1));
  REQUIRE(std::memcmp(mem.data(), src.data(), mem.size()) == 0);
}

TEST_CASE("tcp: a link a wait kept is read again once nobody waits on it", "[tcp][conformance]") {
  // After a wait, the waiting thread keeps the link's sockets (so that its next wait reads the
  // next frames itself); when no wait comes, the progress thread must take them back and place
  // what arrives: here b only watches its memory and flag, as a peer polling a flag would.
  Pair p(2);
  Target t(p, 4096);
  REQUIRE(p.a_to_b->signal(SignalOp{&t.fdst, 0, 1, 1}).is_ok());
  REQUIRE(wait_for(*p.b_to_a, t.flag, 1).is_ok());  // b's side of the link is now kept
  std::vector<std::byte> src(t.mem.size());
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 13 + 5);
  REQUIRE(p.a_to_b->write(WriteOp{src.data(), nullptr, &t.dst, 0, src.size(), 2}).is_ok());
  REQUIRE(p.a_to_b->signal(SignalOp{&t.fdst, 0, 2, 3}).is_ok());
  Completion c[4];
  std::size_t n = 0;
  REQUIRE(p.a_to_b->poll(c, n).is_ok());  // sends what waits in a's send buffer
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!reached(t.flag.value.load(std::memory_order_acquire), 2) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(reached(t.flag.value.load(std::memory_order_acquire), 2));
  REQUIRE(std::memcmp(t.mem.data(), src.data(), src.size()) == 0);
}

TEST_CASE("tcp: a transport stops at once right after a wait kept one of its links", "[tcp][conformance]") {
  // Keeping a link wakes the progress thread through the same counter stop() writes; a wake-up
  // read while stop() writes must not be lost (the thread would sleep forever and the
  // destructor hang: ctest's timeout is this case's failure).
  for (int round = 0; round < 100; ++round) {
    Pair p(1);
    Target t(p, 64);
    REQUIRE(p.a_to_b->signal(SignalOp{&t.fdst, 0, 1, 1}).is_ok());
    REQUIRE(wait_for(*p.b_to_a, t.flag, 1).is_ok());  // b keeps the link, and wakes its progress thread
  }
}

TEST_CASE("tcp: two kept links whose ends both send more than the socket buffers hold do not block each other",
          "[tcp][conformance]") {
  // Each side waited once (so it keeps its sockets), then both write 8 MiB to each other at
  // once through 256 KiB socket buffers: each side's progress thread must take its kept sockets
  // back and read while its owner waits for room, or both wait until the timeout.
  Pair p(2, {}, 256 * 1024);
  Target at_b(p, 8 << 20);
  // The same towards a: a's memory and flag, imported by b.
  std::vector<std::byte> a_mem(8 << 20);
  SignalFlag a_flag;
  auto a_region = p.a->register_memory(a_mem.data(), a_mem.size(), MemoryKind::Host);
  auto a_flag_region = p.a->register_memory(&a_flag, sizeof a_flag, MemoryKind::Host);
  const RemoteRegion to_a = p.b->import_region(a_region.key()), to_a_flag = p.b->import_region(a_flag_region.key());
  REQUIRE(p.a_to_b->signal(SignalOp{&at_b.fdst, 0, 1, 1}).is_ok());
  REQUIRE(p.b_to_a->signal(SignalOp{&to_a_flag, 0, 1, 1}).is_ok());
  REQUIRE(wait_for(*p.b_to_a, at_b.flag, 1).is_ok());
  REQUIRE(wait_for(*p.a_to_b, a_flag, 1).is_ok());
  std::vector<std::byte> from_a(8 << 20), from_b(8 << 20);
  for (std::size_t i = 0; i < from_a.size(); ++i) {
    from_a[i] = static_cast<std::byte>(i * 7 + 1);
    from_b[i] = static_cast<std::byte>(i * 11 + 3);
  }
  Status sa, sb;
  std::thread b_sends([&] {
    sb = p.b_to_a->write(WriteOp{from_b.data(), nullptr, &to_a, 0, from_b.size(), 2});
    if (sb.is_ok()) sb = p.b_to_a->signal(SignalOp{&to_a_flag, 0, 2, 3});
    if (sb.is_ok()) sb = wait_for(*p.b_to_a, at_b.flag, 2);
  });
  sa = p.a_to_b->write(WriteOp{from_a.data(), nullptr, &at_b.dst, 0, from_a.size(), 2});
  if (sa.is_ok()) sa = p.a_to_b->signal(SignalOp{&at_b.fdst, 0, 2, 3});
  if (sa.is_ok()) sa = wait_for(*p.a_to_b, a_flag, 2);
  b_sends.join();
  REQUIRE(sa.is_ok());
  REQUIRE(sb.is_ok());
  REQUIRE(std::memcmp(at_b.mem.data(), from_a.data(), from_a.size()) == 0);
  REQUIRE(std::memcmp(a_mem.data(), from_b.data(), from_b.size()) == 0);
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

TEST_CASE("tcp: RINGFENCE_TCP_SPIN_US is parsed and checked, and a spinning wait sees signals and still ends at its bound",
          "[tcp][spin]") {
  CHECK(tcp::Options::from(nullptr).spin_us == 50);
  CommOptions o;
  o.transport_settings["RINGFENCE_TCP_SPIN_US"] = "0";
  CHECK(tcp::Options::from(&o).spin_us == 0);
  o.transport_settings["RINGFENCE_TCP_SPIN_US"] = "-5";
  try {
    (void)tcp::Options::from(&o);
    FAIL("accepted RINGFENCE_TCP_SPIN_US=-5");
  } catch (const InvalidUsage& e) {
    CHECK(std::string(e.what()).find("RINGFENCE_TCP_SPIN_US") != std::string::npos);
  }
  for (const int spin_us : {0, 1000000}) {  // sleep at once; spin for longer than any wait
    CAPTURE(spin_us);
    Pair p(1, {}, 0, spin_us);
    Target t(p, 64);
    // Nothing comes: the wait returns InProgress at its own bound (5 ms), not after the spin.
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(p.b_to_a->wait(t.flag, 1, std::chrono::milliseconds(5)).in_progress());
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(500));
    // Signals sent while the other side waits (spinning or asleep) are seen, in order.
    std::thread sender([&] {
      for (std::uint32_t v = 1; v <= 50; ++v) {
        if (v % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        while (p.a_to_b->signal(SignalOp{&t.fdst, 0, v, v}).in_progress()) std::this_thread::yield();
      }
    });
    bool all_ok = true;
    for (std::uint32_t v = 1; v <= 50; ++v) all_ok = all_ok && wait_for(*p.b_to_a, t.flag, v).is_ok();
    sender.join();
    CHECK(all_ok);
  }
}
