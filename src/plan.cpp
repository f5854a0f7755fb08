#include <fmt/format.h>

#include <algorithm>
#include <ringfence/plan.hpp>

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
