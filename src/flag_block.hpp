#pragma once
// FlagBlock: the layout of one rank's signal words, mailboxes and call fingerprint slots, which
// its peers write into (engine.hpp's RingRunner and the communicator's lanes read it).
#include <cstddef>
#include <cstdint>
#include <ringfence/status.hpp>
#include <ringfence/transport.hpp>

#include "call_fingerprint.hpp"

namespace ringfence::detail {

/// Bytes of one mailbox: header {u32 key length, u32 crc32c of the key, u32 call}, then the key.
inline constexpr std::size_t kMailboxBytes = 512;

/// Local signal words of one rank, indexed by peer rank p:
/// - `data[p]`: p wrote chunk m into our inbox (value m + 1); the rest of its line holds the
///   trailers of p's chunks when there are few slots (EngineConfig::trailers_with_flag);
/// - `credit[p]`: p consumed (and verified) chunk m we wrote into its inbox (value m + 1);
/// - `mail[p]`: p wrote the key of its output buffer for call c into `mailbox(p)` (value c);
/// - `nack[p]`: p found a chunk from us corrupted (value = p's nack count); which one is in
///   `nack_msg[p]` (its message number, low 32 bits), signalled just before on the same link;
/// - `retry[p]`: p re-sent the chunk we asked for, or published its receive-buffer key again
///   (value = p's count of both; kRepublishKeyPiece);
/// - `p2p_mail[p]`: p wrote the key of a receive buffer into `p2p_mailbox(p)` (value = how many
///   keys p published to us so far): the destination of our next direct point-to-point send.
/// - `call[p]`: p wrote the fingerprint of its collective number c into `call_area(p, c)`
///   (value c, low 32 bits);
/// - `call_ack[p]`: p read our fingerprint of collective c (value c), so its slot is free again
///   (for a carried post: and its data passed);
/// - `repost[p]`: p found our post in fingerprint slot s damaged or lost and asks for it again
///   (value = p's count of such requests << 10 | piece << 5 | s, piece 0 for the whole post,
///   k + 1 for its data's k-th kRepostPieceBytes; carried allreduce, RingRunner::run_carried);
/// - `reposted[p]`: p wrote the post we asked for again (value = that request's value);
/// - `abort` (one word): some peer failed and aborted; value = error code << 24 |
///   (origin + 1) << 12 | (rank it blames + 1), ranks below 4095 (0 = nobody). The origin is
///   the rank that failed first: a rank that fails on the word passes it on unchanged
///   (`CommFailure::forward_abort`). An origin equal to this rank means a local abort
///   (`abort()`, the heartbeat, a sibling lane). Peers write it with a plain store: the last
///   writer wins.
/// All values are monotone for the communicator's lifetime: nothing is ever reset.
struct FlagBlock {
  SignalFlag* data = nullptr;
  SignalFlag* credit = nullptr;
  SignalFlag* mail = nullptr;
  SignalFlag* nack = nullptr;
  SignalFlag* retry = nullptr;
  SignalFlag* p2p_mail = nullptr;
  SignalFlag* nack_msg = nullptr;
  SignalFlag* call = nullptr;
  SignalFlag* call_ack = nullptr;
  SignalFlag* nack_piece = nullptr;    ///< which part of the chunk a NACK asks for (encode_piece)
  SignalFlag* repost = nullptr;
  SignalFlag* reposted = nullptr;
  SignalFlag* abort = nullptr;         ///< one word
  std::byte* mailboxes = nullptr;      ///< [size] x kMailboxBytes (collectives' output keys)
  std::byte* p2p_mailboxes = nullptr;  ///< [size] x kMailboxBytes (point-to-point receive keys)
  std::byte* calls = nullptr;          ///< [size] x kCallSlots x call_slot_bytes(size) (CallPost and its data)
  std::size_t call_slot_stride = 0;    ///< call_slot_bytes(size)
  enum Word { kData = 0, kCredit, kMail, kNack, kRetry, kP2PMail, kNackMsg, kCall, kCallAck, kNackPiece, kRepost, kReposted, kWords };
  /// Bytes per peer: the words, two mailboxes and the fingerprint slots (a multiple of 64).
  static std::size_t per_peer(int size) noexcept {
    return kWords * sizeof(SignalFlag) + 2 * kMailboxBytes + kCallSlots * call_slot_bytes(size);
  }

  static std::size_t bytes(int size) noexcept { return static_cast<std::size_t>(size) * per_peer(size) + sizeof(SignalFlag); }
  static std::size_t abort_offset(int size) noexcept { return static_cast<std::size_t>(size) * per_peer(size); }
  /// Offset of fingerprint slot `slot` written by `rank`.
  static std::size_t call_offset(int size, int rank, std::size_t slot) noexcept {
    return mailbox_offset(size, 2 * size) + (static_cast<std::size_t>(rank) * kCallSlots + slot) * call_slot_bytes(size);
  }
  /// Fingerprint slot `slot` that `peer` writes into this block (read side of call_offset).
  const std::byte* call_slot(int peer, std::size_t slot) const noexcept {
    return calls + (static_cast<std::size_t>(peer) * kCallSlots + slot) * call_slot_stride;
  }
  /// Encodes an abort word.
  static std::uint32_t abort_value(ErrorCode code, int origin, int blamed) noexcept {
    auto field = [](int r) { return r >= 0 && r < 4095 ? static_cast<std::uint32_t>(r + 1) : 0u; };
    return static_cast<std::uint32_t>(code) << 24 | field(origin) << 12 | field(blamed);
  }
  static std::size_t flag_offset(Word w, int size, int rank) noexcept {
    return (static_cast<std::size_t>(w) * static_cast<std::size_t>(size) + static_cast<std::size_t>(rank)) *
           sizeof(SignalFlag);
  }
  static std::size_t data_offset(int size, int rank) noexcept { return flag_offset(kData, size, rank); }
  static std::size_t credit_offset(int size, int rank) noexcept { return flag_offset(kCredit, size, rank); }
  static std::size_t mail_offset(int size, int rank) noexcept { return flag_offset(kMail, size, rank); }
  static std::size_t mailbox_offset(int size, int rank) noexcept {
    return static_cast<std::size_t>(size) * kWords * sizeof(SignalFlag) + static_cast<std::size_t>(rank) * kMailboxBytes;
  }
  static std::size_t p2p_mailbox_offset(int size, int rank) noexcept {
    return mailbox_offset(size, size) + static_cast<std::size_t>(rank) * kMailboxBytes;
  }
  void bind(void* base, int size) noexcept {
    auto* f = static_cast<SignalFlag*>(base);
    data = f;
    credit = f + size;
    mail = f + 2 * size;
    nack = f + 3 * size;
    retry = f + 4 * size;
    p2p_mail = f + 5 * size;
    nack_msg = f + 6 * size;
    mailboxes = static_cast<std::byte*>(base) + mailbox_offset(size, 0);
    p2p_mailboxes = static_cast<std::byte*>(base) + p2p_mailbox_offset(size, 0);
    call = f + kCall * size;
    call_ack = f + kCallAck * size;
    nack_piece = f + kNackPiece * size;
    repost = f + kRepost * size;
    reposted = f + kReposted * size;
    calls = static_cast<std::byte*>(base) + call_offset(size, 0, 0);
    call_slot_stride = call_slot_bytes(size);
    abort = reinterpret_cast<SignalFlag*>(static_cast<std::byte*>(base) + abort_offset(size));
  }
};

}  // namespace ringfence::detail
