// nvlink -> pcie across processes (one rank per process, ranks may share a GPU). Two modes:
//
// Host lanes (default): the ranks run over the nvlink transport with checksums and fence
// agreement; a fault rule corrupts the nvlink link 0-1 (RINGFENCE_FAULT, default below), the
// agreement moves that pair to the pcie transport, and every collective before, during and
// after the move is checked exactly (integer-valued inputs, tests/support/verifiable.hpp): host
// allreduces, then a stream-ordered allreduce on device memory. Exits 1 unless link 0-1 ended
// on pcie on both ends with no fence and every other link stayed on nvlink.
//
// --device-regions: every allreduce is stream-ordered on device memory and runs on device
// regions (RINGFENCE_DEVICE_REGIONS=on: the engine on device memory, nvlink/pcie links, the
// kernel module's reductions; checksums off, as device regions require). The evidence is a
// replay storm on the NVLink mapped to link 0-1 (RINGFENCE_HEALTH_LINK_MAP, default
// 0-1=nvml:0:1), read through the fake NVML of tests/support (RINGFENCE_NVML_LIBRARY, whose
// state file RINGFENCE_FAKE_NVML_STATE rank 0 rewrites from collective #7 on). The agreement
// moves the pair to pcie on the host lanes and on the device lane. Exits 1 unless both of the
// pair's links (host and device lane) ended on pcie with no fence, every other link stayed on
// nvlink, and every allreduce was exact.
//
// Both exit 77 when no CUDA runtime, driver or device is usable. Run by ringfence-run over the
// fake runtime in CI (RINGFENCE_CUDART) and on GPUs by scripts/device-check.sh.
//   move_mp [--device-regions] [COUNT] [ITERATIONS]   elements per allreduce (default 65537),
//                                                       allreduces (default 24)
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ringfence/ringfence.hpp>
#include <ringfence/transports/cuda_ipc.hpp>
#include <string>
#include <vector>

#include "cuda_rt.hpp"
#include "support/verifiable.hpp"

using namespace ringfence;

namespace {

// A communicator over the move's two transports alone: nvlink first, pcie its fallback.
Communicator over_nvlink_and_pcie(const LaunchInfo& launch, CommOptions options) {
  options.transports = {std::string(transports::cuda_ipc::kNvlinkName), std::string(transports::cuda_ipc::kPcieName)};
  TransportRegistry registry;
  registry.add(std::string(transports::cuda_ipc::kNvlinkName), transports::cuda_ipc::make_nvlink_transport);
  registry.add(std::string(transports::cuda_ipc::kPcieName), transports::cuda_ipc::make_pcie_transport);
  return Communicator::from_launch(launch, registry, options);
}

// Replaces the fake NVML's state file at once (write, then rename): the other process may be
// reading it.
void write_nvml_state(const std::string& path, int rank, const std::string& content) {
  const std::string tmp = fmt::format("{}.tmp{}", path, rank);
  std::ofstream(tmp, std::ios::trunc) << content;
  std::filesystem::rename(tmp, path);
}

// The --device-regions mode (see the top of the file).
int run_device_regions(tools::CudaRt& cuda, const LaunchInfo& launch, CommOptions options, const Environment& env,
                       std::size_t count, int iterations) {
  const auto state = env.get("RINGFENCE_FAKE_NVML_STATE");
  if (options.health.nvml_library.empty() || !state) {
    std::printf("rank %d: --device-regions needs RINGFENCE_NVML_LIBRARY (the fake NVML of tests/support) and "
                "RINGFENCE_FAKE_NVML_STATE (its state file)\n",
                launch.rank);
    return 2;
  }
  const std::string quiet = "count 1\nlinks 4\n";
  write_nvml_state(*state, launch.rank, quiet);  // every rank, before the communicator reads it
  options.checksum = false;
  options.device_regions = DeviceRegionsMode::On;
  options.health_agree_every = 2;
  options.health_agree_min_interval = std::chrono::microseconds(0);  // by count only: these agreements fall at set calls
  if (options.health_link_map.empty()) options.health_link_map = "0-1=nvml:0:1";
  Communicator comm = over_nvlink_and_pcie(launch, options);
  const int rank = comm.rank(), n = comm.size();
  std::vector<std::string> moved;
  comm.on_health_event([&](const HealthEvent& e) {
    if (e.kind == EventKind::LinkMoved) moved.push_back(fmt::format("{}-{} {} at collective #{}", e.a, e.b, e.detail, e.sequence));
  });
  void* stream = nullptr;
  void* dev = nullptr;
  if (cuda.stream_create(&stream) != 0 || cuda.malloc_(&dev, count * sizeof(std::int32_t)) != 0) {
    std::printf("rank %d: cudaStreamCreate / cudaMalloc failed\n", rank);
    return 1;
  }
  std::size_t wrong = 0;
  std::vector<std::int32_t> buf(count);
  for (int it = 0; it < iterations; ++it) {
    if (rank == 0 && it >= 6)  // replays on the mapped NVLink, more at every step
      write_nvml_state(*state, rank, fmt::format("{}d0.l1.crc_flit {}\nd0.l1.replay {}\n", quiet, 250000 * (it - 5), 7 * (it - 5)));
    test::fill_input(DataType::Int32, ReduceOp::Sum, rank, n, buf.data(), count, static_cast<std::size_t>(it));
    bool ok = cuda.memcpy_(dev, buf.data(), count * sizeof(std::int32_t), tools::CudaRt::kHostToDevice) == 0;
    comm.allreduce(dev, dev, count, DataType::Int32, ReduceOp::Sum, CudaStream{stream});
    ok = ok && cuda.stream_sync(stream) == 0 &&
         cuda.memcpy_(buf.data(), dev, count * sizeof(std::int32_t), tools::CudaRt::kDeviceToHost) == 0;
    wrong += ok ? test::count_wrong(DataType::Int32, ReduceOp::Sum, n, buf.data(), count, static_cast<std::size_t>(it)) : count;
  }
  (void)cuda.free_(dev);
  (void)cuda.stream_destroy(stream);
  std::string links;
  bool placed = true, device_lane = false;
  for (const auto& l : comm.links()) {
    const bool pair = LinkId::of(rank, l.peer) == LinkId::of(0, 1);
    placed = placed && l.transport == (pair ? "pcie" : "nvlink") && l.state == LinkState::Up;
    device_lane = device_lane || l.device_lane;
    links += fmt::format(" {}:{}{}", l.peer, l.transport, l.device_lane ? "(device lane)" : "");
  }
  // Every rank hears of the host lanes' move; the pair's ends of their device lane's too.
  const bool pair_moved = moved.size() == (rank <= 1 ? 2u : 1u);
  const bool pass = wrong == 0 && comm.fenced_links().empty() && placed && device_lane && pair_moved &&
                    comm.device_path() == "device regions";
  std::printf("rank %d: %s: %d stream-ordered allreduces of %zu int32 on %s, %zu wrong; moved: %s; links%s; fenced %zu\n", rank,
              pass ? "passed" : "FAILED", iterations, count, comm.device_path().c_str(), wrong,
              moved.empty() ? "none" : fmt::format("{}", fmt::join(moved, "; ")).c_str(), links.c_str(), comm.fenced_links().size());
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const bool device_regions = argc > 1 && std::strcmp(argv[1], "--device-regions") == 0;
  if (device_regions) --argc, ++argv;
  const std::size_t count = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 65537;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 24;
  const Environment env = Environment::from_process();
  CommOptions options = CommOptions::from_env(env);
  const LaunchInfo launch = detect_launch(env);
  tools::CudaRt cuda;
  if (const std::string why = cuda.load(options.cuda_runtime); !why.empty()) {
    std::printf("rank %d: skipped: %s\n", launch.rank, why.c_str());
    return 77;
  }
  if (cuda.set_device(launch.rank % cuda.devices) != 0) {
    std::printf("rank %d: cudaSetDevice(%d) failed\n", launch.rank, launch.rank % cuda.devices);
    return 1;
  }
  if (device_regions) return run_device_regions(cuda, launch, options, env, count, iterations);
  options.checksum = true;
  options.health_agree_every = 2;
  options.health_agree_min_interval = std::chrono::microseconds(0);  // by count only: these agreements fall at set calls
  if (options.fault.empty()) options.fault = "flip:rate=1e-5,link=0-1,seed=5,transport=nvlink";
  Communicator comm = over_nvlink_and_pcie(launch, options);
  const int rank = comm.rank(), n = comm.size();
  if (n < 2) {
    std::printf("rank %d: needs at least 2 ranks\n", rank);
    return 1;
  }
  std::string moved;
  comm.on_health_event([&](const HealthEvent& e) {
    if (e.kind == EventKind::LinkMoved) moved = fmt::format("{}-{} {} at collective #{}", e.a, e.b, e.detail, e.sequence);
  });

  std::size_t wrong = 0;
  std::vector<float> buf(count);
  for (int it = 0; it < iterations; ++it) {
    test::fill_input(DataType::Float32, ReduceOp::Sum, rank, n, buf.data(), count, static_cast<std::size_t>(it));
    comm.allreduce(buf.data(), buf.data(), count, DataType::Float32, ReduceOp::Sum);
    wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, n, buf.data(), count, static_cast<std::size_t>(it));
  }
  // After the move: one stream-ordered allreduce on device memory.
  void* stream = nullptr;
  void* dev = nullptr;
  if (cuda.stream_create(&stream) != 0 || cuda.malloc_(&dev, count * sizeof(float)) != 0) {
    std::printf("rank %d: cudaStreamCreate / cudaMalloc failed\n", rank);
    return 1;
  }
  test::fill_input(DataType::Float32, ReduceOp::Sum, rank, n, buf.data(), count);
  bool ok = cuda.memcpy_(dev, buf.data(), count * sizeof(float), tools::CudaRt::kHostToDevice) == 0;
  comm.allreduce(dev, dev, count, DataType::Float32, ReduceOp::Sum, CudaStream{stream});
  ok = ok && cuda.stream_sync(stream) == 0 &&
       cuda.memcpy_(buf.data(), dev, count * sizeof(float), tools::CudaRt::kDeviceToHost) == 0;
  const std::size_t device_wrong = ok ? test::count_wrong(DataType::Float32, ReduceOp::Sum, n, buf.data(), count) : count;
  (void)cuda.free_(dev);
  (void)cuda.stream_destroy(stream);

  std::string links;
  bool placed = true;
  for (const auto& l : comm.links()) {
    const bool pair = LinkId::of(rank, l.peer) == LinkId::of(0, 1);
    placed = placed && l.transport == (pair ? "pcie" : "nvlink") && l.state == LinkState::Up;
    links += fmt::format(" {}:{}", l.peer, l.transport);
  }
  const bool pass = wrong == 0 && device_wrong == 0 && comm.fenced_links().empty() && placed && !moved.empty();
  std::printf("rank %d: %s: %d host allreduces of %zu floats + 1 on device, %zu + %zu wrong; %s; links%s; fenced %zu\n", rank,
              pass ? "passed" : "FAILED", iterations, count, wrong, device_wrong, moved.empty() ? "no move" : ("moved " + moved).c_str(),
              links.c_str(), comm.fenced_links().size());
  return pass ? 0 : 1;
}
