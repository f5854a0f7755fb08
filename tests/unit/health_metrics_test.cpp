// The Prometheus exposition of a rank's health (HealthSnapshot::prometheus, refreshed on a timer
// by RINGFENCE_HEALTH_PROMETHEUS_INTERVAL_MS): per-link series, and the raw hardware counters
// that fed the policy for mapped links (here NVLink counters of the fake NVML).
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <ringfence/communicator.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/fake_nvml_state.hpp"
#include "support/thread_ranks.hpp"

using namespace ringfence;

TEST_CASE("metrics: mapped NVLinks' raw counters and per-link timed writes are in the Prometheus text", "[health][nvml][metrics]") {
  // Two GPUs joined by NVLink 0; GPU 0's link has counted 5 replays so far.
  const std::string topo = "count 2\nlinks 1\nd0.bus 0000:10:00.0\nd0.l0.remote 0000:11:00.0\nd1.bus 0000:11:00.0\nd1.l0.remote 0000:10:00.0\n";
  const test::FakeNvmlState nvml("ringfence-metrics", topo + "d0.l0.replay 5\n");
  const int n = 2;
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("ringfence-metrics-{}", ::getpid());
  std::filesystem::create_directories(dir);
  std::vector<std::string> text(n), file(n);
  const std::string error = test::run_ranks(
      n,
      [&](int r) {
        CommOptions o;
        o.timeout = std::chrono::seconds(20);
        o.health_agree_every = 1000;  // no agreement writes the file: only the timer does
        o.health.nvml_library = RINGFENCE_FAKE_NVML_PATH;
        o.health_link_map = "auto";
        o.health_gpu = r;
        o.health_interval = std::chrono::milliseconds(0);
        o.host_id = "metrics";
        o.health_prometheus = (dir / "job-{rank}.prom").string();
        o.health_prometheus_interval = std::chrono::milliseconds(1);
        return o;
      },
      [&](Communicator& comm) {
        std::vector<float> buf(256 * 1024);  // 1 MiB: writes large enough to be timed
        for (int i = 0; i < 6; ++i) comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
        text[static_cast<std::size_t>(comm.rank())] = comm.health().prometheus();
        // The timed refresh wrote the file during the run (the communicator is still open: the
        // write at close has not happened).
        std::ifstream in(dir / fmt::format("job-{}.prom", comm.rank()));
        std::stringstream content;
        content << in.rdbuf();
        file[static_cast<std::size_t>(comm.rank())] = content.str();
      });
  INFO(error);
  REQUIRE(error.empty());
  INFO(text[0]);
  CHECK(text[0].find(R"(ringfence_hw_counter{rank="0",link="0-1",source="nvml",device="0",port="0",counter=)") != std::string::npos);
  CHECK(text[0].find("} 5\n") != std::string::npos);  // the replay counter's raw value
  CHECK(text[0].find(R"(ringfence_link_timed_bytes_total{rank="0",peer="1"} )") != std::string::npos);
  CHECK(text[0].find(R"(ringfence_link_timed_bytes_total{rank="0",peer="1"} 0)") == std::string::npos);  // writes were timed
  CHECK(text[0].find("ringfence_snapshot_unix_seconds{rank=\"0\"}") != std::string::npos);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << file[static_cast<std::size_t>(r)]);
    CHECK(file[static_cast<std::size_t>(r)].find(fmt::format("ringfence_collectives_total{{rank=\"{}\"}} ", r)) != std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("metrics: a job that only sends and receives refreshes its Prometheus file on the timer too", "[health][metrics][p2p]") {
  // No collective runs, so neither an agreement nor a collective's start writes the file: the
  // send/recv groups must. Link 0-1 corrupts chunks, so the file has something to show.
  const int n = 2;
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("ringfence-metrics-p2p-{}", ::getpid());
  std::filesystem::create_directories(dir);
  std::vector<std::string> file(n);
  std::vector<std::uint64_t> caught(n, 0);
  const std::string error = test::run_ranks(
      n,
      [&](int) {
        CommOptions o;
        o.timeout = std::chrono::seconds(20);
        o.host_id = "metrics-p2p";
        o.fault = "flip:rate=2e-6,link=0-1,seed=9";
        o.health_prometheus = (dir / "job-{rank}.prom").string();
        o.health_prometheus_interval = std::chrono::milliseconds(1);
        return o;
      },
      [&](Communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        const int peer = 1 - comm.rank();
        std::vector<float> out(50000, 1.0f), in(50000);
        for (int i = 0; i < 300; ++i) {
          comm.group_start();
          comm.send(out.data(), out.size(), DataType::Float32, peer);
          comm.recv(in.data(), in.size(), DataType::Float32, peer);
          comm.group_end();
        }
        for (const auto& l : comm.links()) caught[r] += l.checksum_errors;
        // One more group after the count: its refresh (1 ms timer) writes what was counted.
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        comm.group_start();
        comm.send(out.data(), out.size(), DataType::Float32, peer);
        comm.recv(in.data(), in.size(), DataType::Float32, peer);
        comm.group_end();
        std::ifstream f(dir / fmt::format("job-{}.prom", comm.rank()));  // before close writes it
        std::stringstream content;
        content << f.rdbuf();
        file[r] = content.str();
      });
  INFO(error);
  REQUIRE(error.empty());
  for (int r = 0; r < n; ++r) {
    const auto i = static_cast<std::size_t>(r);
    INFO("rank " << r << ", " << caught[i] << " caught: " << file[i]);
    REQUIRE(caught[i] > 0);  // the link really corrupted chunks towards this rank
    const std::string series = fmt::format("ringfence_link_checksum_errors_total{{rank=\"{}\",peer=\"{}\"", r, 1 - r);
    const auto at = file[i].find(series);
    REQUIRE(at != std::string::npos);
    const auto value_at = file[i].find("} ", at);
    REQUIRE(value_at != std::string::npos);
    CHECK(std::stoull(file[i].substr(value_at + 2)) >= caught[i]);
  }
  std::filesystem::remove_all(dir);
}
