// Counter deltas: saturation, wrap, reset and unreadable readings; sliding windows.
#include <ringfence/health/counters.hpp>

#include <fmt/format.h>

namespace ringfence::health {

std::string CounterId::to_string() const { return fmt::format("{}:{}:{}:{}", source, device, port, name); }

std::optional<std::uint64_t> CounterReading::max_value() const noexcept {
  if (width_bits <= 0 || width_bits > 64) return std::nullopt;
  if (width_bits == 64) return UINT64_MAX;
  return (std::uint64_t{1} << width_bits) - 1;
}

std::string_view to_string(DeltaKind kind) noexcept {
  switch (kind) {
    case DeltaKind::Normal: return "normal";
    case DeltaKind::Baseline: return "baseline";
    case DeltaKind::Wrapped: return "wrapped";
    case DeltaKind::Reset: return "reset";
    case DeltaKind::Saturated: return "saturated";
    case DeltaKind::Unreadable: return "unreadable";
  }
  return "unknown";
}

SlidingWindow::SlidingWindow(Duration length) : length_(length > Duration::zero() ? length : Duration(1)) {}

void SlidingWindow::add(const CounterDelta& d) {
  samples_.push_back(d);
  if (samples_.size() == 1 || d.time > newest_) newest_ = d.time;
  prune(newest_);
}

void SlidingWindow::prune(TimePoint now) {
  // Samples are appended in time order by the tracker, so the oldest sit at the front.
  while (!samples_.empty() && samples_.front().time <= now - length_) samples_.pop_front();
}

WindowStats SlidingWindow::stats(TimePoint now) const {
  WindowStats st;
  std::uint64_t sum = 0;
  bool any_known = false;
  for (const CounterDelta& d : samples_) {
    if (d.time <= now - length_ || d.time > now) continue;
    ++st.samples;
    st.saturated |= d.kind == DeltaKind::Saturated;
    st.reset |= d.kind == DeltaKind::Reset;
    st.wrapped |= d.kind == DeltaKind::Wrapped;
    if (!d.delta) {
      // A baseline is not a gap (nothing was missed before the first reading); every other
      // unknown delta is.
      if (d.kind != DeltaKind::Baseline) {
        ++st.unknown_samples;
        st.complete = false;
      }
      continue;
    }
    any_known = true;
    // Saturating add: a sum that overflows 64 bits is still "very many".
    sum = (UINT64_MAX - sum < *d.delta) ? UINT64_MAX : sum + *d.delta;
    st.covered += d.interval;
  }
  if (any_known) {
    st.sum = sum;
    if (st.covered > Duration::zero())
      st.rate_per_s = static_cast<double>(sum) / std::chrono::duration<double>(st.covered).count();
  }
  return st;
}

CounterTracker::CounterTracker(Duration window) : window_(window) {}

CounterDelta CounterTracker::update(const CounterReading& reading, TimePoint now) {
  CounterDelta d;
  d.time = now;
  if (!reading.value) {
    d.kind = DeltaKind::Unreadable;
  } else {
    const std::uint64_t v = *reading.value;
    const std::optional<std::uint64_t> max = reading.max_value();
    const bool at_max = reading.saturates && max && v >= *max;
    if (last_value_) d.interval = now - last_time_;
    if (!last_value_) {
      d.kind = at_max ? DeltaKind::Saturated : DeltaKind::Baseline;
    } else if (at_max) {
      d.kind = DeltaKind::Saturated;
      // Events up to the ceiling are certain; anything beyond it is invisible.
      if (*last_value_ < *max) d.delta = *max - *last_value_;
    } else if (v >= *last_value_) {
      d.kind = DeltaKind::Normal;
      d.delta = v - *last_value_;
    } else {
      d.kind = DeltaKind::Reset;
      d.delta = v;
      if (!reading.saturates && max && *max != UINT64_MAX) {
        // Modular difference; a wrap that would imply more than half the range of events
        // between two samples is far less likely than a reset (driver reload, counter clear).
        const std::uint64_t modular = (v - *last_value_) & *max;
        if (modular <= *max / 2 + 1) {
          d.kind = DeltaKind::Wrapped;
          d.delta = modular;
        }
      }
    }
    last_value_ = v;
    last_time_ = now;
  }
  window_.add(d);
  last_delta_ = d;
  return d;
}

void CounterBank::update(const std::vector<CounterSample>& samples, TimePoint now) {
  for (const CounterSample& s : samples) update(s.first, s.second, now);
}

CounterDelta CounterBank::update(const CounterId& id, const CounterReading& reading, TimePoint now) {
  auto it = trackers_.find(id);
  if (it == trackers_.end()) it = trackers_.emplace(id, CounterTracker(window_)).first;
  return it->second.update(reading, now);
}

std::optional<WindowStats> CounterBank::stats(const CounterId& id, TimePoint now) const {
  const CounterTracker* t = find(id);
  if (t == nullptr) return std::nullopt;
  return t->stats(now);
}

const CounterTracker* CounterBank::find(const CounterId& id) const {
  auto it = trackers_.find(id);
  return it == trackers_.end() ? nullptr : &it->second;
}

}  // namespace ringfence::health
