#include "plan_state.hpp"

#include <algorithm>
#include <ringfence/schedule.hpp>

namespace ringfence::detail {

std::optional<Plan> plan_around(const std::vector<int>& base, const std::vector<LinkId>& fenced, int n, RoutePreference prefer) {
  if (prefer == RoutePreference::Cheapest)
    if (auto reordered = plan_ring(n, fenced)) return Plan{std::move(*reordered), {}};
  if (auto relayed = plan_relays(base, fenced)) return Plan{base, std::move(*relayed)};
  if (auto reordered = plan_ring(n, fenced)) return Plan{std::move(*reordered), {}};
  return std::nullopt;
}

void PlanState::install(Plan plan) {
  ring_ = std::move(plan.ring);
  relays_ = std::move(plan.relays);
  // Trees name peers by ring position; they run only on plans without relays whose tree edges
  // avoid every fenced link.
  const int n = static_cast<int>(ring_.size());
  tree_allowed_ = relays_.empty();
  for (int t = 0; t < 2 && tree_allowed_; ++t)
    for (int p = 0; p < n && tree_allowed_; ++p) {
      const int parent = double_tree_node(t, p, n).parent;
      if (parent >= 0 && is_fenced(ring_[static_cast<std::size_t>(p)], ring_[static_cast<std::size_t>(parent)])) tree_allowed_ = false;
    }
}

bool PlanState::is_fenced(int a, int b) const noexcept {
  const LinkId l = LinkId::of(a, b);
  return std::find(fenced_.begin(), fenced_.end(), l) != fenced_.end();
}

bool PlanState::was_moved(LinkId l) const noexcept { return std::find(moved_.begin(), moved_.end(), l) != moved_.end(); }

int PlanState::position_of(int r) const noexcept {
  return static_cast<int>(std::find(ring_.begin(), ring_.end(), r) - ring_.begin());
}

}  // namespace ringfence::detail
