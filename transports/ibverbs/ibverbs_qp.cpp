// Queue pairs of the ibverbs transport: one RC queue pair with its completion queues per peer,
// created and moved to INIT (the device's settings as QpParams).
#include <cerrno>
#include <cstring>
#include <memory>
#include <ringfence/error.hpp>

#include "ibverbs_device.hpp"

namespace ringfence::transports::ibverbs::detail {

QpParams params_of(const Device& d) {
  QpParams p;
  p.port = static_cast<std::uint8_t>(d.port);
  p.timeout = static_cast<std::uint8_t>(d.options.timeout);
  p.retry_count = static_cast<std::uint8_t>(d.options.retry_count);
  p.service_level = static_cast<std::uint8_t>(d.options.service_level);
  p.traffic_class = static_cast<std::uint8_t>(d.options.traffic_class);
  p.gid_index = static_cast<std::uint8_t>(d.options.gid_index);
  p.local_mtu = static_cast<std::uint8_t>(d.port_attr.active_mtu);
  p.local_link_layer = d.port_attr.link_layer;
  return p;
}

QpSet make_qp(const std::shared_ptr<Device>& dev, int peer) {
  QpSet s;
  s.dev = dev;
  auto& v = *dev->verbs;
  s.send_cq = v.create_cq(dev->ctx, kQueueDepth, nullptr, nullptr, 0);
  s.recv_cq = v.create_cq(dev->ctx, kQueueDepth, nullptr, nullptr, 0);
  if (!s.send_cq || !s.recv_cq)
    throw IbvError(fmt::format("rank {}: ibv_create_cq on {} for peer {} failed: {}", dev->rank, dev->name, peer, std::strerror(errno)), errno);
  ibv_qp_init_attr init{};
  init.send_cq = s.send_cq;
  init.recv_cq = s.recv_cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = kQueueDepth;
  init.cap.max_recv_wr = kQueueDepth;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.cap.max_inline_data = 64;  // signals are 4 bytes, sent inline
  s.qp = v.create_qp(dev->pd, &init);
  if (!s.qp)
    throw IbvError(fmt::format("rank {}: ibv_create_qp (RC) on {} for peer {} failed: {}", dev->rank, dev->name, peer, std::strerror(errno)), errno);
  // The provider writes back what it granted; signals need 4 bytes of inline data.
  if (init.cap.max_inline_data < sizeof(std::uint32_t))
    throw IbvError(fmt::format("rank {}: {} grants {} bytes of inline data per send, signals need 4", dev->rank, dev->name,
                               init.cap.max_inline_data),
                   0);
  QpTransition t = init_transition(params_of(*dev));
  if (const int rc = v.modify_qp(s.qp, &t.attr, t.mask); rc != 0)
    throw IbvError(fmt::format("rank {}: ibv_modify_qp RESET->INIT for peer {} failed: {}", dev->rank, peer, std::strerror(rc)), rc);
  return s;
}

}  // namespace ringfence::transports::ibverbs::detail
