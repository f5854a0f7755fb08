// Point-to-point transfers (grouped send/recv, alltoall) over a corrupting link: with checksums
// every received byte is exact, every detected corruption was answered by a re-send, and the
// receiver's verification runs in the pass that copies the chunk out (consume), so a damaged
// delivery that was already copied into the receive buffer is overwritten by the re-sent one.
#include <atomic>
#include <ringfence/communicator.hpp>
#include <vector>

#include "support/catch.hpp"
#include "support/thread_ranks.hpp"
#include "support/verifiable.hpp"

using namespace ringfence;

namespace {

CommOptions corrupting(const char* fault) {
  CommOptions o;
  o.chunk_bytes = 4096;  // many chunks per transfer: many chances to be damaged
  o.timeout = std::chrono::seconds(20);
  o.checksum = true;
  o.host_id = "p2p-integrity";
  o.fault = fault;
  return o;
}

struct Totals {
  std::atomic<std::size_t> wrong{0};
  std::atomic<std::uint64_t> checksum_errors{0}, resends{0};
  void add_links(const Communicator& comm) {
    for (const auto& l : comm.links()) {
      checksum_errors += l.checksum_errors;
      resends += l.retries;
    }
  }
};

}  // namespace

TEST_CASE("p2p: with checksums a corrupting link never corrupts a received send/recv or alltoall block",
          "[integrity][fault][p2p]") {
  for (const char* fault : {"flip:rate=1e-4,link=0-1,seed=5", "drop:rate=0.02,link=0-1,seed=9"}) {
    CAPTURE(fault);
    const int n = 3;
    Totals t;
    const std::string err = test::run_ranks(n, corrupting(fault), [&](Communicator& comm) {
      const int r = comm.rank(), right = (r + 1) % n, left = (r + n - 1) % n;
      const std::size_t count = 50000;  // 200 KB each way: ~50 chunks per transfer
      for (int it = 0; it < 3; ++it) {
        std::vector<float> to_right(count), to_left(count), from_left(count), from_right(count);
        test::fill_pattern(DataType::Float32, r, to_right.data(), count, 0);
        test::fill_pattern(DataType::Float32, r, to_left.data(), count, count);
        comm.group_start();
        comm.send(to_right.data(), count, DataType::Float32, right);
        comm.send(to_left.data(), count, DataType::Float32, left);
        comm.recv(from_left.data(), count, DataType::Float32, left);
        comm.recv(from_right.data(), count, DataType::Float32, right);
        comm.group_end();
        t.wrong += test::count_wrong_pattern(DataType::Float32, left, from_left.data(), count, 0);
        t.wrong += test::count_wrong_pattern(DataType::Float32, right, from_right.data(), count, count);

        const std::size_t block = 20000;
        std::vector<std::int32_t> in(n * block), out(n * block, -1);
        for (int j = 0; j < n; ++j)
          test::fill_pattern(DataType::Int32, r, in.data() + j * block, block, static_cast<std::size_t>(j * n + r) * block);
        comm.alltoall(in.data(), out.data(), block, DataType::Int32);
        for (int s = 0; s < n; ++s)
          t.wrong += test::count_wrong_pattern(DataType::Int32, s, out.data() + s * block, block,
                                               static_cast<std::size_t>(r * n + s) * block);
      }
      // Chunks a call left unaccepted are verified (and re-sent) during later calls: once every
      // rank finished one more collective, every re-send of the last transfer is done.
      float one = 1.0f;
      comm.allreduce(&one, &one, 1, DataType::Float32, ReduceOp::Sum);
      t.add_links(comm);
    });
    INFO(err);
    REQUIRE(err.empty());
    CHECK(t.wrong == 0);
    CHECK(t.checksum_errors > 0);
    CHECK(t.resends >= t.checksum_errors);
  }
}
