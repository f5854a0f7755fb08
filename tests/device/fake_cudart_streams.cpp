// A fake CUDA runtime with real asynchrony, built as libcudart.so.13 in its own folder, for
// CPU-only tests of the stream-ordered calls (src/device_staging.cpp). It does what the host
// staging relies on and nothing else:
//   - cudaMalloc returns host memory that cudaPointerGetAttributes reports as device memory;
//   - every stream (the null handle included) is a thread running its queued copies, event
//     records and host functions in order; cudaStreamSynchronize waits for it;
//   - host functions of every stream run on ONE callback thread per process, as the CUDA
//     runtime may do ("may be serialized"): a host function that waited for another stream's
//     host function would deadlock here as it can on a GPU;
//   - events: cudaEventRecord completes when the stream reaches it, cudaEventQuery says so
//     (cudaErrorNotReady, 600, before);
//   - every asynchronous copy sleeps a little first (fake_cuda_set_copy_delay_us, default
//     500 us), so code that read a copy's destination before the stream reached it would see
//     the old bytes;
//   - fake_cuda_hold(stream, 1) stops a stream before its next operation until
//     fake_cuda_hold(stream, 0): tests prove that a call returned before its work ran;
//   - FAKE_CUDA_DEVICES=0 (or "driver") makes cudaGetDeviceCount report no device (or
//     cudaErrorInsufficientDriver, 35), as on a machine without a GPU or driver.
// cudaFreeHost and cudaHostAlloc count live pinned buffers (fake_cuda_pinned_live).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <mutex>
#include <thread>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr int kInvalidHandle = 400;  // cudaErrorInvalidResourceHandle

struct Stream {
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::function<void()>> ops;
  bool busy = false, hold = false, stop = false;
  std::thread thread;

  Stream() : thread([this] { loop(); }) {}
  ~Stream() {
    {
      std::lock_guard l(m);
      stop = true;
      cv.notify_all();
    }
    thread.join();
  }
  void loop() {
    std::unique_lock l(m);
    for (;;) {
      cv.wait(l, [&] { return stop || (!hold && !ops.empty()); });
      if (ops.empty()) return;
      auto op = std::move(ops.front());
      ops.pop_front();
      busy = true;
      l.unlock();
      op();
      l.lock();
      busy = false;
      cv.notify_all();
    }
  }
  void push(std::function<void()> op) {
    std::lock_guard l(m);
    ops.push_back(std::move(op));
    cv.notify_all();
  }
  void sync() {
    std::unique_lock l(m);
    cv.wait(l, [&] { return ops.empty() && !busy; });
  }
};

// The one thread that runs host functions (never joined: it lives as long as the process).
struct Callbacks {
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::function<void()>> q;
  Callbacks() {
    std::thread([this] {
      std::unique_lock l(m);
      for (;;) {
        cv.wait(l, [&] { return !q.empty(); });
        auto fn = std::move(q.front());
        q.pop_front();
        l.unlock();
        fn();
        l.lock();
      }
    }).detach();
  }
  // Runs `fn` on the callback thread and waits for it (the stream is blocked meanwhile).
  void run(const std::function<void()>& fn) {
    std::mutex done_m;
    std::condition_variable done_cv;
    bool done = false;
    {
      std::lock_guard l(m);
      q.push_back([&] {
        fn();
        std::lock_guard dl(done_m);
        done = true;
        done_cv.notify_all();
      });
      cv.notify_all();
    }
    std::unique_lock dl(done_m);
    done_cv.wait(dl, [&] { return done; });
  }
};

struct Event {
  std::atomic<std::uint64_t> recorded{0}, completed{0};
};

struct State {
  std::mutex m;
  std::map<std::uintptr_t, std::size_t> device;  // cudaMalloc'ed ranges
  std::atomic<int> pinned{0};
  std::atomic<unsigned> delay_us{500};
  Stream* null_stream = nullptr;
  std::set<void*> streams;  // live cudaStreamCreate handles
  Callbacks* callbacks = new Callbacks;  // never destroyed (its thread is detached)
};

State& state() {
  static State s;
  return s;
}

// The stream of `handle`, or nullptr for a handle cudaStreamCreate did not return.
Stream* resolve(void* handle) {
  State& s = state();
  std::lock_guard l(s.m);
  if (handle != nullptr) return s.streams.count(handle) != 0 ? static_cast<Stream*>(handle) : nullptr;
  if (s.null_stream == nullptr) s.null_stream = new Stream;  // lives as long as the process
  return s.null_stream;
}

bool is_device(const void* p) {
  State& s = state();
  std::lock_guard l(s.m);
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto it = s.device.upper_bound(a);
  if (it == s.device.begin()) return false;
  --it;
  return a < it->first + it->second;
}

}  // namespace

struct FakeAttributes {
  int type;
  int device;
  void* device_pointer;
  void* host_pointer;
};

FAKE_EXPORT int cudaGetDeviceCount(int* count) {
  const char* v = std::getenv("FAKE_CUDA_DEVICES");
  if (v != nullptr && std::strcmp(v, "driver") == 0) return 35;  // cudaErrorInsufficientDriver
  *count = v != nullptr ? std::atoi(v) : 1;
  return 0;
}
FAKE_EXPORT int cudaGetDevice(int* device) {
  *device = 0;
  return 0;
}
FAKE_EXPORT int cudaSetDevice(int) { return 0; }
FAKE_EXPORT const char* cudaGetErrorString(int err) {
  return err == 0                ? "no error (fake)"
         : err == 35             ? "CUDA driver version is insufficient for CUDA runtime version (fake)"
         : err == kInvalidHandle ? "invalid resource handle (fake)"
                                 : "error (fake)";
}
FAKE_EXPORT int cudaPointerGetAttributes(FakeAttributes* a, const void* p) {
  std::memset(a, 0, sizeof *a);
  if (is_device(p)) {
    a->type = 2;  // cudaMemoryTypeDevice
    a->device_pointer = const_cast<void*>(p);
  } else {
    a->device = -2;
    a->host_pointer = const_cast<void*>(p);
  }
  return 0;
}
FAKE_EXPORT int cudaMalloc(void** p, std::size_t n) {
  *p = std::malloc(n == 0 ? 1 : n);
  State& s = state();
  std::lock_guard l(s.m);
  s.device[reinterpret_cast<std::uintptr_t>(*p)] = n == 0 ? 1 : n;
  return 0;
}
FAKE_EXPORT int cudaFree(void* p) {
  if (p == nullptr) return 0;
  {
    State& s = state();
    std::lock_guard l(s.m);
    s.device.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  std::free(p);
  return 0;
}
FAKE_EXPORT int cudaHostAlloc(void** p, std::size_t n, unsigned) {
  *p = std::malloc(n);
  ++state().pinned;
  return *p != nullptr ? 0 : 2;
}
FAKE_EXPORT int cudaFreeHost(void* p) {
  std::free(p);
  --state().pinned;
  return 0;
}
FAKE_EXPORT int cudaStreamCreate(void** stream) {
  *stream = new Stream;
  State& s = state();
  std::lock_guard l(s.m);
  s.streams.insert(*stream);
  return 0;
}
FAKE_EXPORT int cudaStreamDestroy(void* stream) {
  Stream* st = resolve(stream);
  if (st == nullptr || stream == nullptr) return kInvalidHandle;
  st->sync();
  {
    State& s = state();
    std::lock_guard l(s.m);
    s.streams.erase(stream);
  }
  delete st;
  return 0;
}
FAKE_EXPORT int cudaStreamSynchronize(void* stream) {
  Stream* st = resolve(stream);
  if (st == nullptr) return kInvalidHandle;
  st->sync();
  return 0;
}
FAKE_EXPORT int cudaMemcpy(void* dst, const void* src, std::size_t n, int) {
  resolve(nullptr)->sync();
  if (n > 0) std::memmove(dst, src, n);
  return 0;
}
FAKE_EXPORT int cudaMemcpyAsync(void* dst, const void* src, std::size_t n, int, void* stream) {
  Stream* st = resolve(stream);
  if (st == nullptr) return kInvalidHandle;
  st->push([=] {
    std::this_thread::sleep_for(std::chrono::microseconds(state().delay_us.load()));
    if (n > 0) std::memmove(dst, src, n);
  });
  return 0;
}
FAKE_EXPORT int cudaLaunchHostFunc(void* stream, void (*fn)(void*), void* arg) {
  Stream* st = resolve(stream);
  if (st == nullptr) return kInvalidHandle;
  st->push([=] { state().callbacks->run([=] { fn(arg); }); });
  return 0;
}
FAKE_EXPORT int cudaEventCreateWithFlags(void** event, unsigned) {
  *event = new Event;
  return 0;
}
FAKE_EXPORT int cudaEventDestroy(void* event) {
  delete static_cast<Event*>(event);
  return 0;
}
FAKE_EXPORT int cudaEventRecord(void* event, void* stream) {
  Stream* st = resolve(stream);
  if (st == nullptr) return kInvalidHandle;
  auto* e = static_cast<Event*>(event);
  const std::uint64_t gen = ++e->recorded;
  st->push([e, gen] { e->completed = gen; });
  return 0;
}
FAKE_EXPORT int cudaEventQuery(void* event) {
  auto* e = static_cast<Event*>(event);
  return e->completed.load() >= e->recorded.load() ? 0 : 600;  // cudaErrorNotReady
}

// Test hooks.
FAKE_EXPORT void fake_cuda_hold(void* stream, int hold) {
  Stream* s = resolve(stream);
  if (s == nullptr) return;
  std::lock_guard l(s->m);
  s->hold = hold != 0;
  s->cv.notify_all();
}
FAKE_EXPORT int fake_cuda_pinned_live() { return state().pinned.load(); }
FAKE_EXPORT void fake_cuda_set_copy_delay_us(unsigned us) { state().delay_us = us; }
FAKE_EXPORT int cudaDeviceSynchronize() {
  resolve(nullptr)->sync();
  return 0;
}
