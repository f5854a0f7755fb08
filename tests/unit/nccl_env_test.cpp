// NCCL's environment variables for the shim ([nccl-env]): each maps onto a ringfence option or is
// reported as ignored, RINGFENCE_* variables win, bad values name the variable.
#include <algorithm>
#include <ringfence/env.hpp>
#include <ringfence/error.hpp>
#include <ringfence/options.hpp>
#include <string>
#include <vector>

#include "env_nccl.hpp"
#include "support/catch.hpp"

using namespace ringfence;

namespace {
const std::vector<std::string> kShimTransports = {"shm", "tcp", "nvlink", "pcie"};

struct Applied {
  CommOptions options;
  NcclEnvironmentReport report;
};
Applied apply(const std::map<std::string, std::string>& vars) {
  const Environment env(vars);
  Applied a{CommOptions::from_env(env), {}};
  a.report = apply_nccl_environment(env, a.options, kShimTransports);
  return a;
}
bool mentions(const std::vector<std::string>& lines, const std::string& part) {
  return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(part) != std::string::npos; });
}
}  // namespace

TEST_CASE("NCCL_DEBUG and NCCL_DEBUG_FILE drive the library's logging", "[nccl-env]") {
  CHECK(apply({{"NCCL_DEBUG", "INFO"}}).options.log_level == LogLevel::Info);
  CHECK(apply({{"NCCL_DEBUG", "trace"}}).options.log_level == LogLevel::Trace);
  CHECK(apply({{"NCCL_DEBUG", "VERSION"}}).options.log_level == LogLevel::Warn);
  CHECK(apply({{"NCCL_DEBUG", "WARN"}}).report.applied == std::vector<std::string>{"NCCL_DEBUG=WARN: log level warn"});
  // RINGFENCE_LOG wins, and says so.
  const Applied both = apply({{"NCCL_DEBUG", "INFO"}, {"RINGFENCE_LOG", "error"}});
  CHECK(both.options.log_level == LogLevel::Error);
  CHECK(mentions(both.report.ignored, "NCCL_DEBUG=INFO: ignored (RINGFENCE_LOG is set and wins)"));
  CHECK_THROWS_WITH(apply({{"NCCL_DEBUG", "LOUD"}}), Catch::Contains("NCCL_DEBUG='LOUD'"));
  CHECK(apply({{"NCCL_DEBUG_FILE", "/tmp/nccl.%h.%p"}}).options.log_file == "/tmp/nccl.%h.%p");
  CHECK(apply({{"NCCL_DEBUG_FILE", "/a"}, {"RINGFENCE_LOG_FILE", "/b"}}).options.log_file == "/b");
  CHECK(mentions(apply({{"NCCL_DEBUG_SUBSYS", "INIT,NET"}}).report.ignored, "NCCL_DEBUG_SUBSYS=INIT,NET: ignored"));
}

TEST_CASE("NCCL_SOCKET_IFNAME picks the tcp data sockets, NCCL_SOCKET_FAMILY is checked", "[nccl-env]") {
  const Applied a = apply({{"NCCL_SOCKET_IFNAME", "^docker,lo"}});
  CHECK(a.options.transport_settings.at("RINGFENCE_SOCKET_IFNAME") == "^docker,lo");
  CHECK(mentions(a.report.applied, "bootstrap and tcp data sockets"));
  CHECK(apply({{"NCCL_SOCKET_IFNAME", "=eth0"}, {"RINGFENCE_SOCKET_IFNAME", "eth1"}}).options.transport_settings.at("RINGFENCE_SOCKET_IFNAME") ==
        "eth1");
  CHECK(mentions(apply({{"NCCL_SOCKET_FAMILY", "AF_INET6"}}).report.ignored, "IPv4 only"));
  CHECK(apply({{"NCCL_SOCKET_FAMILY", "AF_INET"}}).report.ignored.empty());
  CHECK_THROWS_WITH(apply({{"NCCL_SOCKET_FAMILY", "inet"}}), Catch::Contains("NCCL_SOCKET_FAMILY='inet'"));
}

TEST_CASE("NCCL_ALGO maps a single Ring or Tree, other values are reported", "[nccl-env]") {
  CHECK(apply({{"NCCL_ALGO", "Ring"}}).options.algorithm == Algorithm::Ring);
  CHECK(apply({{"NCCL_ALGO", "tree"}}).options.algorithm == Algorithm::Tree);
  const Applied nvls = apply({{"NCCL_ALGO", "NVLS,Ring"}});
  CHECK(nvls.options.algorithm == Algorithm::Auto);
  CHECK(mentions(nvls.report.ignored, "NCCL_ALGO=NVLS,Ring: ignored"));
  CHECK(apply({{"NCCL_ALGO", "Tree"}, {"RINGFENCE_ALGO", "ring"}}).options.algorithm == Algorithm::Ring);
}

TEST_CASE("NCCL_*_DISABLE remove transports, NCCL_IB_HCA picks HCAs", "[nccl-env]") {
  CHECK(apply({{"NCCL_SHM_DISABLE", "1"}}).options.transports == std::vector<std::string>{"tcp", "nvlink", "pcie"});
  CHECK(apply({{"NCCL_P2P_DISABLE", "1"}}).options.transports == std::vector<std::string>{"shm", "tcp"});
  CHECK(apply({{"NCCL_P2P_DISABLE", "1"}, {"NCCL_SHM_DISABLE", "1"}}).options.transports == std::vector<std::string>{"tcp"});
  CHECK(apply({{"NCCL_SHM_DISABLE", "0"}}).options.transports.empty());  // 0: nothing removed, all allowed
  CHECK(apply({{"NCCL_IB_DISABLE", "1"}}).options.transports == kShimTransports);  // no ibverbs registered here
  const Applied explicit_list = apply({{"NCCL_SHM_DISABLE", "1"}, {"RINGFENCE_TRANSPORTS", "shm"}});
  CHECK(explicit_list.options.transports == std::vector<std::string>{"shm"});
  CHECK(mentions(explicit_list.report.ignored, "RINGFENCE_TRANSPORTS is set and wins"));
  CHECK_THROWS_WITH(apply({{"NCCL_SHM_DISABLE", "yes"}}), Catch::Contains("NCCL_SHM_DISABLE='yes'"));
  const Environment none(std::map<std::string, std::string>{{"NCCL_SHM_DISABLE", "1"}});
  CommOptions o;
  CHECK_THROWS_WITH(apply_nccl_environment(none, o, {"shm"}), Catch::Contains("left none of the transports (shm)"));
  CHECK(apply({{"NCCL_IB_HCA", "=mlx5_0:1"}}).options.transport_settings.at("RINGFENCE_IB_HCA") == "=mlx5_0:1");
}

TEST_CASE("other NCCL variables are reported as ignored, with the reason", "[nccl-env]") {
  const Applied a = apply({{"NCCL_PROTO", "LL128"}, {"NCCL_BUFFSIZE", "8388608"}, {"NCCL_MADE_UP", "1"}, {"NCCL_DEBUG", "INFO"}});
  CHECK(a.report.applied.size() == 1);
  CHECK(a.report.ignored.size() == 3);
  CHECK(mentions(a.report.ignored, "NCCL_PROTO=LL128: ignored (ringfence chooses its own protocols"));
  CHECK(mentions(a.report.ignored, "NCCL_BUFFSIZE=8388608: ignored (staging is RINGFENCE_CHUNK_BYTES"));
  CHECK(mentions(a.report.ignored, "NCCL_MADE_UP=1: ignored (not read by the ringfence shim)"));
  CHECK(apply({}).report.applied.empty());
  CHECK(apply({}).report.ignored.empty());
}
