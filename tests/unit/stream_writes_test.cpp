// Streaming slot writes (CommOptions::stream_writes): the setup probe and its decision, the
// choice logged by the host's lowest rank only, and collectives exact with streaming forced on
// (chunks above and below kStreamWriteMinBytes, unaligned ones among them), checksums on and off.
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <ringfence/communicator.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "comm/stream_probe.hpp"
#include "support/catch.hpp"
#include "support/float_collectives.hpp"
#include "support/temp_dir.hpp"
#include "support/thread_ranks.hpp"
#include "support/verifiable.hpp"

using namespace ringfence;

namespace {

std::string read_all(const std::filesystem::path& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("streaming is chosen only where its step is clearly faster", "[stream][probe]") {
  REQUIRE(detail::prefers_stream({10.0, 7.9}));
  REQUIRE_FALSE(detail::prefers_stream({10.0, 8.0}));  // within kStreamWin: keep the cache
  REQUIRE_FALSE(detail::prefers_stream({10.0, 12.0}));
  REQUIRE(detail::prefers_stream({13.4, 4.5}));  // the AMD VM's slow mode (docs/tuning.md)
}

TEST_CASE("the probe times both kinds of step between two CPUs, and gives up on a CPU it cannot use", "[stream][probe]") {
  if (detail::online_cpus() >= 2) {
    const auto p = detail::probe_stream_writes(0, 1);
    REQUIRE(p.has_value());
    CHECK(p->plain_us > 0.0);
    CHECK(p->stream_us > 0.0);
    CHECK(std::isfinite(p->plain_us));
    CHECK(std::isfinite(p->stream_us));
  }
  // A CPU no thread can be pinned to: no answer, quickly (the partner does not wait a second).
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE_FALSE(detail::probe_stream_writes(0, CPU_SETSIZE + 3).has_value());
  REQUIRE_FALSE(detail::probe_stream_writes(-1, 0).has_value());
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
}

TEST_CASE("with auto the host's lowest rank probes and logs the choice, with on or off nothing probes", "[stream][probe]") {
  const auto mode = GENERATE(StreamWritesMode::Auto, StreamWritesMode::On, StreamWritesMode::Off);
  CAPTURE(static_cast<int>(mode));
  test::TempDir dir("rf-stream-log");
  CommOptions o;
  o.stream_writes = mode;
  o.host_id = "stream-probe-log";
  o.log_level = LogLevel::Info;
  o.log_file = (dir.path() / "rank%r.log").string();
  const std::string error = test::run_ranks(3, o, [&](Communicator& comm) {
    std::vector<float> v(1024, 1.0f);
    comm.allreduce(v.data(), v.data(), v.size(), DataType::Float32, ReduceOp::Sum);
    if (v[0] != 3.0f) throw std::runtime_error("wrong sum");
  });
  INFO(error);
  REQUIRE(error.empty());
  const std::string lowest = read_all(dir.path() / "rank0.log"), others = read_all(dir.path() / "rank1.log") + read_all(dir.path() / "rank2.log");
  INFO(lowest);
  if (mode == StreamWritesMode::Auto) {
    const bool ran = lowest.find("stream writes on: a 64 KiB exchange step") != std::string::npos ||
                     lowest.find("stream writes off: a 64 KiB exchange step") != std::string::npos;
    CHECK((ran || detail::online_cpus() < 2));
  } else {
    CHECK(lowest.find("stream writes") == std::string::npos);
  }
  CHECK(others.find("stream writes") == std::string::npos);
}

TEST_CASE("collectives are exact with streaming slot writes forced on, with checksums and without", "[engine][collectives][stream]") {
  const bool checksum = GENERATE(true, false);
  const int n = GENERATE(2, 3);
  CAPTURE(checksum, n);
  CommOptions o;
  o.checksum = checksum;
  o.stream_writes = StreamWritesMode::On;
  o.host_id = "stream-writes";
  o.chunk_bytes = 64 * 1024;
  std::atomic<std::size_t> wrong{0};
  const std::string error = test::run_ranks(n, o, [&](Communicator& comm) {
    // Chunks under and over 4 KiB, odd counts (unaligned chunk ends), several chunks per slot round.
    for (const std::size_t count : {std::size_t{700}, std::size_t{4099}, std::size_t{65541}, std::size_t{300001}}) {
      std::vector<float> in(count), out(count, -1.0f);
      test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), n, in.data(), count, count);
      comm.allreduce(in.data(), out.data(), count, DataType::Float32, ReduceOp::Sum);
      wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, n, out.data(), count, count);
      wrong += test::wrong_after_allgather_broadcast(comm, count);
    }
  });
  INFO(error);
  REQUIRE(error.empty());
  CHECK(wrong == 0);
}

TEST_CASE("chunks read from streamed slots (prefetched) are verified: damaged ones are re-sent, results exact",
          "[engine][collectives][stream][integrity][p2p]") {
  // With streaming slot writes a receiver's checked passes prefetch the chunk ahead of the
  // folding (checked_ops.hpp, CheckedSource::Memory): the copy out (allgather, point-to-point)
  // and the fused float sum (allreduce) must still catch every flip and take the re-sent bytes.
  CommOptions o;
  o.checksum = true;
  o.stream_writes = StreamWritesMode::On;
  o.host_id = "stream-writes-flips";
  o.chunk_bytes = 64 * 1024;
  o.fault = "flip:rate=2e-6,link=0-1,seed=5";
  o.health_agree_every = 0;  // keep the damaged link in use: this tests the passes, not fencing
  o.timeout = std::chrono::seconds(20);
  std::atomic<std::size_t> wrong{0};
  std::atomic<std::uint64_t> errors{0};
  const std::string error = test::run_ranks(2, o, [&](Communicator& comm) {
    const int peer = 1 - comm.rank();
    for (int it = 0; it < 4; ++it) {
      const std::size_t count = 300001;  // several 64 KiB chunks, the last one short and unaligned
      std::vector<float> in(count), out(count, -1.0f);
      test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), 2, in.data(), count, static_cast<std::size_t>(it));
      comm.allreduce(in.data(), out.data(), count, DataType::Float32, ReduceOp::Sum);
      wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, 2, out.data(), count, static_cast<std::size_t>(it));
      wrong += test::wrong_after_allgather_broadcast(comm, count);
      // An exchange: each rank's message is its rank and index, exact in float.
      std::vector<float> mine(count), theirs(count, -1.0f);
      for (std::size_t i = 0; i < count; ++i) mine[i] = static_cast<float>(comm.rank() * 1000000 + static_cast<int>(i) + it);
      comm.group_start();
      comm.send(mine.data(), count, DataType::Float32, peer);
      comm.recv(theirs.data(), count, DataType::Float32, peer);
      comm.group_end();
      for (std::size_t i = 0; i < count; ++i) wrong += theirs[i] != static_cast<float>(peer * 1000000 + static_cast<int>(i) + it) ? 1 : 0;
    }
    for (const auto& l : comm.links())
      if (!l.device_lane) errors += l.checksum_errors;
  });
  INFO(error);
  REQUIRE(error.empty());
  CHECK(wrong == 0);
  CHECK(errors > 0);  // flips reached the checked passes and were caught
}
