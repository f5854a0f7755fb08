// 01_allreduce_demo: the smallest complete ringfence program.
//
//   build/bin/ringfence-run -n 4 build/bin/allreduce_demo
//
// Every rank joins from the launcher's environment, runs float32 sum allreduces from 4 KiB to
// 64 MiB, checks the result exactly, prints a bandwidth table (rank 0), and finally each rank's
// per-link table: transport, state and traffic of every link it used.
#include <chrono>
#include <cstdio>
#include <ringfence/ringfence.hpp>
#include <vector>

int main() {
  try {
    ringfence::Communicator comm = ringfence::Communicator::from_env();
    const int n = comm.size();
    if (comm.rank() == 0) {
      std::printf("ringfence %s: %d ranks, float32 sum allreduce\n", ringfence::kVersionString, n);
      std::printf("%12s %10s %10s %10s %8s\n", "size(B)", "time(us)", "algbw", "busbw", "check");
    }
    bool all_ok = true;
    for (std::size_t bytes = 4096; bytes <= (64u << 20); bytes *= 4) {
      const std::size_t count = bytes / sizeof(float);
      // Inputs are small integers: the sum is exact in any order, so the check is bitwise.
      std::vector<float> buf(count);
      auto fill = [&] {
        for (std::size_t i = 0; i < count; ++i) buf[i] = static_cast<float>((i + static_cast<std::size_t>(comm.rank())) % 16);
      };
      fill();
      comm.allreduce(buf.data(), buf.data(), count, ringfence::DataType::Float32, ringfence::ReduceOp::Sum);  // warm-up
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int r = 0; r < n; ++r) want += static_cast<float>((i + static_cast<std::size_t>(r)) % 16);
        wrong += buf[i] != want;
      }
      const int iters = bytes >= (16u << 20) ? 5 : 20;
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (int it = 0; it < iters; ++it)
        comm.allreduce(buf.data(), buf.data(), count, ringfence::DataType::Float32, ringfence::ReduceOp::Sum);
      double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
      comm.allreduce(&us, &us, 1, ringfence::DataType::Float64, ringfence::ReduceOp::Max);
      std::uint64_t bad = wrong;
      comm.allreduce(&bad, &bad, 1, ringfence::DataType::Uint64, ringfence::ReduceOp::Sum);
      all_ok &= bad == 0;
      const double algbw = static_cast<double>(bytes) / us / 1e3;
      if (comm.rank() == 0)
        std::printf("%12zu %10.1f %10.2f %10.2f %8s\n", bytes, us, algbw, algbw * 2.0 * (n - 1) / n, bad ? "WRONG" : "ok");
    }
    // Per-link tables, one rank after the other.
    for (int r = 0; r < n; ++r) {
      comm.barrier();
      if (r == comm.rank()) {
        std::printf("links of rank %d:\n%s", r, comm.link_table().c_str());
        std::fflush(stdout);
      }
    }
    comm.barrier();
    return all_ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_demo: %s\n", e.what());
    return 1;
  }
}
