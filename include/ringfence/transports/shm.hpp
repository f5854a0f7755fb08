#pragma once
/// \file transports/shm.hpp
/// Shared-memory transport for ranks on one host (target `ringfence::transport_shm`).
///
/// - Regions: memory from `allocate()` lives in POSIX shared-memory segments that peers map;
///   writes into them are one `memcpy`. Any other host pointer is registered for cross-memory
///   attach: writes into it are one `process_vm_writev` (single copy, no staging).
/// - Signals: a release store on a `SignalFlag` in a mapped segment, then a futex wake only when
///   the owner sleeps. Waiters spin `Options::spin_count` (RINGFENCE_SHM_SPIN) polls, then sleep on the futex, so
///   more ranks than cores do not starve each other.
/// - Liveness: each link holds a pidfd of the peer; a wait on a dead peer returns
///   `PeerUnreachable` at once instead of running into the timeout.
/// See transports/shm/README.md for the guarantees table.

#include <chrono>
#include <cstddef>
#include <memory>
#include <ringfence/log.hpp>
#include <string>
#include <ringfence/transport.hpp>
#include <ringfence/transport_settings.hpp>
#include <span>
#include <string_view>

namespace ringfence::transports::shm {

/// Registry name of this transport.
inline constexpr std::string_view kName = "shm";

/// This transport's settings, read from `CommOptions::transport_settings` (its variables:
/// `setting_keys()`).
struct Options {
  /// Flag polls before a waiter sleeps on a futex (0 = sleep at once). Spinning wins latency
  /// when ranks <= cores; sleeping keeps 4 ranks on 2 cores from starving each other.
  /// RINGFENCE_SHM_SPIN (>= 0).
  int spin_count = 2000;
  /// While spinning, polls between `sched_yield` calls (0 = never). A yield hands an
  /// oversubscribed rank's core to the peer it waits for: 4 ranks on 2 cores ran 8 B-256 KiB
  /// allreduces 3-15x slower without it. With a core per rank it cost nothing measurable, and
  /// a rank cannot know whether other jobs share its cores, so it always yields by default
  /// (docs/tuning.md "Spinning and yielding"). RINGFENCE_SHM_YIELD (>= 0).
  int yield_every = 32;
  /// Use cross-memory attach (process_vm_writev) to write straight into a peer's unregistered
  /// buffer; when false such regions are rejected. RINGFENCE_SHM_CMA (0/1).
  bool cross_memory_attach = true;
  /// The settings of `options` (null: the defaults). Throws `InvalidUsage` naming a variable
  /// with a bad value.
  static Options from(const CommOptions* options);
};

/// The variables this transport reads (register them with the transport: `TransportRegistry::add`).
std::span<const SettingKey> setting_keys() noexcept;

/// Creates the shared-memory transport for one communicator. Also removes stale segments left
/// in /dev/shm by ringfence processes that no longer exist (`remove_stale_segments`).
std::unique_ptr<Transport> make_transport(const TransportContext& context);

/// Creates the POSIX shared-memory segment `name` ("/rf-<pid>-…", exclusive) and takes its
/// owner's lock: an exclusive `flock` held as long as the returned descriptor stays open, which
/// the kernel drops when the process dies in any PID namespace. Returns -1 with `errno` set on
/// failure (the segment is then not left behind); EAGAIN: a concurrent `remove_stale_segments`
/// removed the name before the lock was taken, create again under another name.
int create_owned_segment(const std::string& name);

/// Removes every ringfence segment in /dev/shm whose owner's lock is free (its creator is gone,
/// however it died). Segments of live processes, in this PID namespace or another, are left
/// alone. Communicators sweep when their shm transport starts; `ringfence-run` sweeps once its
/// ranks are gone, so a SIGKILLed or interrupted job leaves nothing behind. Returns how many
/// were removed.
std::size_t remove_stale_segments(const Logger* log = nullptr) noexcept;

}  // namespace ringfence::transports::shm
