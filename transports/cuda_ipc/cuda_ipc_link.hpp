#pragma once
// The CUDA IPC link (CudaLink), the data plane: copies on a CUDA stream (pcie: staged through
// pinned host memory), events, and signals stored into the peer's shm flag. Inline (hot).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <ringfence/transport.hpp>
#include <ringfence/transport_util.hpp>
#include <ringfence/transports/cuda_ipc.hpp>
#include <span>
#include <utility>

#include <ringfence/detail/cuda_api.hpp>
#include "cuda_ipc_shared.hpp"

namespace ringfence::transports::cuda_ipc {

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

}  // namespace ringfence::transports::cuda_ipc
