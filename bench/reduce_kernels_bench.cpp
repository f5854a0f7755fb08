// Google Benchmark micro-benchmarks of the host reduction kernels (the functors every
// collective uses), next to plain memcpy, in GB/s of memory traffic (two reads + one write per
// element for a reduction, one read + one write for memcpy):
//
//   build/bin/reduce_kernels_bench --benchmark_filter='float32|memcpy'
//
// and the CRC32C implementations (bytes read), each of them forced:
//
//   build/bin/reduce_kernels_bench --benchmark_filter='crc32c'
//
// The engine's checked passes (checksum mode: a copy or reduction with its CRCs) next to the
// plain ones: --benchmark_filter='checked'.
//
// Sizes: 256 KiB (one pipeline chunk, cache-resident, what the engine reduces at a time) and
// 64 MiB (DRAM bound).
#include <benchmark/benchmark.h>

#include <cstring>
#include <ringfence/crc32c.hpp>
#include <ringfence/reduce_ops.hpp>

#include "../src/checked_ops.hpp"
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

void crc(benchmark::State& state, rf::Crc32cImpl impl) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<std::byte> src(bytes, std::byte{7});
  for (auto _ : state) benchmark::DoNotOptimize(rf::crc32c_with(impl, src.data(), bytes));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

// A short CRC's latency: each CRC seeds the next, as a small call's CRC sits on its path
// (the sender's before its post, the receiver's before its sum). crc32c() picks its short path.
void crc_short_latency(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<std::byte> src(bytes, std::byte{7});
  std::uint32_t c = 0;
  for (auto _ : state) c = rf::crc32c(src.data(), bytes, c);
  benchmark::DoNotOptimize(c);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

// The engine's checked passes (checksum mode) next to the plain ones, over a buffer walked in
// pipeline chunks: "plain" is the reduction alone, "checked" the fused reduction with the
// CRCs of its input and result (what a receiver does with checksums on when its result is sent
// over a link that does not compute CRCs in its copy; over shm a float sum folds its input
// alone, in one loop: sum_f32_with_crc).
void checked_combine(benchmark::State& state, bool checked) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  constexpr std::size_t kChunk = 256 << 10;
  std::vector<std::byte> a(bytes), b(bytes), out(bytes);
  const rf::Reducer k = rf::host_reducer(rf::DataType::Float32, rf::ReduceOp::Sum);
  std::uint32_t ca = 0, cd = 0;
  for (auto _ : state) {
    for (std::size_t at = 0; at < bytes; at += kChunk) {
      if (checked)
        rf::detail::combine_with_crc(k, false, out.data() + at, a.data() + at, b.data() + at, kChunk / 4, 2, &ca, &cd);
      else
        k.combine(out.data() + at, a.data() + at, b.data() + at, kChunk / 4, 2);
    }
    benchmark::DoNotOptimize(ca + cd);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(3 * bytes));
}

void checked_copy(benchmark::State& state, bool checked) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  constexpr std::size_t kChunk = 256 << 10;
  std::vector<std::byte> src(bytes, std::byte{1}), dst(bytes);
  std::uint32_t c = 0;
  for (auto _ : state) {
    for (std::size_t at = 0; at < bytes; at += kChunk) {
      if (checked) c ^= rf::copy_bytes_crc(dst.data() + at, src.data() + at, kChunk);
      else rf::copy_bytes(dst.data() + at, src.data() + at, kChunk);
    }
    benchmark::DoNotOptimize(c);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(2 * bytes));
}

// One small call's checked pass, as a call of 8 B-128 B does it once per chunk (a copy with
// its CRC; a float sum with its input's CRC, and with its result's too): what the pass costs
// when its fixed work outweighs the bytes (docs/protection-cost-small-calls.md, "Small passes").
void checked_small(benchmark::State& state, int kind) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<std::byte> a(bytes, std::byte{1}), b(bytes, std::byte{2}), out(bytes);
  const rf::Reducer k = rf::host_reducer(rf::DataType::Float32, rf::ReduceOp::Sum);
  std::uint32_t ca = 0, cd = 0;
  for (auto _ : state) {
    if (kind == 0) ca ^= rf::copy_bytes_crc(out.data(), a.data(), bytes);
    else rf::detail::combine_with_crc(k, false, out.data(), a.data(), b.data(), bytes / 4, 2, &ca, kind == 2 ? &cd : nullptr);
    benchmark::DoNotOptimize(ca + cd);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

// One checked pass of a chunk the size of a mid-sized call's (4-64 KiB, in the cache): a copy
// with its CRC (a sender's write into a peer's slot) or a float sum with its input's CRC (a
// receiver's verifying reduction, sum_f32_with_crc), where the folding, not the memory, sets the
// pace (docs/protection-cost-amd.md, "The hybrid again, narrower").
void checked_pass(benchmark::State& state, bool sum) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<std::byte> a(bytes, std::byte{1}), b(bytes, std::byte{2}), out(bytes);
  const rf::Reducer k = rf::host_reducer(rf::DataType::Float32, rf::ReduceOp::Sum);
  std::uint32_t c = 0;
  for (auto _ : state) {
    if (sum) rf::detail::combine_with_crc(k, false, out.data(), a.data(), b.data(), bytes / 4, 2, &c, nullptr);
    else c ^= rf::copy_bytes_crc(out.data(), a.data(), bytes);
    benchmark::DoNotOptimize(c);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

const int kRegistered = [] {
  constexpr std::int64_t kChunk = 256 << 10, kLarge = 64 << 20;
  benchmark::RegisterBenchmark("memcpy", memcpy_baseline)->Arg(kChunk)->Arg(kLarge);
  benchmark::RegisterBenchmark("crc32c/table", [](benchmark::State& s) { crc(s, rf::Crc32cImpl::Table); })->Arg(kChunk);
  benchmark::RegisterBenchmark("crc32c/sse4.2-3way", [](benchmark::State& s) { crc(s, rf::Crc32cImpl::Sse42); })
      ->Arg(16 << 10)->Arg(kChunk)->Arg(kLarge);
  benchmark::RegisterBenchmark("crc32c/avx512-vpclmulqdq", [](benchmark::State& s) { crc(s, rf::Crc32cImpl::Fold); })
      ->Arg(4 << 10)->Arg(16 << 10)->Arg(kChunk)->Arg(kLarge);
  benchmark::RegisterBenchmark("crc32c/short-latency", crc_short_latency)->Arg(64)->Arg(96)->Arg(128)->Arg(192)->Arg(248);
  benchmark::RegisterBenchmark("checked/combine/plain", [](benchmark::State& s) { checked_combine(s, false); })->Arg(kChunk)->Arg(kLarge);
  benchmark::RegisterBenchmark("checked/combine/fused", [](benchmark::State& s) { checked_combine(s, true); })->Arg(kChunk)->Arg(kLarge);
  benchmark::RegisterBenchmark("checked/copy/plain", [](benchmark::State& s) { checked_copy(s, false); })->Arg(kChunk)->Arg(kLarge);
  benchmark::RegisterBenchmark("checked/copy/fused", [](benchmark::State& s) { checked_copy(s, true); })->Arg(kChunk)->Arg(kLarge);
  benchmark::RegisterBenchmark("checked/pass/copy", [](benchmark::State& s) { checked_pass(s, false); })->Arg(4 << 10)->Arg(16 << 10)->Arg(32 << 10)->Arg(64 << 10);
  benchmark::RegisterBenchmark("checked/pass/sum", [](benchmark::State& s) { checked_pass(s, true); })->Arg(4 << 10)->Arg(32 << 10)->Arg(64 << 10);
  benchmark::RegisterBenchmark("checked/small/copy", [](benchmark::State& s) { checked_small(s, 0); })->Arg(8)->Arg(64)->Arg(128);
  benchmark::RegisterBenchmark("checked/small/combine", [](benchmark::State& s) { checked_small(s, 1); })->Arg(8)->Arg(64)->Arg(128);
  benchmark::RegisterBenchmark("checked/small/combine2", [](benchmark::State& s) { checked_small(s, 2); })->Arg(8)->Arg(64)->Arg(128);
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
