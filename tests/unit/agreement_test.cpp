// The fence agreement's decision (src/health/agreement.hpp): votes in, moves, fences,
// readmissions and the next plan out. Pure: no ranks, no links. The ballots of several ranks
// are max-reduced here as the agreement's allreduce would.
#include <algorithm>
#include <vector>

#include "health/agreement.hpp"
#include "write_speeds.hpp"
#include "support/catch.hpp"

using namespace ringfence;
using ringfence::detail::Ballot;
using ringfence::detail::Decision;
using ringfence::detail::PlanState;
using ringfence::detail::Vote;

namespace {

// The element-wise max of every rank's ballot (what the agreement's allreduce computes).
Ballot reduce(const std::vector<Ballot>& ballots) {
  Ballot out = ballots.front();
  for (const Ballot& b : ballots)
    for (std::size_t i = 0; i < out.bytes(); ++i)
      out.data()[i] = std::max(out.data()[i], b.data()[i]);
  return out;
}

Ballot empty(int n) {
  Ballot b;
  b.resize(n);
  return b;
}

// A plan of `n` ranks in rank order with `fenced` installed around (as an earlier agreement
// would have left it).
PlanState plan_with(int n, const std::vector<LinkId>& fenced = {}) {
  PlanState p;
  std::vector<int> home(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) home[static_cast<std::size_t>(i)] = i;
  p.start(0, home);
  p.install(detail::Plan{home, {}});
  if (!fenced.empty()) {
    auto next = detail::plan_around(home, fenced, n);
    REQUIRE(next.has_value());
    p.set_fenced(fenced);
    p.install(*next);
  }
  return p;
}

}  // namespace

TEST_CASE("agreement: nothing proposed decides nothing", "[agreement]") {
  const Decision d = detail::decide(empty(4), plan_with(4));
  CHECK(d.moves.empty());
  CHECK(d.added.empty());
  CHECK(d.readmitted.empty());
  CHECK(d.unroutable.empty());
  CHECK_FALSE(d.plan.has_value());
}

TEST_CASE("agreement: one rank's fence proposal fences the link with a relay, the ring unchanged", "[agreement]") {
  std::vector<Ballot> ballots(4, empty(4));
  ballots[1].vote(LinkId::of(1, 2), Vote::Fence);  // only rank 1 saw it
  const Decision d = detail::decide(reduce(ballots), plan_with(4));
  REQUIRE(d.added == std::vector<LinkId>{LinkId{1, 2}});
  REQUIRE(d.plan.has_value());
  CHECK(d.plan->ring == std::vector<int>{0, 1, 2, 3});  // relays keep the ring (and the reduction order)
  REQUIRE(d.plan->relays.size() == 1);
  CHECK(d.plan->relays[0].from == 1);
  CHECK(d.plan->relays[0].to == 2);
  CHECK(d.plan->relays[0].via != 1);
  CHECK(d.plan->relays[0].via != 2);
  CHECK(d.fenced == std::vector<LinkId>{LinkId{1, 2}});
}

TEST_CASE("agreement: conflicting proposals resolve alike on every rank, a fence over a readmission", "[agreement]") {
  // 0-1 is fenced; rank 0 finds it fit to come back, rank 1 still wants it fenced; rank 2
  // proposes 2-3 while rank 3 says nothing about it.
  const PlanState plan = plan_with(4, {LinkId{0, 1}});
  std::vector<Ballot> ballots(4, empty(4));
  ballots[0].vote(LinkId{0, 1}, Vote::Readmit);
  ballots[1].vote(LinkId{0, 1}, Vote::Fence);
  ballots[2].vote(LinkId{2, 3}, Vote::Fence);
  const Decision d = detail::decide(reduce(ballots), plan);
  CHECK(d.readmitted.empty());  // the fence vote dominates
  CHECK(d.added == std::vector<LinkId>{LinkId{2, 3}});
  REQUIRE(d.plan.has_value());
  CHECK(d.fenced == std::vector<LinkId>{LinkId{0, 1}, LinkId{2, 3}});
  // Every rank reduces the same ballots in its own order and decides the same.
  std::vector<Ballot> reversed(ballots.rbegin(), ballots.rend());
  const Decision e = detail::decide(reduce(reversed), plan);
  CHECK(e.added == d.added);
  CHECK(e.fenced == d.fenced);
  CHECK(e.plan->ring == d.plan->ring);
  CHECK(e.plan->relays.size() == d.plan->relays.size());
}

TEST_CASE("agreement: a link both ends may move goes to the fallback instead of being fenced", "[agreement]") {
  std::vector<Ballot> ballots(3, empty(3));
  ballots[0].vote(LinkId{0, 1}, Vote::Fence);
  ballots[0].offer_fallback(0, 1, 1);  // both ends name transport 1
  ballots[1].offer_fallback(1, 0, 1);
  ballots[2].offer_fallback(2, 0, 1);  // other links' offers do not matter
  const Decision d = detail::decide(reduce(ballots), plan_with(3));
  REQUIRE(d.moves.size() == 1);
  CHECK(d.moves[0].first == LinkId{0, 1});
  CHECK(d.moves[0].second == 1);
  CHECK(d.added.empty());
  CHECK_FALSE(d.plan.has_value());  // the plan, and so the bytes, stay
}

TEST_CASE("agreement: ends that offer different fallbacks (or none) fence the link", "[agreement]") {
  for (const int other : {-1, 0, 2}) {
    std::vector<Ballot> ballots(3, empty(3));
    ballots[1].vote(LinkId{0, 1}, Vote::Fence);
    ballots[0].offer_fallback(0, 1, 1);
    ballots[1].offer_fallback(1, 0, other);
    const Decision d = detail::decide(reduce(ballots), plan_with(3));
    CHECK(d.moves.empty());
    CHECK(d.added == std::vector<LinkId>{LinkId{0, 1}});
  }
}

TEST_CASE("agreement: a link no relay or ring avoids stays in use as unroutable", "[agreement]") {
  SECTION("two ranks") {
    Ballot b = empty(2);
    b.vote(LinkId{0, 1}, Vote::Fence);
    const PlanState plan = plan_with(2);
    const Decision d = detail::decide(b, plan);
    CHECK(d.unroutable == std::vector<LinkId>{LinkId{0, 1}});
    CHECK(d.unplannable == std::vector<LinkId>{LinkId{0, 1}});
    CHECK(d.added.empty());
    CHECK_FALSE(d.plan.has_value());
  }
  SECTION("a rank cut off from both others") {
    Ballot b = empty(3);
    b.vote(LinkId{0, 2}, Vote::Fence);
    b.vote(LinkId{1, 2}, Vote::Fence);
    const Decision d = detail::decide(b, plan_with(3));
    CHECK(d.unroutable == std::vector<LinkId>{LinkId{0, 2}, LinkId{1, 2}});
    CHECK_FALSE(d.plan.has_value());
  }
  SECTION("a known unroutable link is not proposed again") {
    PlanState plan = plan_with(2);
    plan.add_unroutable({LinkId{0, 1}});
    Ballot b = empty(2);
    b.vote(LinkId{0, 1}, Vote::Fence);
    const Decision d = detail::decide(b, plan);
    CHECK(d.unroutable.empty());
    CHECK(d.added.empty());
    CHECK_FALSE(d.plan.has_value());
  }
}

TEST_CASE("agreement: probation served readmits a fenced link and the plan starts from the home ring", "[agreement]") {
  const PlanState plan = plan_with(4, {LinkId{1, 2}});
  REQUIRE_FALSE(plan.relays().empty());
  Ballot b = empty(4);
  b.vote(LinkId{1, 2}, Vote::Readmit);
  const Decision d = detail::decide(b, plan);
  CHECK(d.readmitted == std::vector<LinkId>{LinkId{1, 2}});
  CHECK(d.added.empty());
  REQUIRE(d.plan.has_value());
  CHECK(d.plan->ring == std::vector<int>{0, 1, 2, 3});
  CHECK(d.plan->relays.empty());
  CHECK(d.fenced.empty());
}

TEST_CASE("agreement: a readmission vote on a healthy link and a fence vote on a fenced one change nothing", "[agreement]") {
  const PlanState plan = plan_with(4, {LinkId{0, 1}});
  Ballot b = empty(4);
  b.vote(LinkId{2, 3}, Vote::Readmit);  // not fenced: nothing to readmit
  b.vote(LinkId{0, 1}, Vote::Fence);    // still serving its cool-down
  const Decision d = detail::decide(b, plan);
  CHECK(d.readmitted.empty());
  CHECK(d.added.empty());
  CHECK_FALSE(d.plan.has_value());
}

TEST_CASE("agreement: readmissions still apply when the new fences have no route", "[agreement]") {
  const PlanState plan = plan_with(3, {LinkId{0, 1}});
  Ballot b = empty(3);
  b.vote(LinkId{0, 1}, Vote::Readmit);
  b.vote(LinkId{0, 2}, Vote::Fence);
  b.vote(LinkId{1, 2}, Vote::Fence);
  const Decision d = detail::decide(b, plan);
  CHECK(d.unroutable == std::vector<LinkId>{LinkId{0, 2}, LinkId{1, 2}});
  CHECK(d.unplannable == std::vector<LinkId>{LinkId{0, 2}, LinkId{1, 2}});
  CHECK(d.readmitted == std::vector<LinkId>{LinkId{0, 1}});
  REQUIRE(d.plan.has_value());
  CHECK(d.plan->ring == std::vector<int>{0, 1, 2});
  CHECK(d.fenced.empty());
}

TEST_CASE("agreement: the ballot keeps the largest vote and each rank's fallback offers", "[agreement]") {
  Ballot b = empty(3);
  b.vote(LinkId{0, 2}, Vote::Fence);
  b.vote(LinkId{0, 2}, Vote::Readmit);
  CHECK(b.vote_of(LinkId{0, 2}) == Vote::Fence);
  CHECK(b.vote_of(LinkId{0, 1}) == Vote::None);
  b.offer_fallback(2, 0, 3);
  CHECK(b.fallback_of(2, 0) == 3);
  CHECK(b.fallback_of(0, 2) == -1);
  b.clear();
  CHECK(b.vote_of(LinkId{0, 2}) == Vote::None);
  CHECK(b.fallback_of(2, 0) == -1);
}

// ---- write speeds (judge_speeds) ----

namespace {
// A 4-rank ring's ballots: rank r wrote to r + 1 at speed bucket `bucket[r]`, over transport 0.
Ballot ring_speeds(const std::vector<int>& bucket) {
  const int n = static_cast<int>(bucket.size());
  std::vector<Ballot> ballots(static_cast<std::size_t>(n), empty(n));
  for (int r = 0; r < n; ++r) ballots[static_cast<std::size_t>(r)].report_speed(r, (r + 1) % n, bucket[static_cast<std::size_t>(r)], 0);
  return reduce(ballots);
}
}  // namespace

TEST_CASE("agreement: every rank sees every rank's write speeds after the reduction", "[agreement][slow]") {
  const Ballot b = ring_speeds({40, 41, 42, 43});
  for (int r = 0; r < 4; ++r) {
    CHECK(b.speed_of(r, (r + 1) % 4) == 40 + r);
    CHECK(b.speed_transport_of(r, (r + 1) % 4) == 0);
    CHECK(b.speed_of(r, (r + 2) % 4) == -1);  // not measured
  }
}

TEST_CASE("agreement: a link far below its transport's median is slow, one near it is not", "[agreement][slow]") {
  // Quarter-octave buckets: 7 below the median is about 3x slower.
  const auto v = detail::judge_speeds(ring_speeds({44, 37, 44, 45}), std::vector<int>{7});
  REQUIRE(v.slow.size() == 1);
  CHECK(v.slow[0].link == LinkId{1, 2});
  CHECK(v.slow[0].writer == 1);
  CHECK(v.slow[0].bucket == 37);
  CHECK(v.slow[0].median == 44);
  CHECK(v.stragglers.empty());
  CHECK(detail::judge_speeds(ring_speeds({44, 38, 44, 45}), std::vector<int>{7}).slow.empty());  // 6 below: within 3x
  CHECK(detail::judge_speeds(ring_speeds({44, 44, 44, 44}), std::vector<int>{7}).slow.empty());
}

TEST_CASE("agreement: links are compared only with links on the same transport, and need three of them", "[agreement][slow]") {
  // Two fast shm links and two slow tcp links: neither transport has a median of three.
  std::vector<Ballot> ballots(4, empty(4));
  ballots[0].report_speed(0, 1, 60, 0);
  ballots[1].report_speed(1, 2, 60, 0);
  ballots[2].report_speed(2, 3, 30, 1);
  ballots[3].report_speed(3, 0, 30, 1);
  CHECK(detail::judge_speeds(reduce(ballots), std::vector<int>{7}).slow.empty());
  // Two ranks: one link, nothing to compare it with.
  std::vector<Ballot> two(2, empty(2));
  two[0].report_speed(0, 1, 10, 0);
  two[1].report_speed(1, 0, 60, 0);
  CHECK(detail::judge_speeds(reduce(two), std::vector<int>{7}).slow.empty());
}

TEST_CASE("agreement: a rank whose links to two different peers are slow is a straggler, its links are not fenced", "[agreement][slow]") {
  // Rank 2 is slow: its write to 3 and rank 1's write to it.
  const auto v = detail::judge_speeds(ring_speeds({50, 40, 40, 50}), std::vector<int>{7});
  CHECK(v.slow.empty());
  CHECK(v.stragglers == std::vector<int>{2});
  // Both directions of one link slow (an 8-rank ring and the reverse of 1->2): still one link,
  // not a straggler.
  std::vector<Ballot> ballots(8, empty(8));
  for (int r = 0; r < 8; ++r) ballots[static_cast<std::size_t>(r)].report_speed(r, (r + 1) % 8, 50, 0);
  ballots[2].report_speed(2, 1, 40, 0);
  ballots[1].report_speed(1, 2, 40, 0);
  const auto w = detail::judge_speeds(reduce(ballots), std::vector<int>{7});
  REQUIRE(w.slow.size() == 1);
  CHECK(w.slow[0].link == LinkId{1, 2});
  CHECK(w.stragglers.empty());
}

TEST_CASE("write speeds: quarter-octave buckets, and a fast end that stalled or cold writes do not move", "[agreement][slow]") {
  using detail::WriteSpeeds;
  // 256 KiB in 100 us is 2.6 GB/s; a bucket's lower edge is within 19 % below the speed.
  for (const double gbps : {0.1, 0.3, 1.0, 2.6, 10.0, 100.0}) {
    const auto ns = static_cast<std::uint64_t>(262144.0 / gbps);
    const int b = WriteSpeeds::bucket_of(262144, ns);
    CAPTURE(gbps, b);
    CHECK(WriteSpeeds::gbps_of(b) <= gbps * 1.01);
    CHECK(WriteSpeeds::gbps_of(b) > gbps * 0.78);
    CHECK(WriteSpeeds::bucket_of(262144, ns / 3) - b >= 6);  // 3x faster: 6.3 quarter-octaves up
  }
  WriteSpeeds w;
  CHECK(w.fast_end(1) == -1);
  for (int i = 0; i < 10; ++i) w.add(262144, 100000);  // 2.6 GB/s
  for (int i = 0; i < 15; ++i) w.add(262144, 4000000);  // most of them preempted for 4 ms
  CHECK(w.fast_end(8) == WriteSpeeds::bucket_of(262144, 100000));
  CHECK(w.fast_end(26) == -1);  // too few writes
  WriteSpeeds throttled;
  for (int i = 0; i < 30; ++i) throttled.add(262144, 2600000);  // every write at 0.1 GB/s
  CHECK(throttled.fast_end(8) == WriteSpeeds::bucket_of(262144, 2600000));
  w.clear();
  CHECK(w.writes == 0);
}

TEST_CASE("agreement: a link fenced for speed alone is routed around by a re-ordered ring, not a relay", "[agreement][slow]") {
  std::vector<Ballot> ballots(4, empty(4));
  ballots[0].vote(LinkId{1, 2}, Vote::Fence);
  const Ballot b = reduce(ballots);
  // Fenced for speed: no relay (it would add a copy and double two links' traffic).
  const Decision slow = detail::decide(b, plan_with(4), {LinkId{1, 2}});
  REQUIRE(slow.plan.has_value());
  CHECK(slow.plan->relays.empty());
  CHECK(slow.plan->ring != std::vector<int>{0, 1, 2, 3});
  for (std::size_t i = 0; i < 4; ++i) CHECK(LinkId::of(slow.plan->ring[i], slow.plan->ring[(i + 1) % 4]) != LinkId{1, 2});
  // The same fence for corruption keeps the ring (bit-identical results) with a relay.
  const Decision corrupt = detail::decide(b, plan_with(4));
  REQUIRE(corrupt.plan.has_value());
  CHECK(corrupt.plan->ring == std::vector<int>{0, 1, 2, 3});
  CHECK(corrupt.plan->relays.size() == 1);
}

TEST_CASE("digests: a rank is named only when a strict majority agrees, and links where outputs differ are named", "[agreement][digest]") {
  using ringfence::detail::judge_digests;
  const std::uint64_t A = 0x1'0000'aaaa, B = 0x1'0000'bbbb, C = 0x1'0000'cccc;
  SECTION("all alike") {
    const auto v = judge_digests({A, A, A}, {0, 1, 2});
    CHECK(v.agree);
    CHECK(v.ranks.empty());
    CHECK(v.links.empty());
  }
  SECTION("one rank off a strict majority: it is named, with the two ring links into and out of it") {
    const auto v = judge_digests({A, A, B, A}, {0, 1, 2, 3});
    CHECK_FALSE(v.agree);
    CHECK(v.majority);
    CHECK(v.ranks == std::vector<int>{2});
    CHECK(v.links == std::vector<LinkId>{LinkId{1, 2}, LinkId{2, 3}});
  }
  SECTION("every digest different: no rank is named, every ring link is") {
    const auto v = judge_digests({A, B, C}, {0, 1, 2});
    CHECK_FALSE(v.majority);
    CHECK(v.ranks.empty());
    CHECK(v.links == std::vector<LinkId>{LinkId{0, 1}, LinkId{1, 2}, LinkId{0, 2}});
  }
  SECTION("a tie is no majority; the ring order (not rank order) decides which links are named") {
    // Ring 0-2-1-3: ranks 0,2 hold A and 1,3 hold B; a value damaged on hop 2->1 reached 1 and 3.
    const auto v = judge_digests({A, B, A, B}, {0, 2, 1, 3});
    CHECK_FALSE(v.majority);
    CHECK(v.ranks.empty());
    CHECK(v.links == std::vector<LinkId>{LinkId{1, 2}, LinkId{0, 3}});
  }
}

TEST_CASE("agreement pace: quarter-octave figures, the slowest rank's wins, and the stretch is whole octaves up to 16x",
          "[agreement][pace]") {
  using detail::pace_shift;
  using detail::quarter_octaves;
  // Four steps per octave, the two bits below the top one placing a value within it.
  REQUIRE(quarter_octaves(0) == 0);
  REQUIRE(quarter_octaves(1) == 0);
  REQUIRE(quarter_octaves(2) == 4);
  REQUIRE(quarter_octaves(4) == 8);
  REQUIRE(quarter_octaves(5) == 9);
  REQUIRE(quarter_octaves(6) == 10);
  REQUIRE(quarter_octaves(7) == 11);
  REQUIRE(quarter_octaves(8) == 12);
  REQUIRE(quarter_octaves(1'000'000) == 79);  // 2^19 x 1.91: octave 19, top quarter
  for (std::uint64_t v = 1; v < 100000; v = v * 3 / 2 + 1) REQUIRE(quarter_octaves(v) <= quarter_octaves(v + 1));
  // The write speeds' buckets are the same scale (KiB per ms, plus one).
  REQUIRE(detail::WriteSpeeds::bucket_of(1024 * 999, 1000000) == quarter_octaves(1000));

  // 64 calls in 40 us against 1 ms: 4 octaves apart (quarter-octaves 60 and 79) -> 16x.
  REQUIRE(pace_shift(quarter_octaves(40'000), 1'000'000) == 4);
  // 500 us: one octave -> 2x. 2 ms, or 1 ms itself: no stretch.
  REQUIRE(pace_shift(quarter_octaves(500'000), 1'000'000) == 1);
  REQUIRE(pace_shift(quarter_octaves(2'000'000), 1'000'000) == 0);
  REQUIRE(pace_shift(quarter_octaves(1'000'000), 1'000'000) == 0);
  // 1 us: 10 octaves, capped at 16x. No figure, or no interval: none.
  REQUIRE(pace_shift(quarter_octaves(1'000), 1'000'000) == detail::kMaxPaceShift);
  REQUIRE(pace_shift(-1, 1'000'000) == 0);
  REQUIRE(pace_shift(quarter_octaves(40'000), 0) == 0);

  // The reduction keeps the slowest rank's figure; no report reads -1.
  std::vector<Ballot> ranks(3, empty(3));
  REQUIRE(reduce(ranks).pace() == -1);
  ranks[0].report_pace(quarter_octaves(40'000));
  ranks[1].report_pace(quarter_octaves(700'000));
  ranks[2].report_pace(quarter_octaves(90'000));
  REQUIRE(reduce(ranks).pace() == quarter_octaves(700'000));
  // The pace byte is nobody's vote; a vote anywhere is seen.
  REQUIRE_FALSE(reduce(ranks).any_vote());
  ranks[2].vote(LinkId{1, 2}, Vote::Readmit);
  REQUIRE(reduce(ranks).any_vote());
  ranks[2].clear();
  ranks[2].offer_fallback(2, 0, 1);
  ranks[2].report_speed(2, 0, 40, 0);
  REQUIRE_FALSE(reduce(ranks).any_vote());
}
