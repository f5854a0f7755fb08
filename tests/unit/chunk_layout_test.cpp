// Where a chunk lies in its staging slot (EngineConfig::data_offset, src/engine.hpp): with
// checksums a chunk of at most kPackedMaxBytes ends where its trailer starts, so the two share
// a cache line; sender, receiver, relays and piece re-sends must all agree on that place, or
// no chunk would ever pass its check.
#include <ringfence/communicator.hpp>
#include <string>
#include <vector>

#include "engine.hpp"
#include "support/catch.hpp"
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
  for (const std::size_t bytes : {std::size_t{4}, std::size_t{8}, std::size_t{48}, std::size_t{1000}, detail::kPackedMaxBytes}) {
    INFO(bytes << " bytes");
    CHECK(c.data_offset(bytes) + bytes == trailer);
    CHECK((c.data_offset(bytes) + bytes - 1) / 64 == trailer / 64);  // last data byte and trailer: one line
  }
  CHECK(c.data_offset(detail::kPackedMaxBytes + 4) == 0);
  CHECK(c.data_offset(c.slot_bytes) == 0);
  c.slot_bytes = 64;  // a chunk as large as a tiny slot still fits in front of the trailer
  CHECK(c.data_offset(64) == c.trailer_offset() - 64);
  CHECK(c.data_offset(64) + 64 <= c.slot_stride());
  c.checksum = false;  // without checksums (trailers for relays only) chunks start at the slot
  CHECK(c.data_offset(8) == 0);
}

TEST_CASE("chunk layout: packed 4 KiB chunks that never arrive whole are repaired in pieces, results exact", "[integrity][repair][layout]") {
  const int n = 3;
  CommOptions o;
  o.chunk_bytes = 4096;  // packed against the trailer: each piece re-send must land there too
  o.timeout = std::chrono::seconds(60);
  o.checksum = true;
  o.health_enabled = false;  // only the repair can help
  o.fault = "flip:rate=3e-3,link=0-1,seed=7";  // ~12 flipped bytes per 4 KiB delivery
  o.host_id = "packed-repair";
  std::vector<std::size_t> wrong(n, 0);
  std::vector<std::uint64_t> errors(n, 0);
  const std::string error = test::run_ranks(n, o, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    for (const std::size_t count : {std::size_t{3}, std::size_t{700}, std::size_t{3 * 1024}}) {  // 4 B to 4 KiB chunks
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
