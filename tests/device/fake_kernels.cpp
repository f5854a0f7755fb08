// A fake libringfence_kernels.so for CPU-only tests (src/device_kernels.hpp): the same C
// interface as src/cuda/kernel_module.cu, running the same functors and the same vectorised loop
// (`reduce_vec16`, as one "thread") as the device kernels. Each launch runs on the stream's
// thread of the fake runtime (`fake_cuda_launch_kernel`), so it runs in stream order after the
// copies before it and before the operations after it, and never waits for the runtime's
// callback thread (which a host function waiting for a collective may hold); it
// sleeps FAKE_KERNELS_DELAY_US first (default 300 us), so code that read a combine's
// destination before the stream reached it sees the old bytes. Counts launches
// (fake_kernels_launches) so tests can tell that a reduction ran "on the device".
// Lazy loading, as CUDA does it by default (seen on an H200, docs/device.md "Kernel loading"):
// the kernels of a device are "loaded" by ringfence_kernels_preload or else by the first combine
// launched on it, and loading first waits until every stream of that device ran dry
// (fake_cuda_sync_device_streams), a stream held inside a host function included. A library
// that launched its first reduction while its own host function held the user's stream would
// hang here as it did on the GPU. FAKE_KERNELS_EAGER=1 loads without waiting;
// FAKE_KERNELS_PRELOAD_ERROR=N makes the preload fail.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <ringfence/reduce_ops.hpp>
#include <ringfence/types.hpp>
#include <thread>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

extern "C" int fake_cuda_launch_kernel(void* stream, void (*fn)(void*), void* arg);
extern "C" void fake_cuda_sync_device_streams(int device);
extern "C" int cudaGetDevice(int* device);

namespace {

using namespace ringfence;

constexpr int kInvalidValue = 1;  // cudaErrorInvalidValue

struct Task {
  int type, op, finish, divisor;
  void* dst;
  const void* a;
  const void* b;
  std::size_t n;
};

std::atomic<unsigned long> launches{0};

// Devices whose kernels are loaded (bit d: device d), and the lock that makes one thread load.
std::atomic<unsigned long> loaded{0};
std::mutex loading;

int load_current_device() {
  int device = 0;
  if (const int err = cudaGetDevice(&device); err != 0) return err;
  const unsigned long bit = 1UL << (static_cast<unsigned>(device) % 64);
  if ((loaded.load() & bit) != 0) return 0;
  std::lock_guard lock(loading);
  if ((loaded.load() & bit) != 0) return 0;
  const char* eager = std::getenv("FAKE_KERNELS_EAGER");
  if (eager == nullptr || std::string(eager) != "1") fake_cuda_sync_device_streams(device);
  loaded.fetch_or(bit);
  return 0;
}

unsigned delay_us() {
  const char* v = std::getenv("FAKE_KERNELS_DELAY_US");
  return v != nullptr ? static_cast<unsigned>(std::strtoul(v, nullptr, 10)) : 300u;
}

template <class T, class Op>
void apply(const Task& t, Op op) {
  reduce_vec16(static_cast<T*>(t.dst), static_cast<const T*>(t.a), static_cast<const T*>(t.b), t.n, op, 0, 1);
}

template <DataType D>
void dispatch(const Task& t) {
  using T = typename StorageOf<D>::type;
  switch (static_cast<ReduceOp>(t.op)) {
    case ReduceOp::Sum: return apply<T>(t, SumOp<T>{});
    case ReduceOp::Prod: return apply<T>(t, ProdOp<T>{});
    case ReduceOp::Min: return apply<T>(t, MinOp<T>{});
    case ReduceOp::Max: return apply<T>(t, MaxOp<T>{});
    case ReduceOp::Avg: return t.finish != 0 ? apply<T>(t, SumDivOp<T>{t.divisor}) : apply<T>(t, SumOp<T>{});
  }
}

void run(void* arg) {
  std::unique_ptr<Task> t(static_cast<Task*>(arg));
  if (const unsigned us = delay_us(); us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
  switch (static_cast<DataType>(t->type)) {
    case DataType::Int8: dispatch<DataType::Int8>(*t); break;
    case DataType::Uint8: dispatch<DataType::Uint8>(*t); break;
    case DataType::Int32: dispatch<DataType::Int32>(*t); break;
    case DataType::Uint32: dispatch<DataType::Uint32>(*t); break;
    case DataType::Int64: dispatch<DataType::Int64>(*t); break;
    case DataType::Uint64: dispatch<DataType::Uint64>(*t); break;
    case DataType::Float16: dispatch<DataType::Float16>(*t); break;
    case DataType::BFloat16: dispatch<DataType::BFloat16>(*t); break;
    case DataType::Float32: dispatch<DataType::Float32>(*t); break;
    case DataType::Float64: dispatch<DataType::Float64>(*t); break;
  }
  launches.fetch_add(1);
}

}  // namespace

FAKE_EXPORT int ringfence_kernels_abi_version() { return 2; }

// FAKE_KERNELS_PRELOAD_ERROR=N makes it fail with error N, loading nothing (tests of the refusal).
FAKE_EXPORT int ringfence_kernels_preload() {
  if (const char* e = std::getenv("FAKE_KERNELS_PRELOAD_ERROR"); e != nullptr && *e != '\0') return std::atoi(e);
  return load_current_device();
}

FAKE_EXPORT int ringfence_kernels_combine(int type, int op, int finish, int divisor, void* dst, const void* a, const void* b,
                                          std::size_t n, void* stream) {
  if (type < 0 || type > static_cast<int>(DataType::Float64) || op < 0 || op >= kNumReduceOps) return kInvalidValue;
  if (op == static_cast<int>(ReduceOp::Avg) && finish != 0 && divisor <= 0) return kInvalidValue;
  if (n == 0) return 0;
  if (const int err = load_current_device(); err != 0) return err;  // lazy loading: the first launch loads
  auto* task = new Task{type, op, finish, divisor, dst, a, b, n};
  const int err = fake_cuda_launch_kernel(stream, &run, task);
  if (err != 0) delete task;
  return err;
}

FAKE_EXPORT unsigned long fake_kernels_launches() { return launches.load(); }
// Test hook: forget every device's loaded kernels (the next launch or preload loads again).
FAKE_EXPORT void fake_kernels_unload() { loaded.store(0); }
