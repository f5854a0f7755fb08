// The ibverbs transport: RC queue pairs, RDMA WRITE for writes, RDMA WRITE WITH IMM for
// signals, host memory through ibv_reg_mr. libibverbs is dlopen'ed (README: why), so a process
// on a machine without rdma-core, or without an HCA, creates this transport normally and it
// reaches nobody. Pure parts (blobs, queue pair attributes, error classes) are in
// ibverbs_detail.cpp and unit-tested without hardware; this file needs an HCA to run.
#include <dlfcn.h>
#include <endian.h>
#include <fcntl.h>
#include <sched.h>
#include <time.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <ringfence/error.hpp>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/transport_util.hpp>
#include <ringfence/transports/ibverbs.hpp>

#include "dmabuf.hpp"
#include "ibverbs_detail.hpp"

namespace ringfence::transports::ibverbs {
namespace {

using namespace detail;
using transport_util::bump;

// Send/receive queue depth per link; the completion FIFO and the CQs are sized from it.
constexpr int kQueueDepth = 256;
constexpr std::size_t kMaxMessage = std::size_t{1} << 30;  // RC messages are at most 2^31 bytes

// The libibverbs entry points we call, resolved with dlvsym at the IBVERBS_1.1 ABI (as NCCL
// does). ibv_post_send/ibv_post_recv/ibv_poll_cq are inline in verbs.h (they call through the
// context's ops table) and need no symbol.
struct Verbs {
  void* handle = nullptr;
  ibv_device** (*get_device_list)(int*) = nullptr;
  void (*free_device_list)(ibv_device**) = nullptr;
  const char* (*get_device_name)(ibv_device*) = nullptr;
  ibv_context* (*open_device)(ibv_device*) = nullptr;
  int (*close_device)(ibv_context*) = nullptr;
  int (*query_device)(ibv_context*, ibv_device_attr*) = nullptr;
  int (*query_port)(ibv_context*, std::uint8_t, ibv_port_attr*) = nullptr;
  int (*query_gid)(ibv_context*, std::uint8_t, int, ibv_gid*) = nullptr;
  ibv_pd* (*alloc_pd)(ibv_context*) = nullptr;
  int (*dealloc_pd)(ibv_pd*) = nullptr;
  ibv_mr* (*reg_mr)(ibv_pd*, void*, std::size_t, int) = nullptr;
  int (*dereg_mr)(ibv_mr*) = nullptr;
  /// ibv_reg_dmabuf_mr (rdma-core 34+): optional, only device memory needs it.
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd*, std::uint64_t, std::size_t, std::uint64_t, int, int) = nullptr;
  ibv_cq* (*create_cq)(ibv_context*, int, void*, ibv_comp_channel*, int) = nullptr;
  int (*destroy_cq)(ibv_cq*) = nullptr;
  ibv_qp* (*create_qp)(ibv_pd*, ibv_qp_init_attr*) = nullptr;
  int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int) = nullptr;
  int (*destroy_qp)(ibv_qp*) = nullptr;
  int (*get_async_event)(ibv_context*, ibv_async_event*) = nullptr;
  void (*ack_async_event)(ibv_async_event*) = nullptr;

  Verbs() = default;
  Verbs(const Verbs&) = delete;
  Verbs& operator=(const Verbs&) = delete;
  ~Verbs() {
    if (handle) ::dlclose(handle);
  }
};

template <class F>
bool resolve(void* handle, F& fn, const char* name) {
  void* p = ::dlvsym(handle, name, "IBVERBS_1.1");
  if (!p) p = ::dlsym(handle, name);
  fn = reinterpret_cast<F>(p);
  return p != nullptr;
}

// nullptr (and `why`) when the library or one of its symbols is missing.
std::unique_ptr<Verbs> load_verbs(const std::string& path, std::string& why) {
  auto v = std::make_unique<Verbs>();
  v->handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!v->handle) {
    const char* e = ::dlerror();
    why = fmt::format("cannot load {} ({})", path, e ? e : "unknown error");
    return nullptr;
  }
  bool ok = true;
  auto need = [&](auto& fn, const char* name) {
    if (!resolve(v->handle, fn, name)) {
      ok = false;
      why = fmt::format("{} lacks {}", path, name);
    }
  };
  need(v->get_device_list, "ibv_get_device_list");
  need(v->free_device_list, "ibv_free_device_list");
  need(v->get_device_name, "ibv_get_device_name");
  need(v->open_device, "ibv_open_device");
  need(v->close_device, "ibv_close_device");
  need(v->query_device, "ibv_query_device");
  need(v->query_port, "ibv_query_port");
  need(v->query_gid, "ibv_query_gid");
  need(v->alloc_pd, "ibv_alloc_pd");
  need(v->dealloc_pd, "ibv_dealloc_pd");
  need(v->reg_mr, "ibv_reg_mr");
  need(v->dereg_mr, "ibv_dereg_mr");
  need(v->create_cq, "ibv_create_cq");
  need(v->destroy_cq, "ibv_destroy_cq");
  need(v->create_qp, "ibv_create_qp");
  need(v->modify_qp, "ibv_modify_qp");
  need(v->destroy_qp, "ibv_destroy_qp");
  need(v->get_async_event, "ibv_get_async_event");
  need(v->ack_async_event, "ibv_ack_async_event");
  (void)resolve(v->handle, v->reg_dmabuf_mr, "ibv_reg_dmabuf_mr");  // optional: GPUDirect RDMA only
  return ok ? std::move(v) : nullptr;
}

class IbLink;

// The opened device and port, shared by the transport, its listen handles, links and regions
// (whichever goes last closes the device).
struct Device {
  std::unique_ptr<Verbs> verbs;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  std::string name;
  int port = 1;
  ibv_port_attr port_attr{};
  ibv_gid gid{};
  double gbps = 0;
  IbverbsOptions options;
  const Logger* log = nullptr;
  int rank = -1;

  // Async events: drained without blocking by whichever link's poll() gets the lock (no
  // hidden thread); they set these flags, which links read on their own thread.
  std::mutex links_mu;
  std::vector<IbLink*> links;
  std::atomic<bool> port_down{false};
  std::atomic<bool> device_fatal{false};

  Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  ~Device() {
    if (pd) verbs->dealloc_pd(pd);
    if (ctx) verbs->close_device(ctx);
  }
  void drain_async_events() noexcept;
};

// A registration. `addr`/`length` are the registered range as peers address it: the MR's own
// for host memory; for device memory (dma-buf) the MR covers whole pages around it.
struct LocalImpl final : MemoryRegion::Impl {
  std::shared_ptr<Device> dev;
  ibv_mr* mr = nullptr;
  std::uintptr_t addr = 0;
  std::uint64_t length = 0;
  LocalImpl(std::shared_ptr<Device> d, ibv_mr* m, std::uintptr_t a, std::uint64_t len) : dev(std::move(d)), mr(m), addr(a), length(len) {}
  ~LocalImpl() override { dev->verbs->dereg_mr(mr); }
  Bytes key() const override { return serialize(RegionKey{addr, length, mr->rkey}); }
};

struct RemoteImpl final : RemoteRegion::Impl {
  RegionKey key;
  explicit RemoteImpl(RegionKey k) : key(k) {}
};

// One RC queue pair with its two completion queues (send completions are reported by poll;
// receive completions only recycle receive WQEs consumed by the peer's signals).
struct QpSet {
  std::shared_ptr<Device> dev;
  ibv_cq* send_cq = nullptr;
  ibv_cq* recv_cq = nullptr;
  ibv_qp* qp = nullptr;
  QpSet() = default;
  QpSet(QpSet&& o) noexcept { *this = std::move(o); }
  QpSet& operator=(QpSet&& o) noexcept {
    std::swap(dev, o.dev);
    std::swap(send_cq, o.send_cq);
    std::swap(recv_cq, o.recv_cq);
    std::swap(qp, o.qp);
    return *this;
  }
  ~QpSet() {
    if (qp) dev->verbs->destroy_qp(qp);
    if (send_cq) dev->verbs->destroy_cq(send_cq);
    if (recv_cq) dev->verbs->destroy_cq(recv_cq);
  }
};

QpParams params_of(const Device& d) {
  QpParams p;
  p.port = static_cast<std::uint8_t>(d.port);
  p.timeout = static_cast<std::uint8_t>(d.options.timeout);
  p.retry_count = static_cast<std::uint8_t>(d.options.retry_count);
  p.service_level = static_cast<std::uint8_t>(d.options.service_level);
  p.traffic_class = static_cast<std::uint8_t>(d.options.traffic_class);
  p.gid_index = static_cast<std::uint8_t>(d.options.gid_index);
  p.local_mtu = static_cast<std::uint8_t>(d.port_attr.active_mtu);
  p.local_link_layer = d.port_attr.link_layer;
  return p;
}

QpSet make_qp(const std::shared_ptr<Device>& dev, int peer) {
  QpSet s;
  s.dev = dev;
  auto& v = *dev->verbs;
  s.send_cq = v.create_cq(dev->ctx, kQueueDepth, nullptr, nullptr, 0);
  s.recv_cq = v.create_cq(dev->ctx, kQueueDepth, nullptr, nullptr, 0);
  if (!s.send_cq || !s.recv_cq)
    throw IbvError(fmt::format("rank {}: ibv_create_cq on {} for peer {} failed: {}", dev->rank, dev->name, peer, std::strerror(errno)), errno);
  ibv_qp_init_attr init{};
  init.send_cq = s.send_cq;
  init.recv_cq = s.recv_cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = kQueueDepth;
  init.cap.max_recv_wr = kQueueDepth;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.cap.max_inline_data = 64;  // signals are 4 bytes, sent inline
  s.qp = v.create_qp(dev->pd, &init);
  if (!s.qp)
    throw IbvError(fmt::format("rank {}: ibv_create_qp (RC) on {} for peer {} failed: {}", dev->rank, dev->name, peer, std::strerror(errno)), errno);
  // The provider writes back what it granted; signals need 4 bytes of inline data.
  if (init.cap.max_inline_data < sizeof(std::uint32_t))
    throw IbvError(fmt::format("rank {}: {} grants {} bytes of inline data per send, signals need 4", dev->rank, dev->name,
                               init.cap.max_inline_data),
                   0);
  QpTransition t = init_transition(params_of(*dev));
  if (const int rc = v.modify_qp(s.qp, &t.attr, t.mask); rc != 0)
    throw IbvError(fmt::format("rank {}: ibv_modify_qp RESET->INIT for peer {} failed: {}", dev->rank, peer, std::strerror(rc)), rc);
  return s;
}

class IbLink final : public Link {
 public:
  IbLink(std::shared_ptr<Device> dev, QpSet qp, int peer) : dev_(std::move(dev)), qp_(std::move(qp)), peer_(peer) {
    staging_size_ = dev_->options.staging_bytes;
    staging_ = std::make_unique<std::byte[]>(staging_size_);
    staging_mr_ = dev_->verbs->reg_mr(dev_->pd, staging_.get(), staging_size_, IBV_ACCESS_LOCAL_WRITE);
    if (!staging_mr_)
      throw IbvError(fmt::format("rank {}: ibv_reg_mr of the {}-byte staging buffer for peer {} failed: {}", dev_->rank,
                                 staging_size_, peer_, std::strerror(errno)), errno);
    fifo_.resize(kQueueDepth);
    for (int i = 0; i < kQueueDepth; ++i)
      if (post_recv() != 0) {
        dev_->verbs->dereg_mr(staging_mr_);
        throw IbvError(fmt::format("rank {}: ibv_post_recv for peer {} failed", dev_->rank, peer_), errno);
      }
    std::lock_guard lock(dev_->links_mu);
    dev_->links.push_back(this);
  }
  ~IbLink() override {
    {
      std::lock_guard lock(dev_->links_mu);
      std::erase(dev_->links, this);
    }
    fence(FenceReason::Shutdown);
    // Queue pair and CQs go (QpSet) before the staging buffer they may still reference.
    qp_ = QpSet{};
    dev_->verbs->dereg_mr(staging_mr_);
  }

  Status write(const WriteOp& op) noexcept override {
    RINGFENCE_TRY(usable());
    const auto* remote = static_cast<const RemoteImpl*>(op.dst ? op.dst->impl() : nullptr);  // ours (SPI)
    if (!remote || (!op.src && op.bytes) || op.bytes > kMaxMessage) return Status(ErrorCode::InvalidUsage);
    // Never post a write outside the imported region: the HCA would fence us with
    // REM_ACCESS_ERR at best, write a neighbour's memory at worst (a wrong but valid rkey).
    if (!range_ok(op.dst_offset, op.bytes, remote->key.length)) return Status(ErrorCode::InvalidUsage);
    if (fifo_full()) return Status(ErrorCode::InProgress);
    ibv_sge sge{};
    sge.length = static_cast<std::uint32_t>(op.bytes);
    std::uint64_t stage_end = stage_head_;
    const auto* local = op.src_region ? dynamic_cast<const LocalImpl*>(op.src_region->impl()) : nullptr;
    const auto* src = static_cast<const std::byte*>(op.src);
    const auto* base = local ? static_cast<const std::byte*>(op.src_region->data()) : nullptr;
    if (local && src >= base && range_ok(static_cast<std::size_t>(src - base), op.bytes, op.src_region->size())) {
      sge.addr = reinterpret_cast<std::uintptr_t>(src);
      sge.lkey = local->mr->lkey;
    } else if (op.bytes) {
      // Not registered with us: copy into the bounce ring (freed in completion order, which RC
      // guarantees is posting order).
      if (op.bytes > staging_size_) return Status(ErrorCode::InvalidUsage);
      std::uint64_t at = stage_head_;
      if (at % staging_size_ + op.bytes > staging_size_) at += staging_size_ - at % staging_size_;  // wrap
      if (at + op.bytes - stage_tail_ > staging_size_) return Status(ErrorCode::InProgress);
      std::byte* dst = staging_.get() + at % staging_size_;
      std::memcpy(dst, src, op.bytes);
      sge.addr = reinterpret_cast<std::uintptr_t>(dst);
      sge.lkey = staging_mr_->lkey;
      stage_end = at + op.bytes;
    }
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = op.wr_id;
    wr.sg_list = &sge;
    wr.num_sge = op.bytes ? 1 : 0;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;  // one completion per operation (SPI)
    wr.wr.rdma.remote_addr = remote->key.addr + op.dst_offset;
    wr.wr.rdma.rkey = remote->key.rkey;
    if (const int rc = ibv_post_send(qp_.qp, &wr, &bad); rc != 0) {
      bump(stats_.errors, 1);
      return Status(ErrorCode::Ibv, rc);
    }
    stage_head_ = stage_end;
    push_fifo(op.wr_id, stage_end);
    bump(stats_.writes, 1);
    bump(stats_.bytes_written, op.bytes);
    return Status::ok();
  }

  Status signal(const SignalOp& op) noexcept override {
    RINGFENCE_TRY(usable());
    const auto* remote = static_cast<const RemoteImpl*>(op.dst ? op.dst->impl() : nullptr);  // ours (SPI)
    if (!remote || op.offset % alignof(std::uint32_t) != 0 || !range_ok(op.offset, sizeof(std::uint32_t), remote->key.length))
      return Status(ErrorCode::InvalidUsage);
    if (fifo_full()) return Status(ErrorCode::InProgress);
    // The value lands in SignalFlag::value (offset 0 of the flag). WRITE_WITH_IMM on RC is
    // executed after every earlier WRITE of this queue pair; the immediate consumes one
    // receive WQE at the peer, whose wait() recycles it. Inline: no registered source needed.
    std::uint32_t value = op.value;
    ibv_sge sge{};
    sge.addr = reinterpret_cast<std::uintptr_t>(&value);
    sge.length = sizeof(value);
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = op.wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    wr.imm_data = htobe32(op.value);
    wr.wr.rdma.remote_addr = remote->key.addr + op.offset;
    wr.wr.rdma.rkey = remote->key.rkey;
    if (const int rc = ibv_post_send(qp_.qp, &wr, &bad); rc != 0) {
      bump(stats_.errors, 1);
      return Status(ErrorCode::Ibv, rc);
    }
    push_fifo(op.wr_id, stage_head_);
    bump(stats_.signals, 1);
    return Status::ok();
  }

  Status poll(std::span<Completion> out, std::size_t& n) noexcept override {
    n = 0;
    if ((++polls_ & 63) == 0) dev_->drain_async_events();
    apply_async_faults();
    drain_recv();
    ibv_wc wc[16];
    while (n < out.size() && fifo_tail_ != fifo_head_) {
      const int want = static_cast<int>(std::min<std::size_t>(16, out.size() - n));
      const int got = ibv_poll_cq(qp_.send_cq, want, wc);
      if (got < 0) {
        fail(Status(ErrorCode::Ibv, got), false);
        break;
      }
      if (got == 0) break;
      for (int i = 0; i < got; ++i) out[n++] = complete(wc[i]);
    }
    // A dead device may never flush: after a fence, pending operations complete as Fenced
    // here rather than never.
    if (state_.load(std::memory_order_relaxed) == LinkState::Fenced && dev_->device_fatal.load(std::memory_order_relaxed))
      while (n < out.size() && fifo_tail_ != fifo_head_) {
        const Pending p = pop_fifo();
        out[n++] = Completion{p.wr_id, Status(ErrorCode::Fenced)};
      }
    return Status::ok();
  }

  Status wait(SignalFlag& flag, std::uint32_t target, std::chrono::nanoseconds max) noexcept override {
    const auto start = std::chrono::steady_clock::now();
    auto account = [&] {
      bump(stats_.wait_ns, static_cast<std::uint64_t>((std::chrono::steady_clock::now() - start).count()));
    };
    for (unsigned i = 0;; ++i) {
      drain_recv();
      // The HCA places RDMA writes of one RC queue pair in order (no relaxed ordering is
      // requested), so seeing the flag means seeing the writes before it.
      if (reached(flag.value.load(std::memory_order_acquire), target)) return account(), Status::ok();
      if ((i & 255) == 255) {
        if ((i & 4095) == 4095) dev_->drain_async_events();
        apply_async_faults();
        if (const Status s = usable(); !s.is_ok()) return account(), s;
        if (std::chrono::steady_clock::now() - start >= max) return account(), Status(ErrorCode::InProgress);
        if (i > 16 * 1024) {
          // Long waits: back off to 20 us sleeps (no completion channel is armed yet).
          timespec ts{0, 20000};
          ::nanosleep(&ts, nullptr);
        } else {
          ::sched_yield();
        }
      }
      transport_util::cpu_relax();
    }
  }

  void fence(FenceReason why) noexcept override {
    (void)why;
    if (state_.exchange(LinkState::Fenced) == LinkState::Fenced) return;
    // ERR flushes every outstanding WR with WR_FLUSH_ERR; poll() reports them as Fenced.
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    if (qp_.qp) (void)dev_->verbs->modify_qp(qp_.qp, &attr, IBV_QP_STATE);
  }

  LinkState state() const noexcept override { return state_.load(std::memory_order_relaxed); }
  int peer() const noexcept override { return peer_; }
  const LinkStats& stats() const noexcept override { return stats_; }

  // Async-event hooks, called with Device::links_mu held (any thread).
  bool owns(const ibv_async_event& e) const noexcept {
    return e.element.qp == qp_.qp || e.element.cq == qp_.send_cq || e.element.cq == qp_.recv_cq;
  }
  void mark_fatal() noexcept { async_fatal_.store(true, std::memory_order_relaxed); }

 private:
  struct Pending {
    std::uint64_t wr_id = 0;
    std::uint64_t stage_end = 0;
  };

  Status usable() const noexcept {
    switch (state_.load(std::memory_order_relaxed)) {
      case LinkState::Fenced:
      case LinkState::Closed: return Status(ErrorCode::Fenced);
      default: break;
    }
    if (!sticky_.is_ok()) return sticky_;
    if (dev_->port_down.load(std::memory_order_relaxed)) return Status(ErrorCode::PeerUnreachable);
    return Status::ok();
  }

  void apply_async_faults() noexcept {
    if (async_fatal_.load(std::memory_order_relaxed) || dev_->device_fatal.load(std::memory_order_relaxed)) {
      if (state_.load(std::memory_order_relaxed) != LinkState::Fenced) fail(Status(ErrorCode::Ibv), false);
    }
  }

  // Records the link's first error; `link_error` = a path error for the health layer (the
  // queue pair is in ERR, so the link stays unusable but is not fenced by us), else fence.
  void fail(Status s, bool link_error, bool timeout = false) noexcept {
    if (sticky_.is_ok()) {
      sticky_ = s;
      bump(stats_.errors, 1);
      if (timeout) bump(stats_.timeouts, 1);
    }
    if (link_error) {
      LinkState up = LinkState::Up;
      state_.compare_exchange_strong(up, LinkState::Degraded);
    } else {
      fence(FenceReason::Error);
    }
  }

  Completion complete(const ibv_wc& wc) noexcept {
    const Pending p = pop_fifo();
    const std::uint64_t id = wc.wr_id;
    (void)p;  // RC completes in posting order: p.wr_id == wc.wr_id
    if (wc.status == IBV_WC_SUCCESS) return Completion{id, Status::ok()};
    if (state_.load(std::memory_order_relaxed) == LinkState::Fenced && sticky_.is_ok())
      return Completion{id, Status(ErrorCode::Fenced)};  // flushed by our own fence
    if (!sticky_.is_ok() && wc.status == IBV_WC_WR_FLUSH_ERR) return Completion{id, sticky_};  // after the first error
    const WcClass c = classify_wc_status(wc.status);
    const Status s(c.code, static_cast<std::int32_t>(wc.status));
    fail(s, c.action == WcAction::LinkError, c.timeout);
    return Completion{id, s};
  }

  void drain_recv() noexcept {
    ibv_wc wc[16];
    for (;;) {
      const int got = ibv_poll_cq(qp_.recv_cq, 16, wc);
      if (got <= 0) return;
      for (int i = 0; i < got; ++i)
        if (wc[i].status == IBV_WC_SUCCESS) (void)post_recv();
    }
  }

  int post_recv() noexcept {
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.num_sge = 0;  // WRITE_WITH_IMM carries no payload into the receive queue
    return ibv_post_recv(qp_.qp, &wr, &bad);
  }

  bool fifo_full() const noexcept { return fifo_head_ - fifo_tail_ >= fifo_.size(); }
  void push_fifo(std::uint64_t wr_id, std::uint64_t stage_end) noexcept {
    fifo_[fifo_head_++ % fifo_.size()] = Pending{wr_id, stage_end};
  }
  Pending pop_fifo() noexcept {
    const Pending p = fifo_[fifo_tail_++ % fifo_.size()];
    stage_tail_ = p.stage_end;
    return p;
  }

  std::shared_ptr<Device> dev_;
  QpSet qp_;
  int peer_;
  std::unique_ptr<std::byte[]> staging_;
  std::size_t staging_size_ = 0;
  ibv_mr* staging_mr_ = nullptr;
  std::uint64_t stage_head_ = 0, stage_tail_ = 0;  // monotonic byte positions in the ring
  std::vector<Pending> fifo_;                       // posted, not yet completed (sized once)
  std::size_t fifo_head_ = 0, fifo_tail_ = 0;
  unsigned polls_ = 0;
  Status sticky_;
  std::atomic<LinkState> state_{LinkState::Up};
  std::atomic<bool> async_fatal_{false};
  LinkStats stats_;
};

void Device::drain_async_events() noexcept {
  std::unique_lock lock(links_mu, std::try_to_lock);
  if (!lock.owns_lock()) return;  // another link is draining
  ibv_async_event e{};
  while (verbs->get_async_event(ctx, &e) == 0) {  // async_fd is non-blocking: -1 when empty
    const AsyncClass c = classify_async_event(e.event_type);
    switch (c.action) {
      case AsyncAction::Ignore: break;
      case AsyncAction::Log: log->info("ibverbs {}:{}: async event {}", name, port, c.name); break;
      case AsyncAction::PortDown:
        port_down.store(true, std::memory_order_relaxed);
        log->warn("ibverbs {}:{}: port error: links on this port report peer-unreachable", name, port);
        break;
      case AsyncAction::PortUp:
        port_down.store(false, std::memory_order_relaxed);
        log->warn("ibverbs {}:{}: port active again", name, port);
        break;
      case AsyncAction::FenceQp:
        for (IbLink* l : links)
          if (l->owns(e)) {
            l->mark_fatal();
            log->warn("ibverbs {}:{}: {} on the link to rank {}: fencing it", name, port, c.name, l->peer());
          }
        break;
      case AsyncAction::FenceDevice:
        device_fatal.store(true, std::memory_order_relaxed);
        log->error("ibverbs {}: device fatal error: fencing every link", name);
        break;
    }
    verbs->ack_async_event(&e);  // always last, as NCCL does: the event may refer to objects
  }
}

class IbListen final : public ListenHandle {
 public:
  IbListen(ConnInfo info, std::vector<QpSet> qps) : info_(std::move(info)), qps_(std::move(qps)) {}
  Bytes address() const override { return serialize(info_); }
  const ConnInfo& info() const noexcept { return info_; }
  std::vector<QpSet>& qps() noexcept { return qps_; }

 private:
  ConnInfo info_;
  std::vector<QpSet> qps_;  // indexed by peer rank; taken by connect()
};

class IbTransport final : public Transport {
 public:
  explicit IbTransport(const TransportContext& context) : self_(context.self), size_(context.size) {
    log_ = context.log ? context.log : &own_log_;
    const IbverbsOptions options = context.options ? context.options->ib : IbverbsOptions{};
    const HcaFilter filter = parse_hca_filter(options.hca);  // throws on a malformed list
    std::string why;
    auto verbs = load_verbs(options.library, why);
    if (!verbs) {
      unusable_ = why;
      return;
    }
    open(std::move(verbs), options, filter);
    if (dev_)
      log_->info("ibverbs: using {}:{} ({}, lid {}, {:.1f} GB/s)", dev_->name, dev_->port,
                 dev_->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", dev_->port_attr.lid, dev_->gbps);
    else
      log_->debug("ibverbs: unusable: {}", unusable_);
  }

  std::string_view name() const noexcept override { return kName; }

  Reachability can_reach(const PeerInfo& self, const PeerInfo& peer) const override {
    Reachability r;
    if (!dev_) {
      r.reason = unusable_;
      return r;
    }
    if (self.rank == peer.rank) {
      r.reason = "a rank does not connect to itself";
      return r;
    }
    r.ok = true;
    r.bandwidth_gbps = dev_->gbps > 0 ? dev_->gbps : 12.5;
    r.latency_us = 2.0;
    return r;
  }

  MemoryRegion register_memory(void* ptr, std::size_t bytes, MemoryKind kind) override {
    RINGFENCE_EXPECTS(dev_ != nullptr, "rank {}: ibverbs has no usable HCA port ({})", self_.rank, unusable_);
    RINGFENCE_EXPECTS(ptr != nullptr && bytes > 0, "rank {}: ibverbs register_memory(ptr={}, bytes={}): empty region",
                      self_.rank, ptr, bytes);
    if (kind == MemoryKind::Device) return register_device(ptr, bytes);
    ibv_mr* mr = dev_->verbs->reg_mr(dev_->pd, ptr, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!mr)
      throw IbvError(fmt::format("rank {}: ibv_reg_mr({}, {} bytes) on {} failed: {}", self_.rank, ptr, bytes, dev_->name,
                                 std::strerror(errno)),
                     errno);
    return MemoryRegion(std::make_unique<LocalImpl>(dev_, mr, reinterpret_cast<std::uintptr_t>(ptr), bytes), ptr, bytes, kind);
  }

  // GPUDirect RDMA: the pages around [ptr, ptr + bytes) exported by the CUDA driver as a
  // dma-buf and registered with their device addresses as I/O virtual addresses, so peers
  // write at `ptr + offset` exactly as into host memory.
  MemoryRegion register_device(void* ptr, std::size_t bytes) {
    RINGFENCE_EXPECTS(dev_->verbs->reg_dmabuf_mr != nullptr,
                      "rank {}: ibverbs cannot register device memory at {}: this libibverbs lacks ibv_reg_dmabuf_mr "
                      "(rdma-core 34 or later is needed for GPUDirect RDMA)",
                      self_.rank, ptr);
    const CudaDmaBuf& dmabuf = cuda_dmabuf();
    if (!dmabuf.usable())
      throw CudaError(fmt::format("rank {}: ibverbs cannot register device memory at {} ({} bytes): {}", self_.rank, ptr, bytes,
                                  dmabuf.why_not()),
                      0);
    const PageSpan span = page_span(reinterpret_cast<std::uintptr_t>(ptr), bytes, static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)));
    RINGFENCE_EXPECTS(span.length > 0, "rank {}: ibverbs register_memory({}, {} bytes): the range wraps around", self_.rank, ptr, bytes);
    int fd = -1;
    try {
      fd = dmabuf.export_pages(span);
    } catch (const CudaError& e) {
      throw CudaError(fmt::format("rank {}: ibverbs cannot register device memory at {}: {}", self_.rank, ptr, e.what()), e.native());
    }
    ibv_mr* mr = dev_->verbs->reg_dmabuf_mr(dev_->pd, 0, span.length, span.start, fd,
                                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    const int err = errno;
    ::close(fd);  // the registration holds its own reference
    if (!mr)
      throw IbvError(fmt::format("rank {}: ibv_reg_dmabuf_mr({:#x}, {} bytes) on {} failed: {} (does the HCA driver support "
                                 "dma-buf? mlx5 on Linux 5.12+ does)",
                                 self_.rank, span.start, span.length, dev_->name, std::strerror(err)),
                     err);
    return MemoryRegion(std::make_unique<LocalImpl>(dev_, mr, reinterpret_cast<std::uintptr_t>(ptr), bytes), ptr, bytes,
                        MemoryKind::Device);
  }

  const CudaDmaBuf& cuda_dmabuf() {
    std::lock_guard lock(dmabuf_mu_);
    if (!dmabuf_) dmabuf_ = std::make_unique<CudaDmaBuf>();
    return *dmabuf_;
  }

  RemoteRegion import_region(std::span<const std::byte> peer_key) override {
    const RegionKey key = parse_region_key(peer_key);
    return RemoteRegion(std::make_unique<RemoteImpl>(key), static_cast<std::size_t>(key.length));
  }

  std::unique_ptr<ListenHandle> listen() override {
    RINGFENCE_EXPECTS(dev_ != nullptr, "rank {}: ibverbs listen(): no usable HCA port ({})", self_.rank, unusable_);
    ConnInfo info;
    info.rank = static_cast<std::uint32_t>(self_.rank);
    info.lid = dev_->port_attr.lid;
    info.port = static_cast<std::uint8_t>(dev_->port);
    info.mtu = static_cast<std::uint8_t>(dev_->port_attr.active_mtu);
    info.link_layer = dev_->port_attr.link_layer;
    std::memcpy(info.gid.data(), dev_->gid.raw, info.gid.size());
    std::random_device rd;
    info.psn = rd() & 0xffffff;
    info.qpns.assign(static_cast<std::size_t>(size_), 0);
    // One queue pair per possible peer, so one published address serves every connect().
    std::vector<QpSet> qps(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      if (r == self_.rank) continue;
      qps[static_cast<std::size_t>(r)] = make_qp(dev_, r);
      info.qpns[static_cast<std::size_t>(r)] = qps[static_cast<std::size_t>(r)].qp->qp_num;
    }
    return std::make_unique<IbListen>(std::move(info), std::move(qps));
  }

  std::unique_ptr<PendingLink> connect(ListenHandle& local, const PeerInfo& peer,
                                       std::span<const std::byte> peer_address) override {
    auto* listen = dynamic_cast<IbListen*>(&local);
    RINGFENCE_EXPECTS(listen != nullptr, "rank {}: ibverbs connect() to rank {} with another transport's listen handle",
                      self_.rank, peer.rank);
    const ConnInfo remote = parse_conn_info(peer_address);
    RINGFENCE_EXPECTS(remote.rank == static_cast<std::uint32_t>(peer.rank) && remote.qpns.size() == static_cast<std::size_t>(size_),
                      "rank {}: ibverbs address for rank {} describes rank {} of {} ranks (expected {} ranks)", self_.rank,
                      peer.rank, remote.rank, remote.qpns.size(), size_);
    RINGFENCE_EXPECTS(peer.rank >= 0 && peer.rank < size_ && peer.rank != self_.rank, "rank {}: ibverbs connect(): bad peer rank {}",
                      self_.rank, peer.rank);
    QpSet qp = std::move(listen->qps()[static_cast<std::size_t>(peer.rank)]);
    RINGFENCE_EXPECTS(qp.qp != nullptr, "rank {}: ibverbs connect() to rank {} twice on one listen handle", self_.rank, peer.rank);
    const QpParams params = params_of(*dev_);
    QpTransition rtr = rtr_transition(params, remote, remote.qpns[static_cast<std::size_t>(self_.rank)]);
    if (const int rc = dev_->verbs->modify_qp(qp.qp, &rtr.attr, rtr.mask); rc != 0)
      throw IbvError(fmt::format("rank {}: ibv_modify_qp INIT->RTR towards rank {} (lid {}, qpn {:#x}) failed: {}", self_.rank,
                                 peer.rank, remote.lid, rtr.attr.dest_qp_num, std::strerror(rc)),
                     rc);
    QpTransition rts = rts_transition(params, listen->info().psn);
    if (const int rc = dev_->verbs->modify_qp(qp.qp, &rts.attr, rts.mask); rc != 0)
      throw IbvError(fmt::format("rank {}: ibv_modify_qp RTR->RTS towards rank {} failed: {}", self_.rank, peer.rank, std::strerror(rc)), rc);
    return std::make_unique<transport_util::ReadyPendingLink>(std::make_unique<IbLink>(dev_, std::move(qp), peer.rank));
  }

 private:
  void open(std::unique_ptr<Verbs> verbs, const IbverbsOptions& options, const HcaFilter& filter) {
    int n = 0;
    ibv_device** list = verbs->get_device_list(&n);
    if (!list || n == 0) {
      unusable_ = "no InfiniBand/RoCE device (ibv_get_device_list found none)";
      if (list) verbs->free_device_list(list);
      return;
    }
    // Enumerate every device's ports, then choose (pure: choose_port).
    std::vector<HcaPort> ports;
    std::vector<int> device_of;
    for (int d = 0; d < n; ++d) {
      ibv_context* ctx = verbs->open_device(list[d]);
      if (!ctx) continue;
      ibv_device_attr attr{};
      const int phys = verbs->query_device(ctx, &attr) == 0 ? attr.phys_port_cnt : 1;
      for (int p = 1; p <= phys; ++p) {
        ibv_port_attr pa{};
        const bool ok = verbs->query_port(ctx, static_cast<std::uint8_t>(p), &pa) == 0;
        ports.push_back(HcaPort{verbs->get_device_name(list[d]), p, ok && pa.state == IBV_PORT_ACTIVE});
        device_of.push_back(d);
      }
      verbs->close_device(ctx);
    }
    const auto choice = choose_port(ports, filter);
    if (!choice) {
      unusable_ = fmt::format("no ACTIVE port among {} port(s) passes RINGFENCE_IB_HCA='{}'", ports.size(), options.hca);
      verbs->free_device_list(list);
      return;
    }
    const int d = device_of[static_cast<std::size_t>(std::find_if(ports.begin(), ports.end(), [&](const HcaPort& p) {
                                                        return p.device == choice->device && p.port == choice->port;
                                                      }) - ports.begin())];
    auto dev = std::make_shared<Device>();
    dev->options = options;
    dev->log = log_;
    dev->rank = self_.rank;
    dev->name = choice->device;
    dev->port = choice->port;
    dev->ctx = verbs->open_device(list[d]);
    Verbs& v = *verbs;
    dev->verbs = std::move(verbs);
    v.free_device_list(list);
    if (!dev->ctx) {
      unusable_ = fmt::format("ibv_open_device({}) failed: {}", dev->name, std::strerror(errno));
      return;
    }
    // Async events are drained from poll(); the fd must not block.
    const int flags = ::fcntl(dev->ctx->async_fd, F_GETFL);
    if (flags < 0 || ::fcntl(dev->ctx->async_fd, F_SETFL, flags | O_NONBLOCK) < 0) {
      unusable_ = fmt::format("{}: cannot make the async event fd non-blocking: {}", dev->name, std::strerror(errno));
      return;
    }
    if (v.query_port(dev->ctx, static_cast<std::uint8_t>(dev->port), &dev->port_attr) != 0 ||
        v.query_gid(dev->ctx, static_cast<std::uint8_t>(dev->port), options.gid_index, &dev->gid) != 0) {
      unusable_ = fmt::format("{}:{}: ibv_query_port/ibv_query_gid(index {}) failed: {}", dev->name, dev->port, options.gid_index,
                              std::strerror(errno));
      return;
    }
    dev->pd = v.alloc_pd(dev->ctx);
    if (!dev->pd) {
      unusable_ = fmt::format("ibv_alloc_pd({}) failed: {}", dev->name, std::strerror(errno));
      return;
    }
    dev->gbps = port_gbps(dev->port_attr.active_width, dev->port_attr.active_speed);
    dev_ = std::move(dev);
  }

  PeerInfo self_;
  int size_ = 1;
  Logger own_log_{LogLevel::Warn, -1};  // used when the context brings no logger
  const Logger* log_ = nullptr;
  std::shared_ptr<Device> dev_;  // null: unusable_ says why
  std::string unusable_;
  std::mutex dmabuf_mu_;
  std::unique_ptr<CudaDmaBuf> dmabuf_;  // the CUDA driver, loaded at the first device registration
};

}  // namespace

std::unique_ptr<Transport> make_transport(const TransportContext& context) { return std::make_unique<IbTransport>(context); }

}  // namespace ringfence::transports::ibverbs
