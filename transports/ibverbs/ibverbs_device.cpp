// libibverbs loaded at run time (dlopen, entry points by dlvsym) and the device's asynchronous
// events, drained by the links (ports going down or up, fatal queue pair or device errors).
#include <dlfcn.h>

#include <memory>
#include <mutex>
#include <ringfence/log.hpp>
#include <string>

#include "ibverbs_device.hpp"
#include "ibverbs_link.hpp"

namespace ringfence::transports::ibverbs::detail {
namespace {

template <class F>
bool resolve(void* handle, F& fn, const char* name) {
  void* p = ::dlvsym(handle, name, "IBVERBS_1.1");
  if (!p) p = ::dlsym(handle, name);
  fn = reinterpret_cast<F>(p);
  return p != nullptr;
}

}  // namespace

// nullptr (and `why`) when the library or one of its symbols is missing.
std::unique_ptr<Verbs> load_verbs(const std::string& path, std::string& why) {
  auto v = std::make_unique<Verbs>();
  v->handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!v->handle) {
    const char* e = ::dlerror();
    why = fmt::format("cannot load {} ({})", path, e ? e : "unknown error");
    return nullptr;
  }
  bool ok = true;
  auto need = [&](auto& fn, const char* name) {
    if (!resolve(v->handle, fn, name)) {
      ok = false;
      why = fmt::format("{} lacks {}", path, name);
    }
  };
  need(v->get_device_list, "ibv_get_device_list");
  need(v->free_device_list, "ibv_free_device_list");
  need(v->get_device_name, "ibv_get_device_name");
  need(v->open_device, "ibv_open_device");
  need(v->close_device, "ibv_close_device");
  need(v->query_device, "ibv_query_device");
  need(v->query_port, "ibv_query_port");
  need(v->query_gid, "ibv_query_gid");
  need(v->alloc_pd, "ibv_alloc_pd");
  need(v->dealloc_pd, "ibv_dealloc_pd");
  need(v->reg_mr, "ibv_reg_mr");
  need(v->dereg_mr, "ibv_dereg_mr");
  need(v->create_cq, "ibv_create_cq");
  need(v->destroy_cq, "ibv_destroy_cq");
  need(v->create_qp, "ibv_create_qp");
  need(v->modify_qp, "ibv_modify_qp");
  need(v->destroy_qp, "ibv_destroy_qp");
  need(v->get_async_event, "ibv_get_async_event");
  need(v->ack_async_event, "ibv_ack_async_event");
  (void)resolve(v->handle, v->reg_dmabuf_mr, "ibv_reg_dmabuf_mr");  // optional: GPUDirect RDMA only
  return ok ? std::move(v) : nullptr;
}

void Device::drain_async_events() noexcept {
  std::unique_lock lock(links_mu, std::try_to_lock);
  if (!lock.owns_lock()) return;  // another link is draining
  ibv_async_event e{};
  while (verbs->get_async_event(ctx, &e) == 0) {  // async_fd is non-blocking: -1 when empty
    const AsyncClass c = classify_async_event(e.event_type);
    switch (c.action) {
      case AsyncAction::Ignore: break;
      case AsyncAction::Log: log->info("ibverbs {}:{}: async event {}", name, port, c.name); break;
      case AsyncAction::PortDown:
        port_down.store(true, std::memory_order_relaxed);
        log->warn("ibverbs {}:{}: port error: links on this port report peer-unreachable", name, port);
        break;
      case AsyncAction::PortUp:
        port_down.store(false, std::memory_order_relaxed);
        log->warn("ibverbs {}:{}: port active again", name, port);
        break;
      case AsyncAction::FenceQp:
        for (IbLink* l : links)
          if (l->owns(e)) {
            l->mark_fatal();
            log->warn("ibverbs {}:{}: {} on the link to rank {}: fencing it", name, port, c.name, l->peer());
          }
        break;
      case AsyncAction::FenceDevice:
        device_fatal.store(true, std::memory_order_relaxed);
        log->error("ibverbs {}: device fatal error: fencing every link", name);
        break;
    }
    verbs->ack_async_event(&e);  // always last, as NCCL does: the event may refer to objects
  }
}

}  // namespace ringfence::transports::ibverbs::detail
