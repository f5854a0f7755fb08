// The only translation unit that reads environment variables (style §6). Everything else
// parses an `Environment` snapshot, so tests drive it with fake environments.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <ringfence/env.hpp>
#include <ringfence/transport_settings.hpp>
#include <ringfence/error.hpp>
#include <ringfence/fault.hpp>
#include <ringfence/health/config.hpp>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <sstream>

#include "call_fingerprint.hpp"

extern char** environ;  // NOLINT: POSIX

namespace ringfence {

Environment Environment::from_process() {
  std::map<std::string, std::string> vars;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view entry(*e);
    const auto eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    vars.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return Environment(std::move(vars));
}

std::optional<std::string> Environment::get(std::string_view name) const {
  const auto it = vars_.find(name);
  if (it == vars_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> Environment::names_with_prefix(std::string_view prefix) const {
  std::vector<std::string> out;
  for (auto it = vars_.lower_bound(prefix); it != vars_.end() && it->first.starts_with(prefix); ++it)
    out.push_back(it->first);
  return out;
}

namespace {

[[noreturn]] void bad_value(std::string_view name, std::string_view value, std::string_view expected) {
  throw InvalidUsage(fmt::format("environment variable {}='{}' is invalid: expected {}", name, value, expected));
}

long long parse_integer(std::string_view name, std::string_view text, long long lo, long long hi) {
  long long v = 0;
  const auto* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end || v < lo || v > hi)
    bad_value(name, text, fmt::format("an integer in [{}, {}]", lo, hi));
  return v;
}

double parse_positive_double(std::string_view name, std::string_view text) {
  const std::string s(text);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !(v > 0) || v > 1e12)
    throw InvalidUsage(fmt::format("{}='{}': expected a positive number", name, text));
  return v;
}

bool parse_bool(std::string_view name, std::string_view text) {
  if (text == "1" || text == "true" || text == "on" || text == "yes") return true;
  if (text == "0" || text == "false" || text == "off" || text == "no") return false;
  bad_value(name, text, "1, on, true or yes; 0, off, false or no");
}

std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const auto comma = text.find(',', start);
    const auto item = text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (!item.empty()) out.emplace_back(item);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

// 64-bit FNV-1a; used only to derive non-secret tokens and ports from job identifiers.
std::uint64_t fnv1a(std::string_view text, std::uint64_t seed) {
  std::uint64_t h = seed;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}


// The core options (and launcher variables): every other RINGFENCE_* variable is a transport's
// setting (copied to CommOptions::transport_settings) or unknown.
constexpr std::string_view kKnown[] = {
    "RINGFENCE_RANK",         "RINGFENCE_WORLD_SIZE",   "RINGFENCE_LOCAL_RANK",
    "RINGFENCE_LOCAL_SIZE",   "RINGFENCE_STORE_ADDR",   "RINGFENCE_STORE_HOST",
    "RINGFENCE_JOB_TOKEN",    "RINGFENCE_TIMEOUT_MS",   "RINGFENCE_CHUNK_BYTES",
    "RINGFENCE_SLOTS",        "RINGFENCE_TRANSPORTS",   "RINGFENCE_LOG",
    "RINGFENCE_LOG_FILE",     "RINGFENCE_LOG_TIMESTAMP",
    "RINGFENCE_HOST_ID",
    "RINGFENCE_DIRECT_WRITE_MIN_BYTES", "RINGFENCE_DIRECT_WRITE_USER_MIN_BYTES", "RINGFENCE_P2P_DIRECT_USER_MIN_BYTES",
    "RINGFENCE_ALLTOALL_DIRECT_USER_MIN_BYTES", "RINGFENCE_CHANNELS", "RINGFENCE_CHANNEL_MIN_BYTES",
    "RINGFENCE_CHECKSUM",     "RINGFENCE_FAULT",        "RINGFENCE_HEALTH_AGREE_EVERY", "RINGFENCE_HEALTH_AGREE_MIN_US", "RINGFENCE_HEALTH",
    "RINGFENCE_HEALTH_AGREE_BYTES", "RINGFENCE_HEALTH_SLOW_FACTOR", "RINGFENCE_FALLBACK",
    "RINGFENCE_HEALTH_FENCE_CRC_ERRORS", "RINGFENCE_HEALTH_LOG", "RINGFENCE_DIGEST_EVERY", "RINGFENCE_DIGEST_ACTION",
    "RINGFENCE_SYSFS_ROOT",   "RINGFENCE_NVML_LIBRARY", "RINGFENCE_HEALTH_WINDOW_MS", "RINGFENCE_HEALTH_LINK_MAP", "RINGFENCE_HEALTH_GPU",
    "RINGFENCE_HEALTH_INTERVAL_MS", "RINGFENCE_HEALTH_PROMETHEUS_INTERVAL_MS", "RINGFENCE_HEALTH_LEDGER", "RINGFENCE_HEALTH_LEDGER_QUARANTINE_S", "RINGFENCE_HEALTH_CONFIG",
    "RINGFENCE_HEALTH_PROMETHEUS", "RINGFENCE_ALGO", "RINGFENCE_TUNER_ALPHA_US", "RINGFENCE_TUNER_GBPS",
    "RINGFENCE_CHECK_CALLS", "RINGFENCE_HEARTBEAT_MS", "RINGFENCE_CUDART", "RINGFENCE_DEVICE_STAGING_SLOTS",
    "RINGFENCE_DEVICE_REGIONS", "RINGFENCE_CUDA_KERNELS", "RINGFENCE_STREAM_WRITES", "RINGFENCE_SPIN",
    "RINGFENCE_CARRY_MAX_BYTES"};

// An auto / on / off variable into its mode (DeviceRegionsMode, StreamWritesMode, SpinMode).
template <class Mode>
Mode parse_auto_on_off(std::string_view name, std::string_view v) {
  if (v == "auto") return Mode::Auto;
  if (v == "on") return Mode::On;
  if (v == "off") return Mode::Off;
  throw InvalidUsage(fmt::format("{}='{}': expected auto, on or off", name, v));
}

bool is_core_variable(std::string_view name) noexcept {
  return std::find(std::begin(kKnown), std::end(kKnown), name) != std::end(kKnown);
}


}  // namespace

std::vector<std::string> unknown_variables(const Environment& env, const std::vector<std::string>& transport_variables) {
  std::vector<std::string> out;
  for (auto& name : env.names_with_prefix("RINGFENCE_"))
    if (!is_core_variable(name) && std::find(transport_variables.begin(), transport_variables.end(), name) == transport_variables.end())
      out.push_back(name);
  return out;
}

void warn_unknown_variables(const Logger& log, const Environment& env, const std::vector<std::string>& transport_variables,
                            std::string_view who) {
  for (const auto& name : unknown_variables(env, transport_variables)) log.warn("{}ignoring unknown environment variable {} (typo?)", who, name);
}

std::size_t parse_bytes(std::string_view text, std::string_view what) {
  std::string_view digits = text;
  std::size_t mult = 1;
  if (!digits.empty()) {
    switch (digits.back()) {
      case 'K': case 'k': mult = 1ull << 10; break;
      case 'M': case 'm': mult = 1ull << 20; break;
      case 'G': case 'g': mult = 1ull << 30; break;
      default: break;
    }
    if (mult != 1) digits.remove_suffix(1);
  }
  unsigned long long v = 0;
  const auto* end = digits.data() + digits.size();
  const auto [ptr, ec] = std::from_chars(digits.data(), end, v);
  if (digits.empty() || ec != std::errc() || ptr != end || v == 0 ||
      v > std::numeric_limits<std::size_t>::max() / mult)
    bad_value(what, text, "a positive byte count such as 65536, 64K, 1M or 1G");
  return static_cast<std::size_t>(v * mult);
}

CommOptions CommOptions::from_env(const Environment& env, CommOptions o) {
  // Every variable that is not a core option may be a transport's: the transports parse their
  // own (SettingsReader) when they are created.
  for (const std::string& name : env.names_with_prefix("RINGFENCE_"))
    if (!is_core_variable(name)) o.transport_settings[name] = *env.get(name);
  if (auto v = env.get("RINGFENCE_TIMEOUT_MS"))
    o.timeout = std::chrono::milliseconds(parse_integer("RINGFENCE_TIMEOUT_MS", *v, 1, 365ll * 24 * 3600 * 1000));
  if (auto v = env.get("RINGFENCE_CHUNK_BYTES")) o.chunk_bytes = parse_bytes(*v, "RINGFENCE_CHUNK_BYTES");
  if (auto v = env.get("RINGFENCE_CARRY_MAX_BYTES")) {
    o.carry_max_bytes = *v == "off" || *v == "0" ? 0 : parse_bytes(*v, "RINGFENCE_CARRY_MAX_BYTES");
    if (o.carry_max_bytes > detail::kCarryMaxBytes)
      throw InvalidUsage(
          fmt::format("RINGFENCE_CARRY_MAX_BYTES='{}': at most {} bytes travel in a call fingerprint (or off)", *v, detail::kCarryMaxBytes));
  }
  if (auto v = env.get("RINGFENCE_DIRECT_WRITE_MIN_BYTES"))
    o.direct_write_min_bytes = *v == "off" ? SIZE_MAX : parse_bytes(*v, "RINGFENCE_DIRECT_WRITE_MIN_BYTES");
  if (auto v = env.get("RINGFENCE_P2P_DIRECT_USER_MIN_BYTES"))
    o.p2p_direct_user_min_bytes = *v == "off" ? SIZE_MAX : parse_bytes(*v, "RINGFENCE_P2P_DIRECT_USER_MIN_BYTES");
  if (auto v = env.get("RINGFENCE_ALLTOALL_DIRECT_USER_MIN_BYTES"))
    o.alltoall_direct_user_min_bytes = *v == "off" ? SIZE_MAX : parse_bytes(*v, "RINGFENCE_ALLTOALL_DIRECT_USER_MIN_BYTES");
  if (auto v = env.get("RINGFENCE_DIRECT_WRITE_USER_MIN_BYTES"))
    o.direct_write_user_min_bytes = *v == "off" ? SIZE_MAX : parse_bytes(*v, "RINGFENCE_DIRECT_WRITE_USER_MIN_BYTES");
  if (auto v = env.get("RINGFENCE_CHANNELS"))
    o.channels = static_cast<int>(parse_integer("RINGFENCE_CHANNELS", *v, 0, 16));
  if (auto v = env.get("RINGFENCE_CHANNEL_MIN_BYTES")) o.channel_min_bytes = parse_bytes(*v, "RINGFENCE_CHANNEL_MIN_BYTES");
  if (auto v = env.get("RINGFENCE_STREAM_WRITES")) o.stream_writes = parse_auto_on_off<StreamWritesMode>("RINGFENCE_STREAM_WRITES", *v);
  if (auto v = env.get("RINGFENCE_SPIN")) o.spin = parse_auto_on_off<SpinMode>("RINGFENCE_SPIN", *v);
  if (auto v = env.get("RINGFENCE_SLOTS")) o.slots = static_cast<int>(parse_integer("RINGFENCE_SLOTS", *v, 1, 64));
  if (auto v = env.get("RINGFENCE_ALGO")) {
    if (*v == "auto") o.algorithm = Algorithm::Auto;
    else if (*v == "ring") o.algorithm = Algorithm::Ring;
    else if (*v == "tree") o.algorithm = Algorithm::Tree;
    else if (*v == "direct") o.algorithm = Algorithm::Direct;
    else if (*v == "oneshot") o.algorithm = Algorithm::OneShot;
    else throw InvalidUsage(fmt::format("RINGFENCE_ALGO='{}': expected auto, ring, tree, direct or oneshot", *v));
  }
  if (auto v = env.get("RINGFENCE_TUNER_ALPHA_US")) o.tuner_alpha_us = parse_positive_double("RINGFENCE_TUNER_ALPHA_US", *v);
  if (auto v = env.get("RINGFENCE_TUNER_GBPS")) o.tuner_gbps = parse_positive_double("RINGFENCE_TUNER_GBPS", *v);
  if (auto v = env.get("RINGFENCE_TRANSPORTS")) {
    o.transports = split_list(*v);
    if (o.transports.empty()) bad_value("RINGFENCE_TRANSPORTS", *v, "a comma-separated list such as shm,tcp");
  }
  if (auto v = env.get("RINGFENCE_LOG")) {
    const auto level = parse_log_level(*v);
    if (!level) bad_value("RINGFENCE_LOG", *v, "one of error, warn, info, debug, trace (any case)");
    o.log_level = *level;
  }
  if (auto v = env.get("RINGFENCE_LOG_FILE")) {
    if (v->empty()) bad_value("RINGFENCE_LOG_FILE", *v, "a file path (%h host, %p pid, %r rank)");
    o.log_file = *v;
  }
  if (auto v = env.get("RINGFENCE_LOG_TIMESTAMP")) o.log_timestamps = parse_bool("RINGFENCE_LOG_TIMESTAMP", *v);
  if (auto v = env.get("RINGFENCE_HOST_ID")) {
    if (v->empty()) bad_value("RINGFENCE_HOST_ID", *v, "a non-empty host identity");
    o.host_id = *v;
  }
  if (auto v = env.get("RINGFENCE_CHECKSUM")) o.checksum = parse_bool("RINGFENCE_CHECKSUM", *v);
  if (auto v = env.get("RINGFENCE_HEALTH")) o.health_enabled = parse_bool("RINGFENCE_HEALTH", *v);
  if (auto v = env.get("RINGFENCE_HEALTH_AGREE_BYTES")) o.health_agree_bytes = parse_bytes(*v, "RINGFENCE_HEALTH_AGREE_BYTES");
  if (auto v = env.get("RINGFENCE_HEALTH_SLOW_FACTOR")) {
    const double f = parse_positive_double("RINGFENCE_HEALTH_SLOW_FACTOR", *v);
    if (f < 1.5 || f > 1000) bad_value("RINGFENCE_HEALTH_SLOW_FACTOR", *v, "a factor between 1.5 and 1000");
    o.health_slow_factor = f;
  }
  if (auto v = env.get("RINGFENCE_CHECK_CALLS")) o.check_calls = parse_bool("RINGFENCE_CHECK_CALLS", *v);
  if (auto v = env.get("RINGFENCE_HEARTBEAT_MS"))
    o.heartbeat_interval = *v == "off" ? std::chrono::milliseconds(0)
                                       : std::chrono::milliseconds(parse_integer("RINGFENCE_HEARTBEAT_MS", *v, 0, 3600 * 1000));
  if (auto v = env.get("RINGFENCE_HEALTH_LOG")) o.health_log = *v;
  if (auto v = env.get("RINGFENCE_HEALTH_PROMETHEUS")) o.health_prometheus = *v;
  if (auto v = env.get("RINGFENCE_HEALTH_LEDGER")) o.health_ledger = *v;
  if (auto v = env.get("RINGFENCE_HEALTH_LEDGER_QUARANTINE_S"))
    o.health_ledger_quarantine = std::chrono::seconds(parse_integer("RINGFENCE_HEALTH_LEDGER_QUARANTINE_S", *v, 0, 1ll << 40));
  if (auto v = env.get("RINGFENCE_HEALTH_PROMETHEUS_INTERVAL_MS"))
    o.health_prometheus_interval = std::chrono::milliseconds(parse_integer("RINGFENCE_HEALTH_PROMETHEUS_INTERVAL_MS", *v, 0, 1ll << 40));
  // The config file first: the single-setting variables below override it.
  if (auto v = env.get("RINGFENCE_HEALTH_CONFIG")) health::load_health_config(*v, o.health);
  if (auto v = env.get("RINGFENCE_SYSFS_ROOT")) o.health.sysfs_root = *v;
  if (auto v = env.get("RINGFENCE_CUDART")) o.cuda_runtime = *v;
  if (auto v = env.get("RINGFENCE_DEVICE_STAGING_SLOTS"))
    o.device_staging_slots = static_cast<std::size_t>(parse_integer("RINGFENCE_DEVICE_STAGING_SLOTS", *v, 1, 1024));
  if (auto v = env.get("RINGFENCE_DEVICE_REGIONS")) o.device_regions = parse_auto_on_off<DeviceRegionsMode>("RINGFENCE_DEVICE_REGIONS", *v);
  if (auto v = env.get("RINGFENCE_CUDA_KERNELS")) o.cuda_kernels = *v;
  if (auto v = env.get("RINGFENCE_NVML_LIBRARY")) o.health.nvml_library = *v;
  if (auto v = env.get("RINGFENCE_HEALTH_WINDOW_MS"))
    o.health.window = std::chrono::milliseconds(parse_integer("RINGFENCE_HEALTH_WINDOW_MS", *v, 1, 1ll << 40));
  if (auto v = env.get("RINGFENCE_HEALTH_LINK_MAP")) o.health_link_map = *v;
  if (auto v = env.get("RINGFENCE_HEALTH_GPU"))
    o.health_gpu = *v == "cuda" ? CommOptions::kHealthGpuFromCuda
                                : static_cast<int>(parse_integer("RINGFENCE_HEALTH_GPU", *v, -1, 1 << 16));
  if (auto v = env.get("RINGFENCE_HEALTH_INTERVAL_MS"))
    o.health_interval = std::chrono::milliseconds(parse_integer("RINGFENCE_HEALTH_INTERVAL_MS", *v, 0, 1ll << 40));
  if (auto v = env.get("RINGFENCE_DIGEST_EVERY"))
    o.digest_every = static_cast<int>(parse_integer("RINGFENCE_DIGEST_EVERY", *v, 0, 1 << 20));
  if (auto v = env.get("RINGFENCE_DIGEST_ACTION")) {
    if (*v == "error") o.digest_action = DigestAction::Error;
    else if (*v == "fence") o.digest_action = DigestAction::Fence;
    else if (*v == "log") o.digest_action = DigestAction::Log;
    else bad_value("RINGFENCE_DIGEST_ACTION", *v, "error, fence or log");
  }
  if (auto v = env.get("RINGFENCE_HEALTH_AGREE_EVERY"))
    o.health_agree_every = static_cast<int>(parse_integer("RINGFENCE_HEALTH_AGREE_EVERY", *v, 0, 1 << 20));
  if (auto v = env.get("RINGFENCE_HEALTH_AGREE_MIN_US"))
    o.health_agree_min_interval = std::chrono::microseconds(parse_integer("RINGFENCE_HEALTH_AGREE_MIN_US", *v, 0, 10'000'000));
  if (auto v = env.get("RINGFENCE_FALLBACK")) {
    o.fallbacks = FallbackTable{};
    if (*v != "none")
      for (const std::string& pair : split_list(*v)) {
        const auto colon = pair.find(':');
        if (colon == std::string::npos || colon == 0 || colon + 1 == pair.size() || pair.substr(0, colon) == pair.substr(colon + 1))
          bad_value("RINGFENCE_FALLBACK", *v, "comma-separated from:to pairs of two different transports, such as nvlink:pcie, or none");
        o.fallbacks->emplace_back(pair.substr(0, colon), pair.substr(colon + 1));
      }
  }
  if (auto v = env.get("RINGFENCE_HEALTH_FENCE_CRC_ERRORS"))
    o.health.thresholds.checksum_storm_count =
        static_cast<std::uint64_t>(parse_integer("RINGFENCE_HEALTH_FENCE_CRC_ERRORS", *v, 1, 1ll << 40));
  if (auto v = env.get("RINGFENCE_FAULT")) {
    (void)parse_fault_spec(*v);  // validate now: a bad spec is an error naming the variable's rule
    o.fault = *v;
  }
  return o;
}

std::optional<std::string> SettingsReader::text(std::string_view variable) const {
  if (!options_) return std::nullopt;
  const auto it = options_->transport_settings.find(variable);
  if (it == options_->transport_settings.end()) return std::nullopt;
  return it->second;
}

long long SettingsReader::integer(std::string_view variable, long long fallback, long long min, long long max) const {
  const auto v = text(variable);
  return v ? parse_integer(variable, *v, min, max) : fallback;
}

std::size_t SettingsReader::bytes(std::string_view variable, std::size_t fallback) const {
  const auto v = text(variable);
  return v ? parse_bytes(*v, variable) : fallback;
}

bool SettingsReader::boolean(std::string_view variable, bool fallback) const {
  const auto v = text(variable);
  return v ? parse_bool(variable, *v) : fallback;
}

CommOptions CommOptions::from_env(const Environment& env) { return from_env(env, CommOptions{}); }

CommOptions CommOptions::from_env() { return from_env(Environment::from_process()); }

std::string_view to_string(Launcher launcher) noexcept {
  switch (launcher) {
    case Launcher::Ringfence: return "ringfence-run";
    case Launcher::Torchrun: return "torchrun";
    case Launcher::OpenMpi: return "openmpi";
    case Launcher::Slurm: return "slurm";
  }
  return "unknown";
}

std::string to_hex(const JobToken& token) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(token.size() * 2);
  for (std::uint8_t b : token) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

std::optional<JobToken> parse_token(std::string_view hex) noexcept {
  JobToken token{};
  if (hex.size() != token.size() * 2) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < token.size(); ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    token[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return token;
}

LaunchInfo detect_launch(const Environment& env) {
  LaunchInfo info;
  struct Source {
    Launcher launcher;
    const char* rank;
    const char* size;
    const char* local_rank;
    const char* local_size;
  };
  static constexpr Source kSources[] = {
      {Launcher::Ringfence, "RINGFENCE_RANK", "RINGFENCE_WORLD_SIZE", "RINGFENCE_LOCAL_RANK", "RINGFENCE_LOCAL_SIZE"},
      {Launcher::Torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {Launcher::OpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {Launcher::Slurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
  };
  const Source* src = nullptr;
  for (const Source& s : kSources)
    if (env.has(s.rank) || env.has(s.size)) {
      src = &s;
      break;
    }
  if (!src)
    throw InvalidUsage(
        "no launcher variables found: set RINGFENCE_RANK and RINGFENCE_WORLD_SIZE, or start under ringfence-run, "
        "torchrun, mpirun or srun");
  constexpr long long kMaxRanks = 1 << 20;
  const auto rank_s = env.get(src->rank);
  const auto size_s = env.get(src->size);
  if (!rank_s) throw InvalidUsage(fmt::format("{} is set but {} is missing", src->size, src->rank));
  if (!size_s) throw InvalidUsage(fmt::format("{} is set but {} is missing", src->rank, src->size));
  info.launcher = src->launcher;
  info.size = static_cast<int>(parse_integer(src->size, *size_s, 1, kMaxRanks));
  info.rank = static_cast<int>(parse_integer(src->rank, *rank_s, 0, info.size - 1));
  info.local_rank = 0;
  info.local_size = 0;  // unknown
  if (auto v = env.get(src->local_rank)) info.local_rank = static_cast<int>(parse_integer(src->local_rank, *v, 0, kMaxRanks));
  if (src->local_size)
    if (auto v = env.get(src->local_size))
      info.local_size = static_cast<int>(parse_integer(src->local_size, *v, 1, kMaxRanks));

  // Job identity: used to derive a (non-secret) token and, on one node, a store port.
  std::string job_id;
  bool single_node = false;
  switch (info.launcher) {
    case Launcher::Torchrun: job_id = "torchrun:" + env.get("TORCHELASTIC_RUN_ID").value_or(""); break;
    case Launcher::OpenMpi:
      job_id = "ompi:" + env.get("OMPI_MCA_ess_base_jobid").value_or("");
      single_node = info.local_size == info.size;
      break;
    case Launcher::Slurm:
      job_id = "slurm:" + env.get("SLURM_JOB_ID").value_or("") + "." + env.get("SLURM_STEP_ID").value_or("");
      single_node = env.get("SLURM_NNODES").value_or("") == "1";
      break;
    case Launcher::Ringfence: break;
  }

  auto parse_port = [](std::string_view name, std::string_view text) {
    return static_cast<std::uint16_t>(parse_integer(name, text, 1, 65535));
  };
  if (auto addr = env.get("RINGFENCE_STORE_ADDR")) {
    const auto colon = addr->rfind(':');
    if (colon == std::string::npos || colon == 0) bad_value("RINGFENCE_STORE_ADDR", *addr, "host:port");
    info.store_host = addr->substr(0, colon);
    info.store_port = parse_port("RINGFENCE_STORE_ADDR", std::string_view(*addr).substr(colon + 1));
    info.host_store = false;
    if (auto h = env.get("RINGFENCE_STORE_HOST")) info.host_store = parse_bool("RINGFENCE_STORE_HOST", *h);
  } else if (auto master = env.get("MASTER_ADDR")) {
    const auto port_s = env.get("MASTER_PORT");
    if (!port_s) throw InvalidUsage("MASTER_ADDR is set but MASTER_PORT is missing");
    std::uint16_t port = parse_port("MASTER_PORT", *port_s);
    // torchrun's agent already serves its own store on MASTER_PORT; ringfence's store uses the next port.
    if (env.has("TORCHELASTIC_RUN_ID")) {
      if (port == 65535) bad_value("MASTER_PORT", *port_s, "a port below 65535 under torchrun (ringfence uses MASTER_PORT+1)");
      ++port;
    }
    info.store_host = *master;
    info.store_port = port;
    info.host_store = info.rank == 0;
    job_id += ":" + *master + ":" + *port_s;
  } else if (single_node && !job_id.empty()) {
    info.store_host = "127.0.0.1";
    // Below Linux's default ephemeral range (32768-60999), so an outgoing connection's local port
    // cannot already hold it.
    info.store_port = static_cast<std::uint16_t>(20000 + fnv1a(job_id, 14695981039346656037ull) % 12000);
    info.host_store = info.rank == 0;
  } else {
    throw InvalidUsage(fmt::format(
        "rank {}: no bootstrap store address for launcher {}: set RINGFENCE_STORE_ADDR=host:port, or MASTER_ADDR "
        "and MASTER_PORT (rank 0 hosts the store there)",
        info.rank, to_string(info.launcher)));
  }

  if (auto t = env.get("RINGFENCE_JOB_TOKEN")) {
    const auto token = parse_token(*t);
    if (!token) bad_value("RINGFENCE_JOB_TOKEN", "<hidden>", "32 hexadecimal digits");
    info.token = *token;
  } else {
    if (info.launcher == Launcher::Ringfence)
      throw InvalidUsage("RINGFENCE_JOB_TOKEN is required with RINGFENCE_RANK/RINGFENCE_WORLD_SIZE (ringfence-run sets it)");
    const std::string seed = fmt::format("ringfence:{}:{}", job_id, info.size);
    const std::uint64_t a = fnv1a(seed, 14695981039346656037ull), b = fnv1a(seed, 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < 8; ++i) {
      info.token[i] = static_cast<std::uint8_t>(a >> (8 * i));
      info.token[8 + i] = static_cast<std::uint8_t>(b >> (8 * i));
    }
    info.token_is_derived = true;
  }
  return info;
}

}  // namespace ringfence
