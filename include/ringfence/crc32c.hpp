#pragma once
/// \file crc32c.hpp
/// CRC32C (Castagnoli, the iSCSI/ext4 polynomial 0x1EDC6F41, reflected), used to check every
/// chunk end to end when `CommOptions::checksum` is on. Hardware `crc32` instruction when the
/// build targets SSE4.2 (x86-64-v2 and later), a table otherwise; both give the same values.

#include <cstddef>
#include <cstdint>

namespace ringfence {

/// CRC32C of `bytes` bytes at `data`, continuing from `crc` (pass 0 to start). Thread-safe,
/// allocation-free. `crc32c("123456789", 9) == 0xE3069283`.
std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc = 0) noexcept;

/// The table implementation (always available; tests compare it with `crc32c`).
std::uint32_t crc32c_portable(const void* data, std::size_t bytes, std::uint32_t crc = 0) noexcept;

/// True when `crc32c` uses the CPU instruction in this build.
bool crc32c_is_hardware() noexcept;

}  // namespace ringfence
