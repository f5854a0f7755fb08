// RingRunner, integrity and relays: re-send requests and their service, and the chunks this
// rank forwards around fenced links.
#include "ring_runner.hpp"

namespace ringfence::detail {

// Point-to-point mode: any peer we sent to may ask for a re-send.
Status RingRunner::service_all_nacks() noexcept {
  for (int r = 0; r < c_.size; ++r)
    if (Connection* ch = nack_all_[r]) RINGFENCE_TRY(service_nacks(*ch));
  return Status::ok();
}

// Re-send requests for chunks an earlier point-to-point call left unaccepted (retained copies):
// served from every wait of lane 0, whatever the call.
Status RingRunner::service_retained() noexcept {
  for (int r = 0; r < c_.size; ++r) {
    Connection* ch = c_.retained_peers[r];
    if (ch && ch != right_ && flags_.nack[ch->peer].value.load(std::memory_order_acquire) != ch->nacks_seen)
      RINGFENCE_TRY(service_nacks(*ch));
  }
  return Status::ok();
}

// Forwards relayed chunks that arrived and fit, answers the receiver's NACKs, and passes the
// receiver's credits back to the sender (a relay slot is free only once the receiver accepted
// the copy, so a re-send can always be served from it). Never blocks.
Status RingRunner::service_relays() noexcept {
  const auto slots = static_cast<std::uint64_t>(c_.slots);
  for (int i = 0; i < relays_.count; ++i) {
    RelayDuty& d = relays_.duty[i];
    Connection& in = *d.in;
    Connection& out = *d.out;
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
      const std::byte* const slot_start = in.inbox + static_cast<std::size_t>(in.received % slots) * c_.slot_stride();
      const ChunkTrailer t = trailer_of(in, in.received);
      const std::byte* const slot = slot_start + c_.data_offset(t.bytes);  // the chunk's bytes (checked below)
      if (c_.checksum) {
        // Every hop is checked: a chunk damaged on the way to us is asked for again from the
        // sender (and counted against that link), never forwarded, so each corrupting hop is
        // blamed on its own link and can be fenced in turn.
        if (!reached(flags_.retry[in.peer].value.load(std::memory_order_acquire), in.nacks_sent)) break;  // re-send pending
        if (t.message != static_cast<std::uint32_t>(in.received) || t.bytes > c_.slot_bytes || t.crc != crc32c(slot, t.bytes)) {
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
      out.sent_log[k % kSentLog] = Connection::SentChunk{slot, t.bytes, nullptr, 0, k, true, t.crc};
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
std::uint32_t RingRunner::sender_credit(const RelayDuty& d) const noexcept {
  const std::uint32_t accepted = flags_.credit[d.out->peer].value.load(std::memory_order_acquire) -
                                 static_cast<std::uint32_t>(d.base_out);
  return static_cast<std::uint32_t>(d.base_in) + accepted;
}

// Re-sends every chunk the peer of `ch` reported corrupted since we last looked.
Status RingRunner::service_nacks(Connection& ch) noexcept {
  const std::uint32_t seen = flags_.nack[ch.peer].value.load(std::memory_order_acquire);
  while (ch.nacks_seen != seen) {
    ++ch.nacks_seen;
    resending_ = true;
    // R signalled the chunk's number before the nack on the same link, and waits for our
    // re-send before it asks again, so this load sees the number that goes with this nack.
    const std::uint32_t which = flags_.nack_msg[ch.peer].value.load(std::memory_order_acquire);
    const std::uint32_t piece = flags_.nack_piece[ch.peer].value.load(std::memory_order_acquire);
    if (piece == kRepublishKeyPiece) {  // not a chunk: our receive-buffer key reached the peer damaged
      RINGFENCE_TRY(republish_p2p_key(ch));
      continue;
    }
    const std::uint64_t m = ch.sent - static_cast<std::uint32_t>(static_cast<std::uint32_t>(ch.sent) - which);
    if (m >= ch.sent || ch.sent - m > static_cast<std::uint64_t>(c_.slots) || ch.sent_log[m % kSentLog].message != m)
      return fail(Status(ErrorCode::Fatal), ch, "a re-send request for a chunk no longer held", m);
    ++ch.resends;
    RINGFENCE_TRY(put_chunk(ch, m, piece));
    const Status s = ch.link->signal(SignalOp{&ch.peer_flags, FlagBlock::flag_offset(FlagBlock::kRetry, c_.size, c_.rank),
                                              ch.resends.load(std::memory_order_relaxed), m});
    if (!s.is_ok()) return fail(s, ch, "signalling a re-sent chunk", m);
    RINGFENCE_TRY(drain(ch, "completing a re-sent chunk"));
  }
  return Status::ok();
}

// Asks the peer of `ch` to re-send message m (or the piece of it that `piece` names): its
// number and the piece, then the nack, on the same link.
Status RingRunner::request_resend(Connection& ch, std::uint64_t m, std::uint32_t piece) noexcept {
  requested_ = true;
  Status s = ch.link->signal(SignalOp{&ch.peer_flags, FlagBlock::flag_offset(FlagBlock::kNackMsg, c_.size, c_.rank),
                                      static_cast<std::uint32_t>(m), m});
  if (s.is_ok())
    s = ch.link->signal(SignalOp{&ch.peer_flags, FlagBlock::flag_offset(FlagBlock::kNackPiece, c_.size, c_.rank), piece, m});
  if (s.is_ok())
    s = ch.link->signal(SignalOp{&ch.peer_flags, FlagBlock::flag_offset(FlagBlock::kNack, c_.size, c_.rank), ++ch.nacks_sent, m});
  if (!s.is_ok()) return fail(s, ch, "requesting a re-send", m);
  return drain(ch, "requesting a re-send");
}

}  // namespace ringfence::detail
