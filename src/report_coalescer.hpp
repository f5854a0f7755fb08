#pragma once
// Holds back a report that repeats: a link with no route around keeps corrupting chunks for the
// rest of the job (it stays in use, checked), and reporting every agreement that saw a mismatch,
// or every call whose fingerprint came damaged, wrote thousands of events and warnings a minute
// (a 2-rank all_reduce_perf with flip:rate=1e-4: 3,219 checksum_errors events in 4 s). The first
// report goes out at once, so a fault is seen as early as before; later ones at most once per
// interval, each carrying the sum of what was held back, so totals stay exact.
#include <chrono>
#include <cstdint>

namespace ringfence::detail {

class ReportCoalescer {
 public:
  using Clock = std::chrono::steady_clock;

  /// At most one report per `interval` after the first.
  explicit ReportCoalescer(Clock::duration interval) noexcept : interval_(interval) {}

  /// Adds `count` occurrences at `now` (0 only lets out what is held back once the interval has
  /// passed). Returns the sum to report now, this count and those held back since the last
  /// report, or 0 when nothing is to be reported yet.
  std::uint64_t add(std::uint64_t count, Clock::time_point now) noexcept {
    held_ += count;
    if (held_ == 0 || (reported_ && now - last_ < interval_)) return 0;
    reported_ = true;
    last_ = now;
    const std::uint64_t out = held_;
    held_ = 0;
    return out;
  }

  /// What is held back (for a last report when the reporter stops); nothing is held after.
  std::uint64_t take_held() noexcept {
    const std::uint64_t out = held_;
    held_ = 0;
    return out;
  }

  /// Whether occurrences are held back, waiting for the interval to pass.
  bool holds() const noexcept { return held_ != 0; }

  /// When the last report went out (meaningless before the first).
  Clock::time_point last_report() const noexcept { return last_; }

 private:
  Clock::duration interval_;
  Clock::time_point last_{};
  std::uint64_t held_ = 0;
  bool reported_ = false;
};

}  // namespace ringfence::detail
