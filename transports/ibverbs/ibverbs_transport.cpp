// The ibverbs transport (IbTransport): device and port choice, memory registration, listen and
// connect; the other parts are listed below.
//
// The ibverbs transport: RC queue pairs, RDMA WRITE for writes, RDMA WRITE WITH IMM for
// signals, host memory through ibv_reg_mr. libibverbs is dlopen'ed (README: why), so a process
// on a machine without rdma-core, or without an HCA, creates this transport normally and it
// reaches nobody. Pure parts (blobs, queue pair attributes, error classes) are in
// ibverbs_detail.cpp and unit-tested without hardware; the files below need an HCA to run:
// ibverbs_device.{hpp,cpp} (libibverbs entry points, device, regions, async events),
// ibverbs_qp.cpp (queue pairs), ibverbs_link.hpp (the link's data path) and this file.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <ringfence/error.hpp>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/transport_util.hpp>
#include <ringfence/transports/ibverbs.hpp>

#include "dmabuf.hpp"
#include "ibverbs_detail.hpp"
#include "ibverbs_device.hpp"
#include "ibverbs_link.hpp"

namespace ringfence::transports::ibverbs {
namespace {

using namespace detail;

class IbListen final : public ListenHandle {
 public:
  IbListen(ConnInfo info, std::vector<QpSet> qps) : info_(std::move(info)), qps_(std::move(qps)) {}
  Bytes address() const override { return serialize(info_); }
  const ConnInfo& info() const noexcept { return info_; }
  std::vector<QpSet>& qps() noexcept { return qps_; }

 private:
  ConnInfo info_;
  std::vector<QpSet> qps_;  // indexed by peer rank; taken by connect()
};

class IbTransport final : public Transport {
 public:
  explicit IbTransport(const TransportContext& context) : self_(context.self), size_(context.size) {
    log_ = context.log ? context.log : &own_log_;
    const Options options = Options::from(context.options);
    const HcaFilter filter = parse_hca_filter(options.hca);  // throws on a malformed list
    std::string why;
    auto verbs = load_verbs(options.library, why);
    if (!verbs) {
      unusable_ = why;
      return;
    }
    open(std::move(verbs), options, filter);
    if (dev_)
      log_->info("ibverbs: using {}:{} ({}, lid {}, {:.1f} GB/s)", dev_->name, dev_->port,
                 dev_->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", dev_->port_attr.lid, dev_->gbps);
    else
      log_->debug("ibverbs: unusable: {}", unusable_);
  }

  std::string_view name() const noexcept override { return kName; }

  Reachability can_reach(const PeerInfo& self, const PeerInfo& peer) const override {
    Reachability r;
    if (!dev_) {
      r.reason = unusable_;
      return r;
    }
    if (self.rank == peer.rank) {
      r.reason = "a rank does not connect to itself";
      return r;
    }
    r.ok = true;
    r.bandwidth_gbps = dev_->gbps > 0 ? dev_->gbps : 12.5;
    r.latency_us = 2.0;
    return r;
  }

  MemoryRegion register_memory(void* ptr, std::size_t bytes, MemoryKind kind) override {
    RINGFENCE_EXPECTS(dev_ != nullptr, "rank {}: ibverbs has no usable HCA port ({})", self_.rank, unusable_);
    RINGFENCE_EXPECTS(ptr != nullptr && bytes > 0, "rank {}: ibverbs register_memory(ptr={}, bytes={}): empty region",
                      self_.rank, ptr, bytes);
    if (kind == MemoryKind::Device) return register_device(ptr, bytes);
    ibv_mr* mr = dev_->verbs->reg_mr(dev_->pd, ptr, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!mr)
      throw IbvError(fmt::format("rank {}: ibv_reg_mr({}, {} bytes) on {} failed: {}", self_.rank, ptr, bytes, dev_->name,
                                 std::strerror(errno)),
                     errno);
    return MemoryRegion(std::make_unique<LocalImpl>(dev_, mr, reinterpret_cast<std::uintptr_t>(ptr), bytes), ptr, bytes, kind);
  }

  // GPUDirect RDMA: the pages around [ptr, ptr + bytes) exported by the CUDA driver as a
  // dma-buf and registered with their device addresses as I/O virtual addresses, so peers
  // write at `ptr + offset` exactly as into host memory.
  MemoryRegion register_device(void* ptr, std::size_t bytes) {
    RINGFENCE_EXPECTS(dev_->verbs->reg_dmabuf_mr != nullptr,
                      "rank {}: ibverbs cannot register device memory at {}: this libibverbs lacks ibv_reg_dmabuf_mr "
                      "(rdma-core 34 or later is needed for GPUDirect RDMA)",
                      self_.rank, ptr);
    const CudaDmaBuf& dmabuf = cuda_dmabuf();
    if (!dmabuf.usable())
      throw CudaError(fmt::format("rank {}: ibverbs cannot register device memory at {} ({} bytes): {}", self_.rank, ptr, bytes,
                                  dmabuf.why_not()),
                      0);
    const PageSpan span = page_span(reinterpret_cast<std::uintptr_t>(ptr), bytes, static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)));
    RINGFENCE_EXPECTS(span.length > 0, "rank {}: ibverbs register_memory({}, {} bytes): the range wraps around", self_.rank, ptr, bytes);
    int fd = -1;
    try {
      fd = dmabuf.export_pages(span);
    } catch (const CudaError& e) {
      throw CudaError(fmt::format("rank {}: ibverbs cannot register device memory at {}: {}", self_.rank, ptr, e.what()), e.native());
    }
    ibv_mr* mr = dev_->verbs->reg_dmabuf_mr(dev_->pd, 0, span.length, span.start, fd,
                                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    const int err = errno;
    ::close(fd);  // the registration holds its own reference
    if (!mr)
      throw IbvError(fmt::format("rank {}: ibv_reg_dmabuf_mr({:#x}, {} bytes) on {} failed: {} (does the HCA driver support "
                                 "dma-buf? mlx5 on Linux 5.12+ does)",
                                 self_.rank, span.start, span.length, dev_->name, std::strerror(err)),
                     err);
    return MemoryRegion(std::make_unique<LocalImpl>(dev_, mr, reinterpret_cast<std::uintptr_t>(ptr), bytes), ptr, bytes,
                        MemoryKind::Device);
  }

  const CudaDmaBuf& cuda_dmabuf() {
    std::lock_guard lock(dmabuf_mu_);
    if (!dmabuf_) dmabuf_ = std::make_unique<CudaDmaBuf>();
    return *dmabuf_;
  }

  RemoteRegion import_region(std::span<const std::byte> peer_key) override {
    const RegionKey key = parse_region_key(peer_key);
    return RemoteRegion(std::make_unique<RemoteImpl>(key), static_cast<std::size_t>(key.length));
  }

  std::unique_ptr<ListenHandle> listen() override {
    RINGFENCE_EXPECTS(dev_ != nullptr, "rank {}: ibverbs listen(): no usable HCA port ({})", self_.rank, unusable_);
    ConnInfo info;
    info.rank = static_cast<std::uint32_t>(self_.rank);
    info.lid = dev_->port_attr.lid;
    info.port = static_cast<std::uint8_t>(dev_->port);
    info.mtu = static_cast<std::uint8_t>(dev_->port_attr.active_mtu);
    info.link_layer = dev_->port_attr.link_layer;
    std::memcpy(info.gid.data(), dev_->gid.raw, info.gid.size());
    std::random_device rd;
    info.psn = rd() & 0xffffff;
    info.qpns.assign(static_cast<std::size_t>(size_), 0);
    // One queue pair per possible peer, so one published address serves every connect().
    std::vector<QpSet> qps(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      if (r == self_.rank) continue;
      qps[static_cast<std::size_t>(r)] = make_qp(dev_, r);
      info.qpns[static_cast<std::size_t>(r)] = qps[static_cast<std::size_t>(r)].qp->qp_num;
    }
    return std::make_unique<IbListen>(std::move(info), std::move(qps));
  }

  std::unique_ptr<PendingLink> connect(ListenHandle& local, const PeerInfo& peer,
                                       std::span<const std::byte> peer_address) override {
    auto* listen = dynamic_cast<IbListen*>(&local);
    RINGFENCE_EXPECTS(listen != nullptr, "rank {}: ibverbs connect() to rank {} with another transport's listen handle",
                      self_.rank, peer.rank);
    const ConnInfo remote = parse_conn_info(peer_address);
    RINGFENCE_EXPECTS(remote.rank == static_cast<std::uint32_t>(peer.rank) && remote.qpns.size() == static_cast<std::size_t>(size_),
                      "rank {}: ibverbs address for rank {} describes rank {} of {} ranks (expected {} ranks)", self_.rank,
                      peer.rank, remote.rank, remote.qpns.size(), size_);
    RINGFENCE_EXPECTS(peer.rank >= 0 && peer.rank < size_ && peer.rank != self_.rank, "rank {}: ibverbs connect(): bad peer rank {}",
                      self_.rank, peer.rank);
    QpSet qp = std::move(listen->qps()[static_cast<std::size_t>(peer.rank)]);
    RINGFENCE_EXPECTS(qp.qp != nullptr, "rank {}: ibverbs connect() to rank {} twice on one listen handle", self_.rank, peer.rank);
    const QpParams params = params_of(*dev_);
    QpTransition rtr = rtr_transition(params, remote, remote.qpns[static_cast<std::size_t>(self_.rank)]);
    if (const int rc = dev_->verbs->modify_qp(qp.qp, &rtr.attr, rtr.mask); rc != 0)
      throw IbvError(fmt::format("rank {}: ibv_modify_qp INIT->RTR towards rank {} (lid {}, qpn {:#x}) failed: {}", self_.rank,
                                 peer.rank, remote.lid, rtr.attr.dest_qp_num, std::strerror(rc)),
                     rc);
    QpTransition rts = rts_transition(params, listen->info().psn);
    if (const int rc = dev_->verbs->modify_qp(qp.qp, &rts.attr, rts.mask); rc != 0)
      throw IbvError(fmt::format("rank {}: ibv_modify_qp RTR->RTS towards rank {} failed: {}", self_.rank, peer.rank, std::strerror(rc)), rc);
    return std::make_unique<transport_util::ReadyPendingLink>(std::make_unique<IbLink>(dev_, std::move(qp), peer.rank));
  }

 private:
  void open(std::unique_ptr<Verbs> verbs, const Options& options, const HcaFilter& filter) {
    int n = 0;
    ibv_device** list = verbs->get_device_list(&n);
    if (!list || n == 0) {
      unusable_ = "no InfiniBand/RoCE device (ibv_get_device_list found none)";
      if (list) verbs->free_device_list(list);
      return;
    }
    // Enumerate every device's ports, then choose (pure: choose_port).
    std::vector<HcaPort> ports;
    std::vector<int> device_of;
    for (int d = 0; d < n; ++d) {
      ibv_context* ctx = verbs->open_device(list[d]);
      if (!ctx) continue;
      ibv_device_attr attr{};
      const int phys = verbs->query_device(ctx, &attr) == 0 ? attr.phys_port_cnt : 1;
      for (int p = 1; p <= phys; ++p) {
        ibv_port_attr pa{};
        const bool ok = verbs->query_port(ctx, static_cast<std::uint8_t>(p), &pa) == 0;
        ports.push_back(HcaPort{verbs->get_device_name(list[d]), p, ok && pa.state == IBV_PORT_ACTIVE});
        device_of.push_back(d);
      }
      verbs->close_device(ctx);
    }
    const auto choice = choose_port(ports, filter);
    if (!choice) {
      unusable_ = fmt::format("no ACTIVE port among {} port(s) passes RINGFENCE_IB_HCA='{}'", ports.size(), options.hca);
      verbs->free_device_list(list);
      return;
    }
    const int d = device_of[static_cast<std::size_t>(std::find_if(ports.begin(), ports.end(), [&](const HcaPort& p) {
                                                        return p.device == choice->device && p.port == choice->port;
                                                      }) - ports.begin())];
    auto dev = std::make_shared<Device>();
    dev->options = options;
    dev->log = log_;
    dev->rank = self_.rank;
    dev->name = choice->device;
    dev->port = choice->port;
    dev->ctx = verbs->open_device(list[d]);
    Verbs& v = *verbs;
    dev->verbs = std::move(verbs);
    v.free_device_list(list);
    if (!dev->ctx) {
      unusable_ = fmt::format("ibv_open_device({}) failed: {}", dev->name, std::strerror(errno));
      return;
    }
    // Async events are drained from poll(); the fd must not block.
    const int flags = ::fcntl(dev->ctx->async_fd, F_GETFL);
    if (flags < 0 || ::fcntl(dev->ctx->async_fd, F_SETFL, flags | O_NONBLOCK) < 0) {
      unusable_ = fmt::format("{}: cannot make the async event fd non-blocking: {}", dev->name, std::strerror(errno));
      return;
    }
    if (v.query_port(dev->ctx, static_cast<std::uint8_t>(dev->port), &dev->port_attr) != 0 ||
        v.query_gid(dev->ctx, static_cast<std::uint8_t>(dev->port), options.gid_index, &dev->gid) != 0) {
      unusable_ = fmt::format("{}:{}: ibv_query_port/ibv_query_gid(index {}) failed: {}", dev->name, dev->port, options.gid_index,
                              std::strerror(errno));
      return;
    }
    dev->pd = v.alloc_pd(dev->ctx);
    if (!dev->pd) {
      unusable_ = fmt::format("ibv_alloc_pd({}) failed: {}", dev->name, std::strerror(errno));
      return;
    }
    dev->gbps = port_gbps(dev->port_attr.active_width, dev->port_attr.active_speed);
    dev_ = std::move(dev);
  }

  PeerInfo self_;
  int size_ = 1;
  Logger own_log_{LogLevel::Warn, -1};  // used when the context brings no logger
  const Logger* log_ = nullptr;
  std::shared_ptr<Device> dev_;  // null: unusable_ says why
  std::string unusable_;
  std::mutex dmabuf_mu_;
  std::unique_ptr<CudaDmaBuf> dmabuf_;  // the CUDA driver, loaded at the first device registration
};

}  // namespace

namespace {
constexpr SettingKey kSettings[] = {
    {"RINGFENCE_IB_HCA", "devices and ports (NCCL_IB_HCA syntax)"},
    {"RINGFENCE_IB_GID_INDEX", "GID index (0..255)"},
    {"RINGFENCE_IB_TIMEOUT", "ACK timeout exponent (1..31)"},
    {"RINGFENCE_IB_RETRY_CNT", "retries (0..7)"},
    {"RINGFENCE_IB_SL", "service level (0..15)"},
    {"RINGFENCE_IB_TC", "traffic class (0..255)"},
    {"RINGFENCE_IB_STAGING_BYTES", "bounce buffer per link for unregistered sources"},
    {"RINGFENCE_IB_LIBRARY", "libibverbs to dlopen"},
};
}  // namespace

std::span<const SettingKey> setting_keys() noexcept { return kSettings; }

Options Options::from(const CommOptions* options) {
  const SettingsReader r(options);
  Options o;
  if (auto v = r.text("RINGFENCE_IB_HCA")) {
    // Kept as text, parsed when the transport is created; an empty list is refused here.
    RINGFENCE_EXPECTS(!v->empty(), "environment variable RINGFENCE_IB_HCA='' is invalid: expected a device list such as "
                                   "mlx5_0:1,mlx5_1 or ^mlx5_2");
    o.hca = *v;
  }
  o.gid_index = static_cast<int>(r.integer("RINGFENCE_IB_GID_INDEX", o.gid_index, 0, 255));
  o.timeout = static_cast<int>(r.integer("RINGFENCE_IB_TIMEOUT", o.timeout, 1, 31));
  o.retry_count = static_cast<int>(r.integer("RINGFENCE_IB_RETRY_CNT", o.retry_count, 0, 7));
  o.service_level = static_cast<int>(r.integer("RINGFENCE_IB_SL", o.service_level, 0, 15));
  o.traffic_class = static_cast<int>(r.integer("RINGFENCE_IB_TC", o.traffic_class, 0, 255));
  o.staging_bytes = r.bytes("RINGFENCE_IB_STAGING_BYTES", o.staging_bytes);
  o.library = r.text("RINGFENCE_IB_LIBRARY").value_or(o.library);
  return o;
}

std::unique_ptr<Transport> make_transport(const TransportContext& context) { return std::make_unique<IbTransport>(context); }

}  // namespace ringfence::transports::ibverbs
