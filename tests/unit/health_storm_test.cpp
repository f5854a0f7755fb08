// Health from hardware counters on thread ranks with the fake NVML (tests/support/fake_nvml_state.hpp):
// storms fence mapped links, the automatic NVLink map and the planner, readmission after a
// storm, the background sampler, and the Prometheus file.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdlib>
#include <functional>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <tuple>
#include <ringfence/communicator.hpp>
#include <ringfence/crc32c.hpp>
#include <ringfence/events.hpp>
#include <ringfence/fault.hpp>
#include <ringfence/log.hpp>
#include <ringfence/transports/shm.hpp>
#include <ringfence/transports/tcp.hpp>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/fake_nvml_state.hpp"
#include "support/temp_dir.hpp"
#include "support/thread_ranks.hpp"
#include "checked_ops.hpp"
#include "support/fence_scenario.hpp"
#include "support/verifiable.hpp"
#include "support/plan_scenario.hpp"

using namespace ringfence;
using test::PlanOutcome;
using test::run_plan_scenario;

namespace {
// Options for thread ranks on the fake NVML with the automatic NVLink map (`map`) or none, on
// host `host`, agreements every 2 collectives, no background sampling.
CommOptions fake_nvml_options(const char* host, bool map) {
  CommOptions o;
  o.timeout = std::chrono::seconds(20);
  o.health_agree_every = 2;
  o.health_agree_min_interval = std::chrono::microseconds(0);  // by count only: these agreements fall at set calls
  o.health.nvml_library = RINGFENCE_FAKE_NVML_PATH;
  if (map) o.health_link_map = "auto";
  o.health_interval = std::chrono::milliseconds(0);
  o.host_id = host;
  return o;
}

// Per-rank options: `o` with RINGFENCE_HEALTH_GPU = gpu(rank).
std::function<CommOptions(int)> per_rank_gpu(const CommOptions& o, std::function<int(int)> gpu) {
  return [o, gpu](int r) {
    CommOptions mine = o;
    mine.health_gpu = gpu(r);
    return mine;
  };
}

// Fake NVML state: four GPUs with bus ids 0000:2g:00.0 and one NVLink each, bridging 0-2 and 1-3.
std::string bridged_gpus() {
  std::string topo = "count 4\nlinks 1\n";
  for (int g = 0; g < 4; ++g)
    topo += fmt::format("d{0}.bus 0000:{1:02x}:00.0\nd{0}.l0.remote 0000:{2:02x}:00.0\n", g, 0x20 + g, 0x20 + (g + 2) % 4);
  return topo;
}

// Runs `iterations` exact sum allreduces of `count` elements of `type` on `comm`. Before
// collective `at` (0-based) all ranks meet at `meet()`, rank 0 calls `change()` (a new fake NVML
// state), and all meet again, so every rank runs the same collectives before and after the
// change. Returns the number of wrong elements.
std::size_t allreduces_changing_at(Communicator& comm, int iterations, int at, DataType type, std::size_t count,
                                   const std::function<void()>& meet, const std::function<void()>& change) {
  const int n = comm.size();
  std::vector<std::byte> buf(count * size_of(type));
  std::size_t wrong = 0;
  for (int it = 0; it < iterations; ++it) {
    if (it == at) {
      meet();
      if (comm.rank() == 0) change();
      meet();
    }
    test::fill_input(type, ReduceOp::Sum, comm.rank(), n, buf.data(), count);
    comm.allreduce(buf.data(), buf.data(), count, type, ReduceOp::Sum);
    wrong += test::count_wrong(type, ReduceOp::Sum, n, buf.data(), count);
  }
  return wrong;
}
}  // namespace

TEST_CASE("a counter storm on the fake NVML fences the mapped link and relays around it", "[health][nvml][e2e]") {
  const test::FakeNvmlState nvml("ringfence-storm", "count 1\nlinks 4\n");
  const int n = 4;
  std::barrier sync(n, [&]() noexcept {});
  std::atomic<std::size_t> wrong{0};
  std::vector<std::vector<LinkId>> fences(n);
  std::vector<std::vector<int>> rings(n);
  std::vector<std::vector<Relay>> relays(n);
  std::vector<std::uint64_t> fenced_at(n, 0);
  CommOptions o;
  o.timeout = std::chrono::seconds(20);
  o.health_agree_every = 2;
  o.health_agree_min_interval = std::chrono::microseconds(0);  // by count only: these agreements fall at set calls
  o.health.nvml_library = RINGFENCE_FAKE_NVML_PATH;
  o.health_link_map = "1-2=nvml:0:1";  // the NVLink behind ring edge 1-2
  o.host_id = "storm";
  const std::string error = test::run_ranks(n, o, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    comm.on_health_event([&, r](const HealthEvent& e) {
      if (e.kind == EventKind::LinkFenced) fenced_at[r] = e.sequence;
    });
    // Between collectives #6 and #7 the NVLink starts replaying.
    wrong += allreduces_changing_at(comm, 12, 6, DataType::Int32, 10000, [&] { sync.arrive_and_wait(); },
                                    [&] { nvml.write("count 1\nlinks 4\nd0.l1.crc_flit 250000\nd0.l1.replay 7\n"); });
    fences[r] = comm.fenced_links();
    rings[r] = comm.ring();
    relays[r] = comm.relays();
  });
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(fences[r] == std::vector<LinkId>{LinkId{1, 2}});
    REQUIRE(fenced_at[r] == 8);  // first agreement after the storm (agreements at 2, 4, 6, 8, ...)
    REQUIRE(rings[r] == rings[0]);
    REQUIRE(relays[r] == std::vector<Relay>{Relay{1, 0, 2}});  // hop 1 -> 2 now goes through rank 0
  }
}

TEST_CASE("RINGFENCE_HEALTH_LINK_MAP=auto maps NVLinks from NVML's topology, a storm on one fences its ranks' link",
          "[health][nvml][e2e][topology]") {
  // Four ranks, one GPU each (NVML index = rank), NVLinks in a ring: link 0 of GPU g joins GPU
  // g+1, link 1 joins GPU g-1. GPU 1's link 1 (to GPU 0) storms: only rank 1 reads it, and
  // only through the automatic map, so link 0-1 must be fenced.
  std::string topo = "count 4\nlinks 2\n";
  for (int g = 0; g < 4; ++g)
    topo += fmt::format("d{0}.bus 0000:{1:02x}:00.0\nd{0}.l0.remote 0000:{2:02x}:00.0\nd{0}.l1.remote 0000:{3:02x}:00.0\n", g,
                        0x10 + g, 0x10 + (g + 1) % 4, 0x10 + (g + 3) % 4);
  const test::FakeNvmlState nvml("ringfence-topology", topo);
  const int n = 4;
  std::barrier sync(n, [&]() noexcept {});
  std::atomic<std::size_t> wrong{0};
  std::vector<std::vector<LinkId>> fences(n);
  std::vector<std::string> proposal(n);
  const std::string error = test::run_ranks(
      n, per_rank_gpu(fake_nvml_options("topology", true), [](int r) { return r; }),
      [&](Communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        comm.on_health_event([&, r](const HealthEvent& e) {
          if (e.kind == EventKind::FenceProposed) proposal[r] = fmt::format("{}-{}", e.a, e.b);
        });
        wrong += allreduces_changing_at(comm, 8, 2, DataType::Int32, 10000, [&] { sync.arrive_and_wait(); },
                                        [&] { nvml.write(topo + "d1.l1.replay 3\n"); });
        fences[r] = comm.fenced_links();
      });
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  REQUIRE(proposal == std::vector<std::string>{"", "0-1", "", ""});  // only GPU 1 saw its link replay
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(fences[r] == std::vector<LinkId>{LinkId{0, 1}});
  }
}

TEST_CASE("the planner makes NVLink-bridged ranks ring neighbours, and a storm on a bridge is relayed around",
          "[health][nvml][e2e][topology][plan]") {
  // Four ranks, one GPU each (NVML index = rank), NVLink bridges 0-2 and 1-3 only. The home ring
  // must use both bridges (0, 1, 3, 2; rank order would use none). Bridge 1-3 then storms:
  // the automatic map fences ring hop 1 -> 3 and rank 0 relays it; results stay exact.
  const std::string topo = bridged_gpus();
  const test::FakeNvmlState nvml("ringfence-planner", topo);
  const int n = 4;
  std::barrier sync(n, [&]() noexcept {});
  std::atomic<std::size_t> wrong{0};
  std::vector<std::vector<int>> home(n), rings(n);
  std::vector<std::vector<LinkId>> fences(n);
  std::vector<std::vector<Relay>> relays(n);
  const std::string error = test::run_ranks(
      n, per_rank_gpu(fake_nvml_options("planner", true), [](int r) { return r; }),
      [&](Communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        home[r] = comm.ring();
        wrong += allreduces_changing_at(comm, 8, 2, DataType::Float32, 30000, [&] { sync.arrive_and_wait(); },
                                        [&] { nvml.write(topo + "d3.l0.replay 3\n"); });  // GPU 3's bridge to GPU 1
        rings[r] = comm.ring();
        fences[r] = comm.fenced_links();
        relays[r] = comm.relays();
      });
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(home[r] == std::vector<int>{0, 1, 3, 2});
    REQUIRE(rings[r] == std::vector<int>{0, 1, 3, 2});
    REQUIRE(fences[r] == std::vector<LinkId>{LinkId{1, 3}});
    REQUIRE(relays[r] == std::vector<Relay>{Relay{1, 0, 3}});
  }
}

TEST_CASE("without a GPU named the planner keeps rank order, and one rank's unknown GPU breaks no agreement",
          "[health][nvml][e2e][topology][plan]") {
  // The same bridges, but rank 2 names no GPU: every rank learns only bridge 1-3, and the ring
  // is the lexicographically first that uses it, 0, 1, 3, 2. With no rank naming a GPU the
  // ranks ascend.
  const test::FakeNvmlState nvml("ringfence-planner-partial", bridged_gpus());
  const int n = 4;
  for (const bool any_gpu : {true, false}) {
    const test::PlannedRun run = test::plan_and_allreduce(
        n, per_rank_gpu(fake_nvml_options("planner", false), [&](int r) { return any_gpu && r != 2 ? r : -1; }));
    INFO("any_gpu " << any_gpu << ": " << run.error);
    REQUIRE(run.error.empty());
    REQUIRE(run.wrong == 0);
    for (const auto& ring : run.rings) REQUIRE(ring == (any_gpu ? std::vector<int>{0, 1, 3, 2} : std::vector<int>{0, 1, 2, 3}));
  }
}

TEST_CASE("GPUs on NVSwitches are joined: every rank learns which GPUs reach the switches and plans with it",
          "[health][nvml][e2e][topology][plan]") {
  // GPUs 0 and 2 have two active NVLinks each, both ending at an NVSwitch (whose far-end bus id
  // NVML leaves empty on link 1); GPUs 1 and 3 have none. Ranks 0 and 2 are joined through the
  // switches, so the ring is 0, 1, 3, 2 (rank order joins nobody). The switch links map to no
  // ring edge (they serve every pair of the GPU), which the automatic map must accept.
  std::string topo = "count 4\nlinks 2\n";
  for (int g = 0; g < 4; ++g) {
    topo += fmt::format("d{0}.bus 0000:{1:02x}:00.0\n", g, 0x40 + g);
    if (g % 2 == 0)
      topo += fmt::format("d{0}.l0.type switch\nd{0}.l0.remote 0000:c0:00.0\nd{0}.l1.type switch\n", g);
    else
      topo += fmt::format("d{0}.l0.state 0\nd{0}.l1.state 0\n", g);
  }
  const test::FakeNvmlState nvml("ringfence-planner-nvswitch", topo);
  const test::PlannedRun run = test::plan_and_allreduce(4, per_rank_gpu(fake_nvml_options("nvswitch", true), [](int r) { return r; }));
  INFO(run.error);
  REQUIRE(run.error.empty());
  REQUIRE(run.wrong == 0);
  for (const auto& ring : run.rings) REQUIRE(ring == std::vector<int>{0, 1, 3, 2});
}

TEST_CASE("a fenced link whose storm ended serves its cool-down and is readmitted: the original plan returns",
          "[health][nvml][e2e][probation]") {
  const test::FakeNvmlState nvml("ringfence-probation", "count 1\nlinks 4\n");
  const int n = 4;
  std::barrier sync(n, [&]() noexcept {});
  CommOptions o;
  o.timeout = std::chrono::seconds(20);
  o.health_agree_every = 2;
  o.health_agree_min_interval = std::chrono::microseconds(0);  // by count only: these agreements fall at set calls
  o.health.nvml_library = RINGFENCE_FAKE_NVML_PATH;
  o.health.window = std::chrono::milliseconds(100);            // the storm leaves the window quickly
  o.health.timings.fence_cooldown = std::chrono::milliseconds(150);
  o.health_link_map = "1-2=nvml:0:1";
  o.health_interval = std::chrono::milliseconds(0);
  o.host_id = "probation";
  std::vector<PlanOutcome> out;
  std::size_t wrong = 0;
  const std::string error = run_plan_scenario(n, o, 40, 10000, LinkId{1, 2}, [&](int it, Communicator& comm) {
    if (it == 4) {  // the NVLink replays once (a storm), then stays quiet
      sync.arrive_and_wait();
      if (comm.rank() == 0) nvml.write("count 1\nlinks 4\nd0.l1.crc_flit 250000\nd0.l1.replay 7\n");
      sync.arrive_and_wait();
    }
    if (it >= 8) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let the cool-down pass
  }, out, wrong);
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(wrong == 0);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    const PlanOutcome& o_r = out[static_cast<std::size_t>(r)];
    REQUIRE(o_r.fenced_at == 6);                      // first agreement after the storm
    REQUIRE(o_r.readmitted_at > o_r.fenced_at);        // after the cool-down, at the same collective everywhere
    REQUIRE(o_r.readmitted_at == out[0].readmitted_at);
    REQUIRE(o_r.fences.empty());
    REQUIRE(o_r.ring == std::vector<int>{0, 1, 2, 3});  // the original plan, no relays
    REQUIRE(o_r.relays == 0);
    REQUIRE(o_r.epoch == 2);                           // fenced, then readmitted
  }
}

TEST_CASE("the background sampler reads the counter sources between collectives and stops with the communicator",
          "[health][nvml]") {
  const test::FakeNvmlState nvml("ringfence-sampler", "count 1\nlinks 2\n");
  auto store = std::make_shared<InProcessStore>();
  std::vector<std::uint64_t> samples(2, 0), after(2, 0);
  std::vector<std::thread> threads;
  std::mutex mutex;
  std::string error;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        CommOptions o;
        o.health.nvml_library = RINGFENCE_FAKE_NVML_PATH;
        o.health_link_map = "0-1=nvml:0:0";
        o.health_interval = std::chrono::milliseconds(5);
        o.host_id = "sampler";
        {
          Communicator comm(store, r, 2, builtin_transports(), o);
          std::int32_t v = 1;
          comm.allreduce(&v, &v, 1, DataType::Int32, ReduceOp::Sum);
          std::this_thread::sleep_for(std::chrono::milliseconds(150));
          samples[r] = comm.health().background_samples;
          comm.barrier();
        }  // the sampler thread is joined here; nothing may touch freed state afterwards
        after[r] = 1;
      } catch (const std::exception& e) {
        std::lock_guard lock(mutex);
        error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  INFO(error);
  REQUIRE(error.empty());
  for (int r = 0; r < 2; ++r) {
    REQUIRE(samples[r] >= 5);  // ~30 expected at 5 ms over 150 ms; generous for a loaded box
    REQUIRE(after[r] == 1);
  }
}

TEST_CASE("the Prometheus text file shows the fenced link, its checksum errors and the epoch", "[health][prometheus]") {
  test::TempDir dir{"ringfence-prom"};
  CommOptions o;
  o.chunk_bytes = 4096;
  o.timeout = std::chrono::seconds(20);
  o.checksum = true;
  o.health_agree_every = 2;
  o.health_agree_min_interval = std::chrono::microseconds(0);  // by count only: these agreements fall at set calls
  o.fault = "flip:rate=1e-4,link=0-1,seed=3";
  o.health_prometheus = (dir.path() / "ringfence-{rank}.prom").string();
  o.host_id = "prom";
  const std::string error = test::run_ranks(4, o, [&](Communicator& comm) {
    std::vector<float> buf(30000, 1.0f);
    for (int it = 0; it < 8; ++it) comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
  });
  INFO(error);
  REQUIRE(error.empty());
  std::ifstream in(dir.path() / "ringfence-1.prom");
  REQUIRE(in.good());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE_THAT(text, Catch::Contains("# TYPE ringfence_link_checksum_errors_total counter"));
  REQUIRE_THAT(text, Catch::Contains("ringfence_fenced_links{rank=\"1\"} 1"));
  REQUIRE_THAT(text, Catch::Contains("ringfence_epoch{rank=\"1\"} 1"));
  REQUIRE_THAT(text, Catch::Contains("ringfence_link_state{rank=\"1\",peer=\"0\",transport=\"shm\"} 3"));  // fenced
  REQUIRE_THAT(text, Catch::Contains("ringfence_relays{rank=\"1\"} 1"));
  REQUIRE_FALSE(std::filesystem::exists(dir.path() / "ringfence-1.prom.tmp"));
}
