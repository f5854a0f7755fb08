#pragma once
/// \file health/policy.hpp
/// The per-link health policy: evidence in, verdict out, and the state machine
/// `Healthy → Suspect → Fenced → Probation → Healthy` with hysteresis and cool-down.
///
/// Unknown evidence (a source that is absent, unsupported or unreadable) neither fences nor
/// heals: it fires no rule and does not count as clean, so it cannot move a link towards
/// Healthy and it interrupts the clean run that leaving Suspect or Probation needs. A link
/// whose evidence has been entirely unknown reports `LinkHealth::Unknown`, not Healthy.
/// Everything runs on the caller's clock (time points passed in), so tests use a fake clock.

#include <cstdint>
#include <deque>
#include <optional>
#include <ringfence/health/counters.hpp>
#include <ringfence/health/options.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace ringfence::health {

/// What is known about one link at one observation. Every hardware signal is optional:
/// nullopt means unknown. Counter fields are sums over the monitor's sliding window
/// (`WindowStats::sum`), rates are events per second over that window. The transport fields
/// are event counts since the previous observation and are always known (the transport is the
/// one reporting them); `bandwidth_ratio` is optional because a link may carry no traffic.
/// Value type; build one per link per observation.
struct Evidence {
  // --- NVLink (NVML) ---
  /// NVLink CRC (flit + data) errors per second over the window.
  std::optional<double> nvlink_crc_per_s;
  /// NVLink CRC (flit + data) errors in the window.
  std::optional<std::uint64_t> nvlink_crc_count;
  /// NVLink replay + recovery events in the window.
  std::optional<std::uint64_t> nvlink_replay_recovery_count;
  /// NVLink link state: true = active, false = down.
  std::optional<bool> nvlink_active;
  /// Volatile uncorrectable ECC errors in the window on the GPU at either end (DBE).
  std::optional<std::uint64_t> ecc_uncorrected_count;
  /// A row remap failed on the GPU at either end.
  std::optional<bool> remap_failure;
  // --- GPU Xid events (NVML event set) ---
  /// Xids classified Fail (`classify_xid`: DCGM's devastating Xids) on the GPU in the window.
  std::optional<std::uint64_t> xid_fatal_count;
  /// Xids classified Warn (DCGM's PCIe, NVLink and memory Xids) on the GPU in the window.
  std::optional<std::uint64_t> xid_warn_count;
  /// The latest Fail-class Xid of the GPU (`NvmlDeviceSample::last_fatal_xid`), named in the
  /// reason when the fatal rule fires; informative only (it neither fires nor clears a rule).
  std::optional<unsigned long long> xid_last_fatal;
  /// The latest Warn-class Xid of the GPU (`NvmlDeviceSample::last_warn_xid`); informative only.
  std::optional<unsigned long long> xid_last_warn;
  // --- PCIe ---
  /// PCIe replays in the window.
  std::optional<std::uint64_t> pcie_replay_count;
  /// Time the PCIe replay window covers (`WindowStats::covered`); required to judge the budget.
  Duration pcie_replay_window{};
  /// Lane rate in GT/s (from `current_link_speed`); nullopt = use the option default.
  std::optional<double> pcie_lane_gts;
  /// Trained width in lanes; nullopt = use the option default.
  std::optional<int> pcie_width;
  /// AER fatal + non-fatal errors in the window (TOTAL_ERR_FATAL + TOTAL_ERR_NONFATAL deltas).
  std::optional<std::uint64_t> pcie_aer_uncorrectable_count;
  /// AER correctable errors in the window (TOTAL_ERR_COR delta).
  std::optional<std::uint64_t> pcie_aer_correctable_count;
  /// The PCIe link trained below its maximum speed or width.
  std::optional<bool> pcie_downtrained;
  // --- InfiniBand ---
  /// `link_downed` increments in the window.
  std::optional<std::uint64_t> ib_link_downed_count;
  /// Other PMA error increments in the window (symbol_error, link_error_recovery,
  /// port_rcv_errors, port_rcv_remote_physical_errors, port_xmit_discards,
  /// local_link_integrity_errors, excessive_buffer_overrun_errors).
  std::optional<std::uint64_t> ib_error_count;
  /// Port state ACTIVE and phys_state LinkUp.
  std::optional<bool> ib_link_up;
  /// `rate` below the expected rate (width or speed downgrade).
  std::optional<bool> ib_rate_degraded;
  // --- The transport's own counters (always known) ---
  /// End-to-end checksum mismatches since the previous observation.
  std::uint64_t checksum_mismatches = 0;
  /// Operations that timed out since the previous observation.
  std::uint64_t timeouts = 0;
  /// Operations that completed since the previous observation (resets the timeout streak).
  std::uint64_t successes = 0;
  /// Achieved / expected bandwidth over the last interval; nullopt when there was no traffic.
  std::optional<double> bandwidth_ratio;
};

/// Severity of an observation, ordered: `Unknown < Clean < Warn < Fail`.
enum class Severity : std::uint8_t {
  Unknown,  ///< no signal was known: nothing fires, nothing heals
  Clean,    ///< at least one signal was known and none fired
  Warn,     ///< a suspect rule fired (DCGM WARN)
  Fail,     ///< a fence rule fired (DCGM FAIL)
};

/// "unknown", "clean", "warn", "fail". Thread-safe.
std::string_view to_string(Severity s) noexcept;

/// Result of evaluating one observation. Value type.
struct Verdict {
  Severity severity = Severity::Unknown;  ///< the worst rule that fired
  /// One human-readable line per rule that fired at Warn or Fail, e.g.
  /// "nvlink crc 150.0/s >= 100.0/s (DCGM)". Empty when Clean or Unknown.
  std::vector<std::string> reasons;
};

/// Evaluates the stateless rules of `e` against `t` (everything except the checksum storm,
/// the consecutive-timeout count and the slow-bandwidth duration, which need history and live
/// in `LinkPolicy`). Thread-safe, pure; may throw only `std::bad_alloc`.
Verdict evaluate(const Evidence& e, const HealthThresholds& t);

/// Fills the NVLink and GPU fields of `e` from the windows of `bank` (fed by
/// `NvmlSource::read_counters`) for NVLink `link` of GPU `gpu` (the NVML index as a string):
/// CRC flit + data count and rate, replay + recovery count, volatile uncorrectable ECC, PCIe
/// replays and their window, and the GPU's Fail / Warn Xid events ("xid_fatal", "xid_warn").
/// Counters the bank has not seen or whose window holds nothing known stay unknown. Link
/// state, remap failure and the latest Xid numbers are not counters: set them from the
/// latest `NvmlDeviceSample`. Not thread-safe with respect to `bank`.
void add_nvml_evidence(Evidence& e, const CounterBank& bank, const std::string& gpu, int link, TimePoint now);
/// Fills the InfiniBand counter fields of `e` for port `port` of `device` from `bank` (fed by
/// `SysfsSource::read_counters`): `link_downed`, and the sum of the other seven PMA error
/// counters. Port state and rate are not counters: set them from the latest `IbPortSample`.
void add_ib_evidence(Evidence& e, const CounterBank& bank, const std::string& device, int port, TimePoint now);
/// Fills the PCIe AER fields of `e` for PCI device `bdf` from `bank`: TOTAL_ERR_FATAL +
/// TOTAL_ERR_NONFATAL, and TOTAL_ERR_COR. Downtraining: set it from the latest `PcieSample`.
void add_pcie_evidence(Evidence& e, const CounterBank& bank, const std::string& bdf, TimePoint now);

/// PCIe replays allowed per minute on a link: ceil(lane GT/s × 1e9 × ber × 60 × width)
/// (DCGM MonitorPcie; Gen4 x16 at 1e-12 → 16). Thread-safe.
double pcie_replay_budget_per_minute(double lane_gts, int width, double ber) noexcept;

/// The states of a link.
enum class PolicyState : std::uint8_t {
  Healthy,    ///< carrying traffic, nothing wrong seen
  Suspect,    ///< carrying traffic, a warning seen; watched, escalates on failure
  Fenced,     ///< not to be used; waits out its cool-down
  Probation,  ///< cool-down over, carrying (probe) traffic again; any warning refences it
};

/// "healthy", "suspect", "fenced", "probation". Thread-safe.
std::string_view to_string(PolicyState s) noexcept;

/// What a link reports to users: its state, or Unknown when it is nominally Healthy but
/// nothing about it has ever been known (all sources unknown).
enum class LinkHealth : std::uint8_t { Unknown, Healthy, Suspect, Fenced, Probation };

/// "unknown", "healthy", "suspect", "fenced", "probation". Thread-safe.
std::string_view to_string(LinkHealth h) noexcept;

/// One state change. Value type.
struct Transition {
  PolicyState from = PolicyState::Healthy;  ///< state before
  PolicyState to = PolicyState::Healthy;    ///< state after
  TimePoint time{};                     ///< when (the observation's time)
  /// Why: the rules that fired, or "clean for 30000 ms", "cool-down 60000 ms over", ...
  std::vector<std::string> reasons;
};

/// The state machine of ONE link. Not thread-safe (one owner, typically the monitor).
/// Transitions (each taken on an `observe` call; see docs/health.md for the table):
/// - Healthy → Suspect on Warn; Healthy → Fenced on Fail.
/// - Suspect → Fenced on Fail, or when suspect for `suspect_escalate_after` (if > 0) without
///   clearing; Suspect → Healthy after Clean observations spanning `suspect_clear_after` with
///   no Warn, Fail or Unknown in between.
/// - Fenced stays Fenced until the cool-down has passed since the last Fail; then the first
///   observation that is not Warn or Fail moves it to Probation. Unknown is accepted here on
///   purpose: a fenced link carries no traffic, so a link judged only by its transport would
///   otherwise stay fenced forever. Probation is a trial, not a verdict: only Clean evidence
///   gathered during it heals the link.
/// - Probation → Fenced on Warn or Fail (probation failed: the next cool-down is multiplied
///   by `cooldown_backoff`, capped at `max_fence_cooldown`); Probation → Healthy after Clean
///   observations spanning `probation_duration` (the cool-down then returns to its base).
/// - A relapse (Fenced again, by evidence or `fence()`, within twice the served cool-down plus
///   `probation_duration` after probation healed it) counts as a failed probation: the
///   cool-down it served is multiplied by `cooldown_backoff`. A fenced link carries no traffic,
///   so its probation cannot show slowness; without this a persistently slow link would be
///   readmitted and fenced again at the base cool-down for ever.
class LinkPolicy {
 public:
  /// A Healthy link judged by `thresholds` and `timings` (copied).
  explicit LinkPolicy(const HealthThresholds& thresholds = {}, const PolicyTimings& timings = {});
  /// Shorthand for `LinkPolicy(options.thresholds, options.timings)`.
  explicit LinkPolicy(const HealthOptions& options) : LinkPolicy(options.thresholds, options.timings) {}

  /// Feeds one observation taken at `now` (time must not go backwards) and returns the
  /// transition it caused, if any. May throw only `std::bad_alloc`.
  std::optional<Transition> observe(const Evidence& e, TimePoint now);
  /// Fences the link from outside (agreement, an operator) with `reason`; the cool-down starts
  /// at `now`. Returns the transition, or nullopt when already fenced (the cool-down restarts).
  std::optional<Transition> fence(std::string reason, TimePoint now);

  /// The current state.
  PolicyState state() const noexcept { return state_; }
  /// The reported health (see `LinkHealth`).
  LinkHealth health() const noexcept;
  /// The verdict of the last observation, including history rules.
  const Verdict& last_verdict() const noexcept { return last_verdict_; }
  /// The cool-down the link serves on its next (or current) fence.
  Duration current_cooldown() const noexcept { return cooldown_; }
  /// Number of failed probations (relapses included) since the link was last Healthy.
  int failed_probations() const noexcept { return failed_probations_; }

 private:
  Verdict judge(const Evidence& e, TimePoint now);
  Transition move(PolicyState to, TimePoint now, std::vector<std::string> reasons);

  HealthThresholds thresholds_;
  PolicyTimings timings_;
  PolicyState state_ = PolicyState::Healthy;
  Verdict last_verdict_;
  TimePoint entered_{};                        // when the current state was entered
  std::optional<TimePoint> clean_since_;       // start of the current unbroken clean run
  std::optional<TimePoint> last_fail_;         // latest Fail (starts the cool-down)
  std::optional<TimePoint> slow_since_;        // start of the current slow-bandwidth run
  std::deque<std::pair<TimePoint, std::uint64_t>> checksum_events_;  // for the storm rule
  int consecutive_timeouts_ = 0;
  int failed_probations_ = 0;
  Duration cooldown_;
  std::optional<TimePoint> healed_at_;  // when probation last healed the link (for relapses)
  Duration relapse_cooldown_{};         // the cool-down it had served then
  int relapse_failed_ = 0;              // and its failed probations
};

}  // namespace ringfence::health
