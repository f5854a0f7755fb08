// Chunks that a damaged link never delivers whole are repaired piece by piece
// (src/ring_runner_repair.cpp): with health off the link stays in use, so every collective
// must still finish, exactly, on the repair alone.
#include <ringfence/communicator.hpp>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/thread_ranks.hpp"
#include "support/verifiable.hpp"

using namespace ringfence;

TEST_CASE("a link flipping 1 byte in 1000 never delivers a 64 KiB chunk whole, yet every result is exact", "[integrity][repair]") {
  const int n = 3;
  CommOptions o;
  o.chunk_bytes = 64 * 1024;  // some 65 flipped bytes per delivery: whole re-sends would never get through
  o.timeout = std::chrono::seconds(60);
  o.checksum = true;
  o.health_enabled = false;  // no agreement fences the link: only the repair can help
  o.fault = "flip:rate=1e-3,link=0-1,seed=5";
  o.host_id = "repair";
  std::vector<std::size_t> wrong(n, 0);
  std::vector<std::uint64_t> errors(n, 0);
  const std::string error = test::run_ranks(n, o, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    std::vector<float> buf(3 * 64 * 1024 / sizeof(float));
    for (int it = 0; it < 3; ++it) {
      test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), n, buf.data(), buf.size());
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
      wrong[r] += test::count_wrong(DataType::Float32, ReduceOp::Sum, n, buf.data(), buf.size());
    }
    for (const auto& l : comm.links()) errors[r] += l.checksum_errors;
  });
  INFO(error);
  REQUIRE(error.empty());
  std::uint64_t total = 0;
  for (int r = 0; r < n; ++r) {
    CHECK(wrong[static_cast<std::size_t>(r)] == 0);
    total += errors[static_cast<std::size_t>(r)];
  }
  CHECK(total > 100);  // the link really was that bad
}
