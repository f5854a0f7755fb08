// Shared driver of the nccl-tests-compatible benchmarks; see perf_common.hpp.
#include "perf_common.hpp"

#include "perf_json.hpp"
#include "perf_pattern.hpp"

#include <getopt.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <ringfence/half.hpp>
#include <string_view>
#include <type_traits>

namespace ringfence::bench {
namespace {

constexpr std::size_t kPageBytes = 4096;

std::string str(std::string_view s) { return std::string(s); }

}  // namespace

namespace {

// ------------------------------------------------------------------------------------------
// Buffers
// ------------------------------------------------------------------------------------------

// A benchmark buffer from the heap or the backend's allocator; pre-faulted so first-touch
// page faults never land inside a timed loop.
// With `--memory device` the buffer lives in device memory and `host()` is a host copy that the driver
// fills and checks; `upload()` / `download()` move the whole buffer between the two.
class Buffer {
 public:
  Buffer(std::size_t bytes, MemoryMode mode, Backend& backend) : bytes_(std::max<std::size_t>(bytes, 1)), backend_(backend) {
    if (mode != MemoryMode::User) {
      ptr_ = backend.alloc(bytes_);
      from_backend_ = true;
    } else {
      ptr_ = std::aligned_alloc(kPageBytes, (bytes_ + kPageBytes - 1) / kPageBytes * kPageBytes);
    }
    if (ptr_ == nullptr) throw std::bad_alloc();
    if (mode == MemoryMode::Device) {
      host_ = std::aligned_alloc(kPageBytes, (bytes_ + kPageBytes - 1) / kPageBytes * kPageBytes);
      if (host_ == nullptr) throw std::bad_alloc();
      std::memset(host_, 0, bytes_);
      upload();
    } else {
      std::memset(ptr_, 0, bytes_);
    }
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (from_backend_) {
      try {
        backend_.free(ptr_);
      } catch (...) {  // a broken communicator cannot free; the process is exiting anyway
      }
    } else {
      std::free(ptr_);
    }
    std::free(host_);
  }
  // What the collectives are given.
  void* get() const { return ptr_; }
  // What the driver fills and checks (the same memory unless --memory device).
  void* host() const { return host_ != nullptr ? host_ : ptr_; }
  // Copies the first `bytes` (all by default) between the host copy and the device buffer.
  void upload(std::size_t bytes = SIZE_MAX) {
    if (host_ != nullptr) backend_.upload(ptr_, host_, std::min(bytes, bytes_));
  }
  void download(std::size_t bytes = SIZE_MAX) {
    if (host_ != nullptr) backend_.download(host_, ptr_, std::min(bytes, bytes_));
  }

 private:
  std::size_t bytes_;
  Backend& backend_;
  void* ptr_ = nullptr;
  void* host_ = nullptr;
  bool from_backend_ = false;
};

// The driver's own reductions (times, #wrong, the rank table) run on host memory.
void host_allreduce(Backend& b, const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) {
  if (b.host_allreduce) b.host_allreduce(send, recv, count, type, op);
  else b.allreduce(send, recv, count, type, op);
}

void synchronize(Backend& b) {
  if (b.synchronize) b.synchronize();
}

const char* memory_name(MemoryMode m) {
  switch (m) {
    case MemoryMode::User: return "user";
    case MemoryMode::Alloc: return "alloc";
    case MemoryMode::Device: return "device";
  }
  return "?";
}

// ------------------------------------------------------------------------------------------
// Table
// ------------------------------------------------------------------------------------------

double aggregate_time(Backend& b, double local_us, TimeAggregate how) {
  double v = local_us;
  switch (how) {
    case TimeAggregate::Rank0:
      v = b.rank == 0 ? local_us : 0.0;
      host_allreduce(b, &v, &v, 1, DataType::Float64, ReduceOp::Sum);
      return v;
    case TimeAggregate::Avg:
      host_allreduce(b, &v, &v, 1, DataType::Float64, ReduceOp::Sum);
      return v / b.size;
    case TimeAggregate::Min: host_allreduce(b, &v, &v, 1, DataType::Float64, ReduceOp::Min); return v;
    case TimeAggregate::Max: host_allreduce(b, &v, &v, 1, DataType::Float64, ReduceOp::Max); return v;
  }
  return v;
}

const char* aggregate_name(TimeAggregate a) {
  switch (a) {
    case TimeAggregate::Rank0: return "rank 0";
    case TimeAggregate::Avg: return "avg over ranks";
    case TimeAggregate::Min: return "min over ranks";
    case TimeAggregate::Max: return "max over ranks";
  }
  return "?";
}

// "#  Rank  0 Group  0 Pid  1234 on host device -1 [host]" lines (nccl-tests' shape), gathered through the backend's own allreduce. Returns
// how many ranks share this rank's host (this one included).
int print_ranks(Backend& b) {
  constexpr std::size_t kHostBytes = 64;
  const auto n = static_cast<std::size_t>(b.size);
  std::vector<std::int64_t> pids(n, 0);
  std::vector<std::uint8_t> hosts(n * kHostBytes, 0);
  pids[static_cast<std::size_t>(b.rank)] = static_cast<std::int64_t>(::getpid());
  char host[kHostBytes] = {};
  ::gethostname(host, sizeof host - 1);
  std::memcpy(&hosts[static_cast<std::size_t>(b.rank) * kHostBytes], host, kHostBytes);
  host_allreduce(b, pids.data(), pids.data(), n, DataType::Int64, ReduceOp::Sum);
  host_allreduce(b, hosts.data(), hosts.data(), hosts.size(), DataType::Uint8, ReduceOp::Max);
  int on_host = 0;
  for (std::size_t r = 0; r < n; ++r)
    on_host += std::memcmp(&hosts[r * kHostBytes], &hosts[static_cast<std::size_t>(b.rank) * kHostBytes], kHostBytes) == 0;
  if (b.rank != 0) return on_host;
  std::printf("# Using devices\n");  // nccl-tests' heading; a host rank has no device
  for (std::size_t r = 0; r < n; ++r) {
    hosts[r * kHostBytes + kHostBytes - 1] = 0;
    std::printf("#  Rank %2zu Group  0 Pid %6lld on %10s device %2d [host]\n", r, static_cast<long long>(pids[r]),
                reinterpret_cast<const char*>(&hosts[r * kHostBytes]), -1);
  }
  return on_host;
}

// Returns how many ranks share this rank's host.
int print_header(Collective c, const PerfArgs& a, Backend& b) {
  if (b.rank == 0) {
    // nccl-tests' first line (scripts read it), then ours.
    std::printf("# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d agg iters: %d "
                "validation: %d graph: 0\n",
                a.min_bytes, a.max_bytes, a.step_factor > 1 ? a.step_factor : a.step_bytes, a.step_factor > 1 ? "factor" : "bytes",
                a.warmup, a.iters, a.agg_iters, a.check);
    std::printf("# %s %s_perf: nRanks %d time: %s memory: %s%s\n", b.name.c_str(), collective_name(c), b.size,
                aggregate_name(a.aggregate), memory_name(a.memory),
                a.fresh_send ? " fresh-send: each call timed alone, after its rank wrote its send buffer again" : "");
    for (const auto& note : b.notes) std::printf("# %s\n", note.c_str());
    std::printf("#\n");
  }
  const int on_host = print_ranks(b);
  if (b.rank == 0) {
    std::printf("#\n");
    std::printf("#                                                              out-of-place                       in-place\n");
    std::printf("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n");
    std::printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n");
    std::fflush(stdout);
  }
  return on_host;
}

// nccl-tests' time column: 2 decimals below 100 us, 1 below 10 ms, none above.
void format_time(char (&out)[32], double us) {
  if (us >= 10000.0) std::snprintf(out, sizeof out, "%7.0f", us);
  else if (us >= 100.0) std::snprintf(out, sizeof out, "%7.1f", us);
  else std::snprintf(out, sizeof out, "%7.2f", us);
}

std::vector<std::size_t> sizes_of(const PerfArgs& a) {
  std::vector<std::size_t> sizes;
  for (std::size_t s = a.min_bytes; s <= a.max_bytes;) {
    sizes.push_back(s);
    std::size_t next = a.step_factor > 1 ? (s == 0 ? 1 : s * a.step_factor) : s + a.step_bytes;
    if (next <= s || (a.step_factor > 1 && s != 0 && next / a.step_factor != s)) break;  // overflow / no progress
    s = next;
  }
  return sizes;
}

struct Totals {
  std::uint64_t wrong = 0;
  double busbw_sum = 0.0;
  std::size_t busbw_count = 0;
};

// Everything one row needs to run and check a collective: the periods of every rank's input
// and of the reduced result, and the row's element counts.
struct Row {
  Collective c;
  DataType type;
  ReduceOp op;
  int root;
  std::size_t count;  // elements of the whole vector (the size column)
  std::size_t per;    // elements per rank block (reduce-scatter, allgather, alltoall), else count
  std::size_t elem;
  const std::vector<std::vector<std::byte>>* inputs;  // [rank] one period of that rank's input
  const std::vector<std::byte>* reduced;              // one period of the reduction of all inputs
};

// Writes `n` elements of `period` starting at global index `first` (tiled modulo kPatternPeriod).
void fill_from(void* buf, std::size_t n, const std::vector<std::byte>& period, std::size_t elem, std::size_t first) {
  auto* dst = static_cast<std::byte*>(buf);
  std::size_t i = 0;
  while (i < n) {
    const std::size_t j = (first + i) % kPatternPeriod;
    const std::size_t run = std::min(n - i, kPatternPeriod - j);
    std::memcpy(dst + i * elem, period.data() + j * elem, run * elem);
    i += run;
  }
}

// Elements of `buf` (n of them) that differ from `period` at global indices [first, first + n);
// the first one's position in `buf` goes to `first_bad`.
std::uint64_t wrong_in(const void* buf, std::size_t n, const std::vector<std::byte>& period, std::size_t elem, std::size_t first,
                       std::size_t& first_bad, std::uint64_t wrong_so_far) {
  const auto* got = static_cast<const std::byte*>(buf);
  std::uint64_t wrong = 0;
  std::size_t i = 0;
  while (i < n) {
    const std::size_t j = (first + i) % kPatternPeriod;
    const std::size_t run = std::min(n - i, kPatternPeriod - j);
    if (std::memcmp(got + i * elem, period.data() + j * elem, run * elem) != 0)
      for (std::size_t k = 0; k < run; ++k)
        if (std::memcmp(got + (i + k) * elem, period.data() + (j + k) * elem, elem) != 0) {
          if (wrong_so_far + wrong == 0) first_bad = i + k;
          ++wrong;
        }
    i += run;
  }
  return wrong;
}

// Buffers of one measurement: where the call reads and writes, and how to prepare them.
struct Placement {
  const void* src = nullptr;
  void* dst = nullptr;
};

Placement place(const Row& w, int rank, bool in_place, void* send, void* recv) {
  const std::size_t r = static_cast<std::size_t>(rank), bytes_per = w.per * w.elem;
  auto* s = static_cast<std::byte*>(send);
  auto* d = static_cast<std::byte*>(recv);
  if (!in_place) return {send, recv};
  switch (w.c) {
    case Collective::ReduceScatter: return {s, s + r * bytes_per};  // result lands in our own block
    case Collective::AllGather: return {d + r * bytes_per, d};     // our block of the output is the input
    default: return {recv, recv};
  }
}

// Stores every byte of [p, p + bytes) again, unchanged (volatile, so the compiler keeps the
// stores): the lines end up modified in this core's cache, where a producer of the data (a
// backward pass writing gradients) leaves them, instead of clean and shared from the last call.
void store_again(void* p, std::size_t bytes) {
  auto* words = static_cast<volatile std::uint64_t*>(p);
  for (std::size_t i = 0; i < bytes / 8; ++i) words[i] = words[i];
  auto* tail = static_cast<volatile unsigned char*>(p);
  for (std::size_t i = bytes / 8 * 8; i < bytes; ++i) tail[i] = tail[i];
}

// --fresh-send: the rank's input written again before a call, in place (host memory) or by a
// copy of the buffer that holds it from its host image (device memory; in place, the input lies
// in the receive buffer except for reduce_scatter: `place`).
void write_send_again(const Row& w, bool in_place, Buffer& send, Buffer& recv, const Placement& at) {
  if (send.host() == send.get()) {
    store_again(const_cast<void*>(at.src), (w.c == Collective::AllGather ? w.per : w.count) * w.elem);
    return;
  }
  Buffer& holder = in_place && w.c != Collective::ReduceScatter ? recv : send;
  holder.upload(w.count * w.elem);
}

// Fills the input of one measurement (every check run starts from fresh data).
void prepare(const Row& w, int rank, bool in_place, const Placement& at, void* recv) {
  const auto& mine = (*w.inputs)[static_cast<std::size_t>(rank)];
  const std::size_t r = static_cast<std::size_t>(rank);
  void* src = const_cast<void*>(at.src);
  switch (w.c) {
    case Collective::AllGather: fill_from(src, w.per, mine, w.elem, r * w.per); break;
    default: fill_from(src, w.count, mine, w.elem, 0);  // the whole vector (or all blocks)
  }
  if (!in_place) {  // sentinel: elements never written show up as wrong
    const std::size_t out_elems = w.c == Collective::ReduceScatter ? w.per : w.count;
    std::memset(recv, 0xa5, out_elems * w.elem);
  }
}

void invoke(const Row& w, Backend& b, const Placement& at) {
  const int n = b.size;
  switch (w.c) {
    case Collective::AllReduce: b.allreduce(at.src, at.dst, w.count, w.type, w.op); break;
    case Collective::ReduceScatter: b.reduce_scatter(at.src, at.dst, w.per, w.type, w.op); break;
    case Collective::AllGather: b.all_gather(at.src, at.dst, w.per, w.type); break;
    case Collective::Broadcast: b.broadcast(at.src, at.dst, w.count, w.type, w.root); break;
    case Collective::Reduce: b.reduce(at.src, at.dst, w.count, w.type, w.op, w.root); break;
    case Collective::AllToAll: b.all_to_all(at.src, at.dst, w.per, w.type); break;
    case Collective::SendRecv: b.send_recv(at.src, at.dst, w.count, w.type, (b.rank + 1) % n, (b.rank + n - 1) % n); break;
  }
}

// Wrong elements of this rank's output.
std::uint64_t verify(const Row& w, int rank, int n, const Placement& at, std::size_t& first_bad) {
  const std::size_t r = static_cast<std::size_t>(rank);
  const auto& in = *w.inputs;
  auto* out = static_cast<const std::byte*>(at.dst);
  switch (w.c) {
    case Collective::AllReduce: return wrong_in(out, w.count, *w.reduced, w.elem, 0, first_bad, 0);
    case Collective::ReduceScatter: return wrong_in(out, w.per, *w.reduced, w.elem, r * w.per, first_bad, 0);
    case Collective::Reduce: return rank == w.root ? wrong_in(out, w.count, *w.reduced, w.elem, 0, first_bad, 0) : 0;
    case Collective::Broadcast: return wrong_in(out, w.count, in[static_cast<std::size_t>(w.root)], w.elem, 0, first_bad, 0);
    case Collective::SendRecv:
      return wrong_in(out, w.count, in[static_cast<std::size_t>((rank + n - 1) % n)], w.elem, 0, first_bad, 0);
    case Collective::AllGather:
    case Collective::AllToAll: {
      std::uint64_t wrong = 0;
      for (std::size_t s = 0; s < static_cast<std::size_t>(n); ++s) {
        // allgather: block s is rank s's input at [s*per, ...); alltoall: rank s's block r of its
        // send buffer, i.e. its input at [r*per, ...).
        const std::size_t first = w.c == Collective::AllGather ? s * w.per : r * w.per;
        std::size_t bad = 0;
        const std::uint64_t k = wrong_in(out + s * w.per * w.elem, w.per, in[s], w.elem, first, bad, 0);
        if (k && wrong == 0) first_bad = s * w.per + bad;
        wrong += k;
      }
      return wrong;
    }
  }
  return 0;
}

// One measurement (out-of-place or in-place) of one row: warm-up, timed loop, then `check`
// verified runs. Prints its four columns on rank 0.
// With --memory device the data is prepared and checked in the buffers' host copies (`host`) while the
// collective runs on the device buffers (`at`); otherwise both are the same memory.
Measured measure(const PerfArgs& a, Backend& b, const Row& w, bool in_place, Buffer& send, Buffer& recv, Totals& totals) {
  const std::string unsupported = in_place && b.in_place_unsupported ? b.in_place_unsupported(w.c) : std::string();
  if (!unsupported.empty()) {
    if (b.rank == 0) std::printf("  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
    return {};
  }
  const Placement at = place(w, b.rank, in_place, send.get(), recv.get());
  const Placement host = place(w, b.rank, in_place, send.host(), recv.host());
  auto prepare_all = [&] {
    prepare(w, b.rank, in_place, host, recv.host());
    send.upload(w.count * w.elem);  // a row never touches more than its size column
    recv.upload(w.count * w.elem);
  };
  if (a.check != 0) prepare_all();  // time on realistic data, not on zeros
  for (int i = 0; i < a.warmup; ++i) invoke(w, b, at);
  synchronize(b);
  b.barrier();
  double local_us = 0;
  if (a.fresh_send) {
    // Each call on a send buffer just written by this rank (untimed). No barrier between them:
    // every rank writes the same amount, so they arrive together as in the plain loop (a barrier
    // before each call measured the same, bench/README.md "Fresh send buffers").
    std::chrono::steady_clock::duration calls{};
    for (int i = 0; i < a.iters * a.agg_iters; ++i) {
      write_send_again(w, in_place, send, recv, at);
      synchronize(b);
      const auto t0 = std::chrono::steady_clock::now();
      invoke(w, b, at);
      synchronize(b);
      calls += std::chrono::steady_clock::now() - t0;
    }
    local_us = std::chrono::duration<double, std::micro>(calls).count() / a.iters / a.agg_iters;
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    // -m: each timed iteration issues agg_iters calls; the time is per call, as in nccl-tests.
    for (int i = 0; i < a.iters; ++i)
      for (int k = 0; k < a.agg_iters; ++k) invoke(w, b, at);
    synchronize(b);
    const auto t1 = std::chrono::steady_clock::now();
    local_us = std::chrono::duration<double, std::micro>(t1 - t0).count() / a.iters / a.agg_iters;
  }
  const double us = aggregate_time(b, local_us, a.aggregate);

  std::uint64_t wrong = 0;
  for (int c = 0; c < a.check; ++c) {
    prepare_all();
    if (a.fresh_send) write_send_again(w, in_place, send, recv, at);  // checked as timed
    invoke(w, b, at);
    synchronize(b);
    send.download(w.count * w.elem);
    recv.download(w.count * w.elem);
    std::size_t first_bad = 0;
    std::uint64_t local = verify(w, b.rank, b.size, host, first_bad);
    if (local != 0) {
      std::fprintf(stderr, "# rank %d: %s %s %s count %zu %s: %llu wrong elements, first at %zu: got %s\n", b.rank,
                   collective_name(w.c), str(to_string(w.type)).c_str(), str(to_string(w.op)).c_str(), w.count,
                   in_place ? "in-place" : "out-of-place", static_cast<unsigned long long>(local), first_bad,
                   element_string(host.dst, first_bad, w.type).c_str());
    }
    host_allreduce(b, &local, &wrong, 1, DataType::Uint64, ReduceOp::Sum);
    if (wrong != 0) break;  // like nccl-tests: the first failing check ends the loop
  }

  const double sec = us * 1e-6;
  const double algbw = sec > 0.0 ? static_cast<double>(w.count * w.elem) / 1e9 / sec : 0.0;
  const double busbw = algbw * busbw_factor(w.c, b.size);
  totals.wrong += wrong;
  totals.busbw_sum += busbw;
  ++totals.busbw_count;
  if (b.rank == 0) {
    char t[32];
    format_time(t, us);
    if (a.check != 0) std::printf("  %7s  %6.2f  %6.2f  %5g", t, algbw, busbw, static_cast<double>(wrong));
    else std::printf("  %7s  %6.2f  %6.2f  %5s", t, algbw, busbw, "N/A");
  }
  return Measured{true, us, algbw, busbw, a.check != 0 ? static_cast<std::int64_t>(wrong) : -1};
}

bool offered(Collective c, const Backend& b) {
  switch (c) {
    case Collective::AllReduce: return static_cast<bool>(b.allreduce);
    case Collective::ReduceScatter: return static_cast<bool>(b.reduce_scatter);
    case Collective::AllGather: return static_cast<bool>(b.all_gather);
    case Collective::Broadcast: return static_cast<bool>(b.broadcast);
    case Collective::Reduce: return static_cast<bool>(b.reduce);
    case Collective::AllToAll: return static_cast<bool>(b.all_to_all);
    case Collective::SendRecv: return static_cast<bool>(b.send_recv);
  }
  return false;
}

}  // namespace

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::AllGather: return "all_gather";
    case Collective::Broadcast: return "broadcast";
    case Collective::Reduce: return "reduce";
    case Collective::AllToAll: return "alltoall";
    case Collective::SendRecv: return "sendrecv";
  }
  return "?";
}

bool has_op(Collective c) {
  return c == Collective::AllReduce || c == Collective::ReduceScatter || c == Collective::Reduce;
}

double busbw_factor(Collective c, int ranks) {
  const double n = ranks;
  switch (c) {
    case Collective::AllReduce: return 2.0 * (n - 1) / n;
    case Collective::ReduceScatter:
    case Collective::AllGather:
    case Collective::AllToAll: return (n - 1) / n;
    case Collective::Broadcast:
    case Collective::Reduce:
    case Collective::SendRecv: return 1.0;
  }
  return 1.0;
}

int run_perf(Collective c, const PerfArgs& a, Backend& b) {
  if (a.memory == MemoryMode::Alloc && !b.alloc) {
    if (b.rank == 0) std::fprintf(stderr, "# --memory alloc is not supported by %s\n", b.name.c_str());
    return 2;
  }
  if (a.memory == MemoryMode::Device && !(b.alloc && b.upload && b.download)) {
    if (b.rank == 0) std::fprintf(stderr, "# --memory device is not supported by %s\n", b.name.c_str());
    return 2;
  }
  if (a.timeout_s > 0) {
    if (!b.set_timeout) {
      if (b.rank == 0) std::fprintf(stderr, "# -T is not supported by %s\n", b.name.c_str());
      return 2;
    }
    b.set_timeout(std::chrono::milliseconds(static_cast<std::int64_t>(a.timeout_s * 1000)));
  }
  if (!offered(c, b)) {
    if (b.rank == 0) std::fprintf(stderr, "# %s is not offered by %s\n", collective_name(c), b.name.c_str());
    return 2;
  }
  if ((c == Collective::Broadcast || c == Collective::Reduce) && a.root >= b.size) {
    if (b.rank == 0) std::fprintf(stderr, "# -r %d: root must be below the rank count %d\n", a.root, b.size);
    return 2;
  }
  if (const std::string why = check_sizes(c, a, b.size); !why.empty()) {
    if (b.rank == 0) std::fprintf(stderr, "# %s\n", why.c_str());
    return 2;
  }
  if (std::string note = size_note(c, a, b.size); !note.empty()) b.notes.push_back("note: " + std::move(note));
  const int on_host = print_header(c, a, b);
  // Every rank decides alike (a host too small for its ranks' buffers stops the whole job).
  const std::string memory = check_memory(a, on_host, host_memory_bytes());
  std::int64_t too_big = memory.empty() ? 0 : 1;
  host_allreduce(b, &too_big, &too_big, 1, DataType::Int64, ReduceOp::Max);
  if (too_big) {
    if (!memory.empty()) std::fprintf(stderr, "# rank %d: %s\n", b.rank, memory.c_str());
    return 2;
  }
  Buffer send(a.max_bytes, a.memory, b);
  Buffer recv(a.max_bytes, a.memory, b);
  const std::vector<std::size_t> sizes = sizes_of(a);
  const bool blocks = c == Collective::ReduceScatter || c == Collective::AllGather || c == Collective::AllToAll;
  const auto n = static_cast<std::size_t>(b.size);
  Totals totals;
  std::vector<ResultRow> rows;  // for -J
  for (int cycle = 0; a.run_cycles == 0 || cycle < a.run_cycles; ++cycle)  // -N
  for (DataType type : a.types) {
    const std::string why = b.unsupported ? b.unsupported(type) : std::string();
    if (!why.empty()) {
      if (b.rank == 0) std::printf("# skipping %s: %s\n", str(to_string(type)).c_str(), why.c_str());
      continue;
    }
    const std::size_t elem = size_of(type);
    // Data-movement collectives run once per type with the min/max pattern (101 values: a
    // misplaced element is caught), the others once per op.
    const std::vector<ReduceOp> ops = has_op(c) ? a.ops : std::vector<ReduceOp>{ReduceOp::Max};
    for (ReduceOp op : ops) {
      std::vector<std::vector<std::byte>> inputs(n);
      std::vector<std::byte> reduced;
      for (std::size_t r = 0; r < n; ++r) {
        Pattern p = make_pattern(type, op, static_cast<int>(r), b.size);
        inputs[r] = std::move(p.input);
        if (r == 0) reduced = std::move(p.expected);
      }
      for (std::size_t size : sizes) {
        std::size_t count = size / elem;
        if (blocks) count = count / n * n;
        const Row w{c, type, op, a.root, count, blocks ? count / n : count, elem, &inputs, &reduced};
        if (b.rank == 0)
          std::printf("%12zu  %12zu  %8s  %6s  %6i", count * elem, count, str(to_string(type)).c_str(),
                      has_op(c) ? str(to_string(op)).c_str() : "none",
                      c == Collective::Broadcast || c == Collective::Reduce ? a.root : -1);
        ResultRow row{cycle, count * elem, count, str(to_string(type)), has_op(c) ? str(to_string(op)) : "none",
                      c == Collective::Broadcast || c == Collective::Reduce ? a.root : -1, {}, {}};
        row.out_of_place = measure(a, b, w, false, send, recv, totals);
        row.in_place = measure(a, b, w, true, send, recv, totals);
        if (!a.json_file.empty() && b.rank == 0) rows.push_back(std::move(row));
        if (b.rank == 0) {
          std::printf("\n");
          std::fflush(stdout);
        }
      }
    }
  }
  if (b.rank == 0) {
    const double avg = totals.busbw_count ? totals.busbw_sum / static_cast<double>(totals.busbw_count) : 0.0;
    std::printf("# Out of bounds values : %llu %s\n", static_cast<unsigned long long>(totals.wrong),
                totals.wrong ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g\n", avg);
    std::printf("#\n");
    std::printf("# Collective test concluded: %s_perf\n", collective_name(c));
    std::fflush(stdout);
    if (!a.json_file.empty()) {
      if (const std::string why = write_json(a.json_file, c, a, b, rows, totals.wrong, avg); !why.empty()) {
        std::fprintf(stderr, "# %s\n", why.c_str());
        return 1;
      }
    }
  }
  return totals.wrong ? 1 : 0;
}

int run_all_reduce_perf(const PerfArgs& a, Backend& b) { return run_perf(Collective::AllReduce, a, b); }


}  // namespace ringfence::bench
