// Copies with streaming stores (copy_bytes_stream, copy_bytes_crc_stream; engine.hpp
// kStreamResultMinBytes) and a receiver's checked copies out of a slot (checked_copy, prefetching
// or not): the same bytes and CRCs as the plain copies at every length and
// alignment, nothing written past the end; and the 2-rank allreduce and allgather that use them
// for their final values (and a broadcast of that size, which does not) stay exact, with
// checksums and without.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <ringfence/communicator.hpp>
#include <ringfence/crc32c.hpp>
#include <ringfence/reduce_ops.hpp>
#include <vector>

#include "support/catch.hpp"
#include "support/float_collectives.hpp"
#include "support/thread_ranks.hpp"
#include "support/verifiable.hpp"
#include "checked_ops.hpp"
#include "engine.hpp"

using namespace ringfence;

TEST_CASE("streaming copies give the plain copies' bytes and CRCs at every length and alignment", "[integrity][crc32c][stream]") {
  std::mt19937 rng(5);
  std::vector<std::byte> src(300 * 1024), raw(300 * 1024 + 128);
  for (auto& x : src) x = static_cast<std::byte>(rng());
  // A 64-byte aligned base inside `raw`, then offsets that leave it aligned to 64, 16 or nothing.
  const auto base = (reinterpret_cast<std::uintptr_t>(raw.data()) + 63) / 64 * 64 - reinterpret_cast<std::uintptr_t>(raw.data());
  for (std::size_t offset : {0u, 16u, 64u, 3u}) {
    // Around the 64- and 256-byte steps; up to a slot (256 KiB), where the CRC variant streams.
    for (std::size_t len : {0u, 1u, 63u, 255u, 256u, 257u, 4096u, 4448u, 4709u, 16384u, 16385u, 65535u, 65536u, 65537u, 262144u}) {
      for (int with_crc = 0; with_crc < 7; ++with_crc) {
        CAPTURE(offset, len, with_crc);
        std::fill(raw.begin(), raw.end(), std::byte{0x5a});
        std::byte* dst = raw.data() + base + offset;
        if (with_crc >= 3) {  // a receiver's copy out of its slot, streaming or not, prefetching or not
          const bool stream = with_crc % 2 == 0;
          const auto from = with_crc >= 5 ? detail::CheckedSource::Cache : detail::CheckedSource::Memory;
          REQUIRE(detail::checked_copy(dst, src.data() + 1, len, stream, from) == crc32c(src.data() + 1, len));
        } else if (with_crc == 1) {
          REQUIRE(copy_bytes_crc_stream(dst, src.data() + 1, len) == crc32c(src.data() + 1, len));
        } else if (with_crc == 2) {  // a sender's streaming write into a slot (WriteOp::stream)
          REQUIRE(staging_copy_crc_stream(dst, src.data() + 1, len) == crc32c(src.data() + 1, len));
        } else {
          copy_bytes_stream(dst, src.data() + 1, len);
        }
        REQUIRE(std::memcmp(dst, src.data() + 1, len) == 0);
        REQUIRE(std::all_of(raw.begin(), raw.begin() + static_cast<std::ptrdiff_t>(base + offset),
                            [](std::byte x) { return x == std::byte{0x5a}; }));
        REQUIRE(std::all_of(raw.begin() + static_cast<std::ptrdiff_t>(base + offset + len), raw.end(),
                            [](std::byte x) { return x == std::byte{0x5a}; }));
      }
    }
  }
}

TEST_CASE("2-rank collectives large enough to stream their final values are exact, with checksums and without",
          "[engine][collectives][stream]") {
  const bool checksum = GENERATE(true, false);
  INFO("checksums " << checksum);
  CommOptions o;
  o.checksum = checksum;
  o.health_enabled = false;
  o.host_id = "stream-results";
  // Just over the threshold, and an odd count: the second half's chunks start unaligned.
  const std::size_t count = detail::kStreamResultMinBytes / sizeof(float) + 7;
  std::atomic<std::size_t> wrong{0};
  const std::string error = test::run_ranks(2, o, [&](Communicator& comm) {
    std::vector<float> in(count), out(count, -1.0f);
    for (int it = 0; it < 2; ++it) {
      test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), 2, in.data(), count, static_cast<std::size_t>(it));
      comm.allreduce(in.data(), out.data(), count, DataType::Float32, ReduceOp::Sum);
      wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, 2, out.data(), count, static_cast<std::size_t>(it));
    }
    wrong += test::wrong_after_allgather_broadcast(comm, count);
  });
  INFO(error);
  REQUIRE(error.empty());
  CHECK(wrong == 0);
}
