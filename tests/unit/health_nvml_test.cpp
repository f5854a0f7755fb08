// NVML source against the fake NVML library (tests/support/fake_nvml.cpp): normal readings,
// unsupported features, a counter storm that fences one NVLink, a missing library, Xid events
// (classification, delivery, unknown cases, a fatal Xid that fences) and NVLink topology.
#include <dlfcn.h>
#include <stdlib.h>

#include <algorithm>
#include <ringfence/health/counters.hpp>
#include <ringfence/health/nvml_source.hpp>
#include <ringfence/health/policy.hpp>

#include "support/catch.hpp"
#include "support/fake_nvml_state.hpp"

using namespace ringfence::health;
using namespace std::chrono_literals;
using ringfence::test::FakeNvmlState;

namespace {

const TimePoint t0 = TimePoint{} + 1000s;

// Points the fake at a state file in a scratch directory for the lifetime of the object.
struct FakeNvml : FakeNvmlState {
  explicit FakeNvml(const std::string& state) : FakeNvmlState("ringfence-nvml", state) {}
};

// The fake's test hook: event sets created and not yet freed (global in the fake library,
// which this process shares with every NvmlSource loading the same path).
int open_event_sets() {
  void* lib = ::dlopen(RINGFENCE_FAKE_NVML_PATH, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib != nullptr);
  auto fn = reinterpret_cast<int (*)()>(::dlsym(lib, "ringfenceFakeNvmlOpenEventSets"));
  REQUIRE(fn != nullptr);
  const int n = fn();
  ::dlclose(lib);  // the NvmlSource under test keeps its own reference
  return n;
}

// The reading of counter {"nvml", gpu, 0, name} in a flat sweep; fails the test when absent.
CounterReading reading(const std::vector<CounterSample>& flat, const std::string& gpu, const std::string& name) {
  const auto it = std::find_if(flat.begin(), flat.end(), [&](const CounterSample& c) {
    return c.first == CounterId{"nvml", gpu, 0, name};
  });
  REQUIRE(it != flat.end());
  return it->second;
}

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

  // Flat counters: 3 links x 4 + 7 device-wide on GPU 0, 7 device-wide on GPU 1.
  const std::vector<CounterSample> flat = nvml.read_counters();
  REQUIRE(flat.size() == 3 * 4 + 7 + 7);
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
  REQUIRE(link1.state() == PolicyState::Fenced);
  REQUIRE_THAT(link1.last_verdict().reasons.front(), Catch::Contains("nvlink crc"));
  REQUIRE(link0.state() == PolicyState::Healthy);

  // A single replay on link 0 is a DCGM fail too.
  fake.write("count 1\nlinks 2\nd0.l1.crc_flit " + std::to_string(crc) + "\nd0.l0.replay 1\n");
  observe(t0 + 14s);
  REQUIRE(link0.state() == PolicyState::Fenced);
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
  REQUIRE(t->to == PolicyState::Fenced);
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
    REQUIRE_FALSE(s.xid_fatal.value);
    REQUIRE_FALSE(nvml.xid_events_registered(0));
    REQUIRE(nvml.poll_xid_events().empty());
    REQUIRE_FALSE(nvml.pci_bus_id(0));
    REQUIRE(nvml.nvlink_peers(0).empty());
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

TEST_CASE("Xids are classified as DCGM's health watches do", "[health][nvml]") {
  for (unsigned long long x : {48, 64, 74, 79, 95, 119, 120, 140}) {
    INFO("Xid " << x);
    REQUIRE(classify_xid(x) == XidSeverity::Fail);
  }
  for (unsigned long long x : {38, 39, 42, 67, 73, 121, 137, 31, 32, 43, 63, 94}) {
    INFO("Xid " << x);
    REQUIRE(classify_xid(x) == XidSeverity::Warn);
  }
  // Application faults, the unknown Xid 999, 0 and numbers next to the listed ones are ignored.
  for (unsigned long long x : {0ull,   1ull,   13ull,  33ull,  37ull,  40ull,  41ull,  44ull,  45ull,         47ull,
                               49ull,  62ull,  65ull,  68ull,  69ull,  75ull,  78ull,  80ull,  93ull,         96ull,
                               118ull, 122ull, 136ull, 138ull, 139ull, 141ull, 154ull, 999ull, 0x100000030ull}) {
    INFO("Xid " << x);
    REQUIRE(classify_xid(x) == XidSeverity::Ignore);
  }
  REQUIRE(to_string(XidSeverity::Fail) == "fail");
  REQUIRE(to_string(XidSeverity::Warn) == "warn");
  REQUIRE(to_string(XidSeverity::Ignore) == "ignore");
}

TEST_CASE("Xid events of the fake NVML are delivered once and counted by severity", "[health][nvml]") {
  // Xids that happened before the source registered its event set are not seen (as in NVML).
  FakeNvml fake("count 2\nlinks 1\nd0.xids 79\n");
  const int sets_before = open_event_sets();
  NvmlSource nvml(RINGFENCE_FAKE_NVML_PATH);
  REQUIRE(nvml.available());
  REQUIRE(open_event_sets() == sets_before + 1);
  REQUIRE(nvml.xid_events_registered(0));
  REQUIRE(nvml.xid_events_registered(1));
  REQUIRE_FALSE(nvml.xid_events_registered(2));
  REQUIRE(nvml.poll_xid_events().empty());
  std::vector<CounterSample> flat = nvml.read_counters();
  REQUIRE(reading(flat, "0", "xid_fatal") == CounterReading::known(0, 64));
  REQUIRE(reading(flat, "0", "xid_warn") == CounterReading::known(0, 64));
  REQUIRE(reading(flat, "1", "xid_fatal") == CounterReading::known(0, 64));

  // 74 fatal, 13 ignored, 43 warn on GPU 0; 94 warn and 999 (unknown Xid) ignored on GPU 1.
  fake.write("count 2\nlinks 1\nd0.xids 79 74 13 43\nd1.xids 94, 999\n");
  const std::vector<XidEvent> ev = nvml.poll_xid_events();
  REQUIRE(ev.size() == 5);
  REQUIRE(ev[0].gpu == 0u);
  REQUIRE(ev[0].xid == 74u);
  REQUIRE(ev[0].severity == XidSeverity::Fail);
  REQUIRE(ev[1].xid == 13u);
  REQUIRE(ev[1].severity == XidSeverity::Ignore);
  REQUIRE(ev[2].xid == 43u);
  REQUIRE(ev[2].severity == XidSeverity::Warn);
  REQUIRE(ev[3].gpu == 1u);
  REQUIRE(ev[3].xid == 94u);
  REQUIRE(ev[3].severity == XidSeverity::Warn);
  REQUIRE(ev[4].gpu == 1u);
  REQUIRE(ev[4].xid == 999u);
  REQUIRE(ev[4].severity == XidSeverity::Ignore);
  REQUIRE(nvml.poll_xid_events().empty());  // delivered once

  NvmlDeviceSample d0 = nvml.sample(0);
  REQUIRE(d0.xid_fatal == CounterReading::known(1, 64));
  REQUIRE(d0.xid_warn == CounterReading::known(1, 64));
  REQUIRE(d0.last_fatal_xid == 74u);
  REQUIRE(d0.last_warn_xid == 43u);
  const NvmlDeviceSample d1 = nvml.sample(1);
  REQUIRE(d1.xid_fatal == CounterReading::known(0, 64));
  REQUIRE(d1.xid_warn == CounterReading::known(1, 64));
  REQUIRE_FALSE(d1.last_fatal_xid);
  REQUIRE(d1.last_warn_xid == 94u);

  // read_counters drains by itself; counts are cumulative since the session started.
  fake.write("count 2\nlinks 1\nd0.xids 79 74 13 43 48 31\nd1.xids 94, 999\n");
  flat = nvml.read_counters();
  REQUIRE(reading(flat, "0", "xid_fatal").value == 2u);
  REQUIRE(reading(flat, "0", "xid_warn").value == 2u);
  REQUIRE(reading(flat, "1", "xid_fatal").value == 0u);
  REQUIRE(reading(flat, "1", "xid_warn").value == 1u);
  d0 = nvml.sample(0);
  REQUIRE(d0.last_fatal_xid == 48u);
  REQUIRE(d0.last_warn_xid == 31u);

  // A second session gets its own event set: it sees only Xids raised after it registered.
  {
    NvmlSource other(RINGFENCE_FAKE_NVML_PATH);
    REQUIRE(open_event_sets() == sets_before + 2);
    REQUIRE(other.poll_xid_events().empty());
    fake.write("count 2\nlinks 1\nd0.xids 79 74 13 43 48 31 95\nd1.xids 94, 999\n");
    REQUIRE(other.sample(0).xid_fatal.value == 1u);
  }
  REQUIRE(open_event_sets() == sets_before + 1);  // the destructor freed its set
  REQUIRE(nvml.sample(0).xid_fatal.value == 3u);  // the first session sees 95 as well
}

TEST_CASE("Xid counts are unknown when events cannot be registered or drained", "[health][nvml]") {
  const int sets_before = open_event_sets();
  SECTION("nvmlDeviceRegisterEvents returns NOT_SUPPORTED") {
    FakeNvml fake("count 1\nevents NS\nd0.ecc_uncorrected 0\n");
    NvmlSource nvml(RINGFENCE_FAKE_NVML_PATH);
    REQUIRE(nvml.available());
    REQUIRE_FALSE(nvml.xid_events_registered(0));
    REQUIRE(open_event_sets() == sets_before);  // the unused set was freed
    fake.write("count 1\nevents NS\nd0.xids 74\n");
    REQUIRE(nvml.poll_xid_events().empty());
    const std::vector<CounterSample> flat = nvml.read_counters();
    REQUIRE(reading(flat, "0", "xid_fatal") == CounterReading::unknown(64));
    REQUIRE(reading(flat, "0", "xid_warn") == CounterReading::unknown(64));
    REQUIRE(reading(flat, "0", "ecc_uncorrected").value == 0u);  // the rest still reads
  }
  SECTION("one GPU without event support") {
    FakeNvml fake("count 3\nd1.events NS\nd2.event_types 0x3\n");
    NvmlSource nvml(RINGFENCE_FAKE_NVML_PATH);
    REQUIRE(nvml.xid_events_registered(0));
    REQUIRE_FALSE(nvml.xid_events_registered(1));  // NOT_SUPPORTED from RegisterEvents
    REQUIRE_FALSE(nvml.xid_events_registered(2));  // Xid not among the supported event types
    fake.write("count 3\nd1.events NS\nd2.event_types 0x3\nd0.xids 74\nd1.xids 74\nd2.xids 74\n");
    REQUIRE(nvml.sample(0).xid_fatal.value == 1u);
    REQUIRE_FALSE(nvml.sample(1).xid_fatal.value);
    REQUIRE_FALSE(nvml.sample(2).xid_fatal.value);
  }
  SECTION("NVML_ERROR_UNKNOWN from registration frees the set") {
    FakeNvml fake("count 2\nevents 999\n");
    NvmlSource nvml(RINGFENCE_FAKE_NVML_PATH);
    REQUIRE_FALSE(nvml.xid_events_registered(0));
    REQUIRE_FALSE(nvml.xid_events_registered(1));
    REQUIRE(open_event_sets() == sets_before);
  }
  SECTION("a library without the event symbols") {
    FakeNvml fake("count 1\nd0.ecc_corrected 3\n");
    NvmlSource nvml(RINGFENCE_FAKE_NVML_NOEVENTS_PATH);
    REQUIRE(nvml.available());
    REQUIRE_FALSE(nvml.xid_events_registered(0));
    REQUIRE(nvml.poll_xid_events().empty());
    const NvmlDeviceSample s = nvml.sample(0);
    REQUIRE_FALSE(s.xid_fatal.value);
    REQUIRE_FALSE(s.xid_warn.value);
    REQUIRE(s.ecc_corrected.value == 3u);
    REQUIRE(nvml.pci_bus_id(0) == "0000:00:00.0");  // the rest of the library still works
  }
  SECTION("a failing drain (GPU lost) makes that read unknown, the next good one counts") {
    FakeNvml fake("count 1\n");
    NvmlSource nvml(RINGFENCE_FAKE_NVML_PATH);
    REQUIRE(nvml.xid_events_registered(0));
    fake.write("count 1\nwait 15\nd0.xids 74\n");
    REQUIRE(nvml.poll_xid_events().empty());
    REQUIRE(reading(nvml.read_counters(), "0", "xid_fatal") == CounterReading::unknown(64));
    fake.write("count 1\nd0.xids 74\n");
    REQUIRE(reading(nvml.read_counters(), "0", "xid_fatal") == CounterReading::known(1, 64));
  }
  REQUIRE(open_event_sets() == sets_before);
}

TEST_CASE("an Xid 74 on the fake NVML fences the links of its GPU", "[health][nvml][policy]") {
  FakeNvml fake("count 2\nlinks 1\n");
  NvmlSource nvml(RINGFENCE_FAKE_NVML_PATH);
  CounterBank bank(60s);
  bank.update(nvml.read_counters(), t0);  // baseline
  fake.write("count 2\nlinks 1\nd0.xids 74\nd1.xids 42\n");
  bank.update(nvml.read_counters(), t0 + 1s);  // delta

  Evidence e0;
  add_nvml_evidence(e0, bank, "0", 0, t0 + 1s);
  REQUIRE(e0.xid_fatal_count == 1u);
  REQUIRE(e0.xid_warn_count == 0u);
  e0.xid_last_fatal = nvml.sample(0).last_fatal_xid;
  Verdict v = evaluate(e0, HealthThresholds{});
  REQUIRE(v.severity == Severity::Fail);
  REQUIRE(v.reasons == std::vector<std::string>{"Xid fatal events 1 >= 1 (DCGM; latest Xid 74)"});
  LinkPolicy link0;
  const auto t = link0.observe(e0, t0 + 1s);
  REQUIRE(t);
  REQUIRE(t->to == PolicyState::Fenced);

  // Xid 42 (PCIe replay) on GPU 1 makes its links suspect only.
  Evidence e1;
  add_nvml_evidence(e1, bank, "1", 0, t0 + 1s);
  REQUIRE(e1.xid_fatal_count == 0u);
  REQUIRE(e1.xid_warn_count == 1u);
  v = evaluate(e1, HealthThresholds{});
  REQUIRE(v.severity == Severity::Warn);
  REQUIRE(v.reasons == std::vector<std::string>{"Xid warn events 1 >= 1 (DCGM)"});

  // 61 s later the event has left the window: clean again.
  bank.update(nvml.read_counters(), t0 + 62s);
  Evidence later;
  add_nvml_evidence(later, bank, "0", 0, t0 + 62s);
  REQUIRE(later.xid_fatal_count == 0u);
}

TEST_CASE("PCI bus ids and NVLink peers from the fake NVML", "[health][nvml][topology]") {
  FakeNvml fake(
      "count 4\nlinks 6\n"
      "d0.bus 00000000:3B:00.0\nd1.bus 0000:3c:00.0\nd2.bus NS\n"
      "d0.l0.remote 00000000:3C:00.0\n"             // NVML's spelling
      "d0.l1.remote 0000:3c:00.0\n"                 // legacy / Linux spelling of the same GPU
      "d0.l2.state 0\nd0.l2.remote 0000:3d:00.0\n"  // inactive: left out
      "d0.l3.remote NS\n"                           // not supported: left out
      "d0.l4.remote garbage\n"                      // unparseable: left out
      "d0.l5.remote 0000:C1:00.0\nd0.l5.type switch\n"  // an NVSwitch
      "d1.nvlink NS\n"
      "d3.l0.type switch\n"                            // a switch with a zeroed far end: still a link
      "d3.l1.type NS\nd3.l1.remote 0000:3b:00.0\n"      // kind not supported: Unknown, named
      "d3.l2.type npu\nd3.l2.remote 0000:00:01.0\n"     // a CPU
      "d3.l4.type unknown\nd3.l4.remote 0000:3d:00.0\n");
  NvmlSource nvml(RINGFENCE_FAKE_NVML_PATH);
  REQUIRE(nvml.pci_bus_id(0) == "0000:3b:00.0");
  REQUIRE(nvml.pci_bus_id(1) == "0000:3c:00.0");
  REQUIRE_FALSE(nvml.pci_bus_id(2));
  REQUIRE(nvml.pci_bus_id(3) == "0000:03:00.0");  // the fake's default "00000000:03:00.0"
  REQUIRE_FALSE(nvml.pci_bus_id(4));              // out of range

  const std::vector<NvLinkPeer> p0 = nvml.nvlink_peers(0);
  using enum NvLinkFarEnd;
  REQUIRE(p0 == std::vector<NvLinkPeer>{{0, "0000:3c:00.0", Gpu}, {1, "0000:3c:00.0", Gpu}, {5, "0000:c1:00.0", Switch}});
  REQUIRE(nvml.nvlink_peers(1).empty());  // NVLink not supported
  // GPU 3: links 3 and 5 are active with a zeroed far end of kind gpu: no peer.
  REQUIRE(nvml.nvlink_peers(3) ==
          std::vector<NvLinkPeer>{{0, "", Switch}, {1, "0000:3b:00.0", Unknown}, {2, "0000:00:01.0", Cpu}, {4, "0000:3d:00.0", Unknown}});
  REQUIRE(nvml.nvlink_peers(9).empty());

  // Ranks 0 (GPU 0), 1 and 2 (both on GPU 1), 3 (GPU 2: bus id unknown).
  std::vector<std::string> bus_of_rank;
  for (unsigned gpu : {0u, 1u, 1u, 2u}) bus_of_rank.push_back(nvml.pci_bus_id(gpu).value_or(""));
  REQUIRE(nvlink_edges(0, 0, p0, bus_of_rank) == std::vector<NvlinkEdge>{{1, 0, 0}, {1, 0, 1}, {2, 0, 0}, {2, 0, 1}});
  // A switch link gives no edge even where its bus id is a rank's GPU (it serves every pair).
  std::vector<NvLinkPeer> via_switch = p0;
  via_switch[0].far_end = Switch;
  REQUIRE(nvlink_edges(0, 0, via_switch, bus_of_rank) == std::vector<NvlinkEdge>{{1, 0, 1}, {2, 0, 1}});
}
