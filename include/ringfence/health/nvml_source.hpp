#pragma once
/// \file health/nvml_source.hpp
/// GPU health data from NVML, loaded with `dlopen` (no nvml.h, no link-time dependency): per
/// NVLink state and CRC flit / CRC data / replay / recovery counters, volatile ECC corrected /
/// uncorrected totals, remapped rows, the PCIe replay counter, Xid events (an NVML event set)
/// and the NVLink topology (PCI bus ids at both ends of each active link). A missing library,
/// a missing symbol, a failed `nvmlInit` or `NVML_ERROR_NOT_SUPPORTED` all read as *unknown*,
/// never as healthy and never as an exception. Tests load a fake NVML built in tests/ by path.

#include <cstdint>
#include <memory>
#include <optional>
#include <ringfence/health/counters.hpp>
#include <ringfence/health/topology.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace ringfence::health {

/// NVML field ids used for the per-link NVLink counters (`nvmlDeviceGetFieldValues` with
/// scopeId = link index; reference health-counters.md §1.4).
enum class NvmlField : unsigned {
  NvlinkCrcFlitTotal = 38,  ///< NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL
  NvlinkCrcDataTotal = 45,  ///< NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL
  NvlinkReplayTotal = 52,   ///< NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL
  NvlinkRecoveryTotal = 59  ///< NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL
};

/// NVML event type bit of Xid critical errors (`nvmlEventTypeXidCriticalError`, reference
/// health-counters.md §1.6). The only event type `NvmlSource` registers.
inline constexpr unsigned long long kNvmlEventTypeXidCriticalError = 0x8;

/// What the health layer makes of one Xid.
enum class XidSeverity : std::uint8_t {
  Ignore,  ///< not a health signal for links (application faults, unknown Xids): not counted
  Warn,    ///< DCGM reports WARN for it: the GPU's links become suspect
  Fail,    ///< DCGM reports FAIL for it: the GPU's links are fenced
};

/// Classifies an Xid as DCGM 4.6's health watches do (reference health-counters.md §2.2):
/// - Fail: the always-on "devastating" Xids 48 (DBE), 74 (NVLink), 79 (fallen off the bus),
///   95 (uncontained ECC), 119 / 120 (GSP), 140 (ECC unrecovered), and Memory's 64.
/// - Warn: PCIe 38, 39, 42; NVLink 67, 73, 121 (C2C corrected), 137; memory 31, 32, 43, 63
///   and 94 (contained ECC).
/// - Ignore: every other number, including 999 (NVML's "unknown Xid") and 0.
/// Thread-safe, pure.
XidSeverity classify_xid(unsigned long long xid) noexcept;

/// "ignore", "warn", "fail". Thread-safe.
std::string_view to_string(XidSeverity s) noexcept;

/// One Xid event drained from NVML (`NvmlSource::poll_xid_events`). Value type.
struct XidEvent {
  /// NVML index of the GPU the event names; nullopt when its handle matched none of ours.
  std::optional<unsigned> gpu;
  unsigned long long xid = 0;                  ///< the Xid number (`nvmlEventData_t::eventData`)
  XidSeverity severity = XidSeverity::Ignore;  ///< `classify_xid(xid)`
};

/// One NVLink of one GPU, as read in one sweep. Value type.
struct NvLinkSample {
  unsigned link = 0;            ///< link index on the GPU
  std::optional<bool> active;   ///< nvmlDeviceGetNvLinkState; nullopt when unknown
  CounterReading crc_flit;      ///< RX flit CRC errors (64-bit)
  CounterReading crc_data;      ///< RX data CRC errors (64-bit)
  CounterReading replay;        ///< TX replays (64-bit)
  CounterReading recovery;      ///< link recovery (retrain) events (64-bit)
};

/// One GPU, as read in one sweep. Value type; unknown readings where NVML could not answer.
struct NvmlDeviceSample {
  unsigned index = 0;  ///< NVML device index
  /// Links that exist: those for which nvmlDeviceGetNvLinkState answered (active or not).
  /// Empty when NVLink is not supported or the handle could not be obtained.
  std::vector<NvLinkSample> links;
  CounterReading ecc_corrected;    ///< volatile corrected (single-bit) ECC total (64-bit)
  CounterReading ecc_uncorrected;  ///< volatile uncorrected (double-bit) ECC total (64-bit)
  CounterReading remapped_correctable;    ///< rows remapped for correctable errors (32-bit)
  CounterReading remapped_uncorrectable;  ///< rows remapped for uncorrectable errors (32-bit)
  std::optional<bool> remap_pending;      ///< a remap awaits a GPU reset
  std::optional<bool> remap_failure;      ///< a remap failed
  CounterReading pcie_replay;             ///< PCIe replay counter (32-bit)
  /// Xids classified Fail seen on this GPU since the session started (64-bit, never resets).
  /// Unknown when Xid events are not registered on the GPU (missing symbols, NOT_SUPPORTED)
  /// or when draining the event set failed at this sample.
  CounterReading xid_fatal;
  /// Xids classified Warn seen on this GPU since the session started; unknown likewise.
  CounterReading xid_warn;
  /// The latest Fail-class Xid seen on this GPU (for messages: "Xid 74"); nullopt when none.
  std::optional<unsigned long long> last_fatal_xid;
  /// The latest Warn-class Xid seen on this GPU; nullopt when none.
  std::optional<unsigned long long> last_warn_xid;
};

/// An NVML session. The constructor dlopens the library, resolves symbols and calls
/// nvmlInit; every failure is recorded (`available()` false, `unavailable_reason()`) rather
/// than thrown. It then creates one NVML event set and registers XidCriticalError on every
/// GPU that supports it; Xids that happened before that are not seen (NVML does not record
/// them). The destructor frees the event set and calls nvmlShutdown when init succeeded; the
/// library handle is deliberately never dlclosed (as NCCL does: NVML may leave threads
/// behind; dlopen is reference counted, so repeated sessions do not pile up mappings).
/// Sampling is thread-safe: calls into NVML are serialised by a per-instance mutex. Sampling
/// blocks for as long as NVML does (typically microseconds to a few milliseconds per device).
class NvmlSource {
 public:
  /// Loads `library` (a soname such as "libnvidia-ml.so.1" or a path) and initialises NVML.
  /// `max_links` bounds the NVLink indices probed (NVML_NVLINK_MAX_LINKS: 18 before API 13,
  /// 36 since). Never throws except `std::bad_alloc`.
  explicit NvmlSource(const std::string& library = "libnvidia-ml.so.1", unsigned max_links = 36);
  /// Calls nvmlShutdown if nvmlInit succeeded. Never throws.
  ~NvmlSource();
  NvmlSource(const NvmlSource&) = delete;             ///< not copyable (owns an NVML init)
  NvmlSource& operator=(const NvmlSource&) = delete;  ///< not copyable

  /// True when the library loaded, the required symbols exist and nvmlInit succeeded.
  bool available() const noexcept;
  /// Why `available()` is false ("dlopen failed: ...", "nvmlInit_v2 returned 9"); empty when available.
  const std::string& unavailable_reason() const noexcept;
  /// Number of GPUs NVML reports; 0 when unavailable.
  unsigned device_count() const noexcept;

  /// Reads one GPU (draining pending Xid events first, see `poll_xid_events`). An unavailable
  /// source or an index out of range gives a sample whose readings are all unknown. Never
  /// throws except `std::bad_alloc`.
  NvmlDeviceSample sample(unsigned index) const;
  /// Every counter of every GPU as flat samples for a `CounterBank`: ids {"nvml", "<index>",
  /// link, "nvlink_crc_flit" | "nvlink_crc_data" | "nvlink_replay" | "nvlink_recovery"} and
  /// {"nvml", "<index>", 0, "ecc_corrected" | "ecc_uncorrected" | "remapped_correctable" |
  /// "remapped_uncorrectable" | "pcie_replay" | "xid_fatal" | "xid_warn"}. Drains pending Xid
  /// events once for all GPUs. The Xid counts are cumulative since the session started, so
  /// the bank's first read is their baseline: an Xid drained by that first read is not a
  /// delta (read once right after construction to start the baseline early). Never throws
  /// except `std::bad_alloc`.
  std::vector<CounterSample> read_counters() const;

  /// Drains every Xid event NVML has queued (nvmlEventSetWait_v2 with a 0 ms timeout, so it
  /// never blocks; at most 4096 per call, the rest stay queued for the next call), adds the
  /// Fail / Warn ones to their GPU's counts and returns all of them in arrival order, ignored
  /// Xids included, for logging. `sample` and `read_counters` drain too, and events drained
  /// there are only counted: call this before them to see every raw event. Empty when no
  /// event set is registered. Never throws except `std::bad_alloc`.
  std::vector<XidEvent> poll_xid_events() const;
  /// True when XidCriticalError events are registered on GPU `index` (otherwise its Xid
  /// counts read unknown).
  bool xid_events_registered(unsigned index) const noexcept;

  /// PCI bus id of GPU `index` in the canonical form of `normalize_pci_bus_id`
  /// ("0000:3b:00.0"), from nvmlDeviceGetPciInfo_v3 (falls back to _v2, then the unversioned
  /// legacy-layout symbol). nullopt when unavailable, out of range, not supported or not
  /// printable. Never throws except `std::bad_alloc`.
  std::optional<std::string> pci_bus_id(unsigned index) const;
  /// The index of the GPU whose `pci_bus_id` is `bus_id` (any spelling
  /// `normalize_pci_bus_id` accepts); nullopt when no GPU has it or NVML is unavailable.
  /// Never throws except `std::bad_alloc`.
  std::optional<unsigned> index_of_bus_id(std::string_view bus_id) const;
  /// The active NVLinks of GPU `index` whose far end NVML names: every link below
  /// `max_links` whose nvmlDeviceGetNvLinkState is active and whose
  /// nvmlDeviceGetNvLinkRemotePciInfo_v2 (falls back to the unversioned symbol) succeeds with
  /// a bus id `normalize_pci_bus_id` accepts, or whose far end
  /// nvmlDeviceGetNvLinkRemoteDeviceType calls a switch (its bus id may then be empty: NCCL
  /// sees NVSwitch far ends empty on some platforms); in link order. `far_end` is that call's
  /// answer (Unknown when the symbol is missing or the call fails). Links that are inactive,
  /// unsupported, or neither named nor a switch are left out. Empty when unavailable. Never
  /// throws except `std::bad_alloc`.
  std::vector<NvLinkPeer> nvlink_peers(unsigned index) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringfence::health
