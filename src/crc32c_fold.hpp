#pragma once
// CRC32C by carry-less-multiply folding (AVX-512 + VPCLMULQDQ), as a stream over 256-byte
// pieces: crc32c.cpp runs it over a buffer, checked_ops.cpp interleaves it with the copy or
// reduction that reads the same bytes. Functions here carry their own target attribute; call
// them only where `available()` says so. Registers are raw (pre-inverted) CRC registers.
#include <cstddef>
#include <cstdint>

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics leave a don't-care operand undefined on purpose (extracts,
// casts); -Wmaybe-uninitialized (and, once inlined into a new caller, -Wuninitialized) reports
// that inside the header.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#define RINGFENCE_CRC_X86 1
#define RF_FOLD_TARGET __attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2")))
#endif

namespace ringfence::detail::crcfold {

#if defined(RINGFENCE_CRC_X86)

/// True when this CPU has what the folding needs (AVX-512F, VPCLMULQDQ, PCLMUL, SSE4.2).
bool available() noexcept;

// x^n mod P in the normal (not reflected) bit order, bit 31 = x^31.
constexpr std::uint32_t xpow_mod(unsigned n) {
  std::uint64_t r = 1;
  for (unsigned i = 0; i < n; ++i) {
    r <<= 1;
    if (r & (std::uint64_t{1} << 32)) r ^= (std::uint64_t{1} << 32) | 0x1EDC6F41u;
  }
  return static_cast<std::uint32_t>(r);
}
constexpr std::uint32_t reflect32(std::uint32_t v) {
  std::uint32_t r = 0;
  for (int i = 0; i < 32; ++i)
    if (v & (1u << i)) r |= 1u << (31 - i);
  return r;
}

// Folding (Intel, "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ", in the
// reflected domain). A 16-byte block V is the polynomial whose bit k (little-endian) is the
// coefficient of x^(127-k); moving it D bits further along the message multiplies it by x^D,
// and modulo P that is V.lo64 * (x^(64+D) mod P) + V.hi64 * (x^D mod P), a 96-bit value XORed
// into the block there. In the reflected domain a carry-less product comes out shifted by one
// bit, which the constants absorb (x^(63+D) and x^(D-1)); each sits in the upper half of its
// 64-bit lane. The folded message keeps its CRC, so the last block's CRC, by two `crc32`
// instructions, is the message's.
constexpr std::uint64_t fold_constant(unsigned exponent) { return std::uint64_t{reflect32(xpow_mod(exponent))} << 32; }
struct FoldPair {
  std::uint64_t lo, hi;  // multiplies V.lo64, V.hi64
};
constexpr FoldPair fold_by(unsigned bits) { return {fold_constant(63 + bits), fold_constant(bits - 1)}; }

constexpr FoldPair kFold128 = fold_by(128), kFold256 = fold_by(256), kFold384 = fold_by(384), kFold512 = fold_by(512),
                   kFold1024 = fold_by(1024), kFold1536 = fold_by(1536), kFold2048 = fold_by(2048);

RF_FOLD_TARGET inline __m128i fold128(__m128i v, FoldPair k, __m128i next) noexcept {
  const __m128i kk = _mm_set_epi64x(static_cast<long long>(k.hi), static_cast<long long>(k.lo));
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(v, kk, 0x00), _mm_clmulepi64_si128(v, kk, 0x11)), next);
}
RF_FOLD_TARGET inline __m512i fold512(__m512i v, FoldPair k, __m512i next) noexcept {
  const __m512i kk = _mm512_broadcast_i32x4(_mm_set_epi64x(static_cast<long long>(k.hi), static_cast<long long>(k.lo)));
  // a ^ b ^ c in one instruction (truth table 0x96).
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(v, kk, 0x00), _mm512_clmulepi64_epi128(v, kk, 0x11), next, 0x96);
}


/// Bytes one step folds: four 512-bit accumulators.
inline constexpr std::size_t kStreamBytes = 256;

struct Stream {
  __m512i x0, x1, x2, x3;
};

/// The 256 bytes one step folds, in registers: a pass that loads them for its own work (a copy,
/// a sum) folds the same registers, so the bytes are read once.
struct Block {
  __m512i v[4];
};

RF_FOLD_TARGET inline Block load(const unsigned char* p) noexcept {
  return Block{{_mm512_loadu_si512(p), _mm512_loadu_si512(p + 64), _mm512_loadu_si512(p + 128), _mm512_loadu_si512(p + 192)}};
}

RF_FOLD_TARGET inline void store(unsigned char* p, const Block& b) noexcept {
  for (int k = 0; k < 4; ++k) _mm512_storeu_si512(p + 64 * k, b.v[k]);
}

/// A stream over the first 256 bytes, continuing the raw register `raw` (it enters as the first
/// four message bytes XORed with it).
RF_FOLD_TARGET inline Stream start(const Block& b, std::uint32_t raw) noexcept {
  const __m512i r = _mm512_inserti32x4(_mm512_setzero_si512(), _mm_cvtsi32_si128(static_cast<int>(raw)), 0);
  return Stream{_mm512_xor_si512(b.v[0], r), b.v[1], b.v[2], b.v[3]};
}

/// The next 256 bytes.
RF_FOLD_TARGET inline void step(Stream& s, const Block& b) noexcept {
  s.x0 = fold512(s.x0, kFold2048, b.v[0]);
  s.x1 = fold512(s.x1, kFold2048, b.v[1]);
  s.x2 = fold512(s.x2, kFold2048, b.v[2]);
  s.x3 = fold512(s.x3, kFold2048, b.v[3]);
}

RF_FOLD_TARGET inline Stream start(const unsigned char* p, std::uint32_t raw) noexcept { return start(load(p), raw); }
RF_FOLD_TARGET inline void step(Stream& s, const unsigned char* p) noexcept { step(s, load(p)); }

/// The raw register after the stream and `bytes` (< 256 or more) final bytes at `p`.
RF_FOLD_TARGET inline std::uint32_t finish(const Stream& s, const unsigned char* p, std::size_t bytes) noexcept {
  // Four accumulators into the last one (each lane 64, 128, 192 bytes back), then its four
  // lanes into the last lane.
  __m512i x3 = fold512(s.x0, kFold1536, s.x3);
  x3 = fold512(s.x1, kFold1024, x3);
  x3 = fold512(s.x2, kFold512, x3);
  __m128i v = _mm512_extracti32x4_epi32(x3, 3);
  v = fold128(_mm512_extracti32x4_epi32(x3, 0), kFold384, v);
  v = fold128(_mm512_extracti32x4_epi32(x3, 1), kFold256, v);
  v = fold128(_mm512_extracti32x4_epi32(x3, 2), kFold128, v);
  for (; bytes >= 16; p += 16, bytes -= 16) v = fold128(v, kFold128, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  std::uint64_t r = _mm_crc32_u64(0, static_cast<std::uint64_t>(_mm_cvtsi128_si64(v)));
  r = _mm_crc32_u64(r, static_cast<std::uint64_t>(_mm_extract_epi64(v, 1)));
  auto c = static_cast<std::uint32_t>(r);
  while (bytes--) c = _mm_crc32_u8(c, *p++);
  return c;
}

#endif  // RINGFENCE_CRC_X86

}  // namespace ringfence::detail::crcfold
