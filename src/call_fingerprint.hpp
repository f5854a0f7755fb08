#pragma once
// Call fingerprints (design §6, docs/failure-semantics.md): what every rank writes about its call
// before the call uses data, the short word a sender puts beside its data flag, and the check the
// executor settles. Their slots in a rank's flags are laid out in flag_block.hpp (FlagBlock); a
// connection (engine.hpp) keeps its posts in KeptPosts, below.
#include <cstddef>
#include <cstdint>
#include <memory>

namespace ringfence::detail {

struct Connection;

/// A sender's current call, as {sequence modulo 2^32, fingerprint CRC}, in the last 8 bytes of
/// the line of its receiver's data flag (after the trailers): written before its first chunk of
/// each call on the link (with a fingerprint check left to the executor). A receiver that checks
/// this sender and finds its own call's number and CRC there has the sender's fingerprint
/// without reading the slot and the flag that carry the whole one: two cache lines a call,
/// a third of a small allreduce's time (RingRunner::settle_call). Anything else there (a later
/// call's word, one a fault damaged, none yet, a relay that does not write one) sends it to
/// the whole fingerprint, as before.
struct CallWord {
  std::uint32_t sequence = 0;
  std::uint32_t crc = 0;
  friend bool operator==(const CallWord&, const CallWord&) = default;
};

/// Fingerprint slots per peer: a rank may post this many calls ahead of a peer's reading.
/// Enough that acknowledgements (kCallAckEvery) are rare: each is a line the sender then
/// reads again from the receiver's cache.
inline constexpr std::size_t kCallSlots = 32;
/// The ring executor acknowledges the fingerprints it compares of calls whose number is a
/// multiple of this (acknowledgements count up, so one frees every slot before it too);
/// `settle_fingerprint` acknowledges every one, which covers the fingerprints compared before a
/// fence agreement (it may re-pair the ranks), except a carried post's: a carried allreduce
/// acknowledges every post itself once its data passed (RingRunner::run_carried). At most
/// `kCallSlots`, so a slot's previous call is always followed by an acknowledged one before the
/// slot comes round again.
inline constexpr std::size_t kCallAckEvery = 16;
static_assert(kCallAckEvery >= 1 && kCallAckEvery <= kCallSlots);

/// Collectives as named in fingerprints and mismatch errors.
enum class CallKind : std::uint8_t { Allreduce = 1, ReduceScatter, Allgather, Broadcast, Reduce, Alltoall, Barrier };

/// What every rank must agree on before a collective uses data it received (design §6; see
/// docs/failure-semantics.md for when it is compared): its number and
/// arguments. 32 bytes, written to the ring neighbour with a CRC32C so a damaged or lost one is
/// told apart from a real disagreement.
struct CallFingerprint {
  std::uint64_t sequence = 0;  ///< collective number on the communicator (1, 2, ...)
  std::uint64_t count = 0;     ///< the call's count argument
  std::uint8_t collective = 0; ///< `CallKind`
  std::uint8_t type = 0;       ///< DataType (0 for calls that move bytes only)
  std::uint8_t op = 0;         ///< ReduceOp (0 for calls that do not reduce)
  std::uint8_t carried = 0;    ///< 1: the post carries the call's data (CallPost; a carried allreduce)
  std::int32_t root = -1;      ///< root rank, -1 for calls without one
  std::uint32_t crc = 0;       ///< CRC32C of the 24 bytes before it
  std::uint32_t reserved2 = 0;
};
static_assert(sizeof(CallFingerprint) == 32);

/// The most bytes a call's post carries: a carried allreduce of two ranks
/// (docs/carried-allreduce.md) moves its whole input in the post, up to the 4 KiB where small
/// calls end (issue #29's 8 B-4 KiB). Only two-rank communicators have slots that large
/// (call_slot_bytes).
inline constexpr std::size_t kCarryMaxBytes = 4096;
/// A carried post of at most this many bytes of data is watched by its receiver while it waits
/// (RingRunner::WatchedPost). The post is written head first, so a receiver that finds
/// the head may find the data still coming: its CRC fails and it looks again. Up to 1 KiB the
/// reading overlaps the writing and the call gains (docs/carried-allreduce.md, "Watching the
/// post"); at 4 KiB the failed CRCs cost more than the flag's line does.
inline constexpr std::size_t kWatchedPostDataBytes = 1024;

/// The head of one fingerprint slot as posted: the fingerprint and, in a carried allreduce
/// (`fp.carried`), the length and CRC of the sender's input, which follows this head in the slot
/// (`data()`). `data_crc` is crc32c(data) xor fp.crc: the data is bound to the call it was sent
/// in, and the pass that copies or reduces the data computes its CRC (seed 0) on the way. A plain
/// post writes only `fp`; the rest of the slot then holds whatever an earlier carried post left
/// there, which `fp.carried` says to ignore.
struct CallPost {
  CallFingerprint fp;
  std::uint32_t data_crc = 0;    ///< crc32c(data(), data_bytes) ^ fp.crc
  std::uint32_t data_bytes = 0;  ///< bytes of data() in use
  /// The carried data, right after the head (within the slot: call_slot_bytes).
  std::byte* data() noexcept { return reinterpret_cast<std::byte*>(this) + sizeof(CallPost); }
  const std::byte* data() const noexcept { return reinterpret_cast<const std::byte*>(this) + sizeof(CallPost); }
  /// Bytes a post writes: the fingerprint, and the carried data with its head.
  std::size_t posted_bytes() const noexcept { return fp.carried ? sizeof(CallPost) + data_bytes : sizeof(CallFingerprint); }
};
static_assert(sizeof(CallPost) == 40 && alignof(CallPost) <= 16);
/// A post its receiver found damaged this many times is asked for again in pieces of this many
/// bytes, each with its own CRC (RingRunner::repair_carried): a link that spoils most whole
/// posts (flips at 1e-3 per byte spoil 98 % of 4 KiB ones, by e^-4.1) still gets pieces through.
inline constexpr int kWholeRepostAttempts = 4;
inline constexpr std::size_t kRepostPieceBytes = 256;
static_assert(kCarryMaxBytes / kRepostPieceBytes < 32, "a re-post request names its piece in 5 bits");
/// `CallPost::data_bytes` of a re-posted piece: the piece's number and length under a tag no
/// whole post's length has, so neither is taken for the other.
constexpr std::uint32_t repost_piece_tag(std::size_t piece, std::size_t bytes) noexcept {
  return 0x80000000u | static_cast<std::uint32_t>(piece) << 16 | static_cast<std::uint32_t>(bytes);
}
/// Bytes between fingerprint slots, in a FlagBlock (FlagBlock::calls) and in a connection's
/// kept posts (Connection::call_post): a carried post's room on two ranks, 128 bytes on more,
/// where only plain fingerprints are posted (as before carried posts grew). Multiples of 128, so
/// no two slots share a pair of lines (which adjacent-line prefetchers fetch together).
constexpr std::size_t call_slot_bytes(int size) noexcept {
  return size == 2 ? (sizeof(CallPost) + kCarryMaxBytes + 127) / 128 * 128 : 128;
}

/// Our fingerprint posts to one peer (with carried data), kept until their slot comes round:
/// they outlive the writes and are written again when the peer asks (re-posts). kCallSlots
/// slots of call_slot_bytes(size), laid out as the peer's slots for them, zeroed. Empty until
/// the lane that owns the connection is connected (Lanes::connect), which knows the size.
class KeptPosts {
 public:
  KeptPosts() noexcept = default;
  explicit KeptPosts(int size) : stride_(call_slot_bytes(size)), mem_(std::make_unique<std::byte[]>(kCallSlots * stride_)) {}
  CallPost& operator[](std::size_t slot) noexcept { return *reinterpret_cast<CallPost*>(mem_.get() + slot * stride_); }
  std::size_t stride() const noexcept { return stride_; }

 private:
  std::size_t stride_ = 0;
  std::unique_ptr<std::byte[]> mem_;
};

/// A call fingerprint posted to the ranks that check it and not yet compared with the one
/// `from` posted (design §6). The ring executor compares it before it uses the first chunk it
/// receives, when a wait finds it already there, and at the end of the call, so the first data
/// leaves without waiting for the neighbour's fingerprint (docs/failure-semantics.md).
struct CallCheck {
  Connection* from = nullptr;  ///< connection whose fingerprint of this call we compare (null: none pending)
  CallFingerprint mine;     ///< ours, numbered and with its CRC
  CallFingerprint theirs;   ///< `from`'s, once read
  bool settled = false;     ///< `theirs` was read
  bool posted = true;       ///< `mine` was posted (a carried call posts it itself: CallChecker::prepare)
  bool damage_counted = false;  ///< `theirs` arrived damaged and that was counted against the link already (CallChecker::judge)
  bool intact = false;      ///< `theirs` arrived undamaged and numbered as this call
  /// Every rank that sends us a chunk is compared before that chunk is used, not only `from`:
  /// calls that receive from every rank (one-shot, direct, trees), whose senders wrote their
  /// fingerprint to every peer first (docs/failure-semantics.md, "Calls that receive from every rank").
  bool pairwise = false;
  /// `mine` as the word a sender writes beside its data flag (CallWord).
  CallWord word() const noexcept { return CallWord{static_cast<std::uint32_t>(mine.sequence), mine.crc}; }
  /// Read, intact, and a different call: the ranks disagree.
  bool disagree() const noexcept {
    return settled && intact &&
           (theirs.collective != mine.collective || theirs.type != mine.type || theirs.op != mine.op || theirs.count != mine.count ||
            theirs.root != mine.root || theirs.carried != mine.carried);
  }
};

}  // namespace ringfence::detail
