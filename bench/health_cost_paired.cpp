// health_cost_paired: what protection costs, measured in pairs inside one process.
//
// bench/health_cost.sh compares separate runs of all_reduce_perf. On a shared VM a whole run
// lands in a fast or a slow mode (two pinned 128 KiB runs of the same build differ by up to 5x
// here), so "best of 3 runs" compares luck as much as code. This program holds, on every rank,
// two communicators over the same thread ranks, one with protection off (no checksums, no
// health) and one at the defaults (with any RINGFENCE_* variables of the environment applied:
// `RINGFENCE_HEALTH=off` measures checksums alone), and alternates blocks of allreduces between them, swapping
// which goes first each round. Both sides of every pair see the same machine state, and the
// median of the per-round ratios is what protection costs.
//
//   health_cost_paired [-n ranks (2)] [-b min (8)] [-e max (256M)] [-r rounds (7)] [-t transport (shm)]
//                      [--bind core|none] [--only off|on]
//
// --only runs one side's blocks and skips the other (to profile one side with `perf record`);
// the table then shows that side alone.
// Under a launcher (`ringfence-run -n 4 [--bind-to core] health_cost_paired ...`: RINGFENCE_RANK
// set) every process is one rank instead: the defaults' communicator joins through the launch
// variables and the off one is split from it, so the pairs run on the ranks users run, with the
// launcher's placement (--bind does not apply; -n, if given, must match the launch: exit 2),
// -t still picks the transport of both sides, and rank 0 prints the table.
// Thread ranks (gloo's idea), float sum, out-of-place, user buffers; the transport is forced to
// `-t` on both sides. Ranks are pinned to one CPU each when they fit (`--bind core`, default).
// Sizes below 64 KiB compare time (on / off, lower is better), larger sizes busbw (on / off).
// Every size's results are checked exactly after its rounds (integers held in floats).
// Exit 0, 1 when a result was wrong or a rank failed, 2 on bad arguments.
#include <fmt/format.h>
#include <getopt.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <ringfence/communicator.hpp>
#include <ringfence/env.hpp>
#include <string>
#include <thread>
#include <vector>

#include "perf_common.hpp"

namespace {

using ringfence::bench::parse_size;
using ringfence::Communicator;
using Clock = std::chrono::steady_clock;

struct Args {
  int ranks = 2;
  bool ranks_given = false;  // -n on the command line (under a launcher it must match the launch)
  std::size_t min_bytes = 8, max_bytes = std::size_t{256} << 20;
  int rounds = 7;
  std::string transport = "shm";
  bool bind = true;
  std::string only;  // "", "off" or "on"
};

// Iterations per block: about 50 ms of work at this VM's speeds, at least 5.
int iterations_for(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>((std::size_t{256} << 20) / bytes, 5, 10000));
}

// Seconds per allreduce of one block on `comm`, after two untimed calls that also line the
// ranks up (a call cannot finish before every rank has entered it).
double time_block(Communicator& comm, const float* send, float* recv, std::size_t count, int iters) {
  for (int i = 0; i < 2; ++i) comm.allreduce(send, recv, count, ringfence::DataType::Float32, ringfence::ReduceOp::Sum);
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) comm.allreduce(send, recv, count, ringfence::DataType::Float32, ringfence::ReduceOp::Sum);
  return std::chrono::duration<double>(Clock::now() - t0).count() / iters;
}

// One size's rounds as rank 0 saw them.
struct SizeResult {
  std::vector<double> off, on;  // seconds per call, per round
};

void pin_to_cpu(int index) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  if (cpus.empty()) return;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpus[static_cast<std::size_t>(index) % cpus.size()], &one);
  pthread_setaffinity_np(pthread_self(), sizeof one, &one);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// One rank's rounds over every size on its two communicators; rank 0 records its timings in
// `results`. Returns the rank's wrong elements (checked after each size's rounds).
std::size_t run_rank(const Args& args, const std::vector<std::size_t>& sizes, Communicator& comm_off, Communicator& comm_on,
                     std::vector<SizeResult>& results) {
  const int r = comm_on.rank();
  std::size_t wrong = 0;
  for (std::size_t s = 0; s < sizes.size(); ++s) {
    const std::size_t count = sizes[s] / sizeof(float);
    // Small integers: every partial sum is exact in float, in any order.
    std::vector<float> send(count), recv(count);
    for (std::size_t i = 0; i < count; ++i) send[i] = static_cast<float>((i * 7 + static_cast<std::size_t>(r)) % 64);
    const int iters = iterations_for(sizes[s]);
    for (int round = 0; round < args.rounds; ++round) {
      const bool off_first = round % 2 == 0;
      double t_off = 0, t_on = 0;
      for (int half = 0; half < 2; ++half) {
        const bool off_now = (half == 0) == off_first;
        if (!args.only.empty() && args.only != (off_now ? "off" : "on")) continue;
        (off_now ? t_off : t_on) = time_block(off_now ? comm_off : comm_on, send.data(), recv.data(), count, iters);
      }
      if (r == 0) {
        results[s].off.push_back(t_off);
        results[s].on.push_back(t_on);
      }
    }
    for (std::size_t i = 0; i < count; ++i) {
      std::size_t expect = 0;
      for (int q = 0; q < comm_on.size(); ++q) expect += (i * 7 + static_cast<std::size_t>(q)) % 64;
      if (recv[i] != static_cast<float>(expect)) ++wrong;
    }
  }
  return wrong;
}

// Rank 0's table: per size the best block of each side, the median of the round ratios and
// their range.
int print_table(const Args& args, const std::vector<std::size_t>& sizes, const std::vector<SizeResult>& results,
                const std::string& placement, const ringfence::CommOptions& on) {
  const double busbw_factor = 2.0 * (args.ranks - 1) / args.ranks;
  fmt::print("health_cost_paired: {} ranks ({}), transport {}, {} rounds per size; off = checksums and health off, "
             "on = the defaults{}\n\n",
             args.ranks, placement, args.transport, args.rounds,
             fmt::format(" (checksum {}, health {})", on.checksum ? "on" : "off", on.health_enabled ? "on" : "off"));
  fmt::print("| ranks | bytes | off time (us) | on time (us) | **on/off, median of rounds** | range of round ratios | off busbw (GB/s) | on busbw (GB/s) |\n");
  fmt::print("|---|---|---|---|---|---|---|---|\n");
  // A side that did not run (--only) shows "-".
  const auto cell = [](double v, double scale) { return v > 0 ? fmt::format("{:.2f}", v * scale) : std::string("-"); };
  for (std::size_t s = 0; s < sizes.size(); ++s) {
    const auto& res = results[s];
    const bool small = sizes[s] < (64u << 10);
    std::vector<double> ratios;
    if (args.only.empty())
      for (std::size_t k = 0; k < res.off.size(); ++k)  // time ratio below 64 KiB, busbw ratio from there
        ratios.push_back(small ? res.on[k] / res.off[k] : res.off[k] / res.on[k]);
    const double off_best = *std::min_element(res.off.begin(), res.off.end());
    const double on_best = *std::min_element(res.on.begin(), res.on.end());
    const double bytes = static_cast<double>(sizes[s]);
    fmt::print("| {} | {} | {} | {} | {} | {} | {} | {} |\n", args.ranks, sizes[s], cell(off_best, 1e6), cell(on_best, 1e6),
               ratios.empty() ? "-" : fmt::format("**{:.2f}** ({})", median(ratios), small ? "time" : "busbw"),
               ratios.empty() ? "-"
                              : fmt::format("{:.2f}–{:.2f}", *std::min_element(ratios.begin(), ratios.end()),
                                            *std::max_element(ratios.begin(), ratios.end())),
               cell(off_best > 0 ? busbw_factor * bytes / off_best : 0, 1e-9), cell(on_best > 0 ? busbw_factor * bytes / on_best : 0, 1e-9));
  }
  return 0;
}

int usage(const char* self, int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: %s [-n ranks] [-b min bytes] [-e max bytes] [-r rounds] [-t transport] [--bind core|none] [--only off|on]\n", self);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  static const option longs[] = {{"bind", required_argument, nullptr, 'B'}, {"only", required_argument, nullptr, 'O'}, {"help", no_argument, nullptr, 'h'}, {}};
  for (int c; (c = getopt_long(argc, argv, "n:b:e:r:t:h", longs, nullptr)) != -1;) {
    switch (c) {
      case 'n': args.ranks = std::atoi(optarg), args.ranks_given = true; break;
      case 'b': args.min_bytes = parse_size(optarg).value_or(0); break;
      case 'e': args.max_bytes = parse_size(optarg).value_or(0); break;
      case 'r': args.rounds = std::atoi(optarg); break;
      case 't': args.transport = optarg; break;
      case 'B':
        if (std::string(optarg) != "core" && std::string(optarg) != "none") {
          std::fprintf(stderr, "%s: --bind takes core or none, not '%s'\n", argv[0], optarg);
          return 2;
        }
        args.bind = std::string(optarg) == "core";
        break;
      case 'O':
        if (std::string(optarg) != "off" && std::string(optarg) != "on") {
          std::fprintf(stderr, "%s: --only takes off or on, not '%s'\n", argv[0], optarg);
          return 2;
        }
        args.only = optarg;
        break;
      case 'h': return usage(argv[0], 0);
      default: return usage(argv[0], 2);
    }
  }
  if (args.rounds < 1 || args.min_bytes < sizeof(float) || args.max_bytes < args.min_bytes) {
    std::fprintf(stderr, "%s: need -r >= 1, %zu <= -b <= -e (got -r %d -b %zu -e %zu)\n", argv[0], sizeof(float),
                 args.rounds, args.min_bytes, args.max_bytes);
    return 2;
  }
  std::vector<std::size_t> sizes;
  for (std::size_t b = args.min_bytes; b <= args.max_bytes; b *= 2) sizes.push_back(b / sizeof(float) * sizeof(float));
  const bool pin = args.bind && args.ranks <= static_cast<int>(std::thread::hardware_concurrency());

  ringfence::CommOptions off;
  off.transports = {args.transport};
  off.checksum = false;
  off.health_enabled = false;
  // The defaults, with the environment's RINGFENCE_* variables applied (RINGFENCE_HEALTH=off
  // measures checksums alone, RINGFENCE_CHECKSUM=off health alone).
  ringfence::CommOptions on = ringfence::CommOptions::from_env(ringfence::Environment::from_process(), {});
  on.transports = {args.transport};

  std::vector<SizeResult> results(sizes.size());
  std::string placement;
  const ringfence::Environment env = ringfence::Environment::from_process();
  if (env.has("RINGFENCE_RANK")) {  // process ranks under a launcher
    std::size_t wrong = 0;
    int rank = -1;
    try {
      const ringfence::LaunchInfo launch = ringfence::detect_launch(env);
      rank = launch.rank;
      if (args.ranks_given && args.ranks != launch.size) {
        std::fprintf(stderr, "health_cost_paired: rank %d: -n %d, but the launcher started %d ranks (leave -n out under a launcher)\n",
                     rank, args.ranks, launch.size);
        return 2;
      }
      args.ranks = launch.size;
      Communicator comm_on = Communicator::from_launch(launch, ringfence::builtin_transports(), on);
      std::optional<Communicator> comm_off = comm_on.split(0, comm_on.rank(), off);
      wrong = run_rank(args, sizes, *comm_off, comm_on, results);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "health_cost_paired: rank %d: %s\n", rank, e.what());
      return 1;
    }
    if (wrong) {
      std::fprintf(stderr, "health_cost_paired: rank %d: %zu wrong elements\n", rank, wrong);
      return 1;
    }
    if (rank != 0) return 0;
    cpu_set_t allowed;
    const bool bound = sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) == 1;
    placement = fmt::format("process ranks, rank 0 {}", bound ? "bound to one CPU" : "unbound");
    return print_table(args, sizes, results, placement, on);
  }
  if (args.ranks < 2) {
    std::fprintf(stderr, "%s: need -n >= 2 (got -n %d)\n", argv[0], args.ranks);
    return 2;
  }
  placement = fmt::format("thread ranks, {}", pin ? "pinned" : "unpinned");

  auto store_off = std::make_shared<ringfence::PrefixStore>(std::make_shared<ringfence::InProcessStore>(), "off/");
  auto store_on = std::make_shared<ringfence::PrefixStore>(std::make_shared<ringfence::InProcessStore>(), "on/");
  std::atomic<std::size_t> wrong{0};
  std::mutex error_mutex;
  std::string error;
  std::vector<std::thread> threads;
  for (int r = 0; r < args.ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        if (pin) pin_to_cpu(r);
        Communicator comm_off(store_off, r, args.ranks, ringfence::builtin_transports(), off);
        Communicator comm_on(store_on, r, args.ranks, ringfence::builtin_transports(), on);
        wrong += run_rank(args, sizes, comm_off, comm_on, results);
      } catch (const std::exception& e) {
        std::lock_guard lock(error_mutex);
        if (error.empty()) error = fmt::format("rank {}: {}", r, e.what());
      }
    });
  for (auto& t : threads) t.join();
  if (!error.empty()) {
    std::fprintf(stderr, "health_cost_paired: %s\n", error.c_str());
    return 1;
  }

  if (wrong) {
    std::fprintf(stderr, "health_cost_paired: %zu wrong elements\n", wrong.load());
    return 1;
  }
  return print_table(args, sizes, results, placement, on);
}
