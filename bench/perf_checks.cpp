// Checks of a benchmark's sizes against its data types and the host's memory, made before any
// buffer is allocated: a size that holds no element, or buffers that cannot fit, are reported
// naming the option instead of running a row of nothing or dying in std::bad_alloc.
#include <unistd.h>

#include <cstdio>
#include <ringfence/types.hpp>
#include <string>
#include <utility>

#include "perf_common.hpp"

namespace ringfence::bench {
namespace {

std::string gib(double bytes) {
  char out[32];
  std::snprintf(out, sizeof out, "%.1f GiB", bytes / double(1ull << 30));
  return out;
}

}  // namespace

namespace {

// Bytes of the smallest row that holds an element of every requested type (one per rank for
// the collectives that split the row into blocks), and that type.
std::pair<std::size_t, DataType> least_row(Collective c, const PerfArgs& a, int ranks) {
  const bool blocks = c == Collective::ReduceScatter || c == Collective::AllGather || c == Collective::AllToAll;
  std::pair<std::size_t, DataType> least{0, DataType::Int8};
  for (DataType type : a.types) {
    const std::size_t bytes = size_of(type) * (blocks ? static_cast<std::size_t>(ranks) : 1);
    if (bytes > least.first) least = {bytes, type};
  }
  return least;
}

std::string what_it_holds(Collective c, DataType type) {
  const bool blocks = c == Collective::ReduceScatter || c == Collective::AllGather || c == Collective::AllToAll;
  return "one " + std::string(to_string(type)) + " element" + (blocks ? " per rank" : "");
}

}  // namespace

std::string check_sizes(Collective c, const PerfArgs& a, int ranks) {
  const auto [least, type] = least_row(c, a, ranks);
  if (a.max_bytes == 0 || a.max_bytes >= least) return {};
  return "-e " + std::to_string(a.max_bytes) + ": smaller than " + what_it_holds(c, type) + " (" + std::to_string(least) +
         " bytes), so no row would move any data; use -e " + std::to_string(least) + " or more";
}

std::string size_note(Collective c, const PerfArgs& a, int ranks) {
  const auto [least, type] = least_row(c, a, ranks);
  if (a.min_bytes == 0 || a.min_bytes >= least) return {};
  return "-b " + std::to_string(a.min_bytes) + ": rows below " + std::to_string(least) + " bytes hold less than " +
         what_it_holds(c, type) + " and run with what fits (rounded down, as nccl-tests do)";
}

std::string check_memory(const PerfArgs& a, int ranks_on_host, std::size_t host_bytes) {
  // A send and a receive buffer of -e bytes per rank in host memory (with --memory device, the host
  // copies the driver fills and checks); the reference data is small next to them.
  const double need = 2.0 * double(a.max_bytes) * ranks_on_host;
  if (need <= double(host_bytes)) return {};
  return "-e " + std::to_string(a.max_bytes) + ": " + (a.memory == MemoryMode::Device ? "host copies of " : "") +
         "a send and a receive buffer of " + gib(double(a.max_bytes)) + " for each of the " + std::to_string(ranks_on_host) +
         " ranks on this host need " + gib(need) + "; this host has " + gib(double(host_bytes)) + " of memory";
}

std::size_t host_memory_bytes() noexcept {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) : ~std::size_t{0};
}

}  // namespace ringfence::bench
