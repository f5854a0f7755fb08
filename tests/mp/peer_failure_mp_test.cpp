// A rank that disappears ("exit") or stops answering ("stall") must turn into a clear error on
// every other rank, within the configured timeout, never a hang.
//   exit:  the last rank _exit(0)s while an allreduce is in flight; survivors must see
//          PeerUnreachableError or TimeoutError naming a rank, well within the timeout.
//   stall: the last rank sleeps for 3x the timeout instead of joining; survivors must see
//          TimeoutError after roughly the timeout (RINGFENCE_TIMEOUT_MS), not later than 2x.
//   shrink: as exit, then the survivors shrink the communicator without the dead rank and
//          run exact allreduces on it.
// The failing rank exits 0 so the launcher lets the survivors report.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <ringfence/ringfence.hpp>
#include <thread>
#include <vector>

using namespace ringfence;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  const bool stall = argc > 1 && std::strcmp(argv[1], "stall") == 0;
  const bool shrink = argc > 1 && std::strcmp(argv[1], "shrink") == 0;
  try {
    Communicator comm = Communicator::from_env();
    const int victim = comm.size() - 1;
    const auto timeout = comm.options().timeout;
    std::vector<float> buf(8u << 20, 1.0f);
    comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);  // everyone healthy
    if (comm.rank() == victim) {
      // The others may still be finishing the healthy allreduce (the victim can finish a ring
      // step ahead of them): give them that, so the failure hits the next collective.
      std::this_thread::sleep_for(timeout / 4);
      if (stall) {
        std::this_thread::sleep_for(3 * timeout);
        _exit(0);
      }
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        _exit(0);
      }).detach();
      for (;;) comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
    }
    const auto start = Clock::now();
    try {
      for (int i = 0; i < 1000; ++i) comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
      std::fprintf(stderr, "FAIL: no error although rank %d is gone\n", victim);
      return 1;
    } catch (const Error& e) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      const bool right_kind = stall ? e.code() == ErrorCode::Timeout
                                    : (e.code() == ErrorCode::PeerUnreachable || e.code() == ErrorCode::Timeout);
      // Every survivor names a rank and a link. For a dead peer that is the victim (directly,
      // through the rank that aborted, or through the heartbeat). For a stall — a live process
      // that does not call the collective; its heartbeat goes on — it can be a neighbour that
      // was itself waiting on the victim (both deadlines expire together). A stopped process
      // (SIGSTOP) is named by every survivor through the heartbeat: see the fault matrix.
      const std::string victim_name = "rank " + std::to_string(victim);
      const bool names_rank = stall ? std::strstr(e.what(), "rank ") != nullptr && std::strstr(e.what(), "link") != nullptr
                                    : std::strstr(e.what(), victim_name.c_str()) != nullptr;
      const long long bound = 2 * timeout.count();
      const bool in_time = ms <= bound && (!stall || ms >= timeout.count() / 2);
      std::printf("rank %d saw after %lld ms (bound %lld ms): %s\n", comm.rank(), static_cast<long long>(ms), bound, e.what());
      if (!right_kind || !names_rank || !in_time) {
        std::fprintf(stderr, "FAIL: kind ok=%d names rank=%d in time=%d\n", right_kind, names_rank, in_time);
        return 1;
      }
      // The communicator refuses further use, without hanging.
      try {
        comm.allreduce(buf.data(), buf.data(), 1, DataType::Float32, ReduceOp::Sum);
        return 1;
      } catch (const Error& again) {
        if (!std::strstr(again.what(), "already failed")) return 1;
      }
      if (comm.async_error().is_ok()) return 1;
      if (shrink) {
        Communicator small = comm.shrink({victim});
        const int n = small.size();
        if (n != comm.size() - 1 || small.rank() != comm.rank()) return 1;
        for (int it = 0; it < 3; ++it) {
          std::vector<double> v(100000);
          for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 7 + static_cast<std::size_t>(small.rank()) * 3) % 13);
          small.allreduce(v.data(), v.data(), v.size(), DataType::Float64, ReduceOp::Sum);
          for (std::size_t i = 0; i < v.size(); ++i) {
            double want = 0;
            for (int r = 0; r < n; ++r) want += static_cast<double>((i * 7 + static_cast<std::size_t>(r) * 3) % 13);
            if (v[i] != want) {
              std::fprintf(stderr, "FAIL: element %zu after shrink: %g != %g\n", i, v[i], want);
              return 1;
            }
          }
        }
        std::printf("rank %d: shrunk to %d ranks, allreduce exact\n", small.rank(), n);
      }
      std::printf("1 passed, 0 failed\n");
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected error: %s\n", e.what());
    return 1;
  }
}
