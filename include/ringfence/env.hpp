#pragma once
/// \file env.hpp
/// The one place ringfence reads environment variables. `Environment::from_process()` takes a
/// snapshot of `environ`; everything else parses a snapshot, so tests pass fake environments.
///
/// | variable | meaning | default |
/// |---|---|---|
/// | RINGFENCE_RANK, RINGFENCE_WORLD_SIZE, RINGFENCE_LOCAL_RANK | explicit launch (ringfence-run) | — |
/// | RINGFENCE_STORE_ADDR | `host:port` of the bootstrap store | MASTER_ADDR:MASTER_PORT |
/// | RINGFENCE_STORE_HOST | 1 = this rank hosts the store (else rank 0 does unless the launcher hosts it) | — |
/// | RINGFENCE_JOB_TOKEN | 32 hex digits shared by all ranks; authenticates store peers | derived from the job id |
/// | RINGFENCE_TIMEOUT_MS | wait deadline in ms (> 0) | 60000 |
/// | RINGFENCE_CHUNK_BYTES | pipeline chunk size in bytes (> 0, K/M/G suffixes) | 262144 |
/// | RINGFENCE_SLOTS | chunks in flight per link (1..64) | 4 |
/// | RINGFENCE_ALGO | allreduce algorithm: auto, ring, tree, direct, oneshot | auto |
/// | RINGFENCE_CARRY_MAX_BYTES | two-rank allreduces up to this size travel in the call fingerprint (0..4096, off) | 4096 |
/// | RINGFENCE_STREAM_WRITES | auto/on/off: chunks into shared-memory slots with streaming stores (auto: probed at setup, tried again while the job runs, docs/tuning.md) | auto |
/// | RINGFENCE_TUNER_ALPHA_US, RINGFENCE_TUNER_GBPS | tuner model: per-hop cost (us), link bandwidth (GB/s) | 6, 2 |
/// | RINGFENCE_DIRECT_WRITE_MIN_BYTES | from this size, final values go straight into `alloc()`ed outputs; `off` disables | 256K |
/// | RINGFENCE_DIRECT_WRITE_USER_MIN_BYTES | the same for user buffers, via cross-memory attach | off |
/// | RINGFENCE_P2P_DIRECT_USER_MIN_BYTES | send/recv (larger than the slots hold) and alltoall write straight into user receive buffers from this size (cross-memory attach); `off` disables | off |
/// | RINGFENCE_ALLTOALL_DIRECT_USER_MIN_BYTES | alltoall with 3+ ranks and checksums off writes straight into user receive buffers from this size; `off` disables | 256K |
/// | RINGFENCE_CHANNELS | parallel channels (lanes with their own links and worker thread) for large ring collectives; 0 = auto (cores ÷ local ranks, ≤ 4; ≥ 2 for network-only links on a host not oversubscribed) | 0 |
/// | RINGFENCE_CHANNEL_MIN_BYTES | smallest slice per channel | 1M |
/// | RINGFENCE_CHECKSUM | on/off: CRC32C per chunk, verified, re-sent on mismatch | on |
/// | RINGFENCE_HEALTH | on/off: fence agreements (checksum errors, counters, slow links, stragglers) | on |
/// | RINGFENCE_HEALTH_AGREE_BYTES | an agreement also runs after this many collective bytes (0 = by count only) | 32M |
/// | RINGFENCE_HEALTH_SLOW_FACTOR | a link this many times slower than its transport's median link (twice in a row) is fenced | 3 |
/// | RINGFENCE_FAULT | fault injection rules (grammar in fault.hpp) | none |
/// | RINGFENCE_HEALTH_AGREE_EVERY | collectives between fence agreements (0 = never); more (×2…×16) while they take less than the next variable's time and all is well | 64 |
/// | RINGFENCE_HEALTH_AGREE_MIN_US | quiet agreements are paced to about this many microseconds apart (0 = by count only) | 10000 |
/// | RINGFENCE_FALLBACK | `from:to` transport pairs a link that must be fenced moves along instead (docs/health.md), or `none` | what the selected transports declare |
/// | RINGFENCE_HEALTH_FENCE_CRC_ERRORS | corrupted chunks from a peer within the checksum storm window (10 s) that make a rank propose a fence | 3 |
/// | RINGFENCE_HEALTH_LOG | append health events as JSON lines to this file | none |
/// | RINGFENCE_HEALTH_PROMETHEUS | Prometheus text file per rank (`{rank}` in the path) | none |
/// | RINGFENCE_HEALTH_LEDGER | health ledger shared by jobs: fences outlive the job (docs/health.md) | none |
/// | RINGFENCE_HEALTH_LEDGER_QUARANTINE_S | how long a fenced link in the ledger stays fenced for later jobs | 86400 |
/// | RINGFENCE_HEALTH_PROMETHEUS_INTERVAL_MS | refresh of that file while collectives run (0: agreements and close only) | 2000 |
/// | RINGFENCE_HEALTH_CONFIG | file of health thresholds and timings (`key = value`, see health/config.hpp) | none |
/// | RINGFENCE_SYSFS_ROOT | root of the sysfs tree the health sources read | / |
/// | RINGFENCE_CUDART | CUDA runtime library for the stream-ordered calls | libcudart.so.13, .12, .11.0, .so |
/// | RINGFENCE_DEVICE_STAGING_SLOTS | stream-ordered calls in flight per communicator (pinned staging buffers) | 8 |
/// | RINGFENCE_DEVICE_REGIONS | auto/on/off: stream-ordered collectives run the engine on device memory (docs/device.md) | auto |
/// | RINGFENCE_CUDA_KERNELS | the device reduction kernels' module | libringfence_kernels.so next to the library, then the loader's search |
/// | RINGFENCE_NVML_LIBRARY | NVML library to dlopen | libnvidia-ml.so.1 |
/// | RINGFENCE_HEALTH_WINDOW_MS | sliding window of counter deltas | 60000 |
/// | RINGFENCE_HEALTH_INTERVAL_MS | background sampling period of the counter sources (0 = off) | 1000 |
/// | RINGFENCE_HEALTH_LINK_MAP | link -> hardware counters, e.g. 0-1=nvml:0:2;1-2=ib:mlx5_0:1, or `auto` (NVLink topology) | none |
/// | RINGFENCE_HEALTH_GPU | NVML index of this rank's GPU (the planner's NVLink preference, the `auto` link map), or `cuda` (the current CUDA device, found in NVML by bus id) | none |
/// | RINGFENCE_DIGEST_EVERY | compare output digests across ranks every N collectives (0 = never) | 0 |
/// | RINGFENCE_DIGEST_ACTION | what a digest mismatch does: error, fence, log | error |
/// | RINGFENCE_TRANSPORTS | comma list restricting and ordering transports | all |
/// | RINGFENCE_LOG | error, warn, info, debug, trace (any case) | warn |
/// | RINGFENCE_LOG_FILE | log lines to this file, appended; `%h` host, `%p` pid, `%r` rank | stderr |
/// | RINGFENCE_LOG_TIMESTAMP | on: every log line starts with the UTC time | off |
/// | RINGFENCE_HOST_ID | host identity override | hostname + boot id |
/// | RINGFENCE_<TRANSPORT>_* | a transport's own settings (`CommOptions::transport_settings`): see transports/<name>/README.md | |
///
/// Launchers understood by `detect_launch`: ringfence-run (RINGFENCE_*), torchrun (RANK,
/// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Open MPI
/// (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE) and Slurm (SLURM_PROCID, SLURM_NTASKS,
/// SLURM_LOCALID). `RINGFENCE_*` values override the launcher's. See docs/launching.md.

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ringfence {

/// An immutable snapshot of environment variables.
class Environment {
 public:
  /// An empty environment.
  Environment() = default;
  /// An environment holding exactly `vars` (for tests and embedding).
  explicit Environment(const std::map<std::string, std::string>& vars) : vars_(vars.begin(), vars.end()) {}
  /// Snapshot of the process environment. This is the only function in ringfence that reads
  /// `environ`. Not thread-safe against concurrent `setenv` (no getenv is).
  static Environment from_process();

  /// The value of `name`, or nullopt when unset.
  std::optional<std::string> get(std::string_view name) const;
  /// True when `name` is set (even to an empty string).
  bool has(std::string_view name) const { return get(name).has_value(); }
  /// All variables whose name starts with `prefix`.
  std::vector<std::string> names_with_prefix(std::string_view prefix) const;

 private:
  std::map<std::string, std::string, std::less<>> vars_;
};

/// `RINGFENCE_*` variables in `env` that ringfence does not know (likely typos): neither a core
/// option nor one of `transport_variables`, which callers take from the registry their
/// communicators use (`TransportRegistry::setting_variables()`; no default, since without it
/// every transport setting would read as a typo). The communicator logs a warning for each.
std::vector<std::string> unknown_variables(const Environment& env, const std::vector<std::string>& transport_variables);

class Logger;
/// Warns on `log`, once per name, "`who`ignoring unknown environment variable RINGFENCE_X
/// (typo?)" for each of `unknown_variables(env, transport_variables)`: what every entry point that
/// reads the environment (Communicator::from_env, the NCCL shim, the PyTorch backend) tells the
/// user whose misspelt setting did not take effect. `who` prefixes the line ("nccl shim: ").
void warn_unknown_variables(const Logger& log, const Environment& env, const std::vector<std::string>& transport_variables,
                            std::string_view who = {});

/// Parses a positive byte count with an optional K/M/G (binary) suffix: "65536", "64K", "1M".
/// Throws `InvalidUsage` naming `what` on a malformed or out-of-range value.
std::size_t parse_bytes(std::string_view text, std::string_view what);

/// A random job token shared by every rank of a job; authenticates bootstrap-store peers.
using JobToken = std::array<std::uint8_t, 16>;

/// Which launcher set the variables `detect_launch` used.
enum class Launcher : std::uint8_t { Ringfence, Torchrun, OpenMpi, Slurm };

/// "ringfence-run", "torchrun", "openmpi", "slurm".
std::string_view to_string(Launcher launcher) noexcept;

/// Everything a rank needs to join a job, as read from the environment.
struct LaunchInfo {
  Launcher launcher = Launcher::Ringfence;  ///< where rank/size came from
  int rank = 0;                             ///< global rank, 0 <= rank < size
  int size = 1;                             ///< number of ranks
  int local_rank = 0;                       ///< rank among the ranks of this host
  int local_size = 0;                       ///< ranks on this host; 0 = unknown
  std::string store_host;                   ///< bootstrap store host name or address
  std::uint16_t store_port = 0;             ///< bootstrap store TCP port
  bool host_store = false;                  ///< this process must host the store
  JobToken token{};                         ///< job token (explicit or derived)
  bool token_is_derived = false;            ///< token derived from job ids: not secret
};

/// Reads launch variables (see the table above). Throws `InvalidUsage` naming the variable when
/// one is malformed, when rank/size are missing, or when no store address can be found.
LaunchInfo detect_launch(const Environment& env);

/// Formats a token as 32 lower-case hex digits.
std::string to_hex(const JobToken& token);
/// Parses 32 hex digits; nullopt otherwise.
std::optional<JobToken> parse_token(std::string_view hex) noexcept;

}  // namespace ringfence
