#pragma once
/// \file half.hpp
/// Storage types for float16 and bfloat16 and exact conversions to and from float,
/// usable on host and device. Conversions to the 16-bit types round to nearest even,
/// keep NaN a NaN and saturate to infinity like IEEE 754.

#include <cstdint>
#include <cstring>
#include <ringfence/config.hpp>

namespace ringfence {

/// IEEE 754 binary16 stored as its bit pattern. Trivially copyable, 2 bytes.
struct Half {
  std::uint16_t bits;  ///< raw binary16 bits
};

/// bfloat16 (upper half of a binary32) stored as its bit pattern. Trivially copyable, 2 bytes.
struct BFloat16 {
  std::uint16_t bits;  ///< raw bfloat16 bits
};

namespace detail {
RINGFENCE_HOST_DEVICE RINGFENCE_FORCEINLINE std::uint32_t float_bits(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
RINGFENCE_HOST_DEVICE RINGFENCE_FORCEINLINE float bits_float(std::uint32_t u) noexcept {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace detail

/// Exact widening of a binary16 value to float (every binary16 value is a float).
RINGFENCE_HOST_DEVICE RINGFENCE_FORCEINLINE float to_float(Half h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  const std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  std::uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1f)  // inf / nan: keep payload
    return detail::bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp != 0)  // normal
    return detail::bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0)
    return detail::bits_float(sign);
  // subnormal: value = mant * 2^-24, exact in float
  const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign ? -mag : mag;
}

/// Rounds a float to the nearest binary16 (ties to even); overflow gives infinity,
/// NaN stays NaN (quiet).
RINGFENCE_HOST_DEVICE RINGFENCE_FORCEINLINE Half to_half(float f) noexcept {
  const std::uint32_t u = detail::float_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u)  // inf or nan
    return Half{static_cast<std::uint16_t>(sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u))};
  if (abs >= 0x477ff000u)  // >= 65520 rounds to inf
    return Half{static_cast<std::uint16_t>(sign | 0x7c00u)};
  if (abs < 0x38800000u) {  // below smallest normal (2^-14): subnormal or zero
    // Scale so the subnormal step (2^-24) is one unit; float addition rounds to nearest even.
    const float mag = detail::bits_float(abs) + 0.5f;  // 0.5 = 2^-1: aligns 2^-24 at bit 0
    return Half{static_cast<std::uint16_t>(sign | (detail::float_bits(mag) - 0x3f000000u))};
  }
  // normal: rebias exponent, round mantissa from 23 to 10 bits, ties to even
  const std::uint32_t odd = (abs >> 13) & 1u;
  const std::uint32_t rounded = abs + 0xfffu + odd;
  return Half{static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13))};
}

/// Exact widening of a bfloat16 value to float.
RINGFENCE_HOST_DEVICE RINGFENCE_FORCEINLINE float to_float(BFloat16 b) noexcept {
  return detail::bits_float(static_cast<std::uint32_t>(b.bits) << 16);
}

/// Rounds a float to the nearest bfloat16 (ties to even); NaN stays NaN (quiet).
RINGFENCE_HOST_DEVICE RINGFENCE_FORCEINLINE BFloat16 to_bfloat16(float f) noexcept {
  const std::uint32_t u = detail::float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return BFloat16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return BFloat16{static_cast<std::uint16_t>(rounded >> 16)};
}

}  // namespace ringfence
