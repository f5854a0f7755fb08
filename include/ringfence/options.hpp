#pragma once
/// \file options.hpp
/// Options aggregates with defaults. Designated initializers work:
/// `CommOptions{.timeout = std::chrono::seconds(10), .chunk_bytes = 1 << 20}`.
/// `CommOptions::from_env` (src/env.cpp) is the only code that reads `RINGFENCE_*` variables.

#include <algorithm>
#include <chrono>
#include <optional>
#include <cstddef>
#include <cstdint>
#include <ringfence/health/options.hpp>
#include <ringfence/log.hpp>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ringfence {

class Environment;

/// Settings that belong to one transport, as text keyed by their variable name
/// (`RINGFENCE_<NAME>_<KEY>`): see include/ringfence/transport_settings.hpp.
using TransportSettings = std::map<std::string, std::string, std::less<>>;

/// Fallback transports, as (from, to) transport names (`CommOptions::fallbacks`).
using FallbackTable = std::vector<std::pair<std::string, std::string>>;

/// Whether stream-ordered collectives run the engine on device memory (docs/device.md "Device
/// regions in the engine") instead of staging through pinned host memory.
enum class DeviceRegionsMode : std::uint8_t {
  Auto,  ///< when every rank can (a device transport to every peer, the kernel module, no checksums); else staged
  On,    ///< required: the first stream-ordered collective throws `CudaError` saying why not
  Off,   ///< always host-staged
};

/// Whether the engine's waits may spin long without yielding the CPU (`CommOptions::spin`).
enum class SpinMode : std::uint8_t {
  Auto,  ///< when every rank of this host is bound to a CPU of its own (PeerInfo::cpu)
  On,    ///< the ranks' cores are theirs alone, bound or not (not where ranks outnumber the CPUs)
  Off,   ///< never: a short spin, then the link's wait, which yields
};

/// How chunks are written into peers' staging slots (`CommOptions::stream_writes`).
enum class StreamWritesMode : std::uint8_t {
  Auto,  ///< streaming stores where a probe of this host at setup, or a trial call later, finds them clearly faster
  On,    ///< always streaming stores (from kStreamWriteMinBytes, 4 KiB)
  Off,   ///< always plain stores through the cache
};

/// What a result-digest mismatch does (`CommOptions::digest_action`).
enum class DigestAction : std::uint8_t {
  Error,  ///< fail the collective on every rank
  Fence,  ///< fence the links over which outputs start to disagree, and continue
  Log,    ///< log and record the events only
};

/// Allreduce algorithm (see docs/tuning.md).
enum class Algorithm : std::uint8_t {
  Auto,  ///< the tuner picks by message size, rank count and plan
  Ring,  ///< pipelined ring reduce-scatter + allgather (bandwidth-optimal; relays fenced hops)
  Tree,  ///< double binary tree (latency grows with log2 n); ring when the plan has relays
  Direct,  ///< every rank reduces one slice from all peers (two hops); ring once a link is fenced
  OneShot, ///< every rank sends its whole input to all and reduces all itself (one hop; small messages)
};

/// Options of one communicator. Plain aggregate; every field has a sane default.
struct CommOptions {
  /// Deadline for every wait on a peer (signal, credit, store, connect). A dead or stalled peer
  /// becomes a `TimeoutError`/`PeerUnreachableError` after at most this long. Env: RINGFENCE_TIMEOUT_MS.
  std::chrono::milliseconds timeout{60000};
  /// Pipeline chunk size in bytes (rounded down to whole elements, at least one element).
  /// Env: RINGFENCE_CHUNK_BYTES.
  std::size_t chunk_bytes = 256 * 1024;
  /// Chunks in flight per link (staging slots per peer). Env: RINGFENCE_SLOTS.
  int slots = 4;
  /// Allreduce algorithm; Auto lets the tuner choose. Must match on every rank.
  /// Env: RINGFENCE_ALGO=auto|ring|tree|direct|oneshot.
  Algorithm algorithm = Algorithm::Auto;
  /// Two-rank allreduces of at most this many bytes (and > 0) move their data in the call
  /// fingerprint each rank posts anyway, instead of as a chunk (docs/carried-allreduce.md):
  /// a third to half the time of a small call, with its checksum whatever `checksum` says.
  /// Needs `check_calls`, host memory and the Auto or OneShot algorithm. At most 4096; 0 = off.
  /// Must match on every rank. Env: RINGFENCE_CARRY_MAX_BYTES=<bytes>|off.
  std::size_t carry_max_bytes = 4096;
  /// Tuner model (alpha-beta, docs/tuning.md): cost of one hop of one chunk in microseconds
  /// (signal, wake-up, pipeline bubble) and the bandwidth of one link in GB/s. Must match on
  /// every rank. Env: RINGFENCE_TUNER_ALPHA_US, RINGFENCE_TUNER_GBPS.
  double tuner_alpha_us = 6.0;
  double tuner_gbps = 2.0;
  /// Messages of at least this many bytes whose output buffer comes from `alloc()` receive
  /// final values straight into that buffer (one memcpy by the sender into the shared
  /// segment) instead of through staging slots plus a copy. SIZE_MAX disables it. Must match
  /// on every rank. Env: RINGFENCE_DIRECT_WRITE_MIN_BYTES=<bytes>|off.
  std::size_t direct_write_min_bytes = 256 * 1024;
  /// CUDA runtime library the stream-ordered calls load (`CudaStream` overloads); empty tries
  /// libcudart.so.13, .12, .11.0, libcudart.so. Env: RINGFENCE_CUDART.
  std::string cuda_runtime;
  /// Pinned host staging buffers of the stream-ordered calls: at most this many calls in flight
  /// per communicator (a further call waits for one to finish, up to `timeout`).
  /// Env: RINGFENCE_DEVICE_STAGING_SLOTS.
  std::size_t device_staging_slots = 8;
  /// Device regions for the stream-ordered calls: decided by all ranks together at the first
  /// stream-ordered collective (send/recv follow that decision). Env:
  /// RINGFENCE_DEVICE_REGIONS=auto|on|off.
  DeviceRegionsMode device_regions = DeviceRegionsMode::Auto;
  /// The device reduction kernels' module (libringfence_kernels.so, src/device_kernels.hpp);
  /// empty: next to the library or program, then the loader's search. Env: RINGFENCE_CUDA_KERNELS.
  std::string cuda_kernels;
  /// The same for plain user buffers, written by cross-memory attach (process_vm_writev).
  /// Off by default: on the development machines it measured no faster than staging (see
  /// docs/architecture.md). Applies only at or above `direct_write_min_bytes`.
  /// Env: RINGFENCE_DIRECT_WRITE_USER_MIN_BYTES=<bytes>|off.
  std::size_t direct_write_user_min_bytes = SIZE_MAX;
  /// Point-to-point transfers (send/recv, alltoall) of at least `direct_write_min_bytes` go
  /// straight into the receiver's buffer when it comes from `alloc()`, or when it is a plain
  /// user buffer of at least this many bytes (cross-memory attach): one copy instead of two.
  /// A send/recv only when it is also larger than the slots hold (`slots` x chunk bytes): a
  /// direct send waits for its receiver, and one that fits must return once written. With
  /// checksums the receiver verifies the chunks in its buffer and asks for damaged ones again
  /// (docs/architecture.md). Off by default: on the development VM cross-memory attach was
  /// slower than staging for send/recv at 2 and 4 ranks (e.g. 4.4 vs 5.6 GB/s at 4 MiB), and
  /// with checksums slower for alltoall too (2026-12-03, docs/collectives.md).
  /// Env: RINGFENCE_P2P_DIRECT_USER_MIN_BYTES=<bytes>|off.
  std::size_t p2p_direct_user_min_bytes = SIZE_MAX;
  /// The same for alltoall with 3 or more ranks, where every pair exchanges at once and staging
  /// costs a wake-up of the receiver per chunk per peer: measured 4 ranks on 2 cores, 1 MiB
  /// blocks, 1.40 (direct) vs 0.26 GB/s (staged) busbw. Without checksums only: with them the
  /// receiver reads each block again to verify it in place, and direct measured slower from
  /// 1 MiB blocks (docs/collectives.md), so only `p2p_direct_user_min_bytes` applies then. With
  /// 2 ranks alltoall is one send/recv pair and follows `p2p_direct_user_min_bytes`. Otherwise
  /// the lower of the two applies.
  /// Env: RINGFENCE_ALLTOALL_DIRECT_USER_MIN_BYTES=<bytes>|off.
  std::size_t alltoall_direct_user_min_bytes = 256 * 1024;
  /// Parallel channels ("lanes"): each has its own connection, flags and staging slots to every
  /// peer and its own worker thread; ring collectives (allreduce, reduce-scatter, allgather,
  /// broadcast, reduce) of at least `2 × channel_min_bytes` are split into one slice per channel
  /// and run at once. 0 = auto: online cores ÷ ranks on this host, at most 4 (1 on an
  /// oversubscribed host); at least 2 when every link is a network link (only network
  /// transports selected) and the host is not oversubscribed (docs/tuning.md "Channels").
  /// Must match on every rank. Env: RINGFENCE_CHANNELS.
  int channels = 0;
  /// Smallest slice a channel is given (bytes); a call uses min(channels, bytes ÷ this) channels.
  /// Must match on every rank. Env: RINGFENCE_CHANNEL_MIN_BYTES.
  std::size_t channel_min_bytes = 1024 * 1024;
  /// Chunks of 4 KiB or more that go through a shared-memory slot are written with streaming
  /// (non-temporal) stores or through the cache. Which hands them to the reading core faster
  /// depends on the host: on an AMD EPYC (Zen 5) VM whose two vCPUs do not share a cache,
  /// streaming made 2-rank allreduce 2.1-2.9x faster at 64 KiB-16 MiB; on an Intel VM it was
  /// slower (docs/tuning.md "Streaming slot writes"). Auto: the host's lowest rank times both
  /// at setup (a few ms) and the host's ranks follow it; from the 1024th collective on, one
  /// collective of 64 KiB or more now and then runs with the other kind on every rank, and the
  /// ranks switch where it ran clearly faster (a host whose cores change behaviour while the
  /// job runs). A local choice: ranks may differ. Env: RINGFENCE_STREAM_WRITES=auto|on|off.
  StreamWritesMode stream_writes = StreamWritesMode::Auto;
  /// Long spins in the engine's waits: a rank waiting for a peer polls the flag up to
  /// `kDedicatedSpinPolls` times before the link's wait, which yields the CPU (`sched_yield`
  /// costs ~1 µs on these VMs even when no one else runs). Yielding is right when ranks share
  /// cores, with each other or with another job, and costs a chain's ranks (reduce, broadcast)
  /// 5-25 % at 32 KiB-2 MiB when each has a core of its own. A rank cannot see other jobs, so
  /// auto takes binding as the sign: every rank of the host bound to one CPU, all different
  /// (`ringfence-run --bind-to core`, `mpirun --bind-to core`, `srun --cpu-bind=cores`), as
  /// MPI libraries busy-poll when not oversubscribed. Two jobs bound to the same CPUs then spin
  /// against each other: set off for them. A local choice: ranks may differ
  /// (docs/tuning.md "Spinning on dedicated cores"). Env: RINGFENCE_SPIN=auto|on|off.
  SpinMode spin = SpinMode::Auto;
  /// Allowed transports in priority order, by registry name; empty = every registered
  /// transport in registry order. Env: RINGFENCE_TRANSPORTS=<name>,<name>.
  std::vector<std::string> transports;
  /// Log verbosity. Env: RINGFENCE_LOG=error|warn|info|debug|trace (any case).
  LogLevel log_level = LogLevel::Warn;
  /// Log lines go to this file instead of stderr, appended (`%h` host, `%p` pid, `%r` rank, as
  /// NCCL_DEBUG_FILE: `expand_log_path`); empty = stderr. Env: RINGFENCE_LOG_FILE.
  std::string log_file;
  /// Start every log line with the UTC time (microseconds). Env: RINGFENCE_LOG_TIMESTAMP=on|off.
  bool log_timestamps = false;
  /// Host identity used to decide which peers share memory; empty = hostname + boot id.
  /// Env: RINGFENCE_HOST_ID (tests use it to simulate several hosts).
  std::string host_id;
  /// The transports' own settings, as text by variable name (each transport's README and
  /// `setting_keys()` list its variables). `from_env` copies every `RINGFENCE_*` variable that is
  /// not one of the options here; set them in code the same way,
  /// `options.transport_settings["RINGFENCE_<NAME>_<KEY>"] = "4"`. A transport parses its own
  /// when it is created and refuses a bad value with `InvalidUsage` naming the variable.
  TransportSettings transport_settings;
  /// End-to-end integrity: every chunk carries a CRC32C that the receiver verifies; a corrupted
  /// chunk is re-sent (and counted against the link), so it never reaches a result. On by
  /// default: the CRC is computed in the pass that copies or reduces the chunk anyway (see
  /// docs/health.md "What protection costs"). Must match on every rank. Env:
  /// RINGFENCE_CHECKSUM=on|off.
  bool checksum = true;
  /// Link health: the ranks agree, every so often (below), on which links to fence, judging
  /// each link on its checksum errors, timeouts, hardware counters (link map) and the speed of
  /// its writes against the job's other links on the same transport (a link persistently ~3x
  /// slower is fenced and routed around; a rank all of whose links are slow is reported as a
  /// straggler). On by default. Must match on every rank. Env: RINGFENCE_HEALTH=on|off.
  bool health_enabled = true;
  /// Collectives between two fence agreements (an internal, checksummed allreduce of everyone's
  /// proposals and link speeds; when the fence set changed, every rank switches to a ring that
  /// avoids the fenced links), or more of them while agreements are paced by time (below).
  /// 0 disables agreements. Must match on every rank. Env: RINGFENCE_HEALTH_AGREE_EVERY.
  int health_agree_every = 64;
  /// Agreements are paced by time too: when `health_agree_every` collectives take less than
  /// this on every rank and the last agreement found nothing to act on (no vote on any link, no
  /// link or rank judged slow), the next one waits 2, 4, 8 or 16 times as many collectives, so
  /// agreements come about this far apart (a stream of 1-microsecond allreduces would otherwise
  /// pay for one every 64 microseconds). At most 16 times: a link that turns bad right after a
  /// paced agreement is judged within 16 x 64 collectives however slow they become. Any vote
  /// puts the count back to `health_agree_every`. Timed from the first agreement, which keeps
  /// the count (the time since setup includes waiting for the slowest rank to start). 0: by
  /// count only. Must match on every rank. Env: RINGFENCE_HEALTH_AGREE_MIN_US. 10 ms: an
  /// agreement costs ~2 us at 2 ranks and ~16 us at 4 ranks on 2 cores, so at 1 ms 4-rank calls
  /// of 8 B-32 KiB paid about 3 % for them (docs/protection-cost.md, "Agreements are rare").
  std::chrono::microseconds health_agree_min_interval{10000};
  /// An agreement also runs once this many bytes (the collectives' data sizes, the same on every
  /// rank) went by since the last one, so large messages are judged within about a second on a
  /// slow link too. 0: by count only. Must match on every rank. Env: RINGFENCE_HEALTH_AGREE_BYTES.
  std::size_t health_agree_bytes = std::size_t{32} << 20;
  /// A link is slow when its writes' median speed is this many times below the median of the
  /// job's links on its transport, at two agreements in a row. Env: RINGFENCE_HEALTH_SLOW_FACTOR.
  double health_slow_factor = 3.0;
  /// Fallback transports, as (from, to) names: when the ranks agree that a link must be fenced
  /// and both of its ends are on `from` and reach each other over `to` (another selected
  /// transport), the pair moves to `to` instead (a `link_moved` event): the plan stays, and
  /// so does every result, bit for bit. Otherwise the link is fenced and routed around. A moved
  /// link is judged afresh on its new transport and may move again, or be fenced; it does not
  /// move back. Unset (the default): the pairs the selected transports declare
  /// (`TransportTraits::fallbacks`, e.g. a GPU peer-to-peer transport names its host-staged
  /// twin). An end without the pair in its table refuses the move. An empty table never moves.
  /// Env: RINGFENCE_FALLBACK=<from>:<to>,... or `none`.
  std::optional<FallbackTable> fallbacks;
  /// Every this many collectives, ranks compare an 8-byte digest (CRC32C) of their allreduce
  /// output. A rank is named only when a strict majority of ranks agree and it differs from
  /// them; otherwise the ring links over which the outputs start to disagree are named. Each
  /// mismatch is a `DigestMismatch` event (counted in `Communicator::digest_mismatches()`),
  /// then `digest_action` applies. 0 disables. Must match on every rank.
  /// Env: RINGFENCE_DIGEST_EVERY.
  int digest_every = 0;
  /// What a digest mismatch does: `Error` (the default) fails the allreduce on every rank with
  /// `ErrorCode::Fatal` naming the ranks or links (its output is wrong somewhere); `Fence`
  /// fences the named links (agreed alike on every rank; no route left is an error) and
  /// continues; `Log` only logs and records the events. Must match on every rank.
  /// Env: RINGFENCE_DIGEST_ACTION=error|fence|log.
  DigestAction digest_action = DigestAction::Error;
  /// Health-layer sources and policy thresholds (sysfs root, NVML library, windows, DCGM-derived
  /// thresholds; see docs/health.md). Env: RINGFENCE_SYSFS_ROOT, RINGFENCE_NVML_LIBRARY,
  /// RINGFENCE_HEALTH_WINDOW_MS, RINGFENCE_HEALTH_CONFIG (a file of thresholds), and
  /// RINGFENCE_HEALTH_FENCE_CRC_ERRORS (`thresholds.checksum_storm_count`: corrupted chunks from
  /// a peer within `checksum_storm_window` that make a rank propose fencing the link).
  health::HealthOptions health;
  /// Which hardware counters describe which link, e.g. `0-1=nvml:0:2` (the counter sources and
  /// their grammar: docs/health.md, "From evidence to a fenced link"),
  /// or `auto` (NVLinks from NVML's topology, see `health_gpu`), alone or with such entries.
  /// Mapped links are judged by the health policy at every fence agreement (which then runs
  /// even without checksums). Must be non-empty on every rank or on none.
  /// Env: RINGFENCE_HEALTH_LINK_MAP.
  std::string health_link_map;
  /// NVML index of this rank's GPU. Its PCI bus id and active NVLinks travel with the rank's
  /// peer info: the planner makes NVLink-joined (and same-GPU) ranks ring neighbours
  /// (`plan_home_ring`), and `health_link_map` entry `auto` maps each active NVLink of this GPU
  /// whose far end is another rank's GPU to the link with that rank. -1 = none (rank order);
  /// `kHealthGpuFromCuda` (-2) = the CUDA device current on the thread that builds the
  /// communicator, found in NVML by its PCI bus id (CUDA and NVML number GPUs differently).
  /// Env: RINGFENCE_HEALTH_GPU (an index, or `cuda`).
  int health_gpu = -1;
  /// `health_gpu` value: this rank's GPU is the current CUDA device (`RINGFENCE_HEALTH_GPU=cuda`).
  static constexpr int kHealthGpuFromCuda = -2;
  /// With a link map: a background thread also samples the counter sources this often, so
  /// windows see bursts between agreements (started and stopped with the communicator).
  /// 0 disables. Env: RINGFENCE_HEALTH_INTERVAL_MS.
  std::chrono::milliseconds health_interval{1000};
  /// Append every health event as one JSON line to this file (all ranks may share it: each
  /// line is one O_APPEND write); empty = no file. Env: RINGFENCE_HEALTH_LOG.
  std::string health_log;
  /// Prometheus text file (node-exporter textfile collector format) rewritten atomically at every
  /// fence agreement, every `health_prometheus_interval` (checked when a collective starts and
  /// when a send/recv group ends), and
  /// when the communicator closes; `{rank}` in the path is replaced by the rank. Empty = none.
  /// `ringfence-health --live DIR` reads these files. Env: RINGFENCE_HEALTH_PROMETHEUS.
  std::string health_prometheus;
  /// Health ledger (docs/health.md "Health ledger"): a file shared by jobs where every fence,
  /// move and readmission is appended with the link's ends named by host and GPU (or place on
  /// the host); at init a job fences (agreed, from collective #1) the links still in quarantine
  /// there. Empty = none. Env: RINGFENCE_HEALTH_LEDGER.
  std::string health_ledger;
  /// How long a link fenced or moved in the ledger stays fenced for later jobs, unless
  /// `ringfence-health ledger clear` clears it first. Env: RINGFENCE_HEALTH_LEDGER_QUARANTINE_S.
  std::chrono::seconds health_ledger_quarantine{24 * 3600};
  /// How often the Prometheus file is refreshed while collectives or send/recv run; 0 = only at
  /// agreements and close. Env: RINGFENCE_HEALTH_PROMETHEUS_INTERVAL_MS.
  std::chrono::milliseconds health_prometheus_interval{2000};
  /// Fault injection rules (see fault.hpp for the grammar); empty = none.
  /// Env: RINGFENCE_FAULT.
  std::string fault;
  /// Call fingerprints (docs/failure-semantics.md): in every collective, each rank checks that
  /// its ring neighbour makes the same call (number, collective, datatype, op, count, root)
  /// before it uses any data it received; a mismatch is `InvalidUsage` naming both ranks
  /// instead of a hang or garbage. Costs one small message per collective, sent ahead of the
  /// data. Must match on every rank.
  /// Env: RINGFENCE_CHECK_CALLS=on|off.
  bool check_calls = true;
  /// Liveness heartbeat: a background thread per communicator signals every peer over links of
  /// its own every `heartbeat_interval` and watches theirs, so a peer that dies, stops (SIGSTOP)
  /// or closes its communicator fails this communicator within about `timeout` even between
  /// collectives (`async_error()`, the next call throws at once). 0 ms = off; the default is
  /// min(1 s, max(10 ms, timeout / 10)). Env: RINGFENCE_HEARTBEAT_MS=<ms>|off.
  std::optional<std::chrono::milliseconds> heartbeat_interval;
  /// The interval in effect: `heartbeat_interval` or the default for `timeout` (0 = off).
  std::chrono::milliseconds effective_heartbeat() const noexcept {
    if (heartbeat_interval) return *heartbeat_interval;
    return std::clamp<std::chrono::milliseconds>(timeout / 10, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
  }

  /// Returns `base` with every `RINGFENCE_*` variable of `env` applied. Unknown `RINGFENCE_*`
  /// names are logged as warnings by the caller (see `unknown_variables`). A malformed value
  /// throws `InvalidUsage` naming the variable and the value.
  static CommOptions from_env(const Environment& env, CommOptions base);
  /// Same, starting from default options.
  static CommOptions from_env(const Environment& env);
  /// Same, reading the process environment once.
  static CommOptions from_env();
};

}  // namespace ringfence
