// all_reduce_perf: nccl-tests-compatible allreduce benchmark for ringfence.
//
//   build/bin/ringfence-run -n 4 build/bin/all_reduce_perf -b 8 -e 64M -f 4 -d all -o all
//
// The table, flags and check are shared with mpi_all_reduce_perf (perf_common.hpp); this file
// only wires a ringfence Communicator into the driver.
#include <cstdio>
#include <exception>
#include <ringfence/ringfence.hpp>
#include <string>
#include <vector>

#include "perf_common.hpp"

namespace {

constexpr const char* kProgram = "all_reduce_perf";

// The launcher's rank, read before the communicator exists so that only rank 0 prints help
// and usage errors. Falls back to 0 (a plain, unlaunched run).
int launcher_rank() {
  const ringfence::Environment env = ringfence::Environment::from_process();
  for (const char* name : {"RINGFENCE_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"}) {
    if (const auto v = env.get(name)) {
      try {
        return std::stoi(*v);
      } catch (const std::exception&) {
        return 0;
      }
    }
  }
  return 0;
}

// "peer:transport" of each of rank 0's links, plus the options that shape the data path.
std::vector<std::string> describe(const ringfence::Communicator& comm) {
  const ringfence::CommOptions& o = comm.options();
  std::vector<std::string> notes;
  notes.push_back("ringfence options: chunk_bytes " + std::to_string(o.chunk_bytes) + " slots " +
                  std::to_string(o.slots) + " timeout_ms " + std::to_string(o.timeout.count()));
  if (comm.rank() == 0) {
    std::string links = "rank 0 links:";
    for (const ringfence::LinkInfo& l : comm.links()) links += " " + std::to_string(l.peer) + ":" + l.transport;
    notes.push_back(links);
  }
  return notes;
}

}  // namespace

int main(int argc, char** argv) {
  namespace rf = ringfence;
  namespace bench = ringfence::bench;
  int rank = launcher_rank();
  const bench::ParseOutcome parsed = bench::parse_args(argc, argv, kProgram, rank == 0);
  if (!parsed.args) return parsed.exit_code;
  try {
    rf::Communicator comm = rf::Communicator::from_env();
    rank = comm.rank();
    bench::Backend backend;
    backend.name = std::string("ringfence ") + rf::kVersionString;
    backend.rank = comm.rank();
    backend.size = comm.size();
    backend.allreduce = [&comm](const void* send, void* recv, std::size_t count, rf::DataType type, rf::ReduceOp op) {
      comm.allreduce(send, recv, count, type, op);
    };
    backend.barrier = [&comm] { comm.barrier(); };
    backend.alloc = [&comm](std::size_t bytes) { return comm.alloc(bytes); };
    backend.free = [&comm](void* ptr) { comm.free(ptr); };
    backend.notes = describe(comm);
    return bench::run_all_reduce_perf(*parsed.args, backend);
  } catch (const rf::Error& e) {
    std::fprintf(stderr, "%s: rank %d: ringfence error (%s): %s\n", kProgram, rank,
                 std::string(rf::to_string(e.code())).c_str(), e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: %s\n", kProgram, rank, e.what());
  }
  return 1;
}
