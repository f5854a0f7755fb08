#include <ringfence/plan.hpp>
#include <algorithm>
#include <random>
#include <set>
#include <string>

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

namespace {
// Placements on host `host` with GPU bus ids "g<k>" for gpu[r] >= 0 (unknown for -1) and the
// given undirected NVLinks between GPUs (named by the first GPU only, as one end may be).
std::vector<RankPlacement> placements(const std::vector<std::string>& host, const std::vector<int>& gpu,
                                      const std::vector<std::pair<int, int>>& nvlinks) {
  std::vector<RankPlacement> out(host.size());
  for (std::size_t r = 0; r < host.size(); ++r) {
    out[r].host = host[r];
    if (gpu[r] >= 0) out[r].gpu = "g" + std::to_string(gpu[r]);
    for (const auto& [a, b] : nvlinks)
      if (gpu[r] == a) out[r].nvlinks.push_back("g" + std::to_string(b));
  }
  return out;
}

// Joined neighbours in `order` (ranks of `p`): a cycle when `closed` and more than 2 ranks.
int joined_hops(const std::vector<RankPlacement>& p, const std::vector<int>& order, bool closed) {
  const std::size_t n = order.size();
  int hops = 0;
  for (std::size_t i = 0; i + 1 < n; ++i) hops += gpu_joined(p, order[i], order[i + 1]);
  if (closed && n > 2) hops += gpu_joined(p, order.back(), order.front());
  return hops;
}

// Brute force: per host (hosts by lowest rank), the lexicographically first order of its ranks
// with the most joined neighbours (a cycle when there is one host).
std::vector<int> brute_home_ring(const std::vector<RankPlacement>& p) {
  std::vector<std::string> hosts;
  for (const auto& x : p)
    if (std::find(hosts.begin(), hosts.end(), x.host) == hosts.end()) hosts.push_back(x.host);
  std::vector<int> ring;
  for (const auto& h : hosts) {
    std::vector<int> g;
    for (int r = 0; r < static_cast<int>(p.size()); ++r)
      if (p[static_cast<std::size_t>(r)].host == h) g.push_back(r);
    std::vector<int> best;
    int best_hops = -1;
    do {
      if (const int hops = joined_hops(p, g, hosts.size() == 1); hops > best_hops) best_hops = hops, best = g;
    } while (std::next_permutation(g.begin(), g.end()));
    ring.insert(ring.end(), best.begin(), best.end());
  }
  return ring;
}
}  // namespace

TEST_CASE("the home ring keeps each host's ranks together and ascending without GPU facts", "[plan][topology]") {
  REQUIRE(plan_home_ring({}).empty());
  REQUIRE(plan_home_ring(placements({"a", "a", "a", "a", "a"}, {-1, -1, -1, -1, -1}, {})) == std::vector<int>{0, 1, 2, 3, 4});
  REQUIRE(plan_home_ring(placements({"a", "b", "a", "b"}, {-1, -1, -1, -1}, {})) == std::vector<int>{0, 2, 1, 3});
  REQUIRE(plan_home_ring(placements({"b", "a", "b", "c", "a"}, {0, 1, 2, 3, 4}, {})) == std::vector<int>{0, 2, 1, 4, 3});
}

TEST_CASE("the home ring makes NVLink-joined and same-GPU ranks neighbours", "[plan][topology]") {
  // Bridges 0-2 and 1-3 (named by one end only): the ring uses both (0, 1, 2, 3 uses none).
  const auto bridged = placements({"a", "a", "a", "a"}, {0, 1, 2, 3}, {{0, 2}, {3, 1}});
  REQUIRE(plan_home_ring(bridged) == std::vector<int>{0, 1, 3, 2});
  REQUIRE(gpu_joined(bridged, 3, 1));
  REQUIRE(gpu_joined(bridged, 1, 3));
  REQUIRE_FALSE(gpu_joined(bridged, 0, 1));
  REQUIRE_FALSE(gpu_joined(bridged, 0, 0));
  REQUIRE_FALSE(gpu_joined(bridged, 0, 4));
  // Two ranks per GPU: each GPU's ranks side by side.
  REQUIRE(plan_home_ring(placements({"a", "a", "a", "a"}, {0, 1, 0, 1}, {})) == std::vector<int>{0, 1, 3, 2});
  // A chain of NVLinks 0-3-1-4-2: the ring follows it.
  REQUIRE(plan_home_ring(placements({"a", "a", "a", "a", "a"}, {0, 1, 2, 3, 4}, {{0, 3}, {3, 1}, {1, 4}, {4, 2}})) ==
          std::vector<int>{0, 2, 4, 1, 3});
  // A rank whose GPU is unknown joins nobody; an NVLink across hosts is not a hop inside a host.
  auto unknown = placements({"a", "a", "a"}, {0, -1, 0}, {});
  REQUIRE_FALSE(gpu_joined(unknown, 0, 1));
  REQUIRE(gpu_joined(unknown, 0, 2));
  const auto split = placements({"a", "a", "a", "b", "b"}, {0, 1, 2, 0, 1}, {{0, 2}});
  REQUIRE_FALSE(gpu_joined(split, 0, 3));
  REQUIRE(plan_home_ring(split) == std::vector<int>{0, 2, 1, 3, 4});
  // Across hosts a host's block is a path and may start at any of its ranks: a chain 1-0-2.
  REQUIRE(plan_home_ring(placements({"a", "a", "a", "b"}, {0, 1, 2, 9}, {{0, 1}, {0, 2}})) == std::vector<int>{1, 0, 2, 3});
}

TEST_CASE("gpu_path tells one GPU, direct NVLinks, NVSwitches and PCIe apart", "[plan][topology]") {
  using Kind = GpuPath::Kind;
  const RankPlacement a{"h", "g0", {"g1", "g1", "sw"}, 0};
  const RankPlacement b{"h", "g1", {}, 0};
  const RankPlacement c{"h", "g2", {}, 0};
  REQUIRE(gpu_path(a, b) == GpuPath{Kind::NvLink, 2});  // two links, named by one end only
  REQUIRE(gpu_path(b, a) == GpuPath{Kind::NvLink, 2});
  REQUIRE(gpu_path(a, a) == GpuPath{Kind::SameGpu, 0});
  REQUIRE(gpu_path(b, c) == GpuPath{Kind::Pcie, 0});
  REQUIRE(gpu_path(b, RankPlacement{"h", "", {}, 18}) == GpuPath{});            // a GPU not known
  REQUIRE(gpu_path(b, RankPlacement{"other", "g1", {}, 0}) == GpuPath{});       // another host
  // An HGX board: every GPU's links end at NVSwitches; the narrower end counts.
  const RankPlacement s18{"h", "g3", {}, 18}, s12{"h", "g4", {}, 12};
  REQUIRE(gpu_path(s18, s12) == GpuPath{Kind::NvSwitch, 12});
  REQUIRE(gpu_path(s12, s18) == GpuPath{Kind::NvSwitch, 12});
  REQUIRE(gpu_path(s18, c) == GpuPath{Kind::Pcie, 0});  // only one end on the switches
  REQUIRE(gpu_path(RankPlacement{"h", "g5", {"g3"}, 18}, s18) == GpuPath{Kind::NvLink, 1});  // a direct link wins
  // The planner: ranks 0 and 2 on the switches, 1 and 3 not: 0 and 2 become neighbours (the
  // closing hop), where rank order joins nobody.
  const std::vector<RankPlacement> mixed{{"h", "g0", {}, 4}, {"h", "g1", {}, 0}, {"h", "g2", {}, 4}, {"h", "g3", {}, 0}};
  REQUIRE(gpu_joined(mixed, 0, 2));
  REQUIRE_FALSE(gpu_joined(mixed, 0, 1));
  REQUIRE(plan_home_ring(mixed) == std::vector<int>{0, 1, 3, 2});
  // Every GPU on the switches: all pairs joined, so rank order.
  const std::vector<RankPlacement> hgx{{"h", "g0", {}, 18}, {"h", "g1", {}, 18}, {"h", "g2", {}, 18}, {"h", "g3", {}, 18}};
  REQUIRE(plan_home_ring(hgx) == std::vector<int>{0, 1, 2, 3});
}

TEST_CASE("the home ring has the most joined neighbours and is the lexicographically first such ring", "[plan][topology]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 6);  // 2..7 ranks
    const int gpus = 1 + static_cast<int>(rng() % static_cast<unsigned>(n));
    std::vector<std::string> host(static_cast<std::size_t>(n));
    std::vector<int> gpu(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
      host[static_cast<std::size_t>(r)] = trial % 3 == 0 ? std::string(1, static_cast<char>('a' + rng() % 2)) : "a";
      gpu[static_cast<std::size_t>(r)] = static_cast<int>(rng() % static_cast<unsigned>(gpus + 1)) - 1;  // -1 = unknown
    }
    std::vector<std::pair<int, int>> links;
    for (int a = 0; a < gpus; ++a)
      for (int b = a + 1; b < gpus; ++b)
        if (rng() % 3 == 0) links.emplace_back(rng() % 2 ? a : b, rng() % 2 ? b : a);
    auto p = placements(host, gpu, links);
    if (trial % 4 == 1)  // some GPUs on NVSwitches too
      for (auto& r : p) r.nvswitch_links = rng() % 2 ? 0u : 1u + static_cast<unsigned>(rng() % 18);
    const std::vector<int> ring = plan_home_ring(p);
    INFO("trial " << trial << " n=" << n);
    REQUIRE(ring == brute_home_ring(p));
  }
}

TEST_CASE("a host of more than 16 ranks is ordered by a greedy walk", "[plan][topology]") {
  // 18 ranks, GPU k bridged to GPU k+9: nearest joined rank first, else the smallest left.
  std::vector<int> gpu(18);
  std::vector<std::pair<int, int>> links;
  for (int k = 0; k < 18; ++k) gpu[static_cast<std::size_t>(k)] = k;
  for (int k = 0; k < 9; ++k) links.emplace_back(k, k + 9);
  const std::vector<int> ring = plan_home_ring(placements(std::vector<std::string>(18, "h"), gpu, links));
  std::vector<int> expected;
  for (int k = 0; k < 9; ++k) expected.insert(expected.end(), {k, k + 9});
  REQUIRE(ring == expected);
}
