#pragma once
/// \file health/topology.hpp
/// Which NVLinks of a GPU join this rank to which other ranks: PCI bus ids in one canonical
/// form, the NVLink peers NVML reports (`NvmlSource::nvlink_peers`), and the pure mapping from
/// those peers to (peer rank, GPU, link) edges. Nothing here calls NVML; everything is a pure
/// function of its arguments, so it is tested without hardware.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ringfence::health {

/// Canonical form of a PCI bus id: lowercase hex `dddd:bb:dd.f` with the domain printed with
/// at least four digits (more only when it exceeds 0xffff), exactly as Linux names
/// `/sys/bus/pci/devices/<bdf>` and as `PcieSample` / the "pcie" counters use. Accepts NVML's
/// 8-digit upper-case form ("00000000:3B:00.0"), the legacy 4-digit form ("0000:3B:00.0"), the
/// Linux form and lspci's short form without a domain ("3b:00.0" = domain 0), with surrounding
/// blanks or trailing NULs. Returns nullopt for anything else (empty, non-printable, bus >
/// 0xff, device > 0x1f, function > 7, domain > 0xffffffff), so an unreadable id is unknown,
/// never a made-up address. Thread-safe, pure; may throw only `std::bad_alloc`.
/// Example: `normalize_pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0"`.
std::optional<std::string> normalize_pci_bus_id(std::string_view bus_id);

/// What sits at the far end of an NVLink (nvmlDeviceGetNvLinkRemoteDeviceType).
enum class NvLinkFarEnd : std::uint8_t {
  Unknown = 0,  ///< NVML lacks the call, or it failed or answered NVML_NVLINK_DEVICE_TYPE_UNKNOWN
  Gpu,          ///< another GPU (a direct NVLink, "bridge")
  Switch,       ///< an NVSwitch: the GPU reaches every other switch-connected GPU of its host through it
  Cpu,          ///< a CPU (IBM NPU)
};

/// One active NVLink of a GPU and the GPU (or NVSwitch, or CPU) at its far end. Value type.
struct NvLinkPeer {
  unsigned link = 0;          ///< NVLink index on the local GPU
  std::string remote_bus_id;  ///< PCI bus id of the far end, normalised (`normalize_pci_bus_id`); may be empty for a switch
  NvLinkFarEnd far_end = NvLinkFarEnd::Unknown;  ///< the far end's kind
  /// Member-wise equality.
  friend bool operator==(const NvLinkPeer&, const NvLinkPeer&) = default;
};

/// One NVML-mapped link of this rank: the NVLink `link` of GPU `gpu` (NVML index) joins this rank to `peer`.
struct NvlinkEdge {
  int peer = 0;       ///< the rank at the far end
  unsigned gpu = 0;   ///< NVML index of this rank's GPU
  unsigned link = 0;  ///< NVLink index on that GPU
  /// Member-wise equality.
  friend bool operator==(const NvlinkEdge&, const NvlinkEdge&) = default;
};

/// For GPU `gpu` of this rank (`rank`) with NVLink peers `links`, and `bus_id_of_rank[r]` =
/// the PCI bus id of rank r's GPU (empty = unknown), returns every edge whose remote bus id is
/// another rank's GPU. Several ranks may share a GPU: an NVLink to a GPU used by ranks 2 and 3
/// gives an edge to each. Ranks on the SAME GPU as this rank (same bus id as
/// `bus_id_of_rank[rank]`) get no edge, nor does a link whose far end is this rank's own GPU.
/// A link to a bus id that is no rank's GPU (a GPU of another job) gives no edge, nor does a link
/// to an NVSwitch (its errors hit every pair of the GPU, not one ring edge);
/// an unknown (empty or unparseable) bus id matches nothing. Bus ids are compared after
/// `normalize_pci_bus_id`, so NVML's and Linux's spellings of one device match. `rank` outside
/// `bus_id_of_rank` is allowed (its own GPU is then unknown). Deterministic order: by peer,
/// then link; no duplicates. Thread-safe, pure; may throw only `std::bad_alloc`.
std::vector<NvlinkEdge> nvlink_edges(int rank, unsigned gpu, const std::vector<NvLinkPeer>& links,
                                     const std::vector<std::string>& bus_id_of_rank);

}  // namespace ringfence::health
