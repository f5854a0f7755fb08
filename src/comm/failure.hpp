#pragma once
// How a communicator fails: the first failure (later ones are its consequences), the abort
// words that end in-flight work here and on the peers, and the sentence a failed call throws,
// naming the rank, the peer and the link.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <ringfence/status.hpp>
#include <string>

#include "lane.hpp"

namespace ringfence::detail {

class Lanes;
struct CommContext;

/// The first failure of a communicator, and the abort words that spread it: to this rank's
/// waits on every lane (`local_abort`) and to the peers (`abort_peers`). Any thread.
class CommFailure {
 public:
  CommFailure(const CommContext& ctx, Lanes& lanes) noexcept : ctx_(ctx), lanes_(lanes) {}

  /// Records `s` with its reason unless a failure was recorded already (then false).
  bool record(Status s, const std::string& why) noexcept;
  /// Whether a failure was recorded (lock-free).
  bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }
  /// The failure (Ok when none).
  Status status() const noexcept;
  /// The failure and its reason.
  std::pair<Status, std::string> get() const;
  /// Throws the recorded failure's exception as "rank R: CALL on a communicator that already
  /// failed: WHY"; nothing when none was recorded.
  void throw_if_failed(const char* call) const;
  /// Ends this rank's in-flight work: every lane's abort word names us as the reporter (a local
  /// abort) and `blamed` as the cause. Waits see it within one sleep slice (50 ms). Never blocks.
  void local_abort(ErrorCode code, int blamed) noexcept;
  /// Tells every peer that this rank failed, so ranks waiting on others fail at once with a
  /// message naming us instead of running into their own timeouts. Best effort, never throws.
  void abort_peers(ErrorCode code, int blamed) noexcept;
  /// Passes on the abort that `origin` sent (its error class and the rank it blamed) to every
  /// peer but `origin`. A rank waiting on us may not have heard from `origin` yet (no
  /// connection to it, or not polled yet); once we close our links it would see only our
  /// absence and blame us. Best effort, never throws.
  void forward_abort(ErrorCode code, int origin, int blamed) noexcept;
  /// `record`, `local_abort` and `abort_peers` at once (a part that failed outside a call).
  void fail(Status s, const std::string& why, int blamed) noexcept;

 private:
  const CommContext& ctx_;
  Lanes& lanes_;
  mutable std::mutex mutex_;
  Status status_;
  std::atomic<bool> failed_{false};
  std::string why_;  // complete sentence naming the ranks, without the call
};

/// An error class as the abort word carries it, in words for a message.
std::string class_of(ErrorCode code);

/// Sets `lane`'s own abort word to `value` unless one is set (a local abort: waits on this
/// lane see it within one sleep slice). Any thread; never blocks.
void set_local_abort(LaneState& lane, std::uint32_t value) noexcept;

/// Writes `value` into the abort word of every peer of `lane` but `skip` (best effort, never
/// throws).
void signal_abort(LaneState& lane, int size, std::uint32_t value, int skip = -1) noexcept;

/// What a failed call reports: the status it throws and the message.
struct FailureReport {
  Status status;
  std::string message;
};

/// The report of call `call` (#`seq`) of `rank` that failed with `f` (a failure of the data
/// path, not a local abort): `link_transport` is the transport of the link it failed on (null:
/// local), `timeout` the call's deadline, `silent_note` what the heartbeat says of silent peers.
/// A peer's abort() reaches us as an unreachable peer (our own abort() is AbortedError).
FailureReport describe_failure(int rank, const char* call, std::uint64_t seq, const Failure& f, const std::string* link_transport,
                               std::chrono::nanoseconds timeout, const std::string& silent_note);

}  // namespace ringfence::detail
