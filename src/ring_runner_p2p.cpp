// RingRunner, point-to-point groups (send/recv, alltoall): every op in slot-sized chunks, side by
// side, in list order per peer and direction.
#include "ring_runner.hpp"

namespace ringfence::detail {

// Grouped point-to-point transfers (send/recv, alltoall): every op moves its bytes in
// slot-sized chunks over its peer's connection. Ops to the same peer in the same direction run
// one after the other in list order (so both ends agree on the message sequence); everything
// else progresses side by side without blocking, so no order of calls across ranks can
// deadlock. `connection_of[r]` is the connection to rank r.
Status RingRunner::run_p2p(Connection* const* connection_of, P2POp* ops, std::size_t n, const P2PDirect& direct) noexcept {
  nack_all_ = connection_of;
  if (dev_ && (c_.checksum || c_.trailers || direct.enabled))
    return fail_self(Status(ErrorCode::InvalidUsage),
                "device regions without checksums, trailers or direct transfers (they read chunks on the host)", 0);
  // Sends to ourselves pair with receives from ourselves, k-th with k-th. The copy is done by
  // the send op, piece by piece whenever the transfers to peers cannot move (so it overlaps
  // the waits on them); the receive counts as done (the call ends only when the send is).
  for (std::size_t i = 0, j = 0; i < n; ++i) {
    if (!ops[i].send || ops[i].peer != c_.rank) continue;
    while (j < n && (ops[j].send || ops[j].peer != c_.rank)) ++j;
    if (j == n || ops[j].bytes != ops[i].bytes)
      return fail_self(Status(ErrorCode::InvalidUsage), "a matching receive from ourselves", 0);
    ops[i].local_dst = ops[j].buf;
    if (ops[j].buf == ops[i].buf || c_.size == 1) {  // alone: nothing to overlap with
      if (ops[j].buf != ops[i].buf) RINGFENCE_TRY(copy(ops[j].buf, ops[i].buf, ops[i].bytes));
      ops[i].done = ops[i].bytes;
    }
    ops[j].done = ops[j].bytes;
    ++j;
  }
  if (c_.size == 1) return settle_device();  // only transfers to ourselves (no connections exist)
  // Both ends decide by size alone, so they agree on which transfers go direct. A direct send
  // waits for its receiver's key, so a send outside an exchange (P2PDirect::whole_exchange) goes
  // direct only when it would wait for its receiver anyway: when it does not fit the slots. One
  // that fits returns once written, so every rank may send before it receives.
  const std::size_t fits = c_.slot_bytes * static_cast<std::size_t>(c_.slots);
  for (std::size_t i = 0; i < n; ++i)
    ops[i].direct = direct.enabled && ops[i].peer != c_.rank && ops[i].bytes >= direct.min_bytes &&
                    (direct.whole_exchange || ops[i].bytes > fits);
  // The clock is read only when nothing moved (a small exchange that never waits reads it
  // never): the timeout counts from the first sweep without progress after the last one with.
  std::chrono::steady_clock::time_point last_progress;
  bool moved = true;  // since last_progress was read
  for (;;) {
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
      Connection& ch = *connection_of[op.peer];
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
        if (!slot_free(ch)) continue;
        RINGFENCE_TRY(send_chunk(ch, op.buf + op.done, len, op.dst, op.done));  // dst null: staging
      } else {
        if (!reached(flags_.data[ch.peer].value.load(std::memory_order_acquire), static_cast<std::uint32_t>(ch.received + 1)))
          continue;
        if (op.landed) {  // written straight into our buffer: only verify it
          const std::byte* data = nullptr;
          RINGFENCE_TRY(wait_chunk(ch, data, op.buf + op.done, len));
          RINGFENCE_TRY(release_chunk(ch));
        } else {
          RINGFENCE_TRY(consume(ch, op.buf + op.done, nullptr, len, false));  // one-byte elements (run_p2p's reducer)
        }
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
    if (progress) {
      moved = true;
      continue;
    }
    // Just stopped moving: a short spin on what the first unfinished op waits for before the
    // slow path (clock, services, waking sleepers, the link's wait), as wait_flag spins.
    if (moved) {
      bool up = false;
      RINGFENCE_TRY(spin_for_next(connection_of, ops, n, up));
      if (up) continue;
    }
    const auto now = std::chrono::steady_clock::now();
    // An alltoall's check (Dispatch::exchange_check): a disagreement may be why nothing comes.
    // Not at the first sweep without progress: the fingerprint's line, just written by the
    // checked rank, would cross from its core when the call word beside the data usually settles
    // the check (2-rank 32 B alltoall: 0.95 -> 0.69 us without that read), so one wait slice
    // comes first.
    const bool look_at_call = !moved;
    if (moved) last_progress = now;
    moved = false;
    RINGFENCE_TRY(check_abort("point-to-point progress (the peer failed and aborted)", 0));
    if (look_at_call) RINGFENCE_TRY(verify_call(false));
    if (c_.checksum) RINGFENCE_TRY(service_all_nacks());
    RINGFENCE_TRY(serve_reposts());  // a peer in a carried allreduce may wait on a post of ours
    if (dev_) RINGFENCE_TRY(pump_links());
    if (now - last_progress >= c_.timeout) {
      for (std::size_t i = 0; i < n; ++i)
        if (ops[i].done < ops[i].bytes) {
          Connection& ch = *connection_of[ops[i].peer];
          return fail(Status(ErrorCode::Timeout), ch, waiting_for(ops[i]), ops[i].send ? ch.sent : ch.received);
        }
    }
    // Nothing to do: wait on the flag the first runnable op needs (the link spins briefly,
    // then sleeps on a futex its peer wakes), in short slices so that any other op that
    // becomes ready, a re-send request or an abort is seen soon.
    for (std::size_t i = 0; i < n; ++i) {
      const P2POp& op = ops[i];
      if (op.done >= op.bytes || op.local_dst) continue;
      Connection& ch = *connection_of[op.peer];
      std::uint32_t target = 0;
      SignalFlag& flag = awaited_flag(op, ch, target);
      flush_deferred();
      if (polls_while_repairing(ch)) {  // a peer may wait for our re-send as we wait for it
        const Status polled = poll_serving_nacks(flag, target);
        if (polled.is_error()) return polled;
        if (polled.is_ok()) break;
      }
      const Status st = ch.link->wait(flag, target, std::chrono::microseconds(20));
      if (st.is_error()) {
        RINGFENCE_TRY(check_abort("point-to-point progress (the peer failed and aborted)", 0));
        return fail(st, ch, waiting_for(op), op.send ? ch.sent : ch.received);
      }
      break;
    }
  }
  if (dev_) return finish_device_call();
  RINGFENCE_TRY(verify_call(true));  // an alltoall's check left to us (Dispatch::exchange_check)
  // With checksums a chunk is only done once the receiver accepted it; the receiver may not
  // take it before its own next call (a send outside a group, then a receive, on every rank),
  // so the unaccepted chunks are copied aside and the call returns, as it does without checksums
  // (after a wait bounded by the copy's own time, which in an exchange usually saves it:
  // await_p2p_acceptance).
  // A chunk written straight into the receiver's buffer is different: the receiver published
  // that buffer's key, so it is in this very transfer and verifies it now; and a re-send must
  // write the same bytes there, which our caller may change once we return. So we wait for
  // those (a copy would cost as much as the single copy saved), and only for those: a staged
  // chunk after them may wait for the receiver's next call.
  if (c_.checksum) {
    // Only this call's direct sends can be unaccepted (earlier calls waited for theirs), so the
    // credit lines of the other peers, which they write, are not read. A peer sent several
    // direct ops is looked at again after the first wait: its line is ours then.
    for (std::size_t i = 0; i < n; ++i) {
      if (!ops[i].send || !ops[i].direct) continue;
      Connection* ch = connection_of[ops[i].peer];
      if (const std::uint64_t end = direct_unaccepted_end(*ch); end != 0)
        RINGFENCE_TRY(wait_flag(*ch, flags_.credit[ch->peer], static_cast<std::uint32_t>(end),
                                "acceptance of the chunks written into the receiver's buffer", end - 1));
    }
    // A small call copied every staged chunk aside as it sent it (retains_at_send), so nothing
    // is left to retain, and no credit needs reading (a small exchange's end, as finish_call's).
    if (small_call_copies_aside(bytes_sent_)) return Status::ok();
    std::size_t staged = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (ops[i].send && !ops[i].direct && !ops[i].local_dst) staged += ops[i].bytes;
    RINGFENCE_TRY(await_p2p_acceptance(connection_of, staged));
    retain_unaccepted(connection_of);  // staged chunks after the last direct one
  }
  return Status::ok();
}

// The flag an op that cannot move waits for, and the value it waits for (`target`): the
// receiver's key for a direct send, a credit for a send, data for a receive.
SignalFlag& RingRunner::awaited_flag(const P2POp& op, const Connection& ch, std::uint32_t& target) noexcept {
  const auto slots = static_cast<std::uint64_t>(c_.slots);
  if (awaits_key(op)) {
    target = static_cast<std::uint32_t>(ch.p2p_keys_used + 1);
    return flags_.p2p_mail[ch.peer];
  }
  target = static_cast<std::uint32_t>(op.send ? ch.sent + 1 - std::min<std::uint64_t>(ch.sent, slots) : ch.received + 1);
  return op.send ? flags_.credit[ch.peer] : flags_.data[ch.peer];
}

// spin() on the flag of the first unfinished op to a peer: `up` once it can move. A staged receive
// prefetches the first line of its chunk's slot.
Status RingRunner::spin_for_next(Connection* const* connection_of, const P2POp* ops, std::size_t n, bool& up) noexcept {
  up = false;
  std::size_t i = 0;
  while (i < n && (ops[i].done >= ops[i].bytes || ops[i].local_dst)) ++i;
  if (i == n) return Status::ok();
  const P2POp& op = ops[i];
  const Connection& ch = *connection_of[op.peer];
  std::uint32_t target = 0;
  SignalFlag& flag = awaited_flag(op, ch, target);
  const std::byte* line = nullptr;
  if (!op.send && !op.landed) {
    const std::size_t len = std::min(c_.slot_bytes, op.bytes - op.done);
    line = ch.inbox + static_cast<std::size_t>(ch.received % static_cast<std::uint64_t>(c_.slots)) * c_.slot_stride() + c_.data_offset(len);
  }
  return spin(flag, target, up, nullptr, line);
}

// What a point-to-point op that cannot move waits for, as a failure names it.
const char* RingRunner::waiting_for(const P2POp& op) noexcept {
  if (awaits_key(op))
    return "the receiver's buffer key for a direct send (has the receiver posted a receive of the same size, after its earlier ones from us?)";
  return op.send ? "a free staging slot (credit) for a send" : "data for a receive";
}

// Copies of the chunks [first, ch.sent) to `ch` in its retained area (slot m % slots: at most
// `slots` are unaccepted, and message m + slots waits for m's credit), the sent log pointing
// there, so a re-send asked for in any later call sends the same bytes whatever the caller did
// to its buffer since.
void RingRunner::retain(Connection& ch, std::uint64_t first) noexcept {
  for (std::uint64_t m = first; m < ch.sent; ++m) {
    if (!needs_copy_aside(ch, m)) continue;  // kept already; or direct, which run_p2p waited for
    Connection::SentChunk& c = ch.sent_log[m % kSentLog];
    std::byte* const copy_at = retained_at(ch, m);
    copy_bytes(copy_at, c.src, c.bytes);
    c.src = copy_at;
  }
}

// One past the last chunk to `ch` its receiver has not accepted yet that went straight into its
// buffer (0: none did).
std::uint64_t RingRunner::direct_unaccepted_end(Connection& ch) noexcept {
  const std::uint32_t accepted = ch.credit_seen = flags_.credit[ch.peer].value.load(std::memory_order_acquire);
  for (std::uint64_t m = ch.sent; m > first_unaccepted(ch, accepted); --m)
    if (ch.sent_log[(m - 1) % kSentLog].dst) return m;
  return 0;
}

// Bytes of the chunks to `ch` its receiver has not accepted yet that still need a copy aside:
// what retain_unaccepted would copy for it now.
std::size_t RingRunner::unretained_bytes(Connection& ch) noexcept {
  const std::uint32_t accepted = ch.credit_seen = flags_.credit[ch.peer].value.load(std::memory_order_acquire);
  std::size_t bytes = 0;
  for (std::uint64_t m = first_unaccepted(ch, accepted); m < ch.sent; ++m)
    if (needs_copy_aside(ch, m)) bytes += ch.sent_log[m % kSentLog].bytes;
  return bytes;
}

// Before retain_unaccepted copies more than kAwaitAcceptanceMinBytes aside, waits for the
// receivers' acceptance for about as long as the copy would take (kCopyAsideBytesPerUs),
// serving their re-send requests. Bounded, not until acceptance: a receiver may take our chunks
// only in its next call (a send before a receive on every rank), and waiting for it would
// deadlock. `staged`: the bytes this call sent through staging slots, a bound on what can need
// a copy (chunks of earlier calls were copied when those returned); under the limit the
// receivers' credit lines are not even read.
Status RingRunner::await_p2p_acceptance(Connection* const* connection_of, std::size_t staged) noexcept {
  if (staged <= kAwaitAcceptanceMinBytes) return Status::ok();
  std::size_t bytes = 0;
  for (int r = 0; r < c_.size; ++r)
    if (Connection* ch = connection_of[r]; ch && ch->retained) bytes += unretained_bytes(*ch);
  if (bytes <= kAwaitAcceptanceMinBytes) return Status::ok();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(1 + bytes / kCopyAsideBytesPerUs);
  for (int r = 0; r < c_.size; ++r) {
    Connection* ch = connection_of[r];
    if (!ch || !ch->retained || !ch->link || unretained_bytes(*ch) == 0) continue;
    const auto target = static_cast<std::uint32_t>(ch->sent);
    while (!reached(flags_.credit[ch->peer].value.load(std::memory_order_acquire), target)) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return Status::ok();
      RINGFENCE_TRY(service_nacks(*ch));
      flush_deferred();
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
      const Status st = ch->link->wait(flags_.credit[ch->peer], target, std::min(left, std::chrono::microseconds(20)));
      if (st.is_error()) return Status::ok();  // a gone peer shows in its next call; the copy keeps the chunks
    }
  }
  return Status::ok();
}

// Every chunk a peer has not accepted yet, by its credit read now.
void RingRunner::retain_unaccepted(Connection* const* connection_of) noexcept {
  for (int r = 0; r < c_.size; ++r) {
    Connection* ch = connection_of[r];
    if (!ch || !ch->retained) continue;
    const std::uint32_t accepted = ch->credit_seen = flags_.credit[ch->peer].value.load(std::memory_order_acquire);
    retain(*ch, first_unaccepted(*ch, accepted));
  }
}

}  // namespace ringfence::detail
