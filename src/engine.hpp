#pragma once
// Private engine types: per-peer channels (a link plus the peer's imported regions and the
// message counters) and the step executor. Nothing here allocates or throws once built.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <ringfence/reduce_ops.hpp>
#include <ringfence/schedule.hpp>
#include <string>
#include <ringfence/transport.hpp>

namespace ringfence::detail {

/// Bytes of one mailbox: a u32 key length, then the key.
inline constexpr std::size_t kMailboxBytes = 512;

/// Local signal words of one rank: `data[p]` is bumped by peer p after it wrote a chunk into
/// our inbox; `credit[p]` is bumped by peer p after it consumed a chunk we wrote into its inbox.
/// Both are message counters (1 = first message), monotone for the communicator's lifetime.
/// `mail[p]` is set to the call number after peer p wrote the region key of its output buffer
/// for that call into `mailbox(p)` (direct writes of final values).
struct FlagBlock {
  SignalFlag* data = nullptr;    ///< [size]
  SignalFlag* credit = nullptr;  ///< [size]
  SignalFlag* mail = nullptr;    ///< [size]
  std::byte* mailboxes = nullptr;  ///< [size][kMailboxBytes]
  static std::size_t bytes(int size) noexcept {
    return static_cast<std::size_t>(size) * (3 * sizeof(SignalFlag) + kMailboxBytes);
  }
  static std::size_t data_offset(int rank) noexcept { return static_cast<std::size_t>(rank) * sizeof(SignalFlag); }
  static std::size_t credit_offset(int size, int rank) noexcept {
    return (static_cast<std::size_t>(size) + static_cast<std::size_t>(rank)) * sizeof(SignalFlag);
  }
  static std::size_t mail_offset(int size, int rank) noexcept {
    return (2 * static_cast<std::size_t>(size) + static_cast<std::size_t>(rank)) * sizeof(SignalFlag);
  }
  static std::size_t mailbox_offset(int size, int rank) noexcept {
    return 3 * static_cast<std::size_t>(size) * sizeof(SignalFlag) + static_cast<std::size_t>(rank) * kMailboxBytes;
  }
  void bind(void* base, int size) noexcept {
    data = static_cast<SignalFlag*>(base);
    credit = data + size;
    mail = credit + size;
    mailboxes = static_cast<std::byte*>(base) + mailbox_offset(size, 0);
  }
};

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
struct Channel {
  int peer = -1;
  std::string transport_name;
  Transport* transport = nullptr;
  std::unique_ptr<Link> link;
  std::byte* inbox = nullptr;   ///< our staging slots that this peer writes into
  MemoryRegion inbox_region;    ///< registration of `inbox` with `transport`
  MemoryRegion flags_region;    ///< registration of our FlagBlock with `transport`
  RemoteRegion peer_inbox;      ///< the peer's staging slots for us
  RemoteRegion peer_flags;      ///< the peer's FlagBlock
  std::uint64_t sent = 0;       ///< messages written to the peer
  std::uint64_t received = 0;   ///< messages consumed from the peer
};

/// What went wrong in the data path, filled without allocation; the API layer formats it.
struct Failure {
  Status status;
  int peer = -1;
  const char* what = "";     ///< static description of the wait or operation
  std::uint64_t message = 0; ///< message number on the link
};

/// Fixed parameters of the executor for one communicator.
struct EngineConfig {
  int rank = 0;
  int size = 1;
  int slots = 4;
  std::size_t slot_bytes = 0;  ///< bytes per staging slot (multiple of 64, >= 8)
  std::chrono::nanoseconds timeout{};
};

/// Runs one ring allreduce over `left`/`right` channels. Returns Ok, or an error with
/// `failure` describing the peer and the wait. Never throws or allocates.
Status run_ring_allreduce(const EngineConfig& config, FlagBlock flags, Channel* left, Channel* right,
                          const void* send, void* recv, std::size_t count, const Reducer& reducer,
                          const DirectWrite& direct, Failure& failure) noexcept;

}  // namespace ringfence::detail
