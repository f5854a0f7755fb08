// nvlink -> pcie: a pair whose NVLink must be fenced moves to the pcie transport at the fence
// agreement (the fallback nvlink declares, TransportTraits::fallbacks: CommOptions::fallbacks is left unset), over the fake CUDA runtime (thread ranks of one
// process, delayed copies). The plan stays and every result stays bit-identical to the
// fault-free run; the CPU twin (shm -> tcp) is tests/unit/link_move_test.cpp.
#include <ringfence/communicator.hpp>
#include <ringfence/transports/cuda_ipc.hpp>
#include <string>

#include "support/catch.hpp"
#include "support/fence_scenario.hpp"

using namespace ringfence;
namespace cuda_ipc = transports::cuda_ipc;

TEST_CASE("nvlink -> pcie: a corrupting NVLink pair moves to pcie, same plan, bit-identical results", "[cuda_ipc][move]") {
  TransportRegistry registry;
  registry.add(std::string(cuda_ipc::kNvlinkName), cuda_ipc::make_nvlink_transport);
  registry.add(std::string(cuda_ipc::kPcieName), cuda_ipc::make_pcie_transport);
  // One staging slot: a credit the old link still held back (a signal waits for its copies'
  // event) is the one the sender needs next, so moving must restore it or the ring stalls.
  const auto tweak = [](int, CommOptions& o) {
    o.cuda_runtime = RINGFENCE_FAKE_CUDART_PATH;
    o.slots = 1;
    o.timeout = std::chrono::seconds(10);
  };
  const auto [clean, faulty] = test::run_against_clean(3, "flip:rate=1e-4,link=1-2,seed=3,transport=nvlink", tweak, registry);
  test::require_moved_once(clean, faulty, 3, LinkId{1, 2}, "nvlink", "pcie");
}
