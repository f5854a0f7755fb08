#pragma once
// The fence agreement's side of the health ledger (ledger.hpp): at init it finds the links of
// this job still in quarantine there; in every agreement it votes to keep them fenced (a vote
// like any other, so every rank fences them together); after the decision it appends the
// fences, moves and readmissions this rank is the one to record.
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "../comm/context.hpp"
#include "agreement.hpp"

namespace ringfence::detail {

class LedgerKeeper {
 public:
  /// Reads CommOptions::health_ledger (when set) and logs what it found: the links of this job
  /// in quarantine and how long they have left. A ledger that cannot be read is a warning.
  void load(const CommContext& ctx);
  /// True until the first agreement has voted on the quarantined links (it is then due at once).
  bool first_vote_pending() const noexcept { return pending_; }
  /// Fence votes for the links still in quarantine at `now`.
  void vote(Ballot& ballot);
  /// Why this rank wanted `l` fenced (its policy's reason, slow-link figures), for the ledger.
  void note_reason(LinkId l, std::string why) { reasons_[l] = std::move(why); }
  /// Appends the decision's fences, moves and readmissions of links of this rank: each end that
  /// proposed the fence writes its reason; the lower end writes when it had none. Fences that
  /// only the ledger asked for are not written again (that would extend their quarantine).
  void record(const CommContext& ctx, const Decision& d);

 private:
  struct Quarantine {
    LinkId link;
    double until = 0;  // unix seconds
  };
  void append(const CommContext& ctx, LinkId l, const char* action, std::string evidence) noexcept;

  std::vector<std::string> ids_;  // endpoint identity by rank
  std::vector<Quarantine> quarantined_;
  std::map<LinkId, std::string> reasons_;  // since the last agreement
  bool pending_ = false;
};

}  // namespace ringfence::detail
