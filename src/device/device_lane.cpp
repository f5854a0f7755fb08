#include "device_lane.hpp"

#include <algorithm>
#include <ringfence/error.hpp>

namespace ringfence::detail {

Transport* DeviceLane::transport(int peer, std::string_view name) const {
  for (const auto& t : ctx_.transports)
    if ((name.empty() || t->name() == name) && t->traits().writes_device_memory && t->can_reach(ctx_.self, ctx_.peer(peer)).ok) return t.get();
  return nullptr;
}

Transport* DeviceLane::fallback(const std::string& from, int peer) const {
  for (const auto& [a, b] : ctx_.fallbacks)
    if (a == from)
      if (Transport* t = transport(peer, b)) return t;
  return nullptr;
}

// This rank's reason it cannot run device regions (empty: it can); `via[p]` gets the device
// transport to rank p (its fallback for a pair fenced or moved before the lane was built).
std::string DeviceLane::refusal(std::vector<Transport*>& via) {
  const CommOptions& options = ctx_.options;
  if (const char* why = configured_off()) return why;
  cuda_ = load_cuda_api(options.cuda_runtime);
  if (!cuda_.usable) return cuda_.why_not;
  if (!cuda_.ipc) return cuda_.ipc_why_not;
  if (!cuda_.set_device) return fmt::format("{} lacks cudaSetDevice", cuda_.library);
  via.assign(static_cast<std::size_t>(ctx_.size), nullptr);
  for (int p = 0; p < ctx_.size; ++p) {
    if (p == ctx_.rank) continue;
    Transport*& t = via[static_cast<std::size_t>(p)];
    t = transport(p);
    if (!t) return fmt::format("no transport writes device memory to rank {} (register nvlink or pcie, transports/cuda_ipc/README.md)", p);
    if (plan_.is_fenced(ctx_.rank, p) || plan_.was_moved(LinkId::of(ctx_.rank, p)))
      if (Transport* f = fallback(std::string(t->name()), p)) t = f;
  }
  if (!kernels_loaded_) kernels_ = load_device_kernels(options.cuda_kernels);  // last: only where it would be used
  if (!kernels_.usable) return kernels_.why_not;
  return {};
}

// The reason this communicator's configuration rules device regions out, whatever the machine
// has; nullptr when it does not.
const char* DeviceLane::configured_off() const noexcept {
  if (ctx_.options.device_regions == DeviceRegionsMode::Off) return "RINGFENCE_DEVICE_REGIONS=off";
  if (lanes_.main().engine.checksum) return "checksums are on (RINGFENCE_CHECKSUM): chunks are verified on the host";
  if (ctx_.store->collective_only()) return "the bootstrap store is collective-only (MPI): the device lane is built lazily";
  return nullptr;
}

void DeviceLane::prepare() noexcept {
  const CommOptions& options = ctx_.options;
  if (configured_off() != nullptr) return;
  if (std::none_of(ctx_.transports.begin(), ctx_.transports.end(), [](const auto& t) { return t->traits().writes_device_memory; }))
    return;
  try {
    // No runtime or no device: nothing to load into, and decide() says why if a call asks.
    if (!load_cuda_api(options.cuda_runtime).usable) return;
    kernels_ = load_device_kernels(options.cuda_kernels);
    kernels_loaded_ = true;
    if (!kernels_.usable) return;  // decide() refuses with kernels_.why_not
    if (const int err = kernels_.preload(); err != kCudaSuccess) {
      kernels_.usable = false;
      kernels_.why_not = fmt::format("{}: loading its kernels failed (ringfence_kernels_preload: CUDA error {})", kernels_.library, err);
      ctx_.log.warn("device regions unavailable: {}", kernels_.why_not);
    }
  } catch (const std::exception& e) {  // formatting only; the module's loader never throws
    ctx_.log.warn("device regions: preparing the kernel module failed: {}", e.what());
  }
}

bool DeviceLane::decide(const char* call) {
  if (verdict_ != 0) return verdict_ > 0;
  failure_.throw_if_failed(call);
  const int rank = ctx_.rank;
  Store& store = *ctx_.store;
  std::vector<Transport*> via;
  const std::string mine = refusal(via);
  // Every rank posts its answer (a collective-only store, the same on every rank, refuses on
  // every rank and takes none). A rank that cannot decides alone: staged, whatever the others
  // say, and they read its "no"; one that can must hear every other rank's "yes".
  if (!store.collective_only()) store.set(fmt::format("device/{}/can", rank), to_bytes(mine.empty() ? std::string("1") : "0" + mine));
  std::string first = mine.empty() ? std::string() : fmt::format("rank {}: {}", rank, mine);  // the first refusal
  for (int r = 0; r < ctx_.size && first.empty(); ++r) {
    const std::string v = to_string(store.get(fmt::format("device/{}/can", r), ctx_.options.timeout));
    if (v.empty() || v[0] != '1') first = fmt::format("rank {}: {}", r, v.empty() ? std::string("?") : v.substr(1));
  }
  if (!first.empty()) {
    verdict_ = -1;
    why_not_ = first;
    if (ctx_.options.device_regions == DeviceRegionsMode::On)
      throw CudaError(fmt::format("rank {}: {} on a CUDA stream: device regions are required (RINGFENCE_DEVICE_REGIONS=on) but {}",
                                  rank, call, first),
                      0);
    ctx_.log.info("stream-ordered collectives are host-staged: {}", first);
    return false;
  }
  build(call, via);
  verdict_ = 1;
  ctx_.log.info("stream-ordered collectives run on device regions ({} kernels)", kernels_.library);
  return true;
}

void DeviceLane::build(const char* call, const std::vector<Transport*>& via) {
  const int rank = ctx_.rank;
  auto L = std::make_unique<LaneState>();
  L->engine = lanes_.main().engine;
  L->engine.checksum = false;
  L->engine.trailers = false;
  for (auto& ch : lanes_.main().connections) {  // lane 0's order: the agreement pairs them by index
    Connection& mine = L->connection_to(ch->peer);
    Transport* t = via[static_cast<std::size_t>(ch->peer)];
    mine.transport = t;
    mine.transport_name = std::string(t->name());
    mine.expected_gbps = t->can_reach(ctx_.self, ctx_.peer(ch->peer)).bandwidth_gbps;
  }
  if (const int err = cuda_.get_device(&ordinal_); err != kCudaSuccess)
    throw CudaError(fmt::format("rank {}: {}: {}", rank, call, cuda_.describe("cudaGetDevice", err)), err);
  // Loaded at setup on the setup thread's device; this thread's device may differ. Here no host
  // function of this communicator holds a stream yet (this call enqueues its own after).
  if (const int err = kernels_.preload(); err != kCudaSuccess)
    throw CudaError(fmt::format("rank {}: {}: {}", rank, call, cuda_.describe("ringfence_kernels_preload", err)), err);
  lanes_.connect(*L, kDeviceLane, MemoryKind::Device, &oneshot_input_);
  regions_ = DeviceRegions{&cuda_, &kernels_, nullptr};
  if (const int err = cuda_.stream_create(&regions_.stream, kCudaStreamNonBlocking); err != kCudaSuccess)
    throw CudaError(fmt::format("rank {}: {}: {}", rank, call, cuda_.describe("cudaStreamCreateWithFlags", err)), err);
  connection_of_.assign(static_cast<std::size_t>(ctx_.size), nullptr);
  for (auto& ch : L->connections) connection_of_[static_cast<std::size_t>(ch->peer)] = ch.get();
  position_connection_.assign(static_cast<std::size_t>(ctx_.size), nullptr);  // filled per call (run)
  lane_ = std::move(L);
  lanes_.attach_device(lane_.get());
}

void DeviceLane::check_pointer(const char* call, const char* what, const void* p, std::size_t bytes) const {
  if (bytes == 0 || p == nullptr) return;
  CudaPointerAttributes a;
  const int err = cuda_.pointer_attributes(&a, p);
  RINGFENCE_EXPECTS(err == kCudaSuccess && a.type != 0,
                    "rank {}: {} on a CUDA stream: {} {} is not device, managed or pinned host memory ({}): device regions "
                    "read and write it on the GPU (RINGFENCE_DEVICE_REGIONS=off stages any memory)",
                    ctx_.rank, call, what, p, err == kCudaSuccess ? "plain host memory" : cuda_.describe("cudaPointerGetAttributes", err));
}

void DeviceLane::make_current(const std::string& what) const {
  if (const int err = cuda_.set_device(ordinal_); err != kCudaSuccess)
    throw CudaError(fmt::format("rank {}: {}: {}", ctx_.rank, what, cuda_.describe("cudaSetDevice", err)), err);
}

void DeviceLane::call_failed(const std::string& why, int err) {
  failure_.record(Status(ErrorCode::Cuda, err), why);
  failure_.abort_peers(ErrorCode::Cuda, ctx_.rank);
  throw CudaError(why, err);
}

// The same as make_current before a device-lane call, failing the communicator like a failed collective.
void DeviceLane::enter(const char* call) {
  try {
    make_current(fmt::format("{} on a CUDA stream", call));
  } catch (const CudaError& e) {
    call_failed(e.what(), e.native());
  }
}

// Tree, direct and one-shot allreduce (c.by_position set) address their peers by ring
// position: the device lane's connections in the plan's order. One-shot in place first copies the
// input on the device (the executor sends it to every peer while results land in it).
Status DeviceLane::run(const char* call, const RingCall& c, const Reducer& reducer, Failure& failure) {
  enter(call);
  LaneState& L = *lane_;
  const std::vector<int>& ring = plan_.ring();
  L.engine.position = lanes_.main().engine.position;
  Connection* left = nullptr;
  Connection* right = nullptr;
  const auto n = static_cast<std::size_t>(ctx_.size);
  if (ctx_.size > 1) {
    const auto at = static_cast<std::size_t>(L.engine.position);
    left = &L.connection_to(ring[(at + n - 1) % n]);
    right = &L.connection_to(ring[(at + 1) % n]);
  }
  RingCall d = c;
  d.device = &regions_;
  d.check = nullptr;
  if (c.by_position) {
    for (std::size_t p = 0; p < ring.size(); ++p)  // sized when the lane was built (ring: empty on one rank)
      position_connection_[p] = ring[p] != ctx_.rank ? &L.connection_to(ring[p]) : nullptr;
    d.by_position = position_connection_.data();
    d.by_rank = connection_of_.data();
  }
  if (c.kind == RingCollective::OneShotAllreduce && c.send == c.recv && c.count > 0) {
    const std::size_t bytes = c.count * reducer.elem_size;  // at most one slot (allreduce checked)
    int err = cuda_.memcpy_async(oneshot_input_, c.send, bytes, kCudaMemcpyDefault, regions_.stream);
    if (err == kCudaSuccess) err = cuda_.stream_synchronize(regions_.stream);
    if (err != kCudaSuccess)
      call_failed(fmt::format("rank {}: {} on a CUDA stream: copying the one-shot input: {}", ctx_.rank, call,
                              cuda_.describe("cudaMemcpyAsync", err)),
                  err);
    d.send = oneshot_input_;
  }
  return run_ring(L.engine, L.flags, left, right, d, reducer, DirectWrite{}, L.relay_duties, failure);
}

Status DeviceLane::run_p2p(const char* call, P2POp* ops, std::size_t n, Failure& failure) {
  enter(call);
  return detail::run_p2p(lane_->engine, lane_->flags, connection_of_.data(), ops, n, P2PDirect{}, failure, &regions_);
}

void DeviceLane::destroy_stream() noexcept {
  if (regions_.stream) cuda_.stream_destroy(regions_.stream);
  regions_.stream = nullptr;
}

}  // namespace ringfence::detail
