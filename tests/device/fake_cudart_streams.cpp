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
//     (cudaErrorNotReady, 600, before); cudaEventElapsedTime gives the time between two
//     completed records of events made without cudaEventDisableTiming (else 400, as CUDA);
//   - every asynchronous copy sleeps a little first (fake_cuda_set_copy_delay_us, default
//     500 us), so code that read a copy's destination before the stream reached it would see
//     the old bytes;
//   - fake_cuda_slow_copies(from, to, us) makes copies on streams of device `from` into memory
//     cudaMalloc'ed on device `to` sleep `us` more (a degraded link between two GPUs);
//   - cuStreamWaitValue32 (GEQ only), found through cudaGetDriverEntryPointByVersion as the
//     library finds it (built with FAKE_CUDART_12_0: through cudaGetDriverEntryPoint only, as a
//     CUDA 12.0-12.4 runtime), holds a stream until a 32-bit word reaches a value (polled every 20 us);
//     fake_cuda_memory_waits(0) makes the entry point unknown, as on a driver without stream
//     memory operations; fake_cuda_counts gives the host functions and waits enqueued so far;
//   - fake_cuda_hold(stream, 1) stops a stream before its next operation until
//     fake_cuda_hold(stream, 0): tests prove that a call returned before its work ran;
//   - FAKE_CUDA_DEVICES=0 (or "driver") makes cudaGetDeviceCount report no device (or
//     cudaErrorInsufficientDriver, 35), as on a machine without a GPU or driver.
// cudaFreeHost and cudaHostAlloc count live pinned buffers (fake_cuda_pinned_live).
// fake_cuda_launch_kernel runs a function on a stream's thread, in order (the fake kernel module);
// fake_cuda_sync_device_streams waits for every stream of a device (its lazy kernel loading).
// For the CUDA IPC transports (transports/cuda_ipc):
//   - cudaMalloc memory lives in a POSIX shared-memory segment (/dev/shm/fakecuda-<pid>-<n>;
//     those of dead processes are removed at a process's first cudaMalloc), so
//     cudaIpcGetMemHandle can name it and another process can cudaIpcOpenMemHandle it (a
//     mapping reported as device memory);
//     as on CUDA, a handle of an interior pointer is refused here (CUDA would silently give the
//     whole allocation's) and a process cannot open its own handle;
//   - devices: FAKE_CUDA_DEVICES of them (default 1), cudaSetDevice / cudaGetDevice per
//     thread (as in CUDA; a thread starts on device 0); peer access between two of them unless
//     FAKE_CUDA_P2P=0; cudaDeviceGetPCIBusId gives the d-th entry of FAKE_CUDA_BUS_IDS (comma-
//     separated) or "0000:0d:00.0" (d in hex);
//   - cudaStreamWaitEvent makes a stream wait for the event's latest record;
//   - the CUDA driver's dma-buf export (cuInit, cuMemGetHandleForAddressRange, cuGetErrorString:
//     the ibverbs transport's GPUDirect RDMA path loads them from this library by path in
//     tests): whole pages inside one allocation give an fd of its segment, anything else
//     CUDA_ERROR_INVALID_VALUE (1).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr int kInvalidHandle = 400;  // cudaErrorInvalidResourceHandle

struct Stream {
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::function<void()>> ops;
  bool busy = false, hold = false, stop = false;
  int device = 0;  // the creating thread's current device (cudaStreamCreate)
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
  bool timing = true;                   // created without cudaEventDisableTiming
  std::atomic<std::int64_t> at_ns{0};   // steady clock at the latest completion
};

// A device allocation: a shared-memory segment mapped here (cudaMalloc'ed or IPC-opened).
struct Allocation {
  std::size_t bytes = 0;
  std::string name;     // the segment ("/fakecuda-<pid>-<n>")
  bool opened = false;  // mapped by cudaIpcOpenMemHandle (closed with cudaIpcCloseMemHandle)
  int device = -1;      // cudaMalloc'ed on this device (-1: opened from another process)
};

// What cudaIpcGetMemHandle writes into the 64 opaque bytes.
struct FakeIpcHandle {
  std::uint32_t magic;
  std::int32_t pid;
  std::uint64_t bytes;
  char name[48];
};
static_assert(sizeof(FakeIpcHandle) == 64);
struct IpcHandleBytes {
  char reserved[64];
};
constexpr std::uint32_t kIpcMagic = 0xfa4ec0daU;

struct State {
  std::mutex m;
  std::map<std::uintptr_t, Allocation> device;  // device ranges mapped in this process
  std::uint64_t next_segment = 0;
  std::set<int> peers_enabled;
  std::atomic<int> pinned{0};
  std::atomic<unsigned> delay_us{500};
  std::map<std::pair<int, int>, unsigned> slow;  // fake_cuda_slow_copies: (stream device, memory device) -> extra us
  Stream* null_stream = nullptr;
  std::set<void*> streams;  // live cudaStreamCreate handles
  Callbacks* callbacks = new Callbacks;  // never destroyed (its thread is detached)
  std::atomic<bool> memory_waits{true};   // cuStreamWaitValue32 offered
  std::atomic<int> host_funcs{0}, waits{0};  // enqueued so far (fake_cuda_counts)
};

thread_local int current_device = 0;  // cudaSetDevice is per host thread

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
  return a < it->first + it->second.bytes;
}

// fake_cuda_slow_copies' extra delay of a copy on a stream of `device` into `dst`.
unsigned extra_delay_us(int device, const void* dst) {
  State& s = state();
  std::lock_guard l(s.m);
  if (s.slow.empty()) return 0;
  const auto a = reinterpret_cast<std::uintptr_t>(dst);
  auto it = s.device.upper_bound(a);
  if (it == s.device.begin()) return 0;
  --it;
  if (a >= it->first + it->second.bytes) return 0;
  const auto slow = s.slow.find({device, it->second.device});
  return slow != s.slow.end() ? slow->second : 0;
}

int device_count() {
  const char* v = std::getenv("FAKE_CUDA_DEVICES");
  return v != nullptr ? std::atoi(v) : 1;
}
bool p2p() {
  const char* v = std::getenv("FAKE_CUDA_P2P");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// Segments of fake device memory whose process is gone (a test killed mid-way): removed once per
// process, at its first cudaMalloc, so /dev/shm does not fill up on a developer's machine.
void remove_stale_segments() {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  while (const dirent* e = ::readdir(dir)) {
    const std::string n(e->d_name);
    if (n.rfind("fakecuda-", 0) != 0) continue;
    const long pid = std::strtol(n.c_str() + 9, nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) ::shm_unlink(("/" + n).c_str());
  }
  ::closedir(dir);
}

void* map_segment(const char* name, std::size_t bytes, bool create) {
  const int fd = ::shm_open(name, create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  if (fd < 0) return nullptr;
  if (create && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    ::close(fd);
    ::shm_unlink(name);
    return nullptr;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  return p == MAP_FAILED ? nullptr : p;
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
  *count = device_count();
  return 0;
}
FAKE_EXPORT int cudaGetDevice(int* device) {
  *device = current_device;
  return 0;
}
FAKE_EXPORT int cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return 101;  // cudaErrorInvalidDevice
  current_device = device;
  return 0;
}
FAKE_EXPORT int cudaDeviceGetPCIBusId(char* out, int len, int device) {
  if (device < 0 || device >= device_count()) return 101;
  if (out == nullptr || len <= 0) return 1;  // cudaErrorInvalidValue
  const char* list = std::getenv("FAKE_CUDA_BUS_IDS");
  if (list == nullptr) {
    std::snprintf(out, static_cast<std::size_t>(len), "0000:%02x:00.0", static_cast<unsigned>(device) & 0xffu);
    return 0;
  }
  std::string_view rest = list;  // entry `device` of the comma-separated list (the last if it is shorter)
  for (int i = 0; i < device && rest.find(',') != std::string_view::npos; ++i) rest.remove_prefix(rest.find(',') + 1);
  const std::string_view id = rest.substr(0, rest.find(','));
  std::snprintf(out, static_cast<std::size_t>(len), "%.*s", static_cast<int>(id.size()), id.data());
  return 0;
}
FAKE_EXPORT int cudaDeviceCanAccessPeer(int* can, int device, int peer) {
  if (device < 0 || device >= device_count() || peer < 0 || peer >= device_count()) return 101;
  *can = device != peer && p2p() ? 1 : 0;
  return 0;
}
FAKE_EXPORT int cudaDeviceEnablePeerAccess(int peer, unsigned) {
  State& s = state();
  std::lock_guard l(s.m);
  if (peer < 0 || peer >= device_count() || peer == current_device) return 101;
  if (!p2p()) return 217;  // cudaErrorPeerAccessUnsupported
  if (!s.peers_enabled.insert(peer).second) return 704;  // cudaErrorPeerAccessAlreadyEnabled
  return 0;
}
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
  if (n == 0) n = 1;
  State& s = state();
  std::lock_guard l(s.m);
  if (s.next_segment == 0) remove_stale_segments();
  const std::string name = "/fakecuda-" + std::to_string(::getpid()) + "-" + std::to_string(s.next_segment++);
  *p = map_segment(name.c_str(), n, true);
  if (*p == nullptr) return 2;  // cudaErrorMemoryAllocation
  s.device[reinterpret_cast<std::uintptr_t>(*p)] = Allocation{n, name, false, current_device};
  return 0;
}
FAKE_EXPORT int cudaFree(void* p) {
  if (p == nullptr) return 0;
  State& s = state();
  std::lock_guard l(s.m);
  auto it = s.device.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == s.device.end() || it->second.opened) return 1;  // cudaErrorInvalidValue
  ::munmap(p, it->second.bytes);
  ::shm_unlink(it->second.name.c_str());
  s.device.erase(it);
  return 0;
}
FAKE_EXPORT int cudaIpcGetMemHandle(IpcHandleBytes* handle, void* p) {
  State& s = state();
  std::lock_guard l(s.m);
  auto it = s.device.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == s.device.end() || it->second.opened) return 1;  // not the base of an allocation of ours
  FakeIpcHandle h{};
  h.magic = kIpcMagic;
  h.pid = ::getpid();
  h.bytes = it->second.bytes;
  std::snprintf(h.name, sizeof h.name, "%s", it->second.name.c_str());
  std::memcpy(handle, &h, sizeof h);
  return 0;
}
FAKE_EXPORT int cudaIpcOpenMemHandle(void** p, IpcHandleBytes handle, unsigned) {
  FakeIpcHandle h{};
  std::memcpy(&h, &handle, sizeof h);
  if (h.magic != kIpcMagic) return 400;
  if (h.pid == ::getpid()) return 201;  // cudaErrorInvalidContext: CUDA refuses a process its own handle
  h.name[sizeof h.name - 1] = 0;
  *p = map_segment(h.name, h.bytes, false);
  if (*p == nullptr) return 205;  // cudaErrorMapBufferObjectFailed
  State& s = state();
  std::lock_guard l(s.m);
  s.device[reinterpret_cast<std::uintptr_t>(*p)] = Allocation{h.bytes, h.name, true, -1};
  return 0;
}
FAKE_EXPORT int cudaIpcCloseMemHandle(void* p) {
  State& s = state();
  std::lock_guard l(s.m);
  auto it = s.device.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == s.device.end() || !it->second.opened) return 1;
  ::munmap(p, it->second.bytes);
  s.device.erase(it);
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
  auto* st = new Stream;
  st->device = current_device;
  *stream = st;
  State& s = state();
  std::lock_guard l(s.m);
  s.streams.insert(*stream);
  return 0;
}
FAKE_EXPORT int cudaStreamCreateWithFlags(void** stream, unsigned) { return cudaStreamCreate(stream); }
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
  const unsigned extra = extra_delay_us(st->device, dst);
  st->push([=] {
    std::this_thread::sleep_for(std::chrono::microseconds(state().delay_us.load() + extra));
    if (n > 0) std::memmove(dst, src, n);
  });
  return 0;
}
FAKE_EXPORT int cudaLaunchHostFunc(void* stream, void (*fn)(void*), void* arg) {
  Stream* st = resolve(stream);
  if (st == nullptr) return kInvalidHandle;
  st->push([=] { state().callbacks->run([=] { fn(arg); }); });
  ++state().host_funcs;
  return 0;
}
// cuStreamWaitValue32 with CU_STREAM_WAIT_VALUE_GEQ (0): the word is in mapped pinned memory,
// here plain host memory; its "device address" is its address.
static int fake_stream_wait_value32(void* stream, unsigned long long address, unsigned value, unsigned flags) {
  Stream* st = resolve(stream);
  if (st == nullptr) return kInvalidHandle;  // CUDA_ERROR_INVALID_HANDLE has the same code
  if (flags != 0 || address == 0) return 1;  // CUDA_ERROR_INVALID_VALUE: only GEQ is faked
  auto* word = reinterpret_cast<std::atomic<std::uint32_t>*>(address);
  st->push([=] {
    while (static_cast<std::int32_t>(word->load(std::memory_order_acquire) - value) < 0)
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  });
  ++state().waits;
  return 0;
}
static int fake_entry_point(const char* symbol, void** fn, int* status) {
  const bool found = state().memory_waits.load() && std::string_view(symbol) == "cuStreamWaitValue32";
  *fn = found ? reinterpret_cast<void*>(&fake_stream_wait_value32) : nullptr;
  if (status != nullptr) *status = found ? 0 : 1;  // cudaDriverEntryPointSymbolNotFound
  return found ? 0 : 500;                          // cudaErrorSymbolNotFound
}
#if defined(FAKE_CUDART_12_0)
// CUDA 12.0-12.4 runtimes have only the entry point of their own driver version (no ...ByVersion).
FAKE_EXPORT int cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long, int* status) {
  return fake_entry_point(symbol, fn, status);
}
#else
FAKE_EXPORT int cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned, unsigned long long, int* status) {
  return fake_entry_point(symbol, fn, status);
}
#endif
FAKE_EXPORT int cudaHostGetDevicePointer(void** device, void* host, unsigned) {
  *device = host;  // unified addressing: the same address
  return 0;
}
FAKE_EXPORT void fake_cuda_memory_waits(int on) { state().memory_waits = on != 0; }
FAKE_EXPORT void fake_cuda_counts(int* host_funcs, int* waits) {
  *host_funcs = state().host_funcs.load();
  *waits = state().waits.load();
}
// A "kernel" (the fake kernel module, fake_kernels.cpp): `fn(arg)` on the stream's own thread,
// in stream order, like work on the GPU. Not a host function: it never waits for the callback
// thread, which a host function waiting for a collective may hold (as on a GPU, where a kernel
// runs while the runtime's callback thread is busy).
// As on CUDA, a kernel launch into a stream of another device than the calling thread's current
// one fails (cudaErrorInvalidResourceHandle); copies and events do not care.
FAKE_EXPORT int fake_cuda_launch_kernel(void* stream, void (*fn)(void*), void* arg) {
  Stream* st = resolve(stream);
  if (st == nullptr) return kInvalidHandle;
  if (stream != nullptr && st->device != current_device) return kInvalidHandle;
  st->push([=] { fn(arg); });
  return 0;
}
FAKE_EXPORT int cudaEventCreateWithFlags(void** event, unsigned flags) {
  auto* e = new Event;
  e->timing = (flags & 2U) == 0;  // cudaEventDisableTiming
  *event = e;
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
  st->push([e, gen] {
    e->at_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
    e->completed = gen;
  });
  return 0;
}
FAKE_EXPORT int cudaEventElapsedTime(float* ms, void* start, void* end) {
  auto* a = static_cast<Event*>(start);
  auto* b = static_cast<Event*>(end);
  if (ms == nullptr || !a->timing || !b->timing || a->recorded.load() == 0 || b->recorded.load() == 0) return kInvalidHandle;
  if (a->completed.load() < a->recorded.load() || b->completed.load() < b->recorded.load()) return 600;  // cudaErrorNotReady
  *ms = static_cast<float>(static_cast<double>(b->at_ns.load() - a->at_ns.load()) / 1e6);
  return 0;
}
FAKE_EXPORT int cudaStreamWaitEvent(void* stream, void* event, unsigned) {
  Stream* st = resolve(stream);
  if (st == nullptr) return kInvalidHandle;
  auto* e = static_cast<Event*>(event);
  const std::uint64_t gen = e->recorded.load();
  st->push([e, gen] {
    while (e->completed.load() < gen) std::this_thread::sleep_for(std::chrono::microseconds(20));
  });
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
FAKE_EXPORT void fake_cuda_slow_copies(int from, int to, unsigned us) {
  State& s = state();
  std::lock_guard l(s.m);
  s.slow[{from, to}] = us;
}
// What CUDA's lazy loading may do when a kernel is first loaded (fake_kernels.cpp): wait until
// every stream of `device` ran dry, a stream stopped inside a host function included. Streams
// must not be destroyed meanwhile (the tests' own streams outlive their calls).
FAKE_EXPORT void fake_cuda_sync_device_streams(int device) {
  std::vector<Stream*> of_device;
  {
    State& s = state();
    std::lock_guard l(s.m);
    for (void* h : s.streams)
      if (static_cast<Stream*>(h)->device == device) of_device.push_back(static_cast<Stream*>(h));
  }
  for (Stream* st : of_device) st->sync();
}
FAKE_EXPORT int cudaDeviceSynchronize() {
  resolve(nullptr)->sync();
  return 0;
}

// The CUDA driver's dma-buf export (transports/ibverbs/dmabuf.cpp).
FAKE_EXPORT int cuInit(unsigned) { return 0; }
FAKE_EXPORT int cuGetErrorString(int err, const char** text) {
  *text = err == 1 ? "invalid argument (fake)" : "error (fake)";
  return 0;
}
FAKE_EXPORT int cuMemGetHandleForAddressRange(void* handle, unsigned long long dptr, std::size_t size, int type,
                                              unsigned long long flags) {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  if (type != 1 || flags != 0 || size == 0 || dptr % page != 0 || size % page != 0) return 1;
  State& s = state();
  std::lock_guard l(s.m);
  auto it = s.device.upper_bound(static_cast<std::uintptr_t>(dptr));
  if (it == s.device.begin()) return 1;
  --it;
  const std::uintptr_t end = (it->first + it->second.bytes + page - 1) / page * page;  // the mapping's last page
  if (dptr < it->first || dptr + size > end) return 1;
  const int fd = ::shm_open(it->second.name.c_str(), O_RDWR, 0);
  if (fd < 0) return 2;
  *static_cast<int*>(handle) = fd;
  return 0;
}
