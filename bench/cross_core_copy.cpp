// cross_core_copy: what one hop of a 2-rank exchange costs per chunk size, without the engine.
// Two threads pinned to two CPUs do what two ranks of a ring do in each step: copy a chunk
// into the other's inbox slot (slots rotate, as staging slots do), publish a flag, wait for the
// other's flag, copy the other's chunk out of their own inbox. Prints the time of one step and
// the write and read halves for every size, so a per-size cliff shows without any library cost
// (docs/tuning.md, "Two ranks": chunks under ~24 KiB cross between cores at half the speed).
//
// -w writes the chunk into the peer's slot with streaming stores (copy_bytes_stream), as the
// engine does where CommOptions::stream_writes holds (docs/tuning.md "Streaming slot writes").
//
//   cross_core_copy [-c cpu,cpu (0,1)] [-n steps per size (20000)] [-s slots (8)] [-w]
#include <getopt.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <ringfence/reduce_ops.hpp>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct alignas(64) Flag {
  std::atomic<std::uint64_t> value{0};
};

struct Side {
  std::vector<std::byte> src, out, inbox;  // own message, copy of the peer's, slots the peer writes
  double write_ns = 0, read_ns = 0, step_ns = 0;
};

bool pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

void spin_until(const Flag& f, std::uint64_t target) {
  while (f.value.load(std::memory_order_acquire) < target) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
}

}  // namespace

int main(int argc, char** argv) {
  int cpu[2] = {0, 1};
  int steps = 20000;
  std::size_t slots = 8;
  bool stream = false;
  for (int c; (c = getopt(argc, argv, "c:n:s:wh")) != -1;) {
    switch (c) {
      case 'c':
        if (std::sscanf(optarg, "%d,%d", &cpu[0], &cpu[1]) != 2) return std::fprintf(stderr, "-c expects cpu,cpu\n"), 2;
        break;
      case 'n': steps = std::atoi(optarg); break;
      case 's': slots = static_cast<std::size_t>(std::atol(optarg)); break;
      case 'w': stream = true; break;
      default:
        std::fprintf(stderr, "usage: cross_core_copy [-c cpu,cpu] [-n steps] [-s slots] [-w]\n");
        return c == 'h' ? 0 : 2;
    }
  }
  // One slot would let a thread overwrite the chunk its peer is still reading.
  if (steps <= 0 || slots < 2) return std::fprintf(stderr, "-n must be positive and -s at least 2\n"), 2;
  constexpr std::size_t kSlotBytes = std::size_t{256} << 10;  // the default staging slot
  std::printf("# %d steps per size, %zu slots of 256 KiB, CPUs %d and %d, %s writes; times of thread 0 per step\n", steps,
              slots, cpu[0], cpu[1], stream ? "streaming" : "plain");
  std::printf("%8s %10s %10s %10s %12s\n", "bytes", "step_us", "write_us", "read_us", "GB/s/dir");
  const std::size_t sizes[] = {1 << 10, 2 << 10, 4 << 10, 8 << 10, 12 << 10, 16 << 10, 20 << 10, 24 << 10,
                               28 << 10, 32 << 10, 48 << 10, 64 << 10, 128 << 10};
  Side side[2];
  for (Side& s : side) s.inbox.assign(slots * kSlotBytes, std::byte{0});
  for (const std::size_t bytes : sizes) {
    Flag flag[2];  // flag[r]: steps whose chunk for rank r is in r's inbox
    for (int r = 0; r < 2; ++r) {
      side[r].src.assign(bytes, static_cast<std::byte>(r + 1));
      side[r].out.assign(bytes, std::byte{0});
    }
    std::atomic<bool> pinned{true};
    auto run = [&](int r) {
      if (!pin(cpu[r])) pinned = false;
      Side& me = side[r];
      Side& peer = side[1 - r];
      Clock::duration wrote{}, read{};
      const auto start = Clock::now();
      for (int i = 1; i <= steps; ++i) {
        const std::size_t slot = static_cast<std::size_t>(i) % slots * kSlotBytes;
        const auto t0 = Clock::now();
        if (stream) ringfence::copy_bytes_stream(peer.inbox.data() + slot, me.src.data(), bytes);
        else ringfence::copy_bytes(peer.inbox.data() + slot, me.src.data(), bytes);
        const auto t1 = Clock::now();
        flag[1 - r].value.store(static_cast<std::uint64_t>(i), std::memory_order_release);
        spin_until(flag[r], static_cast<std::uint64_t>(i));
        const auto t2 = Clock::now();
        ringfence::copy_bytes(me.out.data(), me.inbox.data() + slot, bytes);
        read += Clock::now() - t2;
        wrote += t1 - t0;
      }
      const double n = steps;
      me.step_ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count() / n;
      me.write_ns = std::chrono::duration<double, std::nano>(wrote).count() / n;
      me.read_ns = std::chrono::duration<double, std::nano>(read).count() / n;
    };
    std::thread other(run, 1);
    run(0);
    other.join();
    if (!pinned) return std::fprintf(stderr, "cross_core_copy: cannot pin to CPUs %d and %d\n", cpu[0], cpu[1]), 1;
    if (std::memcmp(side[0].out.data(), side[1].src.data(), bytes) != 0) return std::fprintf(stderr, "copy mismatch\n"), 1;
    const Side& s = side[0];
    std::printf("%8zu %10.2f %10.2f %10.2f %12.2f\n", bytes, s.step_ns / 1e3, s.write_ns / 1e3, s.read_ns / 1e3,
                static_cast<double>(bytes) / s.step_ns);
  }
  return 0;
}
