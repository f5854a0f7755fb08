// The fence agreement's decision (src/health/agreement.hpp): votes in, moves, fences,
// readmissions and the next plan out. Pure: no ranks, no links. The ballots of several ranks
// are max-reduced here as the agreement's allreduce would.
#include <algorithm>
#include <vector>

#include "health/agreement.hpp"
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
