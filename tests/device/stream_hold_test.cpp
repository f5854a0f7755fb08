// How a stream-ordered call holds the user's stream until its host collective ended
// (src/device_staging.hpp): by cuStreamWaitValue32 on a word the progress thread stores, so no
// host function of ours ever waits for a collective. The fake runtime (fake_cudart_streams.cpp)
// runs every host function of the process on one thread, as CUDA may; a host function waiting
// for a collective there deadlocks thread ranks whose calls need each other's host functions.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <mutex>
#include <ringfence/ringfence.hpp>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "support/catch.hpp"
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
using Clock = std::chrono::steady_clock;

namespace {

CommOptions options() {
  CommOptions o;
  o.host_id = "thread-host";
  o.timeout = std::chrono::seconds(20);
  o.chunk_bytes = 4096;
  o.cuda_runtime = RINGFENCE_FAKE_CUDART_PATH;
  return o;
}

// A host function that occupies the process's callback thread until `release` (or 5 s).
struct Blocker {
  std::mutex m;
  std::condition_variable cv;
  bool started = false, release = false, gave_up = false;
  static void run(void* p) {
    auto* b = static_cast<Blocker*>(p);
    std::unique_lock l(b->m);
    b->started = true;
    b->cv.notify_all();
    b->gave_up = !b->cv.wait_for(l, std::chrono::seconds(5), [&] { return b->release; });
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
  // landed. A call that held its stream with a host function would queue behind it and never
  // land: the blocker would give up after 5 s and the calls would have taken that long.
  Stream side;
  Blocker blocker;
  T_CHECK(cudaLaunchHostFunc(side.s, &Blocker::run, &blocker) == 0);
  {
    std::unique_lock l(blocker.m);
    blocker.cv.wait(l, [&] { return blocker.started; });
  }
  int funcs_before = 0, waits_before = 0;
  fake_cuda_counts(&funcs_before, &waits_before);
  const auto start = Clock::now();
  const std::string err = test::run_ranks(3, options(), [&](Communicator& comm) {
    for (int call = 0; call < 4; ++call) checked_allreduce(comm, 1001 + static_cast<std::size_t>(call) * 2000);
  });
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
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
  REQUIRE(secs < 4.0);
  REQUIRE(funcs_after - funcs_before == 0);    // none of ours
  REQUIRE(waits_after - waits_before == 3 * 4);  // one stream wait per call and rank
}

TEST_CASE("without stream memory operations a host function holds the stream, the calls stay exact, and each rank warns once",
          "[device]") {
  const std::string log = fmt::format("/tmp/ringfence_stream_hold_{}.log", ::getpid());
  std::remove(log.c_str());
  CommOptions o = options();
  o.log_file = log;
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
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(log.c_str());
  INFO(text);
  const std::string warning = "stream-ordered calls hold their streams with host functions";
  std::size_t warnings = 0;
  for (std::size_t at = text.find(warning); at != std::string::npos; at = text.find(warning, at + 1)) ++warnings;
  REQUIRE(warnings == 2);  // once per rank, not per call
  REQUIRE(text.find("rank 0: " + warning) != std::string::npos);
  REQUIRE(text.find("rank 1: " + warning) != std::string::npos);
}
