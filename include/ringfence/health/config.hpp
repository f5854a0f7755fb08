#pragma once
/// \file health/config.hpp
/// Loads health-layer thresholds and timings from a small text file, so operators can tune the
/// policy without rebuilding (`RINGFENCE_HEALTH_CONFIG=path`). Format: one `key = value` per
/// line, `#` starts a comment; keys are the field names of `HealthThresholds`, `PolicyTimings`
/// and `HealthOptions` (`window_ms`, `sysfs_root`, `nvml_library`); durations take an `_ms`
/// suffix on the key (`fence_cooldown_ms = 5000`). Unknown keys and malformed values are errors
/// naming the file, the line and the key. Example:
///
///     # fence NVLinks earlier than DCGM does
///     nvlink_crc_fence_per_s = 20
///     checksum_storm_count   = 2
///     fence_cooldown_ms      = 120000

#include <ringfence/health/options.hpp>
#include <string>
#include <string_view>

namespace ringfence::health {

/// Applies the settings in `text` to `options`. `origin` names the source in error messages.
/// Throws `InvalidUsage` naming origin, line and key on any error; on error `options` may be
/// partly updated.
void apply_health_config(std::string_view text, HealthOptions& options, std::string_view origin = "<text>");

/// Reads `path` and applies it (see `apply_health_config`). Throws `SystemError` when the file
/// cannot be read.
void load_health_config(const std::string& path, HealthOptions& options);

}  // namespace ringfence::health
