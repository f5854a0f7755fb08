// Result digests (CommOptions::digest_every): what a divergence does under each
// `digest_action`, with a link that flips bits and no checksums to catch it first.
#include <ringfence/communicator.hpp>
#include <ringfence/events.hpp>
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "support/catch.hpp"
#include "support/thread_ranks.hpp"
#include "support/verifiable.hpp"

using namespace ringfence;

namespace {

// Thread ranks whose link 0-1 flips bits, checksums and health off (the link stays in use),
// every allreduce's digests compared.
CommOptions corrupting(DigestAction action, const char* host) {
  CommOptions o;
  o.chunk_bytes = 4096;
  o.timeout = std::chrono::seconds(20);
  o.checksum = false;
  o.health_enabled = false;
  o.digest_every = 1;
  o.digest_action = action;
  o.fault = "flip:rate=2e-5,link=0-1,seed=21";
  o.host_id = host;
  return o;
}

}  // namespace

TEST_CASE("result digests name a rank whose output diverged", "[integrity][health][digest]") {
  // Without checksums a link flipping bits in the allgather phase leaves ranks with different
  // results; the digest comparison (itself checksummed) must notice, identically on every rank.
  const int n = 3;
  std::vector<std::uint64_t> mismatches(n);
  std::vector<std::vector<std::uint64_t>> named(n);
  const CommOptions o = corrupting(DigestAction::Log, "digest");  // log: count every divergence
  const std::string error = test::run_ranks(n, o, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    comm.on_health_event([&, r](const HealthEvent& e) {
      if (e.kind == EventKind::DigestMismatch) named[r].push_back(e.count);
    });
    std::vector<float> buf(30000);
    for (int it = 0; it < 10; ++it) {
      test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), n, buf.data(), buf.size());
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
    }
    mismatches[r] = comm.digest_mismatches();
  });
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(mismatches[0] > 0);
  for (int r = 1; r < n; ++r) {
    REQUIRE(mismatches[r] == mismatches[0]);  // every rank saw the same divergences
    REQUIRE(named[r] == named[0]);            // and named the same ranks
  }
}

TEST_CASE("a digest mismatch fails the allreduce on every rank by default, naming what differs", "[integrity][health][digest]") {
  const int n = 3;
  CommOptions o = corrupting(DigestAction::Error, "digest-error");
  REQUIRE(CommOptions{}.digest_action == DigestAction::Error);
  std::vector<std::string> errors(n);
  std::vector<int> failed_at(n, -1);
  const std::string error = test::run_ranks(n, o, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    std::vector<float> buf(30000);
    for (int it = 0; it < 10; ++it) {
      test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), n, buf.data(), buf.size());
      try {
        comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
      } catch (const Error& e) {
        errors[r] = e.what();
        failed_at[r] = it;
        if (e.code() != ErrorCode::Fatal) errors[r] = "wrong code: " + errors[r];
        return;
      }
    }
  });
  INFO(error);
  REQUIRE(error.empty());
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << errors[static_cast<std::size_t>(r)]);
    CHECK(failed_at[static_cast<std::size_t>(r)] >= 0);
    CHECK(failed_at[static_cast<std::size_t>(r)] == failed_at[0]);  // the same allreduce on every rank
    CHECK_THAT(errors[static_cast<std::size_t>(r)], Catch::Contains("result digests differ") && Catch::Contains("ring link"));
  }
}

TEST_CASE("digest_action fence fences the links where outputs differ, and later results are exact", "[integrity][health][digest]") {
  const int n = 4;
  const CommOptions o = corrupting(DigestAction::Fence, "digest-fence");
  std::vector<std::vector<std::pair<int, int>>> fenced(n);
  std::vector<std::size_t> wrong_after(n, 0);
  const std::string error = test::run_ranks(n, o, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    comm.on_health_event([&, r](const HealthEvent& e) {
      if (e.kind == EventKind::LinkFenced) fenced[r].emplace_back(e.a, e.b);
    });
    std::vector<float> buf(30000);
    for (int it = 0; it < 12; ++it) {
      test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), n, buf.data(), buf.size());
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
      if (!fenced[r].empty() && it >= 10) wrong_after[r] += test::count_wrong(DataType::Float32, ReduceOp::Sum, n, buf.data(), buf.size());
    }
  });
  INFO(error);
  REQUIRE(error.empty());
  for (int r = 0; r < n; ++r) {
    const auto& f = fenced[static_cast<std::size_t>(r)];
    CHECK(f == fenced[0]);  // agreed alike
    CHECK(std::find(f.begin(), f.end(), std::pair{0, 1}) != f.end());  // the damaging link is among them
    CHECK(wrong_after[static_cast<std::size_t>(r)] == 0);
  }
}
