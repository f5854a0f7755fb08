#include <ringfence/plan.hpp>
#include <set>

#include "support/catch.hpp"

using namespace ringfence;

namespace {
// Checks that `ring` is a permutation of 0..n-1 with no fenced neighbours (cyclically).
bool valid(const std::vector<int>& ring, int n, const std::vector<LinkId>& fenced) {
  if (static_cast<int>(ring.size()) != n) return false;
  if (std::set<int>(ring.begin(), ring.end()).size() != static_cast<std::size_t>(n)) return false;
  for (int i = 0; i < n && n > 1; ++i) {
    const LinkId l = LinkId::of(ring[i], ring[(i + 1) % n]);
    for (const auto& f : fenced)
      if (f == l) return false;
  }
  return true;
}
}  // namespace

TEST_CASE("with nothing fenced the ring is the rank order", "[plan]") {
  for (int n = 1; n <= 9; ++n) {
    const auto ring = plan_ring(n, {});
    REQUIRE(ring.has_value());
    for (int i = 0; i < n; ++i) REQUIRE((*ring)[i] == i);
  }
}

TEST_CASE("every single-link fence is planned around for 4..8 ranks", "[plan]") {
  for (int n = 4; n <= 8; ++n)
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b) {
        const std::vector<LinkId> fenced = {LinkId{a, b}};
        const auto ring = plan_ring(n, fenced);
        INFO("n=" << n << " fenced " << a << "-" << b);
        REQUIRE(ring.has_value());
        REQUIRE(valid(*ring, n, fenced));
      }
}

TEST_CASE("two and three ranks have no ring around a fenced link", "[plan]") {
  REQUIRE_FALSE(plan_ring(2, {LinkId{0, 1}}).has_value());
  REQUIRE_FALSE(plan_ring(3, {LinkId{1, 2}}).has_value());
  REQUIRE(plan_ring(3, {}).has_value());
}

TEST_CASE("a rank cut off from all but one peer leaves no ring", "[plan]") {
  // Rank 0 may only talk to rank 1: a ring needs two neighbours.
  REQUIRE_FALSE(plan_ring(5, {LinkId{0, 2}, LinkId{0, 3}, LinkId{0, 4}}).has_value());
  // Several fences that still allow a ring.
  const std::vector<LinkId> f = {LinkId{0, 1}, LinkId{2, 3}, LinkId{4, 5}, LinkId{1, 2}};
  const auto ring = plan_ring(6, f);
  REQUIRE(ring.has_value());
  REQUIRE(valid(*ring, 6, f));
}

TEST_CASE("relays carry a fenced hop through a healthy rank and keep the ring", "[plan][relay]") {
  const std::vector<int> ring4 = {0, 1, 2, 3};
  auto r = plan_relays(ring4, {LinkId{0, 1}});
  REQUIRE(r.has_value());
  REQUIRE(*r == std::vector<Relay>{Relay{0, 2, 1}});
  REQUIRE(plan_relays(ring4, {})->empty());
  // Three ranks: a ring cannot avoid the link, a relay can (2 forwards 0 -> 1).
  const std::vector<int> ring3 = {0, 1, 2};
  r = plan_relays(ring3, {LinkId{0, 1}});
  REQUIRE(r.has_value());
  REQUIRE(*r == std::vector<Relay>{Relay{0, 2, 1}});
  // Two ranks have nobody to relay through.
  REQUIRE_FALSE(plan_relays({0, 1}, {LinkId{0, 1}}).has_value());
  // A fenced link that is not a ring hop needs no relay.
  REQUIRE(plan_relays(ring4, {LinkId{0, 2}})->empty());
  // Every single fenced hop of rings of 3..8 ranks is relayed without sharing a directed link.
  for (int n = 3; n <= 8; ++n) {
    std::vector<int> ring(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) ring[static_cast<std::size_t>(i)] = i;
    for (int i = 0; i < n; ++i) {
      const int x = i, y = (i + 1) % n;
      const auto relays = plan_relays(ring, {LinkId::of(x, y)});
      INFO("n=" << n << " hop " << x << "->" << y);
      REQUIRE(relays.has_value());
      REQUIRE(relays->size() == 1);
      const Relay& rl = relays->front();
      REQUIRE(rl.from == x);
      REQUIRE(rl.to == y);
      REQUIRE(rl.via != x);
      REQUIRE(rl.via != y);
    }
  }
  // Relays whose paths would collide on a directed link are refused.
  REQUIRE_FALSE(plan_relays(ring3, {LinkId{0, 1}, LinkId{1, 2}}).has_value());
}
