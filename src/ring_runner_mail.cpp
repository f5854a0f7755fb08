// RingRunner, the traffic beside the chunks: mailboxes (output and receive-buffer keys for direct writes)
// and call fingerprints.
#include "ring_runner.hpp"

namespace ringfence::detail {

// See post_fingerprint() in engine.hpp.
// A spread fingerprint (CallCheck::pairwise) is read only by a peer comparing this very call,
// before it uses our chunk of it, and the peer cannot be in a call 32 earlier: it needs no
// acknowledgement, and has its own copies so a later post to a checker waits for nothing it owes.
Status RingRunner::post_fingerprint(Connection* const* to, std::size_t n_to, const CallFingerprint& mine, bool spread,
                                    std::span<const std::byte> carried) noexcept {
  const auto number = static_cast<std::uint32_t>(mine.sequence);
  const std::size_t slot = mine.sequence % kCallSlots;
  for (std::size_t i = 0; i < n_to; ++i) {
    Connection& ch = *to[i];
    // The slot's previous fingerprint to this peer (if any: the pairs change with the plan)
    // must have been read before it is overwritten.
    if (const auto previous = static_cast<std::uint32_t>(ch.call_post(slot).fp.sequence);
        !spread && ch.call_post(slot).fp.sequence != 0 && !reached(ch.call_ack_seen, previous)) {
      RINGFENCE_TRY(wait_flag(ch, flags_.call_ack[ch.peer], previous, "the reading of an earlier call fingerprint", 0));
      ch.call_ack_seen = flags_.call_ack[ch.peer].value.load(std::memory_order_acquire);
    }
    const void* src = nullptr;
    std::size_t bytes = sizeof(CallFingerprint);
    if (spread) {
      ch.spread_fp[slot] = mine;
      src = &ch.spread_fp[slot];
    } else {
      // The post is kept whole (with its carried data) until the slot comes round again: a peer
      // that finds it damaged asks for it again (serve_reposts), possibly calls later.
      CallPost& post = ch.call_post(slot);
      post.fp = mine;
      post.data_bytes = static_cast<std::uint32_t>(carried.size());
      if (!carried.empty()) {
        ch.last_carried = mine.sequence;
        post.data_crc = copy_bytes_crc(post.data(), carried.data(), carried.size()) ^ mine.crc;
      }
      src = &post;
      bytes = post.posted_bytes();
    }
    Status s = ch.link->write(WriteOp{src, nullptr, &ch.peer_flags, FlagBlock::call_offset(c_.size, c_.rank, slot), bytes, 0});
    // A carried post's signal leaves waking a sleeping peer to this runner's next wait or end
    // (defer_wakes: RingRunner::run_carried).
    SignalOp sig{&ch.peer_flags, FlagBlock::flag_offset(FlagBlock::kCall, c_.size, c_.rank), number, 0};
    sig.defer_wake = !carried.empty() && defer_wake(ch);
    if (s.is_ok()) s = ch.link->signal(sig);
    if (!s.is_ok()) return fail(s, ch, "sending the call fingerprint", 0);
    RINGFENCE_TRY(drain(ch, "sending the call fingerprint"));
  }
  return Status::ok();
}

// Reads `check.from`'s fingerprint of this call into `check` (waiting for it when `block`; else
// only if it is there: `check.settled` says). `by_word`: a chunk from that rank has just
// arrived, so the line of its data flag holds the word of the call it sent it in (CallWord);
// when that is ours, it stands for the whole fingerprint.
Status RingRunner::read_call(CallCheck& check, bool block, bool by_word) noexcept {
  Connection& from = *check.from;
  CallWord word;
  if (by_word) std::memcpy(&word, reinterpret_cast<const std::byte*>(&flags_.data[from.peer]) + kFlagLineCallWord, sizeof word);
  if (by_word && word == check.word()) {
    check.theirs = check.mine;
    check.settled = check.intact = true;
  } else if (!read_fingerprint(flags_, check) && block) {
    RINGFENCE_TRY(await_call_post(check));
    read_fingerprint(flags_, check);
  }
  return Status::ok();
}

// Waits until `check.from` has posted its fingerprint of this call (its call flag); reads nothing.
// `watch` as wait_flag's.
Status RingRunner::await_call_post(CallCheck& check, WatchedPost* watch) noexcept {
  Connection& from = *check.from;
  const auto number = static_cast<std::uint32_t>(check.mine.sequence);
  // A watched post is looked at first, in wait_flag's first poll (it lands before its flag).
  if (!watch && reached(flags_.call[from.peer].value.load(std::memory_order_acquire), number)) return Status::ok();
  settling_ = true;  // the wait must not try to settle a check again
  const Status waited =
      wait_flag(from, flags_.call[from.peer], number, "the call fingerprint of the same collective (did every rank make the same calls?)", 0,
                watch);
  settling_ = false;
  return waited;
}

// The checked neighbour's fingerprint (read_call), acknowledged when its number is a multiple
// of kCallAckEvery or `always_ack`, freeing its slot and every one before it.
Status RingRunner::settle_call(CallCheck& check, bool block, bool always_ack, bool by_word) noexcept {
  RINGFENCE_TRY(read_call(check, block, by_word));
  if (!check.settled) return Status::ok();
  Connection& from = *check.from;
  const auto number = static_cast<std::uint32_t>(check.mine.sequence);
  if (!always_ack && number % kCallAckEvery != 0) return Status::ok();
  const Status s = from.link->signal(SignalOp{&from.peer_flags, FlagBlock::flag_offset(FlagBlock::kCallAck, c_.size, c_.rank), number, 0});
  if (!s.is_ok()) return fail(s, from, "acknowledging the call fingerprint", 0);
  return drain(from, "acknowledging the call fingerprint");
}

// The executor's side of a check left to it: settle it (see settle_call) and fail the call
// when the ranks disagree. Called before the first received chunk is used, by waits that
// find the fingerprint there, and at the end of the call.
// `data_from`: the connection a chunk just arrived on (its word may settle the check).
Status RingRunner::verify_call(bool block, Connection* data_from) noexcept {
  if (!check_ || settling_) return Status::ok();
  if (check_->pairwise && data_from && data_from != check_->from) return verify_sender(*data_from);
  if (check_->settled) return Status::ok();
  RINGFENCE_TRY(settle_call(*check_, block, false, data_from == check_->from));
  if (check_->disagree())
    return fail(Status(ErrorCode::InvalidUsage), *check_->from, "a call fingerprint equal to ours (the ranks disagree on this call)", 0);
  return Status::ok();
}

// CallCheck::pairwise: compares the call of `sender` (not the checked rank: settle_call does that
// one) before its first chunk of this call is used, as for the checked rank (read_call): its call
// word, else its whole fingerprint, which it wrote before any chunk, not acknowledged. A damaged
// or stale fingerprint is counted against the link and not compared, as for the checked rank; a
// different call fails the call naming `sender`.
Status RingRunner::verify_sender(Connection& sender) noexcept {
  CallCheck& mine = *check_;
  if (sender.pair_checked == mine.mine.sequence) return Status::ok();
  CallCheck theirs;
  theirs.from = &sender;
  theirs.mine = mine.mine;
  RINGFENCE_TRY(read_call(theirs, true, true));
  if (!theirs.intact) {
    ++sender.checksum_errors;
  } else if (theirs.disagree()) {
    mine = theirs;  // judged after the call: names `sender` and both calls
    return fail(Status(ErrorCode::InvalidUsage), sender, "a call fingerprint equal to ours (the ranks disagree on this call)", 0);
  }
  sender.pair_checked = mine.mine.sequence;
  return Status::ok();
}

// Our call's word into the line of `ch`'s data flag for us, before message m (CallWord).
Status RingRunner::put_call_word(Connection& ch, std::uint64_t m) noexcept {
  ch.call_word = check_->word();
  const Status s = ch.link->write(WriteOp{&ch.call_word, nullptr, &ch.peer_flags, FlagBlock::data_offset(c_.size, c_.rank) + kFlagLineCallWord,
                                          sizeof ch.call_word, m});
  return s.is_ok() ? s : fail(s, ch, "writing the call word", m);
}

// Writes our output's key (empty = "use my staging slots") into the left neighbour's mailbox
// for this call, then signals it. Safe to overwrite: the left neighbour read the previous key
// before its first final-value write of the previous call, which we consumed before
// returning from that call.
Status RingRunner::publish_output_key() noexcept {
  return post_mail(*left_, left_->mail_header, FlagBlock::mailbox_offset(c_.size, c_.rank),
                   FlagBlock::mail_offset(c_.size, c_.rank), direct_.own_key, direct_.call, "publishing the output key");
}

// A mailbox message: header {length, crc32c(key, seeded with its number), number}, then the
// key, written into the peer's mailbox at `box`, then its number signalled at `flag`. A key
// damaged in flight must be refused, never used as an address to write into, and the number
// keeps a key that never arrived (a lossy link) from being mistaken for a later one.
// `header` must outlive the asynchronous writes (it lives in the connection).
Status RingRunner::post_mail(Connection& ch, std::uint32_t* header, std::size_t box, std::size_t flag, std::span<const std::byte> key,
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
bool RingRunner::read_mail(const std::byte* box, std::uint32_t number, std::span<const std::byte>& key) noexcept {
  std::uint32_t header[3] = {};
  std::memcpy(header, box, kMailHeader);
  const std::uint32_t len = header[0];
  if (len + kMailHeader > kMailboxBytes || header[2] != number || crc32c(box + kMailHeader, len, number) != header[1]) return false;
  key = std::span<const std::byte>(box + kMailHeader, len);
  return true;
}

// Waits for the right neighbour's output key of this call and resolves it to a region
// (nullptr when the neighbour asked for staging).
Status RingRunner::fetch_peer_output(const RemoteRegion*& region) noexcept {
  Connection& ch = *right_;
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
Status RingRunner::publish_p2p_key(Connection& ch, P2POp& op, const P2PDirect& d) noexcept {
  const std::span<const std::byte> key = d.key_of(d, op.buf, op.bytes, ch);
  const std::uint32_t number = ch.p2p_keys_published + 1;
  RINGFENCE_TRY(post_p2p_key(ch, key, number, "publishing a receive-buffer key"));
  ch.p2p_keys_published = number;
  if (!key.empty()) std::memcpy(ch.p2p_key, key.data(), key.size());  // post_mail refused longer keys; empty: no data()
  ch.p2p_key_bytes = key.size();
  op.landed = !key.empty();
  return Status::ok();
}

// `key` numbered `number` into the peer's p2p mailbox for us, then its p2p_mail word.
Status RingRunner::post_p2p_key(Connection& ch, std::span<const std::byte> key, std::uint32_t number, const char* what) noexcept {
  return post_mail(ch, ch.p2p_mail_header, FlagBlock::p2p_mailbox_offset(c_.size, c_.rank),
                   FlagBlock::flag_offset(FlagBlock::kP2PMail, c_.size, c_.rank), key, number, what);
}

// The sender read our last key damaged (or not at all) and asked for it again
// (kRepublishKeyPiece): the same key and number, then retry, which answers the request as a
// re-sent chunk would. The sender cannot have used the key yet, so no later one replaced it.
Status RingRunner::republish_p2p_key(Connection& ch) noexcept {
  RINGFENCE_TRY(post_p2p_key(ch, std::span<const std::byte>(ch.p2p_key, ch.p2p_key_bytes), ch.p2p_keys_published,
                             "publishing a receive-buffer key again"));
  const Status s = ch.link->signal(SignalOp{&ch.peer_flags, FlagBlock::flag_offset(FlagBlock::kRetry, c_.size, c_.rank), ++ch.resends, 0});
  if (!s.is_ok()) return fail(s, ch, "signalling a re-published key", 0);
  return drain(ch, "completing a re-published key");
}

// Direct point-to-point, sender side: reads the receiver's key for our next direct send
// (its p2p_mail word reached it) and imports it (nullptr = write into its staging slots). With
// checksums a key that arrived damaged (or not at all) is asked for again, as a chunk would be:
// the receiver is in the matching receive and serves the request from its waits.
Status RingRunner::fetch_p2p_key(Connection& ch, P2POp& op, const P2PDirect& d) noexcept {
  const std::uint32_t number = ch.p2p_keys_used + 1;
  const std::byte* box = flags_.p2p_mailboxes + static_cast<std::size_t>(ch.peer) * kMailboxBytes;
  std::span<const std::byte> key;
  for (int attempt = 1; !read_mail(box, number, key); ++attempt) {
    if (!c_.checksum || attempt >= c_.max_attempts)
      return fail(Status(ErrorCode::Transient), ch, "an intact receive-buffer key (it arrived corrupted)", ch.sent);
    ++ch.checksum_errors;
    RINGFENCE_TRY(request_resend(ch, ch.received, kRepublishKeyPiece));
    RINGFENCE_TRY(wait_flag(ch, flags_.retry[ch.peer], ch.nacks_sent, "a receive-buffer key published again", ch.sent));
  }
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

}  // namespace ringfence::detail
