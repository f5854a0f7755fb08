// Agreements paced by time (CommOptions::health_agree_min_interval, src/health/agreement_round.cpp):
// quiet, fast collectives space the fence agreements out up to 16 times
// `health_agree_every`, identically on every rank; collectives slower than the interval, or no
// interval, keep the count; a vote (here a corrupting link) brings it back at once, and the
// link is still fenced with exact results.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/thread_ranks.hpp"
#include "support/verifiable.hpp"

using namespace ringfence;

namespace {

// What one rank saw: its agreements and pace after the run, the largest pace seen before the
// first re-plan, wrong elements over all calls.
struct PaceRun {
  std::string error;
  std::vector<std::uint64_t> agreements, every, widest_before_replan, epochs;
  std::vector<std::vector<std::uint64_t>> agreed_at;  // per rank: the calls (1-based) after which an agreement had run
  std::vector<std::vector<LinkId>> fenced;
  std::size_t wrong = 0;
};

// `n` thread ranks run `calls` exact Int64 sum allreduces of `count` elements with `o`; the last
// rank reaches its first collective `late_start` after the others.
PaceRun run_paced(int n, const CommOptions& o, int calls, std::size_t count, std::chrono::milliseconds late_start = {}) {
  PaceRun run;
  run.agreements.resize(n);
  run.every.resize(n);
  run.widest_before_replan.resize(n);
  run.epochs.resize(n);
  run.fenced.resize(n);
  run.agreed_at.resize(n);
  std::atomic<std::size_t> wrong{0};
  run.error = test::run_ranks(n, o, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    std::vector<std::int64_t> buf(count);
    std::uint64_t widest = 0;
    if (comm.rank() == n - 1) std::this_thread::sleep_for(late_start);
    for (int c = 0; c < calls; ++c) {
      test::fill_input(DataType::Int64, ReduceOp::Sum, comm.rank(), n, buf.data(), buf.size());
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Int64, ReduceOp::Sum);
      wrong += test::count_wrong(DataType::Int64, ReduceOp::Sum, n, buf.data(), buf.size());
      const HealthSnapshot now = comm.health();
      if (comm.epoch() == 0) widest = std::max(widest, now.agree_every);
      if (now.agreements > run.agreed_at[r].size()) run.agreed_at[r].push_back(static_cast<std::uint64_t>(c) + 1);
    }
    const HealthSnapshot h = comm.health();
    run.agreements[r] = h.agreements;
    run.every[r] = h.agree_every;
    run.widest_before_replan[r] = widest;
    run.epochs[r] = comm.epoch();
    run.fenced[r] = comm.fenced_links();
  });
  run.wrong = wrong;
  return run;
}

CommOptions paced(int every, std::chrono::microseconds interval) {
  CommOptions o;
  o.timeout = std::chrono::seconds(20);
  o.health_agree_every = every;
  o.health_agree_min_interval = interval;
  o.host_id = "agreement-pace";
  return o;
}

// Every rank finished with exact results, the same agreement count and the same pace (the
// count to the next agreement): had they differed, the ranks would have agreed at different calls.
void require_paced(const PaceRun& run, std::uint64_t every, std::uint64_t agreements) {
  INFO(run.error);
  REQUIRE(run.error.empty());
  REQUIRE(run.wrong == 0);
  for (std::size_t r = 0; r < run.every.size(); ++r) {
    INFO("rank " << r);
    REQUIRE(run.every[r] == every);
    REQUIRE(run.agreements[r] == agreements);
    REQUIRE(run.epochs[r] == 0);
    REQUIRE(run.agreed_at[r] == run.agreed_at[0]);
  }
}

// Agreements at `first`, then every `stretch` collectives, up to `calls`.
std::vector<std::uint64_t> schedule(std::vector<std::uint64_t> first, std::uint64_t stretch, std::uint64_t calls) {
  while (first.back() + stretch <= calls) first.push_back(first.back() + stretch);
  return first;
}

}  // namespace

TEST_CASE("quiet collectives faster than the interval space agreements out, 16 times the count at most, alike on every rank",
          "[agreement][pace]") {
  // 10 s between agreements: 8 calls always take less, so every quiet agreement after the first
  // stretches as far as it may. The first falls due at call 8 and starts the clock (the time
  // since setup is not the collectives'), the second at 16, then every 8 x 16 = 128: calls 8,
  // 16, 144, ..., 912.
  const PaceRun run = run_paced(2, paced(8, std::chrono::seconds(10)), 1000, 8);
  require_paced(run, 128, 9);
  REQUIRE(run.agreed_at[0] == schedule({8, 16}, 128, 1000));
}

TEST_CASE("a rank late to its first collective does not shorten the paced stretches", "[agreement][pace]") {
  // The other rank waits 700 ms in its first collective: longer than 16 x 8 calls may take at a
  // 10 s interval (625 ms per 8). Timed from setup, that wait read as slow collectives and the
  // first stretch fell short (CI saw 9 agreements where 8 were due, on a loaded machine).
  const PaceRun run = run_paced(2, paced(8, std::chrono::seconds(10)), 1000, 8, std::chrono::milliseconds(700));
  require_paced(run, 128, 9);
  REQUIRE(run.agreed_at[0] == schedule({8, 16}, 128, 1000));
}

TEST_CASE("without an interval, or with collectives slower than it, agreements keep the count", "[agreement][pace]") {
  // 0: by count only; 1 us: 8 collectives take longer than that on any machine.
  for (const auto interval : {std::chrono::microseconds(0), std::chrono::microseconds(1)}) {
    INFO("interval " << interval.count() << " us");
    require_paced(run_paced(2, paced(8, interval), 1000, 8), 8, 125);
  }
}

TEST_CASE("with agreements off the snapshot says 0 agreements and 0 collectives to the next", "[agreement][pace]") {
  // health_agree_every 0 (RINGFENCE_HEALTH_AGREE_EVERY=0) or health off: nothing is paced, and
  // `agree_every` must not claim an agreement every call.
  CommOptions every_zero = paced(0, std::chrono::microseconds(0));
  CommOptions health_off = paced(8, std::chrono::microseconds(0));
  health_off.health_enabled = false;
  for (const CommOptions& o : {every_zero, health_off}) {
    INFO("agree_every " << o.health_agree_every << ", health " << o.health_enabled);
    require_paced(run_paced(2, o, 50, 8), 0, 0);
  }
}

TEST_CASE("a link that corrupts once agreements are spaced out is fenced, and the count drops back at its vote",
          "[agreement][pace][integrity]") {
  // Link 0-1 flips bits only from its 1500th write: by then the agreements run every 64
  // collectives (4 x 16). The checksums catch every flip (results exact), the next agreement
  // fences the link, and the fence's votes (its cool-down) hold the count at 4.
  const int n = 4;
  CommOptions o = paced(4, std::chrono::seconds(10));
  o.chunk_bytes = 4096;
  o.fault = "flip:rate=1e-4,link=0-1,after=1500,seed=3";
  const PaceRun run = run_paced(n, o, 400, 4096);
  INFO(run.error);
  REQUIRE(run.error.empty());
  REQUIRE(run.wrong == 0);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(run.widest_before_replan[r] == 64);
    REQUIRE(run.fenced[r] == std::vector<LinkId>{LinkId{0, 1}});
    REQUIRE(run.every[r] == 4);
  }
}
