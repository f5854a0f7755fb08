#pragma once
// Internal to the ibverbs transport: the libibverbs entry points it loads (Verbs), the opened
// device and port (Device), registered and imported regions, and one RC queue pair (QpSet).
#include <dlfcn.h>
#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/transport.hpp>
#include <ringfence/transports/ibverbs.hpp>
#include <string>
#include <utility>
#include <vector>

#include "ibverbs_detail.hpp"

namespace ringfence::transports::ibverbs::detail {

// Send/receive queue depth per link; the completion FIFO and the CQs are sized from it.
inline constexpr int kQueueDepth = 256;
inline constexpr std::size_t kMaxMessage = std::size_t{1} << 30;  // RC messages are at most 2^31 bytes

// The libibverbs entry points we call, resolved with dlvsym at the IBVERBS_1.1 ABI (as NCCL
// does). ibv_post_send/ibv_post_recv/ibv_poll_cq are inline in verbs.h (they call through the
// context's ops table) and need no symbol.
struct Verbs {
  void* handle = nullptr;
  ibv_device** (*get_device_list)(int*) = nullptr;
  void (*free_device_list)(ibv_device**) = nullptr;
  const char* (*get_device_name)(ibv_device*) = nullptr;
  ibv_context* (*open_device)(ibv_device*) = nullptr;
  int (*close_device)(ibv_context*) = nullptr;
  int (*query_device)(ibv_context*, ibv_device_attr*) = nullptr;
  int (*query_port)(ibv_context*, std::uint8_t, ibv_port_attr*) = nullptr;
  int (*query_gid)(ibv_context*, std::uint8_t, int, ibv_gid*) = nullptr;
  ibv_pd* (*alloc_pd)(ibv_context*) = nullptr;
  int (*dealloc_pd)(ibv_pd*) = nullptr;
  ibv_mr* (*reg_mr)(ibv_pd*, void*, std::size_t, int) = nullptr;
  int (*dereg_mr)(ibv_mr*) = nullptr;
  /// ibv_reg_dmabuf_mr (rdma-core 34+): optional, only device memory needs it.
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd*, std::uint64_t, std::size_t, std::uint64_t, int, int) = nullptr;
  ibv_cq* (*create_cq)(ibv_context*, int, void*, ibv_comp_channel*, int) = nullptr;
  int (*destroy_cq)(ibv_cq*) = nullptr;
  ibv_qp* (*create_qp)(ibv_pd*, ibv_qp_init_attr*) = nullptr;
  int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int) = nullptr;
  int (*destroy_qp)(ibv_qp*) = nullptr;
  int (*get_async_event)(ibv_context*, ibv_async_event*) = nullptr;
  void (*ack_async_event)(ibv_async_event*) = nullptr;

  Verbs() = default;
  Verbs(const Verbs&) = delete;
  Verbs& operator=(const Verbs&) = delete;
  ~Verbs() {
    if (handle) ::dlclose(handle);
  }
};

std::unique_ptr<Verbs> load_verbs(const std::string& path, std::string& why);

class IbLink;

// The opened device and port, shared by the transport, its listen handles, links and regions
// (whichever goes last closes the device).
struct Device {
  std::unique_ptr<Verbs> verbs;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  std::string name;
  int port = 1;
  ibv_port_attr port_attr{};
  ibv_gid gid{};
  double gbps = 0;
  Options options;
  const Logger* log = nullptr;
  int rank = -1;

  // Async events: drained without blocking by whichever link's poll() gets the lock (no
  // hidden thread); they set these flags, which links read on their own thread.
  std::mutex links_mu;
  std::vector<IbLink*> links;
  std::atomic<bool> port_down{false};
  std::atomic<bool> device_fatal{false};

  Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  ~Device() {
    if (pd) verbs->dealloc_pd(pd);
    if (ctx) verbs->close_device(ctx);
  }
  void drain_async_events() noexcept;
};

// A registration. `addr`/`length` are the registered range as peers address it: the MR's own
// for host memory; for device memory (dma-buf) the MR covers whole pages around it.
struct LocalImpl final : MemoryRegion::Impl {
  std::shared_ptr<Device> dev;
  ibv_mr* mr = nullptr;
  std::uintptr_t addr = 0;
  std::uint64_t length = 0;
  LocalImpl(std::shared_ptr<Device> d, ibv_mr* m, std::uintptr_t a, std::uint64_t len) : dev(std::move(d)), mr(m), addr(a), length(len) {}
  ~LocalImpl() override { dev->verbs->dereg_mr(mr); }
  Bytes key() const override { return serialize(RegionKey{addr, length, mr->rkey}); }
};

struct RemoteImpl final : RemoteRegion::Impl {
  RegionKey key;
  explicit RemoteImpl(RegionKey k) : key(k) {}
};

// One RC queue pair with its two completion queues (send completions are reported by poll;
// receive completions only recycle receive WQEs consumed by the peer's signals).
struct QpSet {
  std::shared_ptr<Device> dev;
  ibv_cq* send_cq = nullptr;
  ibv_cq* recv_cq = nullptr;
  ibv_qp* qp = nullptr;
  QpSet() = default;
  QpSet(QpSet&& o) noexcept { *this = std::move(o); }
  QpSet& operator=(QpSet&& o) noexcept {
    std::swap(dev, o.dev);
    std::swap(send_cq, o.send_cq);
    std::swap(recv_cq, o.recv_cq);
    std::swap(qp, o.qp);
    return *this;
  }
  ~QpSet() {
    if (qp) dev->verbs->destroy_qp(qp);
    if (send_cq) dev->verbs->destroy_cq(send_cq);
    if (recv_cq) dev->verbs->destroy_cq(recv_cq);
  }
};

QpParams params_of(const Device& d);
QpSet make_qp(const std::shared_ptr<Device>& dev, int peer);

}  // namespace ringfence::transports::ibverbs::detail
