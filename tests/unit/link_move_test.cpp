// Moving a link that must be fenced to a fallback transport (CommOptions::fallbacks): the
// pair reconnects over the other transport at the fence agreement, the plan stays, and every
// result stays bit-identical to a fault-free run. On the CPU the pair is shm -> tcp (a fault
// rule limited to shm plays the failing NVLink); nvlink -> pcie over the fake CUDA runtime is
// tests/device/move_test.cpp.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdlib>
#include <ringfence/communicator.hpp>
#include <ringfence/env.hpp>
#include <ringfence/error.hpp>
#include <ringfence/fault.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/fence_scenario.hpp"
#include "support/fake_nvml_state.hpp"
#include "support/link_decorator.hpp"
#include "support/thread_ranks.hpp"
#include "support/verifiable.hpp"

using namespace ringfence;

namespace {
// The scenario's options with shm -> tcp allowed, then `tweak` (which may change that).
std::function<void(int, CommOptions&)> shm_to_tcp(std::function<void(int, CommOptions&)> tweak) {
  return [tweak](int r, CommOptions& o) {
    o.fallbacks = FallbackTable{{"shm", "tcp"}};
    if (tweak) tweak(r, o);
  };
}
std::pair<test::FenceRun, test::FenceRun> run_against_clean(int n, const std::string& fault,
                                                            const std::function<void(int, CommOptions&)>& tweak) {
  return test::run_against_clean(n, fault, shm_to_tcp(tweak));
}
}  // namespace

TEST_CASE("a corrupting shm link moves to tcp at the agreement: same plan, bit-identical results", "[health][move]") {
  // 4 ranks on two lanes (each lane's link moves), and 2 ranks (no route around exists: moving is
  // the only way off the bad link).
  for (const int n : {4, 2}) {
    INFO("ranks " << n);
    const auto tweak = [&](int, CommOptions& o) {
      o.channels = n == 4 ? 2 : 1;
      o.channel_min_bytes = 16384;
    };
    const auto [clean, faulty] = run_against_clean(n, "flip:rate=1e-4,link=0-1,seed=3,transport=shm", tweak);
    test::require_moved_once(clean, faulty, n, LinkId{0, 1}, "shm", "tcp");
  }
}

TEST_CASE("a corrupting tcp link moves to shm (sockets closed, segments registered): same plan, bit-identical results",
          "[health][move]") {
  // The reverse direction: the old links are sockets with receiver threads, closed at the move,
  // and the new links register the staging memory as segments.
  for (const int n : {2, 3}) {
    INFO("ranks " << n);
    const auto tweak = [](int, CommOptions& o) {
      o.transports = {"tcp", "shm"};
      o.fallbacks = FallbackTable{{"tcp", "shm"}};
      o.timeout = std::chrono::seconds(5);
      o.slots = 1;
    };
    const auto [clean, faulty] = run_against_clean(n, "flip:rate=1e-6,link=0-1,seed=3,transport=tcp", tweak);
    test::require_moved_once(clean, faulty, n, LinkId{0, 1}, "tcp", "shm");
  }
}

TEST_CASE("a link whose signals need the sender's progress still moves: the ends drive the old links while they meet",
          "[health][move]") {
  // `hold` keeps every signal on the shm link 0-1 until a poll or wait 2 ms later (as nvlink
  // keeps a signal behind its copies). The agreement's last credits are such signals: a rank
  // that went to the move without polling its old link would leave its peer waiting for them
  // in the agreement, and both would time out. One staging slot: every credit is needed.
  const auto tweak = [](int, CommOptions& o) {
    o.slots = 1;
    o.timeout = std::chrono::seconds(5);
  };
  const auto [clean, faulty] =
      run_against_clean(2, "hold:ms=2,link=0-1,transport=shm;flip:rate=1e-4,link=0-1,seed=3,transport=shm", tweak);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    REQUIRE(faulty.epochs[r] == 1);
    REQUIRE(faulty.moved[r].size() == 1);
    REQUIRE(faulty.transport_to[r].at(1 - r) == "tcp");
  }
}

TEST_CASE("a moved link that goes on corrupting is fenced in turn and relayed around: results stay bit-identical",
          "[health][move]") {
  // The rule corrupts link 0-1 on every transport: it moves to tcp, still corrupts there, has
  // no further fallback, and is fenced with a relay through rank 2.
  const auto [clean, faulty] = run_against_clean(4, "flip:rate=1e-4,link=0-1,seed=5", {});
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    REQUIRE(faulty.epochs[r] == 2);
    REQUIRE(faulty.moved[r].size() == 1);
    REQUIRE(faulty.fences[r] == std::vector<LinkId>{LinkId::of(0, 1)});
    REQUIRE(faulty.relays[r] == std::vector<Relay>{Relay{0, 2, 1}});
    REQUIRE(faulty.rings[r] == clean.rings[r]);
    if (r <= 1) {
      REQUIRE(faulty.transport_to[r].at(1 - r) == "tcp");
      REQUIRE(faulty.state_to[r].at(1 - r) == LinkState::Fenced);
    }
  }
}

TEST_CASE("a link moves only when both ends allow the same fallback, otherwise it is fenced as before", "[health][move]") {
  // Rank 1 allows no fallback: link 0-1 is fenced and relayed; no rank reports a move.
  const auto [clean, faulty] =
      run_against_clean(4, "flip:rate=1e-4,link=0-1,seed=3,transport=shm", [](int r, CommOptions& o) {
        if (r == 1) o.fallbacks = FallbackTable{};
      });
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    REQUIRE(faulty.epochs[r] == 1);
    REQUIRE(faulty.moved[r].empty());
    REQUIRE(faulty.fences[r] == std::vector<LinkId>{LinkId::of(0, 1)});
    for (const auto& [peer, transport] : faulty.transport_to[r]) REQUIRE(transport == "shm");
  }
}

TEST_CASE("an NVLink counter storm moves the mapped link: its counters stop counting against it, direct writes follow it",
          "[health][move][nvml]") {
  // Without checksums the agreement runs for the link map, and allreduces of alloc() memory
  // write final values straight into the right neighbour's output, through keys made for the
  // link's transport (they must be made again for tcp after the move). The storm goes on after
  // the move: the NVLink counters no longer describe link 1-2, so it must not be fenced for
  // them, neither unjudged (no checksums) nor judged afresh on its transport (checksums).
  for (const bool checksum : {false, true}) {
  INFO("checksums " << checksum);
  const test::FakeNvmlState nvml("ringfence-move-storm", "count 1\nlinks 4\n");
  const int n = 4;
  std::barrier sync(n, [&]() noexcept {});
  std::atomic<std::size_t> wrong{0};
  std::vector<std::vector<LinkId>> fences(n);
  std::vector<std::vector<std::string>> moved(n);
  std::vector<std::string> to_2(n);
  CommOptions o;
  o.timeout = std::chrono::seconds(20);
  o.health_agree_every = 2;
  o.health_agree_min_interval = std::chrono::microseconds(0);  // by count only: these agreements fall at set calls
  o.health.nvml_library = RINGFENCE_FAKE_NVML_PATH;
  o.health_link_map = "1-2=nvml:0:1";
  o.host_id = "move-storm";
  o.fallbacks = FallbackTable{{"shm", "tcp"}};
  o.channels = 1;
  o.checksum = checksum;
  const std::string error = test::run_ranks(n, o, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    comm.on_health_event([&, r](const HealthEvent& e) {
      if (e.kind == EventKind::LinkMoved) moved[r].push_back(fmt::format("{}-{} at #{}", e.a, e.b, e.sequence));
    });
    const std::size_t count = 300000;  // 1.2 MB: direct writes
    auto* in = static_cast<std::int32_t*>(comm.alloc(count * 4));
    auto* out = static_cast<std::int32_t*>(comm.alloc(count * 4));
    for (int it = 0; it < 14; ++it) {
      if (it >= 6) {  // from collective #7 on the NVLink replays, more at every step
        sync.arrive_and_wait();
        if (r == 0) nvml.write(fmt::format("count 1\nlinks 4\nd0.l1.crc_flit {}\nd0.l1.replay {}\n", 250000 * (it - 5), 7 * (it - 5)));
        sync.arrive_and_wait();
      }
      test::fill_input(DataType::Int32, ReduceOp::Sum, comm.rank(), n, in, count, static_cast<std::size_t>(it));
      comm.allreduce(in, out, count, DataType::Int32, ReduceOp::Sum);
      wrong += test::count_wrong(DataType::Int32, ReduceOp::Sum, n, out, count, static_cast<std::size_t>(it));
    }
    fences[r] = comm.fenced_links();
    for (const auto& l : comm.links())
      if (l.peer == 2) to_2[r] = l.transport;
    comm.free(in);
    comm.free(out);
  });
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(fences[r].empty());
    REQUIRE(moved[r] == std::vector<std::string>{"1-2 at #8"});  // the first agreement after the storm began
  }
  REQUIRE(to_2[1] == "tcp");
  REQUIRE(to_2[0] == "shm");
  }
}

namespace {
// A transport that reaches every peer and never connects: a move to it fails.
class RefusingTransport final : public Transport {
 public:
  std::string_view name() const noexcept override { return "refusing"; }
  Reachability can_reach(const PeerInfo&, const PeerInfo&) const override { return Reachability{true, 1.0, 1.0, 0, {}}; }
  MemoryRegion register_memory(void*, std::size_t, MemoryKind) override { throw InvalidUsage("refusing: no regions"); }
  RemoteRegion import_region(std::span<const std::byte>) override { throw InvalidUsage("refusing: no regions"); }
  std::unique_ptr<ListenHandle> listen() override {
    struct Handle final : ListenHandle {
      Bytes address() const override { return to_bytes("nowhere"); }
    };
    return std::make_unique<Handle>();
  }
  std::unique_ptr<PendingLink> connect(ListenHandle&, const PeerInfo&, std::span<const std::byte>) override {
    struct Refused final : PendingLink {
      Status try_finish(std::unique_ptr<Link>&) noexcept override { return Status(ErrorCode::PeerUnreachable); }
    };
    return std::make_unique<Refused>();
  }
};
}  // namespace

TEST_CASE("a move that cannot connect fails the communicator on every rank with an error naming it, no hang",
          "[health][move]") {
  TransportRegistry registry = builtin_transports();
  registry.add("refusing", [](const TransportContext&) { return std::make_unique<RefusingTransport>(); });
  auto store = std::make_shared<InProcessStore>();
  const int n = 4;
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        CommOptions o;
        o.chunk_bytes = 4096;
        o.timeout = std::chrono::seconds(10);
        o.checksum = true;
        o.health_agree_every = 2;
        o.health_agree_min_interval = std::chrono::microseconds(0);  // by count only: these agreements fall at set calls
        o.transports = {"shm", "refusing"};
        o.fallbacks = FallbackTable{{"shm", "refusing"}};
        o.fault = "flip:rate=1e-4,link=0-1,seed=3,transport=shm";
        o.host_id = "refused-move";
        Communicator comm(store, r, n, registry, o);
        std::vector<float> buf(30000);
        for (int it = 0; it < 12; ++it) {
          test::fill_input(DataType::Float32, ReduceOp::Sum, r, n, buf.data(), buf.size());
          comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
        }
        errors[static_cast<std::size_t>(r)] = "no error";
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::seconds(9));  // nobody waited out its timeout
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    REQUIRE_THAT(errors[r], Catch::Contains(fmt::format("rank {}: moving the link to rank {} to refusing: connecting failed", r, 1 - r)));
  }
  for (int r = 2; r < n; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    REQUIRE_THAT(errors[r], Catch::Contains("failed") && Catch::Contains("rank"));
    REQUIRE(errors[r] != "no error");
  }
}

namespace {
// A store that says every rank must make the same calls (as MpiStore does).
class CollectiveOnlyStore final : public Store {
 public:
  void set(std::string_view key, std::span<const std::byte> value) override { inner_.set(key, value); }
  Bytes get(std::string_view key, std::chrono::milliseconds timeout) override { return inner_.get(key, timeout); }
  std::int64_t add(std::string_view key, std::int64_t delta) override { return inner_.add(key, delta); }
  bool collective_only() const noexcept override { return true; }

 private:
  InProcessStore inner_;
};
}  // namespace

TEST_CASE("on a store every rank must use together (MPI bootstrap) a link is fenced, not moved", "[health][move]") {
  const auto tweak = [](int, CommOptions&) {};
  const auto run = test::run_scenario(4, "flip:rate=1e-4,link=0-1,seed=3,transport=shm", shm_to_tcp(tweak), builtin_transports(), 12, 30000,
                                      std::make_shared<CollectiveOnlyStore>());
  INFO(run.error);
  REQUIRE(run.error.empty());
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    REQUIRE(run.moved[r].empty());
    REQUIRE(run.fences[r] == std::vector<LinkId>{LinkId::of(0, 1)});
    REQUIRE(run.p2p_wrong[r] == 0);
  }
}

TEST_CASE("RINGFENCE_FALLBACK and the fault rule's transport= field", "[health][move][env]") {
  CommOptions defaults;
  REQUIRE_FALSE(defaults.fallbacks.has_value());  // unset: what the selected transports declare
  const auto o = CommOptions::from_env(Environment(std::map<std::string, std::string>{{"RINGFENCE_FALLBACK", "nvlink:pcie,shm:tcp"}}));
  REQUIRE(o.fallbacks == FallbackTable{{"nvlink", "pcie"}, {"shm", "tcp"}});
  const auto none = CommOptions::from_env(Environment(std::map<std::string, std::string>{{"RINGFENCE_FALLBACK", "none"}}));
  REQUIRE(none.fallbacks.has_value());
  REQUIRE(none.fallbacks->empty());
  for (const char* bad : {"nvlink", "nvlink:", ":pcie", "shm:shm", "nvlink:pcie,tcp"}) {
    INFO(bad);
    REQUIRE_THROWS_WITH(CommOptions::from_env(Environment(std::map<std::string, std::string>{{"RINGFENCE_FALLBACK", bad}})),
                        Catch::Contains("RINGFENCE_FALLBACK") && Catch::Contains("from:to pairs"));
  }
  const auto rules = parse_fault_spec("flip:rate=1e-3,link=0-1,transport=shm;delay:us=5;hold:ms=3");
  REQUIRE(rules.size() == 3);
  REQUIRE(rules[2].kind == FaultKind::Hold);
  REQUIRE(rules[2].stall == std::chrono::milliseconds(3));
  REQUIRE_THROWS_WITH(parse_fault_spec("hold:link=0-1"), Catch::Contains("a hold rule needs ms="));
  REQUIRE(rules[0].transport == "shm");
  REQUIRE(rules[1].transport.empty());
  REQUIRE_THROWS_WITH(parse_fault_spec("flip:rate=1e-3,transport="), Catch::Contains("transport= needs a transport name"));
}

namespace {
// A link that takes 1 ms inside state() and stats() (the calls links() makes on another thread)
// and counts the callers inside them. Destroyed while a caller is inside, it records a
// violation, then waits for the caller to leave (so the test reports instead of crashing).
class SlowReadLink final : public test::ForwardingLink {
 public:
  SlowReadLink(std::unique_ptr<Link> inner, std::atomic<int>* violations) : ForwardingLink(std::move(inner)), violations_(violations) {}
  ~SlowReadLink() override {
    if (readers_.load() > 0) ++*violations_;
    while (readers_.load() > 0) std::this_thread::yield();
  }
  LinkState state() const noexcept override {
    const Reading reading(readers_);
    return inner().state();
  }
  const LinkStats& stats() const noexcept override {
    const Reading reading(readers_);
    return inner().stats();
  }

 private:
  // A caller inside state() or stats(): counted, and held there for 1 ms.
  struct Reading {
    std::atomic<int>& readers;
    explicit Reading(std::atomic<int>& r) noexcept : readers(r) {
      ++readers;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ~Reading() { --readers; }
  };
  std::atomic<int>* violations_;
  mutable std::atomic<int> readers_{0};
};
}  // namespace

TEST_CASE("links() on another thread while a move replaces the link: no link destroyed under a reader, the old transport then the new",
          "[health][move]") {
  // Two ranks, one lane: the pair's only link moves shm -> tcp under a flip fault, while a watcher
  // thread per rank calls links() and link_table() without pause. The shm links hold links() in
  // state() and stats() for 1 ms each, so the watcher is almost always inside the link the move
  // replaces: the move must wait for it (links_mutex) rather than destroy the link under it.
  const int n = 2;
  std::atomic<int> violations{0};
  const TransportRegistry builtin = builtin_transports();
  TransportRegistry registry;
  auto slow_reads = [&violations](std::unique_ptr<Link> link) -> std::unique_ptr<Link> {
    return std::make_unique<SlowReadLink>(std::move(link), &violations);
  };
  registry.add("shm", [&](const TransportContext& ctx) {
    return std::make_unique<test::LinkWrappingTransport<decltype(slow_reads)>>(builtin.create("shm", ctx), slow_reads);
  });
  registry.add("tcp", [&](const TransportContext& ctx) { return builtin.create("tcp", ctx); });
  std::atomic<std::size_t> wrong{0}, torn{0};
  std::vector<std::vector<std::string>> moved(n), seen(n);  // seen: the peer's transport, in order, deduplicated
  CommOptions o;
  o.chunk_bytes = 4096;
  o.timeout = std::chrono::seconds(20);
  o.checksum = true;
  o.health_agree_every = 2;
  o.health_agree_min_interval = std::chrono::microseconds(0);  // by count only: these agreements fall at set calls
  o.fault = "flip:rate=1e-4,link=0-1,seed=3,transport=shm";
  o.host_id = "move-watched";
  o.transports = {"shm", "tcp"};
  o.fallbacks = FallbackTable{{"shm", "tcp"}};
  o.channels = 1;
  const std::string error = test::run_ranks(
      n, [&](int) { return o; },
      [&](Communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        comm.on_health_event([&, r](const HealthEvent& e) {
          if (e.kind == EventKind::LinkMoved) moved[r].push_back(fmt::format("{}-{}", e.a, e.b));
        });
        std::atomic<bool> stop{false};
        std::atomic<std::uint64_t> reads{0};
        std::thread watcher([&, r] {
          while (!stop.load()) {
            for (const auto& l : comm.links()) {
              if (l.transport != "shm" && l.transport != "tcp") ++torn;
              if (seen[r].empty() || seen[r].back() != l.transport) seen[r].push_back(l.transport);
            }
            if (comm.link_table().find("rank") == std::string::npos) ++torn;
            ++reads;
          }
        });
        struct Join {
          std::atomic<bool>& stop;
          std::thread& t;
          ~Join() { stop = true; t.join(); }
        } join{stop, watcher};
        const auto wait_for_reads = [&] {
          for (const std::uint64_t now = reads.load(); reads.load() < now + 2;) std::this_thread::yield();
        };
        wait_for_reads();  // the watcher saw the link before the move ...
        std::vector<float> buf(30000);
        for (int it = 0; it < 12; ++it) {
          test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), n, buf.data(), buf.size(), static_cast<std::size_t>(it));
          comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
          wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, n, buf.data(), buf.size(), static_cast<std::size_t>(it));
        }
        wait_for_reads();  // ... and after it
      },
      &registry);
  INFO(error);
  REQUIRE(error.empty());
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(moved[r] == std::vector<std::string>{"0-1"});
    REQUIRE(seen[r] == std::vector<std::string>{"shm", "tcp"});
  }
  REQUIRE(wrong == 0);
  REQUIRE(torn == 0);
  REQUIRE(violations == 0);
}
