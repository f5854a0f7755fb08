#pragma once
// This rank's GPU as NVML sees it (CommOptions::health_gpu): its PCI bus id and NVLinks, for the
// planner (NVLink-joined ranks become ring neighbours) and the automatic link map
// (RINGFENCE_HEALTH_LINK_MAP=auto). Anything missing is a warning and leaves the GPU unknown.
#include <ringfence/health/topology.hpp>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/transport.hpp>
#include <vector>

#include "monitor.hpp"

namespace ringfence::detail {

/// What `read_gpu_topology` found.
struct GpuTopology {
  int nvml_gpu = -1;                       ///< NVML index of this rank's GPU; -1 = unknown
  std::vector<health::NvLinkPeer> nvlinks; ///< its active NVLinks, with their indices
};

/// Reads the GPU named by `options.health_gpu` (an NVML index, -1 = none, or the current CUDA
/// device) and writes its bus id, the far ends of its NVLinks and its NVSwitch link count into
/// `self` (every rank learns them with the peer info). Nothing for one rank.
GpuTopology read_gpu_topology(const CommOptions& options, int size, const Logger& log, PeerInfo& self);

/// Maps each active NVLink of this rank's GPU whose far end is another rank's GPU (bus ids from
/// `peers`, by rank) to the link with that rank.
std::vector<LinkSource> nvlink_map(int rank, const GpuTopology& gpu, const PeerInfo& self, const std::vector<PeerInfo>& peers,
                                   const Logger& log);

}  // namespace ringfence::detail
