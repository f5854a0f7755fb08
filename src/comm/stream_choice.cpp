#include "stream_choice.hpp"

#include <algorithm>
#include <bit>

namespace ringfence::detail {

void StreamChoice::start(bool initial, bool adapts) noexcept {
  initial_ = current_ = initial;
  adapts_ = adapts;
}

StreamChoice::Call StreamChoice::begin(int kind, std::size_t bytes, std::uint64_t seq) noexcept {
  Call c;
  c.stream = current_;
  if (!adapts_ || bytes < kMinBytes || kind < 0 || kind >= kKinds) return c;
  c.timed = true;
  c.kind = kind;
  c.bucket = std::min(static_cast<int>(std::bit_width(bytes) - std::bit_width(kMinBytes)), kBuckets - 1);
  c.bytes = bytes;
  c.seq = seq;
  // Whether this is the trial depends only on the calls made so far, never on their times, so
  // every rank making the same calls picks the same one.
  const Recent& r = recent_[static_cast<std::size_t>(kind)][static_cast<std::size_t>(c.bucket)];
  if (seq >= next_trial_ && r.count >= kKeep && seq - *std::min_element(r.seq.begin(), r.seq.end()) <= kFresh) {
    c.trial = true;
    // By turns: first the kind the probe did not choose (the same on every rank of a host).
    c.stream = trials_ % 2 == 0 ? !initial_ : initial_;
    ++trials_;
    next_trial_ = seq + gap_;
    gap_ = std::min(2 * gap_, kMaxGap);
  }
  return c;
}

StreamChoice::Outcome StreamChoice::end(const Call& c, std::chrono::nanoseconds took) noexcept {
  Outcome o;
  if (!c.timed || c.bytes == 0) return o;
  const double per_byte = static_cast<double>(took.count()) / static_cast<double>(c.bytes);
  Recent& r = recent_[static_cast<std::size_t>(c.kind)][static_cast<std::size_t>(c.bucket)];
  if (c.stream == current_) {  // an ordinary call (a trial of the current kind is one for this rank)
    const auto at = static_cast<std::size_t>(r.count % kKeep);
    r.ns_per_byte[at] = per_byte;
    r.seq[at] = c.seq;
    ++r.count;
    return o;
  }
  const double best = *std::min_element(r.ns_per_byte.begin(), r.ns_per_byte.end());
  if (per_byte < kWin * best) {
    current_ = c.stream;
    ++switches_;
    o.switched = true;
    o.trial_ns = per_byte * static_cast<double>(c.bytes);
    o.previous_ns = best * static_cast<double>(c.bytes);
  }
  return o;
}

}  // namespace ringfence::detail
