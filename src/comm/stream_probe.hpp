#pragma once
// Whether this host's cores hand a chunk to each other faster when it is written with streaming
// (non-temporal) stores than through the cache (CommOptions::stream_writes,
// docs/tuning.md "Streaming slot writes"). Control plane: runs at setup.
#include <optional>

#include "context.hpp"

namespace ringfence::detail {

/// One exchange step (each side copies a chunk into the other's rotating slot, publishes a
/// flag, waits for the other's, copies the other's chunk out), in microseconds: the fastest
/// round of each kind, with the first copy plain and with it streaming.
struct StreamProbe {
  double plain_us = 0;
  double stream_us = 0;
};

/// Times the exchange between two threads pinned to `cpu_a` and `cpu_b` (64 KiB chunks,
/// rounds of the two kinds alternated, a few milliseconds). nullopt when a thread cannot be
/// pinned there or its partner stops answering for a second: never hangs.
std::optional<StreamProbe> probe_stream_writes(int cpu_a, int cpu_b);

/// Streaming only where it is clearly faster: its step under `kStreamWin` of the plain one.
inline constexpr double kStreamWin = 0.8;
/// Pure: `p.stream_us < kStreamWin * p.plain_us`.
bool prefers_stream(const StreamProbe& p) noexcept;

/// The host's answer, published by the host's lowest rank (others do nothing): by its own
/// CommOptions::stream_writes when on or off; with auto false where this host runs no other
/// rank of the communicator or only network transports are selected, else the probe between
/// its first CPU and the next online one (false where the probe cannot run), logged. Call it
/// before the lanes connect: their store round carries the answer, so MpiStore needs no round
/// of its own (tests/mp/mpi_bootstrap_test.cpp counts them). May throw the store's errors.
void publish_stream_writes(const CommContext& ctx);

/// Whether the choice is made again while the job runs (StreamChoice): auto mode on a host
/// where the probe runs (another rank of the communicator here, a shared-memory transport
/// selected, two or more CPUs).
bool stream_writes_adapt(const CommContext& ctx) noexcept;

/// This communicator's choice (EngineConfig::stream_writes), after the lanes connected:
/// CommOptions::stream_writes when on or off, else the host's published answer. May block on
/// the store and throw its errors.
bool read_stream_writes(const CommContext& ctx);

}  // namespace ringfence::detail
