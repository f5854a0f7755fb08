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

}  // namespace ringfence
