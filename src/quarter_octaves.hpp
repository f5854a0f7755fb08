#pragma once
// A logarithmic scale in integers: about 4 log2(v). Write speeds (write_speeds.hpp) and the
// agreements' pace (health/agreement.hpp) use it where every rank must map the same figures to
// the same step, which floating-point logarithms do not promise across machines.
#include <bit>
#include <cstdint>

namespace ringfence::detail {

/// Four times the octave of `v` (the position of its top bit) plus the two bits below the top
/// one, which place `v` within its octave in quarters of its span (1.25, 1.5, 1.75 standing in
/// for 2^(1/4), 2^(1/2), 2^(3/4)). 0 for 0 and 1.
constexpr int quarter_octaves(std::uint64_t v) noexcept {
  const int b = std::bit_width(v);  // v in [2^(b-1), 2^b)
  if (b == 0) return 0;
  const int quarter = b >= 3 ? static_cast<int>((v >> (b - 3)) & 3) : 0;
  return 4 * (b - 1) + quarter;
}

}  // namespace ringfence::detail
