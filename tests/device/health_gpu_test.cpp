// RINGFENCE_HEALTH_GPU=cuda (CommOptions::kHealthGpuFromCuda): each rank finds its GPU in NVML
// by the PCI bus id of its current CUDA device, over the fake CUDA runtime (per-thread current
// device, bus ids from FAKE_CUDA_BUS_IDS) and the fake NVML (tests/support/fake_nvml.cpp).
#include <ringfence/communicator.hpp>
#include <ringfence/error.hpp>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/fake_nvml_state.hpp"
#include "support/scoped_env.hpp"
#include "support/thread_ranks.hpp"

extern "C" int cudaSetDevice(int);

using namespace ringfence;

namespace {

using test::ScopedEnv;

// Four ranks, rank r on CUDA device r; returns every rank's ring (exact allreduce checked).
std::vector<std::vector<int>> rings_with(int health_gpu, const std::string& cudart) {
  const test::PlannedRun run = test::plan_and_allreduce(4, [&](int r) {
    // Called on rank r's thread, just before it builds the communicator: the CUDA device is per
    // thread, as in CUDA.
    if (cudaSetDevice(r) != 0) throw std::runtime_error("cudaSetDevice failed");
    CommOptions o;
    o.timeout = std::chrono::seconds(20);
    o.host_id = "cuda-gpu";
    o.health.nvml_library = RINGFENCE_FAKE_NVML_PATH;
    o.health_interval = std::chrono::milliseconds(0);
    o.cuda_runtime = cudart;
    o.health_gpu = health_gpu;
    return o;
  });
  INFO(run.error);
  REQUIRE(run.error.empty());
  REQUIRE(run.wrong == 0);
  return run.rings;
}

}  // namespace

TEST_CASE("RINGFENCE_HEALTH_GPU=cuda finds each rank's GPU in NVML by its CUDA device's bus id", "[topology][plan][health]") {
  // NVML numbers the GPUs by bus id (0x20..0x23) and bridges 0-1 and 2-3. CUDA numbers them
  // differently: device 1 is NVML GPU 2 and device 2 is NVML GPU 1. Rank r uses CUDA device r,
  // so ranks 0-2 and 1-3 share bridges and the ring is 0, 1, 3, 2. Taking the CUDA index for
  // the NVML index would join 0-1 and 2-3 instead: ring 0, 1, 2, 3.
  const test::FakeNvmlState nvml("ringfence-health-gpu-cuda",
                                 "count 4\nlinks 1\n"
                                 "d0.bus 0000:20:00.0\nd0.l0.remote 0000:21:00.0\n"
                                 "d1.bus 0000:21:00.0\nd1.l0.remote 0000:20:00.0\n"
                                 "d2.bus 0000:22:00.0\nd2.l0.remote 0000:23:00.0\n"
                                 "d3.bus 0000:23:00.0\nd3.l0.remote 0000:22:00.0\n");
  const ScopedEnv devices("FAKE_CUDA_DEVICES", "4");
  const ScopedEnv buses("FAKE_CUDA_BUS_IDS", "0000:20:00.0,0000:22:00.0,0000:21:00.0,0000:23:00.0");
  for (const auto& ring : rings_with(CommOptions::kHealthGpuFromCuda, RINGFENCE_FAKE_CUDART_PATH))
    REQUIRE(ring == std::vector<int>{0, 1, 3, 2});
  for (const auto& ring : rings_with(-1, RINGFENCE_FAKE_CUDART_PATH)) REQUIRE(ring == std::vector<int>{0, 1, 2, 3});

  // A bus id NVML does not know, or no usable CUDA runtime: the GPU is unknown (a warning),
  // the communicator works in rank order. With NVML bridging 0-2 and 1-3 now, a fallback to the
  // CUDA index as the NVML index would give 0, 1, 3, 2 instead.
  nvml.write("count 4\nlinks 1\n"
             "d0.bus 0000:20:00.0\nd0.l0.remote 0000:22:00.0\n"
             "d1.bus 0000:21:00.0\nd1.l0.remote 0000:23:00.0\n"
             "d2.bus 0000:22:00.0\nd2.l0.remote 0000:20:00.0\n"
             "d3.bus 0000:23:00.0\nd3.l0.remote 0000:21:00.0\n");
  {
    const ScopedEnv strange("FAKE_CUDA_BUS_IDS", "0000:99:00.0");
    for (const auto& ring : rings_with(CommOptions::kHealthGpuFromCuda, RINGFENCE_FAKE_CUDART_PATH))
      REQUIRE(ring == std::vector<int>{0, 1, 2, 3});
  }
  for (const auto& ring : rings_with(CommOptions::kHealthGpuFromCuda, "/nonexistent/libcudart.so.13"))
    REQUIRE(ring == std::vector<int>{0, 1, 2, 3});
}

TEST_CASE("a health_gpu below kHealthGpuFromCuda is refused naming the rank", "[topology][health]") {
  const std::string error = test::run_ranks(2, [](int) {
    CommOptions o;
    o.host_id = "cuda-gpu-bad";
    o.health_gpu = -3;
    return o;
  }, [](Communicator&) {});
  // Both ranks refuse it; the first error is reported, as "rank R: <message>", and the message
  // itself must name R.
  REQUIRE_THAT(error, Catch::Contains("CommOptions::health_gpu") && Catch::Contains("got -3"));
  REQUIRE(error.rfind("rank ", 0) == 0);
  const std::string who = error.substr(0, error.find(':'));
  REQUIRE_THAT(error.substr(who.size() + 1), Catch::Contains(who + ":") || Catch::Contains(who + " "));
}
