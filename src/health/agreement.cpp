#include "agreement.hpp"

#include <algorithm>

namespace ringfence::detail {

void Ballot::resize(int n) {
  n_ = n;
  cells_.assign(2 * static_cast<std::size_t>(n) * static_cast<std::size_t>(n), 0);
}

void Ballot::clear() noexcept { std::fill(cells_.begin(), cells_.end(), std::uint8_t{0}); }

void Ballot::vote(LinkId l, Vote v) noexcept {
  std::uint8_t& slot = cells_[static_cast<std::size_t>(l.a * n_ + l.b)];
  slot = std::max(slot, static_cast<std::uint8_t>(v));
}

void Ballot::offer_fallback(int rank, int peer, int index) noexcept {
  const std::size_t nn = static_cast<std::size_t>(n_) * static_cast<std::size_t>(n_);
  cells_[nn + static_cast<std::size_t>(rank * n_ + peer)] = static_cast<std::uint8_t>(index + 1);
}

Vote Ballot::vote_of(LinkId l) const noexcept { return static_cast<Vote>(cells_[static_cast<std::size_t>(l.a * n_ + l.b)]); }

int Ballot::fallback_of(int rank, int peer) const noexcept {
  const std::size_t nn = static_cast<std::size_t>(n_) * static_cast<std::size_t>(n_);
  return static_cast<int>(cells_[nn + static_cast<std::size_t>(rank * n_ + peer)]) - 1;
}

Decision decide(const Ballot& b, const PlanState& plan) {
  Decision d;
  const int n = b.ranks();
  auto contains = [](const std::vector<LinkId>& v, LinkId l) { return std::find(v.begin(), v.end(), l) != v.end(); };
  for (int a = 0; a < n; ++a)
    for (int c = a + 1; c < n; ++c) {
      const LinkId l{a, c};
      const Vote v = b.vote_of(l);
      const bool fenced = plan.is_fenced(a, c);
      if (v == Vote::Fence && !fenced && !contains(plan.unroutable(), l)) {
        const int to_a = b.fallback_of(a, c), to_c = b.fallback_of(c, a);
        if (to_a >= 0 && to_a == to_c)
          d.moves.emplace_back(l, to_a);
        else
          d.added.push_back(l);
      }
      if (v == Vote::Readmit && fenced) d.readmitted.push_back(l);
    }
  if (d.added.empty() && d.readmitted.empty()) return d;

  // The fence list without the readmitted links, plus the new fences.
  auto kept = [&] {
    std::vector<LinkId> out;
    for (const LinkId& l : plan.fenced())
      if (!contains(d.readmitted, l)) out.push_back(l);
    return out;
  };
  std::vector<LinkId> all = kept();
  all.insert(all.end(), d.added.begin(), d.added.end());
  std::optional<Plan> next = plan_around(d.readmitted.empty() ? plan.ring() : plan.home_ring(), all, n);
  if (!next) {
    d.unroutable = d.added;
    d.unplannable = all;
    d.added.clear();
    if (d.readmitted.empty()) return d;
    // Readmissions still apply (the plan without the unroutable links changes nothing else).
    all = kept();
    next = plan_around(plan.home_ring(), all, n);
    if (!next) {
      d.readmitted.clear();
      return d;
    }
  }
  d.plan = std::move(next);
  d.fenced = std::move(all);
  return d;
}

}  // namespace ringfence::detail
