// Point-to-point transfers written straight into the receiver's buffer with checksums on
// (RingRunner::run_p2p, fetch_p2p_key, service_nacks): the receiver verifies each chunk where it
// landed and asks for damaged ones again; a receive-buffer key that reaches the sender damaged
// or not at all is asked for again (kRepublishKeyPiece); the sender returns only once its
// direct chunks are accepted, so it may overwrite its buffer at once.
#include <atomic>
#include <limits>
#include <ringfence/communicator.hpp>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/thread_ranks.hpp"
#include "support/verifiable.hpp"

using namespace ringfence;

TEST_CASE("direct point-to-point with checksums: damaged and lost chunks and keys are asked for again, every transfer exact",
          "[integrity][fault][p2p][direct]") {
  // One chunk per transfer, or five (more than the four slots: the sender waits for credits
  // while the receiver repairs).
  const std::size_t count = GENERATE(std::size_t{600}, std::size_t{5000});
  // shm writes user buffers by cross-memory attach; tcp's receiver thread writes them.
  const std::string transport = GENERATE(std::string("shm"), std::string("tcp"));
  INFO(count << " floats over " << transport);
  CommOptions o;
  o.transports = {transport};
  o.checksum = true;
  o.health_enabled = false;  // the link must stay in use: no fence, no relay
  o.chunk_bytes = 4096;
  o.direct_write_min_bytes = 1000;  // every transfer here goes direct...
  o.p2p_direct_user_min_bytes = 1;  // ...into plain user buffers
  o.timeout = std::chrono::seconds(30);
  // About one key in twenty (header and key, some 50 bytes) arrives damaged, one write in
  // twenty not at all; most 4 KiB chunks are damaged, many whole deliveries in a row.
  o.fault = "flip:rate=1e-3,link=0-1,seed=5;drop:rate=0.05,link=0-1,seed=6";
  o.host_id = "p2p-direct-checked";
  std::atomic<std::size_t> wrong{0};
  std::atomic<std::uint64_t> damaged_keys{0}, damaged_chunks{0};
  const int transfers = 150;
  const std::string error = test::run_ranks(2, o, [&](Communicator& comm) {
    std::vector<float> buf(count);
    for (int it = 0; it < transfers; ++it) {
      const std::size_t first = static_cast<std::size_t>(it) * 7;  // every transfer differs
      if (comm.rank() == 0) {
        test::fill_pattern(DataType::Float32, 0, buf.data(), count, first);
        comm.send(buf.data(), count, DataType::Float32, 1);
        // Returned: a re-send of a direct chunk would read this buffer, so none may be pending.
        std::fill(buf.begin(), buf.end(), std::numeric_limits<float>::quiet_NaN());
      } else {
        std::fill(buf.begin(), buf.end(), -1.0f);
        comm.recv(buf.data(), count, DataType::Float32, 0);
        wrong += test::count_wrong_pattern(DataType::Float32, 0, buf.data(), count, first);
      }
    }
    // Rank 0 receives no chunks, so its checksum errors are keys that arrived damaged.
    for (const auto& l : comm.links()) (comm.rank() == 0 ? damaged_keys : damaged_chunks) += l.checksum_errors;
  });
  INFO(error);
  REQUIRE(error.empty());
  CHECK(wrong == 0);
  CHECK(damaged_keys > 0);
  CHECK(damaged_chunks > 0);
}
