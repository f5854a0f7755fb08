#pragma once
// What ends a stream-ordered call for the user's stream (DeviceStager): the store of `value`
// into the slot's word that the stream waits for (cuStreamWaitValue32). Stored exactly once:
// when the queued call finished, whether it ran, threw or failed, or, failing that, when the last
// owner drops it (the call was refused before it was queued, or the queue was torn down with
// the call still in it), so the stream is always released. Once, not "at least once": a late
// second store of this value, after the slot was reused for a later call waiting for a higher
// one, would hold that call's stream for good.
#include <atomic>
#include <cstdint>

namespace ringfence::detail {

class CallEnd {
 public:
  CallEnd(std::atomic<std::uint32_t>& word, std::uint32_t value) noexcept : word_(word), value_(value) {}
  ~CallEnd() { fire(); }
  CallEnd(const CallEnd&) = delete;
  CallEnd& operator=(const CallEnd&) = delete;

  /// Stores the value unless it was stored already.
  void fire() noexcept {
    if (!fired_.exchange(true, std::memory_order_acq_rel)) word_.store(value_, std::memory_order_release);
  }

 private:
  std::atomic<std::uint32_t>& word_;  // in mapped pinned memory the stager keeps while a stream may wait on it
  std::uint32_t value_;
  std::atomic<bool> fired_{false};
};

}  // namespace ringfence::detail
