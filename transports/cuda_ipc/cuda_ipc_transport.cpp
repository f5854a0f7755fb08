// The CUDA IPC transports' control plane (CudaIpcTransport): region keys, allocation,
// registration, import, listen and connect. The link (data plane) is in cuda_ipc_link.hpp.
//
// CUDA IPC transports: `nvlink` (peer-to-peer copies) and `pcie` (copies staged through pinned
// host memory). Control plane (allocation, registration, IPC handles, streams, events) takes a
// mutex and may throw; the Link data path is noexcept and allocation-free: a write enqueues
// copies and records a pre-made event, a signal records an event and is stored into the peer's
// shm flag once the event completed (poll / wait).
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <ringfence/error.hpp>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/plan.hpp>
#include <ringfence/transport_util.hpp>
#include <ringfence/transports/cuda_ipc.hpp>
#include <ringfence/transports/shm.hpp>
#include <utility>

#include <ringfence/detail/cuda_api.hpp>
#include "cuda_ipc_link.hpp"
#include "cuda_ipc_shared.hpp"

namespace ringfence::transports::cuda_ipc {
namespace {

// ---- keys ------------------------------------------------------------------------------------
// Device region key: u8 tag (1), u8[3] pad, i32 pid, i32 device, u32 pad, u64 allocation base
// (in the owner's address space), u64 offset of the region in the allocation, u64 bytes, then
// the 64-byte CUDA IPC handle of the allocation. Host region key: u8 tag (2), then the inner shm
// transport's key.
constexpr std::size_t kDeviceKeyBytes = 40 + detail::kCudaIpcHandleBytes;

struct DeviceKey {
  std::int32_t pid = 0;
  std::int32_t device = 0;
  std::uint64_t base = 0;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  detail::CudaIpcHandle handle{};
};

Bytes encode(const DeviceKey& k) {
  Bytes out(kDeviceKeyBytes);
  out[0] = static_cast<std::byte>(Tag::Device);
  std::memcpy(out.data() + 4, &k.pid, 4);
  std::memcpy(out.data() + 8, &k.device, 4);
  std::memcpy(out.data() + 16, &k.base, 8);
  std::memcpy(out.data() + 24, &k.offset, 8);
  std::memcpy(out.data() + 32, &k.bytes, 8);
  std::memcpy(out.data() + 40, &k.handle, sizeof k.handle);
  return out;
}

DeviceKey decode_device_key(std::span<const std::byte> key, std::string_view who) {
  RINGFENCE_EXPECTS(key.size() == kDeviceKeyBytes, "{}: malformed device region key ({} bytes, expected {})", who, key.size(),
                    kDeviceKeyBytes);
  DeviceKey k;
  std::memcpy(&k.pid, key.data() + 4, 4);
  std::memcpy(&k.device, key.data() + 8, 4);
  std::memcpy(&k.base, key.data() + 16, 8);
  std::memcpy(&k.offset, key.data() + 24, 8);
  std::memcpy(&k.bytes, key.data() + 32, 8);
  std::memcpy(&k.handle, key.data() + 40, sizeof k.handle);
  RINGFENCE_EXPECTS(k.pid > 0 && k.device >= 0 && k.base != 0 && k.offset <= UINT64_MAX - k.bytes,
                    "{}: malformed device region key (pid {}, device {}, base {:#x}, offset {}, bytes {})", who, k.pid, k.device,
                    k.base, k.offset, k.bytes);
  return k;
}

struct LocalRegion final : MemoryRegion::Impl {
  Bytes key_bytes;
  MemoryRegion inner;  // Host regions: the shm registration
  Bytes key() const override { return key_bytes; }
};

class CudaListen final : public ListenHandle {
 public:
  CudaListen(std::unique_ptr<ListenHandle> inner, int device) : inner_(std::move(inner)), device_(device) {}
  // u32 length + the inner shm address, then i32 device.
  Bytes address() const override {
    const Bytes in = inner_->address();
    Bytes out(4 + in.size() + 4);
    const auto len = static_cast<std::uint32_t>(in.size());
    std::memcpy(out.data(), &len, 4);
    std::memcpy(out.data() + 4, in.data(), in.size());
    std::memcpy(out.data() + 4 + in.size(), &device_, 4);
    return out;
  }
  ListenHandle& inner() { return *inner_; }

 private:
  std::unique_ptr<ListenHandle> inner_;
  int device_;
};

// ---- Transport -------------------------------------------------------------------------------
class CudaIpcTransport final : public Transport {
 public:
  CudaIpcTransport(const TransportContext& ctx, Mode mode) : shared_(std::make_shared<Shared>()) {
    Shared& s = *shared_;
    s.mode = mode;
    s.self = ctx.self;
    s.log = ctx.log;
    s.api = detail::load_cuda_api(ctx.options != nullptr ? ctx.options->cuda_runtime : std::string());
    if (!s.api.usable) {
      s.why_not = s.api.why_not;
    } else if (!s.api.ipc) {
      s.why_not = s.api.ipc_why_not;
    } else if (const int err = s.api.get_device(&s.device); err != detail::kCudaSuccess) {
      s.why_not = s.api.describe("cudaGetDevice", err);
    }
    s.inner = shm::make_transport(ctx);
    if (!s.why_not.empty() && s.log) s.log->debug("{}: unusable: {}", s.who(), s.why_not);
  }
  ~CudaIpcTransport() override {
    std::lock_guard lock(shared_->mutex);
    for (const auto& [base, bytes] : shared_->allocations) (void)shared_->api.free(reinterpret_cast<void*>(base));
    shared_->allocations.clear();
  }

  std::string_view name() const noexcept override { return mode_name(shared_->mode); }
  // nvlink declares pcie as its fallback: the PCIe path avoids the NVLink fabric, so a pair whose
  // NVLink must be fenced moves there (same plan, same bytes) instead of being routed around.
  const TransportTraits& traits() const noexcept override {
    static const TransportTraits kNvlink{.shares_memory = true, .writes_device_memory = true, .fallbacks = {std::string(kPcieName)}};
    static const TransportTraits kPcie{.shares_memory = true, .writes_device_memory = true};
    return shared_->mode == Mode::Nvlink ? kNvlink : kPcie;
  }

  Reachability can_reach(const PeerInfo& self, const PeerInfo& peer) const override {
    Reachability r;
    if (self.host_id != peer.host_id) {
      r.reason = fmt::format("rank {} is on host '{}', rank {} on host '{}'", self.rank, self.host_id, peer.rank, peer.host_id);
      return r;
    }
    if (!shared_->why_not.empty()) {
      r.reason = fmt::format("no usable CUDA IPC: {}", shared_->why_not);
      return r;
    }
    r.ok = true;
    r.min_chunk_bytes = shared_->mode == Mode::Pcie ? kPcieChunkBytes : 0;
    // pcie: one PCIe Gen5 x16 direction. nvlink: from the GPUs' NVML facts when both ranks named
    // one (`CommOptions::health_gpu`): NVLink-joined or switch-connected pairs get their links'
    // bandwidth, other pairs copy peer to peer over PCIe (where the GPUs allow it: `connect`
    // refuses pairs without peer access); unknown GPUs and one shared GPU keep the nominal figure.
    const GpuPath path = shared_->mode == Mode::Nvlink ? gpu_path(placement_of(self), placement_of(peer)) : GpuPath{GpuPath::Kind::Pcie};
    const bool pcie = path.kind == GpuPath::Kind::Pcie;
    r.latency_us = pcie ? 10.0 : 5.0;
    r.bandwidth_gbps = pcie                                 ? kPcieGbps
                       : path.links > 0                     ? kNvlinkLinkGbps * path.links  // NvLink, NvSwitch
                                                            : kNominalNvlinkGbps;           // Unknown, SameGpu
    return r;
  }

  void* allocate(std::size_t bytes, MemoryKind kind) override {
    if (kind == MemoryKind::Host) return shared_->inner->allocate(bytes, kind);
    if (bytes == 0) return nullptr;
    shared_->require_usable();
    void* p = nullptr;
    shared_->check(shared_->api.malloc(&p, bytes), "cudaMalloc");
    std::lock_guard lock(shared_->mutex);
    shared_->allocations[reinterpret_cast<std::uintptr_t>(p)] = bytes;
    return p;
  }

  bool deallocate(void* ptr) noexcept override {
    if (shared_->inner->deallocate(ptr)) return true;
    std::lock_guard lock(shared_->mutex);
    auto it = shared_->allocations.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == shared_->allocations.end()) return false;
    (void)shared_->api.free(ptr);
    shared_->allocations.erase(it);
    return true;
  }

  MemoryRegion register_memory(void* ptr, std::size_t bytes, MemoryKind kind) override {
    auto impl = std::make_unique<LocalRegion>();
    if (kind == MemoryKind::Host) {
      impl->inner = shared_->inner->register_memory(ptr, bytes, kind);
      const Bytes inner_key = impl->inner.key();
      impl->key_bytes.reserve(1 + inner_key.size());
      impl->key_bytes.push_back(static_cast<std::byte>(Tag::Host));
      impl->key_bytes.insert(impl->key_bytes.end(), inner_key.begin(), inner_key.end());
      return MemoryRegion(std::move(impl), ptr, bytes, kind);
    }
    shared_->require_usable();
    RINGFENCE_EXPECTS(ptr != nullptr, "{}: register_memory(nullptr, {}) of device memory", shared_->who(), bytes);
    DeviceKey k;
    k.pid = static_cast<std::int32_t>(::getpid());
    k.device = shared_->device;
    k.bytes = bytes;
    const auto p = reinterpret_cast<std::uintptr_t>(ptr);
    k.base = p;
    {
      std::lock_guard lock(shared_->mutex);
      auto it = shared_->allocations.upper_bound(p);
      if (it != shared_->allocations.begin() && p < std::prev(it)->first + std::prev(it)->second) {
        --it;
        RINGFENCE_EXPECTS(bytes <= it->first + it->second - p, "{}: region [{}, +{}) runs past its allocation of {} bytes",
                          shared_->who(), ptr, bytes, it->second);
        k.base = it->first;
      }
    }
    k.offset = p - k.base;
    const int err = shared_->api.ipc_get_mem_handle(&k.handle, reinterpret_cast<void*>(k.base));
    if (err != detail::kCudaSuccess)
      throw CudaError(fmt::format("{}: cannot share device buffer {}: {} (register memory from allocate(), or the base "
                                  "pointer of a whole cudaMalloc allocation)",
                                  shared_->who(), ptr, shared_->api.describe("cudaIpcGetMemHandle", err)),
                      err);
    impl->key_bytes = encode(k);
    return MemoryRegion(std::move(impl), ptr, bytes, kind);
  }

  RemoteRegion import_region(std::span<const std::byte> peer_key) override {
    RINGFENCE_EXPECTS(!peer_key.empty(), "{}: empty region key", shared_->who());
    auto remote = std::make_unique<Remote>();
    const auto tag = static_cast<Tag>(peer_key[0]);
    if (tag == Tag::Host) {
      remote->tag = Tag::Host;
      remote->inner = shared_->inner->import_region(peer_key.subspan(1));
      const std::size_t bytes = remote->inner.size();
      return RemoteRegion(std::move(remote), bytes);
    }
    RINGFENCE_EXPECTS(tag == Tag::Device, "{}: malformed region key (tag {})", shared_->who(), static_cast<int>(peer_key[0]));
    const DeviceKey k = decode_device_key(peer_key, shared_->who());
    shared_->require_usable();
    remote->tag = Tag::Device;
    if (k.pid == static_cast<std::int32_t>(::getpid())) {
      remote->ptr = reinterpret_cast<std::byte*>(k.base + k.offset);  // CUDA refuses a process its own handle
    } else {
      remote->opened = open(k);
      remote->ptr = static_cast<std::byte*>(remote->opened->base) + k.offset;
    }
    return RemoteRegion(std::move(remote), k.bytes);
  }

  std::unique_ptr<ListenHandle> listen() override {
    return std::make_unique<CudaListen>(shared_->inner->listen(), shared_->device);
  }

  std::unique_ptr<PendingLink> connect(ListenHandle& local, const PeerInfo& peer, std::span<const std::byte> address) override {
    shared_->require_usable();
    std::uint32_t len = 0;
    RINGFENCE_EXPECTS(address.size() >= 8, "{}: malformed address of rank {} ({} bytes)", shared_->who(), peer.rank, address.size());
    std::memcpy(&len, address.data(), 4);
    RINGFENCE_EXPECTS(len == address.size() - 8, "{}: malformed address of rank {}", shared_->who(), peer.rank);
    std::int32_t peer_device = 0;
    std::memcpy(&peer_device, address.data() + 4 + len, 4);
    auto pending = shared_->inner->connect(static_cast<CudaListen&>(local).inner(), peer, address.subspan(4, len));
    std::unique_ptr<Link> inner;
    const Status s = pending->try_finish(inner);
    RINGFENCE_EXPECTS(s.is_ok(), "{}: shm link to rank {} did not come up ({})", shared_->who(), peer.rank, to_string(s.code()));
    if (shared_->mode == Mode::Nvlink && peer_device != shared_->device) enable_peer(peer, peer_device);
    return std::make_unique<transport_util::ReadyPendingLink>(std::make_unique<CudaLink>(shared_, peer.rank, std::move(inner)));
  }

 private:
  void enable_peer(const PeerInfo& peer, int peer_device) {
    Shared& s = *shared_;
    int can = 0;
    s.check(s.api.device_can_access_peer(&can, s.device, peer_device), "cudaDeviceCanAccessPeer");
    if (can == 0)
      throw CudaError(fmt::format("{}: GPU {} cannot access GPU {} of rank {} peer to peer (cudaDeviceCanAccessPeer = 0); "
                                  "use the pcie transport for this pair",
                                  s.who(), s.device, peer_device, peer.rank),
                      0);
    const int err = s.api.device_enable_peer_access(peer_device, 0);
    if (err != detail::kCudaErrorPeerAccessAlreadyEnabled) s.check(err, "cudaDeviceEnablePeerAccess");
  }

  std::shared_ptr<Opened> open(const DeviceKey& k) {
    std::lock_guard lock(shared_->mutex);
    auto& slot = shared_->opened[{k.pid, k.base}];
    if (auto live = slot.lock()) return live;
    auto o = std::make_shared<Opened>();
    o->owner = shared_;
    const int err = shared_->api.ipc_open_mem_handle(&o->base, k.handle, detail::kCudaIpcMemLazyEnablePeerAccess);
    if (err != detail::kCudaSuccess) {
      o->base = nullptr;
      throw CudaError(fmt::format("{}: cannot open the device buffer of pid {} (GPU {}): {}", shared_->who(), k.pid, k.device,
                                  shared_->api.describe("cudaIpcOpenMemHandle", err)),
                      err);
    }
    slot = o;
    return o;
  }

  std::shared_ptr<Shared> shared_;
};

}  // namespace

std::unique_ptr<Transport> make_nvlink_transport(const TransportContext& context) {
  return std::make_unique<CudaIpcTransport>(context, Mode::Nvlink);
}
std::unique_ptr<Transport> make_pcie_transport(const TransportContext& context) {
  return std::make_unique<CudaIpcTransport>(context, Mode::Pcie);
}

}  // namespace ringfence::transports::cuda_ipc
