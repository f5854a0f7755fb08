// Google Benchmark micro-benchmarks of the host reduction kernels (the functors every
// collective uses), next to plain memcpy, in GB/s of memory traffic (two reads + one write per
// element for a reduction, one read + one write for memcpy):
//
//   build/bin/reduce_kernels_bench --benchmark_filter='float32|memcpy'
//
// Sizes: 256 KiB (one pipeline chunk, cache-resident, what the engine reduces at a time) and
// 64 MiB (DRAM bound).
#include <benchmark/benchmark.h>

#include <cstring>
#include <ringfence/reduce_ops.hpp>
#include <string>
#include <vector>

namespace {

namespace rf = ringfence;

void reduce_kernel(benchmark::State& state, rf::DataType type, rf::ReduceOp op) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t count = bytes / rf::size_of(type);
  // Zeros: every op stays finite and exact in every type (no denormal or NaN slow paths).
  std::vector<std::byte> a(bytes), b(bytes), out(bytes);
  const rf::Reducer k = rf::host_reducer(type, op);
  for (auto _ : state) {
    k.combine(out.data(), a.data(), b.data(), count, 2);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(3 * bytes));
}

void memcpy_baseline(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<std::byte> src(bytes, std::byte{1}), dst(bytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(2 * bytes));
}

const int kRegistered = [] {
  constexpr std::int64_t kChunk = 256 << 10, kLarge = 64 << 20;
  benchmark::RegisterBenchmark("memcpy", memcpy_baseline)->Arg(kChunk)->Arg(kLarge);
  for (int t = 0; t < rf::kNumDataTypes; ++t)
    for (int o = 0; o < rf::kNumReduceOps; ++o) {
      const auto type = static_cast<rf::DataType>(t);
      const auto op = static_cast<rf::ReduceOp>(o);
      const std::string name = std::string(rf::to_string(type)) + "/" + std::string(rf::to_string(op));
      benchmark::RegisterBenchmark(name.c_str(), [type, op](benchmark::State& s) { reduce_kernel(s, type, op); })
          ->Arg(kChunk)
          ->Arg(kLarge);
    }
  return 0;
}();

}  // namespace

BENCHMARK_MAIN();
