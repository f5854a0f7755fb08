// A sender's own block stored into its output by the write that sends it (WriteAlso,
// staging_copy2_crc, copy_bytes2; RingRunner's CopyAlong): both destinations get the source's
// bytes and the CRC is the source's at every length and alignment, nothing is written outside
// either range; and out-of-place allgathers and broadcasts stay exact over shm (which stores the
// second destination in its copy) and tcp (which does not: the engine copies), with checksums
// and without, streaming or not, where the send goes straight into the peer's output (the
// engine copies), and where faults split or drop the writes.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <ringfence/communicator.hpp>
#include <ringfence/crc32c.hpp>
#include <ringfence/reduce_ops.hpp>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/thread_ranks.hpp"
#include "support/verifiable.hpp"

using namespace ringfence;

namespace {

bool all_fill(const std::vector<std::byte>& v, std::size_t from, std::size_t to) {
  return std::all_of(v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(to),
                     [](std::byte x) { return x == std::byte{0x5a}; });
}

// Out-of-place allgather and broadcast (every rank the root once) of `count` floats, `reps`
// times: the number of wrong elements.
std::size_t wrong_gathers_and_broadcasts(Communicator& comm, std::size_t count, int reps) {
  const int n = comm.size();
  std::size_t wrong = 0;
  for (int it = 0; it < reps; ++it) {
    const auto first = static_cast<std::size_t>(it) * 11;  // every call's data differs
    std::vector<float> in(count), gathered(static_cast<std::size_t>(n) * count, -1.0f), out(count, -1.0f);
    test::fill_pattern(DataType::Float32, comm.rank(), in.data(), count, first);
    comm.allgather(in.data(), gathered.data(), count, DataType::Float32);
    for (int r = 0; r < n; ++r)
      wrong += test::count_wrong_pattern(DataType::Float32, r, gathered.data() + static_cast<std::size_t>(r) * count, count, first);
    const int root = it % n;
    comm.broadcast(in.data(), out.data(), count, DataType::Float32, root);
    wrong += test::count_wrong_pattern(DataType::Float32, root, out.data(), count, first);
  }
  return wrong;
}

}  // namespace

TEST_CASE("a write to two destinations stores the source's bytes at both and returns its CRC", "[integrity][crc32c][copy_along]") {
  std::mt19937 rng(9);
  std::vector<std::byte> src(300 * 1024), slot(300 * 1024 + 128), local(300 * 1024 + 128);
  for (auto& x : src) x = static_cast<std::byte>(rng());
  const auto aligned = [](const std::vector<std::byte>& v) {
    return (reinterpret_cast<std::uintptr_t>(v.data()) + 63) / 64 * 64 - reinterpret_cast<std::uintptr_t>(v.data());
  };
  const std::size_t slot_base = aligned(slot), local_base = aligned(local);
  for (std::size_t offset : {0u, 16u, 3u}) {
    // Around the 256-byte fold step, the 8 KiB blocks, 16 KiB (copy first, then fold) and a slot.
    for (std::size_t len : {0u, 1u, 255u, 256u, 257u, 8192u, 8195u, 16384u, 16385u, 65536u, 65599u, 262144u, 262147u}) {
      for (int kind = 0; kind < 4; ++kind) {
        const bool stream = kind % 2 == 1, with_crc = kind >= 2;
        CAPTURE(offset, len, stream, with_crc);
        std::fill(slot.begin(), slot.end(), std::byte{0x5a});
        std::fill(local.begin(), local.end(), std::byte{0x5a});
        std::byte* to = slot.data() + slot_base + offset;
        std::byte* also = local.data() + local_base + 5;  // never aligned alike with `to`
        const std::byte* from = src.data() + 1;
        if (with_crc) REQUIRE(staging_copy2_crc(to, also, from, len, stream) == crc32c(from, len));
        else copy_bytes2(to, also, from, len, stream);
        REQUIRE(std::memcmp(to, from, len) == 0);
        REQUIRE(std::memcmp(also, from, len) == 0);
        REQUIRE(all_fill(slot, 0, slot_base + offset));
        REQUIRE(all_fill(slot, slot_base + offset + len, slot.size()));
        REQUIRE(all_fill(local, 0, local_base + 5));
        REQUIRE(all_fill(local, local_base + 5 + len, local.size()));
      }
    }
  }
}

TEST_CASE("out-of-place allgathers and broadcasts are exact when the send stores the own block too",
          "[engine][collectives][copy_along]") {
  const std::string transport = GENERATE(std::string("shm"), std::string("tcp"));
  const bool checksum = GENERATE(true, false);
  const int n = GENERATE(2, 3);
  const bool stream = GENERATE(true, false);
  CAPTURE(transport, checksum, n, stream);
  CommOptions o;
  o.transports = {transport};
  o.checksum = checksum;
  o.stream_writes = stream ? StreamWritesMode::On : StreamWritesMode::Off;
  o.chunk_bytes = 64 * 1024;
  o.host_id = "copy-along";
  o.timeout = std::chrono::seconds(20);
  std::atomic<std::size_t> wrong{0};
  const std::string error = test::run_ranks(n, o, [&](Communicator& comm) {
    // One chunk under 16 KiB; several chunks, the last short and unaligned.
    for (const std::size_t count : {std::size_t{1000}, std::size_t{4099}, std::size_t{70001}})
      wrong += wrong_gathers_and_broadcasts(comm, count, 2);
  });
  INFO(error);
  REQUIRE(error.empty());
  CHECK(wrong == 0);
}

TEST_CASE("the own block reaches the output where faults split or drop its write", "[engine][collectives][copy_along][fault]") {
  // Flipped writes go out in pieces without the second destination, dropped ones not at all:
  // the engine copies the block itself, and the re-sent chunk does not copy it again.
  CommOptions o;
  o.checksum = true;
  o.chunk_bytes = 16 * 1024;
  o.host_id = "copy-along-faults";
  o.health_agree_every = 0;  // keep the damaged link in use: this tests the copies, not fencing
  o.timeout = std::chrono::seconds(30);
  o.fault = "flip:rate=2e-5,link=0-1,seed=3;drop:rate=0.05,link=0-1,seed=4";
  std::atomic<std::size_t> wrong{0};
  std::atomic<std::uint64_t> errors{0};
  const std::string error = test::run_ranks(2, o, [&](Communicator& comm) {
    wrong += wrong_gathers_and_broadcasts(comm, 50001, 6);
    for (const auto& l : comm.links())
      if (!l.device_lane) errors += l.checksum_errors;
  });
  INFO(error);
  REQUIRE(error.empty());
  CHECK(wrong == 0);
  CHECK(errors > 0);  // the faults reached the checked chunks
}

TEST_CASE("the own block reaches the output where the send goes straight into the peer's output",
          "[engine][collectives][copy_along][direct]") {
  // Without checksums, final values go into the right neighbour's output (alloc()ed: mapped;
  // plain memory: cross-memory attach) and the write has no second destination: the engine
  // copies the own block itself.
  const bool alloc = GENERATE(true, false);
  const int n = GENERATE(2, 3);
  CAPTURE(alloc, n);
  CommOptions o;
  o.checksum = false;
  o.chunk_bytes = 16 * 1024;
  o.direct_write_min_bytes = 1000;
  if (!alloc) o.direct_write_user_min_bytes = 0;
  o.host_id = "copy-along-direct";
  o.timeout = std::chrono::seconds(20);
  std::atomic<std::size_t> wrong{0};
  const std::string error = test::run_ranks(n, o, [&](Communicator& comm) {
    for (const std::size_t count : {std::size_t{4099}, std::size_t{50001}}) {
      const std::size_t gathered_count = static_cast<std::size_t>(n) * count;
      std::vector<float> in(count), plain_gathered(alloc ? 0 : gathered_count), plain_out(alloc ? 0 : count);
      float* gathered = alloc ? static_cast<float*>(comm.alloc(gathered_count * sizeof(float))) : plain_gathered.data();
      float* out = alloc ? static_cast<float*>(comm.alloc(count * sizeof(float))) : plain_out.data();
      for (int it = 0; it < n; ++it) {
        const auto first = static_cast<std::size_t>(it) * 7;
        test::fill_pattern(DataType::Float32, comm.rank(), in.data(), count, first);
        std::fill(gathered, gathered + gathered_count, -1.0f);
        comm.allgather(in.data(), gathered, count, DataType::Float32);
        for (int r = 0; r < n; ++r)
          wrong += test::count_wrong_pattern(DataType::Float32, r, gathered + static_cast<std::size_t>(r) * count, count, first);
        std::fill(out, out + count, -1.0f);
        comm.broadcast(in.data(), out, count, DataType::Float32, it);
        wrong += test::count_wrong_pattern(DataType::Float32, it, out, count, first);
      }
      if (alloc) {
        comm.free(gathered);
        comm.free(out);
      }
    }
  });
  INFO(error);
  REQUIRE(error.empty());
  CHECK(wrong == 0);
}
