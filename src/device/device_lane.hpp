#pragma once
// The device lane (docs/device.md "Device regions in the engine"): stream-ordered collectives
// run the executor on the user's device buffers over a lane of their own, whose links are device
// transports (nvlink, pcie) and whose staging slots and scratch are device memory. Every rank
// decides together at the first stream-ordered collective whether to build it (`decide`); from
// then on a call that runs on it asks `current()` for it instead of testing a flag.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "../comm/context.hpp"
#include "../comm/failure.hpp"
#include "../comm/lanes.hpp"
#include "../comm/plan_state.hpp"
#include <ringfence/detail/cuda_api.hpp>
#include "../device_kernels.hpp"

namespace ringfence::detail {

class DeviceLane {
 public:
  DeviceLane(CommContext& ctx, Lanes& lanes, const PlanState& plan, CommFailure& failure) noexcept
      : ctx_(ctx), lanes_(lanes), plan_(plan), failure_(failure) {}
  DeviceLane(const DeviceLane&) = delete;
  DeviceLane& operator=(const DeviceLane&) = delete;

  /// At communicator setup, before any stream-ordered call: where device regions could run later
  /// (not off, checksums off, a transport that writes device memory, a CUDA device), loads the kernel module
  /// and its kernels into the current device's context now (`DeviceKernels::preload`): CUDA
  /// would load them at the first launch, on the progress thread, and that load may wait for a
  /// user stream our own host function holds (docs/device.md "Kernel loading"). A failure is
  /// logged and left to `decide`, which then refuses with the reason. Never throws.
  void prepare() noexcept;
  /// Whether stream-ordered collective `call` runs on the device lane. The first call decides,
  /// on every rank at the same call (stream-ordered collectives are issued in the same order
  /// everywhere): each rank posts whether it can, and the lane is built only when all can.
  /// Throws `CudaError` when RINGFENCE_DEVICE_REGIONS=on and some rank cannot.
  bool decide(const char* call);
  /// 0: not decided yet, 1: device lane, -1: staged.
  int verdict() const noexcept { return verdict_; }
  /// Why staged (the first rank that could not, and why).
  const std::string& why_not() const noexcept { return why_not_; }
  bool built() const noexcept { return lane_ != nullptr; }
  LaneState& lane() noexcept { return *lane_; }

  /// The call about to run on the progress thread runs on the device lane (its gate said so)
  /// until `leave()`.
  void enter_call() noexcept { active_ = true; }
  void leave_call() noexcept { active_ = false; }
  /// The device lane while a call runs on it, else null: what dispatch asks.
  DeviceLane* current() noexcept { return active_ ? this : nullptr; }

  /// Throws `InvalidUsage` unless `p` is memory the GPU can address (device, managed or pinned host).
  void check_pointer(const char* call, const char* what, const void* p, std::size_t bytes) const;
  /// Makes the lane's GPU current on this thread: kernels launch only into streams of the
  /// thread's current device, and the progress thread is not the one that chose it. Throws
  /// `CudaError` ("rank R: <what>: cudaSetDevice failed: ...").
  void make_current(const std::string& what) const;
  /// Runs ring collective `c` (tree, direct and one-shot too) on the device lane in the plan's
  /// ring order: every link direct (the lane has one to every peer, so fenced hops need no
  /// relay). A CUDA failure outside the executor fails the communicator and throws `CudaError`.
  Status run(const char* call, const RingCall& c, const Reducer& reducer, Failure& failure);
  /// Runs a group of point-to-point transfers on the device lane (no direct writes: keys of user
  /// device buffers are not exchanged).
  Status run_p2p(const char* call, P2POp* ops, std::size_t n, Failure& failure);

  /// The first transport (registry order) that writes device memory and reaches `peer`, or the
  /// one named `name` if it does; null = none.
  Transport* transport(int peer, std::string_view name = {}) const;
  /// The device transport a link to `peer` over `from` moves to when it must be fenced: the
  /// first allowed pair (CommOptions::fallbacks) from `from` to another transport that writes
  /// device memory and reaches the peer; null = none.
  Transport* fallback(const std::string& from, int peer) const;

  /// Destroys the lane's stream (teardown, after its connections are gone).
  void destroy_stream() noexcept;

 private:
  std::string refusal(std::vector<Transport*>& via);
  const char* configured_off() const noexcept;
  void build(const char* call, const std::vector<Transport*>& via);
  // A CUDA call of a device-lane collective failed outside the executor: the communicator fails
  // (the peers learn it at once) and the call throws CudaError(`why`).
  [[noreturn]] void call_failed(const std::string& why, int err);
  void enter(const char* call);

  CommContext& ctx_;
  Lanes& lanes_;
  const PlanState& plan_;
  CommFailure& failure_;
  std::unique_ptr<LaneState> lane_;
  int verdict_ = 0;
  std::string why_not_;
  CudaApi cuda_;
  DeviceKernels kernels_;
  bool kernels_loaded_ = false;  // prepare() loaded (and preloaded) the module: refusal() keeps it
  int ordinal_ = 0;  // the CUDA device current on the thread that built the lane
  DeviceRegions regions_;
  std::vector<Connection*> connection_of_;        // by rank (null for ourselves)
  std::vector<Connection*> position_connection_;  // by ring position, for tree/direct/one-shot
  std::byte* oneshot_input_ = nullptr;      // one slot of device memory: an in-place one-shot allreduce's input
  bool active_ = false;
};

}  // namespace ringfence::detail
