// Chunk and credit signals leave waking a sleeping receiver for later (SignalOp::defer_wake,
// RingRunner::defer_wake): the runner flushes before it waits on any link and when the call
// ends. A missed flush leaves a peer asleep until its futex slice ends (20 ms without
// checksums), so calls between ranks that sleep at once (RINGFENCE_SHM_SPIN=0) would take
// milliseconds each instead of microseconds.
#include <chrono>
#include <ringfence/ringfence.hpp>
#include <vector>

#include "support/catch.hpp"
#include "support/thread_ranks.hpp"

using namespace ringfence;

namespace {

CommOptions sleeping_options(bool checksum) {
  CommOptions o;
  o.transports = {"shm"};
  o.checksum = checksum;
  o.transport_settings.emplace("RINGFENCE_SHM_SPIN", "0");  // every wait not over at once sleeps
  o.chunk_bytes = 16 * 1024;                            // the larger calls move several chunks a link
  return o;
}

}  // namespace

TEST_CASE("deferred wake-ups: ranks that sleep at once are never left asleep by a chunk or credit signal",
          "[shm][wake]") {
  const bool checksum = GENERATE(false, true);
  const int n = GENERATE(2, 3, 4);  // from 3 ranks a ring sends and receives on different links
  INFO("ranks " << n << ", checksums " << checksum);
  constexpr int kCalls = 150;
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<std::size_t> wrong{0};
  const std::string err = test::run_ranks(n, sleeping_options(checksum), [&](Communicator& comm) {
    for (const std::size_t count : {std::size_t{2}, std::size_t{1000}, std::size_t{40000}}) {
      std::vector<std::int64_t> buf(count);
      for (int call = 0; call < kCalls; ++call) {
        test::fill_input(DataType::Int64, ReduceOp::Sum, comm.rank(), n, buf.data(), count);
        comm.allreduce(buf.data(), buf.data(), count, DataType::Int64, ReduceOp::Sum);
        wrong += test::count_wrong(DataType::Int64, ReduceOp::Sum, n, buf.data(), count);
      }
    }
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(err == "");
  REQUIRE(wrong == 0);
  // 450 calls: with a wake-up missed in most of them they take 450 x 1-20 ms; woken at once,
  // a few ms even with every wait a futex sleep on 2 busy cores.
  INFO("seconds " << secs);
  REQUIRE(secs < 3.0);
}
