#pragma once
/// \file health/sysfs_source.hpp
/// InfiniBand port counters and state, and PCIe AER counters and link training, read from
/// sysfs under a configurable root (`HealthOptions::sysfs_root`; tests point it at a fake
/// tree). Construction enumerates what exists and may throw; sampling never throws for I/O or
/// parse problems: a missing file, "N/A (no PMA)" or unparsable content is an unknown reading,
/// never a healthy one.

#include <optional>
#include <ringfence/health/counters.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace ringfence::health {

/// One InfiniBand port: `<root>/sys/class/infiniband/<device>/ports/<port>`. Value type.
struct IbPort {
  std::string device;  ///< e.g. "mlx5_0"
  int port = 1;        ///< port number (1-based in sysfs)
  /// Member-wise ordering and equality.
  friend auto operator<=>(const IbPort&, const IbPort&) = default;
};

/// The IBTA PMA PortCounters error counters read from `ports/<p>/counters/` (file names), with
/// their hardware widths (they saturate at all-ones, they do not wrap).
struct IbCounterSpec {
  std::string_view name;  ///< file name under counters/
  int width_bits;         ///< PMA width: 16, 8 or 4
};
/// The eight error counters sampled per port: symbol_error, link_error_recovery, link_downed,
/// port_rcv_errors, port_rcv_remote_physical_errors, port_xmit_discards,
/// local_link_integrity_errors, excessive_buffer_overrun_errors.
extern const IbCounterSpec kIbErrorCounters[8];

/// Width in bits of an mlx5 `hw_counters/` file: 32 for Q counters (firmware values that wrap),
/// 64 for congestion counters (`rp_*`, `np_*`), 0 when the name is not known.
int mlx5_hw_counter_width(std::string_view name) noexcept;

/// One sweep of an IB port. Value type; unknown fields stay nullopt / unknown readings.
struct IbPortSample {
  IbPort port;  ///< which port
  /// The `kIbErrorCounters`, in that order, as (file name, reading). Always 8 entries.
  std::vector<std::pair<std::string, CounterReading>> counters;
  /// Every file under `ports/<p>/hw_counters/` except `lifespan`, sorted by name.
  std::vector<std::pair<std::string, CounterReading>> hw_counters;
  /// Logical state number from `state` ("4: ACTIVE" → 4); nullopt when unreadable.
  std::optional<int> state;
  /// Physical state number from `phys_state` ("5: LinkUp" → 5); nullopt when unreadable.
  std::optional<int> phys_state;
  /// Rate in Gb/s from `rate` ("200 Gb/sec (4X HDR)" → 200); nullopt when unreadable.
  std::optional<double> rate_gbps;
  /// Lane count from `rate` ("4X" → 4); nullopt when absent.
  std::optional<int> rate_width;
  /// True when state is ACTIVE (4) and phys_state is LinkUp (5); false when either is known
  /// and different; nullopt when either is unknown.
  std::optional<bool> link_up() const;
};

/// One AER file (`aer_dev_correctable`, `aer_dev_nonfatal`, `aer_dev_fatal`) parsed: one
/// reading per "NAME count" line in file order, TOTAL_ERR_* included. Empty when the file is
/// missing; a malformed line gives an unknown reading under its name (or under "?").
using AerCounters = std::vector<std::pair<std::string, CounterReading>>;

/// One sweep of a PCI device `<root>/sys/bus/pci/devices/<bdf>`. Value type.
struct PcieSample {
  std::string bdf;         ///< e.g. "0000:3b:00.0"
  AerCounters correctable;  ///< aer_dev_correctable
  AerCounters nonfatal;     ///< aer_dev_nonfatal
  AerCounters fatal;        ///< aer_dev_fatal
  std::optional<double> current_speed_gts;  ///< current_link_speed in GT/s ("32.0 GT/s PCIe" → 32)
  std::optional<double> max_speed_gts;      ///< max_link_speed in GT/s
  std::optional<int> current_width;         ///< current_link_width (lanes)
  std::optional<int> max_width;             ///< max_link_width (lanes)
  /// The TOTAL_ERR_COR / TOTAL_ERR_NONFATAL / TOTAL_ERR_FATAL reading of the matching file;
  /// unknown when the file or its TOTAL line is missing. `which` is "correctable", "nonfatal"
  /// or "fatal".
  CounterReading total(std::string_view which) const;
  /// True when the link trained below its maximum speed or width; false when both are known
  /// and at maximum; nullopt when any of the four values is unknown.
  std::optional<bool> downtrained() const;
};

/// Parses one decimal counter file's content ("123\n"). nullopt for anything else ("N/A (no
/// PMA)", empty, negative, trailing junk, overflow). Thread-safe, never throws.
std::optional<std::uint64_t> parse_counter_text(std::string_view text) noexcept;
/// Parses "<n>: <NAME>" (IB `state` / `phys_state`) to n. Thread-safe, never throws.
std::optional<int> parse_state_text(std::string_view text) noexcept;
/// Parses an IB `rate` ("200 Gb/sec (4X HDR)", "2.5 Gb/sec (1X SDR)") to Gb/s and lane count.
/// Thread-safe, never throws.
std::pair<std::optional<double>, std::optional<int>> parse_rate_text(std::string_view text) noexcept;
/// Parses a PCIe link speed ("32.0 GT/s PCIe", "8 GT/s", "2.5 GT/s") to GT/s; nullopt for
/// "Unknown" and junk. Thread-safe, never throws.
std::optional<double> parse_pcie_speed_text(std::string_view text) noexcept;
/// Parses an AER file's content (see `AerCounters`); counters are 64-bit (kernel u64), never
/// wrap. May throw only `std::bad_alloc`.
AerCounters parse_aer_text(std::string_view text);

/// Reads IB and PCIe health data from sysfs below a root directory. Immutable after
/// construction, so `sample*` may be called from several threads at once. Sampling blocks on
/// small file reads (sysfs: microseconds; the `hw_counters` cache lifespan is 10 ms).
class SysfsSource {
 public:
  /// Enumerates `<root>/sys/class/infiniband/*/ports/*` and the PCI devices to watch: the
  /// given `pci_devices` (BDFs, kept even if absent so they read as unknown), or, when empty,
  /// every `<root>/sys/bus/pci/devices/*` that has an `aer_dev_correctable` file. A missing
  /// infiniband or pci directory means no such devices. Throws `InvalidUsage` when `root` is
  /// not a directory and `SystemError` when a present directory cannot be listed.
  explicit SysfsSource(std::string root = "/", std::vector<std::string> pci_devices = {});

  /// The sysfs root this source reads under.
  const std::string& root() const noexcept { return root_; }
  /// IB ports found at construction, sorted.
  const std::vector<IbPort>& ib_ports() const noexcept { return ib_ports_; }
  /// PCI devices watched, sorted.
  const std::vector<std::string>& pci_devices() const noexcept { return pci_devices_; }

  /// Reads one IB port. Never throws except `std::bad_alloc`; whatever cannot be read is unknown.
  IbPortSample sample_ib(const IbPort& port) const;
  /// Reads one PCI device. Never throws except `std::bad_alloc`.
  PcieSample sample_pcie(const std::string& bdf) const;
  /// Every counter of every enumerated port and device as flat samples for a `CounterBank`:
  /// ids {"ib", dev, port, name} (hw counters as "hw_counters/<name>") and {"pcie", bdf, 0,
  /// "aer_dev_<kind>/<NAME>"}. Never throws except `std::bad_alloc`.
  std::vector<CounterSample> read_counters() const;

 private:
  std::string root_;
  std::vector<IbPort> ib_ports_;
  std::vector<std::string> pci_devices_;
};

}  // namespace ringfence::health
