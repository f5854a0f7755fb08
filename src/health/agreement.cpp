#include "agreement.hpp"

#include <algorithm>

#include "../quarter_octaves.hpp"

namespace ringfence::detail {

void Ballot::resize(int n) {
  n_ = n;
  cells_.assign(4 * static_cast<std::size_t>(n) * static_cast<std::size_t>(n) + 1, 0);  // + the pace byte
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

void Ballot::report_speed(int rank, int peer, int bucket, int transport) noexcept {
  const std::size_t nn = static_cast<std::size_t>(n_) * static_cast<std::size_t>(n_);
  const std::size_t at = static_cast<std::size_t>(rank * n_ + peer);
  cells_[2 * nn + at] = static_cast<std::uint8_t>(std::clamp(bucket + 1, 1, 255));
  cells_[3 * nn + at] = static_cast<std::uint8_t>(std::clamp(transport + 1, 1, 255));
}

int Ballot::speed_of(int rank, int peer) const noexcept {
  const std::size_t nn = static_cast<std::size_t>(n_) * static_cast<std::size_t>(n_);
  return static_cast<int>(cells_[2 * nn + static_cast<std::size_t>(rank * n_ + peer)]) - 1;
}

int Ballot::speed_transport_of(int rank, int peer) const noexcept {
  const std::size_t nn = static_cast<std::size_t>(n_) * static_cast<std::size_t>(n_);
  return static_cast<int>(cells_[3 * nn + static_cast<std::size_t>(rank * n_ + peer)]) - 1;
}

void Ballot::report_pace(int bucket) noexcept { cells_.back() = static_cast<std::uint8_t>(std::clamp(bucket + 1, 1, 255)); }

int Ballot::pace() const noexcept { return static_cast<int>(cells_.back()) - 1; }

bool Ballot::any_vote() const noexcept {
  const auto votes = cells_.begin() + static_cast<std::ptrdiff_t>(n_) * n_;
  return std::any_of(cells_.begin(), votes, [](std::uint8_t v) { return v != 0; });
}

int pace_shift(int pace_bucket, std::uint64_t min_interval_ns) noexcept {
  if (pace_bucket < 0 || min_interval_ns == 0) return 0;
  return std::clamp((quarter_octaves(min_interval_ns) - pace_bucket) / 4, 0, kMaxPaceShift);
}

SpeedVerdict judge_speeds(const Ballot& b, const std::vector<int>& gap_buckets) {
  SpeedVerdict v;
  const int n = b.ranks();
  struct Directed {
    int from, to, bucket, transport;
  };
  std::vector<Directed> measured;
  for (int r = 0; r < n; ++r)
    for (int p = 0; p < n; ++p)
      if (p != r && b.speed_of(r, p) >= 0) measured.push_back({r, p, b.speed_of(r, p), b.speed_transport_of(r, p)});
  // The measured speeds of each transport, sorted once.
  std::vector<std::vector<int>> by_transport;
  for (const Directed& d : measured) {
    const auto t = static_cast<std::size_t>(std::max(d.transport, 0));
    if (by_transport.size() <= t) by_transport.resize(t + 1);
    by_transport[t].push_back(d.bucket);
  }
  for (auto& b : by_transport) std::sort(b.begin(), b.end());
  std::vector<Directed> suspects;  // far below the median: a slow link, or one end of a slow rank
  for (const Directed& d : measured) {
    const auto t = static_cast<std::size_t>(std::max(d.transport, 0));
    const std::vector<int>& buckets = by_transport[t];
    if (buckets.size() < 3) continue;
    // Links of one transport differ by nature (shared memory within a core's cache or across
    // cores, a NUMA hop): a lone slow link must be far below the slower quarter of them, not
    // only below the median, to be told from the slower half of a healthy job.
    const int lower = buckets[std::max<std::size_t>(1, buckets.size() / 4)];
    const int median = buckets[buckets.size() / 2];
    const int gap = gap_buckets.empty() ? 7 : gap_buckets[std::min(t, gap_buckets.size() - 1)];
    if (median - d.bucket >= gap) suspects.push_back(d);
    if (lower - d.bucket >= gap) v.slow.push_back(SlowLink{LinkId::of(d.from, d.to), d.from, d.bucket, lower, median});
  }
  // A rank at the end of two or more suspect links to different peers is the slow one.
  for (int r = 0; r < n; ++r) {
    std::vector<int> peers;
    for (const Directed& d : suspects)
      if (d.from == r || d.to == r) {
        const int other = d.from == r ? d.to : d.from;
        if (std::find(peers.begin(), peers.end(), other) == peers.end()) peers.push_back(other);
      }
    if (peers.size() >= 2) v.stragglers.push_back(r);
  }
  std::erase_if(v.slow, [&](const SlowLink& s) {
    return std::any_of(v.stragglers.begin(), v.stragglers.end(), [&](int r) { return s.link.a == r || s.link.b == r; });
  });
  // One entry per link (both directions may be slow): the slower direction.
  std::sort(v.slow.begin(), v.slow.end(), [](const SlowLink& x, const SlowLink& y) {
    return x.link.a != y.link.a ? x.link.a < y.link.a : x.link.b != y.link.b ? x.link.b < y.link.b : x.bucket < y.bucket;
  });
  v.slow.erase(std::unique(v.slow.begin(), v.slow.end(), [](const SlowLink& x, const SlowLink& y) { return x.link == y.link; }),
               v.slow.end());
  return v;
}

Decision decide(const Ballot& b, const PlanState& plan, const std::vector<LinkId>& slow) {
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
  const bool only_slow =
      !d.added.empty() && std::all_of(d.added.begin(), d.added.end(), [&](const LinkId& l) { return contains(slow, l); });
  std::optional<Plan> next = plan_around(d.readmitted.empty() ? plan.ring() : plan.home_ring(), all, n,
                                         only_slow ? RoutePreference::Cheapest : RoutePreference::KeepOrder);
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

DigestVerdict judge_digests(const std::vector<std::uint64_t>& digests, const std::vector<int>& ring) {
  DigestVerdict v;
  const std::size_t n = digests.size();
  std::uint64_t common = 0;
  std::size_t best = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto votes = static_cast<std::size_t>(std::count(digests.begin(), digests.end(), digests[i]));
    if (votes > best) best = votes, common = digests[i];
  }
  v.agree = best == n;
  if (v.agree) return v;
  v.majority = 2 * best > n;
  if (v.majority)
    for (std::size_t r = 0; r < n; ++r)
      if (digests[r] != common) v.ranks.push_back(static_cast<int>(r));
  for (std::size_t i = 0; i < ring.size() && ring.size() == n; ++i) {
    const auto from = static_cast<std::size_t>(ring[i]), to = static_cast<std::size_t>(ring[(i + 1) % n]);
    if (digests[from] != digests[to]) v.links.push_back(LinkId::of(static_cast<int>(from), static_cast<int>(to)));
  }
  return v;
}

}  // namespace ringfence::detail
