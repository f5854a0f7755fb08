#pragma once
/// \file plan.hpp
/// Ring planning over the live link graph: a ring is a cyclic order of all ranks in which no
/// two neighbours are joined by a fenced link. Pure functions, identical on every rank for the
/// same input, so ranks that agree on the fenced set agree on the ring.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ringfence {

/// An undirected link between two ranks, stored with `a < b`.
struct LinkId {
  int a = 0;
  int b = 0;
  /// Normalises the order of the two ranks.
  static LinkId of(int x, int y) noexcept { return x < y ? LinkId{x, y} : LinkId{y, x}; }
  friend bool operator==(LinkId, LinkId) = default;
  friend auto operator<=>(LinkId, LinkId) = default;  ///< by a, then b (for ordered containers)
};

/// Finds a ring of `size` ranks that uses none of `fenced`, starting at rank 0 and preferring
/// low ranks first (so with nothing fenced it is 0, 1, ..., size-1). Returns nullopt when no
/// such ring exists (for example any fence with 2 or 3 ranks). Deterministic; exhaustive search
/// with pruning, fine for the rank counts of one communicator (it gives up after `max_steps`
/// search steps and returns nullopt).
std::optional<std::vector<int>> plan_ring(int size, const std::vector<LinkId>& fenced, long max_steps = 1'000'000);

/// Where one rank sits, for planning the unfenced ("home") ring: its host and, when known,
/// its GPU and that GPU's NVLinks (from NVML, see `CommOptions::health_gpu`). Value type.
struct RankPlacement {
  std::string host;                  ///< host id: equal strings = same host
  std::string gpu;                   ///< PCI bus id of the rank's GPU (normalised); empty = unknown
  std::vector<std::string> nvlinks;  ///< normalised bus ids at the far ends of that GPU's active NVLinks (switches excluded)
  unsigned nvswitch_links = 0;       ///< active NVLinks of that GPU to NVSwitches
};

struct PeerInfo;

/// The placement a rank's peer info describes (host id, GPU bus id, NVLinks, switch links): the
/// one conversion the planner and the transports use.
RankPlacement placement_of(const PeerInfo& info);

/// How the GPUs of two ranks exchange data, as NVML describes them (`gpu_path`). Value type.
struct GpuPath {
  /// The kind of path.
  enum class Kind : std::uint8_t {
    Unknown,   ///< different hosts, or a GPU not known
    SameGpu,   ///< one GPU: device-local copies
    NvLink,    ///< direct NVLinks join the two GPUs
    NvSwitch,  ///< both GPUs have active NVLinks to NVSwitches (and none to each other)
    Pcie,      ///< known, different GPUs of one host with no NVLink between them
  };
  Kind kind = Kind::Unknown;
  /// NvLink: the links joining the two GPUs (the larger count named by either end); NvSwitch:
  /// the smaller of the two GPUs' switch link counts (the narrower end); otherwise 0.
  unsigned links = 0;
  /// Member-wise equality.
  friend bool operator==(const GpuPath&, const GpuPath&) = default;
};

/// The path between the GPUs of `a` and `b` (see `GpuPath`). A direct NVLink counts when either
/// end names the other's bus id (one end may have read its far ends wrong or not at all). Pure.
GpuPath gpu_path(const RankPlacement& a, const RankPlacement& b);

/// True when ranks `x` and `y` of `ranks` sit on one host and their GPUs are known and either
/// the same GPU, joined by an active NVLink (named by either end), or both connected to the
/// host's NVSwitches (`gpu_path` is SameGpu, NvLink or NvSwitch). Such a pair moves data
/// device to device without crossing PCIe, so the planner makes it ring neighbours when it can.
bool gpu_joined(const std::vector<RankPlacement>& ranks, int x, int y);

/// The home ring: the plan with nothing fenced. Hosts follow in the order of their lowest rank and
/// each host's ranks are contiguous, so a ring crosses between hosts once per host and direction.
/// Within a host the ranks are ordered so that as many ring neighbours as possible are `gpu_joined`
/// (with one host the closing hop counts too): GPUs bridged 0-2 and 1-3 give 0, 1, 3, 2 (both
/// bridges are hops). Ties, and hosts with no joined pair, take the lexicographically smallest
/// order, so without GPU facts a host's ranks ascend (one host: 0, 1, ..., n-1). A host of more
/// than 16 ranks is ordered by a greedy walk (nearest joined rank first). Deterministic and pure:
/// every rank computes the same ring from the same placements. Empty input gives an empty ring.
std::vector<int> plan_home_ring(const std::vector<RankPlacement>& ranks);

/// A fenced ring hop `from -> to` carried through `via` instead: `from -> via -> to`, the relay
/// forwarding chunks unchanged. The logical ring, and with it the order in which every
/// element's contributions are added, stays the same, so results stay bit-identical to the
/// unfenced plan.
struct Relay {
  int from = -1;
  int via = -1;
  int to = -1;
  friend bool operator==(const Relay&, const Relay&) = default;
};

/// Relays that carry every fenced hop of `ring` (ranks in ring order, hops ring[i] ->
/// ring[i+1]) over healthy links: for each fenced hop the lowest rank whose links to both ends
/// are not fenced. Returns nullopt when a fenced hop has no such rank, or when two paths would
/// share a directed link (each directed link carries one stream of chunks). An empty vector
/// means nothing to relay.
std::optional<std::vector<Relay>> plan_relays(const std::vector<int>& ring, const std::vector<LinkId>& fenced);

/// "0-1, 2-3" (empty for no links).
std::string to_string(const std::vector<LinkId>& links);
/// "0->2->1, 2->0->3" (empty for no relays).
std::string to_string(const std::vector<Relay>& relays);

}  // namespace ringfence
