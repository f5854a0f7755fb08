#pragma once
// One fence agreement at a collective boundary, around the pure `decide` (agreement.hpp):
// observe (this rank's links judged by their policies on what the transports saw since the last
// agreement, hardware counters too for mapped links) -> ballot -> a checksummed max-allreduce
// that gives every rank the same ballot -> `decide` -> apply (moves, fences with relays or a
// re-ordered ring, readmissions, links with no route kept in use with checksums). Also the
// result digests (design §5 "Integrity").
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "../comm/context.hpp"
#include "../comm/lanes.hpp"
#include "../comm/plan_state.hpp"
#include "../device/device_lane.hpp"
#include "../report_coalescer.hpp"
#include "agreement.hpp"
#include "ledger_keeper.hpp"
#include "link_mover.hpp"
#include "monitor.hpp"
#include "reporting.hpp"

namespace ringfence::detail {

class AgreementRound {
 public:
  /// `set_plan` installs a plan in the plan state and wires the lanes and fingerprints to it.
  AgreementRound(CommContext& ctx, Lanes& lanes, PlanState& plan, DeviceLane& device, LinkMover& mover, EventSink& events,
                 std::function<void(Plan)> set_plan)
      : ctx_(ctx), lanes_(lanes), plan_(plan), device_(device), mover_(mover), events_(events), set_plan_(std::move(set_plan)) {}
  ~AgreementRound() { stop(); }

  /// Sizes the ballot and digests for the job; `monitor` (may be null) judges the links.
  void start(std::unique_ptr<HealthMonitor> monitor);
  /// Stops the monitor's sampler and emits the checksum_errors counts held back (at most one
  /// event per link a second after its first); called from the communicator's destructor.
  void stop() noexcept;
  HealthMonitor* monitor() const noexcept { return monitor_.get(); }
  /// Whether agreements run: more than one rank, health on (CommOptions::health_enabled) and
  /// RINGFENCE_HEALTH_AGREE_EVERY > 0 (health_enabled).
  bool enabled() const noexcept;
  /// Counts a collective of `bytes` (its data size, the same on every rank); true when an
  /// agreement is due before it: `health_agree_every` collectives (times the pace the last
  /// agreement set, `pace_shift`) or `health_agree_bytes` bytes since the last one. Every rank
  /// counts the same calls against the same pace, so all agree at the same one.
  bool due(std::uint64_t bytes) noexcept;
  /// Runs one agreement (between collectives, on every rank at the same collective). Returns Ok
  /// or the failure of the internal allreduce; a move that fails throws.
  Status run(Failure& failure);
  /// Installs an agreed fence list at setup (shrink and split carry fences over): the same
  /// planning as an agreement, without the vote. Throws `LinkFencedError` when no plan avoids them.
  void install_fences(std::vector<LinkId> all);
  /// Every rank puts crc32c(output) in its slot and a max-allreduce gives everyone all digests;
  /// `judge_digests` names ranks (strict majority) or ring links, the same on every rank, and
  /// `CommOptions::digest_action` applies: `error` gets the message when the action is Error
  /// (or when Fence finds no route); Fence installs the fences. Returns the internal
  /// allreduce's failure, else Ok.
  Status compare_digests(const void* out, std::size_t bytes, Failure& failure, std::string& error);
  /// After a point-to-point call: emits checksum_errors events for chunks that arrived damaged
  /// since the last report (the first on a link at once, then at most one a second with the
  /// sum, as agreements do), so a job that only sends and receives, where no agreement ever
  /// runs, still names a corrupting link; with a warning, at most one every 10 s per link.
  /// Nothing while agreements are off (`enabled`).
  void report_p2p_checksum_errors() noexcept;
  std::uint64_t digest_mismatches() const noexcept { return digest_mismatches_; }
  /// Agreements run so far, and the collectives from the last to the next (by count; bytes
  /// may bring it sooner): `HealthSnapshot::agreements`, `agree_every` (0 while agreements are off).
  AgreementCount count() const noexcept { return {agreements_, enabled() ? every_ : 0}; }

 private:
  Status max_allreduce(void* data, std::size_t count, DataType type, Failure& failure);
  void observe();
  // The write speeds in the reduced ballot: persistently slow links get fence votes (the same
  // on every rank, which decide from the same ballot) and are returned; stragglers are reported.
  std::vector<LinkId> judge_slowness();
  void report_speeds() noexcept;
  void report_checksum_errors(std::chrono::steady_clock::time_point now, bool p2p) noexcept;
  // The checksum_errors counters of connection `i` to its peer, summed over every lane.
  std::uint64_t checksum_errors_from(std::size_t i) noexcept;
  void report_pace(std::chrono::steady_clock::time_point now) noexcept;
  // Sets every_ from the reduced ballot: health_agree_every, stretched while all is quiet.
  void pace_next() noexcept;
  std::uint64_t base_every() const noexcept { return static_cast<std::uint64_t>(std::max(ctx_.options.health_agree_every, 1)); }
  // Switches to `next` with `fenced`: fences this rank's newly fenced links, reopens its
  // readmitted ones, rebuilds the ring and bumps the epoch.
  void install(Plan next, std::vector<LinkId> fenced, const std::vector<LinkId>& added, const std::vector<LinkId>& readmitted);
  void no_route(const Decision& d);
  void emit(HealthEvent e) noexcept { events_.emit(std::move(e), ctx_.rank, ctx_.seq, plan_.epoch(), ctx_.log); }

  CommContext& ctx_;
  Lanes& lanes_;
  PlanState& plan_;
  DeviceLane& device_;
  LinkMover& mover_;
  EventSink& events_;
  std::function<void(Plan)> set_plan_;
  std::unique_ptr<HealthMonitor> monitor_;
  Ballot ballot_;
  std::vector<std::uint8_t> sent_;  // our input to a one-shot max_allreduce (reserved at start for the ballot and the digests)
  // Up to this many ranks max_allreduce goes to every peer in one step (one-shot), not round a ring.
  static constexpr int kOneShotMaxRanks = 8;
  std::vector<TransportObservation> observations_;  // per agreement; reserved at start
  std::vector<std::pair<std::uint64_t, std::uint64_t>> timed_;  // per peer: timed bytes, ns
  std::vector<ReportCoalescer> checksum_reports_;  // per peer: checksum_errors events held back
  std::vector<ReportCoalescer> p2p_warnings_;  // per peer: warnings about corrupted point-to-point chunks held back
  std::vector<std::uint64_t> checksum_counted_;  // per peer: its links' checksum_errors counters, summed, already reported or held
  std::vector<std::uint64_t> digests_;
  LedgerKeeper ledger_;  // RINGFENCE_HEALTH_LEDGER: fences that outlive the job
  std::uint64_t calls_since_ = 0, bytes_since_ = 0;  // since the last agreement
  std::uint64_t calls_counted_ = 0;  // calls_since_ when the agreement fell due
  std::uint64_t every_ = 0;  // collectives to the next agreement (pace_next)
  std::uint64_t agreements_ = 0;  // run so far
  std::chrono::steady_clock::time_point last_agreement_;

  // Agreements in a row at which link (a, b) (index a * n + b) or rank r was judged slow.
  std::vector<std::uint8_t> slow_streak_, straggler_streak_;
  std::uint64_t digest_mismatches_ = 0;
};

}  // namespace ringfence::detail
