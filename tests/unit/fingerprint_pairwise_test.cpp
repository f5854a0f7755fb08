// Call fingerprints compared sender by sender (CallCheck::pairwise, docs/failure-semantics.md
// "Calls that receive from every rank"): a one-shot allreduce on more than two ranks sends its
// input before any comparison, so every receiver must compare each sender's call itself before
// it uses that sender's chunk, not only its checked ring predecessor's.
#include <chrono>
#include <ringfence/ringfence.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/thread_ranks.hpp"

using namespace ringfence;

namespace {

CommOptions one_shot_options() {
  CommOptions o;
  o.host_id = "thread-host";
  o.timeout = std::chrono::seconds(20);
  o.chunk_bytes = 256;
  o.algorithm = Algorithm::OneShot;
  return o;
}

}  // namespace

TEST_CASE("fingerprints: a one-shot receiver refuses a disagreeing sender that is not its checked rank",
          "[failure][fingerprint]") {
  // Rank 1 of 4 calls max where the others call sum (same count and type: its chunk has the
  // right size and would reduce without complaint). Rank 0 checks rank 3 (its ring predecessor)
  // and combines rank 1's chunk first. Rank 1 starts at once and sends; rank 0 starts 100 ms
  // later, when rank 1's chunk is there; ranks 2 and 3 start 300 ms later, so no one but ranks
  // 0 and 1 can find the disagreement before then, and rank 1 only once rank 0's chunk arrives.
  // Rank 0 must find it itself before it uses rank 1's chunk: its error names both calls. (Had
  // it taken the chunk, it would wait for rank 2 until rank 1's abort ended the call.)
  std::vector<std::string> seen(4);
  const std::string err = test::run_ranks(4, one_shot_options(), [&](Communicator& comm) {
    std::vector<float> buf(8, 1.0f);
    comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);  // in step first
    const auto r = static_cast<std::size_t>(comm.rank());
    if (comm.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (comm.rank() >= 2) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    try {
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, comm.rank() == 1 ? ReduceOp::Max : ReduceOp::Sum);
      seen[r] = "no error";
    } catch (const InvalidUsage& e) {
      seen[r] = e.what();
    }
  });
  REQUIRE(err.empty());
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << seen[r]);
    CHECK(seen[r] != "no error");
  }
  INFO("rank 0: " << seen[0]);
  CHECK(seen[0].find("rank 0 called allreduce(count=8, float, sum), rank 1 called allreduce(count=8, float, max)") !=
        std::string::npos);
}
