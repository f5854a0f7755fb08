#pragma once
// The fence agreement's decision (design §5.4, docs/health.md "Agreement"): every rank fills a
// ballot with what its links' policies say, a checksummed max-allreduce gives every rank the
// same ballot, and `decide` turns it into the same fences, moves, readmissions and plan on every
// rank. `decide` is pure: votes and the current plan in, the decision out.
#include <cstdint>
#include <optional>
#include <ringfence/plan.hpp>
#include <utility>
#include <vector>

#include "../comm/plan_state.hpp"

namespace ringfence::detail {

/// A vote on a link: the largest vote any rank casts wins (a fence dominates a readmission).
enum class Vote : std::uint8_t { None = 0, Readmit = 1, Fence = 2 };

/// Four n x n byte matrices reduced with max over every rank: the votes on link (a, b), a < b,
/// at [a][b] of the first; in row r of the second, the transport (index + 1, 0 = none) each of
/// r's links may move to instead of being fenced (CommOptions::fallbacks); in row r of the third,
/// the speed of r's writes to each peer since the last agreement (WriteSpeeds::fast_end bucket + 1,
/// 0 = too few writes) and of the fourth, the transport those writes went over (index + 1).
/// Each rank fills only its own rows of the last three, so the max gives everyone all of them.
/// One byte after them paces the agreements (`report_pace`): the largest wins.
class Ballot {
 public:
  /// Sized for `n` ranks, empty.
  void resize(int n);
  /// Empties every cell (allocates nothing).
  void clear() noexcept;
  /// Casts `v` on link `l` (the largest vote on a link stays).
  void vote(LinkId l, Vote v) noexcept;
  /// Says that `rank`'s link to `peer` may move to transport `index` (-1: nowhere).
  void offer_fallback(int rank, int peer, int index) noexcept;
  /// The vote on `l` after the reduction.
  Vote vote_of(LinkId l) const noexcept;
  /// The transport `rank`'s link to `peer` may move to (-1: none).
  int fallback_of(int rank, int peer) const noexcept;
  /// Says that `rank`'s writes to `peer` went at speed bucket `bucket` (WriteSpeeds) over
  /// transport `transport` (registry index).
  void report_speed(int rank, int peer, int bucket, int transport) noexcept;
  /// The speed bucket of `rank`'s writes to `peer` (-1: not measured), and their transport.
  int speed_of(int rank, int peer) const noexcept;
  int speed_transport_of(int rank, int peer) const noexcept;
  /// Says how long `health_agree_every` collectives took on this rank since the last agreement,
  /// as quarter-octaves of nanoseconds (quarter_octaves.hpp); the reduction keeps the slowest
  /// rank's figure.
  void report_pace(int bucket) noexcept;
  /// That figure after the reduction (-1: no rank reported one).
  int pace() const noexcept;
  /// Whether any rank voted on any link (a fence, a cool-down still served, a readmission).
  bool any_vote() const noexcept;
  /// The cells, for the allreduce.
  std::uint8_t* data() noexcept { return cells_.data(); }
  const std::uint8_t* data() const noexcept { return cells_.data(); }
  std::size_t bytes() const noexcept { return cells_.size(); }
  int ranks() const noexcept { return n_; }

 private:
  int n_ = 0;
  std::vector<std::uint8_t> cells_;
};

/// What every rank does after an agreement.
struct Decision {
  /// Links to fence whose two ends offered the same fallback: moved there instead, the plan unchanged.
  std::vector<std::pair<LinkId, int>> moves;
  /// Links fenced by this agreement (in the new plan).
  std::vector<LinkId> added;
  /// Fenced links readmitted (probation served, both ends clean).
  std::vector<LinkId> readmitted;
  /// Links that must be fenced but that no relay or ring avoids: they stay in use, degraded,
  /// with checksums on every rank from now on.
  std::vector<LinkId> unroutable;
  /// With `unroutable`: the whole fence list that no plan avoided (for the message).
  std::vector<LinkId> unplannable;
  /// The new plan when it changes (then `fenced` is its fence list).
  std::optional<Plan> plan;
  std::vector<LinkId> fenced;
};

/// A link far slower than the job's other links on its transport (`judge_speeds`).
struct SlowLink {
  LinkId link;
  int writer = -1;  ///< the end whose writes were slow
  int bucket = 0;   ///< their speed (WriteSpeeds bucket)
  int lower = 0;    ///< the lower quartile of the transport's measured links
  int median = 0;   ///< their median
};

/// What the write speeds in a reduced ballot say: slow links, and ranks at the end of slow
/// links to two or more different peers (stragglers: the rank is slow, not its links).
struct SpeedVerdict {
  std::vector<SlowLink> slow;
  std::vector<int> stragglers;
};

/// Judges every measured directed link against the links on its transport (at least three
/// measured, else there is no comparison to speak of): a link is slow when `gap_buckets[t]`
/// (t its transport; the last entry for any beyond) quarter-octaves or more below the lower
/// quartile of them (links of one transport differ by
/// nature: within or across a core's cache, a NUMA hop); a rank is a straggler when links to
/// two or more different peers are that far below the median. A straggler's links are not
/// slow links. Pure: every rank gets the same verdict from the same ballot.
SpeedVerdict judge_speeds(const Ballot& b, const std::vector<int>& gap_buckets);

/// Decides from the reduced ballot `b` and the current plan: fence votes on links neither fenced
/// nor known unroutable become moves (both ends offered the same fallback) or fences;
/// readmission votes on fenced links readmit them. Fences prefer relays over `ring` (the
/// reduction order stays, results stay bit-identical); when links come back the plan starts
/// again from `home_ring`, so a job whose fences all healed runs its original plan. Without any
/// plan the new fences become `unroutable` (readmissions still apply when a plan without them exists).
/// When every new fence is one of the `slow` links (fenced for speed, nothing was corrupted),
/// the cheapest route wins instead: a re-ordered ring before relays (RoutePreference::Cheapest).
Decision decide(const Ballot& b, const PlanState& plan, const std::vector<LinkId>& slow = {});

/// Agreements are paced by time as well as by count: when `health_agree_every` collectives took
/// less than `min_interval_ns` on every rank (their slowest figure, `pace_bucket`), the next
/// agreement waits 2^k times as many collectives, k the whole octaves between the two (0 with
/// no figure, -1, or no interval, 0). Pure: every rank gets the same k from the same ballot.
/// At most 16 times: a link that turns bad just after a paced agreement waits at most that
/// many times longer, in collectives, however slow they then become.
inline constexpr int kMaxPaceShift = 4;
int pace_shift(int pace_bucket, std::uint64_t min_interval_ns) noexcept;

/// Who a result-digest comparison blames (`judge_digests`).
struct DigestVerdict {
  bool agree = true;             ///< every rank's output has the same digest
  bool majority = false;         ///< more than half the ranks share one digest
  std::vector<int> ranks;        ///< with a majority: the ranks whose digest differs from it
  std::vector<LinkId> links;     ///< ring links whose two ends' outputs differ
};

/// Names ranks only when a strict majority of ranks agree (the others are named); without one
/// no rank is named. Links: the edges of `ring` (the collective's rank order) whose ends' digests
/// differ. A value damaged on one hop of a ring travels on to the ranks downstream, so the ranks
/// holding it form an arc: the damaging hop is where the arc starts, one of the named links
/// (the other is where it ends). Pure: every rank gets the same verdict.
DigestVerdict judge_digests(const std::vector<std::uint64_t>& digests, const std::vector<int>& ring);

}  // namespace ringfence::detail
