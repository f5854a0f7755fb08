// RingRunner, the data path: waits on flags, chunk writes and receipts, the end of a call.
#include "ring_runner.hpp"

#include <utility>

namespace ringfence::detail {

Status RingRunner::finish_call() noexcept {
  RINGFENCE_TRY(verify_call(true));  // a call that received nothing (a broadcast root) compares here
  if (dev_) return finish_device_call();
  // With checksums a chunk is only done once the receiver accepted it. Small calls leave
  // copies of the chunks not accepted yet (lane 0's retained areas) and return, as they would
  // without checksums: waiting for every receiver would make each small call a barrier. Larger
  // ones stay to re-send (copying would cost more than the wait). A ring sends to its right
  // neighbour only.
  if (c_.checksum && c_.size > 1) {
    if (small_call_copies_aside(bytes_sent_)) {
      // Every chunk such a call sent was copied aside as it went (retains_at_send).
    } else if (can_copy_aside() && unaccepted_bytes() <= c_.retain_max_bytes) {
      retain_unaccepted(c_.retained_peers);
    } else if (by_position_) {
      RINGFENCE_TRY(await_all_acceptance());
    } else {
      RINGFENCE_TRY(await_acceptance(*right_));
    }
  }
  // A relay stays until it forwarded this call's chunks, the receiver accepted them, and the
  // sender got its credits back.
  if (relays_.count > 0) {
    const auto deadline = std::chrono::steady_clock::now() + c_.timeout;
    for (;;) {
      RINGFENCE_TRY(service_relays());
      RelayDuty* pending = nullptr;
      std::uint64_t pending_target = 0;  // its chunks to receive in this call
      for (int i = 0; i < relays_.count && !pending; ++i) {
        RelayDuty& d = relays_.duty[i];
        const std::uint32_t accepted = flags_.credit[d.out->peer].value.load(std::memory_order_acquire);
        if (d.in->received < relay_target_[i] || !reached(accepted, static_cast<std::uint32_t>(d.out->sent)) ||
            d.credited != sender_credit(d)) {
          pending = &d;
          pending_target = relay_target_[i];
        }
      }
      if (!pending) break;
      RINGFENCE_TRY(check_abort("relaying (the peer failed and aborted the collective)", pending->in->received));
      if (std::chrono::steady_clock::now() >= deadline)
        return fail(Status(ErrorCode::Timeout), *pending->in, "chunks to relay", pending->in->received);
      if (c_.checksum) RINGFENCE_TRY(service_nacks(*right_));
      flush_deferred();
      // Wait for the store that comes next: the sender's data flag while a chunk of this call is
      // missing, else the receiver's credit (its acceptance of what we forwarded, or a slot it
      // frees). Polling a data flag that is already up (the sender's next call, or a chunk held
      // back by a full slot) would return at once, round and round without a yield.
      Connection& in = *pending->in;
      Connection& out = *pending->out;
      const auto next_data = static_cast<std::uint32_t>(in.received + 1);
      const bool wants_data = in.received < pending_target &&
                              !reached(flags_.data[in.peer].value.load(std::memory_order_acquire), next_data);
      SignalFlag& flag = wants_data ? flags_.data[in.peer] : flags_.credit[out.peer];
      const std::uint32_t target = wants_data ? next_data : flag.value.load(std::memory_order_acquire) + 1;
      const Status polled = poll_with_relays(flag, target);
      if (!polled.in_progress()) {
        if (polled.is_error()) return polled;
        continue;
      }
      const Status st = (wants_data ? in : out).link->wait(flag, target, std::chrono::microseconds(20));
      if (st.is_error()) return fail(st, wants_data ? in : out, "chunks to relay", in.received);
    }
  }
  return Status::ok();
}

// Polls every link of the call: a device transport stores a signal that waits behind its
// copies only from a poll or wait on that link, and a peer may be waiting for it.
Status RingRunner::pump_links() noexcept {
  Status st = Status::ok();
  for_each_call_connection([&](Connection& ch) {
    if (st.is_ok()) st = drain(ch, "completing device copies and their signals");
  });
  return st;
}

// End of a device-region call: our output is written, and every link of the call finished
// what it was given (our copies landed in the peers' slots, the signals behind them are
// stored), so nothing of the call waits for a poll of a link that may not come. The peers
// need not have consumed the chunks yet (as on the host lanes): a send that fits the slots
// ends before its receive runs.
Status RingRunner::finish_device_call() noexcept {
  RINGFENCE_TRY(settle_device());
  return await_all_delivery();
}

// Pumps every link of the call until each is idle (Link::idle), in 20 us slices, bounded by
// the timeout; an abort of a peer ends it.
Status RingRunner::await_all_delivery() noexcept {
  const auto deadline = std::chrono::steady_clock::now() + c_.timeout;
  for (;;) {
    RINGFENCE_TRY(pump_links());
    Connection* busy = nullptr;
    for_each_call_connection([&](Connection& ch) {
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

// Bytes of the chunks this call's peers have not accepted yet.
std::size_t RingRunner::unaccepted_bytes() noexcept {
  std::size_t bytes = 0;
  for_each_call_connection([&](Connection& ch) {
    const std::uint32_t accepted = ch.credit_seen = flags_.credit[ch.peer].value.load(std::memory_order_acquire);
    for (std::uint64_t m = first_unaccepted(ch, accepted); m < ch.sent; ++m)
      bytes += ch.sent_log[m % kSentLog].bytes;
  });
  return bytes;
}

// Lane 0 at the end of the communicator: waits, at most until `deadline`, until every peer
// accepted the chunks left in the retained areas, serving their re-send requests; a peer that
// never takes them (gone, or an unmatched send) is given up on.
void RingRunner::drain_retained(std::chrono::steady_clock::time_point deadline) noexcept {
  for (int r = 0; r < c_.size; ++r) {
    Connection* ch = c_.retained_peers ? c_.retained_peers[r] : nullptr;
    if (!ch || !ch->link || ch->sent == 0) continue;
    while (!reached(flags_.credit[ch->peer].value.load(std::memory_order_acquire), static_cast<std::uint32_t>(ch->sent)) &&
           std::chrono::steady_clock::now() < deadline) {
      if (!service_nacks(*ch).is_ok()) break;
      if (!serve_repost(*ch).is_ok()) break;  // the receiver may first need a carried post of ours again
      flush_deferred();
      if (ch->link->wait(flags_.credit[ch->peer], static_cast<std::uint32_t>(ch->sent), std::chrono::milliseconds(1)).is_error()) break;
    }
  }
}

// A rank that relays waits for two things at once: `flag` (its own step) and the chunks and
// credits it forwards. A link's wait watches one flag: it spins there (2000 polls, a yield every
// 32, on shm) and then sleeps until that flag's store or the slice's end, while a relayed chunk
// lies unforwarded and its receiver waits. So a relay polls both itself first, `kRelayPolls`
// rounds, yielding every `kRelayYieldEvery` (on 2 cores, 4 ranks with a fenced link relayed:
// 8 B-4 KiB allreduces took 161-813 us a call without this, 43-85 us with it; docs/health.md,
// "How a relay waits"). Ok once `flag` reached `target`, InProgress when it did not in time.
Status RingRunner::poll_with_relays(SignalFlag& flag, std::uint32_t target) noexcept {
  for (int i = 1; i <= kRelayPolls; ++i) {
    RINGFENCE_TRY(service_relays());
    if (reached(flag.value.load(std::memory_order_acquire), target)) return Status::ok();
    if (i % kRelayYieldEvery == 0)
      std::this_thread::yield();
    else
      cpu_pause();
  }
  return Status(ErrorCode::InProgress);
}

// Once chunks are re-sent in a call, both ends of a damaged link usually wait for each other at
// once: each asked the other for a piece (repair_in_pieces) and waits for it in the link's wait,
// which watches one flag, spins its polls and sleeps; the other's request lies unanswered until
// that wait's slice ends (the link's spin with its yields, then a 20 us futex slice). On the AMD
// VM a 2-rank 1 MiB sendrecv with flip:rate=1e-4 took 36-41 ms for some 250 failed pieces a
// call per rank and the pieces that got through: 60-120 us a round trip (not timed one by one). So a repairing call polls its flag itself first, answering requests
// every kServeEvery polls (the link's own wait follows when the peer stays silent). Only where
// the peer's signals are plain stores (TransportTraits::flags_stored_by_peer): over tcp the
// link's wait reads the socket itself, and polling the flag instead made the same 1 MiB
// exchange 1.8x slower.
Status RingRunner::poll_serving_nacks(SignalFlag& flag, std::uint32_t target) noexcept {
  for (int i = 1; i <= kServePolls; ++i) {
    if (reached(flag.value.load(std::memory_order_acquire), target)) return Status::ok();
    if (i % kServeEvery == 0) {
      RINGFENCE_TRY(serve_resend_requests());
      if (relays_.count > 0) RINGFENCE_TRY(service_relays());  // a relay's chunks wait for us too
      flush_deferred();
    }
    if (i % kServeYieldEvery == 0)
      std::this_thread::yield();
    else
      cpu_pause();
  }
  return Status(ErrorCode::InProgress);
}

// The re-send requests every wait serves: any peer's in point-to-point mode, else the right
// neighbour's and those for chunks earlier point-to-point calls left retained.
Status RingRunner::serve_resend_requests() noexcept {
  RINGFENCE_TRY(nack_all_ ? service_all_nacks() : service_nacks(*right_));
  if (!nack_all_ && c_.retained_peers) RINGFENCE_TRY(service_retained());
  return Status::ok();
}

// Waits until `ch`'s peer accepted (consumed; with checksums, verified) every chunk we sent it.
Status RingRunner::await_acceptance(Connection& ch) noexcept {
  if (ch.sent == 0) return Status::ok();
  return wait_flag(ch, flags_.credit[ch.peer], static_cast<std::uint32_t>(ch.sent), "acceptance of the last chunks", ch.sent - 1);
}

// The same on every connection of the call.
Status RingRunner::await_all_acceptance() noexcept {
  Status st = Status::ok();
  for_each_call_connection([&](Connection& ch) {
    if (st.is_ok()) st = await_acceptance(ch);
  });
  return st;
}

// A short spin on `flag` before a wait's slow path (EngineConfig::spin_polls says why and how
// long): `up` once it reached `target` (or the watched post landed), not when the polls ran out.
// A peer in a carried allreduce may be waiting for a post of ours again meanwhile
// (serve_reposts). `prefetch`: a line the awaited message will land in, asked for at every poll so
// it is on its way when the flag's line arrives, not asked for after it.
Status RingRunner::spin(SignalFlag& flag, std::uint32_t target, bool& up, WatchedPost* watch, const std::byte* prefetch) noexcept {
  up = true;
  for (int i = 0; i < c_.spin_polls; ++i) {
    // A watched post is looked at before its flag: it lands first (the flag is written after
    // it), and a reader that loads the flag's line once it changed takes that line's transfer
    // and then the post's, where the post alone is one (WatchedPost).
    if (watch && watch->look()) return Status::ok();
    if (prefetch) __builtin_prefetch(prefetch, 0, 3);
    if (reached(flag.value.load(std::memory_order_acquire), target)) return Status::ok();
    if ((i & (kRepostPollEvery - 1)) == kRepostPollEvery - 1) RINGFENCE_TRY(serve_reposts());
    cpu_pause();
  }
  up = false;
  return Status::ok();
}

// Waits until `flag` reaches `target`, letting the link sleep between checks; bounded by the
// communicator timeout. Services re-send requests from the right neighbour and requests for a
// carried post again (serve_reposts) meanwhile.
Status RingRunner::wait_flag(Connection& ch, SignalFlag& flag, std::uint32_t target, const char* what, std::uint64_t message,
                             WatchedPost* watch) noexcept {
  bool up = false;
  RINGFENCE_TRY(spin(flag, target, up, watch));
  if (up) return Status::ok();
  const auto deadline = std::chrono::steady_clock::now() + c_.timeout;
  for (;;) {
    RINGFENCE_TRY(check_abort("progress (the peer failed and aborted the collective)", message));
    RINGFENCE_TRY(verify_call(false));  // a disagreement may be why nothing comes
    RINGFENCE_TRY(serve_reposts());
    if (c_.checksum) RINGFENCE_TRY(serve_resend_requests());
    if (watch && watch->look()) return Status::ok();
    if (relays_.count > 0) {
      const Status polled = poll_with_relays(flag, target);
      if (!polled.in_progress()) return polled;  // reached, or a relay failed
    }
    if (polls_while_repairing(ch)) {
      const Status polled = poll_serving_nacks(flag, target);
      if (!polled.in_progress()) return polled;
    }
    if (dev_) RINGFENCE_TRY(pump_links());
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return fail(Status(ErrorCode::Timeout), ch, what, message);
    // Sleep in slices so a relay chunk or a device link's signal (20 us), a NACK or a request
    // for a carried post again (1 ms; 20 us once a peer asked for re-sends in this call: it may
    // be repairing a chunk piece by piece) or an abort (50 ms) is handled promptly. Neither
    // request signals the flag we sleep on.
    const auto slice = std::min<std::chrono::nanoseconds>(
        deadline - now, relays_.count > 0 || dev_ || resending_        ? std::chrono::nanoseconds(20000)
                        : c_.checksum || ch.last_carried != 0 ? std::chrono::nanoseconds(1000000)
                                                              : std::chrono::nanoseconds(50000000));
    flush_deferred();  // a peer asleep on a signal of ours may be what this waits for
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

Status RingRunner::drain(Connection& ch, const char* what) noexcept {
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

// `dst = a op b` (b null: `dst = a`) from local operands; with checksums the result's CRC is
// kept for sending it (known_).
Status RingRunner::produce(std::byte* dst, const std::byte* a, const std::byte* b, std::size_t count, bool last) noexcept {
  const std::size_t bytes = count * reducer_.elem_size;
  if (!c_.checksum || dev_ || crc_at_send_) {  // nothing to verify; a send computes its own CRC
    known_ = KnownCrc{};
    return b ? combine(dst, a, b, count, last) : copy(dst, a, bytes);
  }
  std::uint32_t crc = 0;
  if (b) combine_with_crc(reducer_, last, dst, a, b, count, c_.size, nullptr, &crc);
  else crc = copy_bytes_crc(dst, a, bytes);
  known_ = KnownCrc{dst, bytes, crc};
  return Status::ok();
}

// The copy of our input that no send of the same range took along (CopyAlong).
Status RingRunner::copy_alone(CopyAlong& along) noexcept {
  const CopyAlong a = std::exchange(along, CopyAlong{});
  return produce(a.to, a.from, nullptr, a.count, false);
}

// Writes chunk `m` (data, then trailer in checksum mode) as recorded in the sent log.
Status RingRunner::put_chunk(Connection& ch, std::uint64_t m, std::uint32_t piece, bool with_trailer, std::byte* also) noexcept {
  Connection::SentChunk& c = ch.sent_log[m % kSentLog];
  const std::size_t slot = static_cast<std::size_t>(m % static_cast<std::uint64_t>(c_.slots)) * c_.slot_stride();
  if (piece != 0) return put_piece(ch, m, decode_piece(piece, c.bytes), slot);
  WriteOp w = c.dst ? WriteOp{c.src, nullptr, c.dst, c.dst_offset, c.bytes, m}
                    : WriteOp{c.src, nullptr, &ch.peer_inbox, slot + c_.data_offset(c.bytes), c.bytes, m};
  // A chunk without a known CRC: the link may compute it in the pass that copies it.
  WriteCrc crc_of_write;
  if (c_.checksum && !c.has_crc) w.crc = &crc_of_write;
  w.stream = c_.streams(c.bytes);
  WriteAlso also_write{also};
  if (also) w.also = &also_write;
  // Bandwidth evidence for the health layer, unless the link times its writes itself (they
  // only enqueue: a device copy).
  const bool timed = c.bytes >= kTimedWriteBytes && !ch.link->times_writes();
  const auto start = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  RINGFENCE_TRY(write_data(ch, w, "writing a chunk", m));
  if (also && !also_write.done) copy_bytes(also, c.src, c.bytes);  // a link that does not copy, or a fault's pieces
  if (timed) {
    const auto ns = static_cast<std::uint64_t>((std::chrono::steady_clock::now() - start).count());
    ch.timed_ns.store(ch.timed_ns.load(std::memory_order_relaxed) + ns, std::memory_order_relaxed);
    ch.timed_bytes.store(ch.timed_bytes.load(std::memory_order_relaxed) + c.bytes, std::memory_order_relaxed);
    ch.speeds.add(c.bytes, ns);
  }
  if (c_.checksum && !c.has_crc) {  // kept for re-sends (the source stays as it was)
    c.crc = crc_of_write.done ? crc_of_write.value : crc32c(c.src, c.bytes);
    c.has_crc = true;
  }
  if ((c_.checksum || c_.trailers) && with_trailer) return put_trailer(ch, m, c.has_crc ? c.crc : 0, c.bytes);
  return Status::ok();
}

// One data write; a full completion queue is drained and the write tried once more.
Status RingRunner::write_data(Connection& ch, const WriteOp& w, const char* what, std::uint64_t m) noexcept {
  Status s = ch.link->write(w);
  if (s.in_progress()) {
    RINGFENCE_TRY(drain(ch, "draining completions"));
    s = ch.link->write(w);
  }
  return s.is_ok() ? s : fail(s, ch, what, m);
}

// The trailer {crc, bytes, m} of message m (a chunk, or a re-sent piece).
Status RingRunner::put_trailer(Connection& ch, std::uint64_t m, std::uint32_t crc, std::size_t bytes) noexcept {
  ChunkTrailer& t = ch.trailers[m % kSentLog];  // outlives an asynchronous write
  t = ChunkTrailer{crc, static_cast<std::uint32_t>(bytes), static_cast<std::uint32_t>(m)};
  const RemoteRegion* region = c_.trailers_with_flag() ? &ch.peer_flags : &ch.peer_inbox;
  const Status s = ch.link->write(WriteOp{&t, nullptr, region, c_.trailer_at(c_.rank, m), sizeof t, m});
  return s.is_ok() ? s : fail(s, ch, "writing a chunk trailer", m);
}

// `dst == nullptr`: into the peer's staging slot for message m; otherwise into `dst` at
// `dst_offset` (direct write of a final value; the slot of message m holds only the trailer).
Status RingRunner::send_chunk(Connection& ch, const std::byte* src, std::size_t bytes, const RemoteRegion* dst,
                  std::size_t dst_offset, std::byte* also) noexcept {
  RINGFENCE_TRY(settle_device());  // `src` may be a device copy's or reduction's destination
  const std::uint64_t m = ch.sent;
  const auto slots = static_cast<std::uint64_t>(c_.slots);
  if (!slot_free(ch)) {
    RINGFENCE_TRY(wait_flag(ch, flags_.credit[ch.peer], static_cast<std::uint32_t>(m + 1 - slots),
                            "a free staging slot (credit)", m));
    ch.credit_seen = flags_.credit[ch.peer].value.load(std::memory_order_acquire);
  }
  Connection::SentChunk& c = ch.sent_log[m % kSentLog];
  c = Connection::SentChunk{src, bytes, dst, dst_offset, m};
  if (c_.checksum && known_.at == src && known_.bytes == bytes) {  // the pass that produced it computed it
    c.has_crc = true;
    c.crc = known_.crc;
  }
  if (check_ && !(ch.call_word == check_->word())) RINGFENCE_TRY(put_call_word(ch, m));  // first chunk of the call here
  // Where the trailer lies in the data flag's line and the link can store it with the flag, the
  // signal carries it: one operation instead of a write and a signal, most of what the trailer
  // cost a small call (docs/protection-cost-small-calls.md). Re-sends and relays still write it.
  const bool carry = (c_.checksum || c_.trailers) && c_.trailers_with_flag() && ch.transport &&
                     ch.transport->traits().signals_carry_bytes;
  RINGFENCE_TRY(put_chunk(ch, m, 0, !carry, also));
  SignalOp sig{&ch.peer_flags, FlagBlock::data_offset(c_.size, c_.rank), static_cast<std::uint32_t>(m + 1), m};
  if (carry) {
    ChunkTrailer& t = ch.trailers[m % kSentLog];  // outlives a signal the link defers
    t = ChunkTrailer{c.has_crc ? c.crc : 0, static_cast<std::uint32_t>(bytes), static_cast<std::uint32_t>(m)};
    sig.with = &t;
    sig.with_offset = c_.trailer_at(c_.rank, m);
    sig.with_bytes = sizeof t;
  }
  sig.defer_wake = defer_wake(ch);
  const Status s = ch.link->signal(sig);
  if (!s.is_ok()) return fail(s, ch, "signalling a chunk", m);
  if (retains_at_send(ch, dst, bytes)) {  // after the signal: the copy overlaps the receiver's work
    std::byte* const copy_at = retained_at(ch, m);
    copy_bytes(copy_at, src, bytes);
    c.src = copy_at;
  }
  ch.sent = m + 1;
  bytes_sent_ += bytes;
  return drain(ch, "completing a chunk");
}

// Waits for the next message from `ch`; `slot` is its staging slot.
Status RingRunner::await_chunk(Connection& ch, const std::byte*& slot) noexcept {
  const std::uint64_t m = ch.received;
  RINGFENCE_TRY(wait_flag(ch, flags_.data[ch.peer], static_cast<std::uint32_t>(m + 1), "data", m));
  // No chunk is used before the sender's call is known to be ours. From the checked rank the
  // fingerprint (and the call word beside the flag) came before the data on the same link, so
  // this does not wait.
  RINGFENCE_TRY(verify_call(true, &ch));
  slot = ch.inbox + static_cast<std::size_t>(m % static_cast<std::uint64_t>(c_.slots)) * c_.slot_stride();
  return Status::ok();
}

// Delivery `attempt` of the chunk `ch` is on failed its check: count it and ask for it again
// (one re-send answers each NACK, so the sender's re-send count reaches our NACK count). A link
// that damaged the last few deliveries (or earlier chunks: `repair_piece`) is asked for pieces.
Status RingRunner::redeliver(Connection& ch, int attempt, const std::byte* data, std::size_t bytes, bool& repaired) noexcept {
  const std::uint64_t m = ch.received;
  ++ch.checksum_errors;
  if (attempt >= (ch.repair_piece ? 1 : kWholeDeliveries) && bytes > kPieceUnit && c_.slot_bytes <= kMaxPieceSlotBytes) {
    RINGFENCE_TRY(repair_in_pieces(ch, data, bytes));
    repaired = true;
    return Status::ok();
  }
  if (attempt >= c_.max_attempts) return fail(Status(ErrorCode::Transient), ch, "an intact chunk (every delivery failed its checksum)", m);
  RINGFENCE_TRY(request_resend(ch, m));
  return wait_flag(ch, flags_.retry[ch.peer], ch.nacks_sent, "a re-sent chunk", m);
}

// Waits for message m (`bytes` long) from `ch` and, in checksum mode, verifies it before it is
// used (asking for re-sends until it arrives intact); `*crc` gets its CRC. `landed` is where
// the data went when written directly; otherwise `data` is where it lies in its slot.
Status RingRunner::wait_chunk(Connection& ch, const std::byte*& data, const std::byte* landed, std::size_t bytes,
                              std::uint32_t* crc) noexcept {
  const std::byte* slot = nullptr;
  RINGFENCE_TRY(await_chunk(ch, slot));
  data = landed ? landed : slot + c_.data_offset(bytes);
  if (!c_.checksum) return Status::ok();
  bool repaired = false;
  for (int attempt = 1;; ++attempt) {
    const std::uint32_t c = crc32c(data, bytes);
    if (repaired || intact(ch, bytes, c)) {
      if (crc) *crc = c;
      return Status::ok();
    }
    RINGFENCE_TRY(redeliver(ch, attempt, data, bytes, repaired));
  }
}

// Receives the next chunk from `ch` and consumes it: `dst = chunk op b` (the reducer's combine,
// or finish when `last`), or `dst = chunk` when `b` is null; then hands the slot back. With
// checksums the pass that consumes the chunk also verifies it (checked_ops.hpp): a damaged
// delivery only wrote `dst`, which the re-sent chunk's pass writes again. Where `dst` overlaps
// `b` (in place) that would lose `b`, so the chunk is verified first. Either way the result's
// CRC is kept for sending it on, unless the send's copy computes it (crc_at_send_).
Status RingRunner::consume(Connection& ch, std::byte* dst, const std::byte* b, std::size_t count, bool last) noexcept {
  const std::size_t elem = reducer_.elem_size, bytes = count * elem;
  const std::byte* slot = nullptr;
  const bool in_place = b && dst < b + bytes && b < dst + bytes;
  if (!c_.checksum || dev_ || in_place) {
    const std::byte* data = nullptr;
    RINGFENCE_TRY(wait_chunk(ch, data, nullptr, bytes));
    if (!b && stream_results_) {  // a final value; checksummed copies (never in place) take the verified path below
      copy_bytes_stream(dst, data, bytes);
      known_ = KnownCrc{};
    } else {
      RINGFENCE_TRY(produce(dst, data, b, count, last));
    }
    return release_chunk(ch);
  }
  RINGFENCE_TRY(await_chunk(ch, slot));
  const std::byte* const data = slot + c_.data_offset(bytes);
  const bool crc_of_result = !b || !crc_at_send_;  // a copy's CRC of its input is its result's
  // A streamed chunk's lines come from memory: the pass prefetches them (CheckedSource).
  const CheckedSource from = c_.streams(bytes) ? CheckedSource::Memory : CheckedSource::Cache;
  bool repaired = false;
  for (int attempt = 1;; ++attempt) {
    std::uint32_t crc_in = 0, crc_out = 0;
    if (b) combine_with_crc(reducer_, last, dst, data, b, count, c_.size, &crc_in, crc_of_result ? &crc_out : nullptr, from);
    else crc_in = crc_out = checked_copy(dst, data, bytes, stream_results_, from);
    if (repaired || intact(ch, bytes, crc_in)) {
      known_ = crc_of_result ? KnownCrc{dst, bytes, crc_out} : KnownCrc{};
      return release_chunk(ch);
    }
    RINGFENCE_TRY(redeliver(ch, attempt, data, bytes, repaired));
  }
}

Status RingRunner::release_chunk(Connection& ch) noexcept {
  RINGFENCE_TRY(settle_device());  // a device copy or reduction may still read the slot
  const std::uint64_t m = ch.received;
  SignalOp sig{&ch.peer_flags, FlagBlock::credit_offset(c_.size, c_.rank), static_cast<std::uint32_t>(m + 1), m};
  sig.defer_wake = defer_wake(ch);
  const Status s = ch.link->signal(sig);
  if (!s.is_ok()) return fail(s, ch, "returning a credit", m);
  ch.received = m + 1;
  return drain(ch, "completing a credit");
}

}  // namespace ringfence::detail
