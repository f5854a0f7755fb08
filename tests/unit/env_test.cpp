// Environment parsing: options, launchers, and the errors that name the variable.
#include <ringfence/env.hpp>
#include <ringfence/error.hpp>
#include <ringfence/health/config.hpp>
#include <ringfence/options.hpp>
#include <ringfence/transports/ibverbs.hpp>
#include <ringfence/transports/shm.hpp>
#include <ringfence/transports/tcp.hpp>
#include <cstdio>

#include "support/captured_log.hpp"
#include "support/catch.hpp"

using namespace ringfence;

namespace {
Environment env(const std::map<std::string, std::string>& vars) { return Environment(vars); }

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const InvalidUsage& e) {
    return e.what();
  }
  return "<no InvalidUsage thrown>";
}
const std::string kToken = "00112233445566778899aabbccddeeff";
}  // namespace

TEST_CASE("defaults hold without variables", "[env]") {
  const CommOptions o = CommOptions::from_env(env({}));
  REQUIRE(o.timeout == std::chrono::milliseconds(60000));
  REQUIRE(o.chunk_bytes == 256 * 1024);
  REQUIRE(o.slots == 4);
  REQUIRE(o.transports.empty());
  REQUIRE(o.log_level == LogLevel::Warn);
  // Quiet agreements about 10 ms apart (options.hpp says why not 1 ms).
  REQUIRE(o.health_agree_min_interval == std::chrono::milliseconds(10));
}

TEST_CASE("RINGFENCE_* variables override options", "[env]") {
  const CommOptions o = CommOptions::from_env(env({{"RINGFENCE_TIMEOUT_MS", "1500"},
                                                   {"RINGFENCE_CHUNK_BYTES", "64K"},
                                                   {"RINGFENCE_SLOTS", "2"},
                                                   {"RINGFENCE_TRANSPORTS", "shm,tcp"},
                                                   {"RINGFENCE_LOG", "debug"},
                                                   {"RINGFENCE_HOST_ID", "hostA"},
                                                   {"RINGFENCE_SHM_SPIN", "0"},
                                                   {"RINGFENCE_SHM_CMA", "0"},
                                                   {"RINGFENCE_ALLTOALL_DIRECT_USER_MIN_BYTES", "1M"},
                                                   {"RINGFENCE_HEALTH_FENCE_CRC_ERRORS", "5"},
                                                   {"RINGFENCE_CHANNELS", "3"},
                                                   {"RINGFENCE_CHANNEL_MIN_BYTES", "2M"},
                                                   {"RINGFENCE_TCP_SOCKETS", "4"},
                                                   {"RINGFENCE_SOCKET_IFNAME", "^docker,lo"},
                                                   {"RINGFENCE_HEALTH_GPU", "3"},
                                                   {"RINGFENCE_DEVICE_REGIONS", "off"},
                                                   {"RINGFENCE_STREAM_WRITES", "on"},
                                                   {"RINGFENCE_CARRY_MAX_BYTES", "64"},
                                                   {"RINGFENCE_CUDA_KERNELS", "/opt/rf/libringfence_kernels.so"}}));
  REQUIRE(o.timeout == std::chrono::milliseconds(1500));
  REQUIRE(o.chunk_bytes == 64 * 1024);
  REQUIRE(o.slots == 2);
  REQUIRE(o.transports == std::vector<std::string>{"shm", "tcp"});
  REQUIRE(o.log_level == LogLevel::Debug);
  REQUIRE(o.host_id == "hostA");
  // Transport settings travel as text and are parsed by their transport.
  REQUIRE(o.transport_settings.at("RINGFENCE_SHM_SPIN") == "0");
  REQUIRE(transports::shm::Options::from(&o).spin_count == 0);
  REQUIRE_FALSE(transports::shm::Options::from(&o).cross_memory_attach);
  REQUIRE(o.transport_settings.count("RINGFENCE_TIMEOUT_MS") == 0);  // core options are not copied
  REQUIRE(o.alltoall_direct_user_min_bytes == 1024 * 1024);
  REQUIRE(o.health.thresholds.checksum_storm_count == 5);
  REQUIRE(o.channels == 3);
  REQUIRE(o.channel_min_bytes == 2 * 1024 * 1024);
  REQUIRE(o.carry_max_bytes == 64);
  REQUIRE(CommOptions::from_env(env({{"RINGFENCE_CARRY_MAX_BYTES", "off"}})).carry_max_bytes == 0);
  REQUIRE(transports::tcp::Options::from(&o).sockets == 4);
  REQUIRE(transports::tcp::Options::from(&o).interfaces == "^docker,lo");
  REQUIRE(transports::tcp::Options::from(nullptr).sockets == 2);  // no options: the defaults
  REQUIRE(o.health_gpu == 3);
  REQUIRE(o.device_regions == DeviceRegionsMode::Off);
  REQUIRE(o.cuda_kernels == "/opt/rf/libringfence_kernels.so");
  REQUIRE(CommOptions{}.device_regions == DeviceRegionsMode::Auto);
  REQUIRE(o.stream_writes == StreamWritesMode::On);
  REQUIRE(CommOptions{}.stream_writes == StreamWritesMode::Auto);
  REQUIRE(CommOptions::from_env(env({{"RINGFENCE_STREAM_WRITES", "off"}})).stream_writes == StreamWritesMode::Off);
  REQUIRE(CommOptions::from_env(env({{"RINGFENCE_STREAM_WRITES", "auto"}})).stream_writes == StreamWritesMode::Auto);
  REQUIRE(CommOptions{}.spin == SpinMode::Auto);
  REQUIRE(CommOptions::from_env(env({{"RINGFENCE_SPIN", "on"}})).spin == SpinMode::On);
  REQUIRE(CommOptions::from_env(env({{"RINGFENCE_SPIN", "off"}})).spin == SpinMode::Off);
  REQUIRE(CommOptions::from_env(env({{"RINGFENCE_SPIN", "auto"}})).spin == SpinMode::Auto);
  REQUIRE(CommOptions::from_env(env({{"RINGFENCE_SPIN", "on"}})).transport_settings.count("RINGFENCE_SPIN") == 0);  // a core option
  REQUIRE(CommOptions::from_env(env({{"RINGFENCE_DEVICE_REGIONS", "on"}})).device_regions == DeviceRegionsMode::On);
  REQUIRE(CommOptions::from_env(env({{"RINGFENCE_DEVICE_REGIONS", "auto"}})).device_regions == DeviceRegionsMode::Auto);
  REQUIRE(CommOptions::from_env(env({{"RINGFENCE_HEALTH_GPU", "cuda"}})).health_gpu == CommOptions::kHealthGpuFromCuda);
  REQUIRE(CommOptions::from_env(env({{"RINGFENCE_ALLTOALL_DIRECT_USER_MIN_BYTES", "off"}})).alltoall_direct_user_min_bytes ==
          SIZE_MAX);
  // A base passed in keeps fields the environment does not mention.
  CommOptions base;
  base.slots = 7;
  REQUIRE(CommOptions::from_env(env({}), base).slots == 7);
}

TEST_CASE("ibverbs variables reach the ibverbs transport's options", "[env][ibverbs]") {
  const CommOptions none;
  const auto d = transports::ibverbs::Options::from(&none);
  REQUIRE(d.hca.empty());
  REQUIRE(d.gid_index == 0);
  REQUIRE(d.timeout == 20);
  REQUIRE(d.retry_count == 7);
  const CommOptions o = CommOptions::from_env(env({{"RINGFENCE_IB_HCA", "^=mlx5_2:1,mlx4"},
                                                   {"RINGFENCE_IB_GID_INDEX", "3"},
                                                   {"RINGFENCE_IB_TIMEOUT", "18"},
                                                   {"RINGFENCE_IB_RETRY_CNT", "5"},
                                                   {"RINGFENCE_IB_SL", "2"},
                                                   {"RINGFENCE_IB_TC", "106"}}));
  const auto ib = transports::ibverbs::Options::from(&o);
  REQUIRE(ib.hca == "^=mlx5_2:1,mlx4");
  REQUIRE(ib.gid_index == 3);
  REQUIRE(ib.timeout == 18);
  REQUIRE(ib.retry_count == 5);
  REQUIRE(ib.service_level == 2);
  REQUIRE(ib.traffic_class == 106);
  // A transport's variables are known once the transport declares them (TransportRegistry::add).
  std::vector<std::string> declared;
  for (const SettingKey& k : transports::ibverbs::setting_keys()) declared.emplace_back(k.variable);
  REQUIRE(unknown_variables(env({{"RINGFENCE_IB_HCA", "mlx5"}, {"RINGFENCE_IB_HCAS", "mlx5"}}), declared) ==
          std::vector<std::string>{"RINGFENCE_IB_HCAS"});
  REQUIRE(unknown_variables(env({{"RINGFENCE_IB_HCA", "mlx5"}}), {}) == std::vector<std::string>{"RINGFENCE_IB_HCA"});
}

TEST_CASE("bad values are errors naming the variable", "[env]") {
  struct Case {
    const char* name;
    const char* value;
  };
  const Case cases[] = {{"RINGFENCE_TIMEOUT_MS", "abc"}, {"RINGFENCE_TIMEOUT_MS", "0"},   {"RINGFENCE_TIMEOUT_MS", "-5"},
                        {"RINGFENCE_CHUNK_BYTES", "1X"}, {"RINGFENCE_CHUNK_BYTES", "0"}, {"RINGFENCE_SLOTS", "65"},
                        {"RINGFENCE_LOG", "loud"},       {"RINGFENCE_TRANSPORTS", ","},  {"RINGFENCE_SHM_CMA", "maybe"},
                        {"RINGFENCE_CHANNELS", "17"},    {"RINGFENCE_TCP_SOCKETS", "0"}, {"RINGFENCE_TCP_SOCKETS", "9"},
                        {"RINGFENCE_HEALTH_GPU", "x"},   {"RINGFENCE_IB_HCA", ""},       {"RINGFENCE_IB_GID_INDEX", "256"},
                        {"RINGFENCE_IB_TIMEOUT", "0"},   {"RINGFENCE_IB_TIMEOUT", "32"}, {"RINGFENCE_IB_RETRY_CNT", "8"},
                        {"RINGFENCE_IB_SL", "16"},       {"RINGFENCE_IB_TC", "-1"},       {"RINGFENCE_DEVICE_REGIONS", "yes"},
                        {"RINGFENCE_STREAM_WRITES", "1"}, {"RINGFENCE_SPIN", "yes"},
                        {"RINGFENCE_CARRY_MAX_BYTES", "4097"}, {"RINGFENCE_CARRY_MAX_BYTES", "1X"}};
  for (const Case& c : cases) {
    INFO(c.name << "=" << c.value);
    // Core options fail in from_env; a transport's settings when the transport reads them.
    const std::string msg = error_of([&] {
      const CommOptions o = CommOptions::from_env(env({{c.name, c.value}}));
      (void)transports::shm::Options::from(&o);
      (void)transports::tcp::Options::from(&o);
      (void)transports::ibverbs::Options::from(&o);
    });
    REQUIRE_THAT(msg, Catch::Contains(c.name) && Catch::Contains(std::string("'") + c.value + "'"));
  }
}

TEST_CASE("switches take 1/0, on/off, true/false, yes/no, and a bad one lists them", "[env]") {
  for (const auto& [text, on] : {std::pair{"1", true}, {"on", true}, {"true", true}, {"yes", true}, {"0", false}, {"off", false},
                                  {"false", false}, {"no", false}}) {
    INFO("RINGFENCE_CHECKSUM=" << text);
    CHECK(CommOptions::from_env(env({{"RINGFENCE_CHECKSUM", text}})).checksum == on);
  }
  // The message once said "expected 0 or 1" while the docs (and users) write "off".
  const std::string msg = error_of([] { (void)CommOptions::from_env(env({{"RINGFENCE_CHECKSUM", "bogus"}})); });
  REQUIRE_THAT(msg, Catch::Contains("RINGFENCE_CHECKSUM='bogus'") && Catch::Contains("1, on, true or yes; 0, off, false or no"));
}

TEST_CASE("parse_bytes accepts suffixes and rejects junk", "[env]") {
  REQUIRE(parse_bytes("8", "x") == 8);
  REQUIRE(parse_bytes("4k", "x") == 4096);
  REQUIRE(parse_bytes("256M", "x") == 256u << 20);
  REQUIRE(parse_bytes("1G", "x") == 1u << 30);
  REQUIRE_THROWS_AS(parse_bytes("", "x"), InvalidUsage);
  REQUIRE_THROWS_AS(parse_bytes("M", "x"), InvalidUsage);
  REQUIRE_THROWS_AS(parse_bytes("99999999999999999999", "x"), InvalidUsage);
}

TEST_CASE("ringfence-run variables", "[env][launch]") {
  const LaunchInfo l = detect_launch(env({{"RINGFENCE_RANK", "2"},
                                          {"RINGFENCE_WORLD_SIZE", "4"},
                                          {"RINGFENCE_LOCAL_RANK", "2"},
                                          {"RINGFENCE_LOCAL_SIZE", "4"},
                                          {"RINGFENCE_STORE_ADDR", "127.0.0.1:29500"},
                                          {"RINGFENCE_JOB_TOKEN", kToken}}));
  REQUIRE(l.launcher == Launcher::Ringfence);
  REQUIRE(l.rank == 2);
  REQUIRE(l.size == 4);
  REQUIRE(l.local_rank == 2);
  REQUIRE(l.local_size == 4);
  REQUIRE(l.store_host == "127.0.0.1");
  REQUIRE(l.store_port == 29500);
  REQUIRE_FALSE(l.host_store);
  REQUIRE(to_hex(l.token) == kToken);
  REQUIRE_FALSE(l.token_is_derived);
}

TEST_CASE("torchrun variables: rank 0 hosts the store on MASTER_PORT+1", "[env][launch]") {
  const auto vars = std::map<std::string, std::string>{{"RANK", "0"},          {"WORLD_SIZE", "2"},
                                                       {"LOCAL_RANK", "0"},    {"LOCAL_WORLD_SIZE", "2"},
                                                       {"MASTER_ADDR", "node1"}, {"MASTER_PORT", "29500"},
                                                       {"TORCHELASTIC_RUN_ID", "job7"}};
  const LaunchInfo l = detect_launch(env(vars));
  REQUIRE(l.launcher == Launcher::Torchrun);
  REQUIRE(l.store_host == "node1");
  REQUIRE(l.store_port == 29501);
  REQUIRE(l.host_store);
  REQUIRE(l.token_is_derived);
  auto other = vars;
  other["RANK"] = "1";
  const LaunchInfo l1 = detect_launch(env(other));
  REQUIRE_FALSE(l1.host_store);
  REQUIRE(l1.token == l.token);  // every rank derives the same token
  other["TORCHELASTIC_RUN_ID"] = "job8";
  REQUIRE(detect_launch(env(other)).token != l.token);  // another job, another token
}

TEST_CASE("Open MPI on one node derives a local store", "[env][launch]") {
  const LaunchInfo l = detect_launch(env({{"OMPI_COMM_WORLD_RANK", "1"},
                                          {"OMPI_COMM_WORLD_SIZE", "4"},
                                          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                          {"OMPI_MCA_ess_base_jobid", "1652162561"}}));
  REQUIRE(l.launcher == Launcher::OpenMpi);
  REQUIRE(l.rank == 1);
  REQUIRE(l.store_host == "127.0.0.1");
  REQUIRE(l.store_port >= 20000);
  REQUIRE(l.store_port < 32000);
  REQUIRE_FALSE(l.host_store);
}

TEST_CASE("Slurm across nodes needs an address", "[env][launch]") {
  const std::string msg = error_of([] {
    (void)detect_launch(env({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}, {"SLURM_NNODES", "2"}}));
  });
  REQUIRE_THAT(msg, Catch::Contains("RINGFENCE_STORE_ADDR") && Catch::Contains("slurm"));
  const LaunchInfo l = detect_launch(env({{"SLURM_PROCID", "3"},
                                          {"SLURM_NTASKS", "8"},
                                          {"SLURM_LOCALID", "1"},
                                          {"SLURM_NNODES", "2"},
                                          {"MASTER_ADDR", "10.0.0.1"},
                                          {"MASTER_PORT", "12345"}}));
  REQUIRE(l.launcher == Launcher::Slurm);
  REQUIRE(l.store_port == 12345);  // not torchrun: the port is used as is
  REQUIRE(l.local_rank == 1);
}

TEST_CASE("launch errors name the variable", "[env][launch]") {
  REQUIRE_THAT(error_of([] { (void)detect_launch(env({})); }), Catch::Contains("RINGFENCE_RANK"));
  REQUIRE_THAT(error_of([] { (void)detect_launch(env({{"RANK", "0"}})); }), Catch::Contains("WORLD_SIZE"));
  REQUIRE_THAT(error_of([] {
                 (void)detect_launch(env({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}));
               }),
               Catch::Contains("RANK='4'"));
  REQUIRE_THAT(error_of([] {
                 (void)detect_launch(env({{"RINGFENCE_RANK", "0"},
                                          {"RINGFENCE_WORLD_SIZE", "1"},
                                          {"RINGFENCE_STORE_ADDR", "h:1"},
                                          {"RINGFENCE_JOB_TOKEN", "xyz"}}));
               }),
               Catch::Contains("RINGFENCE_JOB_TOKEN"));
  REQUIRE_THAT(error_of([] {
                 (void)detect_launch(env({{"RINGFENCE_RANK", "0"}, {"RINGFENCE_WORLD_SIZE", "1"}, {"RINGFENCE_STORE_ADDR", "nohost"}}));
               }),
               Catch::Contains("RINGFENCE_STORE_ADDR"));
}

TEST_CASE("token hex round trip", "[env]") {
  const auto t = parse_token(kToken);
  REQUIRE(t.has_value());
  REQUIRE(to_hex(*t) == kToken);
  REQUIRE_FALSE(parse_token("0011").has_value());
  REQUIRE_FALSE(parse_token("zz112233445566778899aabbccddeeff").has_value());
}

TEST_CASE("unknown RINGFENCE_* variables are reported", "[env]") {
  const auto unknown = unknown_variables(env({{"RINGFENCE_TIMEOUT_MS", "5"}, {"RINGFENCE_TIMEOUT", "5"}, {"OTHER", "1"}}), {});
  REQUIRE(unknown == std::vector<std::string>{"RINGFENCE_TIMEOUT"});
  // The warning every entry point logs: the name once, the caller's prefix, nothing for known names.
  test::CapturedLog log(LogLevel::Warn);
  warn_unknown_variables(*log.get(), env({{"RINGFENCE_TIMEOUT_MS", "5"}, {"RINGFENCE_TIMEOUT", "5"}, {"RINGFENCE_SHM_SPIN", "9"}}),
                         {"RINGFENCE_SHM_SPIN"}, "nccl shim: ");
  const std::string text = log.text();
  REQUIRE_THAT(text, Catch::Contains("nccl shim: ignoring unknown environment variable RINGFENCE_TIMEOUT (typo?)"));
  REQUIRE(text.find("RINGFENCE_TIMEOUT (typo?)") == text.rfind("RINGFENCE_TIMEOUT (typo?)"));
  REQUIRE(text.find("RINGFENCE_TIMEOUT_MS") == std::string::npos);
  REQUIRE(text.find("RINGFENCE_SHM_SPIN") == std::string::npos);
}

TEST_CASE("health thresholds load from a config file named by RINGFENCE_HEALTH_CONFIG", "[env][health]") {
  const std::string path = "/tmp/ringfence-health-config-test.conf";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fputs("# tuned\nnvlink_crc_fence_per_s = 20\n  checksum_storm_count=2 # inline comment\nfence_cooldown_ms = 5000\n"
               "window_ms = 30000\nsysfs_root = /tmp/fake\n",
               f);
    std::fclose(f);
  }
  const CommOptions o = CommOptions::from_env(env({{"RINGFENCE_HEALTH_CONFIG", path}, {"RINGFENCE_SYSFS_ROOT", "/override"}}));
  REQUIRE(o.health.thresholds.nvlink_crc_fence_per_s == 20.0);
  REQUIRE(o.health.thresholds.checksum_storm_count == 2);
  REQUIRE(o.health.timings.fence_cooldown == std::chrono::milliseconds(5000));
  REQUIRE(o.health.window == std::chrono::milliseconds(30000));
  REQUIRE(o.health.sysfs_root == "/override");  // the single variable wins over the file
  // Errors name the file, the line and the key.
  health::HealthOptions h;
  REQUIRE_THAT(error_of([&] { health::apply_health_config("a = 1\n", h, "x.conf"); }),
               Catch::Contains("x.conf:1") && Catch::Contains("unknown key 'a'"));
  REQUIRE_THAT(error_of([&] { health::apply_health_config("\nfence_cooldown_ms = soon\n", h, "x.conf"); }),
               Catch::Contains("x.conf:2") && Catch::Contains("fence_cooldown_ms"));
  REQUIRE_THAT(error_of([&] { health::apply_health_config("just words\n", h, "x.conf"); }), Catch::Contains("key = value"));
  REQUIRE_THROWS_AS(CommOptions::from_env(env({{"RINGFENCE_HEALTH_CONFIG", "/nonexistent/ringfence.conf"}})), SystemError);
  std::remove(path.c_str());
}
