// NCCL's environment variables for the shim (env_nccl.hpp). Each variable either maps onto a
// ringfence option or is reported as ignored with the reason, so a user moving a job over from
// NCCL sees what took effect.
#include "env_nccl.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <ringfence/error.hpp>
#include <ringfence/transports/cuda_ipc.hpp>
#include <ringfence/transports/ibverbs.hpp>
#include <ringfence/transports/shm.hpp>
#include <string_view>

namespace ringfence {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

bool flag_on(std::string_view name, std::string_view value) {
  if (value == "1") return true;
  if (value == "0") return false;
  throw InvalidUsage(fmt::format("environment variable {}='{}' is invalid: expected 0 or 1", name, value));
}

// Variables NCCL users set that have no counterpart here, with why.
struct Ignored {
  std::string_view name, why;
};
constexpr Ignored kIgnored[] = {
    {"NCCL_PROTO", "ringfence chooses its own protocols (docs/tuning.md)"},
    {"NCCL_NET_GDR_LEVEL", "GPUDirect RDMA is used whenever the ibverbs transport can register device memory"},
    {"NCCL_NET_GDR_READ", "GPUDirect RDMA is used whenever the ibverbs transport can register device memory"},
    {"NCCL_BUFFSIZE", "staging is RINGFENCE_CHUNK_BYTES x RINGFENCE_SLOTS per link"},
    {"NCCL_NTHREADS", "no CUDA thread-count knob: host engine, and kernels sized per call"},
    {"NCCL_MIN_NCHANNELS", "channels are RINGFENCE_CHANNELS"},
    {"NCCL_MAX_NCHANNELS", "channels are RINGFENCE_CHANNELS"},
    {"NCCL_DEBUG_SUBSYS", "every subsystem is logged at the chosen level"},
    {"NCCL_LAUNCH_MODE", "no kernel launch modes"},
    {"NCCL_CUMEM_ENABLE", "device memory comes from the caller"},
    {"NCCL_NVLS_ENABLE", "no NVLink SHARP"},
    {"NCCL_COLLNET_ENABLE", "no CollNet"},
    {"NCCL_CROSS_NIC", "one NIC per link"},
    {"NCCL_IB_GID_INDEX", "set RINGFENCE_IB_GID_INDEX"},
    {"NCCL_IB_TIMEOUT", "set RINGFENCE_IB_TIMEOUT"},
    {"NCCL_IB_RETRY_CNT", "set RINGFENCE_IB_RETRY_CNT"},
    {"NCCL_IB_SL", "set RINGFENCE_IB_SL"},
    {"NCCL_IB_TC", "set RINGFENCE_IB_TC"},
};

// The variables this file applies (anything else named NCCL_* is reported as unknown).
constexpr std::string_view kApplied[] = {"NCCL_DEBUG",       "NCCL_DEBUG_FILE",  "NCCL_SOCKET_IFNAME", "NCCL_SOCKET_FAMILY",
                                         "NCCL_ALGO",        "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE",   "NCCL_IB_DISABLE",
                                         "NCCL_IB_HCA"};

// Removes transport `name` (and, for P2P, both device transports) from the allowed list.
void disallow(CommOptions& o, const std::vector<std::string>& transports, std::initializer_list<std::string_view> names) {
  if (o.transports.empty()) o.transports = transports;
  std::erase_if(o.transports, [&](const std::string& t) { return std::find(names.begin(), names.end(), t) != names.end(); });
}

}  // namespace

NcclEnvironmentReport apply_nccl_environment(const Environment& env, CommOptions& o, const std::vector<std::string>& transports) {
  NcclEnvironmentReport r;
  const auto applied = [&](std::string_view name, const std::string& value, std::string what) {
    r.applied.push_back(fmt::format("{}={}: {}", name, value, what));
  };
  const auto ignored = [&](std::string_view name, const std::string& value, std::string why) {
    r.ignored.push_back(fmt::format("{}={}: ignored ({})", name, value, why));
  };

  if (auto v = env.get("NCCL_DEBUG")) {
    const std::string level = lower(*v);
    if (env.has("RINGFENCE_LOG")) ignored("NCCL_DEBUG", *v, "RINGFENCE_LOG is set and wins");
    else if (level == "version" || level == "warn" || level == "abort") o.log_level = LogLevel::Warn, applied("NCCL_DEBUG", *v, "log level warn");
    else if (level == "info") o.log_level = LogLevel::Info, applied("NCCL_DEBUG", *v, "log level info");
    else if (level == "trace") o.log_level = LogLevel::Trace, applied("NCCL_DEBUG", *v, "log level trace");
    else throw InvalidUsage(fmt::format("environment variable NCCL_DEBUG='{}' is invalid: expected VERSION, WARN, INFO or TRACE", *v));
  }
  if (auto v = env.get("NCCL_DEBUG_FILE")) {
    if (env.has("RINGFENCE_LOG_FILE")) ignored("NCCL_DEBUG_FILE", *v, "RINGFENCE_LOG_FILE is set and wins");
    else if (v->empty()) throw InvalidUsage("environment variable NCCL_DEBUG_FILE='' is invalid: expected a file path (%h host, %p pid)");
    else o.log_file = *v, applied("NCCL_DEBUG_FILE", *v, "log lines appended to this file");
  }
  if (auto v = env.get("NCCL_SOCKET_IFNAME")) {
    if (env.has("RINGFENCE_SOCKET_IFNAME")) ignored("NCCL_SOCKET_IFNAME", *v, "RINGFENCE_SOCKET_IFNAME is set and wins");
    else o.transport_settings["RINGFENCE_SOCKET_IFNAME"] = *v, applied("NCCL_SOCKET_IFNAME", *v, "bootstrap and tcp data sockets");
  }
  if (auto v = env.get("NCCL_SOCKET_FAMILY")) {
    if (*v == "AF_INET") applied("NCCL_SOCKET_FAMILY", *v, "IPv4 (the only family here)");
    else if (*v == "AF_INET6") ignored("NCCL_SOCKET_FAMILY", *v, "sockets are IPv4 only");
    else throw InvalidUsage(fmt::format("environment variable NCCL_SOCKET_FAMILY='{}' is invalid: expected AF_INET or AF_INET6", *v));
  }
  if (auto v = env.get("NCCL_ALGO")) {
    const std::string algo = lower(*v);
    if (env.has("RINGFENCE_ALGO")) ignored("NCCL_ALGO", *v, "RINGFENCE_ALGO is set and wins");
    else if (algo == "ring") o.algorithm = Algorithm::Ring, applied("NCCL_ALGO", *v, "allreduce forced to the ring");
    else if (algo == "tree") o.algorithm = Algorithm::Tree, applied("NCCL_ALGO", *v, "allreduce forced to the tree");
    else ignored("NCCL_ALGO", *v, "only a single Ring or Tree maps onto RINGFENCE_ALGO; the tuner chooses");
  }
  bool disabled_any = false;
  const auto disable = [&](std::string_view name, std::initializer_list<std::string_view> names, const char* what) {
    if (auto v = env.get(name)) {
      if (!flag_on(name, *v)) return;
      if (env.has("RINGFENCE_TRANSPORTS")) return ignored(name, *v, "RINGFENCE_TRANSPORTS is set and wins");
      disallow(o, transports, names);
      disabled_any = true;
      applied(name, *v, what);
    }
  };
  disable("NCCL_P2P_DISABLE", {transports::cuda_ipc::kNvlinkName, transports::cuda_ipc::kPcieName},
          "no device-to-device transports (nvlink, pcie)");
  disable("NCCL_SHM_DISABLE", {transports::shm::kName}, "no shm transport");
  disable("NCCL_IB_DISABLE", {transports::ibverbs::kName}, "no ibverbs transport");
  if (disabled_any && o.transports.empty())
    throw InvalidUsage(fmt::format("NCCL_P2P_DISABLE, NCCL_SHM_DISABLE and NCCL_IB_DISABLE left none of the transports ({})",
                                   fmt::join(transports, ", ")));
  if (auto v = env.get("NCCL_IB_HCA")) {
    if (env.has("RINGFENCE_IB_HCA")) ignored("NCCL_IB_HCA", *v, "RINGFENCE_IB_HCA is set and wins");
    else o.transport_settings["RINGFENCE_IB_HCA"] = *v, applied("NCCL_IB_HCA", *v, "ibverbs devices and ports");
  }
  for (const Ignored& i : kIgnored)
    if (auto v = env.get(i.name)) ignored(i.name, *v, std::string(i.why));
  for (const std::string& name : env.names_with_prefix("NCCL_")) {
    const bool known = std::find(std::begin(kApplied), std::end(kApplied), name) != std::end(kApplied) ||
                       std::any_of(std::begin(kIgnored), std::end(kIgnored), [&](const Ignored& i) { return i.name == name; });
    if (!known) ignored(name, *env.get(name), "not read by the ringfence shim");
  }
  return r;
}

}  // namespace ringfence
