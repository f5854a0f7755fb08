#pragma once
/// \file health/options.hpp
/// Options of the health layer: where its sources read from, how long its windows are, and
/// every threshold of the per-link policy. Plain aggregates with defaults, so designated
/// initializers work: `HealthOptions{.sysfs_root = "/tmp/fake", .window = std::chrono::seconds(10)}`.
/// Nothing here reads the environment; `src/env.cpp` is the only place that may fill these
/// from `RINGFENCE_*` variables. Defaults and their DCGM origin are tabled in docs/health.md.

#include <chrono>
#include <cstdint>
#include <string>

namespace ringfence::health {

/// Thresholds that turn evidence into a verdict (see `evaluate`). A rule whose evidence is
/// unknown never fires and never counts as clean. Counts are events, rates are events per
/// second, windows are the monitor's sliding window (`HealthOptions::window`). A count
/// threshold of 0 disables its rule.
struct HealthThresholds {
  /// NVLink CRC (flit + data) errors per second at or above which the link is fenced.
  /// DCGM `DCGM_LIMIT_MAX_NVLINK_CRC_ERROR` (100/s, "CRC errors only matter at 100+/s").
  double nvlink_crc_fence_per_s = 100.0;
  /// NVLink CRC errors in the window at or above which the link is suspect (DCGM: any CRC → WARN).
  std::uint64_t nvlink_crc_suspect_count = 1;
  /// NVLink replay or recovery events in the window at or above which the link is fenced
  /// (DCGM `DCGM_LIMIT_MAX_NVLINK_ERROR` = 1: any increase fails).
  std::uint64_t nvlink_replay_recovery_fence_count = 1;
  /// Volatile uncorrectable ECC errors in the window at or above which every link of the device
  /// is fenced (DCGM MonitorMem: volatile DBE > 0 → FAIL).
  std::uint64_t ecc_uncorrected_fence_count = 1;
  /// Fail-class Xid events (`classify_xid`: 48, 64, 74, 79, 95, 119, 120, 140) on the GPU in
  /// the window at or above which its links are fenced (DCGM: any devastating Xid → FAIL).
  std::uint64_t xid_fatal_fence_count = 1;
  /// Warn-class Xid events (PCIe 38, 39, 42; NVLink 67, 73, 121, 137; memory 31, 32, 43, 63,
  /// 94) on the GPU in the window at or above which its links are suspect (DCGM: WARN).
  std::uint64_t xid_warn_suspect_count = 1;
  /// PCIe bit-error-rate budget used for the per-lane replay budget: replays per minute per
  /// lane = lane rate (GT/s) × 1e9 × this × 60 (DCGM MonitorPcie: 1e-12, e.g. Gen4 x16 → 16/min).
  double pcie_replay_ber = 1e-12;
  /// Lane rate in GT/s assumed when the evidence does not carry one (Gen4 = 16).
  double pcie_default_lane_gts = 16.0;
  /// Lane count assumed when the evidence does not carry one.
  int pcie_default_width = 16;
  /// PCIe AER fatal or non-fatal errors in the window at or above which the link is fenced.
  std::uint64_t pcie_aer_uncorrectable_fence_count = 1;
  /// PCIe AER correctable errors in the window at or above which the link is suspect
  /// (DCGM diag `max_pcie_correctable_errors` = 0, i.e. any).
  std::uint64_t pcie_aer_correctable_suspect_count = 1;
  /// InfiniBand `link_downed` increments in the window at or above which the port is fenced.
  std::uint64_t ib_link_downed_fence_count = 1;
  /// InfiniBand error increments (symbol_error, link_error_recovery, port_rcv_errors, ...)
  /// in the window at or above which the port is suspect.
  std::uint64_t ib_error_suspect_count = 1;
  /// End-to-end checksum mismatches (since the last observation) that make a link suspect: any.
  std::uint64_t checksum_suspect_count = 1;
  /// Checksum mismatches within `checksum_storm_window` at or above which the link is fenced.
  std::uint64_t checksum_storm_count = 3;
  /// Window of the checksum storm rule.
  std::chrono::milliseconds checksum_storm_window{10000};
  /// Consecutive operation timeouts (no success in between) that fence the link.
  int timeout_fence_count = 3;
  /// Achieved / expected bandwidth below which the link is "slow".
  double bandwidth_min_ratio = 0.25;
  /// How long the link must stay slow (every observation with a known ratio below the minimum)
  /// before it becomes suspect.
  std::chrono::milliseconds bandwidth_slow_for{10000};
};

/// Timings of the per-link state machine `Healthy → Suspect → Fenced → Probation → Healthy`.
/// All durations are measured on the caller's clock (`std::chrono::steady_clock` time points
/// passed to `LinkPolicy::observe`).
struct PolicyTimings {
  /// A suspect link returns to Healthy after clean evidence for this long without interruption
  /// (hysteresis: one warning enters Suspect, a sustained clean run leaves it).
  std::chrono::milliseconds suspect_clear_after{30000};
  /// A link suspect for this long without ever clearing is fenced; 0 = never escalate.
  std::chrono::milliseconds suspect_escalate_after{0};
  /// Minimum time a fenced link stays fenced after its last failing evidence (cool-down).
  std::chrono::milliseconds fence_cooldown{60000};
  /// Each failed probation multiplies the cool-down by this factor (>= 1) ...
  double cooldown_backoff = 2.0;
  /// ... up to this cap.
  std::chrono::milliseconds max_fence_cooldown{30 * 60 * 1000};
  /// A link on probation returns to Healthy after clean evidence for this long without interruption.
  std::chrono::milliseconds probation_duration{60000};
};

/// Everything the health layer is configured by. Env wiring (RINGFENCE_SYSFS_ROOT,
/// RINGFENCE_NVML_LIBRARY, ...) lives in src/env.cpp, not here.
struct HealthOptions {
  /// Root directory under which `sys/class/infiniband` and `sys/bus/pci/devices` are read
  /// ("/" in production, a fake tree in tests). Env (planned): RINGFENCE_SYSFS_ROOT.
  std::string sysfs_root = "/";
  /// NVML library passed to dlopen (a path or a soname). Env (planned): RINGFENCE_NVML_LIBRARY.
  std::string nvml_library = "libnvidia-ml.so.1";
  /// Length of the sliding window over which counter deltas are summed and rates computed
  /// (DCGM evaluates the last 60 s).
  std::chrono::milliseconds window{60000};
  /// Evidence thresholds.
  HealthThresholds thresholds;
  /// State-machine timings.
  PolicyTimings timings;
};

}  // namespace ringfence::health
