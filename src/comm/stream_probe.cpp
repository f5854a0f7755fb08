// The setup-time probe behind CommOptions::stream_writes: two pinned threads exchange chunks the
// way two ranks of a ring do (as bench/cross_core_copy does), with plain and with streaming
// stores, and the faster kind is kept for the communicator's writes into peers' slots.
#include "stream_probe.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <limits>
#include <memory>
#include <new>
#include <ringfence/reduce_ops.hpp>
#include <system_error>
#include <thread>

namespace ringfence::detail {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kChunkBytes = 64 * 1024;  // a typical pipeline chunk: the write half dominates there
constexpr std::size_t kSlots = 8;               // rotating, as staging slots do
constexpr int kStepsPerRound = 16;
constexpr int kRounds = 12;  // alternately plain and streaming, so both see the same minutes
constexpr auto kPatience = std::chrono::seconds(1);

struct alignas(64) Flag {
  std::atomic<std::uint64_t> value{0};
};

struct AlignedBytes {
  struct Free {
    void operator()(std::byte* p) const noexcept { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<std::byte[], Free> p;
  explicit AlignedBytes(std::size_t n) : p(static_cast<std::byte*>(::operator new[](n, std::align_val_t{64}))) {
    std::fill_n(p.get(), n, std::byte{0});
  }
  std::byte* get() const noexcept { return p.get(); }
};

struct Side {
  AlignedBytes src{kChunkBytes}, out{kChunkBytes}, inbox{kSlots * kChunkBytes};
  Flag arrived;  // steps whose chunk for this side is in its inbox
};

bool pin(int cpu) noexcept {
  if (cpu < 0 || cpu >= CPU_SETSIZE) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return ::pthread_setaffinity_np(::pthread_self(), sizeof set, &set) == 0;
}

bool streaming_round(int step) noexcept { return ((step - 1) / kStepsPerRound) % 2 == 1; }

}  // namespace

std::optional<StreamProbe> probe_stream_writes(int cpu_a, int cpu_b) {
  Side side[2];
  std::atomic<int> ready{0};
  std::atomic<bool> failed{false};
  double best[2] = {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};  // plain, streaming
  // Waits until `done()` or the partner gave up or went quiet; false then.
  auto await = [&](auto done) noexcept {
    const auto deadline = Clock::now() + kPatience;
    for (std::uint32_t spins = 0; !done(); ++spins) {
      if (failed.load(std::memory_order_relaxed)) return false;
      if (spins % 1024 == 1023 && Clock::now() > deadline) {
        failed = true;
        return false;
      }
    }
    return true;
  };
  auto run = [&](int me) noexcept {
    if (!pin(me == 0 ? cpu_a : cpu_b)) {
      failed = true;
      return;
    }
    ready.fetch_add(1);
    if (!await([&] { return ready.load() == 2; })) return;
    Side& mine = side[me];
    Side& peer = side[1 - me];
    std::fill_n(mine.src.get(), kChunkBytes, static_cast<std::byte>(me + 1));
    Clock::time_point round_start = Clock::now();
    for (int step = 1; step <= kRounds * kStepsPerRound; ++step) {
      std::byte* const slot = peer.inbox.get() + static_cast<std::size_t>(step) % kSlots * kChunkBytes;
      if (streaming_round(step)) copy_bytes_stream(slot, mine.src.get(), kChunkBytes);
      else copy_bytes(slot, mine.src.get(), kChunkBytes);
      peer.arrived.value.store(static_cast<std::uint64_t>(step), std::memory_order_release);
      if (!await([&] { return mine.arrived.value.load(std::memory_order_acquire) >= static_cast<std::uint64_t>(step); })) return;
      copy_bytes(mine.out.get(), mine.inbox.get() + static_cast<std::size_t>(step) % kSlots * kChunkBytes, kChunkBytes);
      if (me == 0 && step % kStepsPerRound == 0) {
        const Clock::time_point now = Clock::now();
        const double us = std::chrono::duration<double, std::micro>(now - round_start).count() / kStepsPerRound;
        double& b = best[streaming_round(step) ? 1 : 0];
        b = std::min(b, us);
        round_start = now;
      }
    }
  };
  // Two threads of its own: pinning the caller would move the rank's thread for good. If the
  // second cannot start, the first gives up on its own.
  std::thread first(run, 0);
  try {
    std::thread second(run, 1);
    second.join();
  } catch (const std::system_error&) {
    failed = true;
  }
  first.join();
  if (failed) return std::nullopt;
  return StreamProbe{best[0], best[1]};
}

bool prefers_stream(const StreamProbe& p) noexcept { return p.stream_us < kStreamWin * p.plain_us; }

namespace {

// CommOptions::stream_writes when it decides by itself (on, off); nullopt for auto.
std::optional<bool> forced(StreamWritesMode mode) noexcept {
  if (mode == StreamWritesMode::Auto) return std::nullopt;
  return mode == StreamWritesMode::On;
}

// The host's answer, as its lowest rank gives it: its own option when on or off; with auto,
// false where no other rank of the communicator runs here or only network transports are
// selected, else the probe between this rank's first CPU and the next online one (with one
// CPU per rank, usually the next rank's). Logs the probe.
bool probe_host(const CommContext& ctx) {
  if (const auto f = forced(ctx.options.stream_writes)) return *f;
  if (!stream_writes_adapt(ctx)) return false;  // no other core writes a slot here
  const int cpu_a = first_allowed_cpu();
  const int cpu_b = (cpu_a + 1) % online_cpus();
  const std::optional<StreamProbe> probe = probe_stream_writes(cpu_a, cpu_b);
  const bool stream = probe && prefers_stream(*probe);
  if (probe)
    ctx.log.info("stream writes {}: a 64 KiB exchange step between CPUs {} and {} took {:.2f} us plain, {:.2f} us streaming",
                 stream ? "on" : "off", cpu_a, cpu_b, probe->plain_us, probe->stream_us);
  else
    ctx.log.info("stream writes off: the probe between CPUs {} and {} could not run", cpu_a, cpu_b);
  return stream;
}

int lowest_on_host(const CommContext& ctx) noexcept {
  int lowest = ctx.rank;
  for (const PeerInfo& p : ctx.peer_info)
    if (p.host_id == ctx.self.host_id) lowest = std::min(lowest, p.rank);
  return lowest;
}

std::string answer_key(int rank) { return "stream_writes/" + std::to_string(rank); }

}  // namespace

bool stream_writes_adapt(const CommContext& ctx) noexcept {
  return ctx.options.stream_writes == StreamWritesMode::Auto && ctx.ranks_on_host() >= 2 && !ctx.network_only() && online_cpus() >= 2;
}

void publish_stream_writes(const CommContext& ctx) {
  if (ctx.rank == lowest_on_host(ctx)) ctx.store->set(answer_key(ctx.rank), to_bytes(probe_host(ctx) ? "1" : "0"));
}

bool read_stream_writes(const CommContext& ctx) {
  // Read even when this rank's option decides: every rank makes the same store calls.
  const bool host = to_string(ctx.store->get(answer_key(lowest_on_host(ctx)), ctx.options.timeout)) == "1";
  return forced(ctx.options.stream_writes).value_or(host);
}

}  // namespace ringfence::detail
