#pragma once
// A run of exact int32 allreduces on thread ranks that records, per rank, the final plan and when
// one watched link was fenced, readmitted and reported healthy (health tests on fences and
// readmission).
#include <atomic>
#include <functional>
#include <ringfence/communicator.hpp>
#include <ringfence/events.hpp>
#include <string>
#include <vector>

#include "thread_ranks.hpp"
#include "verifiable.hpp"

namespace ringfence::test {

// What one rank saw in a run of exact int32 allreduces: its final plan, and the sequence numbers
// at which link `watched` was last fenced, readmitted and reported healthy (0 = never).
struct PlanOutcome {
  std::vector<LinkId> fences;
  std::vector<int> ring;
  std::size_t relays = 99;
  std::uint64_t epoch = 0, fenced_at = 0, readmitted_at = 0, healthy_at = 0;
};

// `iterations` int32 sum allreduces of `count` elements on `n` thread ranks; `before(it, comm)`
// runs before each (storms, sleeps). Returns the first error ("" if none); wrong elements over
// all ranks go to `wrong`.
inline std::string run_plan_scenario(int n, const CommOptions& o, int iterations, std::size_t count, LinkId watched,
                              const std::function<void(int, Communicator&)>& before, std::vector<PlanOutcome>& out,
                              std::size_t& wrong) {
  out.assign(static_cast<std::size_t>(n), PlanOutcome{});
  std::atomic<std::size_t> bad{0};
  const std::string error = run_ranks(n, o, [&](Communicator& comm) {
    PlanOutcome& mine = out[static_cast<std::size_t>(comm.rank())];
    comm.on_health_event([&](const HealthEvent& e) {
      if (e.a != watched.a || e.b != watched.b) return;
      if (e.kind == EventKind::LinkFenced) mine.fenced_at = e.sequence;
      if (e.kind == EventKind::LinkReadmitted) mine.readmitted_at = e.sequence;
      if (e.kind == EventKind::LinkHealthy) mine.healthy_at = e.sequence;
    });
    std::vector<std::int32_t> buf(count);
    for (int it = 0; it < iterations; ++it) {
      before(it, comm);
      fill_input(DataType::Int32, ReduceOp::Sum, comm.rank(), n, buf.data(), buf.size());
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Int32, ReduceOp::Sum);
      bad += count_wrong(DataType::Int32, ReduceOp::Sum, n, buf.data(), buf.size());
    }
    mine.fences = comm.fenced_links();
    mine.ring = comm.ring();
    mine.relays = comm.relays().size();
    mine.epoch = comm.epoch();
  });
  wrong = bad;
  return error;
}

}  // namespace ringfence::test
