#include "device_staging.hpp"

#include <fmt/format.h>

#include <list>
#include <ringfence/error.hpp>

namespace ringfence::detail {

// Host functions run on a CUDA runtime thread and may not call CUDA: they only touch this.
struct DeviceStager::Shared {
  mutable std::mutex mutex;
  std::condition_variable cv;        // a slot was released or a gate changed
  std::list<Slot> slots;             // stable addresses
  std::size_t pending = 0;           // calls whose release has not run
};

struct DeviceStager::CallState {
  std::shared_ptr<Shared> shared;
  Slot* slot = nullptr;
  bool input_ready = false;  // the input copy landed (guarded by shared->mutex)
  bool work_set = false;     // `work` is the queued collective
  bool cancelled = false;    // nothing was queued: the wait returns at once
  Work work;

  static void on_input(void* p) noexcept {
    auto* g = static_cast<CallState*>(p);
    std::lock_guard lock(g->shared->mutex);
    g->input_ready = true;
    g->shared->cv.notify_all();
  }
  // Holds the stream until the host collective finished (the copy back follows it). The
  // collective is bounded by the communicator's deadlines and by abort(), so this is too.
  static void on_wait(void* p) noexcept {
    auto* g = static_cast<CallState*>(p);
    Work w;
    {
      std::unique_lock lock(g->shared->mutex);
      g->shared->cv.wait(lock, [&] { return g->work_set || g->cancelled; });
      if (g->cancelled) return;
      w = g->work;
    }
    // Its error, if any, is the communicator's failure (async_error() and the next call).
    try {
      while (!w.wait_for(std::chrono::milliseconds(100))) {
      }
    } catch (...) {
    }
  }
  // The last host function of a call: the slot may be reused, the gate freed.
  static void on_release(void* p) noexcept {
    auto* g = static_cast<CallState*>(p);
    std::shared_ptr<Shared> shared = g->shared;
    {
      std::lock_guard lock(shared->mutex);
      g->slot->busy = false;
      --shared->pending;
      shared->cv.notify_all();
    }
    delete g;
  }
};

DeviceStager::DeviceStager(int rank, const char* call, const std::string& cudart_path, std::size_t max_slots)
    : rank_(rank), api_(load_cuda_api(cudart_path)), max_slots_(max_slots < 1 ? 1 : max_slots), shared_(std::make_shared<Shared>()) {
  if (!api_.usable)
    throw CudaError(fmt::format("rank {}: {} on a CUDA stream: no usable CUDA runtime: {}", rank, call, api_.why_not), 0);
}

DeviceStager::~DeviceStager() {
  std::vector<void*> idle;
  {
    std::unique_lock lock(shared_->mutex);
    shared_->cv.wait_for(lock, drain_bound, [&] { return shared_->pending == 0; });
    for (Slot& s : shared_->slots)
      if (!s.busy && s.mem != nullptr) idle.push_back(s.mem);  // a busy slot's stream may still copy: left allocated
  }
  for (void* mem : idle) api_.free_host(mem);  // outside the lock: cudaFreeHost may wait for host functions
}

std::size_t DeviceStager::staging_bytes() const {
  std::lock_guard lock(shared_->mutex);
  std::size_t total = 0;
  for (const Slot& s : shared_->slots) total += s.capacity;
  return total;
}

std::size_t DeviceStager::pending() const {
  std::lock_guard lock(shared_->mutex);
  return shared_->pending;
}

DeviceStager::Slot* DeviceStager::acquire(const char* call, std::size_t bytes, std::chrono::milliseconds wait) {
  Slot* chosen = nullptr;
  {
    std::unique_lock lock(shared_->mutex);
    const bool got = shared_->cv.wait_for(lock, wait, [&] {
      chosen = nullptr;
      for (Slot& s : shared_->slots)
        if (!s.busy && (chosen == nullptr || s.capacity > chosen->capacity)) chosen = &s;
      return chosen != nullptr || shared_->slots.size() < max_slots_;
    });
    if (!got)
      throw TimeoutError(fmt::format("rank {}: {} on a CUDA stream: all {} staging slots stayed in use for {} ms (are the "
                                     "streams of earlier calls blocked?)",
                                     rank_, call, max_slots_, wait.count()));
    if (chosen == nullptr) chosen = &shared_->slots.emplace_back();
    chosen->busy = true;  // reserved: CUDA calls below run without the lock (they may synchronise)
  }
  if (chosen->capacity >= bytes) return chosen;
  // Grow: a control-plane allocation (first use of a larger size), like NCCL's buffers.
  if (chosen->mem != nullptr) api_.free_host(chosen->mem);
  chosen->mem = nullptr;
  chosen->capacity = 0;
  void* mem = nullptr;
  const std::size_t want = bytes < 4096 ? 4096 : bytes;
  if (const int err = api_.host_alloc(&mem, want, kCudaHostAllocPortable); err != kCudaSuccess) {
    {
      std::lock_guard lock(shared_->mutex);
      chosen->busy = false;
      shared_->cv.notify_all();
    }
    throw CudaError(fmt::format("rank {}: {} on a CUDA stream: {} for {} bytes of staging", rank_, call,
                                api_.describe("cudaHostAlloc", err), want),
                    err);
  }
  chosen->mem = static_cast<std::byte*>(mem);
  chosen->capacity = want;
  return chosen;
}

void DeviceStager::run(const char* call, void* stream, const void* src, std::size_t in_bytes, void* dst, std::size_t out_bytes,
                       std::chrono::milliseconds input_wait, const Issue& issue) {
  const std::size_t out_at = (in_bytes + 255) / 256 * 256;
  Slot* slot = acquire(call, out_at + out_bytes, input_wait);
  auto* gate = new CallState{shared_, slot};
  {
    std::lock_guard lock(shared_->mutex);
    ++shared_->pending;
  }
  std::byte* in = slot->mem;
  std::byte* out = slot->mem + out_at;
  auto cuda = [&](const char* what, int err) {
    if (err != kCudaSuccess)
      throw CudaError(fmt::format("rank {}: {} on a CUDA stream: {}", rank_, call, api_.describe(what, err)), err);
  };
  // Until the release is enqueued, a failure here must undo what the stream will not.
  auto undo = [&] {
    std::lock_guard lock(shared_->mutex);
    gate->cancelled = true;
    shared_->cv.notify_all();
  };
  try {
    if (in_bytes > 0) cuda("cudaMemcpyAsync (input to staging)", api_.memcpy_async(in, src, in_bytes, kCudaMemcpyDefault, stream));
    cuda("cudaLaunchHostFunc (input gate)", api_.launch_host_func(stream, &CallState::on_input, gate));
  } catch (...) {
    // Nothing of this call can run after the failed enqueue except a landed copy into the
    // slot, and a copy enqueued before a failing launch may still be in flight: keep the slot
    // busy (lost) rather than reuse memory a copy may still write.
    undo();
    std::lock_guard lock(shared_->mutex);
    --shared_->pending;
    if (in_bytes == 0) slot->busy = false;
    // The gate is referenced by no host function when the launch failed; with a successful
    // launch this path is not taken.
    delete gate;
    throw;
  }
  Work work;
  std::exception_ptr issue_error;
  try {
    work = issue(in, out, [sh = shared_, gate](std::chrono::milliseconds slice) {
      std::unique_lock lock(sh->mutex);
      return sh->cv.wait_for(lock, slice, [&] { return gate->input_ready; });
    });
  } catch (...) {
    issue_error = std::current_exception();
  }
  {
    std::lock_guard lock(shared_->mutex);
    if (issue_error) {
      gate->cancelled = true;
    } else {
      gate->work = work;
      gate->work_set = true;
    }
    shared_->cv.notify_all();
  }
  // From here the gate belongs to the stream: on_release frees it. A failure to enqueue one of
  // these leaves the call's slot in use for good (reported, never reused while a copy may run).
  cuda("cudaLaunchHostFunc (wait for the collective)", api_.launch_host_func(stream, &CallState::on_wait, gate));
  if (!issue_error && out_bytes > 0)
    cuda("cudaMemcpyAsync (result from staging)", api_.memcpy_async(dst, out, out_bytes, kCudaMemcpyDefault, stream));
  cuda("cudaLaunchHostFunc (release staging)", api_.launch_host_func(stream, &CallState::on_release, gate));
  if (issue_error) std::rethrow_exception(issue_error);
}

}  // namespace ringfence::detail
