#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <functional>
#include <ringfence/error.hpp>
#include <ringfence/health/config.hpp>
#include <sstream>

namespace ringfence::health {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

template <class T>
bool parse(std::string_view text, T& out) {
  const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && p == text.data() + text.size();
}

// One settable field: parses `value` into the options, or returns false.
using Setter = std::function<bool(HealthOptions&, std::string_view)>;

// The section of HealthOptions a field lives in.
HealthThresholds& section(HealthOptions& o, HealthThresholds*) { return o.thresholds; }
PolicyTimings& section(HealthOptions& o, PolicyTimings*) { return o.timings; }

template <class Section, class T>
Setter number(T Section::*field) {
  return [field](HealthOptions& o, std::string_view v) { return parse(v, section(o, static_cast<Section*>(nullptr)).*field); };
}

// Durations are given in milliseconds (key suffix `_ms`); `min_ms` bounds them from below.
bool parse_ms(std::string_view v, std::chrono::milliseconds& out, long long min_ms) {
  long long ms = 0;
  if (!parse(v, ms) || ms < min_ms) return false;
  out = std::chrono::milliseconds(ms);
  return true;
}
template <class Section>
Setter millis(std::chrono::milliseconds Section::*field) {
  return [field](HealthOptions& o, std::string_view v) {
    return parse_ms(v, section(o, static_cast<Section*>(nullptr)).*field, 0);
  };
}

const std::vector<std::pair<std::string_view, Setter>>& table() {
  static const std::vector<std::pair<std::string_view, Setter>> kTable = {
      {"nvlink_crc_fence_per_s", number(&HealthThresholds::nvlink_crc_fence_per_s)},
      {"nvlink_crc_suspect_count", number(&HealthThresholds::nvlink_crc_suspect_count)},
      {"nvlink_replay_recovery_fence_count", number(&HealthThresholds::nvlink_replay_recovery_fence_count)},
      {"ecc_uncorrected_fence_count", number(&HealthThresholds::ecc_uncorrected_fence_count)},
      {"xid_fatal_fence_count", number(&HealthThresholds::xid_fatal_fence_count)},
      {"xid_warn_suspect_count", number(&HealthThresholds::xid_warn_suspect_count)},
      {"pcie_replay_ber", number(&HealthThresholds::pcie_replay_ber)},
      {"pcie_default_lane_gts", number(&HealthThresholds::pcie_default_lane_gts)},
      {"pcie_default_width", number(&HealthThresholds::pcie_default_width)},
      {"pcie_aer_uncorrectable_fence_count", number(&HealthThresholds::pcie_aer_uncorrectable_fence_count)},
      {"pcie_aer_correctable_suspect_count", number(&HealthThresholds::pcie_aer_correctable_suspect_count)},
      {"ib_link_downed_fence_count", number(&HealthThresholds::ib_link_downed_fence_count)},
      {"ib_error_suspect_count", number(&HealthThresholds::ib_error_suspect_count)},
      {"checksum_suspect_count", number(&HealthThresholds::checksum_suspect_count)},
      {"checksum_storm_count", number(&HealthThresholds::checksum_storm_count)},
      {"checksum_storm_window_ms", millis(&HealthThresholds::checksum_storm_window)},
      {"timeout_fence_count", number(&HealthThresholds::timeout_fence_count)},
      {"bandwidth_min_ratio", number(&HealthThresholds::bandwidth_min_ratio)},
      {"bandwidth_slow_for_ms", millis(&HealthThresholds::bandwidth_slow_for)},
      {"suspect_clear_after_ms", millis(&PolicyTimings::suspect_clear_after)},
      {"suspect_escalate_after_ms", millis(&PolicyTimings::suspect_escalate_after)},
      {"fence_cooldown_ms", millis(&PolicyTimings::fence_cooldown)},
      {"cooldown_backoff", number(&PolicyTimings::cooldown_backoff)},
      {"max_fence_cooldown_ms", millis(&PolicyTimings::max_fence_cooldown)},
      {"probation_duration_ms", millis(&PolicyTimings::probation_duration)},
      {"window_ms", [](HealthOptions& o, std::string_view v) { return parse_ms(v, o.window, 1); }},
      {"sysfs_root", [](HealthOptions& o, std::string_view v) { return !v.empty() && (o.sysfs_root = std::string(v), true); }},
      {"nvml_library",
       [](HealthOptions& o, std::string_view v) { return !v.empty() && (o.nvml_library = std::string(v), true); }},
  };
  return kTable;
}

}  // namespace

void apply_health_config(std::string_view text, HealthOptions& options, std::string_view origin) {
  int line_no = 0;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++line_no;
    if (const auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    line = trim(line);
    if (line.empty()) continue;
    const auto eq = line.find('=');
    if (eq == std::string_view::npos)
      throw InvalidUsage(fmt::format("{}:{}: expected 'key = value', got '{}'", origin, line_no, line));
    const std::string_view key = trim(line.substr(0, eq)), value = trim(line.substr(eq + 1));
    bool known = false;
    for (const auto& [name, set] : table()) {
      if (name != key) continue;
      known = true;
      if (!set(options, value))
        throw InvalidUsage(fmt::format("{}:{}: invalid value '{}' for '{}'", origin, line_no, value, key));
    }
    if (!known) throw InvalidUsage(fmt::format("{}:{}: unknown key '{}'", origin, line_no, key));
  }
}

void load_health_config(const std::string& path, HealthOptions& options) {
  std::ifstream in(path);
  if (!in) throw SystemError(fmt::format("cannot read health config '{}': {}", path, std::strerror(errno)), errno);
  std::stringstream text;
  text << in.rdbuf();
  apply_health_config(text.str(), options, path);
}

}  // namespace ringfence::health
