#pragma once
/// \file crc32c.hpp
/// CRC32C (Castagnoli, the iSCSI/ext4 polynomial 0x1EDC6F41, reflected), used to check every
/// chunk end to end when `CommOptions::checksum` is on (the default). The implementation is
/// chosen once at run time from the CPU: carry-less-multiply folding (AVX-512 + VPCLMULQDQ),
/// the SSE4.2 `crc32` instruction over three streams, or a table; all give the same values.

#include <cstddef>
#include <cstdint>

namespace ringfence {

/// CRC32C of `bytes` bytes at `data`, continuing from `crc` (pass 0 to start). Thread-safe,
/// allocation-free. `crc32c("123456789", 9) == 0xE3069283`.
std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc = 0) noexcept;

/// The table implementation (always available; tests compare it with `crc32c`).
std::uint32_t crc32c_portable(const void* data, std::size_t bytes, std::uint32_t crc = 0) noexcept;

/// True when `crc32c` uses CPU instructions (folding or `crc32`), not the table.
bool crc32c_is_hardware() noexcept;

/// Name of the implementation `crc32c` uses on this CPU: "avx512-vpclmulqdq", "sse4.2-3way"
/// or "table" (benchmarks print it).
const char* crc32c_implementation() noexcept;

/// The implementations, for tests and benchmarks that compare them.
enum class Crc32cImpl { Table, Sse42, Fold };

/// CRC32C with `impl`, or the best one below it that this CPU has (Fold → Sse42 → Table).
std::uint32_t crc32c_with(Crc32cImpl impl, const void* data, std::size_t bytes, std::uint32_t crc = 0) noexcept;

}  // namespace ringfence
