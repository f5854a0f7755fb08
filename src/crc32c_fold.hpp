#pragma once
// CRC32C by carry-less-multiply folding (AVX-512 + VPCLMULQDQ), as a stream over 256-byte
// pieces: crc32c.cpp runs it over a buffer, checked_ops.cpp interleaves it with the copy or
// reduction that reads the same bytes. Functions here carry their own target attribute; call
// them only where `available()` says so. Registers are raw (pre-inverted) CRC registers.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

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
/// True where the hybrid below pays: AMD CPUs, where it was measured. On Intel parts the
/// folding ran at about 32 bytes a cycle (76 GB/s), where twelve `crc32` a step would be the
/// slower half (not measured there). Decided once.
bool hybrid_pays() noexcept;

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

// The hybrid. Where the folding is bound by its carry-less multiplies (on the AMD EPYC VMs,
// about 18 bytes a cycle whatever the number of accumulators), the scalar `crc32` unit is idle:
// each step of a hybrid pass folds 256 bytes and feeds 32 bytes to each of three `crc32`
// streams that run over three regions after the folded one:
//   [ folded: 256 x steps | lane 0: 32 x steps | lane 1 | lane 2 ]
// and the four registers are joined at the end by shifting each past the bytes after it (one
// carry-less multiply by x^(8n-33) mod P and one `crc32` each). 352 bytes a step instead of 256:
// a 32 KiB CRC 1.3x faster, 4 KiB 1.17x, 2 KiB slower (the finish and the shifts), hence
// kHybridMinBytes (docs/protection-cost.md, "A fast CRC32C").
inline constexpr std::size_t kHybridLaneBytes = 32;  ///< per scalar stream and step: four `crc32`
inline constexpr std::size_t kHybridStepBytes = kStreamBytes + 3 * kHybridLaneBytes;
/// The shortest pass that takes the hybrid.
inline constexpr std::size_t kHybridMinBytes = 4096;
/// The longest pass that takes it: its four regions read at once ran 10-20 % slower than the
/// folding alone from memory (a 256 MiB buffer CRCed in 16 KiB-1 MiB pieces: 18-20 against
/// 22-23 GB/s; prefetching the lanes did not help), 1.3x faster from the cache; passes up to
/// here are mostly in the cache.
inline constexpr std::size_t kHybridMaxBytes = 64 * 1024;
/// Steps one hybrid block takes at most: a pass up to kHybridMaxBytes is one block.
inline constexpr std::size_t kHybridMaxSteps = kHybridMaxBytes / kHybridStepBytes + 1;

// Polynomials mod P in the reflected domain (bit 31 = x^0), for the shift constants.
constexpr std::uint32_t mulmod(std::uint32_t a, std::uint32_t b) {
  std::uint32_t r = 0;
  for (int i = 0; i < 32; ++i) {
    if (a & (0x80000000u >> i)) r ^= b;
    b = (b & 1) ? (b >> 1) ^ 0x82F63B78u : b >> 1;  // b * x
  }
  return r;
}
constexpr std::uint32_t xpow(std::uint64_t n) {
  std::uint32_t r = 0x80000000u, square = 0x40000000u;  // x^0, x^1
  for (; n != 0; n >>= 1) {
    if (n & 1) r = mulmod(r, square);
    square = mulmod(square, square);
  }
  return r;
}
/// The constants that shift a lane's register past one, two and three lanes of `steps` steps.
struct HybridShift {
  std::uint32_t past1, past2, past3;
};
struct HybridShifts {
  HybridShift by_steps[kHybridMaxSteps + 1];
};
constexpr HybridShifts make_hybrid_shifts() {
  HybridShifts t{};
  constexpr std::uint64_t lane_bits = 8 * kHybridLaneBytes;
  const std::uint32_t step1 = xpow(lane_bits), step2 = xpow(2 * lane_bits), step3 = xpow(3 * lane_bits);
  HybridShift k{xpow(lane_bits - 33), xpow(2 * lane_bits - 33), xpow(3 * lane_bits - 33)};
  for (std::size_t steps = 1; steps <= kHybridMaxSteps; ++steps) {
    t.by_steps[steps] = k;
    k = HybridShift{mulmod(k.past1, step1), mulmod(k.past2, step2), mulmod(k.past3, step3)};
  }
  return t;
}
inline constexpr HybridShifts kHybridShifts = make_hybrid_shifts();

/// The raw register `c` moved past the bytes `k` stands for (k = x^(8n-33) mod P: n bytes).
RF_FOLD_TARGET inline std::uint32_t shift_by(std::uint32_t c, std::uint32_t k) noexcept {
  const __m128i product = _mm_clmulepi64_si128(_mm_cvtsi32_si128(static_cast<int>(c)), _mm_cvtsi32_si128(static_cast<int>(k)), 0);
  return static_cast<std::uint32_t>(_mm_crc32_u64(0, static_cast<std::uint64_t>(_mm_cvtsi128_si64(product))));
}

/// One hybrid block of `steps` (2 to kHybridMaxSteps) steps over the bytes at `p` (what the
/// CRC covers), continuing the raw register `raw`. `vec(at)` does the pass's work on the 256
/// bytes at offset `at` of the folded region and returns the registers it loaded from `p + at`;
/// `lane(at)` does it on the 32 bytes at offset `at` of a lane (the CRC reads them from `p`).
template <class Vec, class Lane>
RF_FOLD_TARGET inline std::uint32_t hybrid_block(std::uint32_t raw, const unsigned char* p, std::size_t steps, Vec vec, Lane lane) noexcept {
  const std::size_t folded = kStreamBytes * steps, lane_bytes = kHybridLaneBytes * steps;
  const std::size_t at0 = folded, at1 = folded + lane_bytes, at2 = folded + 2 * lane_bytes;
  std::uint64_t c0 = 0, c1 = 0, c2 = 0;
  const auto lanes = [&](std::size_t o) RF_FOLD_TARGET {
    lane(at0 + o);
    lane(at1 + o);
    lane(at2 + o);
    for (std::size_t q = 0; q < kHybridLaneBytes; q += 8) {
      std::uint64_t v0, v1, v2;
      std::memcpy(&v0, p + at0 + o + q, 8);
      std::memcpy(&v1, p + at1 + o + q, 8);
      std::memcpy(&v2, p + at2 + o + q, 8);
      c0 = _mm_crc32_u64(c0, v0);
      c1 = _mm_crc32_u64(c1, v1);
      c2 = _mm_crc32_u64(c2, v2);
    }
  };
  Stream s = start(vec(0), raw);
  lanes(0);
  for (std::size_t i = 1; i < steps; ++i) {
    step(s, vec(kStreamBytes * i));
    lanes(kHybridLaneBytes * i);
  }
  const std::uint32_t folded_raw = finish(s, p + folded, 0);
  const HybridShift& k = kHybridShifts.by_steps[steps];
  return shift_by(folded_raw, k.past3) ^ shift_by(static_cast<std::uint32_t>(c0), k.past2) ^
         shift_by(static_cast<std::uint32_t>(c1), k.past1) ^ static_cast<std::uint32_t>(c2);
}

/// Hybrid blocks over the longest prefix of [0, bytes) they cover (nothing under
/// kHybridMinBytes), continuing `raw` in place; `vec` and `lane` as for hybrid_block, with
/// offsets from `p`. Returns the bytes covered: the caller does the rest (under one step, or
/// under kHybridMinBytes after full blocks) its own way, from `raw`.
template <class Vec, class Lane>
RF_FOLD_TARGET inline std::size_t hybrid(std::uint32_t& raw, const unsigned char* p, std::size_t bytes, Vec vec, Lane lane) noexcept {
  std::size_t at = 0;
  while (bytes - at >= kHybridMinBytes) {
    const std::size_t steps = std::min((bytes - at) / kHybridStepBytes, kHybridMaxSteps);
    const std::size_t base = at;
    raw = hybrid_block(raw, p + at, steps, [&](std::size_t o) RF_FOLD_TARGET { return vec(base + o); },
                       [&](std::size_t o) RF_FOLD_TARGET { lane(base + o); });
    at += steps * kHybridStepBytes;
  }
  return at;
}

#endif  // RINGFENCE_CRC_X86

}  // namespace ringfence::detail::crcfold
