#include "device_staging.hpp"

#include <fmt/format.h>

#include <condition_variable>
#include <cstring>
#include <new>
#include <mutex>
#include <ringfence/error.hpp>
#include <thread>
#include <vector>

namespace ringfence::detail {

// The call's one host function where the driver has no cuStreamWaitValue32: holds the stream
// until the host collective finished (the copy back follows it). The collective is bounded by
// the communicator's deadlines and by abort(); with one rank per process it depends on no host
// function, so this is bounded too (with several, see the header's comment).
struct DeviceStager::CallState {
  std::mutex mutex;
  std::condition_variable cv;
  bool work_set = false;   // `work` is the queued collective
  bool cancelled = false;  // nothing was queued: return at once
  Work work;

  static void on_wait(void* p) noexcept {
    auto* s = static_cast<CallState*>(p);
    Work w;
    bool run = false;
    {
      std::unique_lock lock(s->mutex);
      s->cv.wait(lock, [&] { return s->work_set || s->cancelled; });
      run = s->work_set;
      w = s->work;
    }
    delete s;  // the last user of the state
    if (!run) return;
    // Its error, if any, is the communicator's failure (async_error() and the next call).
    try {
      while (!w.wait_for(std::chrono::milliseconds(100))) {
      }
    } catch (...) {
    }
  }
};

DeviceStager::DeviceStager(int rank, const char* call, const std::string& cudart_path, std::size_t max_slots)
    : rank_(rank), api_(load_cuda_api(cudart_path)), max_slots_(max_slots < 1 ? 1 : max_slots) {
  if (!api_.usable)
    throw CudaError(fmt::format("rank {}: {} on a CUDA stream: no usable CUDA runtime: {}", rank, call, api_.why_not), 0);
  wait_value_ = api_.stream_wait_value32 != nullptr && api_.host_get_device_pointer != nullptr;
}

DeviceStager::~DeviceStager() {
  const auto deadline = std::chrono::steady_clock::now() + drain_bound;
  while (pending() > 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  bool any_busy = false;
  for (Slot& s : slots_) {
    if (s.busy) {  // a stream may still copy into it, record its events or wait for its word: left allocated
      any_busy = true;
      continue;
    }
    if (s.mem != nullptr) api_.free_host(s.mem);
    if (s.input_done != nullptr) api_.event_destroy(s.input_done);
    if (s.released != nullptr) api_.event_destroy(s.released);
  }
  if (end_words_ != nullptr && !any_busy) api_.free_host(end_words_);
}

void DeviceStager::give_end_word(Slot& slot, std::size_t index) {
  constexpr std::size_t kLine = 64;  // one cache line per slot: the progress thread stores, the GPU polls
  if (end_words_ == nullptr) {
    void* mem = nullptr;
    void* device = nullptr;
    if (api_.host_alloc(&mem, max_slots_ * kLine, kCudaHostAllocPortable | kCudaHostAllocMapped) != kCudaSuccess) {
      wait_value_ = false;
      return;
    }
    if (api_.host_get_device_pointer(&device, mem, 0) != kCudaSuccess) {
      api_.free_host(mem);
      wait_value_ = false;
      return;
    }
    std::memset(mem, 0, max_slots_ * kLine);
    end_words_ = static_cast<std::byte*>(mem);
    end_words_device_ = reinterpret_cast<unsigned long long>(device);
  }
  slot.end_word = new (end_words_ + index * kLine) std::atomic<std::uint32_t>(0);
  slot.end_word_device = end_words_device_ + index * kLine;
}

std::shared_ptr<CallEnd> DeviceStager::hold_on_word(Slot& slot, void* stream) {
  // The word counts the slot's ended calls: a free slot's stream passed its last wait, so the
  // word holds that call's count (wrapping: GEQ compares the difference).
  const std::uint32_t target = slot.end_word->load(std::memory_order_acquire) + 1;
  if (api_.stream_wait_value32(stream, slot.end_word_device, target, kCuStreamWaitValueGeq) != kCudaSuccess) {
    wait_value_ = false;  // a driver without stream memory operations: host functions from now on
    return nullptr;
  }
  return std::make_shared<CallEnd>(*slot.end_word, target);
}

void DeviceStager::reap() const {
  for (Slot& s : slots_)
    if (s.busy && s.armed && api_.event_query(s.released) == kCudaSuccess) {
      s.busy = false;
      s.armed = false;
    }
}

std::size_t DeviceStager::staging_bytes() const {
  std::size_t total = 0;
  for (const Slot& s : slots_) total += s.capacity;
  return total;
}

std::size_t DeviceStager::pending() const {
  reap();
  std::size_t n = 0;
  for (const Slot& s : slots_) n += s.busy && s.armed ? 1 : 0;  // busy and unarmed: lost to a failed enqueue
  return n;
}

DeviceStager::Slot* DeviceStager::acquire(const char* call, std::size_t bytes, std::chrono::milliseconds wait) {
  auto cuda = [&](const char* what, int err) {
    if (err != kCudaSuccess)
      throw CudaError(fmt::format("rank {}: {} on a CUDA stream: {}", rank_, call, api_.describe(what, err)), err);
  };
  const auto deadline = std::chrono::steady_clock::now() + wait;
  Slot* chosen = nullptr;
  for (auto pause = std::chrono::microseconds(20);; pause = std::min(pause * 2, std::chrono::microseconds(1000))) {
    reap();
    for (Slot& s : slots_)
      if (!s.busy && (chosen == nullptr || s.capacity > chosen->capacity)) chosen = &s;
    if (chosen != nullptr || slots_.size() < max_slots_) break;
    if (std::chrono::steady_clock::now() >= deadline)
      throw TimeoutError(fmt::format("rank {}: {} on a CUDA stream: all {} staging slots stayed in use for {} ms (are the "
                                     "streams of earlier calls blocked?)",
                                     rank_, call, max_slots_, wait.count()));
    std::this_thread::sleep_for(pause);
  }
  if (chosen == nullptr) {
    // A new slot: its two events are made once (control plane).
    Slot fresh;
    cuda("cudaEventCreateWithFlags", api_.event_create(&fresh.input_done, kCudaEventDisableTiming));
    if (const int err = api_.event_create(&fresh.released, kCudaEventDisableTiming); err != kCudaSuccess) {
      api_.event_destroy(fresh.input_done);
      cuda("cudaEventCreateWithFlags", err);
    }
    if (wait_value_) give_end_word(fresh, slots_.size());
    chosen = &slots_.emplace_back(fresh);
  }
  if (chosen->capacity < bytes) {
    // Grow: a control-plane allocation (first use of a larger size), like NCCL's buffers.
    if (chosen->mem != nullptr) api_.free_host(chosen->mem);
    chosen->mem = nullptr;
    chosen->capacity = 0;
    void* mem = nullptr;
    const std::size_t want = bytes < 4096 ? 4096 : bytes;
    if (const int err = api_.host_alloc(&mem, want, kCudaHostAllocPortable); err != kCudaSuccess)
      throw CudaError(fmt::format("rank {}: {} on a CUDA stream: {} for {} bytes of staging", rank_, call,
                                  api_.describe("cudaHostAlloc", err), want),
                      err);
    chosen->mem = static_cast<std::byte*>(mem);
    chosen->capacity = want;
  }
  chosen->busy = true;
  chosen->armed = false;
  return chosen;
}

void DeviceStager::run(const char* call, void* stream, std::span<const Piece> inputs, std::span<const Piece> outputs,
                       std::chrono::milliseconds slot_wait, const Issue& issue) {
  std::size_t in_bytes = 0, out_bytes = 0;
  for (const Piece& p : inputs) in_bytes += p.bytes;
  for (const Piece& p : outputs) out_bytes += p.bytes;
  auto cuda = [&](const char* what, int err) {
    if (err != kCudaSuccess)
      throw CudaError(fmt::format("rank {}: {} on a CUDA stream: {}", rank_, call, api_.describe(what, err)), err);
  };
  const std::size_t out_at = (in_bytes + 255) / 256 * 256;
  Slot* slot = acquire(call, out_at + out_bytes, slot_wait);
  std::byte* in = slot->mem;
  std::byte* out = slot->mem + out_at;
  // A failed enqueue before the release event is recorded: with nothing on the stream yet the
  // slot is free again; else the release event is recorded behind what was enqueued (the slot
  // comes back once the stream passed it), and if even that fails the slot stays busy for good
  // (never reused: a copy on the stream may still write it).
  bool enqueued = false;
  auto enqueue = [&](const char* what, int err) {
    if (err == kCudaSuccess) {
      enqueued = true;
      return;
    }
    if (!enqueued) {
      slot->busy = false;
    } else if (api_.event_record(slot->released, stream) == kCudaSuccess) {
      slot->armed = true;
    }
    cuda(what, err);
  };
  for (std::size_t at = 0; const Piece& p : inputs) {
    if (p.bytes > 0) enqueue("cudaMemcpyAsync (input to staging)", api_.memcpy_async(in + at, p.ptr, p.bytes, kCudaMemcpyDefault, stream));
    at += p.bytes;
  }
  enqueue("cudaEventRecord (input copied)", api_.event_record(slot->input_done, stream));
  // Hold the stream until the call ended: on the slot's word, else with a host function.
  std::shared_ptr<CallEnd> end;
  if (wait_value_ && slot->end_word != nullptr) end = hold_on_word(*slot, stream);
  if (end) enqueued = true;
  CallState* state = nullptr;
  if (!end) {
    state = new CallState;
    if (const int err = api_.launch_host_func(stream, &CallState::on_wait, state); err != kCudaSuccess) {
      delete state;  // no host function refers to it
      enqueue("cudaLaunchHostFunc (wait for the collective)", err);
    }
  }
  // From here `state` belongs to its host function (which deletes it).
  Work work;
  std::exception_ptr issue_error;
  try {
    const CudaApi* api = &api_;
    void* event = slot->input_done;
    work = issue(in, out, end, [api, event](std::chrono::milliseconds slice) {
      const auto until = std::chrono::steady_clock::now() + slice;
      for (auto pause = std::chrono::microseconds(10);; pause = std::min(pause * 2, std::chrono::microseconds(500))) {
        const int err = api->event_query(event);
        if (err == kCudaSuccess) return true;
        if (err != kCudaErrorNotReady) throw CudaError(api->describe("cudaEventQuery (input copied)", err), err);
        if (std::chrono::steady_clock::now() >= until) return false;
        std::this_thread::sleep_for(pause);
      }
    });
  } catch (...) {
    issue_error = std::current_exception();
  }
  if (state != nullptr) {
    std::lock_guard lock(state->mutex);
    if (issue_error) {
      state->cancelled = true;
    } else {
      state->work = work;
      state->work_set = true;
    }
    state->cv.notify_all();
  }
  end.reset();  // the queued call holds it now; if none was queued, this releases the stream
  if (!issue_error)
    for (std::size_t at = 0; const Piece& p : outputs) {
      if (p.bytes > 0)
        enqueue("cudaMemcpyAsync (result from staging)", api_.memcpy_async(p.ptr, out + at, p.bytes, kCudaMemcpyDefault, stream));
      at += p.bytes;
    }
  cuda("cudaEventRecord (staging released)", api_.event_record(slot->released, stream));
  slot->armed = true;
  if (issue_error) std::rethrow_exception(issue_error);
}

}  // namespace ringfence::detail
