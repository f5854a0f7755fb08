#pragma once
/// \file nccl_backend.hpp
/// `--backend nccl` of the `<collective>_perf` programs: the same driver, table and checks as
/// `--backend ringfence`, with the collectives of an NCCL library loaded by dlopen
/// (`--nccl-lib`, default libnccl.so.2), so one command line compares both. Built when nccl.h is
/// found; links no CUDA or NCCL library.
///
/// Buffers (`-m`): `device` (the default) is cudaMalloc'ed memory on device
/// `local rank % device count`, through a libcudart loaded by dlopen; with no CUDA device the run
/// says so and exits 77. `user` passes host buffers and a NULL stream to NCCL, which only the
/// ringfence shim (libringfence_nccl.so) accepts. The launcher's ranks bootstrap through a
/// ringfence communicator (from_env), which carries rank 0's ncclUniqueId and the driver's own
/// host-side reductions; the timed collectives are NCCL's alone, on the default stream,
/// synchronised before the clock stops.

#include <string>

#include "perf_common.hpp"

namespace ringfence::bench {

/// Runs the benchmark of `c` over NCCL as described above. `program` names the binary in
/// messages, `launcher_rank` decides who prints before the communicator exists. Returns the
/// exit code: `run_perf`'s (0, 1 or 2), 2 for `--memory alloc`, 77 when it cannot run here (no CUDA
/// device for device buffers, or the library cannot be loaded). Throws what the bootstrap
/// communicator throws.
int run_nccl_perf(Collective c, const PerfArgs& args, const std::string& program, int launcher_rank);

}  // namespace ringfence::bench
