#pragma once
/// \file transport_settings.hpp
/// A transport's own settings (gloo's `attr`, mscclpp's `EndpointConfig`): each transport
/// declares the variables it reads (`RINGFENCE_<NAME>_<KEY>`, listed in its README and by its
/// `setting_keys()`) and parses them itself when it is created, so adding a transport touches no
/// core file. The values travel as text in `CommOptions::transport_settings`, keyed by variable
/// name: `CommOptions::from_env` (the one environment reader) copies every `RINGFENCE_*` variable
/// that is not a core option there, and code may set them the same way.

#include <cstddef>
#include <optional>
#include <ringfence/options.hpp>
#include <string>
#include <string_view>

namespace ringfence {

/// A variable a transport reads, and what it sets (for `unknown_variables` and error messages).
struct SettingKey {
  std::string_view variable;  ///< e.g. "RINGFENCE_SHM_SPIN"
  std::string_view meaning;   ///< one line
};

/// Typed reads of a transport's settings. Every parse error throws `InvalidUsage` naming the
/// variable and the value. Cheap to construct; reads nothing until asked.
class SettingsReader {
 public:
  /// Reads `options->transport_settings`; null = every setting at its default.
  explicit SettingsReader(const CommOptions* options) noexcept : options_(options) {}
  /// The text of `variable`, if set.
  std::optional<std::string> text(std::string_view variable) const;
  /// An integer in [min, max], or `fallback` when unset.
  long long integer(std::string_view variable, long long fallback, long long min, long long max) const;
  /// A positive byte count with an optional K/M/G suffix, or `fallback` when unset.
  std::size_t bytes(std::string_view variable, std::size_t fallback) const;
  /// 0/1 (also on/off, true/false), or `fallback` when unset.
  bool boolean(std::string_view variable, bool fallback) const;

 private:
  const CommOptions* options_;
};

}  // namespace ringfence
