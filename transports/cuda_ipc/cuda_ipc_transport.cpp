// CUDA IPC transports: `nvlink` (peer-to-peer copies) and `pcie` (copies staged through pinned
// host memory). Control plane (allocation, registration, IPC handles, streams, events) takes a
// mutex and may throw; the Link data path is noexcept and allocation-free: a write enqueues
// copies and records a pre-made event, a signal records an event and is stored into the peer's
// shm flag once the event completed (poll / wait).
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <ringfence/error.hpp>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/plan.hpp>
#include <ringfence/transport_util.hpp>
#include <ringfence/transports/cuda_ipc.hpp>
#include <ringfence/transports/shm.hpp>
#include <utility>

#include "cuda_api.hpp"

namespace ringfence::transports::cuda_ipc {
namespace {

using detail::CudaApi;
using transport_util::bump;

enum class Mode : std::uint8_t { Nvlink, Pcie };
enum class Tag : std::uint8_t { Device = 1, Host = 2 };

std::string_view mode_name(Mode m) noexcept { return m == Mode::Nvlink ? kNvlinkName : kPcieName; }

// ---- keys ------------------------------------------------------------------------------------
// Device region key: u8 tag (1), u8[3] pad, i32 pid, i32 device, u32 pad, u64 allocation base
// (in the owner's address space), u64 offset of the region in the allocation, u64 bytes, then
// the 64-byte CUDA IPC handle of the allocation. Host region key: u8 tag (2), then the inner shm
// transport's key.
constexpr std::size_t kDeviceKeyBytes = 40 + detail::kCudaIpcHandleBytes;

struct DeviceKey {
  std::int32_t pid = 0;
  std::int32_t device = 0;
  std::uint64_t base = 0;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  detail::CudaIpcHandle handle{};
};

Bytes encode(const DeviceKey& k) {
  Bytes out(kDeviceKeyBytes);
  out[0] = static_cast<std::byte>(Tag::Device);
  std::memcpy(out.data() + 4, &k.pid, 4);
  std::memcpy(out.data() + 8, &k.device, 4);
  std::memcpy(out.data() + 16, &k.base, 8);
  std::memcpy(out.data() + 24, &k.offset, 8);
  std::memcpy(out.data() + 32, &k.bytes, 8);
  std::memcpy(out.data() + 40, &k.handle, sizeof k.handle);
  return out;
}

DeviceKey decode_device_key(std::span<const std::byte> key, std::string_view who) {
  RINGFENCE_EXPECTS(key.size() == kDeviceKeyBytes, "{}: malformed device region key ({} bytes, expected {})", who, key.size(),
                    kDeviceKeyBytes);
  DeviceKey k;
  std::memcpy(&k.pid, key.data() + 4, 4);
  std::memcpy(&k.device, key.data() + 8, 4);
  std::memcpy(&k.base, key.data() + 16, 8);
  std::memcpy(&k.offset, key.data() + 24, 8);
  std::memcpy(&k.bytes, key.data() + 32, 8);
  std::memcpy(&k.handle, key.data() + 40, sizeof k.handle);
  RINGFENCE_EXPECTS(k.pid > 0 && k.device >= 0 && k.base != 0 && k.offset <= UINT64_MAX - k.bytes,
                    "{}: malformed device region key (pid {}, device {}, base {:#x}, offset {}, bytes {})", who, k.pid, k.device,
                    k.base, k.offset, k.bytes);
  return k;
}

// ---- shared state ----------------------------------------------------------------------------
struct Opened;

// What the transport and its links share (links may outlive the transport object).
struct Shared {
  Mode mode{};
  PeerInfo self;
  CudaApi api;
  int device = -1;         // this rank's current device at creation
  std::string why_not;     // empty when CUDA IPC is usable
  const Logger* log = nullptr;
  std::unique_ptr<Transport> inner;  // shm: host regions (flags), waits, liveness

  std::mutex mutex;
  std::map<std::uintptr_t, std::size_t> allocations;  // allocate(Device): base -> bytes
  std::map<std::pair<std::int32_t, std::uint64_t>, std::weak_ptr<Opened>> opened;  // (pid, base)

  std::string who() const { return fmt::format("rank {}: {}", self.rank, mode_name(mode)); }
  void require_usable() const {
    if (!why_not.empty()) throw CudaError(fmt::format("{}: no usable CUDA IPC: {}", who(), why_not), 0);
  }
  void check(int err, const char* call) const {
    if (err != detail::kCudaSuccess) throw CudaError(fmt::format("{}: {}", who(), api.describe(call, err)), err);
  }
};

// A peer allocation opened with cudaIpcOpenMemHandle; shared by every import of it, closed
// with the last one (which may outlive the transport: it keeps the loaded API alive).
struct Opened {
  std::shared_ptr<const Shared> owner;
  void* base = nullptr;
  Opened() = default;
  Opened(const Opened&) = delete;
  Opened& operator=(const Opened&) = delete;
  ~Opened() {
    if (base != nullptr) (void)owner->api.ipc_close_mem_handle(base);
  }
};

struct LocalRegion final : MemoryRegion::Impl {
  Bytes key_bytes;
  MemoryRegion inner;  // Host regions: the shm registration
  Bytes key() const override { return key_bytes; }
};

struct Remote final : RemoteRegion::Impl {
  Tag tag{};
  std::byte* ptr = nullptr;         // Device: start of the region in this process
  std::shared_ptr<Opened> opened;   // Device, from another process: keeps the mapping open
  RemoteRegion inner;               // Host: the shm import
};

// ---- Link ------------------------------------------------------------------------------------
class CudaLink final : public Link {
 public:
  CudaLink(std::shared_ptr<Shared> shared, int peer, std::unique_ptr<Link> inner)
      : shared_(std::move(shared)), api_(shared_->api), peer_(peer), inner_(std::move(inner)) {
    try {
      shared_->check(api_.stream_create(&stream_, detail::kCudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      for (auto& e : events_) shared_->check(api_.event_create(&e, detail::kCudaEventDisableTiming), "cudaEventCreateWithFlags");
      if (api_.event_elapsed_time != nullptr) {  // timing events: a pair per operation slot
        for (auto& e : timing_start_) shared_->check(api_.event_create(&e, 0), "cudaEventCreateWithFlags");
        for (auto& e : timing_end_) shared_->check(api_.event_create(&e, 0), "cudaEventCreateWithFlags");
      }
      if (shared_->mode == Mode::Pcie) {
        shared_->check(api_.stream_create(&stream_d2h_, detail::kCudaStreamNonBlocking), "cudaStreamCreateWithFlags");
        for (std::size_t i = 0; i < kPcieSlots; ++i) {
          shared_->check(api_.event_create(&copied_[i], detail::kCudaEventDisableTiming), "cudaEventCreateWithFlags");
          shared_->check(api_.event_create(&drained_[i], detail::kCudaEventDisableTiming), "cudaEventCreateWithFlags");
        }
        void* p = nullptr;
        shared_->check(api_.host_alloc(&p, kPcieSlots * kPcieChunkBytes, detail::kCudaHostAllocPortable), "cudaHostAlloc");
        bounce_ = static_cast<std::byte*>(p);
      }
    } catch (...) {
      release();
      throw;
    }
  }
  ~CudaLink() override { release(); }
  CudaLink(const CudaLink&) = delete;
  CudaLink& operator=(const CudaLink&) = delete;

  Status write(const WriteOp& op) noexcept override {
    if (RINGFENCE_UNLIKELY(fenced_)) return Status(ErrorCode::Fenced);
    const auto* dst = static_cast<const Remote*>(op.dst ? op.dst->impl() : nullptr);
    if (RINGFENCE_UNLIKELY(!dst || (!op.src && op.bytes > 0) || !transport_util::write_in_bounds(op)))
      return fail(ErrorCode::InvalidUsage);
    if (head_ - tail_ == kMaxPendingOps) return Status(ErrorCode::InProgress);
    const std::size_t at = head_ % kMaxPendingOps;
    Op& o = ring_[at];
    o = Op{op.wr_id, false, false, Status::ok(), nullptr, 0, 0};
    if (dst->tag == Tag::Host) {
      // Host destinations (flag blocks) take host sources only: the inner shm link memcpy's.
      if (src_on_device(op)) return fail(ErrorCode::InvalidUsage);
      const Status s = inner_->write(WriteOp{op.src, nullptr, &dst->inner, op.dst_offset, op.bytes, 0});
      drain_inner();
      if (!s.is_ok()) return s.in_progress() ? s : fail(s.code(), s.native());
      o.ready = true;
    } else if (op.bytes > 0) {
      std::byte* to = dst->ptr + op.dst_offset;
      // Large copies are timed between two events on `stream_` (pcie: the start waits for the
      // stream's earlier work, the end for the last second hop, so the span covers this copy).
      o.timed = timing_start_[0] != nullptr && op.bytes >= kTimedCopyBytes;
      o.bytes = op.bytes;
      int err = o.timed ? api_.event_record(timing_start_[at], stream_) : detail::kCudaSuccess;
      if (err == detail::kCudaSuccess)
        err = shared_->mode == Mode::Pcie && src_on_device(op) ? staged_copy(to, static_cast<const std::byte*>(op.src), op.bytes)
                                                                : api_.memcpy_async(to, op.src, op.bytes, detail::kCudaMemcpyDefault, stream_);
      if (err == detail::kCudaSuccess) err = api_.event_record(o.timed ? timing_end_[at] : events_[at], stream_);
      if (err != detail::kCudaSuccess) return fail(ErrorCode::Cuda, err);
    } else {
      o.ready = true;
    }
    ++head_;
    bump(stats_.writes, 1);
    bump(stats_.bytes_written, op.bytes);
    return Status::ok();
  }

  Status signal(const SignalOp& op) noexcept override {
    if (RINGFENCE_UNLIKELY(fenced_)) return Status(ErrorCode::Fenced);
    const auto* dst = static_cast<const Remote*>(op.dst ? op.dst->impl() : nullptr);
    if (RINGFENCE_UNLIKELY(!dst || dst->tag != Tag::Host || !transport_util::flag_in_bounds(op)))
      return fail(ErrorCode::InvalidUsage);
    if (head_ - tail_ == kMaxPendingOps) return Status(ErrorCode::InProgress);
    progress();
    if (done_ == head_) {
      // Every earlier operation finished (or there is none): store the flag now. A signal left
      // pending here is delivered only by this link's poll() or wait(), and a rank that next
      // waits on another link would hold it back (a credit its sender needs: a stalled ring).
      const Status s = inner_->signal(SignalOp{&dst->inner, op.offset, op.value, 0});
      drain_inner();
      if (!s.is_ok()) return s.in_progress() ? s : fail(s.code(), s.native());
      ring_[head_ % kMaxPendingOps] = Op{op.wr_id, true, true, Status::ok(), nullptr, 0, 0};
      ++head_;
      ++done_;
      bump(stats_.signals, 1);
      return Status::ok();
    }
    // The event completes once every copy enqueued before it did (pcie: the second hop waits
    // for the first, and both streams' earlier work precedes it on `stream_`).
    const int err = api_.event_record(events_[head_ % kMaxPendingOps], stream_);
    if (err != detail::kCudaSuccess) return fail(ErrorCode::Cuda, err);
    ring_[head_ % kMaxPendingOps] = Op{op.wr_id, true, false, Status::ok(), &dst->inner, op.offset, op.value};
    ++head_;
    ++pending_signals_;
    bump(stats_.signals, 1);
    return Status::ok();
  }

  Status poll(std::span<Completion> out, std::size_t& n) noexcept override {
    progress();
    n = 0;
    while (n < out.size() && tail_ != done_) {
      const Op& o = ring_[tail_ % kMaxPendingOps];
      out[n++] = Completion{o.wr_id, o.status};
      ++tail_;
    }
    return Status::ok();
  }

  Status wait(SignalFlag& flag, std::uint32_t target, std::chrono::nanoseconds max) noexcept override {
    // Our own signals are stored from here too: two ranks waiting for each other's flags while
    // theirs sit behind copies would otherwise wait out their slices.
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      progress();
      const bool pending_signal = pending_signals_ > 0;
      const auto left = max - (std::chrono::steady_clock::now() - start);
      const auto slice = pending_signal ? std::min<std::chrono::nanoseconds>(left, std::chrono::microseconds(50)) : left;
      const Status s = inner_->wait(flag, target, slice.count() > 0 ? slice : std::chrono::nanoseconds(0));
      if (!s.in_progress() || !pending_signal || std::chrono::steady_clock::now() - start >= max) return s;
    }
  }

  void fence(FenceReason why) noexcept override {
    fenced_ = true;  // pending operations complete with Fenced (their copies may still land)
    inner_->fence(why);
  }
  bool can_reopen() const noexcept override { return true; }
  void reopen() noexcept override {
    fenced_ = false;
    inner_->reopen();
  }
  LinkState state() const noexcept override { return fenced_ ? LinkState::Fenced : LinkState::Up; }
  int peer() const noexcept override { return peer_; }
  const LinkStats& stats() const noexcept override { return stats_; }
  bool times_writes() const noexcept override { return timing_start_[0] != nullptr; }
  bool idle() noexcept override {
    progress();
    return done_ == head_;
  }

 private:
  struct Op {
    std::uint64_t wr_id = 0;
    bool is_signal = false;
    bool ready = false;  // finished without an event (host writes)
    Status status;
    const RemoteRegion* flag = nullptr;  // signal: the shm import holding the flag
    std::size_t offset = 0;
    std::uint32_t value = 0;
    bool timed = false;      // a write between timing_start_ and timing_end_ of its slot
    std::size_t bytes = 0;   // a timed write's payload
  };

  Status fail(ErrorCode code, int native = 0) noexcept {
    stats_.errors.fetch_add(1, std::memory_order_relaxed);
    return Status(code, native);
  }

  bool src_on_device(const WriteOp& op) const noexcept {
    if (op.src_region != nullptr) return op.src_region->kind() == MemoryKind::Device;
    detail::CudaPointerAttributes a;
    if (api_.pointer_attributes(&a, op.src) != detail::kCudaSuccess) return false;
    return a.type == detail::kCudaMemoryTypeDevice || a.type == detail::kCudaMemoryTypeManaged;
  }

  // pcie: device -> pinned bounce slot (stream_d2h_) -> peer device (stream_), chunk by chunk;
  // a slot is refilled only after its previous chunk left it.
  int staged_copy(std::byte* to, const std::byte* from, std::size_t bytes) noexcept {
    for (std::size_t off = 0; off < bytes; off += kPcieChunkBytes) {
      const std::size_t len = std::min(kPcieChunkBytes, bytes - off);
      const std::size_t slot = next_slot_++ % kPcieSlots;
      std::byte* bounce = bounce_ + slot * kPcieChunkBytes;
      int err = api_.stream_wait_event(stream_d2h_, drained_[slot], 0);
      if (err == 0) err = api_.memcpy_async(bounce, from + off, len, detail::kCudaMemcpyDefault, stream_d2h_);
      if (err == 0) err = api_.event_record(copied_[slot], stream_d2h_);
      if (err == 0) err = api_.stream_wait_event(stream_, copied_[slot], 0);
      if (err == 0) err = api_.memcpy_async(to + off, bounce, len, detail::kCudaMemcpyDefault, stream_);
      if (err == 0) err = api_.event_record(drained_[slot], stream_);
      if (err != 0) return err;
    }
    return 0;
  }

  // Finishes operations in order: a write when its event completed, a signal when its event
  // completed and the flag was stored.
  void progress() noexcept {
    while (done_ != head_) {
      Op& o = ring_[done_ % kMaxPendingOps];
      if (fenced_) {
        o.status = Status(ErrorCode::Fenced);
      } else if (!o.ready) {
        const std::size_t at = done_ % kMaxPendingOps;
        const int q = api_.event_query(o.timed ? timing_end_[at] : events_[at]);
        if (q == detail::kCudaErrorNotReady) return;
        if (q != detail::kCudaSuccess) {
          o.status = fail(ErrorCode::Cuda, q);
        } else if (o.timed) {
          float ms = 0.0f;
          if (api_.event_elapsed_time(&ms, timing_start_[at], timing_end_[at]) == detail::kCudaSuccess && ms >= 0.0f) {
            bump(stats_.timed_ns, static_cast<std::uint64_t>(static_cast<double>(ms) * 1e6));
            bump(stats_.timed_bytes, o.bytes);
          }
        } else if (o.is_signal) {
          const Status s = inner_->signal(SignalOp{o.flag, o.offset, o.value, 0});
          drain_inner();
          if (s.in_progress()) return;
          if (!s.is_ok()) o.status = fail(s.code(), s.native());
        }
      }
      if (o.is_signal) --pending_signals_;
      ++done_;
    }
  }

  void drain_inner() noexcept {
    Completion c[4];
    std::size_t n = 0;
    do {
      (void)inner_->poll(c, n);
    } while (n == std::size(c));
  }

  void release() noexcept {
    if (stream_d2h_ != nullptr) (void)api_.stream_synchronize(stream_d2h_);
    if (stream_ != nullptr) (void)api_.stream_synchronize(stream_);
    for (auto* list : {&events_, &timing_start_, &timing_end_})
      for (auto& e : *list)
        if (e != nullptr) (void)api_.event_destroy(std::exchange(e, nullptr));
    for (std::size_t i = 0; i < kPcieSlots; ++i) {
      if (copied_[i] != nullptr) (void)api_.event_destroy(std::exchange(copied_[i], nullptr));
      if (drained_[i] != nullptr) (void)api_.event_destroy(std::exchange(drained_[i], nullptr));
    }
    if (stream_d2h_ != nullptr) (void)api_.stream_destroy(std::exchange(stream_d2h_, nullptr));
    if (stream_ != nullptr) (void)api_.stream_destroy(std::exchange(stream_, nullptr));
    if (bounce_ != nullptr) (void)api_.free_host(std::exchange(bounce_, nullptr));
  }

  std::shared_ptr<Shared> shared_;
  const CudaApi& api_;
  int peer_;
  std::unique_ptr<Link> inner_;
  void* stream_ = nullptr;      // copies (nvlink), second hop (pcie), events
  void* stream_d2h_ = nullptr;  // pcie: first hop
  void* events_[kMaxPendingOps] = {};
  void* timing_start_[kMaxPendingOps] = {};  // timed writes (cudaEventElapsedTime present), per slot
  void* timing_end_[kMaxPendingOps] = {};
  void* copied_[kPcieSlots] = {};   // pcie: slot filled
  void* drained_[kPcieSlots] = {};  // pcie: slot emptied
  std::byte* bounce_ = nullptr;
  std::size_t next_slot_ = 0;
  Op ring_[kMaxPendingOps];
  std::size_t head_ = 0, done_ = 0, tail_ = 0;  // tail_ <= done_ <= head_
  std::size_t pending_signals_ = 0;             // signals in [done_, head_): wait() then slices
  std::atomic<bool> fenced_{false};  // read by links() (state()) from other threads
  LinkStats stats_;
};

class CudaListen final : public ListenHandle {
 public:
  CudaListen(std::unique_ptr<ListenHandle> inner, int device) : inner_(std::move(inner)), device_(device) {}
  // u32 length + the inner shm address, then i32 device.
  Bytes address() const override {
    const Bytes in = inner_->address();
    Bytes out(4 + in.size() + 4);
    const auto len = static_cast<std::uint32_t>(in.size());
    std::memcpy(out.data(), &len, 4);
    std::memcpy(out.data() + 4, in.data(), in.size());
    std::memcpy(out.data() + 4 + in.size(), &device_, 4);
    return out;
  }
  ListenHandle& inner() { return *inner_; }

 private:
  std::unique_ptr<ListenHandle> inner_;
  int device_;
};

// ---- Transport -------------------------------------------------------------------------------
class CudaIpcTransport final : public Transport {
 public:
  CudaIpcTransport(const TransportContext& ctx, Mode mode) : shared_(std::make_shared<Shared>()) {
    Shared& s = *shared_;
    s.mode = mode;
    s.self = ctx.self;
    s.log = ctx.log;
    s.api = detail::load_cuda_api(ctx.options != nullptr ? ctx.options->cuda_runtime : std::string());
    if (!s.api.usable) {
      s.why_not = s.api.why_not;
    } else if (!s.api.ipc) {
      s.why_not = s.api.ipc_why_not;
    } else if (const int err = s.api.get_device(&s.device); err != detail::kCudaSuccess) {
      s.why_not = s.api.describe("cudaGetDevice", err);
    }
    s.inner = shm::make_transport(ctx);
    if (!s.why_not.empty() && s.log) s.log->debug("{}: unusable: {}", s.who(), s.why_not);
  }
  ~CudaIpcTransport() override {
    std::lock_guard lock(shared_->mutex);
    for (const auto& [base, bytes] : shared_->allocations) (void)shared_->api.free(reinterpret_cast<void*>(base));
    shared_->allocations.clear();
  }

  std::string_view name() const noexcept override { return mode_name(shared_->mode); }
  bool shares_memory() const noexcept override { return true; }
  bool writes_device_memory() const noexcept override { return true; }

  Reachability can_reach(const PeerInfo& self, const PeerInfo& peer) const override {
    Reachability r;
    if (self.host_id != peer.host_id) {
      r.reason = fmt::format("rank {} is on host '{}', rank {} on host '{}'", self.rank, self.host_id, peer.rank, peer.host_id);
      return r;
    }
    if (!shared_->why_not.empty()) {
      r.reason = fmt::format("no usable CUDA IPC: {}", shared_->why_not);
      return r;
    }
    r.ok = true;
    r.min_chunk_bytes = shared_->mode == Mode::Pcie ? kPcieChunkBytes : 0;
    // pcie: one PCIe Gen5 x16 direction. nvlink: from the GPUs' NVML facts when both ranks named
    // one (`CommOptions::health_gpu`): NVLink-joined or switch-connected pairs get their links'
    // bandwidth, other pairs copy peer to peer over PCIe (where the GPUs allow it: `connect`
    // refuses pairs without peer access); unknown GPUs and one shared GPU keep the nominal figure.
    const GpuPath path = shared_->mode == Mode::Nvlink ? gpu_path(placement_of(self), placement_of(peer)) : GpuPath{GpuPath::Kind::Pcie};
    const bool pcie = path.kind == GpuPath::Kind::Pcie;
    r.latency_us = pcie ? 10.0 : 5.0;
    r.bandwidth_gbps = pcie                                 ? kPcieGbps
                       : path.links > 0                     ? kNvlinkLinkGbps * path.links  // NvLink, NvSwitch
                                                            : kNominalNvlinkGbps;           // Unknown, SameGpu
    return r;
  }

  void* allocate(std::size_t bytes, MemoryKind kind) override {
    if (kind == MemoryKind::Host) return shared_->inner->allocate(bytes, kind);
    if (bytes == 0) return nullptr;
    shared_->require_usable();
    void* p = nullptr;
    shared_->check(shared_->api.malloc(&p, bytes), "cudaMalloc");
    std::lock_guard lock(shared_->mutex);
    shared_->allocations[reinterpret_cast<std::uintptr_t>(p)] = bytes;
    return p;
  }

  bool deallocate(void* ptr) noexcept override {
    if (shared_->inner->deallocate(ptr)) return true;
    std::lock_guard lock(shared_->mutex);
    auto it = shared_->allocations.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == shared_->allocations.end()) return false;
    (void)shared_->api.free(ptr);
    shared_->allocations.erase(it);
    return true;
  }

  MemoryRegion register_memory(void* ptr, std::size_t bytes, MemoryKind kind) override {
    auto impl = std::make_unique<LocalRegion>();
    if (kind == MemoryKind::Host) {
      impl->inner = shared_->inner->register_memory(ptr, bytes, kind);
      const Bytes inner_key = impl->inner.key();
      impl->key_bytes.reserve(1 + inner_key.size());
      impl->key_bytes.push_back(static_cast<std::byte>(Tag::Host));
      impl->key_bytes.insert(impl->key_bytes.end(), inner_key.begin(), inner_key.end());
      return MemoryRegion(std::move(impl), ptr, bytes, kind);
    }
    shared_->require_usable();
    RINGFENCE_EXPECTS(ptr != nullptr, "{}: register_memory(nullptr, {}) of device memory", shared_->who(), bytes);
    DeviceKey k;
    k.pid = static_cast<std::int32_t>(::getpid());
    k.device = shared_->device;
    k.bytes = bytes;
    const auto p = reinterpret_cast<std::uintptr_t>(ptr);
    k.base = p;
    {
      std::lock_guard lock(shared_->mutex);
      auto it = shared_->allocations.upper_bound(p);
      if (it != shared_->allocations.begin() && p < std::prev(it)->first + std::prev(it)->second) {
        --it;
        RINGFENCE_EXPECTS(bytes <= it->first + it->second - p, "{}: region [{}, +{}) runs past its allocation of {} bytes",
                          shared_->who(), ptr, bytes, it->second);
        k.base = it->first;
      }
    }
    k.offset = p - k.base;
    const int err = shared_->api.ipc_get_mem_handle(&k.handle, reinterpret_cast<void*>(k.base));
    if (err != detail::kCudaSuccess)
      throw CudaError(fmt::format("{}: cannot share device buffer {}: {} (register memory from allocate(), or the base "
                                  "pointer of a whole cudaMalloc allocation)",
                                  shared_->who(), ptr, shared_->api.describe("cudaIpcGetMemHandle", err)),
                      err);
    impl->key_bytes = encode(k);
    return MemoryRegion(std::move(impl), ptr, bytes, kind);
  }

  RemoteRegion import_region(std::span<const std::byte> peer_key) override {
    RINGFENCE_EXPECTS(!peer_key.empty(), "{}: empty region key", shared_->who());
    auto remote = std::make_unique<Remote>();
    const auto tag = static_cast<Tag>(peer_key[0]);
    if (tag == Tag::Host) {
      remote->tag = Tag::Host;
      remote->inner = shared_->inner->import_region(peer_key.subspan(1));
      const std::size_t bytes = remote->inner.size();
      return RemoteRegion(std::move(remote), bytes);
    }
    RINGFENCE_EXPECTS(tag == Tag::Device, "{}: malformed region key (tag {})", shared_->who(), static_cast<int>(peer_key[0]));
    const DeviceKey k = decode_device_key(peer_key, shared_->who());
    shared_->require_usable();
    remote->tag = Tag::Device;
    if (k.pid == static_cast<std::int32_t>(::getpid())) {
      remote->ptr = reinterpret_cast<std::byte*>(k.base + k.offset);  // CUDA refuses a process its own handle
    } else {
      remote->opened = open(k);
      remote->ptr = static_cast<std::byte*>(remote->opened->base) + k.offset;
    }
    return RemoteRegion(std::move(remote), k.bytes);
  }

  std::unique_ptr<ListenHandle> listen() override {
    return std::make_unique<CudaListen>(shared_->inner->listen(), shared_->device);
  }

  std::unique_ptr<PendingLink> connect(ListenHandle& local, const PeerInfo& peer, std::span<const std::byte> address) override {
    shared_->require_usable();
    std::uint32_t len = 0;
    RINGFENCE_EXPECTS(address.size() >= 8, "{}: malformed address of rank {} ({} bytes)", shared_->who(), peer.rank, address.size());
    std::memcpy(&len, address.data(), 4);
    RINGFENCE_EXPECTS(len == address.size() - 8, "{}: malformed address of rank {}", shared_->who(), peer.rank);
    std::int32_t peer_device = 0;
    std::memcpy(&peer_device, address.data() + 4 + len, 4);
    auto pending = shared_->inner->connect(static_cast<CudaListen&>(local).inner(), peer, address.subspan(4, len));
    std::unique_ptr<Link> inner;
    const Status s = pending->try_finish(inner);
    RINGFENCE_EXPECTS(s.is_ok(), "{}: shm link to rank {} did not come up ({})", shared_->who(), peer.rank, to_string(s.code()));
    if (shared_->mode == Mode::Nvlink && peer_device != shared_->device) enable_peer(peer, peer_device);
    return std::make_unique<transport_util::ReadyPendingLink>(std::make_unique<CudaLink>(shared_, peer.rank, std::move(inner)));
  }

 private:
  void enable_peer(const PeerInfo& peer, int peer_device) {
    Shared& s = *shared_;
    int can = 0;
    s.check(s.api.device_can_access_peer(&can, s.device, peer_device), "cudaDeviceCanAccessPeer");
    if (can == 0)
      throw CudaError(fmt::format("{}: GPU {} cannot access GPU {} of rank {} peer to peer (cudaDeviceCanAccessPeer = 0); "
                                  "use the pcie transport for this pair",
                                  s.who(), s.device, peer_device, peer.rank),
                      0);
    const int err = s.api.device_enable_peer_access(peer_device, 0);
    if (err != detail::kCudaErrorPeerAccessAlreadyEnabled) s.check(err, "cudaDeviceEnablePeerAccess");
  }

  std::shared_ptr<Opened> open(const DeviceKey& k) {
    std::lock_guard lock(shared_->mutex);
    auto& slot = shared_->opened[{k.pid, k.base}];
    if (auto live = slot.lock()) return live;
    auto o = std::make_shared<Opened>();
    o->owner = shared_;
    const int err = shared_->api.ipc_open_mem_handle(&o->base, k.handle, detail::kCudaIpcMemLazyEnablePeerAccess);
    if (err != detail::kCudaSuccess) {
      o->base = nullptr;
      throw CudaError(fmt::format("{}: cannot open the device buffer of pid {} (GPU {}): {}", shared_->who(), k.pid, k.device,
                                  shared_->api.describe("cudaIpcOpenMemHandle", err)),
                      err);
    }
    slot = o;
    return o;
  }

  std::shared_ptr<Shared> shared_;
};

}  // namespace

std::unique_ptr<Transport> make_nvlink_transport(const TransportContext& context) {
  return std::make_unique<CudaIpcTransport>(context, Mode::Nvlink);
}
std::unique_ptr<Transport> make_pcie_transport(const TransportContext& context) {
  return std::make_unique<CudaIpcTransport>(context, Mode::Pcie);
}

}  // namespace ringfence::transports::cuda_ipc
