// The host reduction kernels again, compiled with -march=x86-64-v3 (AVX2, F16C, FMA) into
// namespace detail::x86_64_v3; reduce_dispatch.cpp uses them where the CPU has those features.
#define RINGFENCE_REDUCE_VARIANT x86_64_v3
#include "reduce.cpp"
