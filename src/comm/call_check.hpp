#pragma once
// Call fingerprints (design §6, docs/failure-semantics.md): before a collective uses data it
// received, each rank compares its call with the nearest rank before it on the ring whose link
// to it is not fenced (and, in calls that receive from every rank, with each rank it receives
// from: `pair`), so mismatched calls are refused naming both ranks instead of mixing data.
// This part posts, settles and judges; what a verdict does to the communicator is the caller's.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "lane.hpp"

namespace ringfence::detail {

/// "allreduce(count=4, float32, sum)" and the like.
std::string describe(const CallFingerprint& f);

/// The fingerprint of a call (`post` fills in the number and the CRC); `op`/`root` -1 = none.
CallFingerprint make_fingerprint(CallKind kind, std::uint64_t count, DataType type, int op = -1, int root = -1) noexcept;

class CallChecker {
 public:
  /// Pairs the ranks for the plan `ring` (fenced links skipped, see `is_fenced`): which lane-0
  /// connection we check and which ranks check ours. The same pairs on every rank (same ring, same
  /// fence list). Between collectives only.
  template <class IsFenced>
  void wire(const std::vector<int>& ring, int rank, LaneState& lane0, IsFenced is_fenced) {
    from_ = nullptr;
    to_.clear();
    const std::size_t n = ring.size();
    for (std::size_t p = 0; p < n; ++p) {
      int source = -1;
      for (std::size_t d = 1; d < n && source < 0; ++d)
        if (const int q = ring[(p + n - d) % n]; !is_fenced(q, ring[p])) source = q;
      if (ring[p] == rank && source >= 0) from_ = &lane0.connection_to(source);
      if (source == rank) to_.push_back(&lane0.connection_to(ring[p]));
    }
    others_.clear();
    for (const int r : ring)
      if (r != rank && std::find(to_.begin(), to_.end(), &lane0.connection_to(r)) == to_.end()) others_.push_back(&lane0.connection_to(r));
  }

  /// Starts a collective: forgets the previous call's check.
  void reset() noexcept { check_ = CallCheck{}; }
  /// Posts `mine` (numbered `seq`) to the ranks that check it, over lane 0, carrying `carried`
  /// (a carried allreduce's input: `mine.carried` is set then).
  Status post(LaneState& lane0, CallFingerprint mine, std::uint64_t seq, Failure& failure,
              std::span<const std::byte> carried = {}) noexcept;
  /// Numbers `mine` (`seq`) and marks it carried, as `post` would, without posting it: the
  /// carried allreduce posts it itself, right before it waits (RingRunner::run_carried).
  void prepare(CallFingerprint mine, std::uint64_t seq, std::span<const std::byte> carried) noexcept;
  /// Whether this rank checks a neighbour's call (always in a two-rank job: fencing its only link
  /// fails the job). A carried allreduce needs it.
  bool checks() const noexcept { return from_ != nullptr; }
  /// Compares now, before the call moves data (for calls that cannot leave it to the executor);
  /// Ok at once when nothing is pending.
  Status settle(LaneState& lane0, Failure& failure) noexcept;
  /// Whether the executor may compare this call's fingerprints: every chunk it receives must
  /// come from the rank we check, so none is used before that rank's call is known to be ours.
  /// True for ring and chain schedules on one lane without relays; trees, one-shot and direct
  /// allreduce receive from every rank (unless there are only two), and extra lanes from links
  /// other than the checked one.
  bool can_defer(const LaneState& lane0, const RingCall& c, int lanes, int size) const noexcept {
    return check_.from && check_.from == lane0.left && lane0.relay_duties.count == 0 && lanes <= 1 && (!c.by_position || size == 2);
  }
  /// Whether the executor may compare this call's fingerprints sender by sender
  /// (CallCheck::pairwise) where `can_defer` says no: calls on one lane without relays that
  /// receive from other ranks than the checked one (one-shot, direct, trees; host memory).
  bool can_pair(const LaneState& lane0, const RingCall& c, int lanes, int size) const noexcept {
    return check_.from && lane0.relay_duties.count == 0 && lanes <= 1 && c.by_position && size > 2;
  }
  /// Whether the executor may compare an exchange's fingerprints (every rank sends to every
  /// rank: alltoall), sender by sender where there are more than two ranks (`pair`): lane 0
  /// carries no relay.
  bool can_defer_exchange(const LaneState& lane0) const noexcept { return check_.from && lane0.relay_duties.count == 0; }
  /// Makes the pending check pairwise: posts this call's fingerprint to the ranks that do not
  /// check ours too (`post` gave it to those that do), before any chunk leaves.
  Status pair(LaneState& lane0, Failure& failure) noexcept;
  /// The pending check, for the executor (RingCall::check).
  CallCheck* pending() noexcept { return &check_; }

  /// What a judged call found.
  struct Verdict {
    enum Kind { None, Damaged, Disagree } kind = None;
    Connection* from = nullptr;  ///< the connection whose fingerprint was judged
    CallFingerprint mine, theirs;
  };
  /// After the data phase (or when it failed): reads the fingerprint if it arrived and judges
  /// it once. A damaged or stale fingerprint is evidence against the link (its connection's
  /// checksum errors count it), not a disagreement.
  Verdict judge(const FlagBlock& flags) noexcept;

 private:
  Connection* from_ = nullptr;    // lane-0 connection whose fingerprint we check
  std::vector<Connection*> to_;   // lane-0 connections of the ranks that check ours
  std::vector<Connection*> others_;  // lane-0 connections of every other peer (pair)
  CallCheck check_;            // this collective's: posted, compared by the executor or settle()
};

}  // namespace ringfence::detail
