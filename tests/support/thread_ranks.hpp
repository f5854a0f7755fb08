#pragma once
// Thread ranks (gloo's spawn idea): `n` communicators in one process sharing an InProcessStore.
#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <ringfence/communicator.hpp>
#include <string>
#include <thread>
#include <vector>

#include "verifiable.hpp"

// Catch2 2.x assertions are not thread-safe: rank threads use T_CHECK, which throws; the
// thread runner (run_ranks, or a test's own) reports the failure on the test thread.
#define T_CHECK(cond)                                                                                             \
  do {                                                                                                            \
    if (!(cond)) throw std::runtime_error(std::string("check failed: " #cond " at line ") + std::to_string(__LINE__)); \
  } while (0)

namespace ringfence::test {

// Runs `body(comm)` on `n` thread ranks built with `options`; returns the first error as
// "rank R: message", or "" when every rank finished. Catch2 assertions are not thread-safe:
// bodies record results (or throw) and the test thread asserts afterwards.
// `options_of(r)` gives rank r's options (ranks that differ, e.g. in their GPU); `registry`
// the transports (null: builtin_transports()).
inline std::string run_ranks(int n, const std::function<CommOptions(int)>& options_of,
                             const std::function<void(Communicator&)>& body, const TransportRegistry* registry = nullptr) {
  auto store = std::make_shared<InProcessStore>();
  std::mutex mutex;
  std::string error;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        Communicator comm(store, r, n, registry ? *registry : builtin_transports(), options_of(r));
        body(comm);
      } catch (const std::exception& e) {
        std::lock_guard lock(mutex);
        if (error.empty()) error = fmt::format("rank {}: {}", r, e.what());
      }
    });
  for (auto& t : threads) t.join();
  return error;
}

inline std::string run_ranks(int n, const CommOptions& options, const std::function<void(Communicator&)>& body) {
  return run_ranks(n, [&](int) { return options; }, body);
}

// What `plan_and_allreduce` saw: the first error ("" = none), the wrong elements of all ranks,
// and every rank's ring.
struct PlannedRun {
  std::string error;
  std::size_t wrong = 0;
  std::vector<std::vector<int>> rings;
};

// Builds `n` thread ranks with `options_of(r)` (on rank r's thread), records each rank's ring and
// runs one exact Int64 sum allreduce of 5000 elements (inputs whose sums are exact in any order).
inline PlannedRun plan_and_allreduce(int n, const std::function<CommOptions(int)>& options_of) {
  PlannedRun out;
  out.rings.resize(static_cast<std::size_t>(n));
  std::atomic<std::size_t> wrong{0};
  out.error = run_ranks(n, options_of, [&](Communicator& comm) {
    out.rings[static_cast<std::size_t>(comm.rank())] = comm.ring();
    std::vector<std::int64_t> buf(5000);
    fill_input(DataType::Int64, ReduceOp::Sum, comm.rank(), n, buf.data(), buf.size());
    comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::Int64, ReduceOp::Sum);
    wrong += count_wrong(DataType::Int64, ReduceOp::Sum, n, buf.data(), buf.size());
  });
  out.wrong = wrong;
  return out;
}

}  // namespace ringfence::test
