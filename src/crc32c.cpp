// CRC32C, chosen once at run time by CPUID (docs/protection-cost.md, "A fast CRC32C"):
//  - AVX-512 + VPCLMULQDQ: carry-less-multiply folding of 256 bytes per step (four 512-bit
//    accumulators), finished with two `crc32` instructions; tens of bytes per cycle, so a
//    chunk's CRC costs a small fraction of the copy or reduction that touches it.
//  - SSE4.2: the `crc32` instruction over three independent streams (one instruction per
//    cycle instead of one per three, its latency), merged by table-driven shifts.
//  - a table, everywhere else.
// The vector paths are compiled with target attributes, not the build's -march, so a portable
// build still uses them where the CPU has them.
#include <array>
#include <cstring>
#include <ringfence/crc32c.hpp>

#include "crc32c_fold.hpp"


namespace ringfence {
namespace {

constexpr std::uint32_t kPoly = 0x82F63B78u;  // reflected 0x1EDC6F41

constexpr std::array<std::uint32_t, 256> make_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr auto kTable = make_table();

std::uint32_t crc_table(std::uint32_t c, const unsigned char* p, std::size_t bytes) noexcept {
  while (bytes--) c = kTable[(c ^ *p++) & 0xffu] ^ (c >> 8);
  return c;
}

// Moving a raw CRC register past `len` zero bytes is linear over GF(2): as four tables of 256
// entries (one per byte of the register) it costs four lookups. Built at first use from the
// operator's 32 columns.
struct ZeroShift {
  std::uint32_t t[4][256];
  explicit ZeroShift(std::size_t len) noexcept {
    std::uint32_t column[32];
    for (int i = 0; i < 32; ++i) {
      std::uint32_t c = 1u << i;
      for (std::size_t n = 0; n < len; ++n) c = kTable[c & 0xffu] ^ (c >> 8);
      column[i] = c;
    }
    for (int k = 0; k < 4; ++k)
      for (std::uint32_t b = 0; b < 256; ++b) {
        std::uint32_t v = 0;
        for (int i = 0; i < 8; ++i)
          if (b & (1u << i)) v ^= column[8 * k + i];
        t[k][b] = v;
      }
  }
  std::uint32_t operator()(std::uint32_t c) const noexcept {
    return t[0][c & 0xffu] ^ t[1][(c >> 8) & 0xffu] ^ t[2][(c >> 16) & 0xffu] ^ t[3][c >> 24];
  }
};

#if defined(RINGFENCE_CRC_X86)

constexpr std::size_t kStreamBlock = 1024;  // bytes per stream and round (3 KiB a round)

// Under one 3-way round: one stream, four instructions per turn of the loop (a small call's
// chunks and trailers are CRCed on every call; its loop overhead was half its instructions).
__attribute__((target("sse4.2"))) std::uint32_t crc_sse42_short(std::uint32_t c, const unsigned char* p, std::size_t bytes) noexcept {
  std::uint64_t c64 = c;
  for (; bytes >= 32; p += 32, bytes -= 32) {
    std::uint64_t v[4];
    std::memcpy(v, p, 32);
    c64 = _mm_crc32_u64(c64, v[0]);
    c64 = _mm_crc32_u64(c64, v[1]);
    c64 = _mm_crc32_u64(c64, v[2]);
    c64 = _mm_crc32_u64(c64, v[3]);
  }
  for (; bytes >= 8; p += 8, bytes -= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
  }
  c = static_cast<std::uint32_t>(c64);
  while (bytes--) c = _mm_crc32_u8(c, *p++);
  return c;
}

// From kThreeStreamMinBytes to one folding stream (256 bytes), where the folding's setup costs
// more than it saves: the `crc32` instruction over three consecutive stretches at once (it
// issues every cycle, its result takes three), joined by moving the first two registers past
// the bytes after them with a carry-less multiply each. With one chain, a CRC of 128-192 bytes
// at each end of a 2-rank allreduce's carried post left those calls at 0.59-0.71 us against
// Open MPI's 0.58-0.66 in the VM's slow phase; with three, 0.52-0.59 (docs/carried-allreduce.md,
// "Short copies").
constexpr std::size_t kThreeStreamMinBytes = 96;

// kByteShift[k] = x^(8k-33) mod P, reflected: crc32(0, clmul(c, kByteShift[k])) is the raw
// register c moved past k zero bytes (the product of two reflected values comes out one bit
// short, and `crc32` of a 64-bit value multiplies it by x^32; protection-cost-amd.md, "The hybrid
// again"). Defined from k = 5; the three streams move registers 32-175 bytes.
constexpr std::size_t kMaxByteShift = 256;
constexpr std::array<std::uint32_t, kMaxByteShift> make_byte_shifts() {
  std::array<std::uint32_t, kMaxByteShift> t{};
  for (unsigned k = 5; k < kMaxByteShift; ++k) t[k] = detail::crcfold::reflect32(detail::crcfold::xpow_mod(8 * k - 33));
  return t;
}
constexpr auto kByteShift = make_byte_shifts();

__attribute__((target("sse4.2,pclmul"))) inline std::uint32_t shift_past(std::uint32_t c, std::size_t bytes) noexcept {
  const __m128i product = _mm_clmulepi64_si128(_mm_cvtsi32_si128(static_cast<int>(c)), _mm_cvtsi32_si128(static_cast<int>(kByteShift[bytes])), 0x00);
  return static_cast<std::uint32_t>(_mm_crc32_u64(0, static_cast<std::uint64_t>(_mm_cvtsi128_si64(product))));
}

// kThreeStreamMinBytes <= bytes < kMaxByteShift: stretches of q/3, q/3 and the rest of the q
// eight-byte words, the last one taking the bytes after the words.
__attribute__((target("sse4.2,pclmul"))) std::uint32_t crc_three_short(std::uint32_t c, const unsigned char* p, std::size_t bytes) noexcept {
  const std::size_t words = bytes / 8, third = words / 3;
  const unsigned char* const p1 = p + 8 * third;
  const unsigned char* const p2 = p + 16 * third;
  std::uint64_t c0 = c, c1 = 0, c2 = 0;
  for (std::size_t i = 0; i < 8 * third; i += 8) {
    std::uint64_t v0, v1, v2;
    std::memcpy(&v0, p + i, 8);
    std::memcpy(&v1, p1 + i, 8);
    std::memcpy(&v2, p2 + i, 8);
    c0 = _mm_crc32_u64(c0, v0);
    c1 = _mm_crc32_u64(c1, v1);
    c2 = _mm_crc32_u64(c2, v2);
  }
  const std::size_t last = bytes - 16 * third;  // the third stretch, from p2
  const auto tail = static_cast<std::uint32_t>(crc_sse42_short(static_cast<std::uint32_t>(c2), p2 + 8 * third, last - 8 * third));
  return shift_past(static_cast<std::uint32_t>(c0), 8 * third + last) ^ shift_past(static_cast<std::uint32_t>(c1), last) ^ tail;
}

// Under one folding stream: one chain, or three from kThreeStreamMinBytes.
__attribute__((target("sse4.2,pclmul"))) std::uint32_t crc_short(std::uint32_t c, const unsigned char* p, std::size_t bytes) noexcept {
  return bytes >= kThreeStreamMinBytes ? crc_three_short(c, p, bytes) : crc_sse42_short(c, p, bytes);
}

__attribute__((target("sse4.2"))) std::uint32_t crc_sse42(std::uint32_t c, const unsigned char* p, std::size_t bytes) noexcept {
  // Three independent streams over consecutive blocks hide the instruction's 3-cycle latency,
  // then the partial registers are merged by shifting them past the blocks that follow.
  static const ZeroShift shift_one(kStreamBlock), shift_two(2 * kStreamBlock);
  while (bytes >= 3 * kStreamBlock) {
    std::uint64_t c0 = c, c1 = 0, c2 = 0;
    for (std::size_t i = 0; i < kStreamBlock; i += 8) {
      std::uint64_t v0, v1, v2;
      std::memcpy(&v0, p + i, 8);
      std::memcpy(&v1, p + kStreamBlock + i, 8);
      std::memcpy(&v2, p + 2 * kStreamBlock + i, 8);
      c0 = _mm_crc32_u64(c0, v0);
      c1 = _mm_crc32_u64(c1, v1);
      c2 = _mm_crc32_u64(c2, v2);
    }
    c = shift_two(static_cast<std::uint32_t>(c0)) ^ shift_one(static_cast<std::uint32_t>(c1)) ^ static_cast<std::uint32_t>(c2);
    p += 3 * kStreamBlock;
    bytes -= 3 * kStreamBlock;
  }
  return crc_sse42_short(c, p, bytes);
}

RF_FOLD_TARGET std::uint32_t crc_fold(std::uint32_t c, const unsigned char* p, std::size_t bytes) noexcept {
  if (bytes < detail::crcfold::kStreamBytes) return crc_short(c, p, bytes);
  detail::crcfold::Stream s = detail::crcfold::start(p, c);
  for (p += detail::crcfold::kStreamBytes, bytes -= detail::crcfold::kStreamBytes; bytes >= detail::crcfold::kStreamBytes;
       p += detail::crcfold::kStreamBytes, bytes -= detail::crcfold::kStreamBytes)
    detail::crcfold::step(s, p);
  return detail::crcfold::finish(s, p, bytes);
}

}  // namespace

namespace detail::crcfold {
bool available() noexcept {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("pclmul") &&
         __builtin_cpu_supports("sse4.2");
}
}  // namespace detail::crcfold

namespace {
bool has_fold() noexcept { return detail::crcfold::available(); }

#endif  // RINGFENCE_CRC_X86

using CrcFn = std::uint32_t (*)(std::uint32_t, const unsigned char*, std::size_t) noexcept;

struct Implementation {
  CrcFn fn;
  const char* name;
  CrcFn small;  // under one folding stream (kStreamBytes), where `fn` would only hand over to it
};

Implementation pick() noexcept {
#if defined(RINGFENCE_CRC_X86)
  __builtin_cpu_init();
  if (has_fold()) return {&crc_fold, "avx512-vpclmulqdq", &crc_short};
  if (__builtin_cpu_supports("sse4.2")) return {&crc_sse42, "sse4.2-3way", &crc_sse42_short};
#endif
  return {&crc_table, "table", &crc_table};
}

// Chosen once (thread-safe static initialisation), never changed.
const Implementation& chosen() noexcept {
  static const Implementation impl = pick();
  return impl;
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc) noexcept {
  const Implementation& impl = chosen();
  return ~(bytes < detail::crcfold::kStreamBytes ? impl.small : impl.fn)(~crc, static_cast<const unsigned char*>(data), bytes);
}

std::uint32_t crc32c_portable(const void* data, std::size_t bytes, std::uint32_t crc) noexcept {
  return ~crc_table(~crc, static_cast<const unsigned char*>(data), bytes);
}

std::uint32_t crc32c_with(Crc32cImpl impl, const void* data, std::size_t bytes, std::uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(RINGFENCE_CRC_X86)
  __builtin_cpu_init();
  if (impl == Crc32cImpl::Fold && has_fold()) return ~crc_fold(~crc, p, bytes);
  if (impl != Crc32cImpl::Table && __builtin_cpu_supports("sse4.2")) return ~crc_sse42(~crc, p, bytes);
#else
  (void)impl;
#endif
  return ~crc_table(~crc, p, bytes);
}

bool crc32c_is_hardware() noexcept { return chosen().fn != &crc_table; }

const char* crc32c_implementation() noexcept { return chosen().name; }

}  // namespace ringfence
