// Which compiled variant of the host reduction kernels (reduce.cpp) runs: chosen once, at the
// first call, from the CPU's features, and never changed (docs/tuning.md, "CPU features"). The
// build's baseline runs anywhere it was built for; x86-64-v3 needs AVX2, F16C and FMA.
#include <cstring>
#include <ringfence/reduce_ops.hpp>

namespace ringfence {
namespace detail {
namespace baseline {
Reducer host_reducer_of(DataType type, ReduceOp op) noexcept;
void copy_bytes(void* dst, const void* src, std::size_t n) noexcept;
}  // namespace baseline
#if RINGFENCE_REDUCE_X86_64_V3
namespace x86_64_v3 {
Reducer host_reducer_of(DataType type, ReduceOp op) noexcept;
void copy_bytes(void* dst, const void* src, std::size_t n) noexcept;
}  // namespace x86_64_v3
#endif
}  // namespace detail

namespace {

struct Kernels {
  Reducer (*reducer)(DataType, ReduceOp) noexcept;
  void (*copy)(void*, const void*, std::size_t) noexcept;
  const char* name;
};

constexpr Kernels kBaseline{&detail::baseline::host_reducer_of, &detail::baseline::copy_bytes, "baseline"};

Kernels pick() noexcept {
#if RINGFENCE_REDUCE_X86_64_V3
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v3"))
    return {&detail::x86_64_v3::host_reducer_of, &detail::x86_64_v3::copy_bytes, "x86-64-v3"};
#endif
  return kBaseline;
}

// Chosen once (thread-safe static initialisation), never changed.
const Kernels& chosen() noexcept {
  static const Kernels kernels = pick();
  return kernels;
}

Reducer finished(Reducer r, DataType type, ReduceOp op) noexcept {
  if (r.combine != nullptr) {
    r.type = type;
    r.op = op;
  }
  return r;
}

// Every (type, op)'s reducer from the chosen kernels, built once: a call looks its reducer up
// instead of going through the kernels' switch (about 40 instructions of a small allreduce).
struct ReducerTable {
  Reducer of[kNumDataTypes][kNumReduceOps];
  ReducerTable() noexcept {
    for (int t = 0; t < kNumDataTypes; ++t)
      for (int o = 0; o < kNumReduceOps; ++o)
        of[t][o] = finished(chosen().reducer(static_cast<DataType>(t), static_cast<ReduceOp>(o)), static_cast<DataType>(t),
                            static_cast<ReduceOp>(o));
  }
};

}  // namespace

Reducer host_reducer(DataType type, ReduceOp op) noexcept {
  if (!is_valid(type) || !is_valid(op)) return finished(chosen().reducer(type, op), type, op);  // null functions
  static const ReducerTable table;
  return table.of[static_cast<int>(type)][static_cast<int>(op)];
}

Reducer host_reducer_baseline(DataType type, ReduceOp op) noexcept { return finished(kBaseline.reducer(type, op), type, op); }

void detail::copy_bytes_large(void* dst, const void* src, std::size_t n) noexcept { chosen().copy(dst, src, n); }

const char* reduce_kernels() noexcept { return chosen().name; }

}  // namespace ringfence
