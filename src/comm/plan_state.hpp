#pragma once
// The communicator's plan: the ring, the relays that carry its fenced hops through a third
// rank, the agreed fence list, the links no plan avoids, the pairs moved to a fallback transport
// and the epoch, plus what derives from them alone (positions, whether the double binary tree
// may run). Pure data: wiring the lanes to a plan is the lanes' job.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <ringfence/plan.hpp>
#include <vector>

namespace ringfence::detail {

/// A ring order and the relays that carry its fenced hops.
struct Plan {
  std::vector<int> ring;
  std::vector<Relay> relays;
};

/// How to route around fenced links when both a relay and a re-ordered ring would.
enum class RoutePreference {
  KeepOrder,  ///< relays first: the logical ring and every element's reduction order stay (bit-identical results)
  Cheapest,   ///< a re-ordered ring first: the same bytes as before over other links, where a relay adds a copy on the relay rank and doubles the traffic of two links
};

/// The plan for `fenced` links starting from ring `base` of `n` ranks: relays or a re-ordered
/// ring as `prefer` says, the other when the first does not exist; nullopt when neither avoids
/// the links. Every rank computes the same plan from the same list.
std::optional<Plan> plan_around(const std::vector<int>& base, const std::vector<LinkId>& fenced, int n,
                                RoutePreference prefer = RoutePreference::KeepOrder);

class PlanState {
 public:
  /// This rank and the home ring (the unfenced plan, which the caller installs).
  void start(int rank, std::vector<int> home_ring) {
    rank_ = rank;
    home_ring_ = std::move(home_ring);
  }
  /// Installs `plan` (between collectives: every connection is quiescent for this rank).
  void install(Plan plan);
  /// Replaces the fence list (an agreement's or a shrink's, identical on every rank).
  void set_fenced(std::vector<LinkId> fenced) { fenced_ = std::move(fenced); }
  /// Links that must be fenced but no plan avoids: they stay in use, checksummed.
  void add_unroutable(const std::vector<LinkId>& links) { unroutable_.insert(unroutable_.end(), links.begin(), links.end()); }
  /// A pair an agreement moved to a fallback transport (the device lane follows it when built later).
  void note_moved(LinkId l) { moved_.push_back(l); }
  /// +1 per re-plan or move.
  void bump_epoch() noexcept { ++epoch_; }

  const std::vector<int>& ring() const noexcept { return ring_; }
  const std::vector<int>& home_ring() const noexcept { return home_ring_; }
  const std::vector<Relay>& relays() const noexcept { return relays_; }
  const std::vector<LinkId>& fenced() const noexcept { return fenced_; }
  const std::vector<LinkId>& unroutable() const noexcept { return unroutable_; }
  std::uint64_t epoch() const noexcept { return epoch_; }
  /// Whether the double binary tree may run: no relays and no tree edge over a fenced link.
  bool tree_allowed() const noexcept { return tree_allowed_; }
  bool is_fenced(int a, int b) const noexcept;
  /// Whether an agreement found no plan around `l` (add_unroutable).
  bool is_unroutable(LinkId l) const noexcept { return std::find(unroutable_.begin(), unroutable_.end(), l) != unroutable_.end(); }
  bool was_moved(LinkId l) const noexcept;
  /// Ring position of rank `r` (ring size when absent).
  int position_of(int r) const noexcept;
  /// This rank's ring position.
  int position() const noexcept { return position_of(rank_); }

 private:
  int rank_ = 0;
  std::vector<int> ring_;       // current ring order
  std::vector<int> home_ring_;  // the unfenced plan: each host's ranks contiguous
  std::vector<Relay> relays_;   // fenced ring hops carried through a third rank
  std::vector<LinkId> fenced_;  // agreed fenced links
  std::vector<LinkId> unroutable_;
  std::vector<LinkId> moved_;
  std::uint64_t epoch_ = 0;
  bool tree_allowed_ = false;
};

}  // namespace ringfence::detail
