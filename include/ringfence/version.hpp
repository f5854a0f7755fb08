#pragma once
/// \file version.hpp
/// Library version (semantic versioning).

/// Major version.
#define RINGFENCE_VERSION_MAJOR 0
/// Minor version.
#define RINGFENCE_VERSION_MINOR 1
/// Patch version.
#define RINGFENCE_VERSION_PATCH 0

namespace ringfence {
/// "MAJOR.MINOR.PATCH".
inline constexpr const char* kVersionString = "0.1.0";
}  // namespace ringfence
