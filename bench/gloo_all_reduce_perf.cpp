// gloo_all_reduce_perf: the all_reduce_perf benchmark over Gloo's ring allreduce
// (gloo::allreduce with AllreduceOptions::Algorithm::RING, the function API PyTorch's
// ProcessGroupGloo uses) on Gloo's tcp transport, as a baseline for ringfence's tcp transport.
// Same flags, table, footer and exact #wrong check as all_reduce_perf (perf_common.hpp).
//
//   store=$(mktemp -d)   # fresh per run: a FileStore holding stale keys mis-pairs ranks
//   build/bin/ringfence-run -n 2 build/bin/gloo_all_reduce_perf --store "$store" -b 1M -e 256M -f 4
//   mpirun -np 2 build/bin/gloo_all_reduce_perf --store "$store" ...   # rank from OMPI_COMM_WORLD_*
//
// Rank and size come from RINGFENCE_RANK / RINGFENCE_WORLD_SIZE (ringfence-run) or
// OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (mpirun); the ranks rendezvous through a
// gloo::rendezvous::FileStore in the directory given by --store (or RINGFENCE_GLOO_STORE), which
// every rank must see and which must be empty at start. The tcp device binds to --hostname
// (default 127.0.0.1) or to the interface --iface (RINGFENCE_GLOO_HOSTNAME, RINGFENCE_GLOO_IFACE).
//
// Gloo has no avg: it runs as sum followed by the host division (timed), like the MPI twin.
// float16/bfloat16 are skipped. Reductions are Gloo's own element loops (gloo::sum<T> etc., the
// ones PyTorch passes), compiled here with the flags of ringfence's reduction kernels.
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <ringfence/types.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "perf_common.hpp"

namespace {

namespace rf = ringfence;
namespace bench = ringfence::bench;

constexpr const char* kProgram = "gloo_all_reduce_perf";

// This program's own flags; everything else goes to the shared nccl-tests parser.
struct GlooArgs {
  std::string store;                  // --store DIR
  std::string hostname = "127.0.0.1"; // --hostname ADDR
  std::string iface;                  // --iface NAME (overrides --hostname)
};

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

// First of `names` that is set, as an integer in [lo, hi]; nullopt when none is set.
std::optional<int> env_int(std::initializer_list<const char*> names, int lo, int hi) {
  for (const char* name : names) {
    if (auto v = env(name)) {
      char* end = nullptr;
      errno = 0;
      const long x = std::strtol(v->c_str(), &end, 10);
      if (errno != 0 || end == v->c_str() || *end != '\0' || x < lo || x > hi)
        throw std::invalid_argument(std::string(name) + "=" + *v + ": expected an integer in [" + std::to_string(lo) + ", " +
                                    std::to_string(hi) + "]");
      return static_cast<int>(x);
    }
  }
  return std::nullopt;
}

// Removes --store/--hostname/--iface (as "--flag VALUE" or "--flag=VALUE") from argv.
// Returns false (after printing when verbose) on a flag without its value.
bool take_gloo_flags(int& argc, char** argv, GlooArgs& g, bool verbose) {
  struct Flag {
    std::string_view name;
    std::string* value;
  };
  const Flag flags[] = {{"--store", &g.store}, {"--hostname", &g.hostname}, {"--iface", &g.iface}};
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    bool taken = false;
    for (const Flag& f : flags) {
      if (arg == f.name) {
        if (i + 1 >= argc) {
          if (verbose) std::fprintf(stderr, "%s: %s needs a value\n", kProgram, argv[i]);
          return false;
        }
        *f.value = argv[++i];
        taken = true;
      } else if (arg.size() > f.name.size() && arg.substr(0, f.name.size()) == f.name && arg[f.name.size()] == '=') {
        *f.value = std::string(arg.substr(f.name.size() + 1));
        taken = true;
      }
      if (taken) break;
    }
    if (!taken) argv[out++] = argv[i];
  }
  argc = out;
  argv[argc] = nullptr;
  return true;
}

void print_gloo_usage() {
  std::printf(
      "Gloo options (%s):\n"
      "  --store <dir>                          FileStore directory shared by all ranks, empty at\n"
      "                                         start (or RINGFENCE_GLOO_STORE; required)\n"
      "  --hostname <addr>                      address the tcp device binds (default 127.0.0.1;\n"
      "                                         or RINGFENCE_GLOO_HOSTNAME)\n"
      "  --iface <name>                         bind the device to this interface instead\n"
      "                                         (or RINGFENCE_GLOO_IFACE)\n"
      "Rank/size: RINGFENCE_RANK/RINGFENCE_WORLD_SIZE (ringfence-run) or\n"
      "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE (mpirun); none = a single rank.\n",
      kProgram);
}

using ReduceFn = void (*)(void*, const void*, const void*, std::size_t);

template <class T>
ReduceFn reduce_fn(rf::ReduceOp op) {
  switch (op) {
    case rf::ReduceOp::Sum:
    case rf::ReduceOp::Avg: return &gloo::sum<T>;
    case rf::ReduceOp::Prod: return &gloo::product<T>;
    case rf::ReduceOp::Min: return &gloo::min<T>;
    case rf::ReduceOp::Max: return &gloo::max<T>;
  }
  return nullptr;
}

// One gloo::allreduce of `count` elements of T; `send == recv` means in place (output only).
template <class T>
void gloo_allreduce(const std::shared_ptr<gloo::Context>& context, std::uint32_t tag, const void* send, void* recv,
                    std::size_t count, rf::ReduceOp op) {
  gloo::AllreduceOptions opts(context);
  opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  if (send != recv) opts.setInput(static_cast<T*>(const_cast<void*>(send)), count);  // only read
  opts.setOutput(static_cast<T*>(recv), count);
  opts.setReduceFunction(reduce_fn<T>(op));
  opts.setTag(tag);
  gloo::allreduce(opts);
}

// Calls fn.template operator()<T>() for the C++ type of `type`; false for the types this
// program does not wire up (float16, bfloat16).
template <class Fn>
bool dispatch(rf::DataType type, Fn&& fn) {
  switch (type) {
    case rf::DataType::Int8: fn.template operator()<std::int8_t>(); return true;
    case rf::DataType::Uint8: fn.template operator()<std::uint8_t>(); return true;
    case rf::DataType::Int32: fn.template operator()<std::int32_t>(); return true;
    case rf::DataType::Uint32: fn.template operator()<std::uint32_t>(); return true;
    case rf::DataType::Int64: fn.template operator()<std::int64_t>(); return true;
    case rf::DataType::Uint64: fn.template operator()<std::uint64_t>(); return true;
    case rf::DataType::Float32: fn.template operator()<float>(); return true;
    case rf::DataType::Float64: fn.template operator()<double>(); return true;
    case rf::DataType::Float16:
    case rf::DataType::BFloat16: break;
  }
  return false;
}

int run(int argc, char** argv) {
  const int rank = env_int({"RINGFENCE_RANK", "OMPI_COMM_WORLD_RANK"}, 0, 1 << 20).value_or(0);
  const int size = env_int({"RINGFENCE_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"}, 1, 1 << 20).value_or(1);
  if (rank >= size) throw std::invalid_argument("rank " + std::to_string(rank) + " >= world size " + std::to_string(size));
  const bool verbose = rank == 0;

  GlooArgs g;
  if (auto v = env("RINGFENCE_GLOO_STORE")) g.store = *v;
  if (auto v = env("RINGFENCE_GLOO_HOSTNAME")) g.hostname = *v;
  if (auto v = env("RINGFENCE_GLOO_IFACE")) g.iface = *v;
  if (!take_gloo_flags(argc, argv, g, verbose)) return 2;
  const bench::ParseOutcome parsed = bench::parse_args(argc, argv, kProgram, verbose);
  if (!parsed.args) {
    if (verbose && parsed.exit_code == 0) print_gloo_usage();  // after -h
    return parsed.exit_code;
  }
  if (parsed.args->backend != "ringfence") {
    if (verbose) std::fprintf(stderr, "%s: --backend %s: this program measures Gloo only\n", kProgram, parsed.args->backend.c_str());
    return 2;
  }
  if (g.store.empty()) {
    if (verbose) std::fprintf(stderr, "%s: no rendezvous directory: pass --store DIR (or set RINGFENCE_GLOO_STORE)\n", kProgram);
    return 2;
  }
  if (::mkdir(g.store.c_str(), 0700) != 0 && errno != EEXIST)
    throw std::runtime_error("cannot create " + g.store + ": " + std::strerror(errno));

  gloo::transport::tcp::attr attr;
  if (!g.iface.empty()) attr.iface = g.iface;
  else attr.hostname = g.hostname;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto store = std::make_shared<gloo::rendezvous::FileStore>(g.store);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->connectFullMesh(*store, device);

  // Every collective call gets its own tag (PyTorch does the same); all ranks call in the same
  // order, so the counters agree.
  auto tag = std::make_shared<std::uint32_t>(0);

  bench::Backend backend;
  backend.name = "Gloo " + std::to_string(GLOO_VERSION_MAJOR) + "." + std::to_string(GLOO_VERSION_MINOR) + "." +
                 std::to_string(GLOO_VERSION_PATCH) + " (tcp, ring)";
  backend.rank = rank;
  backend.size = size;
  backend.allreduce = [context, tag, size](const void* send, void* recv, std::size_t count, rf::DataType type, rf::ReduceOp op) {
    const std::uint32_t t = (*tag)++;
    if (!dispatch(type, [&]<class T>() { gloo_allreduce<T>(context, t, send, recv, count, op); }))
      throw std::runtime_error("gloo::allreduce: unsupported data type");
    if (op == rf::ReduceOp::Avg) bench::divide_by_ranks(recv, count, type, size);
  };
  backend.barrier = [context, tag] {
    gloo::BarrierOptions opts(context);
    opts.setTag((*tag)++);
    gloo::barrier(opts);
  };
  backend.unsupported = [](rf::DataType type) {
    return dispatch(type, []<class T>() {}) ? std::string() : std::string("not wired to Gloo's reductions (float16/bfloat16)");
  };
  backend.notes.push_back("gloo: gloo::allreduce algorithm RING, tcp device " + device->str() + ", FileStore " + g.store);
  return bench::run_perf(bench::Collective::AllReduce, *parsed.args, backend);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    const std::string rank = env("RINGFENCE_RANK").value_or(env("OMPI_COMM_WORLD_RANK").value_or("?"));
    std::fprintf(stderr, "%s: rank %s: %s\n", kProgram, rank.c_str(), e.what());
    return 1;
  }
}
