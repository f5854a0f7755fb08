// How a stream-ordered call holds the user's stream until its host collective ended
// (src/device_staging.hpp): by cuStreamWaitValue32 on a word the progress thread stores, so no
// host function of ours ever waits for a collective. The fake runtime (fake_cudart_streams.cpp)
// runs every host function of the process on one thread, as CUDA may; a host function waiting
// for a collective there deadlocks thread ranks whose calls need each other's host functions.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <dlfcn.h>
#include <fstream>
#include <iterator>
#include <mutex>
#include <ringfence/detail/cuda_api.hpp>
#include <ringfence/ringfence.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/temp_dir.hpp"
#include "support/thread_ranks.hpp"
#include "fake_device.hpp"
#include "support/verifiable.hpp"

extern "C" {
int cudaStreamSynchronize(void*);
int cudaLaunchHostFunc(void*, void (*)(void*), void*);
void fake_cuda_memory_waits(int);
void fake_cuda_counts(int*, int*);
}

using namespace ringfence;
using test::DeviceBuffer;
using test::Stream;

namespace {

// A host function that occupies the process's callback thread until `release` (or 30 s, beyond
// the calls' 20 s timeout: calls that needed the callback thread fail rather than wait for it).
struct Blocker {
  std::mutex m;
  std::condition_variable cv;
  bool started = false, release = false, gave_up = false;
  static void run(void* p) {
    auto* b = static_cast<Blocker*>(p);
    std::unique_lock l(b->m);
    b->started = true;
    b->cv.notify_all();
    b->gave_up = !b->cv.wait_for(l, std::chrono::seconds(30), [&] { return b->release; });
  }
};

// One float allreduce of `count` elements per rank on its own stream, checked exactly.
void checked_allreduce(Communicator& comm, std::size_t count) {
  const int n = comm.size();
  std::vector<float> host(count);
  test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), n, host.data(), count);
  DeviceBuffer buf(count * sizeof(float));
  buf.put(host.data(), count * sizeof(float));
  Stream stream;
  comm.allreduce(buf.p, buf.p, count, DataType::Float32, ReduceOp::Sum, stream.handle());
  T_CHECK(cudaStreamSynchronize(stream.s) == 0);
  const std::vector<std::byte> got = buf.get(count * sizeof(float));
  T_CHECK(test::count_wrong(DataType::Float32, ReduceOp::Sum, n, got.data(), count) == 0);
}

}  // namespace

TEST_CASE("stream-ordered calls complete while another host function holds the runtime's callback thread", "[device]") {
  // A host function on some other stream holds the one callback thread until the ranks' calls
  // landed. A call that held its stream with a host function would queue behind it: its peers'
  // collectives would time out, and the blocker would give up.
  Stream side;
  Blocker blocker;
  T_CHECK(cudaLaunchHostFunc(side.s, &Blocker::run, &blocker) == 0);
  {
    std::unique_lock l(blocker.m);
    blocker.cv.wait(l, [&] { return blocker.started; });
  }
  int funcs_before = 0, waits_before = 0;
  fake_cuda_counts(&funcs_before, &waits_before);
  const std::string err = test::run_ranks(3, test::staged_options(), [&](Communicator& comm) {
    for (int call = 0; call < 4; ++call) checked_allreduce(comm, 1001 + static_cast<std::size_t>(call) * 2000);
  });
  {
    std::lock_guard l(blocker.m);
    blocker.release = true;
    blocker.cv.notify_all();
  }
  T_CHECK(cudaStreamSynchronize(side.s) == 0);
  int funcs_after = 0, waits_after = 0;
  fake_cuda_counts(&funcs_after, &waits_after);
  REQUIRE(err == "");
  REQUIRE_FALSE(blocker.gave_up);
  REQUIRE(funcs_after - funcs_before == 0);    // none of ours
  REQUIRE(waits_after - waits_before == 3 * 4);  // one stream wait per call and rank
}

TEST_CASE("without stream memory operations a host function holds the stream, the calls stay exact, and each rank warns once",
          "[device]") {
  test::TempDir dir("rf-stream-hold");
  CommOptions o = test::staged_options();
  o.log_file = (dir.path() / "rank%r.log").string();
  fake_cuda_memory_waits(0);  // the library loads the runtime per communicator: read at its first stream call
  int funcs_before = 0, waits_before = 0;
  fake_cuda_counts(&funcs_before, &waits_before);
  const std::string err = test::run_ranks(2, o, [&](Communicator& comm) {
    for (int call = 0; call < 3; ++call) checked_allreduce(comm, 3001);
  });
  fake_cuda_memory_waits(1);
  int funcs_after = 0, waits_after = 0;
  fake_cuda_counts(&funcs_after, &waits_after);
  REQUIRE(err == "");
  REQUIRE(funcs_after - funcs_before == 2 * 3);  // one host function per call and rank
  REQUIRE(waits_after - waits_before == 0);
  const std::string warning = "stream-ordered calls hold their streams with host functions";
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(dir.path() / fmt::format("rank{}.log", rank));
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    INFO(text);
    const std::string line = fmt::format("rank {}: {}", rank, warning);
    const std::size_t first = text.find(line);
    REQUIRE(first != std::string::npos);
    REQUIRE(text.find(warning, first + line.size()) == std::string::npos);  // once, not per call
  }
}

// A CUDA 12.0-12.4 runtime has cudaGetDriverEntryPoint but not ...ByVersion: the library finds
// cuStreamWaitValue32 through it (src/cuda_api.cpp), and the wait it gets holds a stream. The
// fake built as such a runtime is a second copy with its own streams and counters, so this
// drives it through the loaded functions, not through a communicator.
TEST_CASE("a CUDA 12.0-12.4 runtime's cudaGetDriverEntryPoint gives the stream wait", "[device]") {
  const char* path = RINGFENCE_FAKE_CUDART_12_0_PATH;
  void* handle = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(handle != nullptr);
  REQUIRE(::dlsym(handle, "cudaGetDriverEntryPointByVersion") == nullptr);  // only the older route exists
  REQUIRE(::dlsym(handle, "cudaGetDriverEntryPoint") != nullptr);
  auto* counts = reinterpret_cast<void (*)(int*, int*)>(::dlsym(handle, "fake_cuda_counts"));
  auto* memory_waits = reinterpret_cast<void (*)(int)>(::dlsym(handle, "fake_cuda_memory_waits"));
  REQUIRE((counts != nullptr && memory_waits != nullptr));

  const detail::CudaApi api = detail::load_cuda_api(path);
  INFO(api.why_not);
  REQUIRE(api.usable);
  REQUIRE(api.stream_wait_value32 != nullptr);
  REQUIRE(api.host_get_device_pointer != nullptr);
  REQUIRE(api.stream_synchronize != nullptr);

  // The wait holds the stream until the word reaches the value.
  std::atomic<std::uint32_t> word{0};
  void* device_word = nullptr;
  REQUIRE(api.host_get_device_pointer(&device_word, &word, 0) == 0);
  int funcs = 0, waits_before = 0, waits_after = 0;
  counts(&funcs, &waits_before);
  REQUIRE(api.stream_wait_value32(nullptr, reinterpret_cast<unsigned long long>(device_word), 1, detail::kCuStreamWaitValueGeq) == 0);
  counts(&funcs, &waits_after);
  REQUIRE(waits_after - waits_before == 1);
  std::atomic<bool> synced{false};
  std::thread sync([&] {
    api.stream_synchronize(nullptr);
    synced = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const bool passed_early = synced.load();
  word.store(1);
  sync.join();
  REQUIRE_FALSE(passed_early);
  REQUIRE(synced.load());

  // A driver without stream memory operations: neither function is bound (host functions hold).
  memory_waits(0);
  const detail::CudaApi without = detail::load_cuda_api(path);
  memory_waits(1);
  REQUIRE(without.usable);
  REQUIRE(without.stream_wait_value32 == nullptr);
  REQUIRE(without.host_get_device_pointer == nullptr);
}
