#pragma once
/// \file schedule.hpp
/// Collective schedules as pure data: a schedule is a function from a step index to a `Step`,
/// computed without allocation from (rank, size, count, chunking). The executor runs steps
/// over links; tests simulate them for many sizes and counts.

#include <cstddef>
#include <cstdint>

namespace ringfence {

/// What one step does. Buffers: `input` (send buffer), `output` (receive buffer), `inbox`
/// (staging slot that the peer's matching Send wrote into).
enum class StepKind : std::uint8_t {
  SendInput,      ///< send input[offset, +count) to `peer`
  SendOutput,     ///< send output[offset, +count) to `peer` (a partial result, into its staging slot)
  SendFinal,      ///< send output[offset, +count) to `peer`, a final value: may go straight into its output
  RecvReduce,     ///< output[offset..] = inbox op input[offset..] (partial result)
  RecvReduceLast, ///< same, producing the final value (avg divides here)
  RecvCopy,       ///< output[offset..] = inbox (or nothing, when the sender wrote the output directly)
  CopyInput,      ///< output[offset..] = input[offset..] (local, no peer)
};

/// True for the step kinds that send to `Step::peer`.
constexpr bool is_send(StepKind kind) noexcept {
  return kind == StepKind::SendInput || kind == StepKind::SendOutput || kind == StepKind::SendFinal;
}

/// One step of a schedule. Offsets and counts are in elements.
struct Step {
  StepKind kind = StepKind::CopyInput;
  int peer = -1;            ///< peer rank for sends and receives, -1 for local steps
  std::size_t offset = 0;   ///< element offset in input/output
  std::size_t count = 0;    ///< elements (> 0: empty steps are never produced)
};

/// Element range [begin, begin + count) of segment `index` when `count` elements are split into
/// `parts` near-equal parts (the first `count % parts` parts hold one extra element).
struct Range {
  std::size_t begin = 0;
  std::size_t count = 0;
};
/// See `Range`. `parts` > 0, `index` < `parts`.
constexpr Range split(std::size_t count, std::size_t parts, std::size_t index) noexcept {
  const std::size_t base = count / parts, extra = count % parts;
  const std::size_t begin = index * base + (index < extra ? index : extra);
  return Range{begin, base + (index < extra ? 1 : 0)};
}

/// Ring allreduce: reduce-scatter then allgather around the ring rank → rank+1, pipelined in
/// chunks of at most `chunk_elems` elements. Segment s (of `size` near-equal segments) is
/// reduced along the ring starting at rank s and finished by rank s-1 (mod size), so every
/// element is reduced in the same order once and copied to the other ranks: results are
/// bit-identical on every rank.
///
/// Steps are generated on demand: `next(step)` fills `step` and returns false at the end.
/// Each Send to the right neighbour has exactly one matching Recv* at that neighbour, in the
/// same order, so message sequence numbers on a link agree on both ends.
class RingAllreduceSchedule {
 public:
  /// `chunk_elems` > 0. `size` >= 1, 0 <= `rank` < `size`.
  constexpr RingAllreduceSchedule(int rank, int size, std::size_t count, std::size_t chunk_elems) noexcept
      : rank_(rank), size_(size), count_(count), chunk_(chunk_elems ? chunk_elems : 1) {
    const Range largest = split(count, static_cast<std::size_t>(size), 0);
    chunks_ = (largest.count + chunk_ - 1) / chunk_;
  }

  /// Left neighbour (receives come from it).
  constexpr int left() const noexcept { return (rank_ + size_ - 1) % size_; }
  /// Right neighbour (sends go to it).
  constexpr int right() const noexcept { return (rank_ + 1) % size_; }
  /// Number of pipeline chunks per segment.
  constexpr std::size_t chunks() const noexcept { return chunks_; }

  /// Produces the next step; false when the schedule is finished.
  constexpr bool next(Step& out) noexcept {
    if (size_ == 1) {
      if (done_single_ || count_ == 0) return false;
      done_single_ = true;
      out = Step{StepKind::CopyInput, -1, 0, count_};
      return true;
    }
    // Position: chunk c, ring phase p in [0, 2(n-1)), half h (0 = send, 1 = receive).
    const std::size_t phases = 2 * static_cast<std::size_t>(size_ - 1);
    while (chunk_idx_ < chunks_) {
      const std::size_t c = chunk_idx_, p = phase_;
      const bool recv = half_ == 1;
      if (++half_ == 2) {  // advance the cursor: half, then phase, then chunk
        half_ = 0;
        if (++phase_ == phases) {
          phase_ = 0;
          ++chunk_idx_;
        }
      }
      const std::size_t n = static_cast<std::size_t>(size_);
      const std::size_t r = static_cast<std::size_t>(rank_);
      std::size_t seg;
      StepKind kind;
      if (p < n - 1) {  // reduce-scatter step k = p
        const std::size_t k = p;
        if (!recv) {
          seg = (r + n - k) % n;
          kind = k == 0 ? StepKind::SendInput : StepKind::SendOutput;
        } else {
          seg = (r + 2 * n - k - 1) % n;
          kind = k == n - 2 ? StepKind::RecvReduceLast : StepKind::RecvReduce;
        }
      } else {  // allgather step k = p - (n - 1)
        const std::size_t k = p - (n - 1);
        seg = recv ? (r + n - k) % n : (r + 1 + n - k) % n;
        kind = recv ? StepKind::RecvCopy : StepKind::SendFinal;
      }
      const Range s = split(count_, n, seg);
      const std::size_t begin = c * chunk_;
      if (begin >= s.count) continue;  // this segment has no chunk c: skipped on both ends
      const std::size_t len = s.count - begin < chunk_ ? s.count - begin : chunk_;
      out = Step{kind, recv ? left() : right(), s.begin + begin, len};
      return true;
    }
    return false;
  }

 private:
  int rank_;
  int size_;
  std::size_t count_;
  std::size_t chunk_;
  std::size_t chunks_ = 0;
  std::size_t chunk_idx_ = 0;
  std::size_t phase_ = 0;
  int half_ = 0;
  bool done_single_ = false;
};

}  // namespace ringfence
