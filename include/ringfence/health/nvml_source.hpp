#pragma once
/// \file health/nvml_source.hpp
/// GPU health data from NVML, loaded with `dlopen` (no nvml.h, no link-time dependency): per
/// NVLink state and CRC flit / CRC data / replay / recovery counters, volatile ECC corrected /
/// uncorrected totals, remapped rows and the PCIe replay counter. A missing library, a missing
/// symbol, a failed `nvmlInit` or `NVML_ERROR_NOT_SUPPORTED` all read as *unknown*, never as
/// healthy and never as an exception. Tests load a fake NVML built in tests/ by path.

#include <memory>
#include <optional>
#include <ringfence/health/counters.hpp>
#include <string>
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
};

/// An NVML session. The constructor dlopens the library, resolves symbols and calls
/// nvmlInit; every failure is recorded (`available()` false, `unavailable_reason()`) rather
/// than thrown. The destructor calls nvmlShutdown when init succeeded; the library handle is
/// deliberately never dlclosed (as NCCL does: NVML may leave threads behind; dlopen is
/// reference counted, so repeated sessions do not pile up mappings). Sampling is thread-safe:
/// calls into NVML are serialised by a per-instance mutex. Sampling blocks for as long as
/// NVML does (typically microseconds to a few milliseconds per device).
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

  /// Reads one GPU. An unavailable source or an index out of range gives a sample whose
  /// readings are all unknown. Never throws except `std::bad_alloc`.
  NvmlDeviceSample sample(unsigned index) const;
  /// Every counter of every GPU as flat samples for a `CounterBank`: ids {"nvml", "<index>",
  /// link, "nvlink_crc_flit" | "nvlink_crc_data" | "nvlink_replay" | "nvlink_recovery"} and
  /// {"nvml", "<index>", 0, "ecc_corrected" | "ecc_uncorrected" | "remapped_correctable" |
  /// "remapped_uncorrectable" | "pcie_replay"}. Never throws except `std::bad_alloc`.
  std::vector<CounterSample> read_counters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringfence::health
