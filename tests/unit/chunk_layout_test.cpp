// Where a chunk lies in its staging slot (EngineConfig::data_offset, src/engine.hpp): with
// checksums a chunk of at most kPackedMaxBytes (48) ends where its trailer starts, in the
// trailer's cache line; larger ones start at the slot. Sender, receiver, relays and piece
// re-sends must all agree on that place, or no chunk would ever pass its check.
#include <ringfence/communicator.hpp>
#include <string>
#include <vector>

#include "engine.hpp"
#include "support/catch.hpp"
#include "support/fence_scenario.hpp"
#include "support/thread_ranks.hpp"
#include "support/verifiable.hpp"

using namespace ringfence;
using ringfence::detail::EngineConfig;

TEST_CASE("chunk layout: small checked chunks end at the trailer, in its cache line, large ones start at the slot", "[integrity][layout]") {
  EngineConfig c;
  c.slot_bytes = 64 * 1024;
  c.checksum = true;
  const std::size_t trailer = c.trailer_offset();
  CHECK(trailer == c.slot_bytes + detail::kTrailerBytes - sizeof(detail::ChunkTrailer));
  CHECK(trailer + sizeof(detail::ChunkTrailer) == c.slot_stride());  // the trailer ends the slot
  static_assert(detail::kPackedMaxBytes + sizeof(detail::ChunkTrailer) == detail::kTrailerBytes);
  for (const std::size_t bytes : {std::size_t{4}, std::size_t{8}, std::size_t{20}, detail::kPackedMaxBytes}) {
    INFO(bytes << " bytes");
    CHECK(c.data_offset(bytes) + bytes == trailer);
    CHECK(c.data_offset(bytes) / 64 == trailer / 64);  // the whole chunk and its trailer: one line
  }
  CHECK(c.data_offset(detail::kPackedMaxBytes + 4) == 0);  // larger chunks: at the slot, aligned
  CHECK(c.data_offset(4096) == 0);
  CHECK(c.data_offset(c.slot_bytes) == 0);
  c.slot_bytes = 64;  // the smallest slot: packing does not depend on the slot's size
  CHECK(c.data_offset(48) == c.trailer_offset() - 48);
  CHECK(c.data_offset(64) == 0);
  c.checksum = false;  // without checksums (trailers for relays only) chunks start at the slot
  CHECK(c.data_offset(8) == 0);
}

TEST_CASE("chunk layout: packed and unpacked chunks on a link that damages most deliveries, results exact", "[integrity][repair][layout]") {
  const int n = 3;
  CommOptions o;
  o.chunk_bytes = 4096;  // 4 KiB chunks are repaired in pieces: each piece must land where the chunk lies
  o.timeout = std::chrono::seconds(60);
  o.checksum = true;
  o.health_enabled = false;  // only the repair can help
  o.fault = "flip:rate=3e-3,link=0-1,seed=7";  // ~12 flipped bytes per 4 KiB delivery
  o.host_id = "packed-repair";
  std::vector<std::size_t> wrong(n, 0);
  std::vector<std::uint64_t> errors(n, 0);
  const std::string error = test::run_ranks(n, o, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    for (const std::size_t count : {std::size_t{3}, std::size_t{12}, std::size_t{700}, std::size_t{3 * 1024}}) {  // 4 B to 4 KiB chunks
      std::vector<float> buf(count);
      for (int it = 0; it < 4; ++it) {
        test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), n, buf.data(), buf.size());
        comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
        wrong[r] += test::count_wrong(DataType::Float32, ReduceOp::Sum, n, buf.data(), buf.size());
      }
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
  CHECK(total > 20);  // the link really was that bad
}

TEST_CASE("chunk layout: packed chunks of a corrupting link are relayed once it is fenced, results bit-identical",
          "[integrity][relay][layout]") {
  // 4 ranks, allreduces of 40 floats: ring chunks of 40 bytes, packed in their trailers' line.
  // Link 0-1 corrupts them until the agreement fences it; the relay 0->2->1 then forwards
  // packed chunks, reading their place from the trailer's length.
  // The ring on both runs: small allreduces otherwise go one-shot, and a fence sends them back to
  // the ring, which sums in another order (exact, but not the clean run's bytes).
  const auto ring = [](int, CommOptions& o) { o.algorithm = Algorithm::Ring; };
  const auto [clean, faulty] = test::run_against_clean(4, "flip:rate=2e-3,link=0-1,seed=3", ring, builtin_transports(), 200, 40);
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    REQUIRE(faulty.fences[r] == std::vector<LinkId>{LinkId{0, 1}});
    REQUIRE(faulty.relays[r] == std::vector<Relay>{Relay{0, 2, 1}});
    REQUIRE(faulty.errors_after_first_epoch[r] == 0);
  }
}
