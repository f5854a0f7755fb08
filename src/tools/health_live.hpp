#pragma once
// ringfence-health --live DIR: a running job's per-link table, from the Prometheus files its
// ranks refresh (RINGFENCE_HEALTH_PROMETHEUS=DIR/name-{rank}.prom,
// RINGFENCE_HEALTH_PROMETHEUS_INTERVAL_MS), like `nvidia-smi` / `dcgmi dmon`.
#include <string>

#include "health_verdict.hpp"

namespace ringfence::tools {

struct LiveOptions {
  std::string dir;        ///< every `*.prom` file in it is read
  double interval_s = 1;  ///< between readings
  int count = 0;          ///< tables to print, 0 = until interrupted
  bool json = false;      ///< one JSON object per reading instead of a table
};

/// Takes a first reading, then every `interval_s` prints the table (GB/s from the difference
/// to the previous reading: recent, not the job's average) and returns the last verdict.
Verdict run_live(const LiveOptions& o);

}  // namespace ringfence::tools
