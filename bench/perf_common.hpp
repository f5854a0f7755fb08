#pragma once
/// \file perf_common.hpp
/// Shared driver of the nccl-tests-compatible benchmarks (`all_reduce_perf`,
/// `mpi_all_reduce_perf`): argument parsing, the size/type/op loops, timing, the `#wrong`
/// check and the table. A benchmark program only builds a `Backend` (the collective under test
/// plus a few service calls) and hands it to `run_all_reduce_perf`, so ringfence and MPI rows
/// come from the same code and are directly comparable.
///
/// Not a library API: lives in bench/, compiled into the benchmark executables only.

#include <cstddef>
#include <chrono>
#include <functional>
#include <optional>
#include <string_view>
#include <ringfence/types.hpp>
#include <string>
#include <vector>

namespace ringfence::bench {

/// Where the two benchmark buffers come from (`-m`).
enum class MemoryMode {
  User,   ///< page-aligned heap memory owned by the benchmark (default)
  Alloc,  ///< `Backend::alloc` (ringfence: `Communicator::alloc`, the zero-copy path)
  Device, ///< device memory from `Backend::alloc`, filled and checked through host copies
          ///< (`Backend::upload` / `download`); the nccl backend's default
};

/// How per-rank times combine into the reported time (`-a`, nccl-tests numbering).
enum class TimeAggregate { Rank0 = 0, Avg = 1, Min = 2, Max = 3 };

/// The collectives the drivers measure (one program each, nccl-tests names).
enum class Collective { AllReduce, ReduceScatter, AllGather, Broadcast, Reduce, AllToAll, SendRecv };

/// nccl-tests program stem ("all_reduce", "reduce_scatter", ...).
const char* collective_name(Collective c);
/// True for the collectives that take a reduction op (the others print "none").
bool has_op(Collective c);
/// nccl-tests' bus-bandwidth factor: 2(n-1)/n allreduce; (n-1)/n reduce-scatter, allgather,
/// alltoall; 1 broadcast, reduce, sendrecv.
double busbw_factor(Collective c, int ranks);

/// Parsed command line. Sizes in bytes; defaults are nccl-tests' except `warmup` (5) and
/// `aggregate` (max over ranks: the slowest rank bounds a collective).
struct PerfArgs {
  std::size_t min_bytes = std::size_t{32} << 20;   ///< -b
  std::size_t max_bytes = std::size_t{32} << 20;   ///< -e
  std::size_t step_bytes = std::size_t{1} << 20;   ///< -i (used when step_factor <= 1)
  std::size_t step_factor = 1;                     ///< -f (multiplicative step when > 1)
  int iters = 20;                                  ///< -n timed iterations per measurement
  int agg_iters = 1;                               ///< -m collectives per timed iteration (nccl-tests' aggregation)
  int warmup = 1;                                  ///< -w untimed iterations before each measurement
  int run_cycles = 1;                              ///< -N sweeps over the sizes (0 = until killed)
  int check = 1;                                   ///< -c verified runs per measurement (0 = off)
  TimeAggregate aggregate = TimeAggregate::Avg;    ///< -a
  double timeout_s = 0;                            ///< -T per-call deadline in seconds (0 = the backend's own)
  std::string json_file;                           ///< -J write the results as JSON here too
  MemoryMode memory = MemoryMode::User;            ///< --memory
  std::vector<DataType> types{DataType::Float32};  ///< -d
  std::vector<ReduceOp> ops{ReduceOp::Sum};        ///< -o
  int root = 0;                                    ///< -r root of broadcast and reduce
  bool memory_set = false;                         ///< -m was given (else the backend's default)
  std::string backend = "ringfence";               ///< --backend ringfence|nccl (<collective>_perf only)
  std::string nccl_library = "libnccl.so.2";       ///< --nccl-lib: the NCCL the nccl backend dlopens
  /// --fresh-send 1: before each timed call (untimed) the rank stores its send buffer's bytes
  /// again, as a producer (a backward pass writing its gradients) leaves them: modified in its own
  /// core's cache. The time is then the sum of the calls alone.
  bool fresh_send = false;
};

/// Result of `parse_args`: the arguments, or the exit code to return at once (0 after `-h`,
/// 2 after a usage error).
struct ParseOutcome {
  std::optional<PerfArgs> args;
  int exit_code = 0;
};

/// Parses nccl-tests' options with their meanings and defaults (`-t -g -b -e -i -f -n -m -w -N -p
/// -c -o -d -r -z -y -T -G -C -a -R -J -h`, plus their long forms; bench/README.md says what
/// each does here) and ringfence's own long options `--memory`, `--backend`, `--nccl-lib`,
/// `--fresh-send`
/// (programs without backends refuse values other than the default). Options that cannot apply
/// on a host backend (`-t 2`, `-g 2`, `-G 1`, `-R 2`) are refused in one line naming them.
/// Sizes accept K/M/G/T (binary) suffixes. Prints help (stdout) or errors (stderr) only when
/// `verbose`, so that only one rank of a job talks. Not thread-safe (uses getopt).
ParseOutcome parse_args(int argc, char** argv, const char* program, bool verbose);

/// A byte count with an optional K/M/G/T suffix (powers of 1024, "KB" too); nullopt when malformed
/// or too large. What `-b`/`-e` accept.
std::optional<std::size_t> parse_size(std::string_view text);

/// The collective under test plus the service calls the driver needs. Every callback is
/// called collectively (all ranks, same order, same arguments except the buffers) from the
/// thread that runs `run_all_reduce_perf`; errors are reported by throwing.
struct Backend {
  std::string name;  ///< printed in the header, e.g. "ringfence 0.1.0"
  int rank = 0;      ///< this rank, 0 <= rank < size
  int size = 1;      ///< number of ranks
  /// `recv = reduce(send over ranks)`; `send == recv` means in place. `count` elements.
  /// Also carries the driver's own reductions (times: float64 min/max/sum; wrong counts:
  /// uint64 sum; header data: int64 sum, uint8 max), so it must support those at least.
  std::function<void(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op)> allreduce;
  /// The other collectives, ringfence's (NCCL's) argument conventions; unset = not offered.
  /// reduce_scatter: `recvcount` per rank; allgather: `sendcount`; alltoall: `count` per peer.
  std::function<void(const void* send, void* recv, std::size_t recvcount, DataType type, ReduceOp op)> reduce_scatter;
  std::function<void(const void* send, void* recv, std::size_t sendcount, DataType type)> all_gather;
  std::function<void(const void* send, void* recv, std::size_t count, DataType type, int root)> broadcast;
  std::function<void(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root)> reduce;
  std::function<void(const void* send, void* recv, std::size_t count, DataType type)> all_to_all;
  /// Sends `count` elements to rank `to` while receiving as many from rank `from`.
  std::function<void(const void* send, void* recv, std::size_t count, DataType type, int to, int from)> send_recv;
  /// Why the in-place form of `c` cannot run (empty or unset = it can); its columns print N/A.
  std::function<std::string(Collective c)> in_place_unsupported;
  /// Returns once every rank has entered it.
  std::function<void()> barrier;
  /// Why `type` cannot be benchmarked (empty or unset = supported).
  std::function<std::string(DataType type)> unsupported;
  /// Allocator for `--memory alloc`; unset = `--memory alloc` is refused.
  std::function<void*(std::size_t bytes)> alloc;
  /// Frees what `alloc` returned.
  std::function<void(void* ptr)> free;
  /// Extra header lines (without the leading '#'), printed by rank 0.
  std::vector<std::string> notes;
  /// `--memory device`: copy `bytes` from host memory to a buffer from `alloc` and back. Both unset =
  /// `--memory device` is refused.
  std::function<void(void* device, const void* host, std::size_t bytes)> upload;
  std::function<void(void* host, const void* device, std::size_t bytes)> download;
  /// Waits until every collective issued so far has completed (stream-ordered backends: before
  /// the clock stops and before results are read); unset = calls complete before returning.
  std::function<void()> synchronize;
  /// `-T`: from now on a call that waits longer than this for a peer fails. Unset = `-T` is
  /// refused for this backend.
  std::function<void(std::chrono::milliseconds)> set_timeout;
  /// Allreduce of host memory for the driver's own numbers (times, #wrong, the rank table);
  /// unset = `allreduce` (which must then accept host memory).
  std::function<void(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op)> host_allreduce;
};

/// Runs the benchmark of `c` over every (type, op, size) of `args` and prints the nccl-tests
/// table on rank 0's stdout. Sizes are the total bytes of the row (nccl-tests: the whole
/// vector, e.g. every rank's blocks for reduce-scatter). Returns the process exit code: 0, or
/// 1 when any element was wrong. Throws whatever the backend throws, and `std::bad_alloc`.
int run_perf(Collective c, const PerfArgs& args, Backend& backend);

/// Why the sizes of `args` cannot run `c` on `ranks` ranks: `-e` above 0 but too small to hold
/// an element of a requested type (per rank for the collectives that split the row), so no row
/// would move data. Empty when they can. Names the option (perf_checks.cpp).
std::string check_sizes(Collective c, const PerfArgs& args, int ranks);
/// A note when `-b` is that small: those rows run with the elements that fit (nccl-tests round
/// down too). Empty otherwise.
std::string size_note(Collective c, const PerfArgs& args, int ranks);
/// Why the buffers of `args` do not fit in `host_bytes` of memory shared by `ranks_on_host`
/// ranks; empty when they fit.
std::string check_memory(const PerfArgs& args, int ranks_on_host, std::size_t host_bytes);
/// Physical memory of this host in bytes.
std::size_t host_memory_bytes() noexcept;

/// `run_perf(Collective::AllReduce, ...)`.
int run_all_reduce_perf(const PerfArgs& args, Backend& backend);

/// Finishes an average for backends without a native one: divides each of `count` summed
/// elements of `type` by `ranks` with ringfence's rounding (integers truncate; 16-bit floats
/// divide in float and round once). Used by the MPI backend after MPI_SUM.
void divide_by_ranks(void* data, std::size_t count, DataType type, int ranks);

}  // namespace ringfence::bench
