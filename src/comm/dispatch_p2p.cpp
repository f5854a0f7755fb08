// Point-to-point on host memory: send/recv queued in groups (group_start/group_end) and run
// together so any pattern completes without deadlock; direct writes into the receiver's buffer
// from `direct_write_min_bytes`.
#include <ringfence/error.hpp>

#include "dispatch.hpp"

namespace ringfence::detail {

void Dispatch::send_recv(const char* call, bool is_send, const void* buf, std::size_t count, DataType type, int peer,
                         bool stream_ops_pending) {
  const int rank = p_.ctx.rank;
  check_usable(call);
  const std::size_t bytes = checks().p2p(call, buf, count, type, peer);
  if (bytes == 0) return;
  RINGFENCE_EXPECTS(peer != rank || group_depth_ > 0,
                    "rank {}: {}: a transfer to or from ourselves needs its match in the same group_start()/group_end()", rank, call);
  RINGFENCE_EXPECTS(!stream_ops_pending, "rank {}: {}: this group already holds send/recv on a CUDA stream; a group takes one kind",
                    rank, call);
  group_ops_.push_back(P2POp{is_send, peer, static_cast<std::byte*>(const_cast<void*>(buf)), bytes, 0});
  if (group_depth_ == 0) run_host_group(call);
}

void Dispatch::group_start(const char* call) {
  check_usable(call);
  ++group_depth_;
}

bool Dispatch::group_end(const char* call) {
  RINGFENCE_EXPECTS(group_depth_ > 0, "rank {}: {}: no matching group_start()", p_.ctx.rank, call);
  if (--group_depth_ > 0) return false;
  check_usable(call);
  return true;
}

void Dispatch::run_host_group(const char* call) {
  if (group_ops_.empty()) return;
  drain();  // queued asynchronous work runs first (issue order)
  apply_timeout(call_timeout_);
  check_p2p_routes(call, group_ops_);
  run_ops(call, group_ops_, p_.ctx.options.p2p_direct_user_min_bytes);
  refresh_metrics_if_due();
}

void Dispatch::check_p2p_routes(const char* call, std::vector<P2POp>& ops) {
  for (const auto& op : ops)
    if (op.peer != p_.ctx.rank && p_.plan.is_fenced(p_.ctx.rank, op.peer)) {
      ops.clear();
      const Failure f{Status(ErrorCode::Fenced), op.peer,
                      "a route for point-to-point transfers over a fenced link (no fallback transport both ends allow, "
                      "RINGFENCE_FALLBACK, took the pair, and no third rank relays send/recv)",
                      0};
      raise(call, f);
    }
}

// `check`: a collective's fingerprint check left to the executor (Dispatch::exchange_check), judged
// after it ran; host memory only.
void Dispatch::run_ops(const char* call, std::vector<P2POp>& ops, std::size_t user_min_bytes, bool whole_exchange, CallCheck* check) {
  Failure failure;
  LaneState& lane0 = p_.lanes.main();
  DeviceLane* device = p_.device.current();
  p_.regs.begin_call();
  const Status s = device ? device->run_p2p(call, ops.data(), ops.size(), failure)
                          : run_p2p(lane0.engine, lane0.flags, p_.lanes.by_rank(), ops.data(), ops.size(),
                                    p2p_direct(user_min_bytes, whole_exchange), failure, nullptr, check);
  ops.clear();
  p_.agreement.report_p2p_checksum_errors();  // a send/recv-only job runs no agreement to report them
  if (check) judge_call(call);  // first: a disagreement explains a failure better than what it caused
  if (!s.is_ok()) raise(call, failure);
}

// Point-to-point direct writes (see P2PDirect).
P2PDirect Dispatch::p2p_direct(std::size_t user_min_bytes, bool whole_exchange) noexcept {
  P2PDirect d;
  d.whole_exchange = whole_exchange;
  d.enabled = p_.ctx.size > 1;  // with checksums too: the receiver verifies its buffer (run_p2p)
  d.min_bytes = p_.ctx.options.direct_write_min_bytes;
  d.user_min_bytes = user_min_bytes;
  d.ctx = this;
  d.key_of = [](const P2PDirect& d, void* ptr, std::size_t bytes, Connection& ch) noexcept -> std::span<const std::byte> {
    auto& self = *static_cast<Dispatch*>(d.ctx);
    if (!self.p_.lanes.is_user_memory(ptr, bytes) && bytes < d.user_min_bytes && !ch.transport->traits().cheap_user_writes) return {};
    try {
      return self.p_.regs.local_key(ptr, bytes, ch.transport);
    } catch (const std::exception& e) {  // not shareable: the sender uses our staging slots
      self.p_.ctx.log.debug("receive buffer not shareable with rank {} ({}): staging", ch.peer, e.what());
      return {};
    }
  };
  d.resolve = [](void* ctx, std::span<const std::byte> key, Connection& ch) noexcept {
    auto& self = *static_cast<Dispatch*>(ctx);
    return self.p_.regs.import(key, ch);
  };
  return d;
}

}  // namespace ringfence::detail
