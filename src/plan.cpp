#include <fmt/format.h>

#include <algorithm>
#include <ringfence/plan.hpp>
#include <ringfence/transport.hpp>

namespace ringfence {
namespace {

struct Search {
  int n;
  std::vector<std::vector<char>> ok;  // ok[x][y]: x and y may be neighbours
  std::vector<int> path;
  std::vector<char> used;
  long steps = 0;
  long max_steps;

  bool extend() {
    if (++steps > max_steps) return false;
    if (static_cast<int>(path.size()) == n) return n < 3 ? true : ok[path.back()][path.front()] != 0;
    const int last = path.back();
    for (int next = 0; next < n; ++next) {
      if (used[next] || !ok[last][next]) continue;
      used[next] = 1;
      path.push_back(next);
      if (extend()) return true;
      path.pop_back();
      used[next] = 0;
    }
    return false;
  }
};

}  // namespace

std::optional<std::vector<int>> plan_ring(int size, const std::vector<LinkId>& fenced, long max_steps) {
  if (size <= 0) return std::nullopt;
  Search s{size, std::vector<std::vector<char>>(size, std::vector<char>(size, 1)), {0}, std::vector<char>(size, 0), 0,
           max_steps};
  for (const LinkId& l : fenced)
    if (l.a >= 0 && l.b < size && l.a != l.b) s.ok[l.a][l.b] = s.ok[l.b][l.a] = 0;
  s.used[0] = 1;
  if (size == 1) return s.path;
  // Two ranks use their one link in both directions.
  if (size == 2) return s.ok[0][1] ? std::optional<std::vector<int>>(std::vector<int>{0, 1}) : std::nullopt;
  if (!s.extend()) return std::nullopt;
  return s.path;
}

RankPlacement placement_of(const PeerInfo& info) {
  return RankPlacement{info.host_id, info.gpu_bus_id, info.nvlink_bus_ids, info.nvswitch_links};
}

GpuPath gpu_path(const RankPlacement& a, const RankPlacement& b) {
  using Kind = GpuPath::Kind;
  if (a.host != b.host || a.gpu.empty() || b.gpu.empty()) return {};
  if (a.gpu == b.gpu) return {Kind::SameGpu, 0};
  auto named = [](const RankPlacement& p, const std::string& bus) {
    return static_cast<unsigned>(std::count(p.nvlinks.begin(), p.nvlinks.end(), bus));
  };
  if (const unsigned direct = std::max(named(a, b.gpu), named(b, a.gpu)); direct > 0) return {Kind::NvLink, direct};
  if (a.nvswitch_links > 0 && b.nvswitch_links > 0) return {Kind::NvSwitch, std::min(a.nvswitch_links, b.nvswitch_links)};
  return {Kind::Pcie, 0};
}

bool gpu_joined(const std::vector<RankPlacement>& ranks, int x, int y) {
  const int n = static_cast<int>(ranks.size());
  if (x < 0 || y < 0 || x >= n || y >= n || x == y) return false;
  const GpuPath::Kind k = gpu_path(ranks[static_cast<std::size_t>(x)], ranks[static_cast<std::size_t>(y)]).kind;
  return k == GpuPath::Kind::SameGpu || k == GpuPath::Kind::NvLink || k == GpuPath::Kind::NvSwitch;
}

namespace {

// Orders one host's ranks (`group`, ascending) so that the most neighbours are joined: a cycle
// when `closed` (one host), else a path. Exact for up to 16 ranks (dynamic programming over
// subsets: best[mask][last] = the most joined hops that can still be added to a walk that has
// visited `mask` and stands at `last`), then the lexicographically smallest optimal walk.
std::vector<int> order_group(const std::vector<RankPlacement>& ranks, const std::vector<int>& group, bool closed) {
  const std::size_t m = group.size();
  std::vector<std::vector<char>> joined(m, std::vector<char>(m, 0));
  bool any = false;
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < m; ++j)
      if (i != j && gpu_joined(ranks, group[i], group[j])) joined[i][j] = 1, any = true;
  if (!any || m <= 2) return group;
  std::vector<int> out;
  std::vector<char> used(m, 0);
  if (m > 16) {  // greedy: the smallest joined unvisited rank, else the smallest unvisited one
    std::size_t last = 0;
    used[0] = 1;
    out.push_back(group[0]);
    for (std::size_t k = 1; k < m; ++k) {
      std::size_t next = m;
      for (std::size_t j = 0; j < m && next == m; ++j)
        if (!used[j] && joined[last][j]) next = j;
      for (std::size_t j = 0; j < m && next == m; ++j)
        if (!used[j]) next = j;
      used[next] = 1;
      out.push_back(group[next]);
      last = next;
    }
    return out;
  }
  const std::size_t full = (std::size_t{1} << m) - 1;
  std::vector<signed char> best((full + 1) * m, -1);  // -1: not computed (unreachable state)
  auto at = [&](std::size_t mask, std::size_t last) -> signed char& { return best[mask * m + last]; };
  // Every state with the start visited; for a path any rank may start, so every mask.
  for (std::size_t mask = full + 1; mask-- > 1;) {
    if (closed && !(mask & 1)) continue;
    for (std::size_t last = 0; last < m; ++last) {
      if (!(mask >> last & 1)) continue;
      if (mask == full) {
        at(mask, last) = static_cast<signed char>(closed ? joined[last][0] : 0);
        continue;
      }
      int top = -1;
      for (std::size_t next = 0; next < m; ++next)
        if (!(mask >> next & 1)) top = std::max(top, joined[last][next] + at(mask | std::size_t{1} << next, next));
      at(mask, last) = static_cast<signed char>(top);
    }
  }
  std::size_t start = 0;
  if (!closed)
    for (std::size_t s = 1; s < m; ++s)
      if (at(std::size_t{1} << s, s) > at(std::size_t{1} << start, start)) start = s;
  std::size_t mask = std::size_t{1} << start, last = start;
  out.push_back(group[start]);
  while (mask != full) {
    for (std::size_t next = 0; next < m; ++next) {
      if (mask >> next & 1) continue;
      const std::size_t to = mask | std::size_t{1} << next;
      if (joined[last][next] + at(to, next) == at(mask, last)) {
        mask = to, last = next;
        out.push_back(group[next]);
        break;
      }
    }
  }
  return out;
}

}  // namespace

std::vector<int> plan_home_ring(const std::vector<RankPlacement>& ranks) {
  const int n = static_cast<int>(ranks.size());
  std::vector<std::vector<int>> groups;  // each host's ranks, ascending; hosts by lowest rank
  std::vector<char> placed(ranks.size(), 0);
  for (int r = 0; r < n; ++r) {
    if (placed[static_cast<std::size_t>(r)]) continue;
    groups.emplace_back();
    for (int q = r; q < n; ++q)
      if (ranks[static_cast<std::size_t>(q)].host == ranks[static_cast<std::size_t>(r)].host) {
        groups.back().push_back(q);
        placed[static_cast<std::size_t>(q)] = 1;
      }
  }
  std::vector<int> ring;
  ring.reserve(ranks.size());
  for (const auto& g : groups) {
    const std::vector<int> ordered = order_group(ranks, g, groups.size() == 1);
    ring.insert(ring.end(), ordered.begin(), ordered.end());
  }
  return ring;
}

std::optional<std::vector<Relay>> plan_relays(const std::vector<int>& ring, const std::vector<LinkId>& fenced) {
  const int n = static_cast<int>(ring.size());
  auto is_fenced = [&](int x, int y) { return std::find(fenced.begin(), fenced.end(), LinkId::of(x, y)) != fenced.end(); };
  std::vector<Relay> relays;
  std::vector<std::pair<int, int>> used;  // directed links carrying a stream
  auto take = [&](int x, int y) {
    if (std::find(used.begin(), used.end(), std::make_pair(x, y)) != used.end()) return false;
    used.emplace_back(x, y);
    return true;
  };
  if (n < 2) return relays;
  // Unfenced ring hops first: they keep their links.
  for (int i = 0; i < n; ++i) {
    const int x = ring[static_cast<std::size_t>(i)], y = ring[static_cast<std::size_t>((i + 1) % n)];
    if (n == 2 && i == 1) break;  // two ranks: one hop each way, both on link 0-1
    if (!is_fenced(x, y) && !take(x, y)) return std::nullopt;
  }
  for (int i = 0; i < n; ++i) {
    const int x = ring[static_cast<std::size_t>(i)], y = ring[static_cast<std::size_t>((i + 1) % n)];
    if (n == 2 && i == 1) break;
    if (!is_fenced(x, y)) continue;
    bool found = false;
    for (int z = 0; z < n && !found; ++z) {
      if (z == x || z == y || is_fenced(x, z) || is_fenced(z, y)) continue;
      if (std::find(used.begin(), used.end(), std::make_pair(x, z)) != used.end() ||
          std::find(used.begin(), used.end(), std::make_pair(z, y)) != used.end())
        continue;
      used.emplace_back(x, z);
      used.emplace_back(z, y);
      relays.push_back(Relay{x, z, y});
      found = true;
    }
    if (!found) return std::nullopt;
  }
  return relays;
}

std::string to_string(const std::vector<LinkId>& links) {
  std::string out;
  for (const auto& l : links) out += fmt::format("{}{}-{}", out.empty() ? "" : ", ", l.a, l.b);
  return out;
}

std::string to_string(const std::vector<Relay>& relays) {
  std::string out;
  for (const auto& r : relays) out += fmt::format("{}{}->{}->{}", out.empty() ? "" : ", ", r.from, r.via, r.to);
  return out;
}

}  // namespace ringfence
