#pragma once
// Internal to the CUDA IPC transports: what the transport and its links share (Shared: the
// loaded CUDA runtime, the inner shm transport, allocations, opened peer allocations) and the
// imported remote region (Remote).
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <ringfence/error.hpp>
#include <ringfence/log.hpp>
#include <ringfence/transport.hpp>
#include <ringfence/transport_util.hpp>
#include <ringfence/transports/cuda_ipc.hpp>
#include <string>
#include <string_view>
#include <utility>

#include <ringfence/detail/cuda_api.hpp>

namespace ringfence::transports::cuda_ipc {

using detail::CudaApi;
using transport_util::bump;

enum class Mode : std::uint8_t { Nvlink, Pcie };
enum class Tag : std::uint8_t { Device = 1, Host = 2 };

inline std::string_view mode_name(Mode m) noexcept { return m == Mode::Nvlink ? kNvlinkName : kPcieName; }

// ---- shared state ----------------------------------------------------------------------------
struct Opened;

// What the transport and its links share (links may outlive the transport object).
struct Shared {
  Mode mode{};
  PeerInfo self;
  CudaApi api;
  int device = -1;         // this rank's current device at creation
  std::string why_not;     // empty when CUDA IPC is usable
  const Logger* log = nullptr;
  std::unique_ptr<Transport> inner;  // shm: host regions (flags), waits, liveness

  std::mutex mutex;
  std::map<std::uintptr_t, std::size_t> allocations;  // allocate(Device): base -> bytes
  std::map<std::pair<std::int32_t, std::uint64_t>, std::weak_ptr<Opened>> opened;  // (pid, base)

  std::string who() const { return fmt::format("rank {}: {}", self.rank, mode_name(mode)); }
  void require_usable() const {
    if (!why_not.empty()) throw CudaError(fmt::format("{}: no usable CUDA IPC: {}", who(), why_not), 0);
  }
  void check(int err, const char* call) const {
    if (err != detail::kCudaSuccess) throw CudaError(fmt::format("{}: {}", who(), api.describe(call, err)), err);
  }
};

// A peer allocation opened with cudaIpcOpenMemHandle; shared by every import of it, closed
// with the last one (which may outlive the transport: it keeps the loaded API alive).
struct Opened {
  std::shared_ptr<const Shared> owner;
  void* base = nullptr;
  Opened() = default;
  Opened(const Opened&) = delete;
  Opened& operator=(const Opened&) = delete;
  ~Opened() {
    if (base != nullptr) (void)owner->api.ipc_close_mem_handle(base);
  }
};

struct Remote final : RemoteRegion::Impl {
  Tag tag{};
  std::byte* ptr = nullptr;         // Device: start of the region in this process
  std::shared_ptr<Opened> opened;   // Device, from another process: keeps the mapping open
  RemoteRegion inner;               // Host: the shm import
};

}  // namespace ringfence::transports::cuda_ipc
