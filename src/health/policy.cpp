// Health policy: rules (DCGM defaults plus ours) and the per-link state machine.
#include <ringfence/health/policy.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>

namespace ringfence::health {

namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

long long ms(Duration d) { return duration_cast<milliseconds>(d).count(); }

// Accumulates rule results: `known` records that some signal was present, `fire` that a rule fired.
struct Judge {
  Verdict v;
  bool known = false;

  void fire(Severity s, std::string reason) {
    v.severity = std::max(v.severity, s);
    v.reasons.push_back(std::move(reason));
  }
  Verdict done() {
    if (v.severity == Severity::Unknown && known) v.severity = Severity::Clean;
    return std::move(v);
  }
};

}  // namespace

std::string_view to_string(Severity s) noexcept {
  switch (s) {
    case Severity::Unknown: return "unknown";
    case Severity::Clean: return "clean";
    case Severity::Warn: return "warn";
    case Severity::Fail: return "fail";
  }
  return "?";
}

std::string_view to_string(PolicyState s) noexcept {
  switch (s) {
    case PolicyState::Healthy: return "healthy";
    case PolicyState::Suspect: return "suspect";
    case PolicyState::Fenced: return "fenced";
    case PolicyState::Probation: return "probation";
  }
  return "?";
}

std::string_view to_string(LinkHealth h) noexcept {
  switch (h) {
    case LinkHealth::Unknown: return "unknown";
    case LinkHealth::Healthy: return "healthy";
    case LinkHealth::Suspect: return "suspect";
    case LinkHealth::Fenced: return "fenced";
    case LinkHealth::Probation: return "probation";
  }
  return "?";
}

double pcie_replay_budget_per_minute(double lane_gts, int width, double ber) noexcept {
  // DCGM: perLane = line rate (Gb/s) × BER × 60 s, budget = ceil(perLane × width).
  return std::ceil(lane_gts * 1e9 * ber * 60.0 * std::max(width, 1));
}

Verdict evaluate(const Evidence& e, const HealthThresholds& t) {
  Judge j;
  // Each rule: a known signal marks the observation as informative, a bad one fires.
  auto count_rule = [&](const std::optional<std::uint64_t>& v, std::uint64_t limit, Severity s, const char* what,
                        const char* origin) {
    if (!v) return;
    j.known = true;
    if (limit > 0 && *v >= limit) j.fire(s, fmt::format("{} {} >= {} ({})", what, *v, limit, origin));
  };
  auto flag_rule = [&](const std::optional<bool>& v, bool bad, Severity s, const char* what) {
    if (!v) return;
    j.known = true;
    if (*v == bad) j.fire(s, what);
  };

  if (e.nvlink_crc_per_s) {
    j.known = true;
    if (*e.nvlink_crc_per_s >= t.nvlink_crc_fence_per_s)
      j.fire(Severity::Fail, fmt::format("nvlink crc {:.1f}/s >= {:.1f}/s (DCGM)", *e.nvlink_crc_per_s,
                                         t.nvlink_crc_fence_per_s));
  }
  count_rule(e.nvlink_crc_count, t.nvlink_crc_suspect_count, Severity::Warn, "nvlink crc errors", "DCGM");
  count_rule(e.nvlink_replay_recovery_count, t.nvlink_replay_recovery_fence_count, Severity::Fail,
             "nvlink replay+recovery events", "DCGM");
  flag_rule(e.nvlink_active, false, Severity::Fail, "nvlink down (DCGM)");
  count_rule(e.ecc_uncorrected_count, t.ecc_uncorrected_fence_count, Severity::Fail, "uncorrectable ECC errors",
             "DCGM");
  flag_rule(e.remap_failure, true, Severity::Fail, "row remap failure (DCGM)");
  // Xid events: counts like the other rules, plus the latest Xid number when the caller knows it.
  auto xid_rule = [&](const std::optional<std::uint64_t>& v, std::uint64_t limit, Severity s, const char* what,
                      const std::optional<unsigned long long>& last) {
    if (!v) return;
    j.known = true;
    if (limit == 0 || *v < limit) return;
    j.fire(s, last ? fmt::format("Xid {} events {} >= {} (DCGM; latest Xid {})", what, *v, limit, *last)
                   : fmt::format("Xid {} events {} >= {} (DCGM)", what, *v, limit));
  };
  xid_rule(e.xid_fatal_count, t.xid_fatal_fence_count, Severity::Fail, "fatal", e.xid_last_fatal);
  xid_rule(e.xid_warn_count, t.xid_warn_suspect_count, Severity::Warn, "warn", e.xid_last_warn);

  if (e.pcie_replay_count) {
    j.known = true;
    const double per_min = pcie_replay_budget_per_minute(e.pcie_lane_gts.value_or(t.pcie_default_lane_gts),
                                                         e.pcie_width.value_or(t.pcie_default_width), t.pcie_replay_ber);
    // The budget is per minute; a window shorter than a minute is judged against one minute's
    // budget so that a young window does not warn on a handful of replays.
    const double minutes = std::max(1.0, std::chrono::duration<double>(e.pcie_replay_window).count() / 60.0);
    const double allowed = per_min * minutes;
    if (static_cast<double>(*e.pcie_replay_count) > allowed)
      j.fire(Severity::Warn, fmt::format("pcie replays {} > budget {:.0f} over {:.0f} s (DCGM)", *e.pcie_replay_count,
                                         allowed, minutes * 60.0));
  }
  count_rule(e.pcie_aer_uncorrectable_count, t.pcie_aer_uncorrectable_fence_count, Severity::Fail,
             "pcie AER fatal+nonfatal errors", "ours");
  count_rule(e.pcie_aer_correctable_count, t.pcie_aer_correctable_suspect_count, Severity::Warn,
             "pcie AER correctable errors", "DCGM diag");
  flag_rule(e.pcie_downtrained, true, Severity::Warn, "pcie link downtrained (speed or width below max)");

  count_rule(e.ib_link_downed_count, t.ib_link_downed_fence_count, Severity::Fail, "ib link_downed", "ours");
  count_rule(e.ib_error_count, t.ib_error_suspect_count, Severity::Warn, "ib port errors", "ours");
  flag_rule(e.ib_link_up, false, Severity::Fail, "ib port not ACTIVE/LinkUp");
  flag_rule(e.ib_rate_degraded, true, Severity::Warn, "ib rate below expected");

  // Transport counters tell something only when there was traffic.
  if (e.checksum_mismatches > 0 || e.timeouts > 0 || e.successes > 0) j.known = true;
  if (t.checksum_suspect_count > 0 && e.checksum_mismatches >= t.checksum_suspect_count)
    j.fire(Severity::Warn, fmt::format("{} checksum mismatches (ours)", e.checksum_mismatches));
  if (e.timeouts > 0) j.fire(Severity::Warn, fmt::format("{} timeouts (ours)", e.timeouts));
  if (e.bandwidth_ratio) j.known = true;
  return j.done();
}

namespace {

// Sum of the known window sums of `names`; nullopt when none is known. A partly unknown set
// gives a lower bound, which is still evidence of errors (but see WindowStats::complete).
struct Sum {
  std::optional<std::uint64_t> count;
  std::optional<double> rate;
  Duration covered{};
};
Sum window_sum(const CounterBank& bank, const std::string& source, const std::string& device, int port,
               std::initializer_list<const char*> names, TimePoint now) {
  Sum out;
  for (const char* name : names) {
    const std::optional<WindowStats> st = bank.stats(CounterId{source, device, port, name}, now);
    if (!st || !st->sum) continue;
    out.count = out.count.value_or(0) + *st->sum;
    if (st->rate_per_s) out.rate = out.rate.value_or(0.0) + *st->rate_per_s;
    out.covered = std::max(out.covered, st->covered);
  }
  return out;
}

}  // namespace

void add_nvml_evidence(Evidence& e, const CounterBank& bank, const std::string& gpu, int link, TimePoint now) {
  const Sum crc = window_sum(bank, "nvml", gpu, link, {"nvlink_crc_flit", "nvlink_crc_data"}, now);
  e.nvlink_crc_count = crc.count;
  e.nvlink_crc_per_s = crc.rate;
  e.nvlink_replay_recovery_count = window_sum(bank, "nvml", gpu, link, {"nvlink_replay", "nvlink_recovery"}, now).count;
  e.ecc_uncorrected_count = window_sum(bank, "nvml", gpu, 0, {"ecc_uncorrected"}, now).count;
  const Sum replay = window_sum(bank, "nvml", gpu, 0, {"pcie_replay"}, now);
  e.pcie_replay_count = replay.count;
  e.pcie_replay_window = replay.covered;
  e.xid_fatal_count = window_sum(bank, "nvml", gpu, 0, {"xid_fatal"}, now).count;
  e.xid_warn_count = window_sum(bank, "nvml", gpu, 0, {"xid_warn"}, now).count;
}

void add_ib_evidence(Evidence& e, const CounterBank& bank, const std::string& device, int port, TimePoint now) {
  e.ib_link_downed_count = window_sum(bank, "ib", device, port, {"link_downed"}, now).count;
  e.ib_error_count = window_sum(bank, "ib", device, port,
                                {"symbol_error", "link_error_recovery", "port_rcv_errors",
                                 "port_rcv_remote_physical_errors", "port_xmit_discards",
                                 "local_link_integrity_errors", "excessive_buffer_overrun_errors"},
                                now)
                         .count;
}

void add_pcie_evidence(Evidence& e, const CounterBank& bank, const std::string& bdf, TimePoint now) {
  e.pcie_aer_uncorrectable_count =
      window_sum(bank, "pcie", bdf, 0, {"aer_dev_fatal/TOTAL_ERR_FATAL", "aer_dev_nonfatal/TOTAL_ERR_NONFATAL"}, now)
          .count;
  e.pcie_aer_correctable_count = window_sum(bank, "pcie", bdf, 0, {"aer_dev_correctable/TOTAL_ERR_COR"}, now).count;
}

LinkPolicy::LinkPolicy(const HealthThresholds& thresholds, const PolicyTimings& timings)
    : thresholds_(thresholds), timings_(timings), cooldown_(timings.fence_cooldown) {}

LinkHealth LinkPolicy::health() const noexcept {
  switch (state_) {
    case PolicyState::Healthy:
      return last_verdict_.severity == Severity::Unknown ? LinkHealth::Unknown : LinkHealth::Healthy;
    case PolicyState::Suspect: return LinkHealth::Suspect;
    case PolicyState::Fenced: return LinkHealth::Fenced;
    case PolicyState::Probation: return LinkHealth::Probation;
  }
  return LinkHealth::Unknown;
}

Verdict LinkPolicy::judge(const Evidence& e, TimePoint now) {
  Verdict v = evaluate(e, thresholds_);
  auto raise = [&](Severity s, std::string reason) {
    v.severity = std::max(v.severity, s);
    v.reasons.push_back(std::move(reason));
  };
  // Checksum storm: N mismatches within T. Fires only on an observation that brought new
  // mismatches, so a quiet observation after a storm does not re-fire on old events.
  while (!checksum_events_.empty() && checksum_events_.front().first <= now - thresholds_.checksum_storm_window)
    checksum_events_.pop_front();
  if (e.checksum_mismatches > 0) {
    checksum_events_.emplace_back(now, e.checksum_mismatches);
    std::uint64_t in_window = 0;
    for (const auto& ev : checksum_events_) in_window += ev.second;
    if (thresholds_.checksum_storm_count > 0 && in_window >= thresholds_.checksum_storm_count)
      raise(Severity::Fail, fmt::format("checksum storm: {} mismatches within {} ms (ours)", in_window,
                                        ms(thresholds_.checksum_storm_window)));
  }
  // Consecutive timeouts. The order of successes and timeouts inside one interval is unknown;
  // assume the worst (the timeouts came last).
  if (e.successes > 0) consecutive_timeouts_ = 0;
  if (e.timeouts > 0) {
    consecutive_timeouts_ += static_cast<int>(std::min<std::uint64_t>(e.timeouts, 1u << 20));
    if (thresholds_.timeout_fence_count > 0 && consecutive_timeouts_ >= thresholds_.timeout_fence_count)
      raise(Severity::Fail, fmt::format("{} consecutive timeouts (ours)", consecutive_timeouts_));
  }
  // Sustained low bandwidth. Observations without traffic neither extend nor break the run.
  if (e.bandwidth_ratio) {
    if (*e.bandwidth_ratio < thresholds_.bandwidth_min_ratio) {
      if (!slow_since_) slow_since_ = now;
      if (now - *slow_since_ >= thresholds_.bandwidth_slow_for)
        raise(Severity::Warn, fmt::format("bandwidth {:.3g}% < {:.3g}% of expected for {} ms (ours)",
                                          *e.bandwidth_ratio * 100, thresholds_.bandwidth_min_ratio * 100,
                                          ms(now - *slow_since_)));
    } else {
      slow_since_.reset();
    }
  }
  return v;
}

Transition LinkPolicy::move(PolicyState to, TimePoint now, std::vector<std::string> reasons) {
  Transition t{state_, to, now, std::move(reasons)};
  const PolicyState from = state_;
  state_ = to;
  entered_ = now;
  clean_since_.reset();
  if (to == PolicyState::Fenced && healed_at_) {
    // Fenced again soon after a probation healed it: a relapse. A fenced link carries no
    // traffic, so its probation could not show what only traffic shows (a slow link is slow
    // again as soon as it is used): count it as a failed probation, so the cool-downs grow
    // instead of the link flapping at the base cool-down.
    if (now - *healed_at_ <= 2 * (relapse_cooldown_ + timings_.probation_duration)) {
      failed_probations_ = relapse_failed_ + 1;
      const double next = std::chrono::duration<double>(relapse_cooldown_).count() * std::max(1.0, timings_.cooldown_backoff);
      const double cap = std::chrono::duration<double>(timings_.max_fence_cooldown).count();
      cooldown_ = duration_cast<Duration>(std::chrono::duration<double>(std::min(next, cap)));
      t.reasons.push_back(fmt::format("fenced again {} ms after it healed (relapse {}); next cool-down {} ms", ms(now - *healed_at_),
                                      failed_probations_, ms(cooldown_)));
    }
    healed_at_.reset();
  }
  if (to == PolicyState::Fenced) {
    // A fence starts a fresh history: a fenced link carries no traffic, and probation must
    // earn its way back on evidence gathered after the fence.
    last_fail_ = now;
    checksum_events_.clear();
    consecutive_timeouts_ = 0;
    slow_since_.reset();
  }
  if (to == PolicyState::Healthy) {
    if (from == PolicyState::Probation) {  // healed: remembered for a relapse (above)
      healed_at_ = now;
      relapse_cooldown_ = cooldown_;
      relapse_failed_ = failed_probations_;
    }
    failed_probations_ = 0;
    cooldown_ = timings_.fence_cooldown;
  }
  return t;
}

std::optional<Transition> LinkPolicy::fence(std::string reason, TimePoint now) {
  last_verdict_ = Verdict{Severity::Fail, {reason}};
  if (state_ == PolicyState::Fenced) {
    last_fail_ = now;
    return std::nullopt;
  }
  return move(PolicyState::Fenced, now, {std::move(reason)});
}

std::optional<Transition> LinkPolicy::observe(const Evidence& e, TimePoint now) {
  last_verdict_ = judge(e, now);
  const Verdict& v = last_verdict_;
  // An unbroken run of Clean observations; anything else (Unknown included) interrupts it.
  auto clean_for = [&]() -> Duration {
    if (v.severity != Severity::Clean) {
      clean_since_.reset();
      return Duration::min();
    }
    if (!clean_since_) clean_since_ = now;
    return now - *clean_since_;
  };

  switch (state_) {
    case PolicyState::Healthy:
      if (v.severity == Severity::Fail) return move(PolicyState::Fenced, now, v.reasons);
      if (v.severity == Severity::Warn) return move(PolicyState::Suspect, now, v.reasons);
      return std::nullopt;

    case PolicyState::Suspect: {
      if (v.severity == Severity::Fail) return move(PolicyState::Fenced, now, v.reasons);
      if (v.severity == Severity::Warn && timings_.suspect_escalate_after > Duration::zero() &&
          now - entered_ >= timings_.suspect_escalate_after) {
        std::vector<std::string> why = v.reasons;
        why.push_back(fmt::format("suspect for {} ms without clearing", ms(now - entered_)));
        return move(PolicyState::Fenced, now, std::move(why));
      }
      if (clean_for() >= timings_.suspect_clear_after)
        return move(PolicyState::Healthy, now, {fmt::format("clean for {} ms", ms(timings_.suspect_clear_after))});
      return std::nullopt;
    }

    case PolicyState::Fenced:
      if (v.severity == Severity::Fail) {
        last_fail_ = now;  // still failing: the cool-down restarts
        return std::nullopt;
      }
      if (v.severity == Severity::Warn) return std::nullopt;
      if (last_fail_ && now - *last_fail_ >= cooldown_) {
        auto t = move(PolicyState::Probation, now, {fmt::format("cool-down {} ms over", ms(cooldown_))});
        (void)clean_for();  // a Clean observation at entry starts the probation's clean run
        return t;
      }
      return std::nullopt;

    case PolicyState::Probation:
      if (v.severity == Severity::Fail || v.severity == Severity::Warn) {
        ++failed_probations_;
        const double next = std::chrono::duration<double>(cooldown_).count() * std::max(1.0, timings_.cooldown_backoff);
        const double cap = std::chrono::duration<double>(timings_.max_fence_cooldown).count();
        cooldown_ = duration_cast<Duration>(std::chrono::duration<double>(std::min(next, cap)));
        std::vector<std::string> why = v.reasons;
        why.push_back(fmt::format("probation failed ({}); next cool-down {} ms", failed_probations_, ms(cooldown_)));
        return move(PolicyState::Fenced, now, std::move(why));
      }
      if (clean_for() >= timings_.probation_duration)
        return move(PolicyState::Healthy, now, {fmt::format("clean for {} ms on probation", ms(timings_.probation_duration))});
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace ringfence::health
