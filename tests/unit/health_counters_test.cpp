// Counter model: deltas through saturation, wrap, reset and unreadable readings; sliding windows.
#include <ringfence/health/counters.hpp>

#include "support/catch.hpp"

using namespace ringfence::health;
using namespace std::chrono_literals;

namespace {
const TimePoint t0 = TimePoint{} + 1000s;
}  // namespace

TEST_CASE("first reading is a baseline, then plain differences", "[health][counters]") {
  CounterTracker t(60s);
  CounterDelta d = t.update(CounterReading::known(100, 64), t0);
  REQUIRE(d.kind == DeltaKind::Baseline);
  REQUIRE_FALSE(d.delta);
  REQUIRE_FALSE(t.stats(t0).sum);  // only a baseline: nothing known yet
  d = t.update(CounterReading::known(130, 64), t0 + 1s);
  REQUIRE(d.kind == DeltaKind::Normal);
  REQUIRE(d.delta == 30u);
  REQUIRE(d.interval == 1s);
  d = t.update(CounterReading::known(130, 64), t0 + 2s);
  REQUIRE(d.delta == 0u);
  const WindowStats st = t.stats(t0 + 2s);
  REQUIRE(st.sum == 30u);
  REQUIRE(st.rate_per_s);
  REQUIRE(*st.rate_per_s == Approx(15.0));
  REQUIRE(st.complete);
  REQUIRE_FALSE(st.saturated);
}

TEST_CASE("a 32-bit counter that wraps gives the modular difference", "[health][counters]") {
  CounterTracker t;
  (void)t.update(CounterReading::known(0xFFFFFFF0u, 32), t0);
  const CounterDelta d = t.update(CounterReading::known(0x10, 32), t0 + 1s);
  REQUIRE(d.kind == DeltaKind::Wrapped);
  REQUIRE(d.delta == 0x20u);
  REQUIRE(t.stats(t0 + 1s).wrapped);
  REQUIRE(t.stats(t0 + 1s).sum == 0x20u);
}

TEST_CASE("a fall that would be an implausible wrap is a reset", "[health][counters]") {
  SECTION("32-bit, modular difference above half the range") {
    CounterTracker t;
    (void)t.update(CounterReading::known(1000, 32), t0);
    const CounterDelta d = t.update(CounterReading::known(10, 32), t0 + 1s);
    REQUIRE(d.kind == DeltaKind::Reset);
    REQUIRE(d.delta == 10u);  // events since the reset
    REQUIRE(t.stats(t0 + 1s).reset);
  }
  SECTION("64-bit never wraps in practice") {
    CounterTracker t;
    (void)t.update(CounterReading::known(UINT64_MAX - 5, 64), t0);
    const CounterDelta d = t.update(CounterReading::known(3, 64), t0 + 1s);
    REQUIRE(d.kind == DeltaKind::Reset);
    REQUIRE(d.delta == 3u);
  }
  SECTION("unknown width cannot wrap") {
    CounterTracker t;
    (void)t.update(CounterReading::known(50), t0);
    const CounterDelta d = t.update(CounterReading::known(7), t0 + 1s);
    REQUIRE(d.kind == DeltaKind::Reset);
    REQUIRE(d.delta == 7u);
  }
  SECTION("after the reset, differences continue from the new value") {
    CounterTracker t;
    (void)t.update(CounterReading::known(50, 64), t0);
    (void)t.update(CounterReading::known(7, 64), t0 + 1s);
    const CounterDelta d = t.update(CounterReading::known(9, 64), t0 + 2s);
    REQUIRE(d.kind == DeltaKind::Normal);
    REQUIRE(d.delta == 2u);
    REQUIRE(t.stats(t0 + 2s).sum == 9u);
  }
}

TEST_CASE("a saturating counter reports a lower bound, then unknown, then a reset when cleared",
          "[health][counters]") {
  CounterTracker t;
  (void)t.update(CounterReading::known(65000, 16, true), t0);
  CounterDelta d = t.update(CounterReading::known(65535, 16, true), t0 + 1s);
  REQUIRE(d.kind == DeltaKind::Saturated);
  REQUIRE(d.delta == 535u);  // at least this many
  d = t.update(CounterReading::known(65535, 16, true), t0 + 2s);
  REQUIRE(d.kind == DeltaKind::Saturated);
  REQUIRE_FALSE(d.delta);  // stuck: anything could have happened
  WindowStats st = t.stats(t0 + 2s);
  REQUIRE(st.saturated);
  REQUIRE_FALSE(st.complete);
  REQUIRE(st.unknown_samples == 1);
  REQUIRE(st.sum == 535u);  // a lower bound
  // Cleared by a PMA Set (perfquery -R): the value falls, which is a reset, not a wrap.
  d = t.update(CounterReading::known(3, 16, true), t0 + 3s);
  REQUIRE(d.kind == DeltaKind::Reset);
  REQUIRE(d.delta == 3u);
}

TEST_CASE("a saturating counter already at its maximum on first sight is unknown", "[health][counters]") {
  CounterTracker t;
  const CounterDelta d = t.update(CounterReading::known(255, 8, true), t0);
  REQUIRE(d.kind == DeltaKind::Saturated);
  REQUIRE_FALSE(d.delta);
  REQUIRE_FALSE(t.stats(t0).complete);
  REQUIRE_FALSE(t.stats(t0).sum);
  // A wrapping counter at all-ones is just a value.
  CounterTracker w;
  REQUIRE(w.update(CounterReading::known(255, 8, false), t0).kind == DeltaKind::Baseline);
}

TEST_CASE("unreadable readings are unknown and the next known reading covers the gap", "[health][counters]") {
  CounterTracker t;
  (void)t.update(CounterReading::known(10, 64), t0);
  CounterDelta d = t.update(CounterReading::unknown(64), t0 + 1s);
  REQUIRE(d.kind == DeltaKind::Unreadable);
  REQUIRE_FALSE(d.delta);
  REQUIRE(t.last_value() == 10u);
  WindowStats st = t.stats(t0 + 1s);
  REQUIRE_FALSE(st.sum);  // never zero, never healthy
  REQUIRE_FALSE(st.complete);
  d = t.update(CounterReading::known(25, 64), t0 + 3s);
  REQUIRE(d.kind == DeltaKind::Normal);
  REQUIRE(d.delta == 15u);
  REQUIRE(d.interval == 3s);
  st = t.stats(t0 + 3s);
  REQUIRE(st.sum == 15u);
  REQUIRE(*st.rate_per_s == Approx(5.0));
  REQUIRE_FALSE(st.complete);  // the unreadable sample is still inside the window
}

TEST_CASE("an unreadable counter never read before stays unknown", "[health][counters]") {
  CounterTracker t;
  for (int i = 0; i < 5; ++i) REQUIRE(t.update(CounterReading::unknown(), t0 + i * 1s).kind == DeltaKind::Unreadable);
  const WindowStats st = t.stats(t0 + 5s);
  REQUIRE_FALSE(st.sum);
  REQUIRE_FALSE(st.rate_per_s);
  REQUIRE(st.unknown_samples == 5);
}

TEST_CASE("the sliding window forgets deltas older than its length", "[health][counters]") {
  CounterTracker t(10s);
  std::uint64_t v = 0;
  (void)t.update(CounterReading::known(v, 64), t0);
  for (int s = 1; s <= 30; ++s) {
    v += s <= 10 ? 100 : 1;  // a burst in the first 10 s, then a trickle
    (void)t.update(CounterReading::known(v, 64), t0 + s * 1s);
  }
  const WindowStats st = t.stats(t0 + 30s);
  REQUIRE(st.samples == 10);
  REQUIRE(st.sum == 10u);
  REQUIRE(*st.rate_per_s == Approx(1.0));
  // Looking back from an earlier time uses only samples up to then (those still held).
  SlidingWindow w(5s);
  w.add(CounterDelta{4u, DeltaKind::Normal, t0 + 1s, 1s});
  w.add(CounterDelta{6u, DeltaKind::Normal, t0 + 2s, 1s});
  REQUIRE(w.stats(t0 + 1s).sum == 4u);
  REQUIRE(w.stats(t0 + 2s).sum == 10u);
  REQUIRE_FALSE(w.stats(t0 + 7s).sum);  // both left the window
  w.prune(t0 + 7s);
  REQUIRE(w.size() == 0);
}

TEST_CASE("a counter bank tracks every id it is fed and knows nothing of the rest", "[health][counters]") {
  CounterBank bank(60s);
  const CounterId a{"ib", "mlx5_0", 1, "symbol_error"};
  const CounterId b{"ib", "mlx5_0", 1, "link_downed"};
  bank.update({{a, CounterReading::known(1, 16, true)}, {b, CounterReading::unknown(8, true)}}, t0);
  bank.update({{a, CounterReading::known(4, 16, true)}, {b, CounterReading::unknown(8, true)}}, t0 + 1s);
  REQUIRE(bank.size() == 2);
  REQUIRE(bank.stats(a, t0 + 1s)->sum == 3u);
  REQUIRE_FALSE(bank.stats(b, t0 + 1s)->sum);
  REQUIRE_FALSE(bank.stats(CounterId{"ib", "mlx5_0", 2, "symbol_error"}, t0 + 1s));
  REQUIRE(a.to_string() == "ib:mlx5_0:1:symbol_error");
  REQUIRE(bank.find(a)->last_value() == 4u);
}
