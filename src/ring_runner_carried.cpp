// RingRunner, the carried allreduce (docs/carried-allreduce.md): on two ranks an allreduce of
// at most kCarryMaxBytes moves no chunk. Each rank's call fingerprint carries its input
// (post_fingerprint), so the one post a call makes anyway is the whole transfer: wait for the
// peer's post, verify its bytes under our own fingerprint's CRC (which proves the call the same;
// otherwise read and compare the fingerprints), reduce. A post
// that arrives damaged or not at all is asked for again (FlagBlock::repost), and every wait of
// every later call answers such requests, so a rank that already returned still serves one.
#include "ring_runner.hpp"

namespace ringfence::detail {

Status RingRunner::run_carried(CallCheck& check, const std::byte* send, std::byte* recv, std::size_t count) noexcept {
  if (!check.from) return fail_self(Status(ErrorCode::InvalidUsage), "a carried allreduce without a checked peer", 0);
  Connection& from = *check.from;
  const std::size_t bytes = count * reducer_.elem_size;
  const auto number = static_cast<std::uint32_t>(check.mine.sequence);
  const std::size_t slot = check.mine.sequence % kCallSlots;
  const std::byte* const theirs = flags_.call_slot(from.peer, slot);
  // Our post goes last, right before the wait, and its signal leaves waking a sleeping peer to
  // our wait (before it sleeps) or our end (defer_wake): a signal that looks for a sleeper at
  // once waits for the flag's line first (docs/carried-allreduce.md, "What it gains").
  defer_wakes(true);
  if (!check.posted) {
    Connection* to[] = {&from};
    RINGFENCE_TRY(post_fingerprint(to, 1, check.mine, false, std::span<const std::byte>(send, bytes)));
    check.posted = true;
  }
  // Our input as posted: the copy our post keeps until its slot comes round (`recv` may be
  // `send`).
  const CallPost& kept = from.call_post(slot);
  const bool kept_ours = kept.fp.sequence == check.mine.sequence && kept.fp.carried && kept.data_bytes == bytes;
  const std::byte* const own = kept_ours ? kept.data() : send;
  // The peer's data is copied out of its slot once and the copy is checked and reduced: bytes
  // may still land in the slot after a check passed (a write that arrives in pieces over a slot
  // whose old bytes equal the new ones, a re-post), so data checked in place and read again to
  // be reduced is not the data that passed.
  alignas(64) std::byte data[kCarryMaxBytes];
  // The common case reads no fingerprint: the post's data CRC is bound to its poster's
  // fingerprint CRC, so data that verifies under *our* fingerprint's CRC is intact and of the
  // same call, as a matching call word stands for the fingerprint (CallCheck::word). A post of
  // at most kWatchedPostDataBytes is watched while we wait and taken once it verifies, without
  // its flag (one line transfer, not two; WatchedPost). Anything else (damage, a different call,
  // a stale slot) goes the long way: the fingerprint is read, compared and, damaged, asked for
  // again.
  WatchedPost watch{theirs, bytes, check.mine.sequence, check.mine.crc, data};
  RINGFENCE_TRY(await_call_post(check, bytes <= kWatchedPostDataBytes ? &watch : nullptr));
  if (watch.verified || copy_verified(theirs, bytes, check.mine.crc, data)) {
    check.theirs = check.mine;
    check.settled = check.intact = true;
    return accept_carried(from, own, data, recv, count, number);
  }
  read_fingerprint(flags_, check);
  for (int attempt = 1;; ++attempt) {
    if (check.intact) {
      if (check.disagree())
        return fail(Status(ErrorCode::InvalidUsage), from, "a call fingerprint equal to ours (the ranks disagree on this call)", 0);
      if (copy_verified(theirs, bytes, check.theirs.crc, data))
        return accept_carried(from, own, data, recv, count, number);
    }
    if (!check.damage_counted) ++from.checksum_errors;  // evidence against the link, as a damaged chunk is
    check.damage_counted = false;
    if (attempt >= c_.max_attempts)
      return fail(Status(ErrorCode::Transient), from, "an intact call fingerprint with its data (every post failed its checksum)", 0);
    if (attempt >= kWholeRepostAttempts && check.intact && bytes > kRepostPieceBytes) {
      RINGFENCE_TRY(repair_carried(check, slot, bytes, data));
      return accept_carried(from, own, data, recv, count, number);
    }
    std::uint32_t asked = 0;
    RINGFENCE_TRY(request_repost(from, slot, 0, asked));
    RINGFENCE_TRY(wait_flag(from, flags_.reposted[from.peer], asked, "the call fingerprint sent again", 0));
    check.settled = check.intact = false;
    read_fingerprint(flags_, check);  // its flag reached this call long ago: reads at once
  }
}

namespace {

// The head of a peer's post in our flag block, as it is now: CallPost::data_crc and data_bytes.
struct PostHead {
  std::uint32_t crc = 0, bytes = 0;
};
PostHead read_head(const std::byte* post) noexcept {
  PostHead h;
  std::memcpy(&h, post + offsetof(CallPost, data_crc), sizeof h);
  return h;
}

}  // namespace

// A look whose head showed this call's number: verifies the data (WatchedPost::look).
bool RingRunner::WatchedPost::verify() noexcept {
  verified = copy_verified(post, bytes, fp_crc, copy);
  if (!verified) skip = 1 << failed++;  // 1, 2, 4, ... polls before the next look
  return verified;
}

// Copies the data of the peer's post at `post` to `data` and checks the copy: true when its
// length and CRC (xor `fp_crc`) are the ones it was posted with. What passed is what the caller
// then reduces, whatever is written to the slot meanwhile.
bool RingRunner::copy_verified(const std::byte* post, std::size_t bytes, std::uint32_t fp_crc, std::byte* data) noexcept {
  const PostHead head = read_head(post);
  if (head.bytes != bytes) return false;
  // From 256 bytes one pass folds what it stores: a copy and then a CRC of the copy took
  // 256-512 B calls 0.61-0.81 us against 0.53-0.56 (a throwaway, three rounds against the build
  // before). Under 256 a masked copy, then a CRC of the copy (docs/carried-allreduce.md, "Short
  // copies").
  return (copy_crc_of_copy(data, post + sizeof(CallPost), bytes) ^ fp_crc) == head.crc;
}

// Writes `own op` the peer's `data` (a checked copy: copy_verified, repair_carried) to `recv`
// and acknowledges the post: the end of a carried call whose peer post passed.
Status RingRunner::accept_carried(Connection& from, const std::byte* own, const std::byte* data, std::byte* recv, std::size_t count,
                                  std::uint32_t number) noexcept {
  // In rank order on both ranks, so both write the same bits (float sums included).
  const bool first = c_.rank < from.peer;
  reducer_.finish(recv, first ? own : data, first ? data : own, count, c_.size);
  return acknowledge_carried(from, number);
}

Status RingRunner::acknowledge_carried(Connection& from, std::uint32_t number) noexcept {
  // Every carried post is acknowledged once its data passed: the peer's close waits for that
  // before it stops answering re-post requests (drain_reposts). The line is ours (the peer
  // reads it only when a slot comes round), so the signal and its look for a sleeper cost no
  // transfer. Its completion is left to the link's next drain (the next post's): when `signal`
  // returns, shm has stored the flag, tcp has sent it (with its pending writes) and ibverbs has
  // posted it; this call's result does not depend on it, and a failure shows there. Without
  // that drain 8-64 B calls took 0.51-0.54 us against 0.52-0.57 in the VM's slow phase
  // (docs/carried-allreduce.md, "Watching the post").
  const Status s = from.link->signal(SignalOp{&from.peer_flags, FlagBlock::flag_offset(FlagBlock::kCallAck, c_.size, c_.rank), number, 0});
  if (!s.is_ok()) return fail(s, from, "acknowledging the call fingerprint", 0);
  return Status::ok();
}

// Asks for the data of the peer's post in `slot` again piece by piece, each piece with its own
// CRC in the slot's head (repost_piece_tag), until every piece passed: the pieces land where the
// whole post's data lies, and a write touches no byte outside its piece, so once the last one
// passed the slot holds the whole data intact. Each piece is copied to `data` and checked
// there, so `data` holds what passed. The post's fingerprint was intact (and the same call)
// when this began; each piece's head brings it again and it is checked again.
Status RingRunner::repair_carried(CallCheck& check, std::size_t slot, std::size_t bytes, std::byte* data) noexcept {
  Connection& from = *check.from;
  const std::byte* const post = flags_.call_slot(from.peer, slot);
  for (std::size_t k = 0, at = 0; at < bytes; ++k, at += kRepostPieceBytes) {
    const std::size_t n = std::min(kRepostPieceBytes, bytes - at);
    for (int attempt = 1;; ++attempt) {
      std::uint32_t asked = 0;
      RINGFENCE_TRY(request_repost(from, slot, k + 1, asked));
      RINGFENCE_TRY(wait_flag(from, flags_.reposted[from.peer], asked, "a piece of the call fingerprint's data sent again", 0));
      check.settled = check.intact = false;
      read_fingerprint(flags_, check);
      const PostHead head = read_head(post);
      std::memcpy(data + at, post + sizeof(CallPost) + at, n);
      if (check.intact && !check.disagree() && head.bytes == repost_piece_tag(k, n) &&
          (crc32c(data + at, n) ^ check.theirs.crc) == head.crc)
        break;
      ++from.checksum_errors;
      if (attempt >= c_.max_attempts)
        return fail(Status(ErrorCode::Transient), from, "a piece of the call fingerprint's data (every re-post failed its checksum)", 0);
    }
  }
  return Status::ok();
}

// Asks `ch`'s peer for its post in `slot` again (`piece` 0), or for the k-th piece of its data
// (`piece` k + 1): the request's value names both under a count that only grows, so a request
// for the same thing twice is still a new value.
Status RingRunner::request_repost(Connection& ch, std::size_t slot, std::size_t piece, std::uint32_t& value) noexcept {
  value = ++ch.reposts_asked << 10 | static_cast<std::uint32_t>(piece) << 5 | static_cast<std::uint32_t>(slot);
  static_assert(kCallSlots == 32, "the request's low 5 bits name the slot");
  const Status s = ch.link->signal(SignalOp{&ch.peer_flags, FlagBlock::flag_offset(FlagBlock::kRepost, c_.size, c_.rank), value, 0});
  if (!s.is_ok()) return fail(s, ch, "asking for a call fingerprint again", 0);
  return drain(ch, "asking for a call fingerprint again");
}

// Writes the posts peers asked for again (request_repost), then says so. The kept post of a
// slot is the one the peer waits for: the slot comes round only after the peer acknowledged it.
Status RingRunner::serve_reposts() noexcept {
  Status st = Status::ok();
  for_each_call_connection([&](Connection& ch) {
    if (st.is_ok()) st = serve_repost(ch);
  });
  return st;
}

Status RingRunner::serve_repost(Connection& ch) noexcept {
  const std::uint32_t asked = flags_.repost[ch.peer].value.load(std::memory_order_acquire);
  if (asked == ch.repost_served) return Status::ok();
  const CallPost& post = ch.call_post(asked % kCallSlots);
  const std::size_t at = FlagBlock::call_offset(c_.size, c_.rank, asked % kCallSlots);
  const std::size_t piece = asked >> 5 & 31;
  Status st = Status::ok();
  if (piece == 0) {
    st = ch.link->write(WriteOp{&post, nullptr, &ch.peer_flags, at, post.posted_bytes(), 0});
  } else {  // the data's piece, then a head with its CRC (repair_carried)
    const std::size_t from = (piece - 1) * kRepostPieceBytes;
    const std::size_t n = post.fp.carried && from < post.data_bytes ? std::min(kRepostPieceBytes, post.data_bytes - from) : 0;
    ch.repost_head.fp = post.fp;
    ch.repost_head.data_bytes = repost_piece_tag(piece - 1, n);
    ch.repost_head.data_crc = crc32c(post.data() + from, n) ^ post.fp.crc;
    if (n > 0) st = ch.link->write(WriteOp{post.data() + from, nullptr, &ch.peer_flags, at + sizeof(CallPost) + from, n, 0});
    if (st.is_ok()) st = ch.link->write(WriteOp{&ch.repost_head, nullptr, &ch.peer_flags, at, sizeof(CallPost), 0});
  }
  if (st.is_ok()) st = ch.link->signal(SignalOp{&ch.peer_flags, FlagBlock::flag_offset(FlagBlock::kReposted, c_.size, c_.rank), asked, 0});
  if (!st.is_ok()) return fail(st, ch, "sending a call fingerprint again", 0);
  ch.repost_served = asked;
  ch.reposts.fetch_add(1, std::memory_order_relaxed);  // counted with re-sent chunks (LinkInfo::retries)
  return drain(ch, "sending a call fingerprint again");
}

// At close: answers re-post requests until each peer acknowledged our last carried post (a peer
// still in that call may find it damaged), or until `deadline`.
void RingRunner::drain_reposts(std::chrono::steady_clock::time_point deadline) noexcept {
  for (int r = 0; r < c_.size; ++r) {
    Connection* ch = c_.retained_peers ? c_.retained_peers[r] : nullptr;
    if (!ch || !ch->link || ch->last_carried == 0) continue;
    const auto last = static_cast<std::uint32_t>(ch->last_carried);
    while (!reached(flags_.call_ack[ch->peer].value.load(std::memory_order_acquire), last) && std::chrono::steady_clock::now() < deadline) {
      if (!serve_repost(*ch).is_ok()) break;
      ch->link->flush_wakes();
      if (ch->link->wait(flags_.call_ack[ch->peer], last, std::chrono::milliseconds(1)).is_error()) break;
    }
  }
}

}  // namespace ringfence::detail
