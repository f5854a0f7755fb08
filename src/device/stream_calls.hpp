#pragma once
// Stream-ordered calls (docs/device.md): collectives and send/recv groups issued on a CUDA
// stream. Each runs as an asynchronous host call in issue order, either on the user's device
// buffers over the device lane (when every rank chose it, DeviceLane::decide) or on pinned host
// staging (DeviceStager): input copied to staging on the stream, the host call on the progress
// thread after its input gate, the result copied back on the stream.
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "../comm/dispatch.hpp"
#include "../device_staging.hpp"
#include "device_lane.hpp"

namespace ringfence::detail {

class StreamCalls {
 public:
  StreamCalls(CommContext& ctx, CommFailure& failure, DeviceLane& device, Dispatch& dispatch) noexcept
      : ctx_(ctx), failure_(failure), device_(device), dispatch_(dispatch) {}

  /// Issues the asynchronous host call from `in` to `out`.
  using IssueOn = std::function<Work(const void* in, void* out)>;
  /// Runs one stream-ordered collective whose argument checks ran (`io`: its bytes): on the
  /// device lane `issue_on` gets the user's `send` and `recv` (memory the GPU can address), and
  /// the stream only the gate's event and the wait for the call's end; else staging.
  void collective(const char* call, CudaStream stream, const void* send, IoBytes io, void* recv, const IssueOn& issue_on);
  /// Stream-ordered send/recv: queued like host ones (one stream per group), then run as one
  /// call. `host_ops_pending`: the group already holds host transfers (refused).
  void send_recv(const char* call, bool is_send, const void* buf, std::size_t count, DataType type, int peer, CudaStream stream,
                 bool host_ops_pending);
  /// Whether the open group holds stream-ordered transfers.
  bool has_ops() const noexcept { return !group_ops_.empty(); }
  /// Runs the queued stream-ordered transfers (group_end).
  void run_group(const char* call);
  /// Pinned host staging bytes held (0 before the first staged call).
  std::size_t staging_bytes() const { return stager_ ? stager_->staging_bytes() : 0; }

 private:
  using Queue = std::function<Work(std::byte* in, std::byte* out)>;
  // Runs one call: `queue(in, out)` issues the asynchronous host call from staging `in` to
  // staging `out`; the user buffers `inputs` are packed one after another into `in`, `outputs`
  // unpacked from `out`. `device`: the call runs on the device lane, staging nothing.
  void staged(const char* call, CudaStream stream, std::span<const DeviceStager::Piece> inputs,
              std::span<const DeviceStager::Piece> outputs, const Queue& queue, bool device = false);

  struct Transfer {
    bool is_send = false;
    int peer = -1;
    void* buf = nullptr;
    std::size_t bytes = 0;
  };
  CommContext& ctx_;
  CommFailure& failure_;
  DeviceLane& device_;
  Dispatch& dispatch_;
  std::unique_ptr<DeviceStager> stager_;
  std::vector<Transfer> group_ops_;  // queued by the stream-ordered send()/recv()
  void* group_stream_ = nullptr;     // their stream
  bool told_host_function_hold_ = false;  // warned once that streams are held by host functions
  std::vector<P2POp> running_;       // the worker's copy of a running group (reused)
};

}  // namespace ringfence::detail
