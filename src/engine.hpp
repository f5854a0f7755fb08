#pragma once
// Private engine types: per-peer connections (a link plus the peer's imported regions and the
// message counters) and the step executor. Nothing here allocates or throws once built.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <ringfence/reduce_ops.hpp>
#include <ringfence/schedule.hpp>
#include <string>
#include <ringfence/transport.hpp>

#include "call_fingerprint.hpp"
#include "flag_block.hpp"
#include "write_speeds.hpp"

namespace ringfence::detail {

/// Bytes of the mailbox header.
inline constexpr std::size_t kMailHeader = 12;
/// EngineConfig::retain_max_bytes where ranks share CPUs or a link is a network link.
inline constexpr std::size_t kRetainMaxBytes = 64 * 1024;
/// EngineConfig::retain_max_bytes with a CPU per rank on shared memory (docs/protection-cost.md,
/// "Waiting for the last chunk").
inline constexpr std::size_t kRunningRetainMaxBytes = 16 * 1024;
/// A 2-rank ring allreduce or allgather of at least this many bytes (per channel slice; for
/// allgather each rank's block) copies the chunks it
/// receives into its output with streaming stores (copy_bytes_stream): those are final values
/// nothing in the call reads again, and a message this large leaves the private caches anyway.
/// Measured 2026-12-03 against the build before, defaults (checksums on), four alternating runs,
/// medians of busbw: allreduce 16, 64, 256 MiB 5.07 / 4.09 / 3.96 against 4.23 / 3.52 / 3.44
/// GB/s (checksums off: 4.68 / 4.44 / 4.36 against 4.52 / 3.89 / 3.85); allgather (three runs)
/// 8.70 / 6.77 / 6.59 against 7.60 / 4.90 / 5.26. At 1-4 MiB no steady gain, so not there (the
/// output may still be in the cache when the caller reads it). A chunk whose destination is not
/// aligned (16 bytes; 64 with checksums) is copied plainly, e.g. rank 1's half of an odd count.
inline constexpr std::size_t kStreamResultMinBytes = std::size_t{16} << 20;
/// Where the communicator streams its writes (EngineConfig::stream_writes), chunks of at least
/// this many bytes go into a peer's slot with streaming stores: under it the plain copy was as
/// fast or faster (bench/cross_core_copy -w, docs/tuning.md "Streaming slot writes").
inline constexpr std::size_t kStreamWriteMinBytes = 4096;
/// Checksum mode: a call that sends at most this many bytes copies each chunk to the retained
/// area right after its signal (RingRunner::retains_at_send) instead of asking at the end which
/// were accepted: the credits' lines are written by the receivers, and reading one right after
/// is a cache miss that costs a small call more than the copy. 16 KiB: a 4-rank one-shot of
/// 4 KiB sends 12 (4 ranks, 8 KiB: 1.28-1.37 -> 0.91-1.16 time on/off with 4 KiB here).
inline constexpr std::size_t kRetainUncheckedBytes = 16 * 1024;
/// Checksum mode, point-to-point: before a transfer copies the staged chunks its receivers have
/// not accepted yet aside (more than kAwaitAcceptanceMinBytes of them), it waits for their
/// acceptance for about as long as that copy takes at this many bytes a microsecond (64 KiB/us,
/// about a copy within the cache here). A receiver in the same exchange (sendrecv, alltoall)
/// verifies our last chunk about when we finish ours, and its credit saves the copy; one that
/// takes them only in a later call costs the wait on top of the copy, at most twice the copy.
/// 2 ranks, 256 KiB sendrecv: 18.9-20.2 -> 14.8-16.5 us, checksums off 15.0-16.0
/// (docs/protection-cost.md, "Point-to-point: a short wait before the copy aside").
inline constexpr std::size_t kCopyAsideBytesPerUs = 64 * 1024;
/// The same wait only for more than this many bytes: a copy of 64 KiB takes under a microsecond,
/// less than the wait cost (2 ranks, 64 KiB sendrecv, fast mode: 5.38-6.05 us a call copying,
/// 5.82-6.96 waiting; 128 KiB 9.95-10.40 against 9.77-10.30). It is at least
/// EngineConfig::retain_max_bytes (16 or 64 KiB), so what a collective would copy, this copies.
inline constexpr std::size_t kAwaitAcceptanceMinBytes = 64 * 1024;
/// Ring calls of at most this many bytes (a rank's data), and point-to-point groups moving at
/// most this many bytes in all, leave waking a sleeping receiver of their chunk and credit
/// signals for later (RingRunner::defer_wake): at 8 B-4 KiB on 2 ranks 0.03-0.1 us a call
/// (docs/protection-cost-small-calls.md). Larger ones wake at once: a sleeper
/// would lie asleep while its peer copies the next chunk (deferred at every size, a 2-rank
/// 256 MiB allreduce fell to 0.67x busbw; up to 64 KiB, 4 ranks on 2 cores lost 15-35 % at
/// 64-256 KiB in two of three runs).
inline constexpr std::size_t kDeferWakeMaxBytes = 8 * 1024;
/// EngineConfig::spin_polls with a CPU per rank.
inline constexpr int kSpinPolls = 64;
/// EngineConfig::spin_polls where every rank of the host has a CPU of its own
/// (CommOptions::spin): about 40 µs of polls at ~20 ns each (AMD EPYC VM), as long as a peer
/// takes to copy or reduce a 64-128 KiB chain piece, so a chain's ranks (reduce, broadcast)
/// wait without the link's yields. 2 ranks bound, against kSpinPolls (docs/tuning.md
/// "Spinning on dedicated cores"): reduce 256 KiB 15.7 -> 13.4 µs, broadcast 32 KiB 3.0 -> 2.5.
inline constexpr int kDedicatedSpinPolls = 2048;
/// EngineConfig::spin_polls with more ranks than CPUs on the host. 4 ranks on 2 cores, median
/// allreduce time against 64 (docs/tuning.md "Spinning and yielding"): 8 B 6.75 -> 5.32 µs,
/// 4 KiB 9.93 -> 8.35.
inline constexpr int kOversubscribedSpinPolls = 4;
/// Bytes reserved after every staging slot for the chunk trailer when trailers do not lie with
/// the data flag (EngineConfig::trailers_with_flag): one cache line, with the trailer in its last
/// bytes (EngineConfig::trailer_offset).
inline constexpr std::size_t kTrailerBytes = 64;
/// Checksum mode with trailers after the slots: a chunk of at most this many bytes is packed
/// against its trailer, in the trailer's own cache line (it ends where the trailer starts;
/// EngineConfig::data_offset), so data and trailer travel in one line and the receiver pays
/// one miss, not two. Larger chunks
/// start at the slot, aligned for the kernels: packing them too would save one line of many
/// and make every 64-byte load and store of the chunk straddle two lines.
inline constexpr std::size_t kPackedMaxBytes = kTrailerBytes - 16;
/// Messages remembered by a sender for re-sends (>= the largest slot count).
inline constexpr std::size_t kSentLog = 64;

/// Written after a chunk when checksums are on; verified by the receiver. After a re-send of
/// part of the chunk (a piece), it describes that piece.
struct ChunkTrailer {
  std::uint32_t crc = 0;      ///< CRC32C of the chunk's (or the re-sent piece's) bytes
  std::uint32_t bytes = 0;    ///< chunk (or piece) length
  std::uint32_t message = 0;  ///< message number on the link, low 32 bits (as the data flag)
};
static_assert(sizeof(ChunkTrailer) == 12);
/// Where the trailers of a link lie when it has at most kFlagLineTrailers slots: in the line of
/// the receiver's data flag for that sender, after the flag's value and waiter count (trailer
/// of slot s at kFlagLineTrailerStart + s * 12). The receiver reads that line anyway to learn
/// that the chunk arrived, so the check costs no line of its own, and a chunk of any size
/// travels in as many lines as without checksums (EngineConfig::trailers_with_flag).
inline constexpr std::size_t kFlagLineTrailerStart = sizeof(SignalFlag::value) + sizeof(SignalFlag::waiters);
inline constexpr int kFlagLineTrailers = static_cast<int>((sizeof(SignalFlag) - kFlagLineTrailerStart) / sizeof(ChunkTrailer));
static_assert(sizeof(SignalFlag) == 64 && kFlagLineTrailers == 4);
/// Where a sender's CallWord (call_fingerprint.hpp) lies in that line: its last 8 bytes.
inline constexpr std::size_t kFlagLineCallWord = sizeof(SignalFlag) - sizeof(CallWord);
static_assert(kFlagLineTrailerStart + kFlagLineTrailers * sizeof(ChunkTrailer) <= kFlagLineCallWord);

/// Re-sends of part of a chunk (ring_runner_repair.cpp): a link so damaged that whole chunks
/// never arrive intact is asked for pieces small enough to get through. A request names bytes
/// [first, end) of the chunk in units of kPieceUnit, in one word (0 = the whole chunk).
inline constexpr std::size_t kPieceUnit = 256;
/// Whole deliveries of a chunk that fail their check before it is asked for in pieces.
inline constexpr int kWholeDeliveries = 4;
/// The first piece size tried, and the size pieces grow back to while they get through.
inline constexpr std::size_t kLargestPiece = 16 * 1024;
/// A re-send request with this piece word asks for no chunk: the receiver of a direct
/// point-to-point transfer re-publishes its receive-buffer key, which reached the sender damaged
/// (or not at all: a dropped write). encode_piece never yields it (first < end).
inline constexpr std::uint32_t kRepublishKeyPiece = 0xffffffffu;
/// Largest slot that piece requests can address (16 bits of units).
inline constexpr std::size_t kMaxPieceSlotBytes = kPieceUnit * 0xffff;
constexpr std::uint32_t encode_piece(std::size_t first, std::size_t end) noexcept {
  return static_cast<std::uint32_t>((first / kPieceUnit) << 16 | ((end + kPieceUnit - 1) / kPieceUnit));
}
struct PieceRange {
  std::size_t first = 0, end = 0;
};
/// The range a request names within a chunk of `bytes` (the whole chunk for 0).
constexpr PieceRange decode_piece(std::uint32_t word, std::size_t bytes) noexcept {
  if (word == 0) return {0, bytes};
  const std::size_t first = (word >> 16) * kPieceUnit, end = (word & 0xffffu) * kPieceUnit;
  return {first < bytes ? first : bytes, end < bytes ? end : bytes};
}


/// Per-call state of the direct-write path: final values (allgather phase) are written
/// straight into the right neighbour's output buffer instead of its staging slots, saving the
/// receiver a copy. Our own output's key goes to the left neighbour (who writes into it).
struct DirectWrite {
  bool enabled = false;
  std::uint32_t call = 0;                 ///< call number, the value of the mail signal
  std::span<const std::byte> own_key;     ///< key of our output buffer (registered with left's transport)
  /// Resolves the right neighbour's key to an imported region (cached; may allocate on first
  /// sight of a buffer, never throws; nullptr on failure).
  const RemoteRegion* (*resolve)(void* ctx, std::span<const std::byte> key) noexcept = nullptr;
  void* ctx = nullptr;
};

/// Everything one rank needs to talk to one peer.
struct Connection {
  int peer = -1;
  std::string transport_name;
  Transport* transport = nullptr;
  std::byte* inbox = nullptr;   ///< our staging slots that this peer writes into
  MemoryRegion inbox_region;    ///< registration of `inbox` with `transport`
  MemoryRegion flags_region;    ///< registration of our FlagBlock with `transport`
  RemoteRegion peer_inbox;      ///< the peer's staging slots for us
  RemoteRegion peer_flags;      ///< the peer's FlagBlock
  /// Declared after the regions, so it is destroyed before them: a frame the peer sent just
  /// before it closed must not find its region gone (tcp: "a signal into an unknown region").
  std::unique_ptr<Link> link;
  /// Lane 0: `slots` x `slot_bytes` where a point-to-point call that returns before the peer
  /// accepted its last chunks (checksum mode) leaves copies of them, so a re-send never reads a
  /// user buffer the caller may already have reused (RingRunner::retain_unaccepted).
  std::byte* retained = nullptr;
  std::uint64_t sent = 0;       ///< messages written to the peer
  std::uint64_t received = 0;   ///< messages consumed from the peer
  /// The peer's credit (messages it accepted) as we last read it: a lower bound, since credits
  /// only grow. A send whose slot it already frees reads nothing: the flag's line is written by
  /// the peer, and each read of it after a write is a miss (RingRunner::send_chunk).
  std::uint32_t credit_seen = 0;
  // Integrity (checksum mode). As a sender: what we wrote (for re-sends), NACKs seen, re-sends
  // done. As a receiver: NACKs sent, re-sends seen.
  struct SentChunk {
    const std::byte* src = nullptr;
    std::size_t bytes = 0;
    const RemoteRegion* dst = nullptr;
    std::size_t dst_offset = 0;
    std::uint64_t message = ~0ull;
    bool has_crc = false;  ///< `crc` holds the chunk's CRC (computed when it was first sent; a relayed chunk keeps its original sender's, end to end)
    std::uint32_t crc = 0;
  };
  SentChunk sent_log[kSentLog];
  ChunkTrailer trailers[kSentLog];  ///< trailer storage must outlive asynchronous writes
  std::uint32_t mail_header[3] = {};  ///< {key length, crc32c(key, seeded with the call), call}
  KeptPosts posts;  ///< our fingerprint posts to this peer (with carried data), for re-posts
  CallPost& call_post(std::size_t slot) noexcept { return posts[slot]; }
  CallFingerprint spread_fp[kCallSlots];  ///< the same, written to a peer that does not check us (CallCheck::pairwise)
  std::uint64_t pair_checked = 0;  ///< the last call whose fingerprint from this peer we compared (CallCheck::pairwise)
  CallWord call_word;  ///< our call's word last written to this peer's data flag line (outlives the write)
  /// The peer's acknowledgement of our fingerprints as we last read it (a lower bound: they only
  /// grow): a post whose slot it already frees reads nothing (RingRunner::post_fingerprint).
  std::uint32_t call_ack_seen = 0;
  std::uint32_t reposts_asked = 0;   ///< fingerprint posts we asked this peer for again (FlagBlock::repost)
  std::uint32_t repost_served = 0;   ///< the peer's last repost request we answered
  CallPost repost_head;              ///< the head of a piece we posted again (outlives the write)
  std::uint64_t last_carried = 0;    ///< the number of our last carried post to this peer (0: none)
  // Direct point-to-point: keys of our receive buffers published to this peer, and keys of the
  // peer's receive buffers we consumed for our sends.
  std::uint32_t p2p_keys_published = 0, p2p_keys_used = 0;
  std::uint32_t p2p_mail_header[3] = {};
  /// A copy of the key last published to this peer, published again when the sender asks
  /// (kRepublishKeyPiece). A copy: the registration cache may evict the entry during the call.
  std::byte p2p_key[kMailboxBytes] = {};
  std::size_t p2p_key_bytes = 0;
  std::uint32_t nacks_seen = 0, nacks_sent = 0;
  /// As a receiver: the piece size that last got through this link when whole chunks did not
  /// (0: whole chunks get through). A damaged link's next chunk starts from it.
  std::size_t repair_piece = 0;
  // Read by links() from any thread (relaxed); written by the communicator's thread alone.
  std::atomic<std::uint32_t> resends{0};
  std::atomic<std::uint32_t> reposts{0};  ///< fingerprint posts we wrote again (serve_reposts); only counted, never signalled
  std::atomic<std::uint64_t> checksum_errors{0};  ///< corrupted chunks received from the peer
  // Health evidence: writes of at least kTimedWriteBytes are timed (achieved bandwidth against
  // `expected_gbps`, the transport's `can_reach` figure), here or by the link itself
  // (`Link::times_writes`, LinkStats::timed_*); `judged` holds the counters' values at the
  // previous fence agreement, which judges the differences (the link's own from zero again
  // when the connection gets a new link).
  double expected_gbps = 0.0;
  // Atomic (one writer, relaxed) because links() reads them from any thread for the metrics.
  std::atomic<std::uint64_t> timed_bytes{0}, timed_ns{0};
  /// The same timed writes, one by one, for the median speed the agreement compares across the
  /// job's links (cleared by each agreement).
  WriteSpeeds speeds;
  struct Judged {
    std::uint64_t checksum_errors = 0, sent = 0, received = 0, timed_bytes = 0, timed_ns = 0, timeouts = 0;
    std::uint64_t link_timed_bytes = 0, link_timed_ns = 0;
  } judged;
};

/// Writes at least this long are timed for the bandwidth evidence (two clock reads per write
/// are noise next to copying this much).
inline constexpr std::size_t kTimedWriteBytes = 32 * 1024;

/// Forward, unchanged, every chunk that `in`'s peer (logical sender) writes to us to `out`'s
/// peer (logical receiver): their link is fenced and we relay (see `Relay` in plan.hpp).
struct RelayDuty {
  Connection* in = nullptr;
  Connection* out = nullptr;
  int sender_position = 0;     ///< ring position of the logical sender (to count its chunks per call)
  std::uint64_t base_in = 0;   ///< in->received when the duty started
  std::uint64_t base_out = 0;  ///< out->sent when the duty started
  std::uint32_t credited = 0;  ///< last credit value passed back to the sender
  int attempts = 0;            ///< checksum mode: deliveries of the current chunk that failed its check
};
inline constexpr int kMaxRelayDuties = 4;
/// This rank's relay duties for the current plan.
struct RelayDuties {
  RelayDuty duty[kMaxRelayDuties];
  int count = 0;
};

/// What went wrong in the data path, filled without allocation; the API layer formats it.
struct Failure {
  Status status;
  int peer = -1;
  const char* what = "";     ///< static description of the wait or operation
  std::uint64_t message = 0; ///< message number on the link
  bool aborted_by_peer = false;  ///< `peer` failed first and aborted; `status` is its error class
  int blamed = -1;               ///< with aborted_by_peer: the rank the failing peer blamed
  /// Transport of the connection it happened on (`Connection::transport_name`, which outlives the
  /// failure's report); null when it happened on none (local) or was not set.
  const std::string* transport = nullptr;
};

/// An abort word (`FlagBlock::abort_value`, nonzero) as the failure it reports: `peer` is the
/// origin (-1 when the word could not name it), `blamed` the rank the origin blamed.
inline Failure abort_failure(std::uint32_t value, const char* what, std::uint64_t message) noexcept {
  Failure f{Status(static_cast<ErrorCode>(value >> 24)), static_cast<int>((value >> 12) & 0xfffu) - 1, what, message};
  f.aborted_by_peer = true;
  f.blamed = static_cast<int>(value & 0xfffu) - 1;
  return f;
}

/// Fixed parameters of the executor for one communicator.
struct EngineConfig {
  int rank = 0;
  int size = 1;
  int position = 0;  ///< our place in the current ring (the schedule's "rank"; 0 = ring start)
  int slots = 4;
  std::size_t slot_bytes = 0;  ///< payload bytes per staging slot (multiple of 64, >= 64)
  bool checksum = false;       ///< CRC32C per chunk, verified by the receiver, re-sent on mismatch
  bool trailers = false;       ///< write chunk trailers even without checksums (relays read the length)
  /// Chunks of at least kStreamWriteMinBytes are written with streaming stores (WriteOp::stream):
  /// set at setup from CommOptions::stream_writes and, with auto, a probe of this host
  /// (publish_stream_writes, read_stream_writes). A local choice: ranks may differ.
  bool stream_writes = false;
  /// Whether a chunk of `bytes` goes into a peer's slot with streaming stores. A receiver asks it
  /// of the chunks it takes, whose lines then come from memory: its senders make the same
  /// host-wide choice (where a forced option makes ranks differ, only speed is affected).
  bool streams(std::size_t bytes) const noexcept { return stream_writes && bytes >= kStreamWriteMinBytes; }
  /// Deliveries of one chunk before the call fails: high enough that a link passing even 1 chunk
  /// in 10 keeps working until the next agreement fences it (p(fail) < 1e-11).
  int max_attempts = 256;
  /// Polls of a flag before a wait takes its slow path (deadline, services, the link's wait with
  /// its yields): a small message's answer usually arrives within a microsecond, and reading
  /// the clock would cost as much. `kOversubscribedSpinPolls` when this host runs more of the
  /// communicator's ranks than it has CPUs: there the answer needs the peer to run, which
  /// spinning only delays. `kDedicatedSpinPolls` when every rank has a CPU of its own
  /// (CommOptions::spin).
  int spin_polls = kSpinPolls;
  /// Checksum mode: a call that ends with at most this many bytes not yet accepted by their
  /// receivers copies them to the retained areas and returns; with more it waits for the
  /// receivers. With a CPU per rank and shared memory only (`kRunningRetainMaxBytes`) a
  /// receiver busy with our last chunk accepts it about when we finish, and waiting for its
  /// credit costs less than copying tens of KiB; where this host runs more of the
  /// communicator's ranks than it has CPUs, or any of this rank's links crosses a network
  /// (kRetainMaxBytes), the credit may first need the receiver scheduled or a network round trip.
  std::size_t retain_max_bytes = kRetainMaxBytes;
  /// Sets the waits for this host's load and this rank's links: `oversubscribed` when this
  /// host runs more of the communicator's ranks than it has online CPUs
  /// (CommContext::oversubscribed); `network_links` when any of this rank's links is a network
  /// link (Lanes::has_network_link). Waiting for a receiver's credit pays off where it comes
  /// within a cache line's trip; across a network it is a round trip, which is expected to cost
  /// more than the copy aside (kRetainMaxBytes; measured for tcp on loopback only,
  /// docs/protection-cost.md "Network links").
  /// `dedicated`: every rank of the host runs on a CPU of its own (CommContext::dedicated_cores),
  /// so a long spin takes no peer's time.
  void fit_to_host(bool oversubscribed, bool network_links, bool dedicated = false) noexcept {
    spin_polls = oversubscribed ? kOversubscribedSpinPolls : dedicated ? kDedicatedSpinPolls : kSpinPolls;
    retain_max_bytes = oversubscribed || network_links ? kRetainMaxBytes : kRunningRetainMaxBytes;
  }
  /// Distance between staging slots: payload plus the trailer.
  std::size_t slot_stride() const noexcept { return slot_bytes + kTrailerBytes; }
  /// Trailers lie in the line of the receiver's data flag (kFlagLineTrailerStart) when the
  /// link has few enough slots for them to fit there; else after each slot (trailer_offset).
  bool trailers_with_flag() const noexcept { return slots <= kFlagLineTrailers; }
  /// Where the trailer of message `m` from rank `from` lies at its receiver: an offset into the
  /// receiver's flag block (trailers_with_flag), else into its inbox from `from`. The one
  /// placement rule for sender (the region it writes), receiver and relays.
  std::size_t trailer_at(int from, std::uint64_t m) const noexcept {
    const auto slot = static_cast<std::size_t>(m % static_cast<std::uint64_t>(slots));
    return trailers_with_flag() ? FlagBlock::data_offset(size, from) + kFlagLineTrailerStart + slot * sizeof(ChunkTrailer)
                                : slot * slot_stride() + trailer_offset();
  }
  /// Where a slot's trailer lies, from the slot's start, when not with the flag: the end of the
  /// line after the payload. Fixed whatever the chunk, so a relay finds it before it knows the
  /// chunk's length.
  std::size_t trailer_offset() const noexcept { return slot_bytes + kTrailerBytes - sizeof(ChunkTrailer); }
  /// Where a chunk of `bytes` lies, from its slot's start: packed against a trailer after the
  /// slot when checksums are on and it is small (kPackedMaxBytes), else at the start. Sender,
  /// receiver and relays derive it from the length alone (checksum is the same on every rank).
  std::size_t data_offset(std::size_t bytes) const noexcept {
    return checksum && !trailers_with_flag() && bytes <= kPackedMaxBytes && bytes <= slot_bytes ? trailer_offset() - bytes : 0;
  }
  std::chrono::nanoseconds timeout{};
  /// `slots + 1` x `slot_bytes` of scratch for partial results that are sent on, not kept.
  std::byte* scratch = nullptr;
  /// Lane 0: the connection to every rank (null for ourselves). With checksums every wait also
  /// serves their re-send requests: a point-to-point call may have returned before its chunks
  /// were accepted, and the receiver may find one damaged in any later call of ours.
  Connection* const* retained_peers = nullptr;
};

struct CudaApi;
struct DeviceKernels;

/// Device regions (docs/device.md "Device regions in the engine"): the call's buffers, the
/// staging slots its peers write into and the scratch are device memory, carried by a transport
/// that writes device memory (nvlink, pcie). The executor then enqueues its copies
/// (`cudaMemcpyAsync`) and reductions (the kernel module's combine, the same functors as the
/// host's) on `stream`, and synchronizes it before any step that lets a peer read what they
/// wrote or overwrite what they read: before a chunk is sent, before a slot is credited back,
/// and at the end of the call. Waits poll every link of the call (a device transport stores a
/// signal behind its copies only from a poll or wait on that link), and a call ends only once
/// every chunk it sent was consumed. Not with checksums, trailers, relays or direct writes
/// (they read chunks on the host): such calls fail with InvalidUsage.
struct DeviceRegions {
  const CudaApi* cuda = nullptr;
  const DeviceKernels* kernels = nullptr;
  void* stream = nullptr;  ///< the executor's stream (cudaStream_t); kernels reduce the Reducer's type and op
};

/// The ring collectives the executor runs (schedules in schedule.hpp).
enum class RingCollective : std::uint8_t { Allreduce, ReduceScatter, Allgather, Broadcast, Reduce, TreeAllreduce, DirectAllreduce, OneShotAllreduce };

/// One ring call. `count`: allreduce/broadcast/reduce elements; reduce-scatter and allgather:
/// elements per block. `root`: ring position of the root (broadcast, reduce).
struct RingCall {
  RingCollective kind = RingCollective::Allreduce;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  int root = 0;
  /// Reduce-scatter / allgather: elements from one block to the next (0 = `count`); a channel
  /// that moves a slice of every block passes the full block length.
  std::size_t stride = 0;
  /// Reduce-scatter / allgather: the rank (= block) at each ring position; nullptr when the ring
  /// is 0, 1, ..., n-1.
  const int* blocks = nullptr;
  /// Tree and direct allreduce: connection per ring position and per rank (null for ourselves).
  Connection* const* by_position = nullptr;
  Connection* const* by_rank = nullptr;
  /// This call's fingerprint check, left to the executor (null: settled before the call, or
  /// none). Only for calls whose every received chunk comes from `check->from`.
  CallCheck* check = nullptr;
  /// Device regions (null: host memory, host copies and reductions).
  const DeviceRegions* device = nullptr;
};

/// One point-to-point transfer of a group.
struct P2POp {
  bool send = false;
  int peer = -1;          ///< rank
  std::byte* buf = nullptr;  ///< source (send) or destination (recv)
  std::size_t bytes = 0;
  std::size_t done = 0;   ///< bytes moved so far
  // Direct mode (engine-internal state): the receiver published its buffer's key; the sender
  // writes the chunks straight into it (dst) and the receiver copies nothing.
  bool direct = false;       ///< this op moves its bytes directly (decided by size, same on both ends)
  bool keyed = false;        ///< recv: key published; send: key fetched
  const RemoteRegion* dst = nullptr;  ///< send: the receiver's buffer (null: it asked for staging)
  bool landed = false;       ///< recv: the sender writes into `buf` (we published a non-empty key)
  std::byte* local_dst = nullptr;  ///< send to ourselves: the matching receive's buffer (copied by the executor)
};

/// How point-to-point transfers may skip the receiver's copy: from `min_bytes` (a send/recv
/// also only when larger than the slots hold, unless `whole_exchange`) a receiver
/// publishes its buffer's key (registered with the link's transport; empty = "use staging")
/// and the sender writes into it. With checksums the receiver verifies each chunk where it
/// landed and asks for damaged ones again (the sender waits for that before it returns, and
/// asks for a damaged key again: kRepublishKeyPiece).
struct P2PDirect {
  bool enabled = false;
  /// Every rank runs every transfer of this exchange in the same call (alltoall), so no send
  /// can wait on a receive its peer has not reached: transfers that fit the slots go direct too.
  bool whole_exchange = false;
  std::size_t min_bytes = SIZE_MAX;
  /// Plain user receive buffers (not from alloc()) take direct writes from this size.
  std::size_t user_min_bytes = SIZE_MAX;
  /// Key of `ptr` registered with `ch`'s transport under the rules of `d`; empty when it
  /// cannot or should not be shared (may allocate on a cache miss, never throws).
  std::span<const std::byte> (*key_of)(const P2PDirect& d, void* ptr, std::size_t bytes, Connection& ch) noexcept = nullptr;
  /// Imports a peer's key (cached; nullptr on failure).
  const RemoteRegion* (*resolve)(void* ctx, std::span<const std::byte> key, Connection& ch) noexcept = nullptr;
  void* ctx = nullptr;
};

/// The chunk, in elements, of a chain broadcast or reduce of `count` elements of `elem` bytes
/// with staging slots of `slot_bytes`: a slot, or for messages under four slots a quarter of
/// the message (at least 32 KiB, whole cache lines), so the chain's ranks overlap.
std::size_t chain_chunk(std::size_t count, std::size_t elem, std::size_t slot_bytes) noexcept;

/// Runs one ring collective over `left`/`right` (see `run_ring_allreduce`).
Status run_ring(const EngineConfig& config, FlagBlock flags, Connection* left, Connection* right, const RingCall& call,
                const Reducer& reducer, const DirectWrite& direct, RelayDuties& relays, Failure& failure) noexcept;


/// Reads `check.from`'s fingerprint of `check.mine`'s call into `check` when its signal has
/// arrived (true); does not acknowledge it. Never blocks.
bool read_fingerprint(const FlagBlock& flags, CallCheck& check) noexcept;

/// Call fingerprints, first half: writes `mine` to every connection in `to[0..n_to)` (after each
/// has read the one `kCallSlots` calls earlier; `spread`: to peers that do not check us, which
/// read it only to compare this call, so without waiting), with `carried` (a carried allreduce's
/// input, `mine.carried` set, at most kCarryMaxBytes) in the same write. Bounded by the timeout.
Status post_fingerprint(const EngineConfig& config, FlagBlock flags, Connection* left, Connection* right, RelayDuties& relays,
                        Connection* const* to, std::size_t n_to, const CallFingerprint& mine, Failure& failure,
                        bool spread = false, std::span<const std::byte> carried = {}) noexcept;

/// A carried allreduce of two ranks (docs/carried-allreduce.md): `check` was posted with our
/// input `send` (post_fingerprint's `carried`); waits for the peer's post of the same call,
/// verifies the carried bytes under our fingerprint's CRC (a match proves the same call; else the
/// fingerprints are read and compared, and the post asked for again while it arrives damaged or
/// not at all) and writes `send op theirs`, in rank order, to `recv`. A different call fails
/// with InvalidUsage (CallCheck::disagree). Bounded by the timeout.
Status run_carried(const EngineConfig& config, FlagBlock flags, Connection* left, Connection* right, RelayDuties& relays, CallCheck& check,
                   const void* send, void* recv, std::size_t count, const Reducer& reducer, Failure& failure) noexcept;

/// Second half, for calls that do not leave it to the executor: waits for `check.from`'s
/// fingerprint of the same call, reads it into `check` and acknowledges it (a carried post only
/// once its data passed, in RingRunner::run_carried). `check.intact` is
/// false when it arrived damaged or stale (a lossy or corrupting link: evidence against the
/// link, not a disagreement); a disagreement is not an error here (see `CallCheck::disagree`).
/// Bounded by the timeout.
Status settle_fingerprint(const EngineConfig& config, FlagBlock flags, Connection* left, Connection* right, RelayDuties& relays,
                          CallCheck& check, Failure& failure) noexcept;

/// Runs a group of point-to-point transfers (`connection_of[r]`: connection to rank r, null for
/// ourselves). `device`: the buffers and staging slots are device memory (see DeviceRegions;
/// `direct` must then be disabled). Never throws or allocates.
Status run_p2p(const EngineConfig& config, FlagBlock flags, Connection* const* connection_of, P2POp* ops, std::size_t n,
               const P2PDirect& direct, Failure& failure, const DeviceRegions* device = nullptr, CallCheck* check = nullptr) noexcept;

/// Lane 0 at the end of a communicator: waits, at most until `deadline`, until every peer
/// accepted the chunks a call left in the retained areas (Connection::retained; checksum mode)
/// and acknowledged our last carried post (Connection::last_carried), serving re-send and
/// re-post requests meanwhile. Never fails: a peer that never takes them is given up on.
void drain_retained(const EngineConfig& config, FlagBlock flags, std::chrono::steady_clock::time_point deadline) noexcept;

/// Runs one ring allreduce over the `left`/`right` connections. Returns Ok, or an error with
/// `failure` describing the peer and the wait. Never throws or allocates.
Status run_ring_allreduce(const EngineConfig& config, FlagBlock flags, Connection* left, Connection* right,
                          const void* send, void* recv, std::size_t count, const Reducer& reducer,
                          const DirectWrite& direct, RelayDuties& relays, Failure& failure) noexcept;

}  // namespace ringfence::detail
