#pragma once
/// \file transports/shm.hpp
/// Shared-memory transport for ranks on one host (target `ringfence::transport_shm`).
///
/// - Regions: memory from `allocate()` lives in POSIX shared-memory segments that peers map;
///   writes into them are one `memcpy`. Any other host pointer is registered for cross-memory
///   attach: writes into it are one `process_vm_writev` (single copy, no staging).
/// - Signals: a release store on a `SignalFlag` in a mapped segment, then a futex wake only when
///   the owner sleeps. Waiters spin `ShmOptions::spin_count` polls, then sleep on the futex, so
///   more ranks than cores do not starve each other.
/// - Liveness: each link holds a pidfd of the peer; a wait on a dead peer returns
///   `PeerUnreachable` at once instead of running into the timeout.
/// See transports/shm/README.md for the guarantees table.

#include <memory>
#include <ringfence/transport.hpp>
#include <string_view>

namespace ringfence::transports::shm {

/// Registry name of this transport.
inline constexpr std::string_view kName = "shm";

/// Creates the shared-memory transport for one communicator. Also removes stale segments left
/// in /dev/shm by ringfence processes that no longer exist.
std::unique_ptr<Transport> make_transport(const TransportContext& context);

}  // namespace ringfence::transports::shm
