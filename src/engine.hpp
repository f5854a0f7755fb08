#pragma once
// Private engine types: per-peer channels (a link plus the peer's imported regions and the
// message counters) and the step executor. Nothing here allocates or throws once built.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <ringfence/reduce_ops.hpp>
#include <ringfence/schedule.hpp>
#include <string>
#include <ringfence/transport.hpp>

namespace ringfence::detail {

/// Local signal words of one rank: `data[p]` is bumped by peer p after it wrote a chunk into
/// our inbox; `credit[p]` is bumped by peer p after it consumed a chunk we wrote into its inbox.
/// Both are message counters (1 = first message), monotone for the communicator's lifetime.
struct FlagBlock {
  SignalFlag* data = nullptr;    ///< [size]
  SignalFlag* credit = nullptr;  ///< [size]
  static std::size_t bytes(int size) noexcept { return 2 * static_cast<std::size_t>(size) * sizeof(SignalFlag); }
  static std::size_t data_offset(int rank) noexcept { return static_cast<std::size_t>(rank) * sizeof(SignalFlag); }
  static std::size_t credit_offset(int size, int rank) noexcept {
    return (static_cast<std::size_t>(size) + static_cast<std::size_t>(rank)) * sizeof(SignalFlag);
  }
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
                          Failure& failure) noexcept;

}  // namespace ringfence::detail
