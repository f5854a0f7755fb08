#include "gpu_topology.hpp"

#include <optional>
#include <ringfence/health/nvml_source.hpp>
#include <string>

#include <ringfence/detail/cuda_api.hpp>

namespace ringfence::detail {

namespace {

// `RINGFENCE_HEALTH_GPU=cuda`: the NVML index of the CUDA device current on this thread, found
// by its PCI bus id (CUDA orders devices fastest first, or as CUDA_VISIBLE_DEVICES says; NVML
// by bus id).
std::optional<unsigned> nvml_index_of_cuda_device(const CommOptions& options, const health::NvmlSource& nvml, const Logger& log) {
  const CudaApi cuda = load_cuda_api(options.cuda_runtime);
  auto unknown = [&](const std::string& why) {
    log.warn("RINGFENCE_HEALTH_GPU=cuda but {}: no NVLink is planned for or mapped", why);
    return std::nullopt;
  };
  if (!cuda.usable) return unknown(fmt::format("no usable CUDA runtime ({})", cuda.why_not));
  if (cuda.get_device == nullptr || cuda.device_get_pci_bus_id == nullptr)
    return unknown(fmt::format("{} lacks cudaGetDevice or cudaDeviceGetPCIBusId", cuda.library));
  int device = -1;
  if (const int err = cuda.get_device(&device); err != kCudaSuccess) return unknown(cuda.describe("cudaGetDevice", err));
  char bus[64] = {};
  if (const int err = cuda.device_get_pci_bus_id(bus, static_cast<int>(sizeof bus) - 1, device); err != kCudaSuccess)
    return unknown(cuda.describe("cudaDeviceGetPCIBusId", err));
  const std::optional<unsigned> index = nvml.index_of_bus_id(bus);
  if (!index) return unknown(fmt::format("NVML has no GPU with the bus id '{}' of CUDA device {}", bus, device));
  log.info("RINGFENCE_HEALTH_GPU=cuda: CUDA device {} ({}) is NVML GPU {}", device, bus, *index);
  return index;
}

}  // namespace

GpuTopology read_gpu_topology(const CommOptions& options, int size, const Logger& log, PeerInfo& self) {
  GpuTopology out;
  if (options.health_gpu == -1 || size == 1) return out;
  const health::NvmlSource nvml(options.health.nvml_library);
  if (!nvml.available()) {
    log.warn("RINGFENCE_HEALTH_GPU={} but NVML is unavailable ({}): no NVLink is planned for or mapped",
             options.health_gpu == CommOptions::kHealthGpuFromCuda ? std::string("cuda") : std::to_string(options.health_gpu),
             nvml.unavailable_reason());
    return out;
  }
  if (options.health_gpu == CommOptions::kHealthGpuFromCuda) {
    const std::optional<unsigned> found = nvml_index_of_cuda_device(options, nvml, log);
    if (!found) return out;
    out.nvml_gpu = static_cast<int>(*found);
  } else {
    out.nvml_gpu = options.health_gpu;
  }
  const auto gpu = static_cast<unsigned>(out.nvml_gpu);
  const auto id = nvml.pci_bus_id(gpu);
  if (!id) {
    log.warn("NVML has no PCI bus id for GPU {} (RINGFENCE_HEALTH_GPU): no NVLink is planned for or mapped", gpu);
    return out;
  }
  out.nvlinks = nvml.nvlink_peers(gpu);
  self.gpu_bus_id = *id;
  for (const auto& l : out.nvlinks) {
    if (l.far_end == health::NvLinkFarEnd::Switch)
      ++self.nvswitch_links;
    else
      self.nvlink_bus_ids.push_back(l.remote_bus_id);
  }
  return out;
}

std::vector<LinkSource> nvlink_map(int rank, const GpuTopology& gpu, const PeerInfo& self, const std::vector<PeerInfo>& peers,
                                   const Logger& log) {
  std::vector<std::string> bus_of(peers.size());
  for (std::size_t r = 0; r < peers.size(); ++r) bus_of[r] = peers[r].gpu_bus_id;
  std::vector<LinkSource> out;
  for (const auto& e : health::nvlink_edges(rank, static_cast<unsigned>(std::max(gpu.nvml_gpu, 0)), gpu.nvlinks, bus_of))
    out.push_back(LinkSource{LinkId::of(rank, e.peer), LinkSource::Kind::Nvml, std::to_string(e.gpu), static_cast<int>(e.link)});
  log.info("health: NVLink map of GPU {} ({}): {} link(s) to other ranks", gpu.nvml_gpu, self.gpu_bus_id.empty() ? "none" : self.gpu_bus_id,
           out.size());
  return out;
}

}  // namespace ringfence::detail
