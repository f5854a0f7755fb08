#pragma once
// The ibverbs transport's link (IbLink): RDMA WRITE and WRITE WITH IMM on one RC queue pair, the
// staging ring for unregistered sources, completions and waits. The data path is inline (hot).
#include <endian.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <ringfence/error.hpp>
#include <ringfence/transport.hpp>
#include <ringfence/transport_util.hpp>
#include <span>
#include <vector>

#include "ibverbs_detail.hpp"
#include "ibverbs_device.hpp"

namespace ringfence::transports::ibverbs::detail {

using transport_util::bump;

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
    if (!remote || (!op.src && op.bytes) || op.bytes > kMaxMessage) return refuse();
    // Never post a write outside the imported region: the HCA would fence us with
    // REM_ACCESS_ERR at best, write a neighbour's memory at worst (a wrong but valid rkey).
    if (!range_ok(op.dst_offset, op.bytes, remote->key.length)) return refuse();
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
      if (op.bytes > staging_size_) return refuse();
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
    // The SPI's placement rule: a whole, 64-aligned SignalFlag inside the region (the value is
    // written into its first 4 bytes).
    if (!remote || !transport_util::flag_in_bounds(op)) return refuse();
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

  // A refused operation (SPI): InvalidUsage, nothing posted, counted in LinkStats::errors.
  Status refuse() noexcept {
    bump(stats_.errors, 1);
    return Status(ErrorCode::InvalidUsage);
  }

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

}  // namespace ringfence::transports::ibverbs::detail
