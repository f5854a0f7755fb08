// Shared-memory transport. Control plane (segments, mappings, registration) takes a mutex and
// may throw; the Link data path is noexcept and allocation-free: a write is a memcpy into a
// mapped segment or one process_vm_writev, a signal is a release store plus a futex wake.
#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <cstdio>
#include <map>
#include <optional>
#include <mutex>
#include <random>
#include <ringfence/error.hpp>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/reduce_ops.hpp>
#include <ringfence/transport_util.hpp>
#include <ringfence/transports/shm.hpp>
#include <string>
#include <vector>

namespace ringfence::transports::shm {
namespace {

constexpr std::string_view kSegmentPrefix = "rf-";  // /dev/shm/rf-<pid>-<nonce>-<n>

// Segments up to this size are mapped with their pages in place (MAP_POPULATE), by their owner
// and by every peer that maps them: otherwise the first chunks through fresh staging slots pay
// a page fault per 4 KiB on both sides (measured: a 2-rank 64 KiB allgather's first 20 calls
// 12.5 -> 8.2 us each, docs/tuning.md "Streaming slot writes"). Larger ones (big alloc()
// buffers) fault in as used rather than cost their whole size at allocation and import.
constexpr std::size_t kPopulateMaxBytes = std::size_t{256} << 20;
int populate_flag(std::size_t bytes) noexcept { return bytes <= kPopulateMaxBytes ? MAP_POPULATE : 0; }

// ---- key encoding --------------------------------------------------------------------------
// Region key: u8 kind, u8[3] pad, i32 pid, u64 offset-or-address, u64 bytes, u32 name length,
// name bytes. Parsed with bounds checks: a malformed key is an InvalidUsage, never a crash.
enum class RegionKind : std::uint8_t { Segment = 1, Cma = 2 };
constexpr std::size_t kKeyHeader = 28;
constexpr std::size_t kMaxNameBytes = 255;

struct KeyFields {
  RegionKind kind{};
  std::int32_t pid = 0;
  std::uint64_t where = 0;
  std::uint64_t bytes = 0;
  std::string name;
};

Bytes encode_key(const KeyFields& k) {
  Bytes out(kKeyHeader + k.name.size());
  const auto kind = static_cast<std::uint8_t>(k.kind);
  const auto len = static_cast<std::uint32_t>(k.name.size());
  std::memcpy(out.data(), &kind, 1);
  std::memcpy(out.data() + 4, &k.pid, 4);
  std::memcpy(out.data() + 8, &k.where, 8);
  std::memcpy(out.data() + 16, &k.bytes, 8);
  std::memcpy(out.data() + 24, &len, 4);
  std::memcpy(out.data() + kKeyHeader, k.name.data(), k.name.size());
  return out;
}

KeyFields decode_key(std::span<const std::byte> key) {
  RINGFENCE_EXPECTS(key.size() >= kKeyHeader, "shm: malformed region key ({} bytes)", key.size());
  KeyFields k;
  std::uint8_t kind = 0;
  std::uint32_t len = 0;
  std::memcpy(&kind, key.data(), 1);
  std::memcpy(&k.pid, key.data() + 4, 4);
  std::memcpy(&k.where, key.data() + 8, 8);
  std::memcpy(&k.bytes, key.data() + 16, 8);
  std::memcpy(&len, key.data() + 24, 4);
  RINGFENCE_EXPECTS(kind == 1 || kind == 2, "shm: malformed region key (kind {})", kind);
  RINGFENCE_EXPECTS(len <= kMaxNameBytes && len == key.size() - kKeyHeader, "shm: malformed region key (name length {})", len);
  k.kind = static_cast<RegionKind>(kind);
  k.name.assign(reinterpret_cast<const char*>(key.data() + kKeyHeader), len);
  if (k.kind == RegionKind::Segment)
    RINGFENCE_EXPECTS(k.name.starts_with(kSegmentPrefix) && k.name.find('/') == std::string::npos,
                      "shm: region key names an invalid segment '{}'", k.name);
  return k;
}

// ---- OS helpers ----------------------------------------------------------------------------
using transport_util::bump;

int pidfd_open(pid_t pid) noexcept { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

bool process_alive(pid_t pid) noexcept { return ::kill(pid, 0) == 0 || errno == EPERM; }

// A peer segment mapped into this process; shared by every RemoteRegion importing it.
struct Mapping {
  std::byte* base = nullptr;
  std::size_t bytes = 0;
  ~Mapping() {
    if (base) ::munmap(base, bytes);
  }
};

struct LocalRegion final : MemoryRegion::Impl {
  KeyFields fields;
  Bytes key() const override { return encode_key(fields); }
};

struct Remote final : RemoteRegion::Impl {
  RegionKind kind{};
  std::shared_ptr<Mapping> mapping;  // Segment: keeps the mapping alive
  std::byte* base = nullptr;         // Segment: start of the region in our address space
  pid_t pid = 0;                     // Cma: owner process
  std::uint64_t address = 0;         // Cma: start of the region in the owner's address space
};

// ---- Link ------------------------------------------------------------------------------------
class ShmLink final : public Link {
 public:
  ShmLink(int peer, pid_t peer_pid, int pidfd, const Options& options)
      : peer_(peer), peer_pid_(peer_pid), pidfd_(pidfd), options_(options), self_(peer_pid == ::getpid()) {}
  ~ShmLink() override {
    if (pidfd_ >= 0) ::close(pidfd_);
  }

  Status write(const WriteOp& op) noexcept override {
    RINGFENCE_TRY(check_usable());
    const auto* dst = static_cast<const Remote*>(op.dst ? op.dst->impl() : nullptr);
    if (RINGFENCE_UNLIKELY(!dst || !op.src || !transport_util::write_in_bounds(op)))
      return fail(ErrorCode::InvalidUsage);
    if (!queue_.has_room()) return Status(ErrorCode::InProgress);
    if (dst->kind == RegionKind::Segment) {
      std::byte* const to = dst->base + op.dst_offset;
      if (op.also) {  // a second, local destination (WriteAlso): from the same loads
        if (op.crc) op.crc->value = staging_copy2_crc(to, op.also->dst, op.src, op.bytes, op.stream);
        else copy_bytes2(to, op.also->dst, op.src, op.bytes, op.stream);
        if (op.crc) op.crc->done = true;
        op.also->done = true;
      } else if (op.crc) {  // the engine wants the bytes' CRC: with the copy (staging_copy_crc)
        op.crc->value = op.stream ? staging_copy_crc_stream(to, op.src, op.bytes) : staging_copy_crc(to, op.src, op.bytes);
        op.crc->done = true;
      } else if (op.stream) {
        copy_bytes_stream(to, op.src, op.bytes);
      } else {
        copy_bytes(to, op.src, op.bytes);
      }
    } else {  // the kernel copies (cross-memory attach): the engine computes the CRC itself
      RINGFENCE_TRY(cma_write(*dst, op));
    }
    bump(stats_.writes, 1);
    bump(stats_.bytes_written, op.bytes);
    queue_.push(op.wr_id, Status::ok());
    return Status::ok();
  }

  Status signal(const SignalOp& op) noexcept override {
    RINGFENCE_TRY(check_usable());
    const auto* dst = static_cast<const Remote*>(op.dst ? op.dst->impl() : nullptr);
    if (RINGFENCE_UNLIKELY(!dst || dst->kind != RegionKind::Segment || !transport_util::flag_in_bounds(op) ||
                           !transport_util::carried_in_bounds(op)))
      return fail(ErrorCode::InvalidUsage);
    if (!queue_.has_room()) return Status(ErrorCode::InProgress);
    if (op.with_bytes != 0) transport_util::store_carried(dst->base + op.with_offset, op.with, op.with_bytes);
    // The store also releases every earlier memcpy on this link to the acquiring reader.
    SignalFlag& flag = *reinterpret_cast<SignalFlag*>(dst->base + op.offset);
    if (!op.defer_wake || !deferred_.store(flag, op.value)) transport_util::store_flag(flag, op.value);
    bump(stats_.signals, 1);
    queue_.push(op.wr_id, Status::ok());
    return Status::ok();
  }

  Status poll(std::span<Completion> out, std::size_t& n) noexcept override {
    queue_.pop(out, n);
    return Status::ok();
  }

  void flush_wakes() noexcept override { deferred_.flush(); }

  Status wait(SignalFlag& flag, std::uint32_t target, std::chrono::nanoseconds max) noexcept override {
    deferred_.flush();  // a peer asleep on a flag we stored may be what we are waiting for
    return transport_util::wait_flag(flag, target, max, options_.spin_count, options_.yield_every, stats_.wait_ns, stats_.yields, [&]() noexcept {
      if (state_ == LinkState::Fenced) return Status(ErrorCode::Fenced);
      return peer_alive() ? Status::ok() : fail(ErrorCode::PeerUnreachable);
    });
  }

  void fence(FenceReason) noexcept override {
    // Every shm operation completes inside write()/signal(), so nothing is pending: fencing
    // only refuses later operations. Idempotent.
    state_ = LinkState::Fenced;
  }
  // A health fence only stops use: the mapped segments stay, so the link can resume (its
  // message counters did not move while fenced, on either end).
  bool can_reopen() const noexcept override { return true; }
  void reopen() noexcept override {
    if (state_ == LinkState::Fenced) state_ = LinkState::Up;
  }
  LinkState state() const noexcept override { return state_.load(std::memory_order_relaxed); }
  int peer() const noexcept override { return peer_; }
  const LinkStats& stats() const noexcept override { return stats_; }

 private:
  Status check_usable() const noexcept {
    if (RINGFENCE_UNLIKELY(state_ == LinkState::Fenced)) return Status(ErrorCode::Fenced);
    return Status::ok();
  }
  Status fail(ErrorCode code, int native = 0) noexcept {
    stats_.errors.fetch_add(1, std::memory_order_relaxed);
    return Status(code, native);
  }

  bool peer_alive() const noexcept {
    if (self_) return true;
    if (pidfd_ >= 0) {
      pollfd p{pidfd_, POLLIN, 0};
      return ::poll(&p, 1, 0) == 0;  // readable = the process has exited
    }
    return process_alive(peer_pid_);
  }

  Status cma_write(const Remote& dst, const WriteOp& op) noexcept {
    if (!options_.cross_memory_attach) return fail(ErrorCode::InvalidUsage);
    std::size_t done_bytes = 0;
    while (done_bytes < op.bytes) {
      iovec local{const_cast<std::byte*>(static_cast<const std::byte*>(op.src)) + done_bytes, op.bytes - done_bytes};
      iovec remote{reinterpret_cast<void*>(dst.address + op.dst_offset + done_bytes), op.bytes - done_bytes};
      const ssize_t n = ::process_vm_writev(dst.pid, &local, 1, &remote, 1, 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        return fail(err == ESRCH ? ErrorCode::PeerUnreachable : err == EFAULT ? ErrorCode::InvalidUsage : ErrorCode::System, err);
      }
      if (n == 0) return fail(ErrorCode::System, EIO);
      done_bytes += static_cast<std::size_t>(n);
    }
    return Status::ok();
  }

  int peer_;
  pid_t peer_pid_;
  int pidfd_;
  Options options_;
  bool self_;
  std::atomic<LinkState> state_{LinkState::Up};  // read by links() from other threads
  transport_util::DeferredWakes deferred_;  // signals whose sleepers are not woken yet
  LinkStats stats_;
  transport_util::CompletionQueue<> queue_;
};

class ShmListen final : public ListenHandle {
 public:
  explicit ShmListen(Bytes address) : address_(std::move(address)) {}
  Bytes address() const override { return address_; }

 private:
  Bytes address_;
};

// ---- Transport -------------------------------------------------------------------------------
class ShmTransport final : public Transport {
 public:
  explicit ShmTransport(const TransportContext& ctx)
      : self_(ctx.self), options_(Options::from(ctx.options)), log_(ctx.log) {
    std::random_device rd;
    nonce_ = fmt::format("{:08x}", static_cast<std::uint32_t>(rd()));
    remove_stale_segments(log_);
    if (options_.cross_memory_attach) cma_unusable_ = probe_cross_memory_attach();
  }
  ~ShmTransport() override {
    for (auto& s : segments_) {
      ::munmap(s.base, s.bytes);
      ::shm_unlink(s.name.c_str());
      ::close(s.owner_fd);
    }
  }

  const TransportTraits& traits() const noexcept override {
    static const TransportTraits kTraits{.shares_memory = true, .crc_in_writes = true, .signals_carry_bytes = true, .flags_stored_by_peer = true,
                                         .speed_spread = 10.0};
    return kTraits;
  }
  std::string_view name() const noexcept override { return kName; }

  // Cross-memory attach needs ptrace-attach rights over the peer (Yama ptrace_scope >= 1,
  // seccomp in containers and LSMs may refuse them). Probe once against our parent, a process
  // we did not start: a read from address 0 fails with EFAULT when access is allowed and with
  // EPERM / ENOSYS when not. Returns why it is unusable, empty when usable. Conservative: when
  // the parent belongs to another user the probe says no and buffers are staged instead.
  std::string probe_cross_memory_attach() const {
    char byte = 0;
    iovec local{&byte, 1};
    iovec remote{nullptr, 1};
    if (::process_vm_readv(::getppid(), &local, 1, &remote, 1, 0) < 0 && errno == EFAULT) return {};
    const std::string why = fmt::format("process_vm_readv probe: {}", std::strerror(errno));
    if (log_) log_->info("shm: cross-memory attach unusable ({}); user buffers are staged", why);
    return why;
  }

  Reachability can_reach(const PeerInfo& self, const PeerInfo& peer) const override {
    Reachability r;
    if (self.host_id != peer.host_id) {
      r.reason = fmt::format("rank {} is on host '{}', rank {} on host '{}'", self.rank, self.host_id, peer.rank, peer.host_id);
      return r;
    }
    r.ok = true;
    r.bandwidth_gbps = 10.0;  // one memcpy stream on a typical server; refined by the tuner's probe
    r.latency_us = 0.5;
    return r;
  }

  void* allocate(std::size_t bytes, MemoryKind kind) override {
    if (kind != MemoryKind::Host || bytes == 0) return nullptr;
    std::lock_guard lock(mutex_);
    std::string name = fmt::format("/{}{}-{}-{}", kSegmentPrefix, ::getpid(), nonce_, next_segment_++);
    // The descriptor stays open: it holds the owner's lock that tells other jobs, in any PID
    // namespace, that this segment is alive (segment_owner.cpp).
    int fd = create_owned_segment(name);
    for (int tries = 1; fd < 0 && errno == EAGAIN && tries < 8; ++tries) {
      name = fmt::format("/{}{}-{}-{}", kSegmentPrefix, ::getpid(), nonce_, next_segment_++);
      fd = create_owned_segment(name);
    }
    if (fd < 0) throw SystemError(fmt::format("shm_open({}) failed: {}", name, std::strerror(errno)), errno);
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const int err = errno;
      ::close(fd);
      ::shm_unlink(name.c_str());
      throw SystemError(fmt::format("ftruncate({}, {}) failed: {} (is /dev/shm large enough?)", name, bytes, std::strerror(err)), err);
    }
    void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | populate_flag(bytes), fd, 0);
    const int err = errno;
    if (base == MAP_FAILED) {
      ::close(fd);
      ::shm_unlink(name.c_str());
      throw SystemError(fmt::format("mmap of {} bytes of {} failed: {}", bytes, name, std::strerror(err)), err);
    }
    segments_.push_back(Segment{name, static_cast<std::byte*>(base), bytes, fd});
    return base;
  }

  bool deallocate(void* ptr) noexcept override {
    std::lock_guard lock(mutex_);
    for (auto it = segments_.begin(); it != segments_.end(); ++it) {
      if (it->base != ptr) continue;
      ::munmap(it->base, it->bytes);
      ::shm_unlink(it->name.c_str());
      ::close(it->owner_fd);
      segments_.erase(it);
      return true;
    }
    return false;
  }

  MemoryRegion register_memory(void* ptr, std::size_t bytes, MemoryKind kind) override {
    RINGFENCE_EXPECTS(kind == MemoryKind::Host, "shm: cannot register {} memory", to_string(kind));
    RINGFENCE_EXPECTS(ptr != nullptr || bytes == 0, "shm: register_memory(nullptr, {})", bytes);
    auto impl = std::make_unique<LocalRegion>();
    {
      std::lock_guard lock(mutex_);
      const auto* p = static_cast<const std::byte*>(ptr);
      for (const auto& s : segments_) {
        if (p >= s.base && p <= s.base + s.bytes && bytes <= static_cast<std::size_t>(s.base + s.bytes - p)) {
          impl->fields = KeyFields{RegionKind::Segment, self_.pid, static_cast<std::uint64_t>(p - s.base), bytes,
                                   s.name.substr(1)};
          return MemoryRegion(std::move(impl), ptr, bytes, kind);
        }
      }
    }
    if (auto foreign = foreign_segment(static_cast<const std::byte*>(ptr), bytes)) {
      impl->fields = std::move(*foreign);
      return MemoryRegion(std::move(impl), ptr, bytes, kind);
    }
    RINGFENCE_EXPECTS(options_.cross_memory_attach,
                      "rank {}: shm: buffer {} is not from comm.alloc() and cross-memory attach is disabled (RINGFENCE_SHM_CMA=0)",
                      self_.rank, ptr);
    RINGFENCE_EXPECTS(cma_unusable_.empty(), "rank {}: shm: buffer {} is not from comm.alloc() and cross-memory attach is unusable here ({})",
                      self_.rank, ptr, cma_unusable_);
    impl->fields = KeyFields{RegionKind::Cma, self_.pid, reinterpret_cast<std::uint64_t>(ptr), bytes, {}};
    return MemoryRegion(std::move(impl), ptr, bytes, kind);
  }

  RemoteRegion import_region(std::span<const std::byte> peer_key) override {
    const KeyFields k = decode_key(peer_key);
    auto remote = std::make_unique<Remote>();
    remote->kind = k.kind;
    if (k.kind == RegionKind::Cma) {
      remote->pid = k.pid;
      remote->address = k.where;
      return RemoteRegion(std::move(remote), k.bytes);
    }
    std::shared_ptr<Mapping> mapping = map_segment("/" + k.name);
    RINGFENCE_EXPECTS(k.where <= mapping->bytes && k.bytes <= mapping->bytes - k.where,
                      "shm: region [{}, +{}) lies outside segment {} of {} bytes", k.where, k.bytes, k.name, mapping->bytes);
    remote->base = mapping->base + k.where;
    remote->mapping = std::move(mapping);
    return RemoteRegion(std::move(remote), k.bytes);
  }

  std::unique_ptr<ListenHandle> listen() override { return std::make_unique<ShmListen>(serialize(self_)); }

  std::unique_ptr<PendingLink> connect(ListenHandle&, const PeerInfo& peer, std::span<const std::byte> address) override {
    const PeerInfo remote = deserialize_peer_info(address);
    RINGFENCE_EXPECTS(remote.rank == peer.rank && remote.host_id == self_.host_id,
                      "rank {}: shm cannot reach rank {} (host '{}' vs '{}')", self_.rank, peer.rank, remote.host_id,
                      self_.host_id);
    int fd = -1;
    if (remote.pid != ::getpid()) {
      fd = pidfd_open(remote.pid);
      if (fd < 0 && errno == ESRCH)
        throw PeerUnreachableError(fmt::format("rank {}: shm peer rank {} (pid {}) has exited", self_.rank, peer.rank, remote.pid));
    }
    return std::make_unique<transport_util::ReadyPendingLink>(std::make_unique<ShmLink>(peer.rank, remote.pid, fd, options_));
  }

 private:
  struct Segment {
    std::string name;
    std::byte* base;
    std::size_t bytes;
    int owner_fd;  // holds the owner's lock while the segment lives
  };

  // [p, p + bytes) inside a ringfence segment of this process that another shm transport made
  // (another communicator's alloc(); the inner shm of the nvlink transport, whose flags a pair
  // that moves to pcie registers again): found by its mapping in /proc/self/maps, keyed like
  // our own. Control path only (registration).
  std::optional<KeyFields> foreign_segment(const std::byte* p, std::size_t bytes) const {
    FILE* maps = std::fopen("/proc/self/maps", "re");
    if (!maps) return std::nullopt;
    const std::string prefix = std::string("/dev/shm/").append(kSegmentPrefix);
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    std::optional<KeyFields> found;
    char line[4096];
    while (!found && std::fgets(line, sizeof line, maps)) {
      unsigned long start = 0, end = 0, offset = 0;
      char path[3072] = {};
      if (std::sscanf(line, "%lx-%lx %*s %lx %*s %*s %3071s", &start, &end, &offset, path) != 4) continue;
      if (at < start || at >= end || bytes > end - at) continue;
      const std::string_view file(path);
      if (file.substr(0, prefix.size()) != prefix || std::strstr(line, "(deleted)")) break;
      found = KeyFields{RegionKind::Segment, self_.pid, static_cast<std::uint64_t>(at - start + offset), bytes,
                        std::string(file.substr(std::string_view("/dev/shm/").size()))};
    }
    std::fclose(maps);
    return found;
  }

  std::shared_ptr<Mapping> map_segment(const std::string& name) {
    std::lock_guard lock(mutex_);
    if (auto it = mappings_.find(name); it != mappings_.end())
      if (auto live = it->second.lock()) return live;
    const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) throw SystemError(fmt::format("rank {}: shm_open({}) of a peer segment failed: {}", self_.rank, name, std::strerror(errno)), errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      throw SystemError(fmt::format("fstat({}) failed: {}", name, std::strerror(err)), err);
    }
    auto mapping = std::make_shared<Mapping>();
    void* base = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ | PROT_WRITE,
                        MAP_SHARED | populate_flag(static_cast<std::size_t>(st.st_size)), fd, 0);
    const int err = errno;
    ::close(fd);
    if (base == MAP_FAILED) throw SystemError(fmt::format("mmap({}) failed: {}", name, std::strerror(err)), err);
    mapping->base = static_cast<std::byte*>(base);
    mapping->bytes = static_cast<std::size_t>(st.st_size);
    mappings_[name] = mapping;
    return mapping;
  }

  PeerInfo self_;
  Options options_;
  const Logger* log_;
  std::string nonce_;
  std::string cma_unusable_;  // why cross-memory attach cannot be used here (empty: it can)
  std::mutex mutex_;
  std::vector<Segment> segments_;
  std::map<std::string, std::weak_ptr<Mapping>> mappings_;
  std::uint64_t next_segment_ = 0;
};

}  // namespace

namespace {
constexpr SettingKey kSettings[] = {
    {"RINGFENCE_SHM_SPIN", "flag polls before a waiter sleeps on a futex (>= 0)"},
    {"RINGFENCE_SHM_YIELD", "polls between sched_yield calls while spinning (>= 0; 0 = never)"},
    {"RINGFENCE_SHM_CMA", "0/1: cross-memory attach into unregistered buffers"},
};
}  // namespace

std::span<const SettingKey> setting_keys() noexcept { return kSettings; }

Options Options::from(const CommOptions* options) {
  const SettingsReader r(options);
  Options o;
  o.spin_count = static_cast<int>(r.integer("RINGFENCE_SHM_SPIN", o.spin_count, 0, 1ll << 30));
  o.cross_memory_attach = r.boolean("RINGFENCE_SHM_CMA", o.cross_memory_attach);
  o.yield_every = static_cast<int>(r.integer("RINGFENCE_SHM_YIELD", o.yield_every, 0, 1 << 20));
  return o;
}

std::unique_ptr<Transport> make_transport(const TransportContext& context) { return std::make_unique<ShmTransport>(context); }

}  // namespace ringfence::transports::shm
