// Device regions and the health layer (docs/device.md "Device regions in the engine"): an NVLink
// the health layer fences, or judges slow on its timed device copies, moves to pcie on the
// device lane as on the host lanes, and results stay exact. Thread ranks over the fake CUDA
// runtime, kernel module and NVML; the other device-region tests are in device_regions_test.cpp.
#include <dlfcn.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstring>
#include <ringfence/ringfence.hpp>
#include <ringfence/transports/cuda_ipc.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/fake_nvml_state.hpp"
#include "support/scoped_env.hpp"
#include "support/thread_ranks.hpp"
#include "fake_device.hpp"
#include "support/verifiable.hpp"
#include "device_regions_support.hpp"

using namespace ringfence;
using test::DeviceBuffer;
using test::Stream;
namespace cuda_ipc = transports::cuda_ipc;
using Clock = std::chrono::steady_clock;

using namespace ringfence::test::regions;

TEST_CASE("device regions: an NVLink the health layer fences moves to pcie on the device lane, results exact", "[device][regions][health]") {
  // The fake NVML's link behind ring edge 1-2 starts replaying between collectives #6 and #7;
  // the agreement at #8 fences 1-2. The host lanes relay hop 1 -> 2 through rank 0 (no ring of
  // 4 avoids it with the plan's preference for relays), so the device lane, which follows the
  // ring, must stop using its nvlink link 1-2: it moves to pcie. Every result stays exact.
  const test::FakeNvmlState nvml("ringfence-device-regions-storm", "count 1\nlinks 4\n");
  const int n = 4;
  const std::size_t count = 6000;
  const TransportRegistry registry = with_device_transports();
  std::barrier sync(n, [&]() noexcept {});
  std::atomic<std::size_t> wrong{0};
  std::vector<std::vector<LinkId>> fences(n);
  std::vector<std::vector<Relay>> relays(n);
  std::vector<std::string> moved(n);
  const std::string err = test::run_ranks(
      n,
      [](int) { return nvml_mapped_options(); },
      [&](Communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        comm.on_health_event([&, r](const HealthEvent& e) {
          if (e.kind == EventKind::LinkMoved) moved[r] += fmt::format("{}-{} {}; ", e.a, e.b, e.detail);
        });
        Stream stream;
        DeviceBuffer buf(count * 4);
        for (int call = 1; call <= 12; ++call) {
          if (call == 7) {
            comm.synchronize();
            T_CHECK(cudaStreamSynchronize(stream.s) == 0);
            sync.arrive_and_wait();
            if (r == 0) nvml.write("count 1\nlinks 4\nd0.l1.crc_flit 250000\nd0.l1.replay 7\n");
            sync.arrive_and_wait();
          }
          wrong += allreduce_in_place_wrong(comm, stream, buf, count);
        }
        T_CHECK(comm.async_error().is_ok());
        T_CHECK(comm.device_path() == "device regions");
        fences[r] = comm.fenced_links();
        relays[r] = comm.relays();
      },
      &registry);
  INFO(err);
  REQUIRE(err == "");
  REQUIRE(wrong == 0);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(fences[static_cast<std::size_t>(r)] == std::vector<LinkId>{LinkId{1, 2}});
    REQUIRE(relays[static_cast<std::size_t>(r)] == std::vector<Relay>{Relay{1, 0, 2}});
    // Only the ends move their device-lane link (the others have no device link of that pair).
    REQUIRE(moved[static_cast<std::size_t>(r)] == (r == 1 || r == 2 ? "1-2 device lane: to pcie (was nvlink); " : ""));
  }
}

TEST_CASE("device regions: a slow NVLink is judged on its timed device copies, moves to pcie and back when readmitted", "[device][regions][health]") {
  // Four fake GPUs, rank r on GPU r. From collective #3 to #8, copies from GPU 1 into GPU 2's
  // memory take 20 ms more (a degraded link: the ring sends 1 -> 2 over the device lane). The
  // device lane's link times its copies with CUDA events; the agreements judge pair 1-2 on that
  // bandwidth (the host lanes carry only the votes): slow, so suspect, then fenced
  // (suspect_escalate_after). Ranks 1 and 2 move their device-lane link to pcie, the host lanes
  // relay 1 -> 2. Once the copies are fast again and the cool-down (200 ms) is served, the pair
  // is readmitted and the device-lane link moves back to nvlink. Every result stays exact. The
  // NVML counters stay clean throughout: the map only makes the pair judged.
  const test::FakeNvmlState nvml("ringfence-device-regions-slow", "count 1\nlinks 4\n");
  const test::ScopedEnv devices("FAKE_CUDA_DEVICES", "4");
  const int n = 4;
  const std::size_t count = 256 * 1024;  // 1 MiB of int32: 24 timed 64 KiB copies per link and call
  const TransportRegistry registry = with_device_transports();
  std::barrier sync(n, [&]() noexcept {});
  std::atomic<std::size_t> wrong{0};
  std::vector<std::vector<LinkId>> fences(n), fenced_at_8(n);
  std::vector<std::string> events(n), moved(n);
  const std::string err = test::run_ranks(
      n,
      [](int) {
        CommOptions o = nvml_mapped_options();
        o.chunk_bytes = 64 * 1024;
        // Nominal NVLink 100 GB/s; fake copies of 64 KiB take 0.5 ms (ratio ~1.3e-3), slowed
        // ones 20.5 ms (~3e-5).
        o.health.thresholds.bandwidth_min_ratio = 2e-4;
        o.health.thresholds.bandwidth_slow_for = std::chrono::milliseconds(0);
        o.health.timings.suspect_escalate_after = std::chrono::milliseconds(1);
        o.health.timings.fence_cooldown = std::chrono::milliseconds(200);
        return o;
      },
      [&](Communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        T_CHECK(cudaSetDevice(comm.rank()) == 0);
        comm.on_health_event([&, r](const HealthEvent& e) {
          if (e.kind == EventKind::LinkMoved) moved[r] += fmt::format("{}-{} {}; ", e.a, e.b, e.detail);
          if (e.kind == EventKind::LinkSuspect || e.kind == EventKind::FenceProposed)
            events[r] += fmt::format("#{} {} {}-{}: {}; ", comm.sequence(), to_string(e.kind), e.a, e.b, e.detail);
        });
        Stream stream;
        DeviceBuffer buf(count * 4);
        for (int call = 1; call <= 24; ++call) {
          if (call == 3 || call == 9) {
            comm.synchronize();
            T_CHECK(cudaStreamSynchronize(stream.s) == 0);
            sync.arrive_and_wait();
            if (r == 0) fake_cuda_slow_copies(1, 2, call == 3 ? 20000 : 0);
            sync.arrive_and_wait();
          }
          if (call > 9) std::this_thread::sleep_for(std::chrono::milliseconds(40));  // let the cool-down pass
          wrong += allreduce_in_place_wrong(comm, stream, buf, count);
          if (call == 8) fenced_at_8[r] = comm.fenced_links();
        }
        T_CHECK(comm.async_error().is_ok());
        T_CHECK(comm.device_path() == "device regions");
        fences[r] = comm.fenced_links();
      },
      &registry);
  INFO(err);
  REQUIRE(err == "");
  REQUIRE(wrong == 0);
  INFO("rank 1 events: " << events[1]);
  // Rank 1 sends over the slow link and judges it on its timed copies.
  REQUIRE_THAT(events[1], Catch::Contains("link_suspect 1-2: bandwidth") && Catch::Contains("fence_proposed 1-2"));
  REQUIRE(events[1].find("#2 ") == std::string::npos);  // nothing before the slowdown
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(fenced_at_8[static_cast<std::size_t>(r)] == std::vector<LinkId>{LinkId{1, 2}});
    REQUIRE(fences[static_cast<std::size_t>(r)].empty());  // readmitted
    REQUIRE(moved[static_cast<std::size_t>(r)] ==
            (r == 1 || r == 2 ? "1-2 device lane: to pcie (was nvlink); 1-2 device lane: back to nvlink (was pcie); " : ""));
  }
}

TEST_CASE("device regions: a pair moved to pcie before the device lane exists gets a pcie link on it too", "[device][regions][health]") {
  // The host lanes run over nvlink (first in the registry). A fake-NVML storm on 1-2 from
  // host collective #3 makes the agreement at #4 move the pair to pcie (both ends reach each
  // other there). The first stream-ordered collective after it builds the device lane: its
  // link 1-2 must start on pcie as well, the others on nvlink; links() lists the device lane's
  // links after the host lanes'.
  const test::FakeNvmlState nvml("ringfence-device-regions-moved", "count 1\nlinks 4\n");
  const int n = 3;
  const std::size_t count = 5000;
  TransportRegistry registry;
  registry.add(std::string(cuda_ipc::kNvlinkName), cuda_ipc::make_nvlink_transport);
  registry.add(std::string(cuda_ipc::kPcieName), cuda_ipc::make_pcie_transport);
  std::barrier sync(n, [&]() noexcept {});
  std::atomic<std::size_t> wrong{0};
  std::vector<std::string> host_links(n), device_links(n), moved(n), table(n);  // table: link table + Prometheus
  const std::string err = test::run_ranks(
      n,
      [](int) { return nvml_mapped_options(); },
      [&](Communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        comm.on_health_event([&, r](const HealthEvent& e) {
          if (e.kind == EventKind::LinkMoved) moved[r] += fmt::format("#{} {}-{} {}; ", comm.sequence(), e.a, e.b, e.detail);
        });
        std::vector<std::int32_t> host(count), out(count);
        for (int call = 1; call <= 4; ++call) {
          if (call == 3) {
            sync.arrive_and_wait();
            if (r == 0) nvml.write("count 1\nlinks 4\nd0.l1.crc_flit 250000\nd0.l1.replay 7\n");
            sync.arrive_and_wait();
          }
          test::fill_input(DataType::Int32, ReduceOp::Sum, comm.rank(), n, host.data(), count);
          comm.allreduce(host.data(), out.data(), count, DataType::Int32, ReduceOp::Sum);
          wrong += test::count_wrong(DataType::Int32, ReduceOp::Sum, n, out.data(), count);
        }
        Stream stream;
        DeviceBuffer buf(count * 4);
        wrong += allreduce_in_place_wrong(comm, stream, buf, count);
        T_CHECK(comm.async_error().is_ok());
        T_CHECK(comm.device_path() == "device regions");
        for (const LinkInfo& l : comm.links())
          (l.device_lane ? device_links : host_links)[r] += fmt::format("{}:{}{} ", l.peer, l.transport, l.bytes_written > 0 ? "" : "(idle)");
        table[r] = comm.link_table() + comm.health().prometheus();
      },
      &registry);
  INFO(err);
  REQUIRE(err == "");
  REQUIRE(wrong == 0);
  REQUIRE(moved[0] == "#4 1-2 to pcie; ");  // every rank reports the agreed move
  REQUIRE(moved[1] == "#4 1-2 to pcie (was nvlink); ");
  REQUIRE(moved[2] == "#4 1-2 to pcie (was nvlink); ");
  // Host lanes, then the device lane. The ring 0-1-2 sends to the right neighbour only; the
  // agreement at #4 also sent each rank's ballot to every peer (one-shot) over the links of
  // the time, so every nvlink host link carried bytes. The pcie link 2->1 the move created after
  // it carried none. The device lane runs no agreement: its left links stay idle.
  REQUIRE(host_links[0] == "1:nvlink 2:nvlink ");
  REQUIRE(host_links[1] == "0:nvlink 2:pcie ");
  REQUIRE(host_links[2] == "0:nvlink 1:pcie(idle) ");
  REQUIRE(device_links[0] == "1:nvlink 2:nvlink(idle) ");
  REQUIRE(device_links[1] == "0:nvlink(idle) 2:pcie ");
  REQUIRE(device_links[2] == "0:nvlink 1:pcie(idle) ");
  REQUIRE_THAT(table[1], Catch::Contains("device lane") &&
                            Catch::Contains("ringfence_link_bytes_total{rank=\"1\",peer=\"2\",lane=\"device\"}") &&
                            Catch::Contains("ringfence_link_state{rank=\"1\",peer=\"2\",transport=\"pcie\",lane=\"device\"} 1"));
}
