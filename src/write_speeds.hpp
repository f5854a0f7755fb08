#pragma once
// Per-connection evidence of how fast a link's writes go (docs/health.md "Slow links"): a
// histogram of the speed of every timed write in quarter-octave buckets. The health agreement
// takes the fast end of it since the last agreement (the speed 90 % of the writes did not
// exceed): writes that waited for the CPU (a preempted rank, a busy host) or for memory (a
// source not in the cache) do not make a link look slow, since the same link's other writes
// were fast; a link whose every write is slow (a throttled, downtrained or congested link)
// does. Plain data, written by the connection's thread only; nothing allocates.
#include <cstddef>
#include <cstdint>

#include "quarter_octaves.hpp"

namespace ringfence::detail {

struct WriteSpeeds {
  /// Buckets: 4 per octave of KiB/ms (about MB/s) from 1 up to 2^24 (16 TB/s).
  static constexpr int kBuckets = 96;
  std::uint32_t count[kBuckets] = {};
  std::uint32_t writes = 0;

  /// Bucket of a write of `bytes` that took `ns`.
  static int bucket_of(std::uint64_t bytes, std::uint64_t ns) noexcept {
    const std::uint64_t v = ns == 0 ? ~std::uint64_t{0} >> 1 : bytes * 1000000 / 1024 / ns + 1;  // KiB per ms, >= 1
    const int i = quarter_octaves(v);
    return i < kBuckets ? i : kBuckets - 1;
  }
  /// The speed a bucket stands for, in GB/s (its lower edge; buckets are ~19 % wide).
  static double gbps_of(int bucket) noexcept {
    const double base = static_cast<double>(std::uint64_t{1} << (bucket / 4));
    return base * (1.0 + 0.25 * (bucket % 4)) * 1024.0 / 1e6;
  }

  void add(std::uint64_t bytes, std::uint64_t ns) noexcept {
    ++count[bucket_of(bytes, ns)];
    ++writes;
  }
  /// The bucket of the write at the 90th percentile of speed (9 in 10 writes were no faster),
  /// or -1 with fewer than `min_writes` writes.
  int fast_end(std::uint32_t min_writes) const noexcept {
    if (writes < min_writes || writes == 0) return -1;
    const std::uint64_t want = (std::uint64_t{writes} * 9 + 9) / 10;  // ceil(0.9 writes)
    std::uint64_t seen = 0;
    for (int i = 0; i < kBuckets; ++i)
      if ((seen += count[i]) >= want) return i;
    return kBuckets - 1;
  }
  void clear() noexcept { *this = WriteSpeeds{}; }
};

}  // namespace ringfence::detail
