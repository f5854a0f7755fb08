#pragma once
// What a stream-ordered call does when its host collective ends (DeviceStager: store the value
// the user's stream waits for). Runs exactly once: when the queued call finished, whether it
// ran, threw or failed, or, failing that, when the last owner drops it (the call was refused
// before it was queued, or the queue was torn down with the call still in it). A stream that
// waits for it is therefore always released, never left holding the GPU.
#include <atomic>
#include <functional>
#include <memory>
#include <utility>

namespace ringfence::detail {

class CallEnd {
 public:
  explicit CallEnd(std::function<void()> at_end) : at_end_(std::move(at_end)) {}
  ~CallEnd() { fire(); }
  CallEnd(const CallEnd&) = delete;
  CallEnd& operator=(const CallEnd&) = delete;

  /// Runs the function unless it already ran.
  void fire() noexcept {
    if (!fired_.exchange(true, std::memory_order_acq_rel) && at_end_) at_end_();
  }

 private:
  std::function<void()> at_end_;
  std::atomic<bool> fired_{false};
};

}  // namespace ringfence::detail
