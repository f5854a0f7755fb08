// sysfs source against fake trees: enumeration, parsing, saturated / wrapped / reset /
// unreadable / missing counters, AER and link training.
#include <ringfence/error.hpp>
#include <ringfence/health/counters.hpp>
#include <ringfence/health/sysfs_source.hpp>

#include "support/catch.hpp"
#include "support/temp_dir.hpp"

using namespace ringfence;
using namespace ringfence::health;
using namespace std::chrono_literals;
using ringfence::test::TempDir;

namespace {

const TimePoint t0 = TimePoint{} + 1000s;

const char* kAerCorrectable =
    "RxErr 0\nBadTLP 2\nBadDLLP 1\nRollover 0\nTimeout 0\nNonFatalErr 0\nCorrIntErr 0\nHeaderOF 0\n"
    "TOTAL_ERR_COR 3\n";
const char* kAerFatal =
    "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nCmpltAbrt 0\nUnxCmplt 0\nRxOF 0\nMalfTLP 0\nECRC 0\n"
    "UnsupReq 0\nACSViol 0\nUncorrIntErr 0\nBlockedTLP 0\nAtomicOpBlocked 0\nTLPBlockedErr 0\n"
    "PoisonTLPBlocked 0\nTOTAL_ERR_FATAL 0\n";

// A fake sysfs with one HDR port on mlx5_0, two ports on mlx5_1, and two PCI devices (one
// with AER files, one without).
struct FakeSysfs {
  TempDir dir{"ringfence-sysfs"};

  std::string port_dir(const std::string& dev, int port) const {
    return "sys/class/infiniband/" + dev + "/ports/" + std::to_string(port);
  }
  void port(const std::string& dev, int p) const {
    const std::string d = port_dir(dev, p);
    for (const IbCounterSpec& c : kIbErrorCounters) dir.write(d + "/counters/" + std::string(c.name), "0\n");
    dir.write(d + "/state", "4: ACTIVE\n");
    dir.write(d + "/phys_state", "5: LinkUp\n");
    dir.write(d + "/rate", "200 Gb/sec (4X HDR)\n");
  }
  void counter(const std::string& dev, int p, const std::string& name, const std::string& value) const {
    dir.write(port_dir(dev, p) + "/counters/" + name, value);
  }
  void hw(const std::string& dev, int p, const std::string& name, const std::string& value) const {
    dir.write(port_dir(dev, p) + "/hw_counters/" + name, value);
  }
  std::string pci(const std::string& bdf) const { return "sys/bus/pci/devices/" + bdf; }

  FakeSysfs() {
    port("mlx5_0", 1);
    port("mlx5_1", 1);
    port("mlx5_1", 2);
    hw("mlx5_0", 1, "out_of_sequence", "0\n");
    hw("mlx5_0", 1, "rp_cnp_handled", "5\n");
    hw("mlx5_0", 1, "lifespan", "10\n");
    const std::string g = pci("0000:3b:00.0");
    dir.write(g + "/aer_dev_correctable", kAerCorrectable);
    dir.write(g + "/aer_dev_nonfatal", "Undefined 0\nDLP 0\nTOTAL_ERR_NONFATAL 0\n");
    dir.write(g + "/aer_dev_fatal", kAerFatal);
    dir.write(g + "/current_link_speed", "32.0 GT/s PCIe\n");
    dir.write(g + "/max_link_speed", "32.0 GT/s PCIe\n");
    dir.write(g + "/current_link_width", "16\n");
    dir.write(g + "/max_link_width", "16\n");
    dir.write(pci("0000:00:1f.0") + "/vendor", "0x8086\n");  // no AER: not watched by default
  }
};

CounterReading find(const std::vector<std::pair<std::string, CounterReading>>& v, const std::string& name) {
  for (const auto& [n, r] : v)
    if (n == name) return r;
  FAIL("no counter " << name);
  return {};
}

}  // namespace

TEST_CASE("sysfs text parsers", "[health][sysfs]") {
  REQUIRE(parse_counter_text("123\n") == 123u);
  REQUIRE(parse_counter_text(" 18446744073709551615 ") == UINT64_MAX);
  REQUIRE_FALSE(parse_counter_text("N/A (no PMA)\n"));
  REQUIRE_FALSE(parse_counter_text(""));
  REQUIRE_FALSE(parse_counter_text("-1"));
  REQUIRE_FALSE(parse_counter_text("12abc"));
  REQUIRE_FALSE(parse_counter_text("18446744073709551616"));
  REQUIRE(parse_state_text("4: ACTIVE\n") == 4);
  REQUIRE(parse_state_text("5: LinkUp") == 5);
  REQUIRE_FALSE(parse_state_text("ACTIVE"));
  auto [gbps, width] = parse_rate_text("200 Gb/sec (4X HDR)\n");
  REQUIRE(gbps == 200.0);
  REQUIRE(width == 4);
  std::tie(gbps, width) = parse_rate_text("2.5 Gb/sec (1X SDR)");
  REQUIRE(gbps == 2.5);
  REQUIRE(width == 1);
  std::tie(gbps, width) = parse_rate_text("garbage");
  REQUIRE_FALSE(gbps);
  REQUIRE(parse_pcie_speed_text("32.0 GT/s PCIe\n") == 32.0);
  REQUIRE(parse_pcie_speed_text("8 GT/s") == 8.0);
  REQUIRE_FALSE(parse_pcie_speed_text("Unknown"));
  const AerCounters aer = parse_aer_text("Receiver Error 2\nBad TLP 1\nbroken\nTOTAL_ERR_COR x\n");
  REQUIRE(aer.size() == 4);
  REQUIRE(aer[0].first == "Receiver Error");
  REQUIRE(aer[0].second.value == 2u);
  REQUIRE_FALSE(aer[2].second.value);  // "broken": no count
  REQUIRE(aer[3].first == "TOTAL_ERR_COR");
  REQUIRE_FALSE(aer[3].second.value);
  REQUIRE(mlx5_hw_counter_width("out_of_sequence") == 32);
  REQUIRE(mlx5_hw_counter_width("np_cnp_sent") == 64);
  REQUIRE(mlx5_hw_counter_width("something_new") == 0);
}

TEST_CASE("sysfs source enumerates ports and AER-capable PCI devices", "[health][sysfs]") {
  FakeSysfs fake;
  const SysfsSource src(fake.dir.str());
  REQUIRE(src.ib_ports() == std::vector<IbPort>{{"mlx5_0", 1}, {"mlx5_1", 1}, {"mlx5_1", 2}});
  REQUIRE(src.pci_devices() == std::vector<std::string>{"0000:3b:00.0"});
  // An explicit device list is kept as given, even for absent devices (they read as unknown).
  const SysfsSource listed(fake.dir.str(), {"0000:99:00.0"});
  REQUIRE(listed.pci_devices() == std::vector<std::string>{"0000:99:00.0"});
  const PcieSample absent = listed.sample_pcie("0000:99:00.0");
  REQUIRE_FALSE(absent.total("fatal").value);
  REQUIRE_FALSE(absent.downtrained().has_value());
  // An empty root has nothing, which is not an error; a root that is not a directory is.
  TempDir empty;
  REQUIRE(SysfsSource(empty.str()).ib_ports().empty());
  REQUIRE_THROWS_AS(SysfsSource(empty.str() + "/does-not-exist"), InvalidUsage);
}

TEST_CASE("sysfs source reads IB counters, state and rate", "[health][sysfs]") {
  FakeSysfs fake;
  fake.counter("mlx5_0", 1, "symbol_error", "17\n");
  fake.counter("mlx5_0", 1, "link_downed", "N/A (no PMA)\n");
  fake.counter("mlx5_0", 1, "port_rcv_errors", "junk\n");
  fake.dir.remove(fake.port_dir("mlx5_0", 1) + "/counters/port_xmit_discards");
  const SysfsSource src(fake.dir.str());
  const IbPortSample s = src.sample_ib({"mlx5_0", 1});
  REQUIRE(s.counters.size() == 8);
  const CounterReading sym = find(s.counters, "symbol_error");
  REQUIRE(sym.value == 17u);
  REQUIRE(sym.width_bits == 16);
  REQUIRE(sym.saturates);
  REQUIRE(find(s.counters, "link_error_recovery").value == 0u);
  REQUIRE(find(s.counters, "link_downed").width_bits == 8);
  REQUIRE_FALSE(find(s.counters, "link_downed").value);         // N/A (no PMA)
  REQUIRE_FALSE(find(s.counters, "port_rcv_errors").value);     // unparsable
  REQUIRE_FALSE(find(s.counters, "port_xmit_discards").value);  // missing file
  REQUIRE(find(s.counters, "local_link_integrity_errors").width_bits == 4);
  REQUIRE(s.state == 4);
  REQUIRE(s.phys_state == 5);
  REQUIRE(s.link_up() == true);
  REQUIRE(s.rate_gbps == 200.0);
  REQUIRE(s.rate_width == 4);
  REQUIRE(s.hw_counters.size() == 2);  // lifespan is not a counter
  REQUIRE(s.hw_counters[0].first == "out_of_sequence");
  REQUIRE(s.hw_counters[0].second.width_bits == 32);
  REQUIRE_FALSE(s.hw_counters[0].second.saturates);
  REQUIRE(s.hw_counters[1].second.value == 5u);

  // A port going down, and a port whose state files vanished.
  fake.dir.write(fake.port_dir("mlx5_1", 1) + "/state", "1: DOWN\n");
  fake.dir.write(fake.port_dir("mlx5_1", 1) + "/phys_state", "3: Disabled\n");
  REQUIRE(src.sample_ib({"mlx5_1", 1}).link_up() == false);
  fake.dir.remove(fake.port_dir("mlx5_1", 2) + "/state");
  fake.dir.remove(fake.port_dir("mlx5_1", 2) + "/rate");
  const IbPortSample gone = src.sample_ib({"mlx5_1", 2});
  REQUIRE_FALSE(gone.link_up().has_value());  // unknown, not up
  REQUIRE_FALSE(gone.rate_gbps);
}

TEST_CASE("sysfs source reads AER counters and detects downtraining", "[health][sysfs]") {
  FakeSysfs fake;
  const SysfsSource src(fake.dir.str());
  PcieSample s = src.sample_pcie("0000:3b:00.0");
  REQUIRE(s.correctable.size() == 9);
  REQUIRE(s.total("correctable").value == 3u);
  REQUIRE(s.total("nonfatal").value == 0u);
  REQUIRE(s.total("fatal").value == 0u);
  REQUIRE(s.total("correctable").width_bits == 64);
  REQUIRE(s.current_speed_gts == 32.0);
  REQUIRE(s.downtrained() == false);
  fake.dir.write(fake.pci("0000:3b:00.0") + "/current_link_width", "8\n");
  REQUIRE(src.sample_pcie("0000:3b:00.0").downtrained() == true);
  fake.dir.write(fake.pci("0000:3b:00.0") + "/current_link_width", "16\n");
  fake.dir.write(fake.pci("0000:3b:00.0") + "/current_link_speed", "16.0 GT/s PCIe\n");
  REQUIRE(src.sample_pcie("0000:3b:00.0").downtrained() == true);
  fake.dir.write(fake.pci("0000:3b:00.0") + "/current_link_speed", "Unknown\n");
  REQUIRE_FALSE(src.sample_pcie("0000:3b:00.0").downtrained().has_value());
  // A missing AER file: the TOTAL is unknown, and read_counters still reports it (as unknown).
  fake.dir.remove(fake.pci("0000:3b:00.0") + "/aer_dev_fatal");
  s = src.sample_pcie("0000:3b:00.0");
  REQUIRE(s.fatal.empty());
  REQUIRE_FALSE(s.total("fatal").value);
  bool found = false;
  for (const auto& [id, r] : src.read_counters())
    if (id.source == "pcie" && id.name == "aer_dev_fatal/TOTAL_ERR_FATAL") {
      found = true;
      REQUIRE_FALSE(r.value);
    }
  REQUIRE(found);
}

TEST_CASE("sysfs counters through a bank: saturated, wrapped, reset, unreadable", "[health][sysfs]") {
  FakeSysfs fake;
  const SysfsSource src(fake.dir.str());
  CounterBank bank(60s);
  const CounterId sym{"ib", "mlx5_0", 1, "symbol_error"};
  const CounterId rcv{"ib", "mlx5_0", 1, "port_rcv_errors"};
  const CounterId downed{"ib", "mlx5_0", 1, "link_downed"};
  const CounterId oos{"ib", "mlx5_0", 1, "hw_counters/out_of_sequence"};
  const CounterId cor{"pcie", "0000:3b:00.0", 0, "aer_dev_correctable/TOTAL_ERR_COR"};

  fake.counter("mlx5_0", 1, "symbol_error", "65530\n");
  fake.counter("mlx5_0", 1, "port_rcv_errors", "40\n");
  fake.hw("mlx5_0", 1, "out_of_sequence", "4294967290\n");
  bank.update(src.read_counters(), t0);

  // Second sweep: symbol_error hits the 16-bit ceiling, out_of_sequence wraps, port_rcv_errors
  // is cleared (reset), link_downed becomes unreadable, AER correctable grows.
  fake.counter("mlx5_0", 1, "symbol_error", "65535\n");
  fake.counter("mlx5_0", 1, "port_rcv_errors", "2\n");
  fake.counter("mlx5_0", 1, "link_downed", "N/A (no PMA)\n");
  fake.hw("mlx5_0", 1, "out_of_sequence", "4\n");
  fake.dir.write(fake.pci("0000:3b:00.0") + "/aer_dev_correctable", "Bad TLP 7\nTOTAL_ERR_COR 7\n");
  bank.update(src.read_counters(), t0 + 1s);

  REQUIRE(bank.find(sym)->last_delta().kind == DeltaKind::Saturated);
  REQUIRE(bank.find(sym)->last_delta().delta == 5u);
  REQUIRE(bank.find(oos)->last_delta().kind == DeltaKind::Wrapped);
  REQUIRE(bank.find(oos)->last_delta().delta == 10u);
  REQUIRE(bank.find(rcv)->last_delta().kind == DeltaKind::Reset);
  REQUIRE(bank.find(rcv)->last_delta().delta == 2u);
  REQUIRE(bank.find(downed)->last_delta().kind == DeltaKind::Unreadable);
  REQUIRE(bank.find(cor)->last_delta().delta == 4u);

  // Third sweep: symbol_error stays stuck at the ceiling: unknown, not zero.
  bank.update(src.read_counters(), t0 + 2s);
  REQUIRE(bank.find(sym)->last_delta().kind == DeltaKind::Saturated);
  REQUIRE_FALSE(bank.find(sym)->last_delta().delta);
  const WindowStats st = *bank.stats(sym, t0 + 2s);
  REQUIRE(st.saturated);
  REQUIRE_FALSE(st.complete);
  REQUIRE(st.sum == 5u);

  // The whole counters directory disappears (driver unloaded): every reading unknown.
  std::filesystem::remove_all(fake.dir.path() / fake.port_dir("mlx5_0", 1) / "counters");
  bank.update(src.read_counters(), t0 + 3s);
  REQUIRE(bank.find(rcv)->last_delta().kind == DeltaKind::Unreadable);
  REQUIRE_FALSE(bank.stats(downed, t0 + 3s)->sum);
}
