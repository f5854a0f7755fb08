#pragma once
// NCCL's environment variables, mapped onto ringfence options for the NCCL shim
// (docs/nccl-compat.md, "NCCL environment variables"). Read here and in env.cpp only.
#include <ringfence/env.hpp>
#include <ringfence/options.hpp>
#include <string>
#include <vector>

namespace ringfence {

/// What `apply_nccl_environment` did, one line per variable, for the shim to log once per
/// communicator (rank 0): `applied` (info) and `ignored` (warn), each "NCCL_X=v: what happened".
struct NcclEnvironmentReport {
  std::vector<std::string> applied;
  std::vector<std::string> ignored;
};

/// Applies the NCCL_* variables of `env` to `options` (already read from RINGFENCE_*), except
/// where a RINGFENCE_* variable set the same thing, which wins. `transports` are the names the
/// shim registers, in priority order (NCCL_SHM_DISABLE and friends remove theirs from the
/// allowed list). Throws `InvalidUsage` naming the variable for a malformed value of a variable
/// that is applied (e.g. NCCL_DEBUG=LOUD); unknown NCCL_* variables are reported as ignored.
NcclEnvironmentReport apply_nccl_environment(const Environment& env, CommOptions& options, const std::vector<std::string>& transports);

}  // namespace ringfence
