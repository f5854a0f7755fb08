// The ring executor: runs `RingAllreduceSchedule` steps over two channels.
//
// Flow control per directed link (sender S -> receiver R), message m (0-based):
//   S waits until credit[R] >= m + 1 - slots (R consumed message m - slots, so slot m % slots is
//   free), writes the chunk into R's inbox slot m % slots, then signals data[S] = m + 1 at R.
//   R waits until data[S] >= m + 1, consumes the slot, then signals credit[R] = m + 1 at S.
// `signal` is ordered after the preceding `write` on the same link (SPI guarantee), so R never
// reads a slot before its bytes have landed. Counters never reset, so nothing needs clearing
// between collectives.
//
// Integrity (config.checksum): S also writes a trailer {crc32c, bytes, m} after the slot. R
// verifies before consuming; on a mismatch it bumps nack[R] at S and waits for retry[S]. The
// chunk to re-send is the one R is blocked on: number credit[R] (R consumed 0..m-1), so no
// payload-carrying word (which a bad link could corrupt too) names it. S services NACKs inside
// every wait (so no cycle of waiting ranks can form), re-writes the chunk from its source (still intact: nothing downstream of a chunk can
// overwrite its source before the chunk was accepted) and bumps retry[S] at R. At the end of a
// call S waits until R has accepted everything it sent. A corrupted chunk never reaches a result.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <thread>
#include <ringfence/crc32c.hpp>

#include "cuda_api.hpp"
#include "device_kernels.hpp"
#include "engine.hpp"

namespace ringfence::detail {
namespace {

inline void cpu_pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class RingRunner {
 public:
  RingRunner(const EngineConfig& c, FlagBlock flags, Channel* left, Channel* right, const Reducer& reducer,
             const DirectWrite& direct, RelayDuties& relays, Failure& failure) noexcept
      : c_(c),
        flags_(flags),
        left_(left),
        right_(right),
        reducer_(reducer),
        direct_(direct),
        relays_(relays),
        failure_(failure) {}

  // Tree mode: steps name peers by ring position; every channel may carry re-send requests.
  void use_positions(Channel* const* by_position, Channel* const* by_rank) noexcept {
    by_position_ = by_position;
    nack_all_ = by_rank;
  }

  // Device regions for this call (see DeviceRegions in engine.hpp); null: host memory.
  void use_device(const DeviceRegions* device) noexcept { dev_ = device; }

  // Runs the schedule `make(position)` returns for our ring position. `make` also gives each
  // relayed sender's schedule (to know how many of its chunks this call carries).
  template <class Make>
  Status run(Make make, const void* send, void* recv) noexcept {
    if (dev_ && (c_.checksum || c_.trailers || relays_.count > 0 || direct_.enabled))
      return fail(Status(ErrorCode::InvalidUsage), self_channel_,
                  "device regions without checksums, trailers, relays or direct writes (they read chunks on the host)", 0);
    const std::size_t elem = reducer_.elem_size;
    const auto* in = static_cast<const std::byte*>(send);
    auto* out = static_cast<std::byte*>(recv);
    // The schedule works on ring positions; flags and links on ranks.
    auto schedule = make(c_.position);
    RINGFENCE_TRY(start_relays(make));
    if (direct_.enabled) RINGFENCE_TRY(publish_output_key());
    const RemoteRegion* peer_out = nullptr;
    bool peer_out_known = false;
    const bool own_out_direct = direct_.enabled && !direct_.own_key.empty();
    Step step;
    while (schedule.next(step)) {
      const std::size_t off = step.offset * elem, oo = step.out_offset * elem, bytes = step.count * elem;
      // Ring schedules talk to the left and right channels (which may be relays); tree
      // schedules name their peers by ring position.
      Channel* const rx_p = by_position_ && step.peer >= 0 ? by_position_[step.peer] : left_;
      Channel* const tx_p =
          by_position_ && step.peer >= 0 ? by_position_[step.kind == StepKind::RecvReduceSend ? step.to : step.peer] : right_;
      if (step.kind == StepKind::CopyInput) {
        if (in + off != out + oo) RINGFENCE_TRY(copy(out + oo, in + off, bytes));
        continue;
      }
      if (step.kind == StepKind::ReduceInputAcc) {
        RINGFENCE_TRY(combine(out + oo, in + off, out + oo, step.count, false));
        continue;
      }
      if (step.kind == StepKind::ReduceInputAccLast) {
        RINGFENCE_TRY(combine(out + oo, in + off, out + oo, step.count, true));
        continue;
      }
      Channel& rx = *rx_p;  // every remaining step talks to a peer
      Channel& tx = *tx_p;
      switch (step.kind) {
        case StepKind::CopyInput:
        case StepKind::ReduceInputAcc:
        case StepKind::ReduceInputAccLast: break;  // handled above
        case StepKind::SendInput: RINGFENCE_TRY(send_chunk(tx, in + off, bytes)); break;
        case StepKind::SendOutput: RINGFENCE_TRY(send_chunk(tx, out + oo, bytes)); break;
        case StepKind::SendFinal:
          if (direct_.enabled) {
            if (!peer_out_known) RINGFENCE_TRY(fetch_peer_output(peer_out));
            peer_out_known = true;
            RINGFENCE_TRY(send_chunk(tx, out + oo, bytes, peer_out, oo));  // peer_out null: staging
          } else {
            RINGFENCE_TRY(send_chunk(tx, out + oo, bytes));
          }
          break;
        case StepKind::RecvReduceSend: {
          // Consume first, then send: a rank blocked on sending must not hold its inbox slot,
          // or a ring of full one-slot links would deadlock. The partial result waits in a
          // scratch slot tied to the outgoing message number m: slot m % (slots + 1) last held
          // message m - slots - 1, accepted before m - 1 could be sent, so a re-send of any
          // unaccepted message still finds its bytes.
          const std::byte* slot = nullptr;
          RINGFENCE_TRY(wait_chunk(rx, slot, nullptr, bytes));
          std::byte* tmp = c_.scratch + static_cast<std::size_t>(tx.sent % static_cast<std::uint64_t>(c_.slots + 1)) * c_.slot_bytes;
          RINGFENCE_TRY(combine(tmp, slot, in + off, step.count, false));
          RINGFENCE_TRY(release_chunk(rx));
          RINGFENCE_TRY(send_chunk(tx, tmp, bytes));
          break;
        }
        case StepKind::RecvReduce:
        case StepKind::RecvReduceLast:
        case StepKind::RecvReduceAcc:
        case StepKind::RecvReduceAccLast:
        case StepKind::RecvCopy: {
          const bool landed_in_output = step.kind == StepKind::RecvCopy && own_out_direct;
          const std::byte* slot = nullptr;
          RINGFENCE_TRY(wait_chunk(rx, slot, landed_in_output ? out + oo : nullptr, bytes));
          switch (step.kind) {
            case StepKind::RecvCopy:
              if (!landed_in_output) RINGFENCE_TRY(copy(out + oo, slot, bytes));
              break;
            case StepKind::RecvReduce: RINGFENCE_TRY(combine(out + oo, slot, in + off, step.count, false)); break;
            case StepKind::RecvReduceLast: RINGFENCE_TRY(combine(out + oo, slot, in + off, step.count, true)); break;
            case StepKind::RecvReduceAcc: RINGFENCE_TRY(combine(out + oo, slot, out + oo, step.count, false)); break;
            default: RINGFENCE_TRY(combine(out + oo, slot, out + oo, step.count, true)); break;
          }
          RINGFENCE_TRY(release_chunk(rx));
          break;
        }
      }
    }
    return finish_call();
  }

  // Grouped point-to-point transfers (send/recv, alltoall): every op moves its bytes in
  // slot-sized chunks over its peer's channel. Ops to the same peer in the same direction run
  // one after the other in list order (so both ends agree on the message sequence); everything
  // else progresses side by side without blocking, so no order of calls across ranks can
  // deadlock. `channel_of[r]` is the channel to rank r.
  Status run_p2p(Channel* const* channel_of, P2POp* ops, std::size_t n, const P2PDirect& direct) noexcept {
    nack_all_ = channel_of;
    if (dev_ && (c_.checksum || c_.trailers || direct.enabled))
      return fail(Status(ErrorCode::InvalidUsage), self_channel_,
                  "device regions without checksums, trailers or direct transfers (they read chunks on the host)", 0);
    // Sends to ourselves pair with receives from ourselves, k-th with k-th. The copy is done by
    // the send op, piece by piece whenever the transfers to peers cannot move (so it overlaps
    // the waits on them); the receive counts as done (the call ends only when the send is).
    for (std::size_t i = 0, j = 0; i < n; ++i) {
      if (!ops[i].send || ops[i].peer != c_.rank) continue;
      while (j < n && (ops[j].send || ops[j].peer != c_.rank)) ++j;
      if (j == n || ops[j].bytes != ops[i].bytes)
        return fail(Status(ErrorCode::InvalidUsage), self_channel_, "a matching receive from ourselves", 0);
      ops[i].local_dst = ops[j].buf;
      if (ops[j].buf == ops[i].buf || c_.size == 1) {  // alone: nothing to overlap with
        if (ops[j].buf != ops[i].buf) RINGFENCE_TRY(copy(ops[j].buf, ops[i].buf, ops[i].bytes));
        ops[i].done = ops[i].bytes;
      }
      ops[j].done = ops[j].bytes;
      ++j;
    }
    if (c_.size == 1) return settle_device();  // only transfers to ourselves (no channels exist)
    // Both ends decide by size alone, so they agree on which transfers go direct.
    for (std::size_t i = 0; i < n; ++i)
      ops[i].direct = direct.enabled && ops[i].peer != c_.rank && ops[i].bytes >= direct.min_bytes;
    const auto slots = static_cast<std::uint64_t>(c_.slots);
    auto last_progress = std::chrono::steady_clock::now();
    for (int idle = 0;;) {
      bool progress = false, pending = false;
      for (std::size_t i = 0; i < n; ++i) {
        P2POp& op = ops[i];
        if (op.done >= op.bytes) continue;
        pending = true;
        if (op.local_dst) continue;  // to ourselves: copied below when nothing else moves
        bool behind = false;  // an earlier op to the same peer and direction is unfinished
        for (std::size_t k = 0; k < i && !behind; ++k)
          behind = ops[k].send == op.send && ops[k].peer == op.peer && ops[k].done < ops[k].bytes;
        if (behind) continue;
        Channel& ch = *channel_of[op.peer];
        const std::size_t len = std::min(c_.slot_bytes, op.bytes - op.done);
        if (op.direct && !op.keyed) {
          if (op.send) {
            if (!reached(flags_.p2p_mail[ch.peer].value.load(std::memory_order_acquire), ch.p2p_keys_used + 1)) continue;
            RINGFENCE_TRY(fetch_p2p_key(ch, op, direct));
          } else {
            RINGFENCE_TRY(publish_p2p_key(ch, op, direct));
          }
          op.keyed = true;
          progress = true;
        }
        if (op.send) {
          if (ch.sent >= slots && !reached(flags_.credit[ch.peer].value.load(std::memory_order_acquire),
                                           static_cast<std::uint32_t>(ch.sent + 1 - slots)))
            continue;
          RINGFENCE_TRY(send_chunk(ch, op.buf + op.done, len, op.dst, op.done));  // dst null: staging
        } else {
          if (!reached(flags_.data[ch.peer].value.load(std::memory_order_acquire), static_cast<std::uint32_t>(ch.received + 1)))
            continue;
          const std::byte* slot = nullptr;
          RINGFENCE_TRY(wait_chunk(ch, slot, op.landed ? op.buf + op.done : nullptr, len));
          if (!op.landed) RINGFENCE_TRY(copy(op.buf + op.done, slot, len));
          RINGFENCE_TRY(release_chunk(ch));
        }
        op.done += len;
        progress = true;
      }
      if (!pending) break;
      if (!progress)
        for (std::size_t i = 0; i < n && !progress; ++i) {
          P2POp& op = ops[i];
          if (!op.local_dst || op.done >= op.bytes) continue;
          const std::size_t len = std::min(c_.slot_bytes, op.bytes - op.done);
          RINGFENCE_TRY(copy(op.local_dst + op.done, op.buf + op.done, len));
          op.done += len;
          progress = true;
        }
      const auto now = std::chrono::steady_clock::now();
      if (progress) {
        last_progress = now;
        idle = 0;
        continue;
      }
      RINGFENCE_TRY(check_abort("point-to-point progress (the peer failed and aborted)", 0));
      if (c_.checksum) RINGFENCE_TRY(service_all_nacks());
      if (dev_) RINGFENCE_TRY(pump_links());
      if (now - last_progress >= c_.timeout) {
        for (std::size_t i = 0; i < n; ++i)
          if (ops[i].done < ops[i].bytes) {
            Channel& ch = *channel_of[ops[i].peer];
            return fail(Status(ErrorCode::Timeout), ch, ops[i].send ? "a free staging slot (credit) for a send" : "data for a receive",
                        ops[i].send ? ch.sent : ch.received);
          }
      }
      // Nothing to do: wait on the flag the first runnable op needs (the link spins briefly,
      // then sleeps on a futex its peer wakes), in short slices so that any other op that
      // becomes ready, a re-send request or an abort is seen soon.
      ++idle;
      for (std::size_t i = 0; i < n; ++i) {
        const P2POp& op = ops[i];
        if (op.done >= op.bytes || op.local_dst) continue;
        Channel& ch = *channel_of[op.peer];
        const bool needs_key = op.send && op.direct && !op.keyed;
        SignalFlag& flag = needs_key ? flags_.p2p_mail[ch.peer] : op.send ? flags_.credit[ch.peer] : flags_.data[ch.peer];
        const std::uint64_t target = needs_key ? ch.p2p_keys_used + 1
                                     : op.send ? ch.sent + 1 - std::min<std::uint64_t>(ch.sent, slots)
                                               : ch.received + 1;
        const Status st = ch.link->wait(flag, static_cast<std::uint32_t>(target),
                                        std::chrono::microseconds(20));
        if (st.is_error()) {
          RINGFENCE_TRY(check_abort("point-to-point progress (the peer failed and aborted)", 0));
          return fail(st, ch, op.send ? "a free staging slot (credit) for a send" : "data for a receive",
                      op.send ? ch.sent : ch.received);
        }
        break;
      }
    }
    if (dev_) return finish_device_call();
    // With checksums a chunk is only done once the receiver accepted it: stay to re-send.
    if (c_.checksum) return await_all_acceptance();
    return Status::ok();
  }

  // See post_fingerprint() in engine.hpp.
  Status post_fingerprint(Channel* const* to, std::size_t n_to, const CallFingerprint& mine) noexcept {
    const auto number = static_cast<std::uint32_t>(mine.sequence);
    const std::size_t slot = mine.sequence % kCallSlots;
    for (std::size_t i = 0; i < n_to; ++i) {
      Channel& ch = *to[i];
      // The slot's previous fingerprint to this peer (if any: the pairs change with the plan)
      // must have been read before it is overwritten.
      if (const std::uint64_t previous = ch.call_fp[slot].sequence; previous != 0)
        RINGFENCE_TRY(wait_flag(ch, flags_.call_ack[ch.peer], static_cast<std::uint32_t>(previous),
                                "the reading of an earlier call fingerprint", 0));
      ch.call_fp[slot] = mine;
      Status s = ch.link->write(WriteOp{&ch.call_fp[slot], nullptr, &ch.peer_flags, FlagBlock::call_offset(c_.size, c_.rank, slot),
                                        sizeof(CallFingerprint), 0});
      if (s.is_ok()) s = ch.link->signal(SignalOp{&ch.peer_flags, FlagBlock::flag_offset(FlagBlock::kCall, c_.size, c_.rank), number, 0});
      if (!s.is_ok()) return fail(s, ch, "sending the call fingerprint", 0);
      RINGFENCE_TRY(drain(ch, "sending the call fingerprint"));
    }
    return Status::ok();
  }

  // Reads the checked neighbour's fingerprint of this call into `check` (waiting for it when
  // `block`; else only if it is there) and acknowledges it when its number is a multiple of
  // kCallAckEvery or `always_ack`, freeing its slot and every one before it.
  Status settle_call(CallCheck& check, bool block, bool always_ack) noexcept {
    Channel& from = *check.from;
    const auto number = static_cast<std::uint32_t>(check.mine.sequence);
    if (!read_fingerprint(flags_, check)) {
      if (!block) return Status::ok();
      settling_ = true;  // the wait below must not try to settle the same check again
      const Status waited = wait_flag(from, flags_.call[from.peer], number,
                                      "the call fingerprint of the same collective (did every rank make the same calls?)", 0);
      settling_ = false;
      RINGFENCE_TRY(waited);
      read_fingerprint(flags_, check);
    }
    if (!always_ack && number % kCallAckEvery != 0) return Status::ok();
    const Status s = from.link->signal(SignalOp{&from.peer_flags, FlagBlock::flag_offset(FlagBlock::kCallAck, c_.size, c_.rank), number, 0});
    if (!s.is_ok()) return fail(s, from, "acknowledging the call fingerprint", 0);
    return drain(from, "acknowledging the call fingerprint");
  }

  // The executor's side of a check left to it: settle it (see settle_call) and fail the call
  // when the ranks disagree. Called before the first received chunk is used, by waits that
  // find the fingerprint there, and at the end of the call.
  Status verify_call(bool block) noexcept {
    if (!check_ || check_->settled || settling_) return Status::ok();
    RINGFENCE_TRY(settle_call(*check_, block, false));
    if (check_->disagree())
      return fail(Status(ErrorCode::InvalidUsage), *check_->from, "a call fingerprint equal to ours (the ranks disagree on this call)", 0);
    return Status::ok();
  }

  // Leaves this call's fingerprint check to the executor (see RingCall::check).
  void check_with(CallCheck* check) noexcept { check_ = check; }

 private:
  // Relay duties: how many chunks each relayed sender sends in this call (its schedule's
  // sends), and the counter bases for passing credits back. Every earlier message on both
  // channels was consumed and credited before this call (earlier calls end only then; a
  // point-to-point call may have left sends to the receiver unaccepted: wait for them).
  template <class Make>
  Status start_relays(Make& make) noexcept {
    for (int i = 0; i < relays_.count; ++i) {
      RelayDuty& d = relays_.duty[i];
      auto theirs = make(d.sender_position);
      std::uint64_t sends = 0;
      for (Step st; theirs.next(st);) sends += static_cast<std::uint64_t>(sends_of(st.kind));
      relay_target_[i] = d.in->received + sends;
      RINGFENCE_TRY(wait_flag(*d.out, flags_.credit[d.out->peer], static_cast<std::uint32_t>(d.out->sent),
                              "acceptance of earlier chunks before relaying", d.out->sent));
      d.base_in = d.in->received;
      d.base_out = d.out->sent;
      d.credited = static_cast<std::uint32_t>(d.base_in);
    }
    return Status::ok();
  }

  Status finish_call() noexcept {
    RINGFENCE_TRY(verify_call(true));  // a call that received nothing (a broadcast root) compares here
    if (dev_) return finish_device_call();
    // With checksums a chunk is only done once the receiver accepted it: stay to re-send. A
    // ring sends to its right neighbour only.
    if (c_.checksum && by_position_) RINGFENCE_TRY(await_all_acceptance());
    else if (c_.checksum && c_.size > 1) RINGFENCE_TRY(await_acceptance(*right_));
    // A relay stays until it forwarded this call's chunks, the receiver accepted them, and the
    // sender got its credits back.
    if (relays_.count > 0) {
      const auto deadline = std::chrono::steady_clock::now() + c_.timeout;
      for (;;) {
        RINGFENCE_TRY(service_relays());
        RelayDuty* pending = nullptr;
        for (int i = 0; i < relays_.count && !pending; ++i) {
          RelayDuty& d = relays_.duty[i];
          const std::uint32_t accepted = flags_.credit[d.out->peer].value.load(std::memory_order_acquire);
          if (d.in->received < relay_target_[i] || !reached(accepted, static_cast<std::uint32_t>(d.out->sent)) ||
              d.credited != sender_credit(d))
            pending = &d;
        }
        if (!pending) break;
        RINGFENCE_TRY(check_abort("relaying (the peer failed and aborted the collective)", pending->in->received));
        if (std::chrono::steady_clock::now() >= deadline)
          return fail(Status(ErrorCode::Timeout), *pending->in, "chunks to relay", pending->in->received);
        if (c_.checksum) RINGFENCE_TRY(service_nacks(*right_));
        const Status st = pending->in->link->wait(flags_.data[pending->in->peer],
                                                  static_cast<std::uint32_t>(pending->in->received + 1),
                                                  std::chrono::microseconds(20));
        if (st.is_error()) return fail(st, *pending->in, "chunks to relay", pending->in->received);
      }
    }
    return Status::ok();
  }

  // ---- device regions (DeviceRegions in engine.hpp) ----

  // `dst = src` over `bytes`: on the executor's stream for device regions, else at once.
  Status copy(std::byte* dst, const std::byte* src, std::size_t bytes) noexcept {
    if (!dev_) {
      copy_bytes(dst, src, bytes);
      return Status::ok();
    }
    const int err = dev_->cuda->memcpy_async(dst, src, bytes, kCudaMemcpyDefault, dev_->stream);
    if (err != kCudaSuccess) return fail(Status(ErrorCode::Cuda, err), self_channel_, "enqueueing a device copy (cudaMemcpyAsync)", 0);
    dev_pending_ = true;
    return Status::ok();
  }

  // `dst = a op b` over `count` elements (`last`: the final step, which divides for avg).
  Status combine(std::byte* dst, const std::byte* a, const std::byte* b, std::size_t count, bool last) noexcept {
    if (!dev_) {
      (last ? reducer_.finish : reducer_.combine)(dst, a, b, count, c_.size);
      return Status::ok();
    }
    const int err = dev_->kernels->launch(reducer_.type, reducer_.op, last, c_.size, dst, a, b, count, dev_->stream);
    if (err != kCudaSuccess) return fail(Status(ErrorCode::Cuda, err), self_channel_, "launching a device reduction", 0);
    dev_pending_ = true;
    return Status::ok();
  }

  // Waits until every copy and reduction enqueued so far has run (before their destinations
  // are sent or their sources handed back). The stream holds only our own work, which depends
  // on nothing but the GPU, so this wait is bounded.
  Status settle_device() noexcept {
    if (!dev_ || !dev_pending_) return Status::ok();
    const int err = dev_->cuda->stream_synchronize(dev_->stream);
    if (err != kCudaSuccess) return fail(Status(ErrorCode::Cuda, err), self_channel_, "device copies and reductions (cudaStreamSynchronize)", 0);
    dev_pending_ = false;
    return Status::ok();
  }

  // Calls `f(channel)` for every channel this call may talk to.
  template <class F>
  void for_each_call_channel(F&& f) noexcept {
    if (nack_all_ && !by_position_) {  // point-to-point: every peer's channel
      for (int r = 0; r < c_.size; ++r)
        if (Channel* ch = nack_all_[r]) f(*ch);
    } else if (by_position_) {
      for (int p = 0; p < c_.size; ++p)
        if (Channel* ch = by_position_[p]) f(*ch);
    } else if (c_.size > 1) {
      f(*right_);
      if (left_ != right_) f(*left_);
    }
  }

  // Polls every link of the call: a device transport stores a signal that waits behind its
  // copies only from a poll or wait on that link, and a peer may be waiting for it.
  Status pump_links() noexcept {
    Status st = Status::ok();
    for_each_call_channel([&](Channel& ch) {
      if (st.is_ok()) st = drain(ch, "completing device copies and their signals");
    });
    return st;
  }

  // End of a device-region call: our output is written, and every link of the call finished
  // what it was given (our copies landed in the peers' slots, the signals behind them are
  // stored), so nothing of the call waits for a poll of a link that may not come. The peers
  // need not have consumed the chunks yet (as on the host lanes): a send that fits the slots
  // ends before its receive runs.
  Status finish_device_call() noexcept {
    RINGFENCE_TRY(settle_device());
    return await_all_delivery();
  }

  // Pumps every link of the call until each is idle (Link::idle), in 20 us slices, bounded by
  // the timeout; an abort of a peer ends it.
  Status await_all_delivery() noexcept {
    const auto deadline = std::chrono::steady_clock::now() + c_.timeout;
    for (;;) {
      RINGFENCE_TRY(pump_links());
      Channel* busy = nullptr;
      for_each_call_channel([&](Channel& ch) {
        if (!busy && ch.link && !ch.link->idle()) busy = &ch;
      });
      if (!busy) return Status::ok();
      const std::uint64_t last = busy->sent > 0 ? busy->sent - 1 : 0;
      RINGFENCE_TRY(check_abort("progress (the peer failed and aborted the collective)", last));
      if (std::chrono::steady_clock::now() >= deadline)
        return fail(Status(ErrorCode::Timeout), *busy, "delivery of the last chunks (device copies and the signals behind them)", last);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // Waits until `ch`'s peer accepted (consumed; with checksums, verified) every chunk we sent it.
  Status await_acceptance(Channel& ch) noexcept {
    if (ch.sent == 0) return Status::ok();
    return wait_flag(ch, flags_.credit[ch.peer], static_cast<std::uint32_t>(ch.sent), "acceptance of the last chunks", ch.sent - 1);
  }
  // The same on every channel of the call.
  Status await_all_acceptance() noexcept {
    Status st = Status::ok();
    for_each_call_channel([&](Channel& ch) {
      if (st.is_ok()) st = await_acceptance(ch);
    });
    return st;
  }

  // A peer failed and told everyone (abort word): fail now with its error class, naming it.
  Status check_abort(const char* what, std::uint64_t message) noexcept {
    const std::uint32_t a = flags_.abort->value.load(std::memory_order_acquire);
    if (RINGFENCE_UNLIKELY(a != 0)) {
      failure_ = Failure{Status(static_cast<ErrorCode>(a >> 24)), static_cast<int>((a >> 12) & 0xfffu) - 1, what, message};
      failure_.aborted_by_peer = true;
      failure_.blamed = static_cast<int>(a & 0xfffu) - 1;
      return failure_.status;
    }
    return Status::ok();
  }

  Status fail(Status s, const Channel& ch, const char* what, std::uint64_t message) noexcept {
    failure_ = Failure{s, ch.peer, what, message};
    if (ch.peer >= 0) failure_.transport = &ch.transport_name;
    return s;
  }

  // Waits until `flag` reaches `target`, letting the link sleep between checks; bounded by the
  // communicator timeout. Services re-send requests from the right neighbour meanwhile.
  Status wait_flag(Channel& ch, SignalFlag& flag, std::uint32_t target, const char* what, std::uint64_t message) noexcept {
    // A short spin first: a small message's answer usually arrives within a microsecond, and
    // reading the clock for the deadline would cost as much as the wait.
    for (int i = 0; i < 64; ++i) {
      if (reached(flag.value.load(std::memory_order_acquire), target)) return Status::ok();
      cpu_pause();
    }
    const auto deadline = std::chrono::steady_clock::now() + c_.timeout;
    for (;;) {
      RINGFENCE_TRY(check_abort("progress (the peer failed and aborted the collective)", message));
      RINGFENCE_TRY(verify_call(false));  // a disagreement may be why nothing comes
      if (c_.checksum) RINGFENCE_TRY(nack_all_ ? service_all_nacks() : service_nacks(*right_));
      if (relays_.count > 0) {
        RINGFENCE_TRY(service_relays());
        if (reached(flag.value.load(std::memory_order_acquire), target)) return Status::ok();
      }
      if (dev_) RINGFENCE_TRY(pump_links());
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return fail(Status(ErrorCode::Timeout), ch, what, message);
      // Sleep in slices so a relay chunk or a device link's signal (20 us), a NACK (1 ms) or an
      // abort (50 ms) is handled promptly.
      const auto slice = std::min<std::chrono::nanoseconds>(
          deadline - now, relays_.count > 0 || dev_ ? std::chrono::nanoseconds(20000)
                          : c_.checksum     ? std::chrono::nanoseconds(1000000)
                                            : std::chrono::nanoseconds(50000000));
      const Status s = ch.link->wait(flag, target, slice);
      if (s.is_ok()) return s;
      if (s.is_error()) {
        // A peer that failed first aborts us and may then exit: its abort explains the
        // failure better than its absence does.
        RINGFENCE_TRY(check_abort("progress (the peer failed and aborted the collective)", message));
        return fail(s, ch, what, message);
      }
    }
  }

  Status drain(Channel& ch, const char* what) noexcept {
    Completion done[8];
    for (;;) {
      std::size_t n = 0;
      const Status s = ch.link->poll(done, n);
      if (!s.is_ok()) return fail(s, ch, what, ch.sent);
      for (std::size_t i = 0; i < n; ++i)
        if (!done[i].status.is_ok()) return fail(done[i].status, ch, what, done[i].wr_id);
      if (n < std::size(done)) return Status::ok();
    }
  }

  // Writes our output's key (empty = "use my staging slots") into the left neighbour's mailbox
  // for this call, then signals it. Safe to overwrite: the left neighbour read the previous key
  // before its first final-value write of the previous call, which we consumed before
  // returning from that call.
  Status publish_output_key() noexcept {
    return post_mail(*left_, left_->mail_header, FlagBlock::mailbox_offset(c_.size, c_.rank),
                     FlagBlock::mail_offset(c_.size, c_.rank), direct_.own_key, direct_.call, "publishing the output key");
  }

  // A mailbox message: header {length, crc32c(key, seeded with its number), number}, then the
  // key, written into the peer's mailbox at `box`, then its number signalled at `flag`. A key
  // damaged in flight must be refused, never used as an address to write into, and the number
  // keeps a key that never arrived (a lossy link) from being mistaken for a later one.
  // `header` must outlive the asynchronous writes (it lives in the channel).
  Status post_mail(Channel& ch, std::uint32_t* header, std::size_t box, std::size_t flag, std::span<const std::byte> key,
                   std::uint32_t number, const char* what) noexcept {
    if (key.size() + kMailHeader > kMailboxBytes) return fail(Status(ErrorCode::InvalidUsage), ch, what, 0);
    header[0] = static_cast<std::uint32_t>(key.size());
    header[1] = crc32c(key.data(), key.size(), number);
    header[2] = number;
    Status s = ch.link->write(WriteOp{header, nullptr, &ch.peer_flags, box, kMailHeader, 0});
    if (s.is_ok() && !key.empty()) s = ch.link->write(WriteOp{key.data(), nullptr, &ch.peer_flags, box + kMailHeader, key.size(), 0});
    if (s.is_ok()) s = ch.link->signal(SignalOp{&ch.peer_flags, flag, number, 0});
    if (!s.is_ok()) return fail(s, ch, what, 0);
    return drain(ch, what);
  }

  // Reads the mailbox message numbered `number` at `box`: false when it is damaged or another
  // number's; else `key` views it (empty = "use my staging slots").
  static bool read_mail(const std::byte* box, std::uint32_t number, std::span<const std::byte>& key) noexcept {
    std::uint32_t header[3] = {};
    std::memcpy(header, box, kMailHeader);
    const std::uint32_t len = header[0];
    if (len + kMailHeader > kMailboxBytes || header[2] != number || crc32c(box + kMailHeader, len, number) != header[1]) return false;
    key = std::span<const std::byte>(box + kMailHeader, len);
    return true;
  }

  // Waits for the right neighbour's output key of this call and resolves it to a region
  // (nullptr when the neighbour asked for staging).
  Status fetch_peer_output(const RemoteRegion*& region) noexcept {
    Channel& ch = *right_;
    RINGFENCE_TRY(wait_flag(ch, flags_.mail[ch.peer], direct_.call, "the peer's output-buffer key", 0));
    std::span<const std::byte> key;
    if (!read_mail(flags_.mailboxes + static_cast<std::size_t>(ch.peer) * kMailboxBytes, direct_.call, key))
      return fail(Status(ErrorCode::Transient), ch, "an intact output-buffer key for this call (it arrived corrupted or not at all)", 0);
    region = nullptr;
    if (key.empty()) return Status::ok();
    region = direct_.resolve(direct_.ctx, key);
    if (!region) return fail(Status(ErrorCode::InvalidUsage), ch, "importing the peer's output buffer", 0);
    return Status::ok();
  }

  // Direct point-to-point, receiver side: publishes the key of `op`'s buffer (empty = "use my
  // staging slots") into the sender's p2p mailbox for us, then signals its p2p_mail word. Safe
  // to overwrite: our previous direct receive from this peer is complete, so the sender read
  // that key before writing its data.
  Status publish_p2p_key(Channel& ch, P2POp& op, const P2PDirect& d) noexcept {
    const std::span<const std::byte> key = d.key_of(d, op.buf, op.bytes, ch);
    const std::uint32_t number = ch.p2p_keys_published + 1;
    RINGFENCE_TRY(post_mail(ch, ch.p2p_mail_header, FlagBlock::p2p_mailbox_offset(c_.size, c_.rank),
                            FlagBlock::flag_offset(FlagBlock::kP2PMail, c_.size, c_.rank), key, number,
                            "publishing a receive-buffer key"));
    ch.p2p_keys_published = number;
    op.landed = !key.empty();
    return Status::ok();
  }

  // Direct point-to-point, sender side: reads the receiver's key for our next direct send
  // (its p2p_mail word reached it) and imports it (nullptr = write into its staging slots).
  Status fetch_p2p_key(Channel& ch, P2POp& op, const P2PDirect& d) noexcept {
    const std::uint32_t number = ch.p2p_keys_used + 1;
    std::span<const std::byte> key;
    if (!read_mail(flags_.p2p_mailboxes + static_cast<std::size_t>(ch.peer) * kMailboxBytes, number, key))
      return fail(Status(ErrorCode::Transient), ch, "an intact receive-buffer key (it arrived corrupted)", ch.sent);
    op.dst = nullptr;
    if (!key.empty()) {
      op.dst = d.resolve(d.ctx, key, ch);
      if (!op.dst) return fail(Status(ErrorCode::InvalidUsage), ch, "importing the peer's receive buffer", ch.sent);
      if (op.dst->size() < op.bytes)
        return fail(Status(ErrorCode::InvalidUsage), ch, "a receive buffer as large as the send (the counts differ)", ch.sent);
    }
    ch.p2p_keys_used = number;
    return Status::ok();
  }

  // Writes chunk `m` (data, then trailer in checksum mode) as recorded in the sent log.
  Status put_chunk(Channel& ch, std::uint64_t m) noexcept {
    const Channel::SentChunk& c = ch.sent_log[m % kSentLog];
    const std::size_t slot = static_cast<std::size_t>(m % static_cast<std::uint64_t>(c_.slots)) * c_.slot_stride();
    WriteOp w = c.dst ? WriteOp{c.src, nullptr, c.dst, c.dst_offset, c.bytes, m}
                      : WriteOp{c.src, nullptr, &ch.peer_inbox, slot, c.bytes, m};
    // Bandwidth evidence for the health layer, unless the link times its writes itself (they
    // only enqueue: a device copy).
    const bool timed = c.bytes >= kTimedWriteBytes && !ch.link->times_writes();
    const auto start = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    Status s = ch.link->write(w);
    if (s.in_progress()) {  // completion queue full: drain and retry once
      RINGFENCE_TRY(drain(ch, "draining completions"));
      s = ch.link->write(w);
    }
    if (!s.is_ok()) return fail(s, ch, "writing a chunk", m);
    if (timed) {
      ch.timed_ns += static_cast<std::uint64_t>((std::chrono::steady_clock::now() - start).count());
      ch.timed_bytes += c.bytes;
    }
    if (c_.checksum || c_.trailers) {
      ChunkTrailer& t = ch.trailers[m % kSentLog];
      const std::uint32_t crc = c.has_crc ? c.crc : c_.checksum ? crc32c(c.src, c.bytes) : 0;
      t = ChunkTrailer{crc, static_cast<std::uint32_t>(c.bytes), m};
      s = ch.link->write(WriteOp{&t, nullptr, &ch.peer_inbox, slot + c_.slot_bytes, sizeof t, m});
      if (!s.is_ok()) return fail(s, ch, "writing a chunk trailer", m);
    }
    return Status::ok();
  }

  // `dst == nullptr`: into the peer's staging slot for message m; otherwise into `dst` at
  // `dst_offset` (direct write of a final value; the slot of message m holds only the trailer).
  Status send_chunk(Channel& ch, const std::byte* src, std::size_t bytes, const RemoteRegion* dst = nullptr,
                    std::size_t dst_offset = 0) noexcept {
    RINGFENCE_TRY(settle_device());  // `src` may be a device copy's or reduction's destination
    const std::uint64_t m = ch.sent;
    const auto slots = static_cast<std::uint64_t>(c_.slots);
    if (m >= slots)
      RINGFENCE_TRY(wait_flag(ch, flags_.credit[ch.peer], static_cast<std::uint32_t>(m + 1 - slots),
                              "a free staging slot (credit)", m));
    ch.sent_log[m % kSentLog] = Channel::SentChunk{src, bytes, dst, dst_offset, m};
    RINGFENCE_TRY(put_chunk(ch, m));
    const Status s = ch.link->signal(SignalOp{&ch.peer_flags, FlagBlock::data_offset(c_.size, c_.rank),
                                              static_cast<std::uint32_t>(m + 1), m});
    if (!s.is_ok()) return fail(s, ch, "signalling a chunk", m);
    ch.sent = m + 1;
    return drain(ch, "completing a chunk");
  }

  // Point-to-point mode: any peer we sent to may ask for a re-send.
  Status service_all_nacks() noexcept {
    for (int r = 0; r < c_.size; ++r)
      if (Channel* ch = nack_all_[r]) RINGFENCE_TRY(service_nacks(*ch));
    return Status::ok();
  }

  // Forwards relayed chunks that arrived and fit, answers the receiver's NACKs, and passes the
  // receiver's credits back to the sender (a relay slot is free only once the receiver accepted
  // the copy, so a re-send can always be served from it). Never blocks.
  Status service_relays() noexcept {
    const auto slots = static_cast<std::uint64_t>(c_.slots);
    for (int i = 0; i < relays_.count; ++i) {
      RelayDuty& d = relays_.duty[i];
      Channel& in = *d.in;
      Channel& out = *d.out;
      if (c_.checksum) RINGFENCE_TRY(service_nacks(out));
      for (;;) {
        // Only this call's chunks: the sender may already be in its next call, and chunks of
        // the next call belong to our next call's count.
        if (in.received >= relay_target_[i]) break;
        if (!reached(flags_.data[in.peer].value.load(std::memory_order_acquire), static_cast<std::uint32_t>(in.received + 1)))
          break;
        const std::uint64_t k = out.sent;
        if (k >= slots &&
            !reached(flags_.credit[out.peer].value.load(std::memory_order_acquire), static_cast<std::uint32_t>(k + 1 - slots)))
          break;
        const std::byte* slot = in.inbox + static_cast<std::size_t>(in.received % slots) * c_.slot_stride();
        ChunkTrailer t;
        std::memcpy(&t, slot + c_.slot_bytes, sizeof t);
        if (c_.checksum) {
          // Every hop is checked: a chunk damaged on the way to us is asked for again from the
          // sender (and counted against that link), never forwarded, so each corrupting hop is
          // blamed on its own link and can be fenced in turn.
          if (!reached(flags_.retry[in.peer].value.load(std::memory_order_acquire), in.nacks_sent)) break;  // re-send pending
          if (t.message != in.received || t.bytes > c_.slot_bytes || t.crc != crc32c(slot, t.bytes)) {
            ++in.checksum_errors;
            if (++d.attempts >= c_.max_attempts)
              return fail(Status(ErrorCode::Transient), in, "an intact chunk to relay (every delivery failed its checksum)",
                          in.received);
            RINGFENCE_TRY(request_resend(in, in.received));
            break;
          }
          d.attempts = 0;
        } else if (t.bytes > c_.slot_bytes) {
          return fail(Status(ErrorCode::Transient), in, "a relayed chunk (bad length)", in.received);
        }
        out.sent_log[k % kSentLog] = Channel::SentChunk{slot, t.bytes, nullptr, 0, k, true, t.crc};
        RINGFENCE_TRY(put_chunk(out, k));
        const Status s = out.link->signal(SignalOp{&out.peer_flags, FlagBlock::data_offset(c_.size, c_.rank),
                                                   static_cast<std::uint32_t>(k + 1), k});
        if (!s.is_ok()) return fail(s, out, "signalling a relayed chunk", k);
        out.sent = k + 1;
        ++in.received;
        RINGFENCE_TRY(drain(out, "completing a relayed chunk"));
      }
      const std::uint32_t credit = sender_credit(d);
      if (credit != d.credited && reached(static_cast<std::uint32_t>(in.received), credit)) {
        const Status s = in.link->signal(SignalOp{&in.peer_flags, FlagBlock::credit_offset(c_.size, c_.rank), credit, 0});
        if (!s.is_ok()) return fail(s, in, "passing a credit back to a relayed sender", in.received);
        d.credited = credit;
        RINGFENCE_TRY(drain(in, "passing a credit back"));
      }
    }
    return Status::ok();
  }

  // The credit a relayed sender is owed: the receiver accepted (credit - base_out) relayed
  // chunks, and the sender's chunks map one to one onto them.
  std::uint32_t sender_credit(const RelayDuty& d) const noexcept {
    const std::uint32_t accepted = flags_.credit[d.out->peer].value.load(std::memory_order_acquire) -
                                   static_cast<std::uint32_t>(d.base_out);
    return static_cast<std::uint32_t>(d.base_in) + accepted;
  }

  // Re-sends every chunk the peer of `ch` reported corrupted since we last looked.
  Status service_nacks(Channel& ch) noexcept {
    const std::uint32_t seen = flags_.nack[ch.peer].value.load(std::memory_order_acquire);
    while (ch.nacks_seen != seen) {
      ++ch.nacks_seen;
      // R signalled the chunk's number before the nack on the same link, and waits for our
      // re-send before it asks again, so this load sees the number that goes with this nack.
      const std::uint32_t which = flags_.nack_msg[ch.peer].value.load(std::memory_order_acquire);
      const std::uint64_t m = ch.sent - static_cast<std::uint32_t>(static_cast<std::uint32_t>(ch.sent) - which);
      if (m >= ch.sent || ch.sent - m > static_cast<std::uint64_t>(c_.slots) || ch.sent_log[m % kSentLog].message != m)
        return fail(Status(ErrorCode::Fatal), ch, "a re-send request for a chunk no longer held", m);
      ++ch.resends;
      RINGFENCE_TRY(put_chunk(ch, m));
      const Status s = ch.link->signal(SignalOp{&ch.peer_flags, FlagBlock::flag_offset(FlagBlock::kRetry, c_.size, c_.rank),
                                                ch.resends.load(std::memory_order_relaxed), m});
      if (!s.is_ok()) return fail(s, ch, "signalling a re-sent chunk", m);
      RINGFENCE_TRY(drain(ch, "completing a re-sent chunk"));
    }
    return Status::ok();
  }

  // Waits for message m from `ch` and, in checksum mode, verifies it (asking for re-sends until
  // it arrives intact). `landed` is where the data went when written directly (else the slot).
  Status wait_chunk(Channel& ch, const std::byte*& slot, const std::byte* landed, std::size_t bytes) noexcept {
    const std::uint64_t m = ch.received;
    RINGFENCE_TRY(wait_flag(ch, flags_.data[ch.peer], static_cast<std::uint32_t>(m + 1), "data", m));
    // No chunk is used before the sender's call is known to be ours. From the checked rank the
    // fingerprint came before the data on the same link, so this does not wait.
    RINGFENCE_TRY(verify_call(true));
    slot = ch.inbox + static_cast<std::size_t>(m % static_cast<std::uint64_t>(c_.slots)) * c_.slot_stride();
    if (!c_.checksum) return Status::ok();
    const std::byte* data = landed ? landed : slot;
    for (int attempt = 1;; ++attempt) {
      ChunkTrailer t;
      std::memcpy(&t, slot + c_.slot_bytes, sizeof t);
      if (t.message == m && t.bytes == bytes && t.crc == crc32c(data, bytes)) return Status::ok();
      ++ch.checksum_errors;
      if (attempt >= c_.max_attempts)
        return fail(Status(ErrorCode::Transient), ch, "an intact chunk (every delivery failed its checksum)", m);
      RINGFENCE_TRY(request_resend(ch, m));
      // One re-send answers each NACK, so the sender's re-send count reaches our NACK count.
      RINGFENCE_TRY(wait_flag(ch, flags_.retry[ch.peer], ch.nacks_sent, "a re-sent chunk", m));
    }
  }

  // Asks the peer of `ch` to re-send message m: its number, then the nack, on the same link.
  Status request_resend(Channel& ch, std::uint64_t m) noexcept {
    Status s = ch.link->signal(SignalOp{&ch.peer_flags, FlagBlock::flag_offset(FlagBlock::kNackMsg, c_.size, c_.rank),
                                        static_cast<std::uint32_t>(m), m});
    if (s.is_ok())
      s = ch.link->signal(SignalOp{&ch.peer_flags, FlagBlock::flag_offset(FlagBlock::kNack, c_.size, c_.rank), ++ch.nacks_sent, m});
    if (!s.is_ok()) return fail(s, ch, "requesting a re-send", m);
    return drain(ch, "requesting a re-send");
  }

  Status release_chunk(Channel& ch) noexcept {
    RINGFENCE_TRY(settle_device());  // a device copy or reduction may still read the slot
    const std::uint64_t m = ch.received;
    SignalOp sig{&ch.peer_flags, FlagBlock::credit_offset(c_.size, c_.rank), static_cast<std::uint32_t>(m + 1), m};
    const Status s = ch.link->signal(sig);
    if (!s.is_ok()) return fail(s, ch, "returning a credit", m);
    ch.received = m + 1;
    return drain(ch, "completing a credit");
  }

  const EngineConfig& c_;
  FlagBlock flags_;
  Channel* left_;
  Channel* right_;
  const Reducer& reducer_;
  const DirectWrite& direct_;
  RelayDuties& relays_;
  Failure& failure_;
  std::uint64_t relay_target_[kMaxRelayDuties] = {};
  Channel* const* nack_all_ = nullptr;  // point-to-point mode: channel per rank (null for ourselves)
  Channel* const* by_position_ = nullptr;  // tree mode: channel per ring position (null for ourselves)
  Channel self_channel_;                // names ourselves in failures
  CallCheck* check_ = nullptr;          // this call's fingerprint check, when left to us
  bool settling_ = false;               // settle_call() is waiting
  const DeviceRegions* dev_ = nullptr;  // device regions of this call (null: host memory)
  bool dev_pending_ = false;            // device work enqueued and not yet synchronized
};

}  // namespace

Status run_ring(const EngineConfig& config, FlagBlock flags, Channel* left, Channel* right, const RingCall& call,
                const Reducer& reducer, const DirectWrite& direct, RelayDuties& relays, Failure& failure) noexcept {
  RingRunner runner(config, flags, left, right, reducer, direct, relays, failure);
  runner.check_with(call.check);
  runner.use_device(call.device);
  const std::size_t chunk = config.slot_bytes / reducer.elem_size;
  const int n = config.size;
  const std::size_t count = call.count;
  switch (call.kind) {
    case RingCollective::Allreduce:
      return runner.run([&](int pos) { return RingAllreduceSchedule(pos, n, count, chunk); }, call.send, call.recv);
    case RingCollective::ReduceScatter:
      return runner.run([&](int pos) { return RingReduceScatterSchedule(pos, n, count, chunk, call.stride, call.blocks); }, call.send, call.recv);
    case RingCollective::Allgather:
      return runner.run([&](int pos) { return RingAllgatherSchedule(pos, n, count, chunk, call.stride, call.blocks); }, call.send, call.recv);
    case RingCollective::Broadcast:
      return runner.run([&](int pos) { return ChainBroadcastSchedule(pos, n, call.root, count, chunk); }, call.send, call.recv);
    case RingCollective::Reduce:
      return runner.run([&](int pos) { return ChainReduceSchedule(pos, n, call.root, count, chunk); }, call.send, call.recv);
    case RingCollective::TreeAllreduce:
      if (relays.count > 0 || !call.by_position) return Status(ErrorCode::InvalidUsage);  // trees never run on a relayed plan
      runner.use_positions(call.by_position, call.by_rank);
      return runner.run([&](int pos) { return DoubleTreeAllreduceSchedule(pos, n, count, chunk); }, call.send, call.recv);
    case RingCollective::OneShotAllreduce:
      if (relays.count > 0 || !call.by_position) return Status(ErrorCode::InvalidUsage);
      runner.use_positions(call.by_position, call.by_rank);
      return runner.run([&](int pos) { return OneShotAllreduceSchedule(pos, n, count, chunk); }, call.send, call.recv);
    case RingCollective::DirectAllreduce:
      if (relays.count > 0 || !call.by_position) return Status(ErrorCode::InvalidUsage);
      runner.use_positions(call.by_position, call.by_rank);
      return runner.run([&](int pos) { return DirectAllreduceSchedule(pos, n, count, chunk); }, call.send, call.recv);
  }
  return Status(ErrorCode::InvalidUsage);
}

Status run_ring_allreduce(const EngineConfig& config, FlagBlock flags, Channel* left, Channel* right, const void* send, void* recv,
                          std::size_t count, const Reducer& reducer, const DirectWrite& direct, RelayDuties& relays,
                          Failure& failure) noexcept {
  return run_ring(config, flags, left, right, RingCall{RingCollective::Allreduce, send, recv, count, 0}, reducer, direct, relays,
                  failure);
}

bool read_fingerprint(const FlagBlock& flags, CallCheck& check) noexcept {
  const int peer = check.from->peer;
  if (!reached(flags.call[peer].value.load(std::memory_order_acquire), static_cast<std::uint32_t>(check.mine.sequence))) return false;
  const std::size_t slot = check.mine.sequence % kCallSlots;
  std::memcpy(&check.theirs, flags.calls + (static_cast<std::size_t>(peer) * kCallSlots + slot) * sizeof(CallFingerprint),
              sizeof check.theirs);
  check.settled = true;
  check.intact = check.theirs.sequence == check.mine.sequence &&
                 check.theirs.crc == crc32c(&check.theirs, offsetof(CallFingerprint, crc));
  return true;
}

Status post_fingerprint(const EngineConfig& config, FlagBlock flags, Channel* left, Channel* right, RelayDuties& relays,
                        Channel* const* to, std::size_t n_to, const CallFingerprint& mine, Failure& failure) noexcept {
  static constexpr Reducer kNoReduce{};
  static constexpr DirectWrite kNoDirect{};
  return RingRunner(config, flags, left, right, kNoReduce, kNoDirect, relays, failure).post_fingerprint(to, n_to, mine);
}

Status settle_fingerprint(const EngineConfig& config, FlagBlock flags, Channel* left, Channel* right, RelayDuties& relays,
                          CallCheck& check, Failure& failure) noexcept {
  static constexpr Reducer kNoReduce{};
  static constexpr DirectWrite kNoDirect{};
  return RingRunner(config, flags, left, right, kNoReduce, kNoDirect, relays, failure).settle_call(check, true, true);
}

Status run_p2p(const EngineConfig& config, FlagBlock flags, Channel* const* channel_of, P2POp* ops, std::size_t n,
               const P2PDirect& direct, Failure& failure, const DeviceRegions* device) noexcept {
  static constexpr Reducer kNoReduce{};
  static constexpr DirectWrite kNoDirect{};
  RelayDuties none;
  RingRunner runner(config, flags, nullptr, nullptr, kNoReduce, kNoDirect, none, failure);
  runner.use_device(device);
  return runner.run_p2p(channel_of, ops, n, direct);
}

}  // namespace ringfence::detail
