// NVML source against the fake NVML library (tests/support/fake_nvml.cpp): normal readings,
// unsupported features, a counter storm that fences one NVLink, and a missing library.
#include <stdlib.h>

#include <ringfence/health/counters.hpp>
#include <ringfence/health/nvml_source.hpp>
#include <ringfence/health/policy.hpp>

#include "support/catch.hpp"
#include "support/temp_dir.hpp"

using namespace ringfence::health;
using namespace std::chrono_literals;
using ringfence::test::TempDir;

namespace {

const TimePoint t0 = TimePoint{} + 1000s;

// Points the fake at a state file in a scratch directory for the lifetime of the object.
struct FakeNvml {
  TempDir dir{"ringfence-nvml"};
  std::string path = (dir.path() / "state").string();
  explicit FakeNvml(const std::string& state) {
    write(state);
    ::setenv("RINGFENCE_FAKE_NVML_STATE", path.c_str(), 1);
  }
  ~FakeNvml() { ::unsetenv("RINGFENCE_FAKE_NVML_STATE"); }
  void write(const std::string& state) const { dir.write("state", state); }
};

}  // namespace

TEST_CASE("NVML source reads the fake NVML's devices, links and counters", "[health][nvml]") {
  FakeNvml fake(
      "count 2\nlinks 3\n"
      "d0.l0.crc_flit 11\nd0.l0.crc_data 12\nd0.l0.replay 13\nd0.l0.recovery 14\n"
      "d0.l2.state 0\nd0.l1.crc_data NS\n"
      "d0.ecc_corrected 5\nd0.ecc_uncorrected 0\nd0.pcie_replay 7\nd0.remapped_cor 2\n"
      "d1.nvlink NS\nd1.remapped NS\nd1.ecc_corrected NS\nd1.ecc_uncorrected NS\n");
  NvmlSource nvml(RINGFENCE_FAKE_NVML_PATH);
  REQUIRE(nvml.available());
  REQUIRE(nvml.unavailable_reason().empty());
  REQUIRE(nvml.device_count() == 2);

  const NvmlDeviceSample d0 = nvml.sample(0);
  REQUIRE(d0.links.size() == 3);
  REQUIRE(d0.links[0].active == true);
  REQUIRE(d0.links[2].active == false);
  REQUIRE(d0.links[0].crc_flit.value == 11u);
  REQUIRE(d0.links[0].crc_data.value == 12u);
  REQUIRE(d0.links[0].replay.value == 13u);
  REQUIRE(d0.links[0].recovery.value == 14u);
  REQUIRE(d0.links[0].crc_flit.width_bits == 64);
  REQUIRE_FALSE(d0.links[1].crc_data.value);  // NOT_SUPPORTED in one field entry only
  REQUIRE(d0.links[1].crc_flit.value == 0u);
  REQUIRE(d0.ecc_corrected.value == 5u);
  REQUIRE(d0.ecc_uncorrected.value == 0u);
  REQUIRE(d0.pcie_replay.value == 7u);
  REQUIRE(d0.remapped_correctable.value == 2u);
  REQUIRE(d0.remap_failure == false);

  const NvmlDeviceSample d1 = nvml.sample(1);
  REQUIRE(d1.links.empty());  // NVLink not supported
  REQUIRE_FALSE(d1.ecc_corrected.value);
  REQUIRE_FALSE(d1.ecc_uncorrected.value);
  REQUIRE_FALSE(d1.remapped_correctable.value);
  REQUIRE_FALSE(d1.remap_failure.has_value());

  const NvmlDeviceSample none = nvml.sample(7);  // out of range: all unknown
  REQUIRE(none.links.empty());
  REQUIRE_FALSE(none.pcie_replay.value);

  // Flat counters: 3 links x 4 + 5 device-wide on GPU 0, 5 device-wide on GPU 1.
  const std::vector<CounterSample> flat = nvml.read_counters();
  REQUIRE(flat.size() == 3 * 4 + 5 + 5);
  REQUIRE(flat.front().first == CounterId{"nvml", "0", 0, "nvlink_crc_flit"});

  // A second session in the same process shares the library; closing it keeps the first usable.
  { NvmlSource other(RINGFENCE_FAKE_NVML_PATH); REQUIRE(other.available()); }
  REQUIRE(nvml.sample(0).links.size() == 3);
}

TEST_CASE("a counter storm on the fake NVML fences exactly the stormy link", "[health][nvml][policy]") {
  FakeNvml fake("count 1\nlinks 2\n");
  NvmlSource nvml(RINGFENCE_FAKE_NVML_PATH);
  REQUIRE(nvml.available());
  HealthOptions opts;
  opts.window = 10s;
  CounterBank bank(opts.window);
  LinkPolicy link0(opts), link1(opts);

  auto observe = [&](TimePoint now) {
    bank.update(nvml.read_counters(), now);
    const NvmlDeviceSample s = nvml.sample(0);
    for (int l = 0; l < 2; ++l) {
      Evidence e;
      add_nvml_evidence(e, bank, "0", l, now);
      e.nvlink_active = s.links[static_cast<std::size_t>(l)].active;
      (void)(l == 0 ? link0 : link1).observe(e, now);
    }
  };

  // Ten clean seconds: counters flat, both links healthy.
  for (int s = 0; s <= 10; ++s) observe(t0 + s * 1s);
  REQUIRE(link0.health() == LinkHealth::Healthy);
  REQUIRE(link1.health() == LinkHealth::Healthy);

  // Link 1 starts taking 500 CRC flit errors per second (>= 100/s: DCGM fail).
  std::uint64_t crc = 0;
  for (int s = 11; s <= 13; ++s) {
    crc += 500;
    fake.write("count 1\nlinks 2\nd0.l1.crc_flit " + std::to_string(crc) + "\n");
    observe(t0 + s * 1s);
  }
  REQUIRE(link1.state() == LinkState::Fenced);
  REQUIRE_THAT(link1.last_verdict().reasons.front(), Catch::Contains("nvlink crc"));
  REQUIRE(link0.state() == LinkState::Healthy);

  // A single replay on link 0 is a DCGM fail too.
  fake.write("count 1\nlinks 2\nd0.l1.crc_flit " + std::to_string(crc) + "\nd0.l0.replay 1\n");
  observe(t0 + 14s);
  REQUIRE(link0.state() == LinkState::Fenced);
}

TEST_CASE("an uncorrectable ECC error fences the links of its GPU", "[health][nvml][policy]") {
  FakeNvml fake("count 1\nlinks 1\n");
  NvmlSource nvml(RINGFENCE_FAKE_NVML_PATH);
  CounterBank bank(60s);
  LinkPolicy link;
  auto observe = [&](TimePoint now) {
    bank.update(nvml.read_counters(), now);
    Evidence e;
    add_nvml_evidence(e, bank, "0", 0, now);
    return link.observe(e, now);
  };
  (void)observe(t0);
  (void)observe(t0 + 1s);
  REQUIRE(link.health() == LinkHealth::Healthy);
  fake.write("count 1\nlinks 1\nd0.ecc_uncorrected 1\n");
  const auto t = observe(t0 + 2s);
  REQUIRE(t);
  REQUIRE(t->to == LinkState::Fenced);
}

TEST_CASE("missing or broken NVML is unknown, never healthy", "[health][nvml]") {
  SECTION("library not found") {
    NvmlSource nvml("/nonexistent/libnvidia-ml.so.1");
    REQUIRE_FALSE(nvml.available());
    REQUIRE_THAT(nvml.unavailable_reason(), Catch::Contains("dlopen"));
    REQUIRE(nvml.device_count() == 0);
    REQUIRE(nvml.read_counters().empty());
    const NvmlDeviceSample s = nvml.sample(0);
    REQUIRE_FALSE(s.ecc_uncorrected.value);
    REQUIRE_FALSE(s.pcie_replay.value);
    // A link judged only by this source reports unknown health and never fences or heals.
    CounterBank bank;
    LinkPolicy link;
    for (int i = 0; i < 100; ++i) {
      bank.update(nvml.read_counters(), t0 + i * 1s);
      Evidence e;
      add_nvml_evidence(e, bank, "0", 0, t0 + i * 1s);
      REQUIRE_FALSE(link.observe(e, t0 + i * 1s));
    }
    REQUIRE(link.health() == LinkHealth::Unknown);
  }
  SECTION("library without the NVML symbols") {
    NvmlSource nvml("libm.so.6");
    REQUIRE_FALSE(nvml.available());
    REQUIRE_THAT(nvml.unavailable_reason(), Catch::Contains("nvmlInit"));
  }
  SECTION("nvmlInit fails (driver not loaded)") {
    FakeNvml fake("init 9\n");
    NvmlSource nvml(RINGFENCE_FAKE_NVML_PATH);
    REQUIRE_FALSE(nvml.available());
    REQUIRE_THAT(nvml.unavailable_reason(), Catch::Contains("9"));
    REQUIRE(nvml.device_count() == 0);
  }
}
