#pragma once
// `-J file`: the perf programs' results as one JSON document (bench/README.md, "JSON output").
#include <cstdint>
#include <string>
#include <vector>

#include "perf_common.hpp"

namespace ringfence::bench {

/// One measurement (out-of-place or in-place) of one row; `ran` false where the call has no
/// in-place form (the table's N/A).
struct Measured {
  bool ran = false;
  double time_us = 0, algbw = 0, busbw = 0;
  std::int64_t wrong = -1;  ///< -1: not checked (-c 0)
};

/// One row of the table.
struct ResultRow {
  int cycle = 0;
  std::size_t bytes = 0, count = 0;
  std::string type, redop;
  int root = -1;
  Measured out_of_place, in_place;
};

/// Writes the run as JSON to `path` (rank 0 only). Returns an error message, or "" when written.
std::string write_json(const std::string& path, Collective c, const PerfArgs& a, const Backend& b,
                       const std::vector<ResultRow>& rows, std::uint64_t wrong, double avg_busbw);

}  // namespace ringfence::bench
