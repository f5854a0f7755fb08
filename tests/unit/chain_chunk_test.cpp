// Chain broadcast and reduce cut messages of fewer than four staging slots into four chunks
// (chain_chunk) so the ranks of the chain overlap. The rule, and exact results at the sizes
// where it cuts, with checksums on a corrupting link too.
#include <atomic>
#include <ringfence/communicator.hpp>
#include <vector>

#include "engine.hpp"
#include "support/catch.hpp"
#include "support/thread_ranks.hpp"
#include "support/verifiable.hpp"

using namespace ringfence;
using detail::chain_chunk;

TEST_CASE("chain chunk: a slot from four slots up, else a quarter of at least 32 KiB in whole lines", "[engine][chain]") {
  constexpr std::size_t slot = 256 * 1024;
  CHECK(chain_chunk(4 * slot, 1, slot) == slot);
  CHECK(chain_chunk(100 * slot / 4, 4, slot) == slot / 4);  // 25 slots of floats: a slot's worth
  CHECK(chain_chunk(32 * 1024, 1, slot) == 32 * 1024);       // one chunk: 32 KiB is the floor
  CHECK(chain_chunk(64 * 1024, 1, slot) == 32 * 1024);       // two of the floor
  CHECK(chain_chunk(128 * 1024, 1, slot) == 32 * 1024);      // four of the floor
  CHECK(chain_chunk(1000, 4, slot) == 32 * 1024 / 4);        // smaller than the floor: one chunk
  CHECK(chain_chunk(256 * 1024 / 4, 4, slot) == 64 * 1024 / 4);   // 256 KiB of floats: four of 64 KiB
  CHECK(chain_chunk(512 * 1024, 1, slot) == 128 * 1024);
  CHECK(chain_chunk((4 * slot - 64) / 8, 8, slot) == slot / 8);  // just under four slots: a quarter rounds up to a slot
  const std::size_t odd = chain_chunk(300001, 2, slot);      // a quarter of 600002 B, rounded up to 64 B
  CHECK(odd * 2 == (600002 / 4 + 63) / 64 * 64);
  // Small slots: never more than a slot.
  CHECK(chain_chunk(1 << 20, 1, 4096) == 4096);
}

TEST_CASE("chain broadcast and reduce of 1-4 slots are exact, with checksums on a corrupting link too",
          "[engine][chain][integrity]") {
  for (const bool corrupt : {false, true}) {
    CAPTURE(corrupt);
    CommOptions o;
    o.host_id = "chain";
    o.timeout = std::chrono::seconds(20);
    o.checksum = corrupt;
    if (corrupt) o.fault = "flip:rate=2e-5,link=0-1,seed=3";
    o.algorithm = Algorithm::Ring;
    const int n = 3;
    std::atomic<std::size_t> wrong{0};
    std::atomic<std::uint64_t> errors{0};
    const std::string err = test::run_ranks(n, o, [&](Communicator& comm) {
      // 64 KiB, 192 KiB, 300 KiB + 4 B and 900 KiB of int32 / float64: 2, 4, 4 and 4 chunks.
      for (std::size_t bytes : {std::size_t{64} << 10, std::size_t{192} << 10, (std::size_t{300} << 10) + 4, std::size_t{900} << 10})
        for (int root : {0, 2}) {
          const std::size_t count = bytes / 4;
          std::vector<std::int32_t> in(count), out(count, -1);
          test::fill_pattern(DataType::Int32, comm.rank(), in.data(), count);
          comm.broadcast(in.data(), out.data(), count, DataType::Int32, root);
          wrong += test::count_wrong_pattern(DataType::Int32, root, out.data(), count);
          const std::size_t dcount = bytes / 8;
          std::vector<double> din(dcount), dout(dcount, -1.0);
          test::fill_input(DataType::Float64, ReduceOp::Sum, comm.rank(), n, din.data(), dcount);
          comm.reduce(din.data(), dout.data(), dcount, DataType::Float64, ReduceOp::Sum, root);
          if (comm.rank() == root) wrong += test::count_wrong(DataType::Float64, ReduceOp::Sum, n, dout.data(), dcount);
        }
      float one = 1.0f;  // every re-send of the last call is done once all ranks finished another
      comm.allreduce(&one, &one, 1, DataType::Float32, ReduceOp::Sum);
      for (const auto& l : comm.links()) errors += l.checksum_errors;
    });
    INFO(err);
    REQUIRE(err.empty());
    CHECK(wrong == 0);
    if (corrupt) CHECK(errors > 0);
  }
}
