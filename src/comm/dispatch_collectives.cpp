// The collectives: argument checks on the caller's thread, then the closure runs now or on the
// progress thread (Dispatch::issue).
#include <cstring>
#include <ringfence/error.hpp>
#include <ringfence/reduce_ops.hpp>

#include "dispatch.hpp"

namespace ringfence::detail {

// An allreduce through chunks (not carried): ring, tree, direct or one-shot, as the tuner chooses.
void Dispatch::run_staged_allreduce(const char* call, const void* send, void* recv, std::size_t count, std::size_t bytes,
                                    const Reducer& reducer) {
  const CommContext& ctx = p_.ctx;
  DeviceLane* device = p_.device.current();
  // The same choice on the device lane (every rank is on it or none is); its links reach every
  // peer directly, as the tree, direct and one-shot schedules need.
  Algorithm algo = choose_allreduce(tuner_, ctx.options.algorithm, ctx.size, bytes, p_.plan.tree_allowed(), p_.plan.fenced().empty());
  // One-shot sends the input to every peer before any result lands, so in place it works on a
  // copy of the input: at most one slot (the same limit on every rank, whatever its buffers).
  // On the device lane DeviceLane::run makes the copy, in device memory.
  if (algo == Algorithm::OneShot && bytes > oneshot_copy_.size()) algo = Algorithm::Ring;
  const void* src = send;
  if (algo == Algorithm::OneShot && send == recv && bytes > 0 && !device) {
    ringfence::copy_bytes(oneshot_copy_.data(), send, bytes);  // the vector copy: glibc's is slow at these sizes here
    src = oneshot_copy_.data();
  }
  if (algo != Algorithm::Ring) {
    const auto ring_kind = algo == Algorithm::Tree     ? RingCollective::TreeAllreduce
                           : algo == Algorithm::Direct ? RingCollective::DirectAllreduce
                                                       : RingCollective::OneShotAllreduce;
    RingCall c{ring_kind, src, recv, count, 0};
    c.by_position = p_.lanes.by_position();
    c.by_rank = p_.lanes.by_rank();
    run_ring_call(call, c, reducer);
  } else {
    run_ring_call(call, RingCall{RingCollective::Allreduce, send, recv, count, 0}, reducer, true);
  }
}

Work Dispatch::allreduce(bool async, const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, CallKind kind) {
  const char* call = kind == CallKind::Barrier ? "barrier" : "allreduce";
  check_usable(call);
  const std::size_t bytes = checks().allreduce(call, send, recv, count, type, op).in;
  return issue(async, call, [this, call, send, recv, count, bytes, type, op, kind] {
    const CommContext& ctx = p_.ctx;
    const Reducer reducer = host_reducer(type, op);
    const bool carried = carries(bytes);
    begin_collective(call, make_fingerprint(kind, count, type, static_cast<int>(op)),
                     carried ? std::span<const std::byte>(static_cast<const std::byte*>(send), bytes) : std::span<const std::byte>());
    if (carried) run_carried_call(call, send, recv, count, reducer);
    else run_staged_allreduce(call, send, recv, count, bytes, reducer);
    if (ctx.size > 1 && ctx.options.digest_every > 0 && ctx.seq % static_cast<std::uint64_t>(ctx.options.digest_every) == 0 && !p_.device.current()) {
      Failure failure;
      std::string mismatch;
      if (!p_.agreement.compare_digests(recv, bytes, failure, mismatch).is_ok()) raise("result digest comparison after allreduce", failure);
      if (!mismatch.empty()) {  // every rank has the same verdict: no one needs aborting
        const std::string message = fmt::format("rank {}: allreduce #{} failed: {}", ctx.rank, ctx.seq, mismatch);
        p_.failure.record(Status(ErrorCode::Fatal), message);
        ctx.log.error("{}", message);
        throw_status(Status(ErrorCode::Fatal), message);
      }
    }
  });
}

Work Dispatch::reduce_scatter(bool async, const void* send, void* recv, std::size_t recvcount, DataType type, ReduceOp op) {
  const char* call = "reduce_scatter";
  check_usable(call);
  checks().reduce_scatter(call, send, recv, recvcount, type, op);
  return issue(async, call, [=, this] {
    begin_collective(call, make_fingerprint(CallKind::ReduceScatter, recvcount, type, static_cast<int>(op)));
    RingCall c{RingCollective::ReduceScatter, send, recv, recvcount, 0};
    c.blocks = p_.plan.ring().data();  // block = rank, whatever the ring's order
    run_ring_call(call, c, host_reducer(type, op));
  });
}

Work Dispatch::allgather(bool async, const void* send, void* recv, std::size_t sendcount, DataType type) {
  const char* call = "allgather";
  check_usable(call);
  const std::size_t send_bytes = checks().allgather(call, send, recv, sendcount, type).in;
  return issue(async, call, [=, this] {
    begin_collective(call, make_fingerprint(CallKind::Allgather, sendcount, type));
    // Moves bytes only: chunking in bytes keeps the schedule independent of the type.
    RingCall c{RingCollective::Allgather, send, recv, send_bytes, 0};
    c.blocks = p_.plan.ring().data();  // block = rank, whatever the ring's order
    run_ring_call(call, c, host_reducer(DataType::Uint8, ReduceOp::Sum), true);
  });
}

Work Dispatch::broadcast(bool async, const void* send, void* recv, std::size_t count, DataType type, int root) {
  const char* call = "broadcast";
  check_usable(call);
  const std::size_t bytes = checks().broadcast(call, send, recv, count, type, root).out;
  return issue(async, call, [=, this] {
    begin_collective(call, make_fingerprint(CallKind::Broadcast, count, type, -1, root));
    run_ring_call(call, RingCall{RingCollective::Broadcast, send, recv, bytes, p_.plan.position_of(root)},
                  host_reducer(DataType::Uint8, ReduceOp::Sum), true);
  });
}

Work Dispatch::reduce(bool async, const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root) {
  const char* call = "reduce";
  check_usable(call);
  checks().reduce(call, send, recv, count, type, op, root);
  return issue(async, call, [=, this] {
    begin_collective(call, make_fingerprint(CallKind::Reduce, count, type, static_cast<int>(op), root));
    run_ring_call(call, RingCall{RingCollective::Reduce, send, recv, count, p_.plan.position_of(root)}, host_reducer(type, op));
  });
}

Work Dispatch::alltoall(bool async, const void* send, void* recv, std::size_t count, DataType type) {
  const char* call = "alltoall";
  check_usable(call);
  const std::size_t bytes = checks().alltoall(call, send, recv, count, type).in;
  const std::size_t block = bytes / static_cast<std::size_t>(p_.ctx.size);
  return issue(async, call, [=, this] {
    begin_collective(call, make_fingerprint(CallKind::Alltoall, count, type));
    if (block == 0) settle_call(call);
    else if (p_.device.current()) run_alltoall(call, send, recv, block);
    else timed_for_stream_choice(kStreamKindAlltoall, block * static_cast<std::size_t>(p_.ctx.size), [&] { run_alltoall(call, send, recv, block); });
  });
}

// Who compares an alltoall's fingerprints. Host memory, no relay and blocks that never go direct:
// the executor, each sender's call before its first block is used (as ring calls leave it to the
// executor), which saves a round trip between the ranks before anything moves; the checked rank
// by its call word beside its data flag, the others (more than two ranks) by the fingerprint
// `pair` posts to them. Otherwise the call is compared here first (settle_call): a direct send
// would read its receiver's buffer key before the receiver's call is known to be ours. Returns
// the check the executor runs, null when settled here.
CallCheck* Dispatch::exchange_check(const char* call, std::size_t block) {
  LaneState& lane0 = p_.lanes.main();
  if (p_.device.current() || block >= p_.ctx.options.direct_write_min_bytes || !p_.calls.can_defer_exchange(lane0)) {
    settle_call(call);
    return nullptr;
  }
  if (p_.ctx.size > 2) {
    Failure failure;
    if (!p_.calls.pair(lane0, failure).is_ok()) raise(call, failure);
  }
  return p_.calls.pending();
}

// A group of sends and receives: every pair exchanges its blocks side by side. The op list is
// this call's own (group_ops_ belongs to the user's thread).
void Dispatch::run_alltoall(const char* call, const void* send, void* recv, std::size_t block) {
  const CommContext& ctx = p_.ctx;
  const int rank = ctx.rank, size = ctx.size;
  const PlanState& plan = p_.plan;
  auto* in = static_cast<std::byte*>(const_cast<void*>(send));
  auto* out = static_cast<std::byte*>(recv);
  auto block_of = [&](std::byte* base, int r) { return base + static_cast<std::size_t>(r) * block; };
  auto& ops = alltoall_ops_;
  ops.clear();
  // The device lane has its own link to every rank (a fenced pair's moved to its fallback where
  // there is one, see LinkMover::move_device_links): no relay through host buffers there.
  const std::vector<LinkId>& fenced = plan.fenced();
  const bool relayed = !fenced.empty() && !p_.device.current();
  for (int k = 0; k < size; ++k) {
    const int to = (rank + k) % size, from = (rank - k + size) % size;
    if (!relayed || !plan.is_fenced(rank, to)) ops.push_back(P2POp{true, to, block_of(in, to), block, 0});
    if (!relayed || !plan.is_fenced(rank, from)) ops.push_back(P2POp{false, from, block_of(out, from), block, 0});
  }
  // Every pair exchanges at once: with staging each receiver must be scheduled for every chunk
  // of every peer, which costs wake-ups on a busy host; direct writes need only the sender
  // (measured: 4 ranks on 2 cores, 1 MiB blocks, 1.40 vs 0.26 GB/s busbw). Not with checksums:
  // then the receiver reads every block once more to verify it where it landed, and direct
  // measured slower from 1 MiB blocks (docs/collectives.md).
  const bool checksum = p_.lanes.main().engine.checksum;
  const std::size_t user_min = size >= 3 && !checksum
                                   ? std::min(ctx.options.p2p_direct_user_min_bytes, ctx.options.alltoall_direct_user_min_bytes)
                                   : ctx.options.p2p_direct_user_min_bytes;
  if (!relayed) return run_ops(call, ops, user_min, true, exchange_check(call, block));
  settle_call(call);
  // Fenced pairs (a, b): every rank takes part, so a third rank c with healthy links to both
  // carries their blocks in two phases (a, b -> c, then c -> b, a). Every rank derives the same
  // relays from the agreed fence list, and ops to one peer keep the same order at both ends (own
  // block first, then relayed ones in fence order).
  alltoall_relay_.resize(2 * fenced.size() * block);
  std::vector<int> via(fenced.size());
  for (std::size_t i = 0; i < fenced.size(); ++i) {
    const LinkId l = fenced[i];
    via[i] = -1;
    for (int c = 0; c < size && via[i] < 0; ++c)
      if (c != l.a && c != l.b && !plan.is_fenced(c, l.a) && !plan.is_fenced(c, l.b)) via[i] = c;
    if (via[i] < 0) {
      const Failure f{Status(ErrorCode::Fenced), rank == l.a ? l.b : l.a, "a rank to relay alltoall blocks around the fenced link", 0};
      raise(call, f);
    }
    std::byte* tmp = alltoall_relay_.data() + 2 * i * block;
    if (rank == l.a) ops.push_back(P2POp{true, via[i], block_of(in, l.b), block, 0});
    if (rank == l.b) ops.push_back(P2POp{true, via[i], block_of(in, l.a), block, 0});
    if (rank == via[i]) {
      ops.push_back(P2POp{false, l.a, tmp, block, 0});          // a's block for b
      ops.push_back(P2POp{false, l.b, tmp + block, block, 0});  // b's block for a
    }
  }
  run_ops(call, ops, user_min, true);
  for (std::size_t i = 0; i < fenced.size(); ++i) {
    const LinkId l = fenced[i];
    std::byte* tmp = alltoall_relay_.data() + 2 * i * block;
    if (rank == via[i]) {
      ops.push_back(P2POp{true, l.b, tmp, block, 0});
      ops.push_back(P2POp{true, l.a, tmp + block, block, 0});
    }
    if (rank == l.a) ops.push_back(P2POp{false, via[i], block_of(out, l.b), block, 0});
    if (rank == l.b) ops.push_back(P2POp{false, via[i], block_of(out, l.a), block, 0});
  }
  run_ops(call, ops, user_min, true);
}

}  // namespace ringfence::detail
