#pragma once
/// \file transport.hpp
/// The transport SPI (design §3): one-sided writes and ordered signals over per-peer links.
///
/// Control plane (`Transport`, `PendingLink`): may block, allocate and throw.
/// Data plane (`Link`): returns `Status`, never throws, never allocates, and is used from one
/// thread at a time (the rank's progress thread or the thread in a blocking collective).
///
/// Setup sequence, identical for every transport:
/// `can_reach` → `listen` → exchange `ListenHandle::address()` bytes through the bootstrap
/// store → `connect` on both ends → `PendingLink::try_finish` until Ok (against a deadline) →
/// `register_memory` / exchange `MemoryRegion::key()` / `import_region`.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <ringfence/status.hpp>
#include <ringfence/types.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ringfence {

class Logger;
struct CommOptions;
using Bytes = std::vector<std::byte>;

/// Identity of one rank as transports see it.
struct PeerInfo {
  int rank = -1;        ///< global rank
  std::string host_id;  ///< equal strings = same host (shared memory possible)
  std::int32_t pid = 0; ///< process id on that host
  /// PCI bus id of this rank's GPU in `health::normalize_pci_bus_id` form ("0000:3b:00.0"),
  /// read from NVML for `CommOptions::health_gpu`; empty = unknown (no GPU named, no NVML).
  std::string gpu_bus_id;
  /// Normalised bus ids at the far ends of that GPU's active NVLinks (NVML), in link order;
  /// the planner makes NVLink-joined ranks ring neighbours (`plan_home_ring`). Links to
  /// NVSwitches are not listed here but counted in `nvswitch_links`.
  std::vector<std::string> nvlink_bus_ids;
  /// Active NVLinks of that GPU whose far end is an NVSwitch (NVML): two GPUs of one host that
  /// both have some reach each other through the switches (HGX / DGX boards). 0 = none or unknown.
  std::uint32_t nvswitch_links = 0;
  /// The one CPU this rank may run on (the affinity mask of the thread that created the
  /// communicator), when that mask holds exactly one
  /// (a launcher bound it: `ringfence-run --bind-to core`, `mpirun --bind-to core`, `srun
  /// --cpu-bind=cores`); -1 when it may run on several. The communicator spins longer in its
  /// waits where every rank of a host is bound to a CPU of its own (`CommOptions::spin`).
  std::int32_t cpu = -1;
};

/// Serialises a `PeerInfo` for the bootstrap store.
Bytes serialize(const PeerInfo& info);
/// Parses bytes made by `serialize(PeerInfo)`; throws `InvalidUsage` on malformed input.
PeerInfo deserialize_peer_info(std::span<const std::byte> bytes);

/// Whether, and how well, a transport connects two ranks.
struct Reachability {
  bool ok = false;               ///< the transport can connect these ranks
  double bandwidth_gbps = 0.0;   ///< expected bandwidth, GB/s (1e9 bytes/s), one direction
  double latency_us = 0.0;       ///< expected one-way latency, microseconds
  /// Smallest pipeline chunk that suits this transport (0 = no preference): the communicator
  /// uses the largest preference of its links when it exceeds `CommOptions::chunk_bytes`.
  std::size_t min_chunk_bytes = 0;
  std::string reason;            ///< why not, when `ok` is false
};

/// A 64-byte-aligned signal word living in registered memory. Writers (the peer, through
/// `Link::signal`) store `value` with release semantics after all earlier writes on the link;
/// the owner waits with `Link::wait`. `waiters` lets signallers skip the wake-up syscall when
/// nobody sleeps. Values are 32-bit counters compared with wrap-around (`reached`).
struct alignas(64) SignalFlag {
  std::atomic<std::uint32_t> value{0};    ///< last signalled value
  std::atomic<std::uint32_t> waiters{0};  ///< threads sleeping on `value`
};
static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "signal flags must be lock-free in shared memory");

/// True when counter `value` has reached `target` (wrap-around aware, window 2^31).
constexpr bool reached(std::uint32_t value, std::uint32_t target) noexcept {
  return static_cast<std::int32_t>(value - target) >= 0;
}

/// Memory registered with one transport. Move-only RAII: destruction deregisters.
/// `key()` is the opaque byte string a peer passes to `Transport::import_region`.
class MemoryRegion {
 public:
  /// Transport-specific state; each transport derives its own.
  class Impl {
   public:
    virtual ~Impl() = default;
    /// Bytes that let a peer address this region.
    virtual Bytes key() const = 0;
  };
  MemoryRegion() = default;
  /// Wraps `impl` describing `bytes` bytes at `ptr` of `kind`.
  MemoryRegion(std::unique_ptr<Impl> impl, void* ptr, std::size_t bytes, MemoryKind kind)
      : impl_(std::move(impl)), ptr_(ptr), bytes_(bytes), kind_(kind) {}
  /// Opaque key for the peer (empty for an empty region).
  Bytes key() const { return impl_ ? impl_->key() : Bytes{}; }
  /// Start of the region.
  void* data() const noexcept { return ptr_; }
  /// Length in bytes.
  std::size_t size() const noexcept { return bytes_; }
  /// Host or device.
  MemoryKind kind() const noexcept { return kind_; }
  /// The transport's state (to be downcast by the transport that made it).
  Impl* impl() const noexcept { return impl_.get(); }
  /// True when a region is held.
  explicit operator bool() const noexcept { return impl_ != nullptr; }

 private:
  std::unique_ptr<Impl> impl_;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  MemoryKind kind_ = MemoryKind::Host;
};

/// A peer's region, imported from its key. Move-only; destruction unmaps.
class RemoteRegion {
 public:
  /// Transport-specific state; each transport derives its own.
  class Impl {
   public:
    virtual ~Impl() = default;
  };
  RemoteRegion() = default;
  /// Wraps `impl` describing a remote region of `bytes` bytes.
  RemoteRegion(std::unique_ptr<Impl> impl, std::size_t bytes) : impl_(std::move(impl)), bytes_(bytes) {}
  /// Length in bytes; writes beyond it are rejected with InvalidUsage.
  std::size_t size() const noexcept { return bytes_; }
  /// The transport's state.
  Impl* impl() const noexcept { return impl_.get(); }
  /// True when a region is held.
  explicit operator bool() const noexcept { return impl_ != nullptr; }

 private:
  std::unique_ptr<Impl> impl_;
  std::size_t bytes_ = 0;
};

/// One one-sided put: `bytes` bytes from `src` into `dst` at `dst_offset`.
/// The CRC32C of a write's bytes, asked of the link by the engine when checksums are on: a
/// link whose `write` copies the bytes through the CPU computes it with the copy
/// (`staging_copy_crc`) and sets `done`; any other link leaves it alone and the engine reads the
/// bytes once more itself. Always the CRC of the source, never of what landed.
struct WriteCrc {
  std::uint32_t value = 0;
  bool done = false;
};

/// A second destination for a write's bytes, in the writer's own memory: a sender's own block
/// that belongs both in its output and in a peer's slot (an out-of-place allgather, a
/// broadcast's root). A link whose `write` copies through the CPU stores the bytes there too,
/// from the same loads, and sets `done`, both within the call; any other link leaves it alone
/// and the engine copies them itself. `dst` overlaps neither the source nor the peer's region.
struct WriteAlso {
  void* dst = nullptr;
  bool done = false;
};

struct WriteOp {
  const void* src = nullptr;                ///< local source (registered or not)
  const MemoryRegion* src_region = nullptr; ///< registration covering `src`, when there is one
  const RemoteRegion* dst = nullptr;        ///< peer region imported by this link's transport
  std::size_t dst_offset = 0;               ///< byte offset in `dst`
  std::size_t bytes = 0;                    ///< length in bytes
  std::uint64_t wr_id = 0;                  ///< echoed in the completion
  WriteCrc* crc = nullptr;                  ///< optional: see WriteCrc (a link may ignore it)
  /// Hint: another core reads these bytes next, and on this host streaming (non-temporal)
  /// stores hand them over faster than the cache does (`CommOptions::stream_writes`). A link
  /// that copies through the CPU may write them so (shm: `copy_bytes_stream`, and
  /// `staging_copy_crc_stream` for `crc`); any other link ignores it.
  bool stream = false;
  WriteAlso* also = nullptr;  ///< optional: see WriteAlso (a link may ignore it)
};

/// One signal: store `value` into the `SignalFlag` at `offset` of `dst`; visible at the peer
/// only after every earlier write on the same link.
struct SignalOp {
  const RemoteRegion* dst = nullptr;  ///< peer region holding the flag, imported by this link's transport
  std::size_t offset = 0;             ///< byte offset of the SignalFlag (64-aligned)
  std::uint32_t value = 0;            ///< value to store
  std::uint64_t wr_id = 0;            ///< echoed in the completion
  /// Optional: `with_bytes` bytes (at most kSignalCarriesMaxBytes) stored at `with_offset` in
  /// `dst` before the flag, so the flag's store publishes them too: the engine's chunk trailer,
  /// which lies in the flag's own line, in one operation with the flag instead of a write and a
  /// signal. Only on links whose transport sets TransportTraits::signals_carry_bytes. The bytes
  /// are read during the call or, where the link defers the signal, until it completes.
  const void* with = nullptr;
  std::size_t with_offset = 0;  ///< byte offset in `dst` of the carried bytes
  std::uint32_t with_bytes = 0;  ///< 0: nothing carried
  /// The link may leave waking a waiter that sleeps on the flag until its next `wait` or
  /// `flush_wakes` (the caller promises one before it blocks or returns to its user), so the
  /// signal need not wait for the flag's line to be published: the engine's chunk and credit
  /// signals, whose sender goes on computing or waits next
  /// (docs/protection-cost-small-calls.md).
  bool defer_wake = false;
};
/// The most bytes a signal carries (SignalOp::with): a trailer's 12 and room to spare, small
/// enough to store in two moves (transport_util::store_carried).
inline constexpr std::uint32_t kSignalCarriesMaxBytes = 16;

/// Completion of one write or signal.
struct Completion {
  std::uint64_t wr_id = 0;  ///< the operation's id
  Status status;            ///< Ok, or why it failed (Fenced after `fence`)
};

/// Lifecycle state of a link.
enum class LinkState : std::uint8_t { Connecting, Up, Degraded, Fenced, Closed };
/// "connecting", "up", "degraded", "fenced", "closed".
std::string_view to_string(LinkState state) noexcept;

/// Why a link was fenced.
enum class FenceReason : std::uint8_t { User, HealthPolicy, Error, Shutdown };

/// Counters every link keeps for the health layer and `ringfence-health`. Updated only by the
/// link's owning thread; read racily (relaxed) by observers.
struct LinkStats {
  std::atomic<std::uint64_t> bytes_written{0};  ///< payload bytes put
  std::atomic<std::uint64_t> writes{0};         ///< write operations
  std::atomic<std::uint64_t> signals{0};        ///< signal operations
  std::atomic<std::uint64_t> errors{0};         ///< failed operations
  std::atomic<std::uint64_t> retries{0};        ///< re-sent operations
  std::atomic<std::uint64_t> wait_ns{0};        ///< time spent waiting on this peer's signals
  std::atomic<std::uint64_t> yields{0};         ///< `sched_yield` calls while spinning for them (shm: RINGFENCE_SHM_YIELD)
  /// Operations the transport retried after a deadline passed and then completed (e.g. a tcp
  /// send or reconnect); fed to the health policy's "repeated timeouts" rule. An operation that
  /// fails its collective is not counted here: it fails the call. shm never times out.
  std::atomic<std::uint64_t> timeouts{0};
  /// Payload bytes of the writes the link timed itself, from start to landing, and the time
  /// those writes took (cuda_ipc: CUDA events around each device copy of at least 32 KiB). The
  /// health layer's bandwidth evidence for links whose `write()` only enqueues the transfer
  /// (`Link::times_writes()`); 0 for links the executor times.
  std::atomic<std::uint64_t> timed_bytes{0};
  std::atomic<std::uint64_t> timed_ns{0};
};

/// A connection to one peer. Data plane: every method is noexcept and allocation-free.
class Link {
 public:
  virtual ~Link() = default;
  /// Starts a one-sided put. Ok = accepted (a completion follows from `poll`); errors are
  /// returned at once (InvalidUsage for out-of-bounds, PeerUnreachable, Fenced).
  [[nodiscard]] virtual Status write(const WriteOp& op) noexcept = 0;
  /// Starts a signal, ordered after every earlier write on this link.
  [[nodiscard]] virtual Status signal(const SignalOp& op) noexcept = 0;
  /// Wakes the waiters that signals with `SignalOp::defer_wake` left sleeping: the engine calls
  /// it before a call returns (`wait` does it first as well). Default: nothing (links whose
  /// signals wake at once). A link that wraps another forwards it.
  virtual void flush_wakes() noexcept {}
  /// Drives progress and returns up to `out.size()` completions in `out[0..n)`. The only
  /// progress call; never blocks.
  [[nodiscard]] virtual Status poll(std::span<Completion> out, std::size_t& n) noexcept = 0;
  /// Waits, for at most `max`, until the local `flag` reaches `target` (written by this link's
  /// peer). Ok = reached; InProgress = not yet (call again; the caller owns the deadline);
  /// PeerUnreachable when the peer is known to be gone. May sleep (futex, epoll).
  [[nodiscard]] virtual Status wait(SignalFlag& flag, std::uint32_t target,
                                    std::chrono::nanoseconds max) noexcept = 0;
  /// Fences the link: idempotent; pending operations complete with `Fenced`, later ones fail.
  virtual void fence(FenceReason why) noexcept = 0;
  /// True when `reopen()` can undo a `FenceReason::HealthPolicy` fence (the hardware path is
  /// still there and the transport can resume). Default: false (the link stays fenced).
  virtual bool can_reopen() const noexcept { return false; }
  /// Undoes a health-policy fence so the link carries traffic again (a fenced link that served
  /// its cool-down and whose counters are clean is readmitted into the plan). Only called when
  /// `can_reopen()` is true and no operation is pending.
  virtual void reopen() noexcept {}
  /// Current state. Called from any thread (`Communicator::links()`), concurrently with the
  /// link's own operations and `fence()`: keep the state in an atomic.
  virtual LinkState state() const noexcept = 0;
  /// Peer rank.
  virtual int peer() const noexcept = 0;
  /// Counters.
  virtual const LinkStats& stats() const noexcept = 0;
  /// True when the link times its writes itself (`LinkStats::timed_bytes`, `timed_ns`): its
  /// `write()` only enqueues the transfer, so the executor's clock around the call would measure
  /// nothing. Default: false (the executor times `write()` for the bandwidth evidence).
  virtual bool times_writes() const noexcept { return false; }
  /// Drives progress (as `poll` does) and returns true when no operation of the link is left in
  /// flight: every write landed and every signal was stored, though completions may still wait
  /// for `poll`. The engine's device regions wait for it at the end of a call, so nothing is
  /// left behind a poll that may not come. Default: true (operations that finish within
  /// `write()` / `signal()` or progress without polls).
  virtual bool idle() noexcept { return true; }
};

/// A connection being established; polled until done. Never blocks.
class PendingLink {
 public:
  virtual ~PendingLink() = default;
  /// Ok (and `out` set) when connected; InProgress to call again; an error otherwise.
  [[nodiscard]] virtual Status try_finish(std::unique_ptr<Link>& out) noexcept = 0;
};

/// Listening endpoint of one transport in one rank. `address()` travels to peers.
class ListenHandle {
 public:
  virtual ~ListenHandle() = default;
  /// Bytes a peer passes to `Transport::connect`.
  virtual Bytes address() const = 0;
};

/// Per-communicator facts given to a transport factory.
struct TransportContext {
  PeerInfo self;                      ///< this rank
  int size = 1;                       ///< ranks in the communicator
  const CommOptions* options = nullptr;  ///< communicator options (outlive the transport)
  const Logger* log = nullptr;        ///< communicator logger (outlives the transport)
};

/// What a transport can do, as the engine needs to know it: one description per transport
/// instead of a yes/no virtual per trait. Returned by `Transport::traits()`.
struct TransportTraits {
  /// A peer's write into a registered plain user buffer costs no more than a write into staging
  /// memory (the receiver places the bytes itself, as a socket transport reads straight into
  /// the buffer), so the engine lets peers write final values into user buffers without
  /// `CommOptions::direct_write_user_min_bytes`. (Shared memory needs cross-memory attach.)
  bool cheap_user_writes = false;
  /// Links move data through memory both ends map: such a transport only joins ranks of one
  /// host, at memory speed. A communicator whose transports all lack it has only network links,
  /// and the tuner uses its network figures.
  bool shares_memory = false;
  /// `write` moves device memory: device sources, and destinations registered as
  /// `MemoryKind::Device` whose staging slots `allocate(bytes, MemoryKind::Device)` made. The
  /// engine's device regions run only over such transports (docs/device.md).
  bool writes_device_memory = false;
  /// `write` into a staging slot copies the bytes through the CPU and fills `WriteOp::crc` with
  /// that copy (`staging_copy_crc`). Then the engine leaves the CRC of a result it is about to
  /// send to the write instead of folding it in the reduction that made it: a copy hides the
  /// folding behind its stores or, up to `kCopyThenCrcMaxBytes`, folds from the cache right after
  /// them; a reduction in the cache does not hide it (docs/protection-cost.md).
  bool crc_in_writes = false;
  /// `signal` stores the bytes a SignalOp carries (SignalOp::with) before its flag, in one
  /// operation. Then a checked chunk's trailer goes with the chunk's data signal: a small call
  /// saves a whole write (its bookkeeping and completion), which was most of what the trailer
  /// cost it (docs/protection-cost-small-calls.md).
  bool signals_carry_bytes = false;
  /// A peer's `signal` is a plain store into the memory of our flag, so polling the flag sees
  /// it with no call into the link (no progress thread, socket read or copy completion in
  /// between). Where the engine must watch a flag and other work at once it then polls the flag
  /// itself instead of waiting in `Link::wait`, which watches one flag (a call re-sending damaged
  /// chunks: RingRunner::poll_serving_nacks). A transport whose signals arrive through its own
  /// progress leaves it false: there the link's wait is the faster way to see them.
  bool flags_stored_by_peer = false;
  /// Transports a link of this one may move to when the health layer must fence it, in order of
  /// preference; the default fallback table (`CommOptions::fallbacks`) is built from these.
  std::vector<std::string> fallbacks;
  /// How far apart the speeds of healthy links of this transport may lie by nature. The health
  /// layer judges a link slow only when it is slower than the job's other links on the
  /// transport by more than this as well as by `CommOptions::health_slow_factor`. Links the CPU
  /// copies (shared memory, sockets) run at the speed of the cores and caches they happen to
  /// share: 6.7x apart on one healthy 4-rank job on a 2-core VM, hence 10 for them; hardware
  /// links of one kind (NVLink, InfiniBand) leave it at 1.
  double speed_spread = 1.0;
};

/// One transport instance per communicator. Control plane: thread-safe, may block and throw.
class Transport {
 public:
  virtual ~Transport() = default;
  /// Short stable name ("shm", "tcp", ...), as used in RINGFENCE_TRANSPORTS.
  virtual std::string_view name() const noexcept = 0;
  /// Whether this transport can connect `self` and `peer`, and how well.
  virtual Reachability can_reach(const PeerInfo& self, const PeerInfo& peer) const = 0;
  /// Allocates `bytes` of memory of `kind` that this transport can share with peers without
  /// copies; nullptr when it has no such allocator. Freed with `deallocate`.
  virtual void* allocate(std::size_t bytes, MemoryKind kind) { (void)bytes; (void)kind; return nullptr; }
  /// Frees memory from `allocate`; false when `ptr` is not this transport's.
  virtual bool deallocate(void* ptr) noexcept { (void)ptr; return false; }
  /// What this transport can do (see `TransportTraits`). Default: none of the traits. Never throws.
  virtual const TransportTraits& traits() const noexcept;
  /// Registers `bytes` at `ptr` so peers can address it. The region must outlive its use.
  virtual MemoryRegion register_memory(void* ptr, std::size_t bytes, MemoryKind kind) = 0;
  /// Imports a peer's region from its key. Throws `InvalidUsage` on a malformed key.
  virtual RemoteRegion import_region(std::span<const std::byte> peer_key) = 0;
  /// Opens this rank's listening endpoint.
  virtual std::unique_ptr<ListenHandle> listen() = 0;
  /// Starts connecting to `peer`, whose listen address is `peer_address`. Both ends call it;
  /// the transport decides which side dials. `local` is this rank's own listen handle.
  virtual std::unique_ptr<PendingLink> connect(ListenHandle& local, const PeerInfo& peer,
                                               std::span<const std::byte> peer_address) = 0;
};

}  // namespace ringfence
