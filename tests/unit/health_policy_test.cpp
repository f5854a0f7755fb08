// Health policy on a fake clock: every transition, hysteresis, cool-down and its back-off,
// probation failure, the history rules (checksum storm, timeouts, slow bandwidth) and unknown.
#include <ringfence/health/config.hpp>
#include <ringfence/health/policy.hpp>

#include "support/catch.hpp"

using namespace ringfence::health;
using namespace std::chrono_literals;

namespace {

const TimePoint t0 = TimePoint{} + 1000s;

// Evidence from one hardware signal, so each case reads as "clean", "warn" or "fail".
Evidence clean() {
  Evidence e;
  e.nvlink_crc_count = 0;
  e.nvlink_crc_per_s = 0.0;
  e.nvlink_replay_recovery_count = 0;
  return e;
}
Evidence warn() {
  Evidence e = clean();
  e.nvlink_crc_count = 5;
  e.nvlink_crc_per_s = 0.5;
  return e;
}
Evidence fail() {
  Evidence e = clean();
  e.nvlink_crc_count = 1500;
  e.nvlink_crc_per_s = 150.0;
  return e;
}
Evidence unknown() { return Evidence{}; }

// Feeds `e` every second for `span` starting at `from`; returns the last transition seen.
std::optional<Transition> feed(LinkPolicy& p, const Evidence& e, TimePoint from, std::chrono::seconds span) {
  std::optional<Transition> last;
  for (auto t = from; t <= from + span; t += 1s)
    if (auto tr = p.observe(e, t)) last = tr;
  return last;
}

}  // namespace

TEST_CASE("evaluate applies the DCGM defaults", "[health][policy]") {
  const HealthThresholds t;
  REQUIRE(evaluate(unknown(), t).severity == Severity::Unknown);
  REQUIRE(evaluate(clean(), t).severity == Severity::Clean);
  REQUIRE(evaluate(warn(), t).severity == Severity::Warn);
  const Verdict v = evaluate(fail(), t);
  REQUIRE(v.severity == Severity::Fail);
  REQUIRE_THAT(v.reasons.front(), Catch::Contains("150.0/s >= 100.0/s"));

  Evidence e;
  e.nvlink_replay_recovery_count = 1;  // any replay/recovery increase fails
  REQUIRE(evaluate(e, t).severity == Severity::Fail);
  e = {};
  e.ecc_uncorrected_count = 1;  // any uncorrectable ECC fails
  REQUIRE(evaluate(e, t).severity == Severity::Fail);
  e = {};
  e.nvlink_active = false;  // link down fails
  REQUIRE(evaluate(e, t).severity == Severity::Fail);
  e = {};
  e.remap_failure = true;
  REQUIRE(evaluate(e, t).severity == Severity::Fail);
  e = {};
  e.ib_link_downed_count = 1;
  REQUIRE(evaluate(e, t).severity == Severity::Fail);
  e = {};
  e.ib_link_up = false;
  REQUIRE(evaluate(e, t).severity == Severity::Fail);
  e = {};
  e.ib_error_count = 3;
  REQUIRE(evaluate(e, t).severity == Severity::Warn);
  e = {};
  e.pcie_aer_uncorrectable_count = 1;
  REQUIRE(evaluate(e, t).severity == Severity::Fail);
  e = {};
  e.pcie_aer_correctable_count = 1;
  REQUIRE(evaluate(e, t).severity == Severity::Warn);
  e = {};
  e.pcie_downtrained = true;
  REQUIRE(evaluate(e, t).severity == Severity::Warn);
  e = {};
  e.checksum_mismatches = 1;  // any checksum mismatch: suspect
  REQUIRE(evaluate(e, t).severity == Severity::Warn);
  e = {};
  e.successes = 10;  // traffic without trouble is clean evidence
  REQUIRE(evaluate(e, t).severity == Severity::Clean);
}

TEST_CASE("PCIe replays are judged against the per-lane budget", "[health][policy]") {
  REQUIRE(pcie_replay_budget_per_minute(16.0, 16, 1e-12) == 16.0);  // Gen4 x16 (DCGM)
  REQUIRE(pcie_replay_budget_per_minute(32.0, 16, 1e-12) == 31.0);  // Gen5 x16 (DCGM)
  const HealthThresholds t;
  Evidence e;
  e.pcie_replay_count = 16;
  e.pcie_replay_window = 60s;
  e.pcie_lane_gts = 16.0;
  e.pcie_width = 16;
  REQUIRE(evaluate(e, t).severity == Severity::Clean);  // at budget
  e.pcie_replay_count = 17;
  REQUIRE(evaluate(e, t).severity == Severity::Warn);
  e.pcie_width = 8;  // half the lanes, half the budget
  e.pcie_replay_count = 9;
  REQUIRE(evaluate(e, t).severity == Severity::Warn);
  e.pcie_replay_window = 5s;  // a young window is judged against one minute's budget
  e.pcie_width = 16;
  e.pcie_replay_count = 16;
  REQUIRE(evaluate(e, t).severity == Severity::Clean);
}

TEST_CASE("Healthy -> Suspect -> Healthy needs a sustained clean run (hysteresis)", "[health][policy]") {
  LinkPolicy p;  // suspect_clear_after = 30 s
  REQUIRE(p.health() == LinkHealth::Unknown);  // nothing observed yet
  REQUIRE_FALSE(p.observe(clean(), t0));
  REQUIRE(p.health() == LinkHealth::Healthy);
  auto tr = p.observe(warn(), t0 + 1s);
  REQUIRE(tr);
  REQUIRE(tr->from == PolicyState::Healthy);
  REQUIRE(tr->to == PolicyState::Suspect);
  REQUIRE_FALSE(tr->reasons.empty());

  // 20 s clean, then one warning: the clean run starts over.
  REQUIRE_FALSE(feed(p, clean(), t0 + 2s, 20s));
  REQUIRE_FALSE(p.observe(warn(), t0 + 23s));
  REQUIRE_FALSE(feed(p, clean(), t0 + 24s, 20s));
  REQUIRE(p.state() == PolicyState::Suspect);
  // Unknown interrupts the run as well: it does not heal.
  REQUIRE_FALSE(p.observe(unknown(), t0 + 45s));
  REQUIRE_FALSE(feed(p, clean(), t0 + 46s, 29s));
  REQUIRE(p.state() == PolicyState::Suspect);
  tr = p.observe(clean(), t0 + 76s);  // 30 s of unbroken clean evidence
  REQUIRE(tr);
  REQUIRE(tr->to == PolicyState::Healthy);
  REQUIRE(p.health() == LinkHealth::Healthy);
}

TEST_CASE("Healthy -> Fenced on failure, Suspect -> Fenced on failure", "[health][policy]") {
  LinkPolicy a;
  auto tr = a.observe(fail(), t0);
  REQUIRE(tr);
  REQUIRE(tr->to == PolicyState::Fenced);
  REQUIRE(a.health() == LinkHealth::Fenced);

  LinkPolicy b;
  (void)b.observe(warn(), t0);
  REQUIRE(b.state() == PolicyState::Suspect);
  tr = b.observe(fail(), t0 + 1s);
  REQUIRE(tr);
  REQUIRE(tr->from == PolicyState::Suspect);
  REQUIRE(tr->to == PolicyState::Fenced);
}

TEST_CASE("a fenced link serves its cool-down, then goes on probation, then heals", "[health][policy]") {
  LinkPolicy p;  // cool-down 60 s, probation 60 s
  (void)p.observe(fail(), t0);
  REQUIRE(p.state() == PolicyState::Fenced);
  // Clean evidence during the cool-down does not shorten it.
  REQUIRE_FALSE(feed(p, clean(), t0 + 1s, 58s));
  REQUIRE(p.state() == PolicyState::Fenced);
  // A failure during the cool-down restarts it.
  REQUIRE_FALSE(p.observe(fail(), t0 + 59s));
  REQUIRE_FALSE(feed(p, clean(), t0 + 60s, 58s));
  REQUIRE(p.state() == PolicyState::Fenced);
  // Warnings keep it fenced after the cool-down.
  REQUIRE_FALSE(p.observe(warn(), t0 + 119s));
  REQUIRE(p.state() == PolicyState::Fenced);
  auto tr = p.observe(clean(), t0 + 120s);
  REQUIRE(tr);
  REQUIRE(tr->from == PolicyState::Fenced);
  REQUIRE(tr->to == PolicyState::Probation);
  REQUIRE(p.health() == LinkHealth::Probation);
  // Probation: 60 s of unbroken clean evidence.
  REQUIRE_FALSE(feed(p, clean(), t0 + 121s, 58s));
  tr = p.observe(clean(), t0 + 180s);
  REQUIRE(tr);
  REQUIRE(tr->to == PolicyState::Healthy);
}

TEST_CASE("a failed probation refences with a longer cool-down, capped, healing resets it", "[health][policy]") {
  PolicyTimings timings;
  timings.fence_cooldown = 10s;
  timings.cooldown_backoff = 2.0;
  timings.max_fence_cooldown = 30s;
  timings.probation_duration = 20s;
  LinkPolicy p({}, timings);
  TimePoint now = t0;
  (void)p.observe(fail(), now);
  REQUIRE(p.current_cooldown() == 10s);
  const std::chrono::seconds expected[] = {20s, 30s, 30s};  // 10 -> 20 -> 40 capped at 30
  std::chrono::seconds cooldown = 10s;
  for (std::chrono::seconds next : expected) {
    now += cooldown;
    auto tr = p.observe(clean(), now);
    REQUIRE(tr);
    REQUIRE(tr->to == PolicyState::Probation);
    now += 1s;
    tr = p.observe(warn(), now);  // probation is strict: a warning fails it
    REQUIRE(tr);
    REQUIRE(tr->from == PolicyState::Probation);
    REQUIRE(tr->to == PolicyState::Fenced);
    REQUIRE(p.current_cooldown() == next);
    cooldown = next;
  }
  REQUIRE(p.failed_probations() == 3);
  // Serve the last cool-down and a full probation: healthy, and the back-off is forgotten.
  now += cooldown;
  REQUIRE(p.observe(clean(), now)->to == PolicyState::Probation);
  REQUIRE(feed(p, clean(), now + 1s, 19s)->to == PolicyState::Healthy);
  REQUIRE(p.current_cooldown() == 10s);
  REQUIRE(p.failed_probations() == 0);
}

TEST_CASE("probation heals only on clean evidence, unknown after the cool-down starts probation",
          "[health][policy]") {
  LinkPolicy p;
  (void)p.observe(fail(), t0);
  // A fenced link carries no traffic: unknown evidence must not keep it fenced forever.
  auto tr = p.observe(unknown(), t0 + 60s);
  REQUIRE(tr);
  REQUIRE(tr->to == PolicyState::Probation);
  // But unknown never heals it.
  REQUIRE_FALSE(feed(p, unknown(), t0 + 61s, 300s));
  REQUIRE(p.state() == PolicyState::Probation);
  // Failure on probation: back to fenced.
  tr = p.observe(fail(), t0 + 400s);
  REQUIRE(tr);
  REQUIRE(tr->to == PolicyState::Fenced);
}

TEST_CASE("unknown evidence neither fences nor heals", "[health][policy]") {
  LinkPolicy p;
  REQUIRE_FALSE(feed(p, unknown(), t0, 600s));
  REQUIRE(p.state() == PolicyState::Healthy);
  REQUIRE(p.health() == LinkHealth::Unknown);  // all sources unknown: not "healthy"
  (void)p.observe(warn(), t0 + 601s);
  REQUIRE_FALSE(feed(p, unknown(), t0 + 602s, 600s));
  REQUIRE(p.state() == PolicyState::Suspect);
  // Known clean evidence on one signal counts even when the others are unknown.
  Evidence partial;
  partial.ib_error_count = 0;
  REQUIRE(feed(p, partial, t0 + 1300s, 30s)->to == PolicyState::Healthy);
  REQUIRE(p.health() == LinkHealth::Healthy);
  REQUIRE_FALSE(p.observe(unknown(), t0 + 1400s));
  REQUIRE(p.health() == LinkHealth::Unknown);  // its sources went dark
}

TEST_CASE("checksum mismatches: one is suspect, a storm is a fence", "[health][policy]") {
  LinkPolicy p;  // storm: 3 within 10 s
  Evidence one;
  one.checksum_mismatches = 1;
  one.successes = 100;
  REQUIRE(p.observe(one, t0)->to == PolicyState::Suspect);
  REQUIRE_FALSE(p.observe(one, t0 + 11s));  // 2 within 10 s? no: the first left the window
  REQUIRE_FALSE(p.observe(one, t0 + 15s));  // 2 within 10 s
  auto tr = p.observe(one, t0 + 20s);       // 3 within 10 s (11, 15, 20)
  REQUIRE(tr);
  REQUIRE(tr->to == PolicyState::Fenced);
  REQUIRE_THAT(tr->reasons.back(), Catch::Contains("checksum storm"));
  // Spread-out mismatches never storm.
  LinkPolicy q;
  for (int i = 0; i < 10; ++i) {
    (void)q.observe(one, t0 + i * 11s);
    REQUIRE(q.state() == PolicyState::Suspect);
  }
}

TEST_CASE("consecutive timeouts fence, a success in between resets the count", "[health][policy]") {
  LinkPolicy p;  // 3 consecutive
  Evidence timeout;
  timeout.timeouts = 1;
  Evidence ok;
  ok.successes = 5;
  REQUIRE(p.observe(timeout, t0)->to == PolicyState::Suspect);
  REQUIRE_FALSE(p.observe(timeout, t0 + 1s));
  REQUIRE_FALSE(p.observe(ok, t0 + 2s));  // resets the streak
  REQUIRE_FALSE(p.observe(timeout, t0 + 3s));
  REQUIRE_FALSE(p.observe(timeout, t0 + 4s));
  REQUIRE(p.state() == PolicyState::Suspect);
  auto tr = p.observe(timeout, t0 + 5s);
  REQUIRE(tr);
  REQUIRE(tr->to == PolicyState::Fenced);
  REQUIRE_THAT(tr->reasons.back(), Catch::Contains("3 consecutive timeouts"));
  // The streak does not survive the fence: a quiet probation does not re-fire it.
  REQUIRE(p.observe(ok, t0 + 65s)->to == PolicyState::Probation);
  REQUIRE(p.state() == PolicyState::Probation);
}

TEST_CASE("bandwidth below 25% of expectation for the configured time is suspect", "[health][policy]") {
  LinkPolicy p;  // 10 s
  Evidence slow;
  slow.bandwidth_ratio = 0.10;
  slow.successes = 1;
  Evidence idle;  // no traffic: neither extends nor breaks the run
  Evidence fast;
  fast.bandwidth_ratio = 0.9;
  fast.successes = 1;
  REQUIRE_FALSE(feed(p, slow, t0, 5s));
  REQUIRE_FALSE(p.observe(idle, t0 + 6s));
  REQUIRE_FALSE(p.observe(fast, t0 + 7s));  // the run breaks
  REQUIRE_FALSE(feed(p, slow, t0 + 8s, 9s));
  REQUIRE(p.state() == PolicyState::Healthy);
  auto tr = p.observe(slow, t0 + 18s);  // slow since t0 + 8 s
  REQUIRE(tr);
  REQUIRE(tr->to == PolicyState::Suspect);
  REQUIRE_THAT(tr->reasons.back(), Catch::Contains("bandwidth 10%"));
}

TEST_CASE("optional escalation: a link that stays suspect is fenced", "[health][policy]") {
  PolicyTimings timings;
  timings.suspect_escalate_after = 30s;
  LinkPolicy p({}, timings);
  (void)p.observe(warn(), t0);
  REQUIRE_FALSE(feed(p, warn(), t0 + 1s, 28s));
  auto tr = p.observe(warn(), t0 + 30s);
  REQUIRE(tr);
  REQUIRE(tr->to == PolicyState::Fenced);
  REQUIRE_THAT(tr->reasons.back(), Catch::Contains("suspect for 30000 ms"));
  // Off by default.
  LinkPolicy q;
  REQUIRE(feed(q, warn(), t0, 600s)->to == PolicyState::Suspect);
  REQUIRE(q.state() == PolicyState::Suspect);
}

TEST_CASE("an external fence (agreement) fences and restarts the cool-down", "[health][policy]") {
  LinkPolicy p;
  (void)p.observe(clean(), t0);
  auto tr = p.fence("agreed at seq 42", t0 + 1s);
  REQUIRE(tr);
  REQUIRE(tr->to == PolicyState::Fenced);
  REQUIRE_FALSE(p.fence("again", t0 + 50s));  // already fenced: cool-down restarts
  REQUIRE_FALSE(p.observe(clean(), t0 + 100s));
  REQUIRE(p.observe(clean(), t0 + 110s)->to == PolicyState::Probation);
  REQUIRE(to_string(PolicyState::Probation) == "probation");
  REQUIRE(to_string(LinkHealth::Unknown) == "unknown");
  REQUIRE(to_string(Severity::Fail) == "fail");
}

TEST_CASE("thresholds come from the options", "[health][policy]") {
  HealthOptions opts;
  opts.thresholds.nvlink_crc_fence_per_s = 1000.0;
  LinkPolicy p(opts);
  REQUIRE(p.observe(fail(), t0)->to == PolicyState::Suspect);  // 150/s: only a warning now
}

TEST_CASE("Xid events: fatal fences, warn is suspect, 0 disables, unknown is unknown", "[health][policy]") {
  const HealthThresholds t;
  REQUIRE(t.xid_fatal_fence_count == 1);
  REQUIRE(t.xid_warn_suspect_count == 1);

  Evidence e;
  e.xid_fatal_count = 0;
  e.xid_warn_count = 0;
  REQUIRE(evaluate(e, t).severity == Severity::Clean);  // known and quiet

  e.xid_fatal_count = 1;
  Verdict v = evaluate(e, t);
  REQUIRE(v.severity == Severity::Fail);
  REQUIRE(v.reasons == std::vector<std::string>{"Xid fatal events 1 >= 1 (DCGM)"});
  e.xid_last_fatal = 74;  // the latest Xid is named when known
  v = evaluate(e, t);
  REQUIRE(v.reasons == std::vector<std::string>{"Xid fatal events 1 >= 1 (DCGM; latest Xid 74)"});

  e = {};
  e.xid_warn_count = 2;
  e.xid_last_warn = 42;
  v = evaluate(e, t);
  REQUIRE(v.severity == Severity::Warn);
  REQUIRE(v.reasons == std::vector<std::string>{"Xid warn events 2 >= 1 (DCGM; latest Xid 42)"});

  e = {};
  e.xid_last_fatal = 79;  // a latest Xid alone is no evidence: no count, nothing known
  REQUIRE(evaluate(e, t).severity == Severity::Unknown);

  // Thresholds from a config file: 0 disables a rule, larger counts raise the bar.
  HealthOptions opts;
  apply_health_config("xid_fatal_fence_count = 2\nxid_warn_suspect_count = 0\n", opts);
  REQUIRE(opts.thresholds.xid_fatal_fence_count == 2);
  REQUIRE(opts.thresholds.xid_warn_suspect_count == 0);
  e = {};
  e.xid_fatal_count = 1;
  e.xid_warn_count = 50;
  REQUIRE(evaluate(e, opts.thresholds).severity == Severity::Clean);
  e.xid_fatal_count = 2;
  v = evaluate(e, opts.thresholds);
  REQUIRE(v.severity == Severity::Fail);
  REQUIRE(v.reasons == std::vector<std::string>{"Xid fatal events 2 >= 2 (DCGM)"});

  // A link with a fatal Xid is fenced at once.
  LinkPolicy p;
  e = {};
  e.xid_fatal_count = 1;
  const auto tr = p.observe(e, t0);
  REQUIRE(tr);
  REQUIRE(tr->to == PolicyState::Fenced);
}

TEST_CASE("a link fenced again soon after probation healed it relapsed: the cool-downs grow, later fences start afresh",
          "[health][policy]") {
  // A slow link: fenced, nothing wrong while it carries no traffic, readmitted, slow again at
  // once. Without the relapse rule it would flap at the base cool-down for ever.
  PolicyTimings timings;
  timings.fence_cooldown = 10s;
  timings.cooldown_backoff = 2.0;
  timings.max_fence_cooldown = 30s;
  timings.probation_duration = 5s;
  LinkPolicy p({}, timings);
  TimePoint now = t0;
  REQUIRE(p.fence("slow", now)->to == PolicyState::Fenced);
  const std::chrono::seconds expected[] = {20s, 30s, 30s};  // 10 -> 20 -> 40 capped at 30
  std::chrono::seconds served = 10s;
  for (std::chrono::seconds next : expected) {
    now += served;
    REQUIRE(p.observe(clean(), now)->to == PolicyState::Probation);
    REQUIRE(feed(p, clean(), now + 1s, 5s)->to == PolicyState::Healthy);
    REQUIRE(p.current_cooldown() == 10s);  // healed: the base again, unless it relapses
    now += 8s;                             // slow again a few agreements after the readmission
    const auto tr = p.fence("slow again", now);
    REQUIRE(tr);
    REQUIRE(tr->to == PolicyState::Fenced);
    CHECK(p.current_cooldown() == next);
    served = next;
  }
  CHECK(p.failed_probations() == 3);
  // Healed, and fenced again only long after: a new fault, the base cool-down.
  now += served;
  REQUIRE(p.observe(clean(), now)->to == PolicyState::Probation);
  REQUIRE(feed(p, clean(), now + 1s, 5s)->to == PolicyState::Healthy);
  now += 10min;
  REQUIRE(p.fence("corrupting", now)->to == PolicyState::Fenced);
  CHECK(p.current_cooldown() == 10s);
  CHECK(p.failed_probations() == 0);
}
