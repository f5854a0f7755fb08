// Where a chunk and its trailer lie (EngineConfig in src/engine.hpp). With at most
// kFlagLineTrailers slots per link (the default, 4) each slot's trailer lies in the line of the
// receiver's data flag for that sender, and chunks start at their slot. With more slots the
// trailer ends the slot's stride, and a checked chunk of at most kPackedMaxBytes (48) ends where
// its trailer starts, in the trailer's cache line. Sender, receiver, relays and piece re-sends
// must all agree on those places, or no chunk would ever pass its check.
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

TEST_CASE("chunk layout: with few slots each trailer lies in its data flag's line, clear of the flag, and chunks start at the slot",
          "[integrity][layout]") {
  EngineConfig c;
  c.size = 5;
  c.slot_bytes = 64 * 1024;
  c.checksum = true;
  for (const int slots : {1, 4}) {
    c.slots = slots;
    REQUIRE(c.trailers_with_flag());
    for (int from = 0; from < c.size; ++from) {
      const std::size_t flag = detail::FlagBlock::data_offset(c.size, from);
      for (std::uint64_t m = 0; m < static_cast<std::uint64_t>(slots); ++m) {
        INFO("from " << from << ", message " << m);
        const std::size_t at = c.trailer_at(from, m);
        CHECK(at >= flag + sizeof(SignalFlag::value) + sizeof(SignalFlag::waiters));  // clear of the value and waiter count
        CHECK((at + sizeof(detail::ChunkTrailer) - 1) / 64 == flag / 64);           // the flag's own line, whole
        if (m > 0) CHECK(at == c.trailer_at(from, m - 1) + sizeof(detail::ChunkTrailer));  // no overlap
        CHECK(c.trailer_at(from, m + static_cast<std::uint64_t>(slots)) == at);  // the slot's place, whatever the message
      }
    }
    for (const std::size_t bytes : {std::size_t{4}, std::size_t{48}, std::size_t{4096}, c.slot_bytes}) CHECK(c.data_offset(bytes) == 0);
  }
  c.slots = detail::kFlagLineTrailers + 1;
  CHECK_FALSE(c.trailers_with_flag());
}

TEST_CASE("chunk layout: with many slots small checked chunks end at the trailer, in its cache line, large ones start at the slot",
          "[integrity][layout]") {
  EngineConfig c;
  c.slot_bytes = 64 * 1024;
  c.slots = 8;
  c.checksum = true;
  REQUIRE_FALSE(c.trailers_with_flag());
  const std::size_t trailer = c.trailer_offset();
  CHECK(trailer == c.slot_bytes + detail::kTrailerBytes - sizeof(detail::ChunkTrailer));
  CHECK(trailer + sizeof(detail::ChunkTrailer) == c.slot_stride());  // the trailer ends the slot
  CHECK(c.trailer_at(3, 9) == 1 * c.slot_stride() + trailer);  // message 9 of 8 slots: slot 1's trailer
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

TEST_CASE("chunk layout: chunks of every size, either trailer place, on a link that damages most deliveries, results exact", "[integrity][repair][layout]") {
  const int n = 3;
  const int slots = GENERATE(4, 8);  // trailers with the data flag; after the slots, small chunks packed
  INFO(slots << " slots");
  CommOptions o;
  o.slots = slots;
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
  // 8 slots: trailers after the slots, so 40-byte chunks are packed against theirs.
  const auto ring = [](int, CommOptions& o) {
    o.algorithm = Algorithm::Ring;
    o.slots = 8;
  };
  const auto [clean, faulty] = test::run_against_clean(4, "flip:rate=2e-3,link=0-1,seed=3", ring, builtin_transports(), 200, 40);
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    REQUIRE(faulty.fences[r] == std::vector<LinkId>{LinkId{0, 1}});
    REQUIRE(faulty.relays[r] == std::vector<Relay>{Relay{0, 2, 1}});
    REQUIRE(faulty.errors_after_first_epoch[r] == 0);
  }
}
