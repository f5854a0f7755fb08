// memcpy_bw: host memory bandwidth B for the performance model of design.md §7
// (allreduce busbw on one host <= B·(n−1)/n²). Each thread copies its own pre-faulted
// buffer; bandwidth counts bytes read plus bytes written, like the model does.
//
//   memcpy_bw [-s bytes per thread (256M)] [-n iterations (10)] [-t threads (1)] [-q]
//
// -q prints only the number (GB/s), for scripts.
#include <getopt.h>

#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

// Decimal size with an optional K/M/G (binary) suffix; 0 on error.
std::size_t parse_size(const char* text) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (end == text) return 0;
  switch (*end) {
    case '\0': return v;
    case 'k': case 'K': return v << 10;
    case 'm': case 'M': return v << 20;
    case 'g': case 'G': return v << 30;
    default: return 0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t bytes = std::size_t{256} << 20;
  int iters = 10;
  int threads = 1;
  bool quiet = false;
  for (int c; (c = getopt(argc, argv, "s:n:t:qh")) != -1;) {
    switch (c) {
      case 's': bytes = parse_size(optarg); break;
      case 'n': iters = std::atoi(optarg); break;
      case 't': threads = std::atoi(optarg); break;
      case 'q': quiet = true; break;
      default:
        std::fprintf(stderr, "usage: %s [-s bytes per thread] [-n iterations] [-t threads] [-q]\n", argv[0]);
        return c == 'h' ? 0 : 2;
    }
  }
  if (bytes == 0 || iters < 1 || threads < 1) {
    std::fprintf(stderr, "%s: -s, -n and -t must be positive\n", argv[0]);
    return 2;
  }
  std::barrier start(threads + 1);
  std::barrier stop(threads + 1);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      // Allocated and touched by the copying thread itself, so pages are local to it.
      std::vector<char> src(bytes, 1);
      std::vector<char> dst(bytes, 0);
      std::memcpy(dst.data(), src.data(), bytes);  // warm-up
      start.arrive_and_wait();
      for (int i = 0; i < iters; ++i) {
        src[static_cast<std::size_t>(i) % bytes] = static_cast<char>(i);  // keep each copy observable
        std::memcpy(dst.data(), src.data(), bytes);
      }
      stop.arrive_and_wait();
      if (dst[bytes / 2] == 42) std::fprintf(stderr, " ");  // defeat dead-store elimination
    });
  }
  start.arrive_and_wait();
  const auto t0 = std::chrono::steady_clock::now();
  stop.arrive_and_wait();
  const auto t1 = std::chrono::steady_clock::now();
  for (auto& th : pool) th.join();
  const double sec = std::chrono::duration<double>(t1 - t0).count();
  const double gbps = 2.0 * static_cast<double>(bytes) * iters * threads / sec / 1e9;
  if (quiet) {
    std::printf("%.2f\n", gbps);
  } else {
    std::printf("memcpy_bw: threads %d bytes/thread %zu iters %d: %.2f GB/s (read + write)\n", threads, bytes, iters,
                gbps);
  }
  return 0;
}
