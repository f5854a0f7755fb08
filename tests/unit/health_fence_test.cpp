// Health end to end on thread ranks: corrupting and slow links fenced by agreement and relayed
// or re-ordered around, readmission, stragglers, concurrent proposals, and two ranks with no
// route around (results exact throughout). Counter storms from the fake NVML and the planner:
// health_storm_test.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdlib>
#include <functional>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <tuple>
#include <ringfence/communicator.hpp>
#include <ringfence/crc32c.hpp>
#include <ringfence/events.hpp>
#include <ringfence/fault.hpp>
#include <ringfence/log.hpp>
#include <ringfence/transports/shm.hpp>
#include <ringfence/transports/tcp.hpp>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/fake_nvml_state.hpp"
#include "support/temp_dir.hpp"
#include "support/thread_ranks.hpp"
#include "checked_ops.hpp"
#include "support/fence_scenario.hpp"
#include "support/verifiable.hpp"
#include "support/plan_scenario.hpp"

using namespace ringfence;
using test::PlanOutcome;
using test::run_plan_scenario;

// The fence scenario (thread ranks, random float inputs, checksums, agreement every 4
// collectives) and its comparison with the fault-free run: tests/support/fence_scenario.hpp.

namespace {
// What the tests below share: `fault` on a host of its own (`host_id`), a 20 s timeout and an
// agreement every `every` calls by count only (no minimum interval), so agreements fall at set
// calls. Checksums and health stay at their defaults (on).
CommOptions agreeing_every(int every, const char* fault, const char* host_id) {
  CommOptions o;
  o.timeout = std::chrono::seconds(20);
  o.health_agree_every = every;
  o.health_agree_min_interval = std::chrono::microseconds(0);
  o.fault = fault;
  o.host_id = host_id;
  return o;
}
// Two ranks whose link 0-1 has no route around once fenced (`fault` on it): small chunks, an
// agreement every 2 calls.
CommOptions no_route_options(const char* fault, const char* host_id) {
  CommOptions o = agreeing_every(2, fault, host_id);
  o.chunk_bytes = 4096;
  return o;
}
}  // namespace

TEST_CASE("a corrupting link is fenced by agreement and relayed around: results stay bit-identical", "[integrity][health]") {
  // The point of ringfence: the protected run's float sums are byte-for-byte those of the
  // fault-free run, although a link corrupted data and was fenced mid-way (4 and 3 ranks).
  for (const auto& [n, link, relay] : {std::tuple{4, std::string("0-1"), Relay{0, 2, 1}},
                                       std::tuple{3, std::string("1-2"), Relay{1, 0, 2}}}) {
    INFO("ranks " << n << ", corrupting link " << link);
    const auto [clean, faulty] = test::run_against_clean(n, "flip:rate=1e-4,link=" + link + ",seed=3", {}, builtin_transports(), 24, 30000);
    const auto a = std::stoi(link.substr(0, 1)), b = std::stoi(link.substr(2, 1));
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      REQUIRE(clean.epochs[r] == 0);
      REQUIRE(faulty.epochs[r] == 1);
      REQUIRE(faulty.fences[r] == std::vector<LinkId>{LinkId::of(a, b)});
      REQUIRE(faulty.relays[r] == std::vector<Relay>{relay});
      REQUIRE(faulty.rings[r] == clean.rings[r]);      // the logical ring did not change
      REQUIRE(faulty.errors_after_first_epoch[r] == 0);     // the bad link carries nothing any more
      REQUIRE(test::fenced_ends_show_fenced(faulty, r));
    }
  }
}

TEST_CASE("a relay hop that corrupts is caught on its own link and fenced in turn: results stay bit-identical",
          "[integrity][health][relay]") {
  // Link 0-1 corrupts and is relayed 0->2->1; then the first hop of that relay (0-2) corrupts
  // too. The relay checks every chunk it forwards, so the damage is blamed on link 0-2 (not on
  // 2-1, which is fine), re-sent by rank 0, and 0-2 is fenced in turn: relay 0->3->1.
  const int n = 4;
  const auto [clean, faulty] =
      test::run_against_clean(n, "flip:rate=1e-4,link=0-1,seed=3;flip:rate=1e-4,link=0-2,seed=5", {}, builtin_transports(), 32, 30000);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(faulty.epochs[r] == 2);  // fenced 0-1, then 0-2
    REQUIRE(faulty.fences[r] == std::vector<LinkId>{LinkId{0, 1}, LinkId{0, 2}});
    REQUIRE(faulty.relays[r] == std::vector<Relay>{Relay{0, 3, 1}});
    REQUIRE(faulty.rings[r] == clean.rings[r]);
    REQUIRE(test::fenced_ends_show_fenced(faulty, r));
  }
}


TEST_CASE("when no relay can carry the fenced hops the ring is re-ordered around them, with exact results",
          "[integrity][health][replan]") {
  // Five ranks; links 0-1, 1-2, 2-3 and 0-4 corrupt: four of the five hops of ring 0..4. No set
  // of relays carries all four (each rank is left two or three links), but one ring avoids them:
  // 0, 2, 4, 1, 3. Inputs whose sums are exact in any order (the reduction order changes).
  const int n = 5;
  CommOptions o = agreeing_every(4,
                                 "flip:rate=1e-4,link=0-1,seed=3;flip:rate=1e-4,link=1-2,seed=4;flip:rate=1e-4,link=2-3,seed=5;"
                                 "flip:rate=1e-4,link=0-4,seed=6",
                                 "replan");
  o.chunk_bytes = 4096;
  std::vector<PlanOutcome> out;
  std::size_t wrong = 0;
  const std::string error = run_plan_scenario(n, o, 32, 30000, LinkId{0, 1}, [](int, Communicator&) {}, out, wrong);
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    std::vector<LinkId> f = out[static_cast<std::size_t>(r)].fences;
    std::sort(f.begin(), f.end(), [](LinkId x, LinkId y) { return std::pair(x.a, x.b) < std::pair(y.a, y.b); });
    REQUIRE(f == std::vector<LinkId>{LinkId{0, 1}, LinkId{0, 4}, LinkId{1, 2}, LinkId{2, 3}});
    REQUIRE(out[static_cast<std::size_t>(r)].ring == std::vector<int>{0, 2, 4, 1, 3});
    REQUIRE(out[static_cast<std::size_t>(r)].relays == 0);
  }
}

TEST_CASE("a link fenced for checksum errors whose corruption stopped is readmitted after its cool-down and probation",
          "[integrity][health][probation]") {
  // The link corrupts only its first writes (a burst), is fenced on checksum evidence alone, serves
  // its cool-down, comes back on probation (every chunk still checked) and, clean, turns healthy.
  const int n = 4;
  CommOptions o = agreeing_every(2, "flip:rate=1e-4,link=0-1,until=60,seed=3", "checksum-probation");
  o.chunk_bytes = 4096;
  o.health.timings.fence_cooldown = std::chrono::milliseconds(150);
  o.health.timings.probation_duration = std::chrono::milliseconds(100);
  std::vector<PlanOutcome> out;
  std::size_t wrong = 0;
  const std::string error = run_plan_scenario(n, o, 60, 30000, LinkId{0, 1}, [](int it, Communicator&) {
    if (it >= 4) std::this_thread::sleep_for(std::chrono::milliseconds(15));  // let the cool-down pass
  }, out, wrong);
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    const PlanOutcome& o_r = out[static_cast<std::size_t>(r)];
    REQUIRE(o_r.fenced_at == out[0].fenced_at);
    REQUIRE(o_r.fenced_at > 0);
    REQUIRE(o_r.readmitted_at > o_r.fenced_at);  // after the cool-down, at the same collective everywhere
    REQUIRE(o_r.readmitted_at == out[0].readmitted_at);
    REQUIRE(o_r.fences.empty());
    REQUIRE(o_r.ring == std::vector<int>{0, 1, 2, 3});
    REQUIRE(o_r.epoch == 2);
    // Both ends of the link judge it: their policies served the cool-down, then clean probation
    // made it healthy again. Nobody else watches link 0-1.
    if (r <= 1) REQUIRE(o_r.healthy_at > o_r.readmitted_at);
    else REQUIRE(o_r.healthy_at == 0);
  }
}

namespace {
// `iterations` in-place int32 sum allreduces of `count` verifiable elements: the wrong elements.
std::size_t int_sum_allreduces(Communicator& comm, std::size_t count, int iterations) {
  std::vector<std::int32_t> buf(count);
  std::size_t wrong = 0;
  for (int it = 0; it < iterations; ++it) {
    test::fill_input(DataType::Int32, ReduceOp::Sum, comm.rank(), comm.size(), buf.data(), buf.size());
    comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Int32, ReduceOp::Sum);
    wrong += test::count_wrong(DataType::Int32, ReduceOp::Sum, comm.size(), buf.data(), buf.size());
  }
  return wrong;
}
}  // namespace

// Left out of the tsan test preset (docs/sanitizers.md): under TSan the links' speeds vary too
// much between agreements to judge any of them.
TEST_CASE("a link far slower than the job's other links is named slow, fenced and relayed around, with exact results",
          "[integrity][health][bandwidth]") {
  const int n = 4;
  std::vector<std::string> slow(n);
  std::vector<int> stragglers(n, 0);
  std::vector<std::vector<LinkId>> fences(n);
  std::atomic<std::size_t> wrong{0};
  // 100 MB/s; the other links run at memory speed.
  CommOptions o = agreeing_every(1, "throttle:mbps=100,link=0-1", "bandwidth");
  o.chunk_bytes = 64 * 1024;  // writes long enough to be timed
  const std::string error = test::run_ranks(n, o, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    comm.on_health_event([&, r](const HealthEvent& e) {
      if (e.a == 0 && e.b == 1 && e.kind == EventKind::LinkSlow) slow[r] = e.detail;
      if (e.kind == EventKind::Straggler) ++stragglers[r];
    });
    wrong += int_sum_allreduces(comm, 1 << 20, 6);  // 4 MiB: 3 MiB per link per allreduce, 48 timed writes
    fences[r] = comm.fenced_links();
  });
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << slow[static_cast<std::size_t>(r)]);
    // Rank 0 writes over 0-1 (ring 0-1-2-3) and times its writes; every rank reads them in the ballot.
    REQUIRE_THAT(slow[static_cast<std::size_t>(r)], Catch::Contains("writes from rank 0 at") && Catch::Contains("GB/s"));
    REQUIRE(std::find(fences[static_cast<std::size_t>(r)].begin(), fences[static_cast<std::size_t>(r)].end(), LinkId{0, 1}) !=
            fences[static_cast<std::size_t>(r)].end());
    REQUIRE(stragglers[static_cast<std::size_t>(r)] == 0);
  }
}

TEST_CASE("a rank slow on all of its links is named a straggler and no link is fenced", "[integrity][health][bandwidth]") {
  const int n = 4;
  std::vector<std::string> straggler(n);
  std::vector<int> slow_events(n, 0);
  std::vector<std::vector<LinkId>> fences(n);
  std::atomic<std::size_t> wrong{0};
  // Rank 2's ring links, both directions.
  CommOptions o = agreeing_every(1, "delay:us=1500,link=1-2;delay:us=1500,link=2-3", "straggler");
  o.chunk_bytes = 64 * 1024;
  const std::string error = test::run_ranks(n, o, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    comm.on_health_event([&, r](const HealthEvent& e) {
      if (e.kind == EventKind::Straggler && e.count == 2) straggler[r] = e.detail;
      if (e.kind == EventKind::LinkSlow) ++slow_events[r];
    });
    wrong += int_sum_allreduces(comm, 1 << 19, 5);
    fences[r] = comm.fenced_links();
  });
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE_THAT(straggler[static_cast<std::size_t>(r)], Catch::Contains("rank 2 is a straggler"));
    REQUIRE(slow_events[static_cast<std::size_t>(r)] == 0);
    REQUIRE(fences[static_cast<std::size_t>(r)].empty());
  }
}

TEST_CASE("two ranks propose different fences at once: every rank agrees on both", "[integrity][health]") {
  // Links 0-1 and 2-3 corrupt at the same time; ranks 1 and 3 propose different fences in the
  // same agreement. Every rank must install the same union and the same relays, and the float
  // results must stay byte-identical to the fault-free run.
  const int n = 5;
  const auto [clean, faulty] =
      test::run_against_clean(n, "flip:rate=1e-4,link=0-1,seed=5;flip:rate=1e-4,link=2-3,seed=6", {}, builtin_transports(), 16, 20000);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    std::vector<LinkId> fences = faulty.fences[r];
    std::sort(fences.begin(), fences.end(), [](LinkId x, LinkId y) { return x.a != y.a ? x.a < y.a : x.b < y.b; });
    REQUIRE(fences == std::vector<LinkId>{LinkId{0, 1}, LinkId{2, 3}});
    REQUIRE(faulty.relays[r] == faulty.relays[0]);
    REQUIRE(faulty.relays[r].size() == 2);
    REQUIRE(faulty.errors_after_first_epoch[r] == 0);
  }
}

TEST_CASE("with two ranks a link that must be fenced has no route around: it stays in use, checksummed, exact",
          "[integrity][health]") {
  CommOptions o = no_route_options("flip:rate=1e-4,link=0-1,seed=9", "noplan");
  std::vector<std::string> no_plan(2);
  std::vector<int> proposed_after(2, 0);  // fence_proposed events after the no_plan one
  std::atomic<std::size_t> wrong{0}, caught{0};
  const std::string error = test::run_ranks(2, o, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    comm.on_health_event([&, r](const HealthEvent& e) {
      if (e.kind == EventKind::NoPlan) no_plan[r] = e.detail;
      if (e.kind == EventKind::FenceProposed && !no_plan[r].empty()) ++proposed_after[r];
    });
    std::vector<float> buf(20000);
    for (int it = 0; it < 20; ++it) {
      test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), 2, buf.data(), buf.size());
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
      wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, 2, buf.data(), buf.size());
    }
    T_CHECK(comm.fenced_links().empty());
    for (const auto& l : comm.links()) caught += l.checksum_errors;
  });
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  REQUIRE(caught > 0);  // the link really corrupted chunks after the decision
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    REQUIRE_THAT(no_plan[static_cast<std::size_t>(r)],
                 Catch::Contains("links 0-1 must be fenced") && Catch::Contains("stay in use, degraded"));
    // Said once: the link is not proposed again at each later agreement (every 2 calls here,
    // the link still flipping bits).
    CHECK(proposed_after[static_cast<std::size_t>(r)] == 0);
  }
}

TEST_CASE("a link with no route around that keeps corrupting: checksum_errors at most once a second after the first, counts exact",
          "[integrity][health]") {
  // Corrupts for 2.6 s from its first flip, then heals: the agreements in the 0.4 s after it
  // observe every mismatch, so the events must add up to the links' counters exactly. Events go
  // out near 0, 1 and 2 s; what the link corrupted from then to 2.6 s is held back until the
  // communicator is destroyed (3 s: before the next second is up).
  CommOptions o = no_route_options("flip:rate=1e-4,link=0-1,seed=5,for_ms=2600", "noplan-events");
  std::vector<std::uint64_t> events(2, 0), reported(2, 0), caught(2, 0);
  std::vector<double> seconds(2, 0.0);
  std::atomic<std::size_t> wrong{0};
  const std::string error = test::run_ranks(2, o, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    comm.on_health_event([&, r](const HealthEvent& e) {
      if (e.kind != EventKind::ChecksumErrors) return;
      ++events[r];
      reported[r] += e.count;
    });
    const auto start = std::chrono::steady_clock::now();
    std::vector<float> buf(20000);
    for (std::int32_t more = 1; more != 0;) {
      test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), 2, buf.data(), buf.size());
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
      wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, 2, buf.data(), buf.size());
      // Both ranks stop at the same call: 3 s after the first one started somewhere.
      more = std::chrono::steady_clock::now() - start < std::chrono::seconds(3) ? 1 : 0;
      comm.allreduce(&more, &more, 1, DataType::Int32, ReduceOp::Min);
    }
    seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (const auto& l : comm.links()) caught[r] += l.checksum_errors;
  });  // the communicators are destroyed here: what they held back is reported now
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << events[r] << " events, " << reported[r] << " reported, " << caught[r] << " caught in "
                  << seconds[r] << " s");
    REQUIRE(caught[r] > 0);
    CHECK(reported[r] == caught[r]);
    // The first at once, then at most one a second, and one with the rest at the end (without
    // the coalescing: one per agreement that saw a mismatch, hundreds here).
    CHECK(events[r] >= 1);
    CHECK(static_cast<double>(events[r]) <= 2.0 + seconds[r]);
  }
}

TEST_CASE("without checksums, a counter storm on a link with no route around turns checksums on, results stay exact",
          "[integrity][health][nvml]") {
  // Two ranks, checksums off, link 0-1 mapped to a fake NVLink. The link storms between
  // collectives #6 and #7; the agreement at #8 must fence it, finds no plan, and switches
  // checksums on instead. From 4 s after connecting the link also flips bits: only the
  // checksums keep the later results exact.
  const test::FakeNvmlState nvml("ringfence-noplan", "count 1\nlinks 1\n");
  const int n = 2;
  std::barrier sync(n, [&]() noexcept {});
  std::atomic<std::size_t> wrong{0}, caught{0};
  std::vector<std::string> no_plan(n);
  CommOptions o = agreeing_every(2, "flip:rate=1e-4,link=0-1,seed=3,at_ms=4000", "noplan-nvml");
  o.checksum = false;
  o.health.nvml_library = RINGFENCE_FAKE_NVML_PATH;
  o.health_link_map = "0-1=nvml:0:0";
  const auto start = std::chrono::steady_clock::now();
  const std::string error = test::run_ranks(n, o, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    comm.on_health_event([&, r](const HealthEvent& e) {
      if (e.kind == EventKind::NoPlan) no_plan[r] = e.detail;
    });
    std::vector<std::int32_t> buf(10000);
    for (int it = 0; it < 24; ++it) {
      if (it == 6) {
        sync.arrive_and_wait();
        if (r == 0) nvml.write("count 1\nlinks 1\nd0.l0.crc_flit 250000\nd0.l0.replay 7\n");
        sync.arrive_and_wait();
      }
      if (it == 12) {  // the link starts flipping bits
        sync.arrive_and_wait();
        std::this_thread::sleep_until(start + std::chrono::milliseconds(4500));
      }
      test::fill_input(DataType::Int32, ReduceOp::Sum, comm.rank(), n, buf.data(), buf.size());
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Int32, ReduceOp::Sum);
      wrong += test::count_wrong(DataType::Int32, ReduceOp::Sum, n, buf.data(), buf.size());
    }
    T_CHECK(comm.fenced_links().empty());
    for (const auto& l : comm.links()) caught += l.checksum_errors;
  });
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  REQUIRE(caught > 0);  // damaged chunks arrived and were caught
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE_THAT(no_plan[static_cast<std::size_t>(r)], Catch::Contains("checksums switched on"));
  }
}


TEST_CASE("a job that only sends and receives over a corrupting link: checksum_errors events as it runs, counts exact, the link named",
          "[integrity][health][p2p]") {
  // No collective, so no agreement ever runs: the point-to-point calls themselves must report
  // the chunks that arrived damaged (the first at once, then at most one event a second per
  // link, the rest when the communicator is destroyed) and warn, naming the link.
  const test::TempDir dir("ringfence-p2p-events");
  CommOptions o = agreeing_every(64, "flip:rate=2e-6,link=0-1,seed=9", "p2p-events");
  o.log_file = (dir.path() / "log").string();
  std::vector<std::uint64_t> during(2, 0), events(2, 0), reported(2, 0), caught(2, 0);
  std::vector<double> seconds(2, 0.0);
  std::atomic<std::size_t> wrong{0};
  const std::string error = test::run_ranks(2, o, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    const int peer = 1 - comm.rank();
    comm.on_health_event([&, r](const HealthEvent& e) {
      if (e.kind != EventKind::ChecksumErrors) return;
      CHECK((e.a == 0 && e.b == 1));
      ++events[r];
      reported[r] += e.count;
    });
    const auto start = std::chrono::steady_clock::now();
    const std::size_t count = 50000;
    std::vector<float> out(count), in(count);
    for (int it = 0; it < 1500; ++it) {  // about 2 s on an idle 2-core VM: coalescing shows
      const auto first = static_cast<std::size_t>(it) * 3;
      test::fill_pattern(DataType::Float32, comm.rank(), out.data(), count, first);
      comm.group_start();
      comm.send(out.data(), count, DataType::Float32, peer);
      comm.recv(in.data(), count, DataType::Float32, peer);
      comm.group_end();
      wrong += test::count_wrong_pattern(DataType::Float32, peer, in.data(), count, first);
    }
    during[r] = reported[r];
    seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (const auto& l : comm.links()) caught[r] += l.checksum_errors;
  });  // destroyed here: what was held back is reported now
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  std::ifstream in(dir.path() / "log");
  const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  INFO(log);
  std::size_t warnings = 0;
  for (std::size_t at = 0; (at = log.find("arrived corrupted in point-to-point calls", at)) != std::string::npos; ++at) ++warnings;
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << events[r] << " events, " << during[r] << " reported while running, " << reported[r] << " in all, " << caught[r] << " caught in "
                  << seconds[r] << " s");
    REQUIRE(caught[r] > 0);  // the link really damaged chunks both ways
    CHECK(during[r] > 0);    // reported while the job ran, not only at its end
    CHECK(reported[r] == caught[r]);
    CHECK(static_cast<double>(events[r]) <= 2.0 + seconds[r]);  // without coalescing: one per damaged call
    CHECK_THAT(log, Catch::Contains(fmt::format("link 0-1: ")) && Catch::Contains(fmt::format("from rank {} arrived corrupted", 1 - r)));
  }
  // One per rank at once, then at most one per link every 10 s.
  CHECK(warnings >= 2);
  CHECK(static_cast<double>(warnings) <= 2.0 * (1.0 + std::max(seconds[0], seconds[1]) / 10.0));
}
