#pragma once
/// \file communicator.hpp
/// `Communicator`: the user-facing object. One per rank per group of ranks.
///
/// Thread-safety: a communicator is used by one thread at a time (like an NCCL communicator);
/// `links()`, `link_table()` and `async_error()` may be called from any thread.
/// Blocking: collectives block the calling thread until the local result is complete, and
/// progress on the calling thread. Every wait is bounded by `CommOptions::timeout`.
/// Asynchronous: the `*_async` variants validate their arguments at once, queue the
/// collective and return a `Work`; one progress thread per communicator (started by the first
/// asynchronous call) runs the queue in issue order. A blocking call first waits for the
/// queued work, so the issue order is the execution order for every call (NCCL's stream
/// order). Buffers of queued work must stay valid until it completes.
/// Errors: argument errors throw `InvalidUsage` naming the argument and the rank; a dead or
/// stalled peer throws `TimeoutError` / `PeerUnreachableError` naming the peer and the link.
/// After a peer failure the communicator is unusable (every later call throws); destroy it.

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <ringfence/error.hpp>
#include <ringfence/events.hpp>
#include <ringfence/options.hpp>
#include <ringfence/plan.hpp>
#include <ringfence/registry.hpp>
#include <ringfence/store.hpp>
#include <ringfence/transport.hpp>
#include <ringfence/types.hpp>
#include <ringfence/work.hpp>
#include <string>
#include <vector>

namespace ringfence {

/// Snapshot of one link, for tables and tests.
struct LinkInfo {
  int rank = -1;             ///< local rank
  int peer = -1;             ///< peer rank
  std::string transport;     ///< transport name ("shm", ...)
  LinkState state = LinkState::Closed;
  std::uint64_t bytes_written = 0;  ///< payload bytes sent to the peer
  std::uint64_t writes = 0;         ///< write operations
  std::uint64_t signals = 0;        ///< signal operations
  std::uint64_t errors = 0;         ///< failed operations
  std::uint64_t retries = 0;        ///< chunks we re-sent because the peer found them corrupted
  std::uint64_t checksum_errors = 0;  ///< corrupted chunks received from the peer (checksum mode)
  double wait_ms = 0.0;             ///< time spent waiting on the peer, milliseconds
  /// Writes of at least 32 KiB are timed (the health layer's bandwidth evidence): their bytes
  /// and nanoseconds so far. Two readings a second apart give the link's recent GB/s.
  std::uint64_t timed_bytes = 0;
  std::uint64_t timed_ns = 0;       ///< see timed_bytes
  int channels_used = 0;            ///< channels (lanes, RINGFENCE_CHANNELS) whose link to the peer carried data
  /// A link of the device lane (stream-ordered collectives on device memory, docs/device.md
  /// "Device regions in the engine"; listed after the host lanes' links once it is built),
  /// not of the host lanes, which the other entries sum.
  bool device_lane = false;
};

/// One hardware counter the health policy reads for a mapped link (RINGFENCE_HEALTH_LINK_MAP):
/// an NVLink CRC/replay/recovery counter, an IB port error counter, a PCIe AER counter.
struct HardwareCounter {
  LinkId link;             ///< the communicator link it describes
  std::string source;      ///< "nvml", "ib" or "pcie"
  std::string device;      ///< GPU index, IB device or PCI address
  int port = 0;            ///< NVLink index or IB port (0 for device-wide counters)
  std::string name;        ///< the counter's name within its source
  std::optional<std::uint64_t> value;       ///< the last raw value read; nullopt = unreadable
  std::optional<std::uint64_t> window_sum;  ///< events in the policy's window; nullopt = unknown
};

/// A point-in-time view of the health layer of one rank.
struct HealthSnapshot {
  int rank = -1;
  std::uint64_t sequence = 0;   ///< collectives issued
  std::uint64_t epoch = 0;      ///< re-plans so far
  std::vector<int> ring;        ///< current ring order
  std::vector<LinkId> fenced;   ///< agreed fenced links
  std::vector<Relay> relays;    ///< fenced ring hops carried through a third rank
  std::uint64_t background_samples = 0;  ///< counter-source samples taken by the background sampler
  std::uint64_t agreements = 0;  ///< fence agreements run so far (0 with health off)
  /// Collectives from the last agreement to the next: `CommOptions::health_agree_every`, or a
  /// multiple of it while agreements are paced by time (`health_agree_min_interval`); 0 while
  /// agreements are off (health off, `health_agree_every` 0, or one rank).
  std::uint64_t agree_every = 0;
  std::vector<LinkInfo> links;  ///< this rank's links
  std::vector<HardwareCounter> counters;  ///< raw counters of this rank's mapped links (empty without a link map)
  /// Human-readable summary plus the link table.
  std::string table() const;
  /// Prometheus text exposition of the same facts (link state, traffic, checksum errors,
  /// re-sends, epoch, fences).
  std::string prometheus() const;
};

/// A group of ranks that run collectives together.
class Communicator {
 public:
  /// Joins a communicator of `size` ranks as `rank`, exchanging addresses through `store`,
  /// with transports from `registry` (filtered and ordered by `options.transports`).
  /// Blocks until every link to this rank's neighbours is up or `options.timeout` passes.
  /// Throws `InvalidUsage` (bad rank/size/options), `TimeoutError` (peers missing) or
  /// `Error` (no transport reaches a peer).
  Communicator(std::shared_ptr<Store> store, int rank, int size, const TransportRegistry& registry,
               CommOptions options = {});

  /// NCCL-style: joins through the TCP store named by `id` (rank 0 hosts it), using the
  /// built-in transports. Defined in `ringfence::builtin` (link `ringfence::all`).
  Communicator(const UniqueId& id, int rank, int size, CommOptions options = CommOptions::from_env());

  /// Joins using launcher variables (ringfence-run, torchrun, Open MPI, Slurm) and the built-in
  /// transports. Defined in `ringfence::builtin` (link `ringfence::all`).
  static Communicator from_env();

  /// Joins using a parsed launch description and `registry`. Hosts the TCP store when
  /// `launch.host_store` is true (the store then lives as long as this communicator).
  static Communicator from_launch(const LaunchInfo& launch, const TransportRegistry& registry,
                                  CommOptions options);

  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;
  /// Closes links and frees memory. Never blocks on peers for longer than a short bounded
  /// goodbye, and never throws.
  ~Communicator();

  /// This rank, 0 <= rank() < size().
  int rank() const noexcept;
  /// Number of ranks.
  int size() const noexcept;
  /// Effective options (after environment overrides).
  const CommOptions& options() const noexcept;

  /// Reduces `count` elements of `type` from every rank's `send` with `op` and leaves the
  /// result in every rank's `recv`. In place when `send == recv`; otherwise the buffers must not
  /// overlap. `count` may be 0. Both buffers hold `count * size_of(type)` bytes of host memory
  /// (user memory or `alloc()`ed). Every rank ends with bit-identical results.
  void allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op);

  /// Reduce-scatter: `send` holds `size()` blocks of `recvcount` elements; rank r receives
  /// block r reduced over every rank in `recv` (`recvcount` elements). In place (NCCL's
  /// convention) when `recv == send + rank() * recvcount * size_of(type)`; otherwise the
  /// buffers must not overlap.
  void reduce_scatter(const void* send, void* recv, std::size_t recvcount, DataType type, ReduceOp op);

  /// Allgather: rank r's `send` (`sendcount` elements) becomes block r of every rank's `recv`
  /// (`size()` blocks). In place when `send == recv + rank() * sendcount * size_of(type)`.
  void allgather(const void* send, void* recv, std::size_t sendcount, DataType type);

  /// Broadcast: `count` elements of the root's `send` land in every rank's `recv` (the root's
  /// too; in place when they are equal). `send` is only read on the root and may be null
  /// elsewhere.
  void broadcast(const void* send, void* recv, std::size_t count, DataType type, int root);

  /// Reduce: `count` elements reduced with `op` over every rank's `send` land in the root's
  /// `recv` (only written on the root; may be null elsewhere). In place when `send == recv`.
  void reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root);

  /// All-to-all: block j (`count` elements) of rank r's `send` lands in block r of rank j's
  /// `recv`; both hold `size()` blocks and must not overlap.
  void alltoall(const void* send, void* recv, std::size_t count, DataType type);

  /// Sends `count` elements to `peer` (which calls `recv` with the same count and type).
  /// Outside a group the call returns once the data left for the peer's staging slots (large
  /// messages wait for the peer to receive); inside `group_start()`/`group_end()` it is queued.
  /// Sends to ourselves are allowed when a matching `recv` from ourselves is in the same group.
  void send(const void* buf, std::size_t count, DataType type, int peer);
  /// Receives `count` elements from `peer` into `buf`. See `send`.
  void recv(void* buf, std::size_t count, DataType type, int peer);
  /// Starts a group: `send`/`recv` calls are queued until the matching `group_end()`, which runs
  /// them all at once, so any pattern (rings, exchanges, halos) completes without deadlock.
  /// Groups nest; collectives inside a group are refused.
  void group_start();
  /// Ends a group; at the outermost level, runs the queued transfers and returns when all are
  /// done. Operations between the same two ranks in the same direction match in call order.
  void group_end();

  /// Returns when every rank has entered the barrier.
  void barrier();

  /// A new communicator of the ranks not in `exclude` (renumbered in rank order), built
  /// through this communicator's bootstrap store. Every surviving rank calls it with the same
  /// list; excluded ranks must not (they may be dead, e.g. after a `PeerUnreachableError`).
  /// Works on a communicator that already failed. Links fenced here between two survivors stay
  /// fenced in the new plan. The store must still be reachable (under ringfence-run the
  /// launcher hosts it; a rank hosting it must not be excluded). Same options unless given.
  /// Throws `InvalidUsage` for a bad list (out of range, excludes everyone, or this rank),
  /// `TimeoutError` when a survivor does not join within the timeout.
  Communicator shrink(const std::vector<int>& exclude);
  /// See `shrink(exclude)`; the new communicator uses `options`.
  Communicator shrink(const std::vector<int>& exclude, CommOptions options);

  /// Splits the ranks like `ncclCommSplit` / `MPI_Comm_split`: ranks passing the same
  /// non-negative `color` form a new communicator, ranked by `key` and then by their rank here.
  /// Collective: every rank calls it (in the same order relative to other collectives); a rank
  /// passing a negative color takes part and gets `std::nullopt`. Built through this
  /// communicator's bootstrap store (which must still be reachable); links fenced here between
  /// two members stay fenced. Same options unless given. Throws like a collective (the colors
  /// travel in an allgather) and like the constructor.
  std::optional<Communicator> split(int color, int key);
  /// See `split(color, key)`; the new communicator uses `options`.
  std::optional<Communicator> split(int color, int key, CommOptions options);

  /// Asynchronous variants: same arguments and checks as the blocking calls (argument errors
  /// throw at once); the collective runs on the progress thread in issue order.
  Work allreduce_async(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op);
  /// See `reduce_scatter`.
  Work reduce_scatter_async(const void* send, void* recv, std::size_t recvcount, DataType type, ReduceOp op);
  /// See `allgather`.
  Work allgather_async(const void* send, void* recv, std::size_t sendcount, DataType type);
  /// See `broadcast`.
  Work broadcast_async(const void* send, void* recv, std::size_t count, DataType type, int root);
  /// See `reduce`.
  Work reduce_async(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root);
  /// See `alltoall`.
  Work alltoall_async(const void* send, void* recv, std::size_t count, DataType type);
  /// See `barrier`.
  Work barrier_async();
  /// Stream-ordered collectives on CUDA memory, like NCCL's (docs/device.md): the call checks
  /// its arguments, enqueues its work on `stream` and returns at once; later work on `stream`
  /// sees the result. Buffers may be device, managed or host memory (anything
  /// `cudaMemcpyAsync` with `cudaMemcpyDefault` accepts). Host-staged: the input is copied to
  /// pinned host memory on `stream`, the host collective runs on the progress thread in issue
  /// order with the other asynchronous calls, and the result is copied back on `stream`.
  /// Throws `CudaError` naming the rank when no CUDA runtime, driver or device is usable or a
  /// CUDA call fails, and like the blocking call for bad arguments. A failure after the call
  /// returned is reported by `async_error()` and the next call; the output is then undefined.
  void allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, CudaStream stream);
  /// Stream-ordered `reduce_scatter` (see the stream-ordered `allreduce`).
  void reduce_scatter(const void* send, void* recv, std::size_t recvcount, DataType type, ReduceOp op, CudaStream stream);
  /// Stream-ordered `allgather` (see the stream-ordered `allreduce`).
  void allgather(const void* send, void* recv, std::size_t sendcount, DataType type, CudaStream stream);
  /// Stream-ordered `broadcast` (see the stream-ordered `allreduce`); `send` is read on the root only.
  void broadcast(const void* send, void* recv, std::size_t count, DataType type, int root, CudaStream stream);
  /// Stream-ordered `reduce` (see the stream-ordered `allreduce`); `recv` is written on the root only.
  void reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root, CudaStream stream);
  /// Stream-ordered `alltoall` (see the stream-ordered `allreduce`).
  void alltoall(const void* send, void* recv, std::size_t count, DataType type, CudaStream stream);
  /// Stream-ordered `send` (see the stream-ordered `allreduce` and `send`), like `ncclSend`:
  /// inside `group_start()`/`group_end()` it is queued with the group's other stream-ordered
  /// send/recv, which must use the same `stream` (a group takes either host or stream-ordered
  /// transfers, not both); outside a group it runs alone. The group's send buffers are copied to
  /// staging on `stream`, the transfers run on the progress thread in issue order, and the
  /// received bytes are copied back on `stream`; the call returns at once.
  void send(const void* buf, std::size_t count, DataType type, int peer, CudaStream stream);
  /// Stream-ordered `recv` (see the stream-ordered `send`).
  void recv(void* buf, std::size_t count, DataType type, int peer, CudaStream stream);
  /// Pinned host staging bytes the stream-ordered calls hold (0 before the first one).
  std::size_t device_staging_bytes() const;
  /// How stream-ordered collectives run (decided by all ranks at the first one, see
  /// `CommOptions::device_regions`): "" before the first one, "device regions" (the engine on
  /// the user's device buffers over device transports), or "host-staged: rank R: <why not>".
  std::string device_path() const;

  /// Waits for every queued asynchronous call (rethrowing nothing: use each `Work`).
  void synchronize();

  /// Allocates `bytes` of memory shared with peers (zero-copy path). Host memory only for now.
  /// Throws `InvalidUsage` for unsupported kinds. Free with `free()` before destroying.
  void* alloc(std::size_t bytes, MemoryKind kind = MemoryKind::Host);
  /// Frees memory from `alloc()`. Throws `InvalidUsage` for foreign pointers.
  void free(void* ptr);

  /// Per-link counters and states (one entry per connected peer). Thread-safe.
  std::vector<LinkInfo> links() const;
  /// `links()` formatted as a table (like `nvidia-smi nvlink -e`).
  std::string link_table() const;

  /// The first error that broke this communicator, or Ok. Never throws; thread-safe. With the
  /// heartbeat on (`CommOptions::heartbeat_interval`) a peer that dies or stops is reported here
  /// within about `CommOptions::timeout` even while no call runs.
  Status async_error() const noexcept;

  /// Ends this rank's in-flight and queued work from any thread, like `ncclCommAbort`: a
  /// running call returns within about 50 ms and it and every later call throw `AbortedError`;
  /// `async_error()` reports `ErrorCode::Aborted`. With the heartbeat on, peers learn it within
  /// one heartbeat interval and fail with `PeerUnreachableError` naming this rank. Destroying
  /// the communicator afterwards does not wait for peers. Never throws.
  void abort() noexcept;
  /// Per-call deadline: collectives and transfers issued after this call wait at most `timeout`
  /// for a peer instead of `CommOptions::timeout`, until set again (zero restores the default).
  /// Queued asynchronous work keeps the value it was issued with. The heartbeat keeps
  /// `CommOptions::timeout`. Throws `InvalidUsage` for a negative value.
  void set_timeout(std::chrono::milliseconds timeout);

  /// Number of collectives issued so far (the call sequence number).
  std::uint64_t sequence() const noexcept;

  /// The current ring: ranks in ring order, starting at rank 0. Changes only at fence
  /// agreements, identically on every rank.
  std::vector<int> ring() const;
  /// Links fenced so far (agreed by every rank), in the order they were fenced.
  std::vector<LinkId> fenced_links() const;
  /// Fenced ring hops carried through a third rank (the ring and the reduction order stay).
  std::vector<Relay> relays() const;
  /// Plan epoch: 0 at start, +1 at every agreed re-plan.
  std::uint64_t epoch() const noexcept;
  /// Snapshot of ring, fences and links. Not synchronised with a collective running on another
  /// thread (counters may be mid-update), never blocks.
  HealthSnapshot health() const;
  /// Number of digest comparisons (see `CommOptions::digest_every`) that found a divergent rank.
  std::uint64_t digest_mismatches() const noexcept;
  /// Calls `callback` for every health event of this rank (replacing an earlier callback).
  /// `checksum_errors` events come at most once a second per link after the first; the counts
  /// held back are delivered when the communicator is destroyed (from its destructor).
  void on_health_event(EventCallback callback);

  struct Impl;

 private:
  explicit Communicator(std::unique_ptr<Impl> impl) noexcept;
  // The state, or InvalidUsage naming `call` on a moved-from communicator.
  Impl* live(const char* call) const;
  std::unique_ptr<Impl> impl_;
};

/// Formats `links` as a table with one row per link.
std::string format_link_table(const std::vector<LinkInfo>& links);

/// The built-in transports (shm, then tcp) in default priority order. Defined in
/// `ringfence::builtin`.
TransportRegistry builtin_transports();

}  // namespace ringfence
