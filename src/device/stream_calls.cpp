#include "stream_calls.hpp"

#include <ringfence/error.hpp>

namespace ringfence::detail {

void StreamCalls::collective(const char* call, CudaStream stream, const void* send, IoBytes io, void* recv, const IssueOn& issue_on) {
  if (!device_.decide(call)) {
    const DeviceStager::Piece in{const_cast<void*>(send), io.in}, out{recv, io.out};
    staged(call, stream, std::span(&in, io.in > 0 ? 1 : 0), std::span(&out, io.out > 0 ? 1 : 0),
           [&](std::byte* i, std::byte* o) { return issue_on(i, o); });
    return;
  }
  device_.check_pointer(call, "sendbuff", send, io.in);
  device_.check_pointer(call, "recvbuff", recv, io.out);
  staged(call, stream, {}, {}, [&](std::byte*, std::byte*) { return issue_on(send, recv); }, true);
}

void StreamCalls::staged(const char* call, CudaStream stream, std::span<const DeviceStager::Piece> inputs,
                         std::span<const DeviceStager::Piece> outputs, const Queue& queue, bool device) {
  dispatch_.check_usable(call);
  const int rank = ctx_.rank;
  if (!stager_) stager_ = std::make_unique<DeviceStager>(rank, call, ctx_.options.cuda_runtime, ctx_.options.device_staging_slots);
  const std::chrono::milliseconds wait = dispatch_.effective_timeout();
  stager_->run(call, stream.handle, inputs, outputs, wait,
               [&](std::byte* in, std::byte* out, std::shared_ptr<CallEnd> end, DeviceStager::Gate gate) {
    // Waits for the input copy in short slices, so abort() and failures end it at once. A gate
    // that times out breaks the communicator like a failed collective: this rank skipped a call
    // its peers are in.
    dispatch_.set_next_gate([this, gate = std::move(gate), wait, call, device, rank] {
      const auto deadline = std::chrono::steady_clock::now() + wait;
      auto ready = [&] {
        try {
          return gate(std::chrono::milliseconds(20));
        } catch (const CudaError& e) {
          const std::string msg = fmt::format("rank {}: {} on a CUDA stream: {}", rank, call, e.what());
          failure_.record(Status(ErrorCode::Cuda, e.native()), msg);
          failure_.abort_peers(ErrorCode::Cuda, rank);
          throw CudaError(msg, e.native());
        }
      };
      while (!ready()) {
        dispatch_.check_usable(call);
        if (std::chrono::steady_clock::now() < deadline) continue;
        const std::string msg =
            fmt::format("rank {}: {} on a CUDA stream: {} did not finish within {} ms (is the stream blocked by earlier work?)", rank,
                        call, device ? "the stream's work before the call" : "the copy of the input to host staging", wait.count());
        failure_.record(Status(ErrorCode::Timeout), msg);
        failure_.abort_peers(ErrorCode::Timeout, rank);
        throw TimeoutError(msg);
      }
      if (device) device_.enter_call();  // the stream got here: the call runs on its path
    });
    dispatch_.set_next_end(std::move(end));
    try {
      Work w = queue(in, out);
      dispatch_.set_next_gate({});
      dispatch_.set_next_end({});
      return w;
    } catch (...) {
      dispatch_.set_next_gate({});
      dispatch_.set_next_end({});
      throw;
    }
  });
  if (!stager_->holds_by_stream_wait() && !told_host_function_hold_) {
    told_host_function_hold_ = true;
    ctx_.log.warn("rank {}: stream-ordered calls hold their streams with host functions (the CUDA runtime or driver offers no "
                  "cuStreamWaitValue32): safe with one rank per process; with several ranks in one process their calls may "
                  "wait for each other's host functions until the timeout (docs/device.md, \"Holding the stream\")",
                  rank);
  }
}

void StreamCalls::send_recv(const char* call, bool is_send, const void* buf, std::size_t count, DataType type, int peer,
                            CudaStream stream, bool host_ops_pending) {
  const int rank = ctx_.rank;
  dispatch_.check_usable(call);
  const std::size_t bytes = dispatch_.checks().p2p(call, buf, count, type, peer);
  RINGFENCE_EXPECTS(!host_ops_pending,
                    "rank {}: {} on a CUDA stream: this group already holds send/recv on host memory (without a stream); a "
                    "group takes one kind",
                    rank, call);
  RINGFENCE_EXPECTS(group_ops_.empty() || group_stream_ == stream.handle,
                    "rank {}: {}: stream {} differs from stream {} of this group's earlier send/recv (a group of "
                    "stream-ordered send/recv takes one stream)",
                    rank, call, stream.handle, group_stream_);
  if (bytes == 0) return;
  RINGFENCE_EXPECTS(peer != rank || dispatch_.group_depth() > 0,
                    "rank {}: {}: a transfer to or from ourselves needs its match in the same group_start()/group_end()", rank, call);
  group_stream_ = stream.handle;
  group_ops_.push_back(Transfer{is_send, peer, const_cast<void*>(buf), bytes});
  if (dispatch_.group_depth() == 0) run_group(call);
}

void StreamCalls::run_group(const char* call) {
  std::vector<Transfer> ops = std::move(group_ops_);
  group_ops_.clear();
  if (ops.empty()) return;
  // Send/recv involve only some ranks, so they never make the decision (DeviceLane::decide);
  // once a collective made it, they follow it: on the device lane, on the user's buffers.
  if (device_.verdict() > 0) {
    for (const Transfer& op : ops) device_.check_pointer(call, "buf", op.buf, op.bytes);
    std::vector<P2POp> direct;
    direct.reserve(ops.size());
    for (const Transfer& op : ops) direct.push_back(P2POp{op.is_send, op.peer, static_cast<std::byte*>(op.buf), op.bytes, 0});
    staged(call, CudaStream{group_stream_}, {}, {}, [&](std::byte*, std::byte*) {
      return dispatch_.issue(true, call, [this, call, direct = std::move(direct)] {
        running_.assign(direct.begin(), direct.end());
        dispatch_.check_p2p_routes(call, running_);
        dispatch_.run_ops(call, running_, ctx_.options.p2p_direct_user_min_bytes);
      });
    }, true);
    return;
  }
  std::vector<DeviceStager::Piece> ins, outs;
  std::vector<std::size_t> at(ops.size());  // offset of each op's bytes in staging in / out
  std::size_t in_total = 0, out_total = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    std::size_t& total = ops[i].is_send ? in_total : out_total;
    at[i] = total;
    total += ops[i].bytes;
    (ops[i].is_send ? ins : outs).push_back(DeviceStager::Piece{ops[i].buf, ops[i].bytes});
  }
  staged(call, CudaStream{group_stream_}, std::span<const DeviceStager::Piece>(ins), std::span<const DeviceStager::Piece>(outs),
         [&](std::byte* in, std::byte* out) {
           std::vector<P2POp> host;
           host.reserve(ops.size());
           for (std::size_t i = 0; i < ops.size(); ++i)
             host.push_back(P2POp{ops[i].is_send, ops[i].peer, (ops[i].is_send ? in : out) + at[i], ops[i].bytes, 0});
           return dispatch_.issue(true, call, [this, call, host = std::move(host)] {
             // run_ops consumes its list: a copy into storage the worker reuses
             running_.assign(host.begin(), host.end());
             dispatch_.check_p2p_routes(call, running_);
             dispatch_.run_ops(call, running_, ctx_.options.p2p_direct_user_min_bytes);
           });
         });
}

}  // namespace ringfence::detail
