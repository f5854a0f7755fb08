#pragma once
// Host-staged, stream-ordered collectives on CUDA memory (docs/device.md). Per call, on the
// user's stream: copy the input to a pinned host staging slot, record the slot's "input" event,
// hold the stream until the host collective ended, copy the result back, record the slot's
// "released" event. The host collective is queued on the communicator's progress thread in
// issue order and first polls the input event (its gate), so it never reads staging memory
// before the input copy landed; the user's stream never copies a result before it is complete.
//
// The stream is held by a stream memory operation, cuStreamWaitValue32 on the slot's word in
// mapped pinned memory, which the progress thread stores when the call ends (CallEnd: however
// it ends). No host function: the CUDA runtime may run the host functions of every stream of a
// process on one thread, and a host function that waited for a collective would hold that
// thread while the collective waits for a peer, and the peer (another rank of the same process:
// thread ranks, one process driving several GPUs) may wait for the host function of its own
// previous call queued behind ours: a deadlock, found as a 1-in-25 timeout under CPU load
// (docs/device.md, "Holding the stream"). Where the driver lacks the memory operations the
// stream is held by a host function as before, which is safe with one rank per process.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <ringfence/work.hpp>
#include <span>
#include <string>

#include <ringfence/detail/cuda_api.hpp>

#include "call_end.hpp"

namespace ringfence::detail {

class DeviceStager {
 public:
  /// The input gate: true once the input copy landed, waiting at most the given time. Throws
  /// `CudaError` when the event cannot be queried.
  using Gate = std::function<bool(std::chrono::milliseconds)>;
  /// Queues the host collective from `in` to `out` (staging memory), which must wait for
  /// `gate` first on the progress thread and fire `end` when it ended (null: nothing to fire),
  /// and returns its Work. May throw (the call then did not happen; dropping `end` fires it).
  using Issue = std::function<Work(std::byte* in, std::byte* out, std::shared_ptr<CallEnd> end, Gate gate)>;

  /// Loads the CUDA runtime (`cudart_path`, or the default names). Throws `CudaError` naming
  /// `rank` and `call` when no runtime, driver or device is usable.
  DeviceStager(int rank, const char* call, const std::string& cudart_path, std::size_t max_slots);
  /// Waits up to `drain_bound` for the streams to release every slot, then frees the staging
  /// memory and events no stream can still touch (the rest is left allocated).
  ~DeviceStager();
  DeviceStager(const DeviceStager&) = delete;
  DeviceStager& operator=(const DeviceStager&) = delete;

  /// User memory copied to or from consecutive staging bytes.
  struct Piece {
    void* ptr = nullptr;
    std::size_t bytes = 0;
  };

  /// Enqueues one staged call on `stream` (see the file comment). The `inputs` are copied, one
  /// after another, to the staging `in` that `issue` gets; the staging `out` is copied back,
  /// one piece after another, into the `outputs` (either list may be empty: a send-only group,
  /// a broadcast's non-root input). Throws `CudaError` when a CUDA call fails, `TimeoutError`
  /// when no staging slot frees up within `slot_wait`, and whatever `issue` throws.
  void run(const char* call, void* stream, std::span<const Piece> inputs, std::span<const Piece> outputs,
           std::chrono::milliseconds slot_wait, const Issue& issue);

  /// Pinned staging bytes allocated now (all slots).
  std::size_t staging_bytes() const;
  /// False once streams are held by host functions (no cuStreamWaitValue32, or the driver
  /// refused one): the fallback that can deadlock with several ranks in one process.
  bool holds_by_stream_wait() const noexcept { return wait_value_; }
  /// Slots whose stream has not released them yet (a slot whose enqueue failed half-way is
  /// never released nor reused, and not counted).
  std::size_t pending() const;

  std::chrono::milliseconds drain_bound{10000};  ///< destructor's wait for in-flight calls

 private:
  struct Slot {
    std::byte* mem = nullptr;
    std::size_t capacity = 0;
    void* input_done = nullptr;  ///< event recorded after the input copy
    void* released = nullptr;    ///< event recorded after the result copy
    bool busy = false;           ///< taken by a call
    bool armed = false;          ///< `released` is recorded: the slot is free once it completed
    std::atomic<std::uint32_t>* end_word = nullptr;  ///< in mapped pinned memory: calls that ended (null: none)
    unsigned long long end_word_device = 0;          ///< its device address
  };
  struct CallState;  // what the call's host function touches

  Slot* acquire(const char* call, std::size_t bytes, std::chrono::milliseconds wait);
  void reap() const;  // frees busy slots whose `released` event completed
  // Points the new slot number `index` at its word in `end_words_` (allocated with the first
  // slot). When the memory cannot be had, streams are held by host functions from now on.
  void give_end_word(Slot& slot, std::size_t index);
  // Holds `stream` until `slot`'s word reaches the next call count; the returned CallEnd stores
  // it. Null when the driver refused the wait (host functions from then on).
  std::shared_ptr<CallEnd> hold_on_word(Slot& slot, void* stream);

  int rank_;
  CudaApi api_;
  std::size_t max_slots_;
  mutable std::list<Slot> slots_;  // stable addresses; used by the caller's thread only
  bool wait_value_ = false;        // streams are held by cuStreamWaitValue32
  std::byte* end_words_ = nullptr; // mapped pinned memory: one cache line per slot
  unsigned long long end_words_device_ = 0;  // its device address
};

}  // namespace ringfence::detail
