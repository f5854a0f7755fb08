#pragma once
// Verifiable data of the perf programs (perf_pattern.cpp): every rank's input and the exact
// expected result of each collective, per type and op, as one period of `kPatternPeriod`
// elements that the driver repeats across a buffer.
#include <cstddef>
#include <ringfence/types.hpp>
#include <string>
#include <vector>

namespace ringfence::bench {

/// Elements per period of a pattern (a prime: no power-of-two shift maps it onto itself).
inline constexpr std::size_t kPatternPeriod = 4099;

/// One period of a rank's input and of the expected reduction over `n` ranks.
struct Pattern {
  std::vector<std::byte> input;
  std::vector<std::byte> expected;
  std::size_t elem = 0;
};

/// Rank `rank`'s input for `op` on `t`, and the expected result over `n` ranks.
Pattern make_pattern(DataType t, ReduceOp op, int rank, int n);

/// Element `i` of `buf` (of type `t`) as a number, for the first-mismatch diagnostic.
std::string element_string(const void* buf, std::size_t i, DataType t);

}  // namespace ringfence::bench
