#pragma once
// Copies and reductions that also compute CRC32C checksums of what they read and write, in
// blocks small enough to stay in the L1 cache between the two (docs/health.md, "What checksums
// cost"): the data comes from memory once, and the CRC reads it from the cache. The engine uses
// them when checksums are on: a receiver verifies a chunk with the pass that consumes it, and
// a sender gets the CRC of a chunk it computed (a partial sum, a final value) for free.
#include <cstddef>
#include <cstdint>
#include <ringfence/reduce_ops.hpp>

namespace ringfence::detail {

/// Bytes per block: three operands of this size stay in a 32 KiB L1 data cache.
inline constexpr std::size_t kCheckedBlockBytes = 8 * 1024;

// Copies with their CRC: `copy_bytes_crc` and `staging_copy_crc` (reduce_ops.hpp), the second
// for transports' writes into a peer's slot.

/// Where the bytes a checked pass verifies come from, which decides whether the pass prefetches
/// them (checked_ops.cpp, `prefetch_ahead`). `Memory`: a staging slot the other core filled with
/// streaming stores (EngineConfig::streams), whose lines come from memory; the folding holds the
/// pass to about 16 bytes a cycle, too slow to keep enough of them in flight by itself. `Cache`:
/// anything else. On the AMD VM prefetching made 2-rank checked allreduces of 256 KiB about a
/// third faster and of 1 MiB 5-15 % where slots were streamed, and 1 MiB ones 8-13 % slower
/// where the other core's cache handed the lines over (docs/protection-cost-amd.md, "Prefetching
/// ahead of the folding").
enum class CheckedSource : std::uint8_t { Cache, Memory };

/// `copy_bytes_crc` (`stream`: `copy_bytes_crc_stream`) reading `src` as `from` says: the one
/// dispatch behind both, and what a receiver calls to copy a chunk out of its slot. Returns the
/// CRC32C of `src`.
std::uint32_t checked_copy(std::byte* dst, const std::byte* src, std::size_t bytes, bool stream, CheckedSource from) noexcept;

/// Copies `bytes` from `src` to `dst` and returns the CRC32C of what it wrote to `dst`, reading
/// `src` once: what a reader checks when `src` may be written while it copies (a peer's post in
/// our flag block: the carried allreduce). `dst` must not overlap `src`. Under 256 bytes, where
/// the CPU has AVX-512BW, with masked loads and stores that touch no byte outside either range.
std::uint32_t copy_crc_of_copy(std::byte* dst, const std::byte* src, std::size_t bytes) noexcept;

/// `dst = a + b` over `count` float32 elements with the CRC32C of `a` into `*crc_a`, the adds
/// and the folding in one loop over the same registers (the most common reduction in training:
/// there the folding hides behind the loads of a chunk another core just wrote); `tail`, the
/// float sum kernel, does the last bytes under 256, so results are bit-identical to it. Returns
/// false, having done nothing, where the CPU does not fold or the range is under 256 bytes or
/// over 256 KiB. `dst` must not overlap `a` or `b`. `combine_with_crc` calls it where it applies.
bool sum_f32_with_crc(CombineFn tail, std::byte* dst, const std::byte* a, const std::byte* b, std::size_t count,
                      std::uint32_t* crc_a, CheckedSource from = CheckedSource::Cache) noexcept;

/// `dst = a op b` over `count` elements with `r` (its finish when `last`, else its combine).
/// Stores the CRC32C of `a` (taken before the block is combined where `dst` is `a`) into
/// `*crc_a` and of the result into `*crc_dst`; either may be null. A float32 sum asked for
/// `*crc_a` alone runs `sum_f32_with_crc`, prefetching `a` per `from`.
void combine_with_crc(const Reducer& r, bool last, std::byte* dst, const std::byte* a, const std::byte* b, std::size_t count,
                      int divisor, std::uint32_t* crc_a, std::uint32_t* crc_dst,
                      CheckedSource from = CheckedSource::Cache) noexcept;

}  // namespace ringfence::detail
