#pragma once
/// \file health/counters.hpp
/// The counter model of the health layer. Sources produce raw `CounterReading`s; a
/// `CounterTracker` turns successive readings into deltas, coping with counters that saturate
/// (IB PMA error counters stick at all-ones), wrap (32-bit firmware counters), reset (driver
/// reload, `perfquery -R`) or cannot be read at all; a `SlidingWindow` sums the deltas of the
/// last W and derives a rate. Raw values are never trusted on their own: only deltas are.
///
/// Time is passed in (`std::chrono::steady_clock::time_point`), so tests drive a fake clock.
/// None of these types is thread-safe; each is owned by one sampler.

#include <chrono>
#include <compare>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ringfence::health {

/// The clock of the health layer. Only its time points are used; nothing here calls `now()`.
using Clock = std::chrono::steady_clock;
/// A point on `Clock`.
using TimePoint = Clock::time_point;
/// A duration on `Clock` (nanoseconds).
using Duration = Clock::duration;

/// Names one counter: which source read it, from which device and port, under which name.
/// Examples: {"ib", "mlx5_0", 1, "symbol_error"}, {"nvml", "0", 3, "nvlink_crc_flit"},
/// {"pcie", "0000:3b:00.0", 0, "aer_dev_fatal/TOTAL_ERR_FATAL"}. `port` is the IB port, the
/// NVLink index, or 0 for device-wide counters. Value type; ordered, so it can key a map.
struct CounterId {
  std::string source;  ///< "ib", "nvml", "pcie", or a transport name
  std::string device;  ///< device name, GPU index or PCI address
  int port = 0;        ///< IB port, NVLink index, or 0 for device-wide counters
  std::string name;    ///< counter name within the source

  /// Member-wise ordering and equality.
  friend auto operator<=>(const CounterId&, const CounterId&) = default;
  /// "source:device:port:name", for logs and messages. May allocate.
  std::string to_string() const;
};

/// One raw read of a counter. Value type.
struct CounterReading {
  /// The value read; nullopt when it could not be read (file missing, "N/A", NOT_SUPPORTED,
  /// parse error). Unknown is never treated as zero.
  std::optional<std::uint64_t> value;
  /// Width of the hardware counter in bits (4, 8, 16, 32, 64), or 0 when unknown. Needed to
  /// tell a wrap from a reset and to recognise a saturated counter.
  int width_bits = 0;
  /// True when the counter sticks at its maximum instead of wrapping (IBTA PMA error counters).
  bool saturates = false;

  /// A readable value.
  static CounterReading known(std::uint64_t v, int width_bits = 0, bool saturates = false) {
    return CounterReading{v, width_bits, saturates};
  }
  /// An unreadable counter.
  static CounterReading unknown(int width_bits = 0, bool saturates = false) {
    return CounterReading{std::nullopt, width_bits, saturates};
  }
  /// Maximum value representable in `width_bits` (all-ones); nullopt when the width is unknown.
  std::optional<std::uint64_t> max_value() const noexcept;
  /// Equality of all fields.
  friend bool operator==(const CounterReading&, const CounterReading&) = default;
};

/// How a delta was obtained.
enum class DeltaKind : std::uint8_t {
  Normal,      ///< value grew (or stayed): delta = new − old
  Baseline,    ///< first known reading: no delta yet (delta unknown)
  Wrapped,     ///< value fell on a wrapping counter of known width: modular difference
  Reset,       ///< value fell and a wrap is implausible: delta = new value (events since reset)
  Saturated,   ///< the counter reached or sits at its maximum: delta is a lower bound, or unknown
  Unreadable,  ///< the reading was unknown: delta unknown
};

/// "normal", "baseline", "wrapped", "reset", "saturated", "unreadable". Thread-safe.
std::string_view to_string(DeltaKind kind) noexcept;

/// The change of one counter between two readings. Value type.
struct CounterDelta {
  /// Events since the previous known reading; nullopt when unknown. For `Saturated` it is a
  /// lower bound (events up to the maximum) when the counter just reached its maximum, and
  /// nullopt while it stays there.
  std::optional<std::uint64_t> delta;
  /// How the delta was obtained.
  DeltaKind kind = DeltaKind::Normal;
  /// When the reading was taken.
  TimePoint time{};
  /// Time since the previous known reading (the span `delta` covers); zero when none.
  Duration interval{};
};

/// Sum and rate of the deltas inside a sliding window. Value type.
struct WindowStats {
  /// Sum of the known deltas in the window; nullopt when the window holds no known delta.
  /// When `complete` is false or `saturated` is true it is a lower bound.
  std::optional<std::uint64_t> sum;
  /// `sum` divided by the time the known deltas cover, in events per second; nullopt when
  /// `sum` is unknown or the covered time is zero.
  std::optional<double> rate_per_s;
  /// Time covered by the known deltas (sum of their intervals).
  Duration covered{};
  /// Deltas in the window, known or not.
  std::size_t samples = 0;
  /// Deltas in the window whose value is unknown (unreadable, or stuck at saturation).
  std::size_t unknown_samples = 0;
  /// True when no delta in the window is unknown.
  bool complete = true;
  /// True when the counter saturated inside the window (its sum is a lower bound).
  bool saturated = false;
  /// True when the counter was reset inside the window.
  bool reset = false;
  /// True when the counter wrapped inside the window.
  bool wrapped = false;
};

/// Deltas of the last `length` of time. Samples older than `now − length` are dropped when
/// `add` or `prune` is called. Not thread-safe. Memory grows with samples per window.
class SlidingWindow {
 public:
  /// A window `length` long (> 0; a non-positive length is clamped to 1 ns).
  explicit SlidingWindow(Duration length);
  /// Appends a delta and drops the samples that left the window relative to `d.time`.
  /// Time must not go backwards between calls (older samples are still accepted, but pruning
  /// uses the newest time seen).
  void add(const CounterDelta& d);
  /// Drops samples older than `now − length`.
  void prune(TimePoint now);
  /// Sum and rate over the samples with time in (now − length, now]. Does not modify the window.
  WindowStats stats(TimePoint now) const;
  /// The window length.
  Duration length() const noexcept { return length_; }
  /// Samples currently held.
  std::size_t size() const noexcept { return samples_.size(); }

 private:
  Duration length_;
  TimePoint newest_{};
  std::deque<CounterDelta> samples_;
};

/// Turns successive readings of ONE counter into deltas and keeps them in a sliding window.
/// Rules (in order):
/// - unknown reading → `Unreadable`, delta unknown; the last known value stays the baseline,
///   so the next known reading's delta covers the gap;
/// - first known reading → `Baseline`, delta unknown;
/// - saturating counter at its maximum → `Saturated`: delta = max − previous when it just
///   reached the maximum (a lower bound), unknown while it stays there;
/// - value ≥ previous → `Normal`;
/// - value < previous, width known, not saturating, and the modular difference is at most half
///   the range → `Wrapped`, delta = (new − old) mod 2^width;
/// - otherwise (64-bit, unknown width, saturating counter cleared, or an implausible wrap) →
///   `Reset`, delta = new value (events since the reset).
/// Not thread-safe.
class CounterTracker {
 public:
  /// A tracker whose window is `window` long.
  explicit CounterTracker(Duration window = std::chrono::seconds(60));
  /// Feeds one reading taken at `now` and returns the delta it implies (also added to the
  /// window). Never throws except `std::bad_alloc`.
  CounterDelta update(const CounterReading& reading, TimePoint now);
  /// Window statistics at `now`.
  WindowStats stats(TimePoint now) const { return window_.stats(now); }
  /// The last known raw value (the baseline of the next delta), if any.
  std::optional<std::uint64_t> last_value() const noexcept { return last_value_; }
  /// The most recent delta returned by `update` (default-constructed before the first).
  const CounterDelta& last_delta() const noexcept { return last_delta_; }

 private:
  SlidingWindow window_;
  std::optional<std::uint64_t> last_value_;
  TimePoint last_time_{};
  CounterDelta last_delta_{};
};

/// One reading with the id of the counter it belongs to; what sources return from a sweep.
using CounterSample = std::pair<CounterId, CounterReading>;

/// A tracker per counter id, created on first sight. The monitor feeds every sweep of every
/// source into one bank and builds evidence from its windows. Not thread-safe.
class CounterBank {
 public:
  /// Trackers of this bank use windows `window` long.
  explicit CounterBank(Duration window = std::chrono::seconds(60)) : window_(window) {}
  /// Feeds each sample (taken at `now`) to its tracker.
  void update(const std::vector<CounterSample>& samples, TimePoint now);
  /// Feeds one reading.
  CounterDelta update(const CounterId& id, const CounterReading& reading, TimePoint now);
  /// Window statistics of `id`; nullopt when the bank has never seen `id` (an absent counter,
  /// which callers must treat as unknown).
  std::optional<WindowStats> stats(const CounterId& id, TimePoint now) const;
  /// The tracker of `id`, or nullptr. The pointer stays valid until the bank is destroyed.
  const CounterTracker* find(const CounterId& id) const;
  /// Number of counters tracked.
  std::size_t size() const noexcept { return trackers_.size(); }
  /// Calls `f(id, tracker)` for every counter, in id order (for reports).
  template <class F>
  void for_each(F&& f) const {
    for (const auto& [id, tracker] : trackers_) f(id, tracker);
  }

 private:
  Duration window_;
  std::map<CounterId, CounterTracker> trackers_;
};

}  // namespace ringfence::health
