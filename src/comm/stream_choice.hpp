#pragma once
// StreamChoice: whether chunks go into peers' slots with streaming stores, kept true to the
// host while the job runs (docs/tuning.md "Streaming slot writes", "Choosing again while the
// job runs").
//
// The setup probe (stream_probe.hpp) decides once, in a few milliseconds. On the AMD VM the
// cores' way of handing lines over changes within minutes, and a probe that caught the other
// mode left a job 1.3-2.9 times slower for its whole life. So, with auto, every collective of
// at least kMinBytes on the host lanes is timed, and on a schedule of collective numbers (the
// same on every rank: they make the same collectives) one call runs as a trial with every rank
// on one kind of store, plain and streaming by turns. A rank adopts the trial's kind when the
// call took under kWin of the best of its recent calls of the same kind and size. The trial is
// the same call on every rank and every rank's time is that of the whole exchange, so they
// decide alike; a rank left on the other kind joins the others at the next trial of their kind
// (for them an ordinary call: a trial of the kind a rank already uses is one for it).
//
// Pure bookkeeping, no clock and no allocation: the dispatcher times the calls.
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace ringfence::detail {

class StreamChoice {
 public:
  /// Calls below this many bytes are neither timed nor trials (their chunks stay under the
  /// streaming threshold or their time is mostly fixed costs).
  static constexpr std::size_t kMinBytes = 64 * 1024;
  /// The first trial waits for this many collectives: the probe's answer stands for a job's
  /// first steps, and a benchmark run of a few hundred calls (bench/compare.sh's) sees no trial.
  /// A trial of the worse kind makes its one call slower (up to 3 times on the AMD VM).
  static constexpr std::uint64_t kFirstTrial = 1024;
  /// Trials then come 2048, 4096, ... collectives apart, at most this many.
  static constexpr std::uint64_t kMaxGap = 4096;
  /// A trial wins where it took under this share of the best recent call (the probe's margin).
  static constexpr double kWin = 0.8;
  /// Recent calls kept per kind and size (powers of two of bytes).
  static constexpr int kKeep = 4;
  /// A kind and size is tried only when its last kKeep calls all ran within this many
  /// collectives (older times may be from another mode of the host).
  static constexpr std::uint64_t kFresh = 256;
  /// Kinds of call the caller numbers (Dispatch: RingCollective's eight values, then alltoall).
  static constexpr int kKinds = 9;
  /// Sizes kept apart: powers of two from kMinBytes (2^16) up; larger calls share the last.
  static constexpr int kBuckets = 32;

  /// `initial`: the setup's choice. `adapts`: auto mode on a host where the probe ran (else the
  /// choice stays `initial` and nothing is timed). Once, on a new StreamChoice, before begin().
  void start(bool initial, bool adapts) noexcept;

  /// One call as begin() planned it.
  struct Call {
    bool stream = false;  // the kind of store this call uses
    bool timed = false;   // end() wants its time
    bool trial = false;   // runs on the trial's kind (which may be the current one)
    int kind = 0, bucket = 0;
    std::size_t bytes = 0;
    std::uint64_t seq = 0;
  };

  /// Plans collective number `seq` of `bytes` and `kind` (< kKinds: the caller's numbering of
  /// collectives, so that unlike calls are not compared).
  Call begin(int kind, std::size_t bytes, std::uint64_t seq) noexcept;

  /// What a finished call taught.
  struct Outcome {
    bool switched = false;
    double trial_ns = 0;     // the trial call's time (switched only)
    double previous_ns = 0;  // the best recent call's time, scaled to the trial's bytes
  };
  /// The call planned by `c` took `took`. Not called for calls that failed.
  Outcome end(const Call& c, std::chrono::nanoseconds took) noexcept;

  /// The kind of store calls use outside trials.
  bool current() const noexcept { return current_; }
  std::uint32_t switches() const noexcept { return switches_; }
  /// Collective number at or after which the next trial runs.
  std::uint64_t next_trial() const noexcept { return next_trial_; }

 private:
  struct Recent {
    std::array<double, kKeep> ns_per_byte{};  // the last kKeep calls, a ring
    std::array<std::uint64_t, kKeep> seq{};   // their collective numbers
    std::uint64_t count = 0;                  // calls recorded
  };
  bool initial_ = false, current_ = false, adapts_ = false;
  std::uint64_t next_trial_ = kFirstTrial, gap_ = 2 * kFirstTrial;
  std::uint32_t trials_ = 0, switches_ = 0;
  std::array<std::array<Recent, kBuckets>, kKinds> recent_{};
};

}  // namespace ringfence::detail
