#pragma once
/// \file transports/cuda_ipc.hpp
/// GPU transports for ranks on one host (target `ringfence::transport_cuda_ipc`): `nvlink`
/// (CUDA IPC, peer-to-peer copies) and `pcie` (the same regions, copies staged through pinned
/// host memory, pipelined). No CUDA header is needed: the runtime is loaded with dlopen
/// (`CommOptions::cuda_runtime`, `RINGFENCE_CUDART`).
///
/// - Device regions: memory from `allocate(bytes, MemoryKind::Device)` (a `cudaMalloc`), or a
///   whole `cudaMalloc` allocation (its base pointer: CUDA IPC names allocations, not
///   addresses). The key carries the CUDA IPC handle; a peer process opens it once
///   (`cudaIpcOpenMemHandle`, shared by every import of that allocation), a peer in the same
///   process uses the pointer.
/// - Host regions (signal flags): shared-memory segments of an inner `shm` transport; waits
///   and liveness are shm's (futex, pidfd).
/// - `nvlink` write: one `cudaMemcpyAsync` on the link's non-blocking stream, peer access
///   enabled when the GPUs differ (a pair without peer access is refused at `connect`: use
///   `pcie`). `pcie` write: device → pinned bounce slot → peer device, in chunks of
///   `kPcieChunkBytes` over `kPcieSlots` slots on two streams, so the two PCIe crossings
///   overlap. Host sources skip the first hop.
/// - Signals are ordered after every earlier write on the link by an event recorded behind
///   them; the flag is stored (shm) once that event completed, from `poll()` or `wait()` on
///   the link. The data path never allocates: events and bounce slots are made at `connect`.
/// See transports/cuda_ipc/README.md.

#include <cstddef>
#include <memory>
#include <ringfence/transport.hpp>
#include <string_view>

namespace ringfence::transports::cuda_ipc {

/// Registry name of the peer-to-peer transport.
inline constexpr std::string_view kNvlinkName = "nvlink";
/// Registry name of the host-staged transport.
inline constexpr std::string_view kPcieName = "pcie";
/// `pcie`: bytes per pipeline chunk.
inline constexpr std::size_t kPcieChunkBytes = std::size_t{1} << 20;
/// `pcie`: pinned bounce slots per link (chunks in flight).
inline constexpr std::size_t kPcieSlots = 4;
/// `can_reach` figures (GB/s, one direction): one NVLink (NVLink 3 and 4 move 25 GB/s per link
/// and direction), a PCIe Gen5 x16 direction, and an NVLink pair whose GPUs NVML does not
/// describe. The health layer judges achieved bandwidth against them (docs/health.md).
inline constexpr double kNvlinkLinkGbps = 25.0;
inline constexpr double kPcieGbps = 25.0;
inline constexpr double kNominalNvlinkGbps = 100.0;
/// Operations (writes + signals) in flight per link; a further one returns InProgress.
inline constexpr std::size_t kMaxPendingOps = 64;
/// Device copies at least this long are timed with CUDA events (`LinkStats::timed_bytes`,
/// `timed_ns`: the health layer's bandwidth evidence) when the runtime has cudaEventElapsedTime.
inline constexpr std::size_t kTimedCopyBytes = 32 * 1024;

/// Creates the `nvlink` transport (CUDA IPC, peer-to-peer copies) for one communicator.
std::unique_ptr<Transport> make_nvlink_transport(const TransportContext& context);
/// Creates the `pcie` transport (CUDA IPC regions, copies staged through pinned host memory).
std::unique_ptr<Transport> make_pcie_transport(const TransportContext& context);

}  // namespace ringfence::transports::cuda_ipc
