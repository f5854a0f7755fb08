// The shm transport's own behaviour: segment and cross-memory-attach writes, futex wake-ups,
// its key format, dead peers. The SPI contract shared by every transport (ordering, completion
// ids, bounds, fencing, malformed keys) is tests/conformance/transport_conformance_test.cpp.
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <ringfence/crc32c.hpp>
#include <ringfence/error.hpp>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/transports/shm.hpp>
#include <thread>
#include <vector>

#include "support/catch.hpp"

using namespace ringfence;

namespace {

struct Pair {
  CommOptions options;
  Logger log;
  std::unique_ptr<Transport> a, b;
  std::unique_ptr<Link> a_to_b;
  Pair() {
    options.transport_settings["RINGFENCE_SHM_SPIN"] = "10";
    PeerInfo pa{0, "h", static_cast<std::int32_t>(::getpid())}, pb{1, "h", static_cast<std::int32_t>(::getpid())};
    a = transports::shm::make_transport(TransportContext{pa, 2, &options, &log});
    b = transports::shm::make_transport(TransportContext{pb, 2, &options, &log});
    auto la = a->listen(), lb = b->listen();
    auto pending = a->connect(*la, pb, lb->address());
    REQUIRE(pending->try_finish(a_to_b).is_ok());
    REQUIRE(a_to_b->state() == LinkState::Up);
    REQUIRE(a_to_b->peer() == 1);
  }
};

std::vector<Completion> drain(Link& link) {
  std::vector<Completion> out(16);
  std::size_t n = 0;
  REQUIRE(link.poll(out, n).is_ok());
  out.resize(n);
  return out;
}

}  // namespace

TEST_CASE("shm: reachability follows the host id", "[shm]") {
  Pair p;
  REQUIRE(p.a->name() == "shm");
  REQUIRE(p.a->can_reach(PeerInfo{0, "h", 1}, PeerInfo{1, "h", 2}).ok);
  const Reachability r = p.a->can_reach(PeerInfo{0, "h", 1}, PeerInfo{1, "other", 2});
  REQUIRE_FALSE(r.ok);
  REQUIRE_THAT(r.reason, Catch::Contains("other"));
}

TEST_CASE("shm: a waiter sleeping on the futex is woken by a signal from another thread", "[shm]") {
  Pair p;
  auto* mem = static_cast<std::byte*>(p.b->allocate(sizeof(SignalFlag), MemoryKind::Host));
  MemoryRegion region = p.b->register_memory(mem, sizeof(SignalFlag), MemoryKind::Host);
  RemoteRegion remote = p.a->import_region(region.key());
  auto& flag = *reinterpret_cast<SignalFlag*>(mem);
  std::thread signaller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    REQUIRE(p.a_to_b->signal(SignalOp{&remote, 0, 1, 1}).is_ok());
  });
  const auto t0 = std::chrono::steady_clock::now();
  Status s = Status(ErrorCode::InProgress);
  while (s.in_progress()) s = p.a_to_b->wait(flag, 1, std::chrono::seconds(5));
  signaller.join();
  REQUIRE(s.is_ok());
  REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(4));
}

TEST_CASE("shm: a signal stores the bytes it carries with its flag, and refuses them out of bounds", "[shm]") {
  Pair p;
  REQUIRE(p.a->traits().signals_carry_bytes);
  auto* mem = static_cast<std::byte*>(p.b->allocate(sizeof(SignalFlag), MemoryKind::Host));
  MemoryRegion region = p.b->register_memory(mem, sizeof(SignalFlag), MemoryKind::Host);
  RemoteRegion remote = p.a->import_region(region.key());
  auto& flag = *reinterpret_cast<SignalFlag*>(mem);
  for (const std::uint32_t bytes : {12u, 16u, 5u}) {  // two 8-byte moves (overlapping, whole), byte by byte
    std::uint8_t carried[16];
    for (std::uint32_t i = 0; i < 16; ++i) carried[i] = static_cast<std::uint8_t>(bytes * 31 + i);
    SignalOp op{&remote, 0, bytes, bytes};
    op.with = carried;
    op.with_offset = 20;
    op.with_bytes = bytes;
    std::memset(mem + 20, 0, 20);
    REQUIRE(p.a_to_b->signal(op).is_ok());
    REQUIRE(flag.value.load() == bytes);
    REQUIRE(std::memcmp(mem + 20, carried, bytes) == 0);
    REQUIRE(static_cast<std::uint8_t>(mem[20 + bytes]) == 0);  // nothing past them
  }
  const std::uint8_t carried[kSignalCarriesMaxBytes + 1] = {};
  SignalOp too_many{&remote, 0, 99, 9};
  too_many.with = carried;
  too_many.with_offset = 8;
  too_many.with_bytes = kSignalCarriesMaxBytes + 1;
  REQUIRE(p.a_to_b->signal(too_many).code() == ErrorCode::InvalidUsage);
  SignalOp outside = too_many;
  outside.with_bytes = 12;
  outside.with_offset = sizeof(SignalFlag) - 8;
  REQUIRE(p.a_to_b->signal(outside).code() == ErrorCode::InvalidUsage);
  REQUIRE(flag.value.load() == 5);  // refused signals store nothing
  REQUIRE(drain(*p.a_to_b).size() == 3);
}

TEST_CASE("shm: memory in another shm transport's segment registers as a segment: flags work, no CMA needed",
          "[shm]") {
  // A pair that moves from nvlink to pcie registers the flags the nvlink transport's own shm
  // allocated; a communicator's alloc() memory may be registered by another one. With
  // cross-memory attach off, only the segment path can succeed, and only it can hold a flag.
  Pair p;
  CommOptions other_options, no_cma;
  no_cma.transport_settings["RINGFENCE_SHM_CMA"] = "0";
  Logger log;
  const PeerInfo rank1{1, "h", static_cast<std::int32_t>(::getpid())};
  auto owner = transports::shm::make_transport(TransportContext{rank1, 2, &other_options, &log});
  auto registrar = transports::shm::make_transport(TransportContext{rank1, 2, &no_cma, &log});
  auto* mem = static_cast<std::byte*>(owner->allocate(8192, MemoryKind::Host));
  REQUIRE(mem != nullptr);
  MemoryRegion region = registrar->register_memory(mem + 4096, 4096, MemoryKind::Host);  // registrar did not allocate it
  RemoteRegion remote = p.a->import_region(region.key());
  REQUIRE(remote.size() == 4096);
  const std::uint64_t value = 0x1234567890abcdefull;
  REQUIRE(p.a_to_b->write(WriteOp{&value, nullptr, &remote, 128, sizeof value, 1}).is_ok());
  REQUIRE(p.a_to_b->signal(SignalOp{&remote, 64, 9, 2}).is_ok());
  REQUIRE(drain(*p.a_to_b).size() == 2);
  REQUIRE(std::memcmp(mem + 4096 + 128, &value, sizeof value) == 0);
  REQUIRE(reinterpret_cast<SignalFlag*>(mem + 4096 + 64)->value.load() == 9);
  // A range running past the end of the segment is no segment region (and CMA is off).
  REQUIRE_THROWS_WITH(registrar->register_memory(mem + 4096, 8192, MemoryKind::Host), Catch::Contains("cross-memory attach is disabled"));
  std::vector<std::byte> heap(64);
  REQUIRE_THROWS_WITH(registrar->register_memory(heap.data(), heap.size(), MemoryKind::Host), Catch::Contains("cross-memory attach is disabled"));
  REQUIRE(owner->deallocate(mem));
}

TEST_CASE("shm: a write asked to stream lands the same bytes and answers the same CRC as a plain one", "[shm][stream]") {
  // WriteOp::stream: streaming stores from 256 bytes where the destination is aligned, the
  // plain copy elsewhere; with `crc` copy-then-CRC up to 16 KiB, fused above, plain past 256 KiB.
  // WriteOp::also: the same bytes in a local buffer too, whatever else the write does.
  Pair p;
  std::vector<std::byte> local(320 * 1024 + 8);
  constexpr std::size_t kBytes = 320 * 1024;
  auto* mem = static_cast<std::byte*>(p.b->allocate(kBytes + 64, MemoryKind::Host));
  REQUIRE(mem != nullptr);
  MemoryRegion region = p.b->register_memory(mem, kBytes + 64, MemoryKind::Host);
  RemoteRegion remote = p.a->import_region(region.key());
  std::vector<std::byte> src(kBytes);
  std::mt19937 rng(9);
  for (auto& x : src) x = static_cast<std::byte>(rng());
  std::uint64_t id = 0;
  for (const std::size_t len : {100u, 4096u, 16384u, 20000u, 65539u, 262144u, 300000u})
    for (const std::size_t at : {0u, 16u, 3u})
      for (const bool stream : {false, true})
        for (const int kind : {0, 1, 2, 3}) {
          const bool with_crc = kind % 2 == 1, with_also = kind >= 2;
          CAPTURE(len, at, stream, with_crc, with_also);
          std::memset(mem, 0x5a, kBytes + 64);
          std::fill(local.begin(), local.end(), std::byte{0x5a});
          WriteCrc crc;
          WriteAlso also{local.data() + 4};
          WriteOp op{src.data() + 1, nullptr, &remote, at, len, ++id};
          op.stream = stream;
          if (with_crc) op.crc = &crc;
          if (with_also) op.also = &also;
          REQUIRE(p.a_to_b->write(op).is_ok());
          REQUIRE(drain(*p.a_to_b).size() == 1);
          REQUIRE(std::memcmp(mem + at, src.data() + 1, len) == 0);
          REQUIRE(static_cast<unsigned char>(mem[at + len]) == 0x5a);  // nothing past the end
          if (at > 0) REQUIRE(static_cast<unsigned char>(mem[at - 1]) == 0x5a);
          if (with_crc) {
            REQUIRE(crc.done);
            REQUIRE(crc.value == crc32c(src.data() + 1, len));
          }
          if (with_also) {
            REQUIRE(also.done);
            REQUIRE(std::memcmp(local.data() + 4, src.data() + 1, len) == 0);
            REQUIRE(static_cast<unsigned char>(local[3]) == 0x5a);
            REQUIRE(static_cast<unsigned char>(local[4 + len]) == 0x5a);
          }
        }
  REQUIRE(p.b->deallocate(mem));
}

TEST_CASE("shm: unregistered buffers are written with one cross-memory-attach copy", "[shm][cma]") {
  Pair p;
  std::vector<std::uint32_t> target(1024, 0);
  MemoryRegion region = p.b->register_memory(target.data(), target.size() * 4, MemoryKind::Host);
  RemoteRegion remote = p.a->import_region(region.key());
  std::vector<std::uint32_t> src(512);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint32_t>(i * 2654435761u);
  // A second destination is the engine's to copy here: the kernel wrote the bytes, not the CPU.
  std::vector<std::uint32_t> local(512, 0);
  WriteAlso also{local.data()};
  WriteOp op{src.data(), nullptr, &remote, 256 * 4, src.size() * 4, 1};
  op.also = &also;
  REQUIRE(p.a_to_b->write(op).is_ok());
  REQUIRE_FALSE(also.done);
  for (std::size_t i = 0; i < 512; ++i) REQUIRE(target[256 + i] == src[i]);
  REQUIRE(target[255] == 0);
  REQUIRE(target[768] == 0);
  // Signals need shared memory: a CMA region cannot hold a flag.
  REQUIRE(p.a_to_b->signal(SignalOp{&remote, 0, 1, 2}).code() == ErrorCode::InvalidUsage);
}

TEST_CASE("shm: cross-memory attach works across processes", "[shm][cma]") {
  // The child writes into the parent's plain heap buffer through the parent's region key.
  Pair p;
  std::vector<std::uint64_t> target(4096, 0);
  MemoryRegion region = p.b->register_memory(target.data(), target.size() * 8, MemoryKind::Host);
  const Bytes key = region.key();
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    CommOptions options;
    Logger log;
    PeerInfo self{0, "h", static_cast<std::int32_t>(::getpid())}, parent{1, "h", static_cast<std::int32_t>(::getppid())};
    auto t = transports::shm::make_transport(TransportContext{self, 2, &options, &log});
    auto listen = t->listen();
    std::unique_ptr<Link> link;
    if (!t->connect(*listen, parent, serialize(parent))->try_finish(link).is_ok()) _exit(2);
    RemoteRegion remote = t->import_region(key);
    std::vector<std::uint64_t> src(4096);
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = i * i + 1;
    _exit(link->write(WriteOp{src.data(), nullptr, &remote, 0, src.size() * 8, 1}).is_ok() ? 0 : 3);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  for (std::size_t i = 0; i < target.size(); ++i) REQUIRE(target[i] == i * i + 1);
}

TEST_CASE("shm: malformed region keys are rejected", "[shm]") {
  Pair p;
  REQUIRE_THROWS_AS(p.a->import_region(Bytes(5)), InvalidUsage);
  auto* mem = p.b->allocate(64, MemoryKind::Host);
  Bytes key = p.b->register_memory(mem, 64, MemoryKind::Host).key();
  Bytes bad = key;
  bad[0] = std::byte{9};  // unknown kind
  REQUIRE_THROWS_AS(p.a->import_region(bad), InvalidUsage);
  bad = key;
  bad.push_back(std::byte{'x'});  // name length disagrees with the key size
  REQUIRE_THROWS_AS(p.a->import_region(bad), InvalidUsage);
  bad = key;
  bad[16] = std::byte{0xff};  // region larger than the segment
  REQUIRE_THROWS_AS(p.a->import_region(bad), InvalidUsage);
}

TEST_CASE("shm: waiting on a peer that exited reports PeerUnreachable at once", "[shm]") {
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) _exit(0);
  CommOptions options;
  options.transport_settings["RINGFENCE_SHM_SPIN"] = "0";
  Logger log;
  PeerInfo self{0, "h", static_cast<std::int32_t>(::getpid())}, peer{1, "h", static_cast<std::int32_t>(child)};
  auto t = transports::shm::make_transport(TransportContext{self, 2, &options, &log});
  auto listen = t->listen();
  std::unique_ptr<Link> link;
  REQUIRE(t->connect(*listen, peer, serialize(peer))->try_finish(link).is_ok());  // pidfd taken while it lives (zombie)
  int status = 0;
  waitpid(child, &status, 0);
  SignalFlag flag;
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(link->wait(flag, 1, std::chrono::seconds(5)).code() == ErrorCode::PeerUnreachable);
  REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
}

TEST_CASE("shm: a segment is stale exactly when its owner's lock is free", "[shm][segments]") {
  namespace shm = ringfence::transports::shm;
  const std::string name = "/rf-" + std::to_string(::getpid()) + "-unittest-" + std::to_string(::time(nullptr));
  const std::string path = "/dev/shm" + name;
  const int fd = shm::create_owned_segment(name);
  REQUIRE(fd >= 0);
  // Owned (by this process, through the descriptor): a sweep leaves it, as a job in another PID
  // namespace must, although nothing there can see our pid.
  shm::remove_stale_segments();
  CHECK(::access(path.c_str(), F_OK) == 0);
  // Creating the same name again is refused; the owner keeps it.
  CHECK(shm::create_owned_segment(name) == -1);
  CHECK(::access(path.c_str(), F_OK) == 0);
  // The owner gone (its descriptor closed, as at any death): the next sweep removes it.
  ::close(fd);
  CHECK(shm::remove_stale_segments() >= 1);
  CHECK(::access(path.c_str(), F_OK) != 0);
  // A child that dies by SIGKILL holding the lock: the kernel drops it, so a sweep removes it.
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const char ok = shm::create_owned_segment(name) >= 0 ? 1 : 0;
    [[maybe_unused]] const ssize_t w = ::write(ready[1], &ok, 1);
    ::pause();
    ::_exit(0);
  }
  char ok = 0;
  REQUIRE(::read(ready[0], &ok, 1) == 1);  // the child holds the lock from here on
  ::close(ready[0]);
  ::close(ready[1]);
  REQUIRE(ok == 1);
  REQUIRE(::access(path.c_str(), F_OK) == 0);
  shm::remove_stale_segments();
  CHECK(::access(path.c_str(), F_OK) == 0);  // the child lives and holds it
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(shm::remove_stale_segments() >= 1);
  CHECK(::access(path.c_str(), F_OK) != 0);
}

TEST_CASE("shm: RINGFENCE_SHM_YIELD sets the polls between yields, and a bad value names the variable", "[shm][yield]") {
  CHECK(transports::shm::Options::from(nullptr).yield_every == 32);
  CommOptions options;
  options.transport_settings["RINGFENCE_SHM_YIELD"] = "0";
  CHECK(transports::shm::Options::from(&options).yield_every == 0);
  options.transport_settings["RINGFENCE_SHM_YIELD"] = "7";
  CHECK(transports::shm::Options::from(&options).yield_every == 7);
  for (const char* bad : {"-1", "often", "auto"}) {
    options.transport_settings["RINGFENCE_SHM_YIELD"] = bad;
    try {
      (void)transports::shm::Options::from(&options);
      FAIL("accepted RINGFENCE_SHM_YIELD=" << bad);
    } catch (const InvalidUsage& e) {
      CHECK(std::string(e.what()).find("RINGFENCE_SHM_YIELD") != std::string::npos);
    }
  }
}

TEST_CASE("shm: a waiter that yields every poll, or never, still sees a signal from another thread", "[shm][yield]") {
  for (const char* yield : {"1", "0"}) {
    CAPTURE(yield);
    CommOptions options;
    options.transport_settings["RINGFENCE_SHM_SPIN"] = "100000";
    options.transport_settings["RINGFENCE_SHM_YIELD"] = yield;
    Logger log;
    PeerInfo pa{0, "h", static_cast<std::int32_t>(::getpid())}, pb{1, "h", static_cast<std::int32_t>(::getpid())};
    auto a = transports::shm::make_transport(TransportContext{pa, 2, &options, &log});
    auto b = transports::shm::make_transport(TransportContext{pb, 2, &options, &log});
    auto la = a->listen(), lb = b->listen();
    std::unique_ptr<Link> a_to_b, b_to_a;
    REQUIRE(a->connect(*la, pb, lb->address())->try_finish(a_to_b).is_ok());
    REQUIRE(b->connect(*lb, pa, la->address())->try_finish(b_to_a).is_ok());
    auto* mem = static_cast<std::byte*>(b->allocate(sizeof(SignalFlag), MemoryKind::Host));
    MemoryRegion region = b->register_memory(mem, sizeof(SignalFlag), MemoryKind::Host);
    RemoteRegion remote = a->import_region(region.key());
    auto& flag = *reinterpret_cast<SignalFlag*>(mem);
    // Many rounds, each answered after a short delay, so waits both spin and yield.
    std::thread signaller([&] {
      for (std::uint32_t v = 1; v <= 200; ++v) {
        while (flag.value.load() != v - 1) std::this_thread::yield();
        std::this_thread::sleep_for(std::chrono::microseconds(v % 7 * 20));
        REQUIRE(a_to_b->signal(SignalOp{&remote, 0, v, v}).is_ok());
      }
    });
    bool all_ok = true;
    for (std::uint32_t v = 1; v <= 200; ++v) {
      Status s = Status(ErrorCode::InProgress);
      while (s.in_progress()) s = b_to_a->wait(flag, v, std::chrono::seconds(5));
      all_ok = all_ok && s.is_ok() && flag.value.load() >= v;
    }
    signaller.join();
    CHECK(all_ok);
    // The waits spun long enough to yield (answers came up to 120 us late): every poll yields
    // with "1", none with "0".
    const std::uint64_t yields = b_to_a->stats().yields.load();
    if (std::string(yield) == "1") CHECK(yields > 0);
    else CHECK(yields == 0);
    b->deallocate(mem);
  }
}
