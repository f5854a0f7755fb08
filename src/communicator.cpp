// Communicator: the public API. Every call forwards to the parts of Communicator::Impl
// (src/comm/comm_impl.hpp; docs/architecture.md): argument checks and dispatch, stream-ordered
// calls, the plan and health reports; shrink and split build new communicators from this one.
#include <algorithm>
#include <ringfence/communicator.hpp>
#include <ringfence/error.hpp>

#include "comm/comm_impl.hpp"

namespace ringfence {

Communicator::Communicator(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;
Communicator::~Communicator() {
  try {
    if (impl_ && !impl_->ctx.options.health_prometheus.empty())
      detail::write_prometheus(impl_->ctx.options.health_prometheus, impl_->ctx.rank, impl_->snapshot(), impl_->ctx.log);
  } catch (...) {  // a destructor never throws; the file is best effort
  }
}

Communicator::Communicator(std::shared_ptr<Store> store, int rank, int size, const TransportRegistry& registry, CommOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->ctx.options = std::move(options);
  impl_->ctx.rank = rank;
  impl_->ctx.size = size;
  impl_->ctx.store = std::move(store);
  impl_->registry = registry;
  impl_->setup(registry);
}

Communicator Communicator::shrink(const std::vector<int>& exclude) { return shrink(exclude, live(__func__)->ctx.options); }

Communicator Communicator::shrink(const std::vector<int>& exclude, CommOptions options) {
  Impl& m = *live(__func__);
  const int rank = m.ctx.rank, size = m.ctx.size;
  std::vector<int> gone = exclude;
  std::sort(gone.begin(), gone.end());
  gone.erase(std::unique(gone.begin(), gone.end()), gone.end());
  for (int r : gone) RINGFENCE_EXPECTS(r >= 0 && r < size, "rank {}: shrink: excluded rank {} is out of range [0, {})", rank, r, size);
  RINGFENCE_EXPECTS(!std::binary_search(gone.begin(), gone.end(), rank),
                    "rank {}: shrink: this rank is in the exclude list (excluded ranks must not call shrink)", rank);
  const int new_size = size - static_cast<int>(gone.size());
  auto new_rank_of = [&](int r) {  // survivors keep their order
    return r - static_cast<int>(std::lower_bound(gone.begin(), gone.end(), r) - gone.begin());
  };
  m.dispatch.drain();  // queued work first (it fails fast when the communicator is broken)
  // A fresh namespace in the store: the shrink count (equal on every survivor: same calls in
  // the same order) and the excluded ranks.
  const std::string prefix = fmt::format("shrink/{}/{}/", m.shrinks++, fmt::join(gone, ","));
  Communicator next(std::make_shared<PrefixStore>(m.ctx.store, prefix), new_rank_of(rank), new_size, m.registry, std::move(options));
  next.impl_->server = m.server;
  // Fences between survivors stay: the same agreed list on every survivor gives the same plan.
  std::vector<LinkId> carried;
  for (const LinkId& l : m.plan.fenced())
    if (!std::binary_search(gone.begin(), gone.end(), l.a) && !std::binary_search(gone.begin(), gone.end(), l.b))
      carried.push_back(LinkId::of(new_rank_of(l.a), new_rank_of(l.b)));
  if (!carried.empty()) next.impl_->agreement.install_fences(std::move(carried));
  m.ctx.log.warn("shrunk to {} ranks without rank(s) {}: this rank is now rank {}", new_size, fmt::join(gone, ","), next.rank());
  return next;
}

std::optional<Communicator> Communicator::split(int color, int key) { return split(color, key, live(__func__)->ctx.options); }

std::optional<Communicator> Communicator::split(int color, int key, CommOptions options) {
  Impl& m = *live(__func__);
  // Everyone's (color, key): one allgather, so every rank derives the same groups.
  const std::int32_t mine[2] = {color < 0 ? -1 : color, key};
  std::vector<std::int32_t> all(2 * static_cast<std::size_t>(m.ctx.size));
  allgather(mine, all.data(), 2, DataType::Int32);
  const std::uint64_t number = m.splits++;
  if (color < 0) return std::nullopt;
  std::vector<int> members;  // old ranks of our group, in new rank order
  for (int r = 0; r < m.ctx.size; ++r)
    if (all[2 * static_cast<std::size_t>(r)] == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[2 * static_cast<std::size_t>(a) + 1] < all[2 * static_cast<std::size_t>(b) + 1]; });
  const auto new_rank_of = [&](int r) { return static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin()); };
  const std::string prefix = fmt::format("split/{}/{}/", number, color);
  Communicator next(std::make_shared<PrefixStore>(m.ctx.store, prefix), new_rank_of(m.ctx.rank), static_cast<int>(members.size()),
                    m.registry, std::move(options));
  next.impl_->server = m.server;
  std::vector<LinkId> carried;  // fences between two members stay
  for (const LinkId& l : m.plan.fenced())
    if (new_rank_of(l.a) < static_cast<int>(members.size()) && new_rank_of(l.b) < static_cast<int>(members.size()))
      carried.push_back(LinkId::of(new_rank_of(l.a), new_rank_of(l.b)));
  if (!carried.empty()) next.impl_->agreement.install_fences(std::move(carried));
  return next;
}

Communicator Communicator::from_launch(const LaunchInfo& launch, const TransportRegistry& registry, CommOptions options) {
  std::shared_ptr<TcpStoreServer> server;
  if (launch.host_store) {
    const Logger log = make_logger(options.log_level, launch.rank, options.log_file, options.log_timestamps).with_subsystem("store");
    try {
      server = std::make_shared<TcpStoreServer>(launch.token, "0.0.0.0", launch.store_port, TcpStoreServerOptions{}, &log);
    } catch (const SystemError& e) {
      if (e.native() != EADDRINUSE) throw;
      // The port came from the launcher's variables (MASTER_PORT+1 under torchrun, a hash of the
      // job id under mpirun / srun): say how to pick another one.
      throw SystemError(fmt::format("rank {}: cannot host the bootstrap store: {} (launcher {}: set "
                                    "RINGFENCE_STORE_ADDR=host:port to a free port on rank 0's host)",
                                    launch.rank, e.what(), to_string(launch.launcher)),
                        e.native());
    }
  }
  auto store = std::make_shared<TcpStoreClient>(launch.store_host, launch.store_port, launch.token, options.timeout);
  Communicator comm(std::move(store), launch.rank, launch.size, registry, std::move(options));
  comm.impl_->server = std::move(server);
  return comm;
}

Communicator::Impl* Communicator::live(const char* call) const {
  if (!impl_)
    throw InvalidUsage(fmt::format("{}: this communicator was moved from: it has no ranks or links any more (use the one it was "
                                   "moved into)",
                                   call));
  return impl_.get();
}

int Communicator::rank() const noexcept { return impl_ ? impl_->ctx.rank : -1; }
int Communicator::size() const noexcept { return impl_ ? impl_->ctx.size : 0; }
const CommOptions& Communicator::options() const noexcept {
  static const CommOptions kDefaults;  // immutable: what a moved-from communicator reports
  return impl_ ? impl_->ctx.options : kDefaults;
}
std::uint64_t Communicator::sequence() const noexcept { return impl_ ? impl_->ctx.seq : 0; }

void Communicator::abort() noexcept {
  if (!impl_) return;
  Impl& m = *impl_;
  try {
    if (m.failure.record(Status(ErrorCode::Aborted), fmt::format("rank {} aborted the communicator (abort())", m.ctx.rank)))
      m.ctx.log.warn("communicator aborted (abort()): in-flight and later calls fail");
  } catch (...) {  // formatting or logging failed: the abort itself goes on
    m.failure.record(Status(ErrorCode::Aborted), std::string());
  }
  m.failure.local_abort(ErrorCode::Aborted, -1);
  if (m.heartbeat) m.heartbeat->request_abort();
}

void Communicator::set_timeout(std::chrono::milliseconds timeout) {
  Impl& m = *live(__func__);
  RINGFENCE_EXPECTS(timeout.count() >= 0, "rank {}: set_timeout: timeout {} ms is negative", m.ctx.rank, timeout.count());
  m.dispatch.set_timeout(timeout);
}

Status Communicator::async_error() const noexcept { return impl_ ? impl_->failure.status() : Status(ErrorCode::InvalidUsage); }

// ---- collectives (blocking, asynchronous, stream-ordered) ----

void Communicator::allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) {
  live(__func__)->dispatch.allreduce(false, send, recv, count, type, op);
}
void Communicator::reduce_scatter(const void* send, void* recv, std::size_t recvcount, DataType type, ReduceOp op) {
  live(__func__)->dispatch.reduce_scatter(false, send, recv, recvcount, type, op);
}
void Communicator::allgather(const void* send, void* recv, std::size_t sendcount, DataType type) {
  live(__func__)->dispatch.allgather(false, send, recv, sendcount, type);
}
void Communicator::broadcast(const void* send, void* recv, std::size_t count, DataType type, int root) {
  live(__func__)->dispatch.broadcast(false, send, recv, count, type, root);
}
void Communicator::reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root) {
  live(__func__)->dispatch.reduce(false, send, recv, count, type, op, root);
}
void Communicator::alltoall(const void* send, void* recv, std::size_t count, DataType type) {
  live(__func__)->dispatch.alltoall(false, send, recv, count, type);
}
void Communicator::barrier() {
  std::uint8_t token = 0;
  // A one-element allreduce: every rank's result depends on every rank's input, so nobody
  // leaves before everybody arrived.
  live(__func__)->dispatch.allreduce(false, &token, &token, 1, DataType::Uint8, ReduceOp::Max, detail::CallKind::Barrier);
}

Work Communicator::allreduce_async(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) {
  return live(__func__)->dispatch.allreduce(true, send, recv, count, type, op);
}
Work Communicator::reduce_scatter_async(const void* send, void* recv, std::size_t recvcount, DataType type, ReduceOp op) {
  return live(__func__)->dispatch.reduce_scatter(true, send, recv, recvcount, type, op);
}
Work Communicator::allgather_async(const void* send, void* recv, std::size_t sendcount, DataType type) {
  return live(__func__)->dispatch.allgather(true, send, recv, sendcount, type);
}
Work Communicator::broadcast_async(const void* send, void* recv, std::size_t count, DataType type, int root) {
  return live(__func__)->dispatch.broadcast(true, send, recv, count, type, root);
}
Work Communicator::reduce_async(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root) {
  return live(__func__)->dispatch.reduce(true, send, recv, count, type, op, root);
}
Work Communicator::alltoall_async(const void* send, void* recv, std::size_t count, DataType type) {
  return live(__func__)->dispatch.alltoall(true, send, recv, count, type);
}
Work Communicator::barrier_async() { return live(__func__)->dispatch.barrier_async(); }
void Communicator::synchronize() { live(__func__)->dispatch.drain(); }

// Stream-ordered: the host calls' argument checks on the user's buffers, then StreamCalls runs
// the host collective on them over the device lane, or on staging memory.
void Communicator::allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, CudaStream stream) {
  Impl* m = live(__func__);
  const auto io = m->dispatch.checks().allreduce("allreduce", send, recv, count, type, op);
  m->streams.collective("allreduce", stream, send, io, recv,
                        [&](const void* in, void* out) { return m->dispatch.allreduce(true, in, out, count, type, op); });
}
void Communicator::reduce_scatter(const void* send, void* recv, std::size_t recvcount, DataType type, ReduceOp op, CudaStream stream) {
  Impl* m = live(__func__);
  const auto io = m->dispatch.checks().reduce_scatter("reduce_scatter", send, recv, recvcount, type, op);
  m->streams.collective("reduce_scatter", stream, send, io, recv,
                        [&](const void* in, void* out) { return m->dispatch.reduce_scatter(true, in, out, recvcount, type, op); });
}
void Communicator::allgather(const void* send, void* recv, std::size_t sendcount, DataType type, CudaStream stream) {
  Impl* m = live(__func__);
  const auto io = m->dispatch.checks().allgather("allgather", send, recv, sendcount, type);
  m->streams.collective("allgather", stream, send, io, recv,
                        [&](const void* in, void* out) { return m->dispatch.allgather(true, in, out, sendcount, type); });
}
void Communicator::broadcast(const void* send, void* recv, std::size_t count, DataType type, int root, CudaStream stream) {
  Impl* m = live(__func__);
  const auto io = m->dispatch.checks().broadcast("broadcast", send, recv, count, type, root);  // non-roots stage no input
  m->streams.collective("broadcast", stream, send, io, recv,
                        [&](const void* in, void* out) { return m->dispatch.broadcast(true, in, out, count, type, root); });
}
void Communicator::reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root, CudaStream stream) {
  Impl* m = live(__func__);
  const auto io = m->dispatch.checks().reduce("reduce", send, recv, count, type, op, root);  // non-roots copy no result back
  m->streams.collective("reduce", stream, send, io, recv, [&](const void* in, void* out) {
    return m->dispatch.reduce(true, in, io.out > 0 ? out : nullptr, count, type, op, root);
  });
}
void Communicator::alltoall(const void* send, void* recv, std::size_t count, DataType type, CudaStream stream) {
  Impl* m = live(__func__);
  const auto io = m->dispatch.checks().alltoall("alltoall", send, recv, count, type);
  m->streams.collective("alltoall", stream, send, io, recv,
                        [&](const void* in, void* out) { return m->dispatch.alltoall(true, in, out, count, type); });
}
std::size_t Communicator::device_staging_bytes() const { return live(__func__)->streams.staging_bytes(); }
std::string Communicator::device_path() const {
  const Impl* m = live(__func__);
  const int verdict = m->device.verdict();
  return verdict > 0 ? std::string("device regions") : verdict < 0 ? "host-staged: " + m->device.why_not() : std::string();
}

// ---- point-to-point ----

void Communicator::send(const void* buf, std::size_t count, DataType type, int peer) {
  Impl* m = live(__func__);
  m->dispatch.send_recv("send", true, buf, count, type, peer, m->streams.has_ops());
}
void Communicator::recv(void* buf, std::size_t count, DataType type, int peer) {
  Impl* m = live(__func__);
  m->dispatch.send_recv("recv", false, buf, count, type, peer, m->streams.has_ops());
}
void Communicator::send(const void* buf, std::size_t count, DataType type, int peer, CudaStream stream) {
  Impl* m = live(__func__);
  m->streams.send_recv("send", true, buf, count, type, peer, stream, m->dispatch.has_host_ops());
}
void Communicator::recv(void* buf, std::size_t count, DataType type, int peer, CudaStream stream) {
  Impl* m = live(__func__);
  m->streams.send_recv("recv", false, buf, count, type, peer, stream, m->dispatch.has_host_ops());
}
void Communicator::group_start() { live(__func__)->dispatch.group_start("group_start"); }
void Communicator::group_end() {
  Impl& m = *live(__func__);
  if (!m.dispatch.group_end("group_end")) return;
  if (m.streams.has_ops())
    m.streams.run_group("group_end");
  else
    m.dispatch.run_host_group("group_end");
}

// ---- memory ----

void* Communicator::alloc(std::size_t bytes, MemoryKind kind) {
  Impl& m = *live(__func__);
  RINGFENCE_EXPECTS(kind == MemoryKind::Host, "rank {}: alloc: {} memory is not supported by this build", m.ctx.rank, to_string(kind));
  RINGFENCE_EXPECTS(bytes > 0, "rank {}: alloc: bytes must be positive", m.ctx.rank);
  return m.lanes.user_alloc(bytes);
}

void Communicator::free(void* ptr) {
  if (!ptr) return;
  Impl& m = *live(__func__);
  // Only what alloc() returned to the user (not internal memory, not another communicator's).
  RINGFENCE_EXPECTS(m.lanes.owns_user_allocation(ptr),
                    "rank {}: free: pointer {} was not returned by this communicator's alloc() (freed twice, or another "
                    "communicator's?)",
                    m.ctx.rank, ptr);
  m.regs.clear_local();  // cached keys may describe the memory being freed
  m.lanes.user_free(ptr);
}

// ---- plan and health ----

std::vector<LinkInfo> Communicator::links() const { return live(__func__)->lanes.links(); }
std::string Communicator::link_table() const { return format_link_table(links()); }
std::vector<int> Communicator::ring() const {
  const auto& ring = live(__func__)->plan.ring();
  return ring.empty() ? std::vector<int>{0} : ring;
}
std::vector<LinkId> Communicator::fenced_links() const { return live(__func__)->plan.fenced(); }
std::vector<Relay> Communicator::relays() const { return live(__func__)->plan.relays(); }
std::uint64_t Communicator::epoch() const noexcept { return impl_ ? impl_->plan.epoch() : 0; }
std::uint64_t Communicator::digest_mismatches() const noexcept { return impl_ ? impl_->agreement.digest_mismatches() : 0; }
HealthSnapshot Communicator::health() const { return live(__func__)->snapshot(); }
void Communicator::on_health_event(EventCallback callback) { live(__func__)->events.set_callback(std::move(callback)); }

}  // namespace ringfence
