// Call fingerprints compared sender by sender (CallCheck::pairwise, docs/failure-semantics.md
// "Calls that receive from every rank"): a one-shot allreduce on more than two ranks sends its
// input before any comparison, so every receiver must compare each sender's call itself before
// it uses that sender's chunk, not only its checked ring predecessor's.
// An alltoall leaves the comparison to the executor too (Dispatch::exchange_check,
// docs/failure-semantics.md "Alltoall"): its blocks leave before any comparison, so each receiver
// compares a sender's call before it uses that sender's block, the checked rank by its call word.
#include <algorithm>
#include <chrono>
#include <ringfence/ringfence.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/thread_ranks.hpp"

using namespace ringfence;

namespace {

CommOptions exchange_options() {
  CommOptions o;
  o.host_id = "thread-host";
  o.timeout = std::chrono::seconds(20);
  o.chunk_bytes = 256;
  return o;
}

CommOptions one_shot_options() {
  CommOptions o = exchange_options();
  o.algorithm = Algorithm::OneShot;
  return o;
}

constexpr float kUntouched = -1.0f;

// What a rank's call ended with: "no error", or the refusal's message.
template <class Call>
std::string outcome(Call&& call) {
  try {
    call();
    return "no error";
  } catch (const InvalidUsage& e) {
    return e.what();
  }
}

// Every rank runs an alltoall of `count` elements of `type` per rank (16 bytes a block, so every
// block fits a staging slot and none goes direct); `odd` runs `odd_type` instead. `delay(rank)`
// holds a rank back before its call. Returns each rank's error ("no error" if none); `received`
// gets rank 0's output.
std::vector<std::string> exchange(int ranks, int odd, DataType odd_type, std::chrono::milliseconds (*delay)(int),
                                  std::vector<float>& received) {
  std::vector<std::string> seen(static_cast<std::size_t>(ranks));
  const std::string err = test::run_ranks(ranks, exchange_options(), [&](Communicator& comm) {
    const auto n = static_cast<std::size_t>(comm.size());
    std::vector<float> in(4 * n, static_cast<float>(comm.rank() + 1)), out(4 * n, kUntouched);
    comm.alltoall(in.data(), out.data(), 4, DataType::Float32);  // in step first
    std::fill(out.begin(), out.end(), kUntouched);
    const auto r = static_cast<std::size_t>(comm.rank());
    std::this_thread::sleep_for(delay(comm.rank()));
    seen[r] = outcome([&] { comm.alltoall(in.data(), out.data(), 4, comm.rank() == odd ? odd_type : DataType::Float32); });
    if (comm.rank() == 0) received = out;
  });
  REQUIRE(err.empty());
  return seen;
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
    seen[r] = outcome([&] {
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, comm.rank() == 1 ? ReduceOp::Max : ReduceOp::Sum);
    });
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

TEST_CASE("fingerprints: an alltoall refuses a disagreeing peer's block before using it", "[failure][fingerprint]") {
  // Rank 1 calls alltoall on int32 where rank 0 calls it on float: the blocks have the same
  // size, and rank 1's block reaches rank 0 before rank 0 has compared anything (rank 0 starts
  // 100 ms later). Both ranks refuse the call naming both; rank 0's output keeps rank 1's block
  // unwritten.
  std::vector<float> out;
  const auto seen = exchange(2, 1, DataType::Int32, [](int r) { return std::chrono::milliseconds(r == 0 ? 100 : 0); }, out);
  INFO("rank 0: " << seen[0]);
  CHECK(seen[0].find("rank 0 called alltoall(count=4, float), rank 1 called alltoall(count=4, int32)") != std::string::npos);
  INFO("rank 1: " << seen[1]);
  CHECK(seen[1].find("rank 1 called alltoall(count=4, int32), rank 0 called alltoall(count=4, float)") != std::string::npos);
  for (std::size_t i = 4; i < 8; ++i) CHECK(out[i] == kUntouched);
}

TEST_CASE("fingerprints: an alltoall on four ranks refuses a disagreeing sender that is not its checked rank",
          "[failure][fingerprint]") {
  // Rank 0 checks rank 3 (its ring predecessor). Rank 1 disagrees and starts at once; rank 0
  // starts 100 ms later, when rank 1's block is there; ranks 2 and 3 300 ms later. Rank 0 must
  // compare rank 1's call itself before it uses rank 1's block: its error names both calls, and
  // that block of its output stays unwritten.
  std::vector<float> out;
  const auto seen = exchange(4, 1, DataType::Int32,
                             [](int r) { return std::chrono::milliseconds(r == 0 ? 100 : r >= 2 ? 300 : 0); }, out);
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << seen[r]);
    CHECK(seen[r] != "no error");
  }
  INFO("rank 0: " << seen[0]);
  CHECK(seen[0].find("rank 0 called alltoall(count=4, float), rank 1 called alltoall(count=4, int32)") != std::string::npos);
  for (std::size_t i = 4; i < 8; ++i) CHECK(out[i] == kUntouched);
}

TEST_CASE("fingerprints: an alltoall against an allreduce is refused naming both, long before the timeout",
          "[failure][fingerprint]") {
  // Rank 0's block leaves at once; rank 1 (a carried allreduce of the same size) waits for rank
  // 0's post, and rank 0 for a block that never comes: its waits must read rank 1's fingerprint.
  std::vector<std::string> seen(2);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string err = test::run_ranks(2, exchange_options(), [&](Communicator& comm) {
    std::vector<float> in(8, 1.0f), out(8, kUntouched);
    comm.alltoall(in.data(), out.data(), 4, DataType::Float32);  // in step first
    const auto r = static_cast<std::size_t>(comm.rank());
    seen[r] = outcome([&] {
      if (comm.rank() == 0)
        comm.alltoall(in.data(), out.data(), 4, DataType::Float32);
      else
        comm.allreduce(in.data(), out.data(), 8, DataType::Float32, ReduceOp::Sum);
    });
  });
  REQUIRE(err.empty());
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << seen[r]);
    CHECK(seen[r].find("alltoall(count=4, float)") != std::string::npos);
    CHECK(seen[r].find("allreduce(count=8, float, sum)") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}
