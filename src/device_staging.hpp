#pragma once
// Host-staged, stream-ordered collectives on CUDA memory (docs/device.md). Per call, on the
// user's stream: copy the input to pinned host staging, a host function that opens the call's
// gate, a host function that waits for the host collective, the copy of the result back, and
// a host function that frees the staging slot. The host collective itself is queued on the
// communicator's progress thread in issue order and waits at the gate first, so it never reads
// staging memory before the input copy landed, and the user's stream never copies a result
// before it is complete.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <ringfence/communicator.hpp>
#include <string>
#include <vector>

#include "cuda_api.hpp"

namespace ringfence::detail {

class DeviceStager {
 public:
  /// The input gate: true once the input copy landed, waiting at most the given time.
  using Gate = std::function<bool(std::chrono::milliseconds)>;
  /// Queues the host collective from `in` to `out` (staging memory), which must wait for
  /// `gate` first on the progress thread, and returns its Work. May throw (the call then did
  /// not happen).
  using Issue = std::function<Work(std::byte* in, std::byte* out, Gate gate)>;

  /// Loads the CUDA runtime (`cudart_path`, or the default names). Throws `CudaError` naming
  /// `rank` and `call` when no runtime, driver or device is usable.
  DeviceStager(int rank, const char* call, const std::string& cudart_path, std::size_t max_slots);
  /// Waits up to `drain_bound` for the streams to pass every call's last host function, then
  /// frees the staging memory no stream can still touch (the rest is left allocated).
  ~DeviceStager();
  DeviceStager(const DeviceStager&) = delete;
  DeviceStager& operator=(const DeviceStager&) = delete;

  /// Enqueues one staged call on `stream` (see the file comment). `in_bytes` from `src` go to
  /// staging, `out_bytes` come back to `dst` (either may be 0). Throws `CudaError` when a CUDA
  /// call fails, `TimeoutError` when no staging slot frees up within `input_wait`, and
  /// whatever `issue` throws.
  void run(const char* call, void* stream, const void* src, std::size_t in_bytes, void* dst, std::size_t out_bytes,
           std::chrono::milliseconds input_wait, const Issue& issue);

  /// Pinned staging bytes allocated now (all slots).
  std::size_t staging_bytes() const;
  /// Calls whose last host function has not run yet.
  std::size_t pending() const;
  /// The runtime library in use.
  const std::string& library() const noexcept { return api_.library; }

  std::chrono::milliseconds drain_bound{10000};  ///< destructor's wait for in-flight calls

 private:
  struct Slot {
    std::byte* mem = nullptr;
    std::size_t capacity = 0;
    bool busy = false;
  };
  struct Shared;  // what host functions touch: outlives this object while calls are in flight
  struct CallState;

  Slot* acquire(const char* call, std::size_t bytes, std::chrono::milliseconds wait);

  int rank_;
  CudaApi api_;
  std::size_t max_slots_;
  std::shared_ptr<Shared> shared_;
};

}  // namespace ringfence::detail
