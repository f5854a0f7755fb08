// mpi_<collective>_perf: the same benchmarks as the ringfence <collective>_perf programs, with
// the MPI collective (MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather, MPI_Bcast,
// MPI_Reduce, MPI_Alltoall, MPI_Sendrecv), so ringfence and the installed MPI print comparable
// rows. One source compiled per collective (RINGFENCE_PERF_COLLECTIVE):
//
//   mpirun -np 4 --oversubscribe --bind-to none --mca pml ob1 --mca btl self,vader
//          build/bin/mpi_all_reduce_perf -b 64K -e 256M -f 4 -d float -o sum
//
// MPI has no avg: it runs as MPI_SUM followed by ringfence's division on the host (timed, as
// it is part of the operation). MPI has no float16/bfloat16: those types are skipped. In-place
// reduce-scatter differs in MPI (MPI_IN_PLACE reads the whole vector from the receive buffer),
// so its in-place columns print N/A; out-of-place broadcast copies the root's buffer first.
#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <ringfence/types.hpp>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#include "perf_common.hpp"

namespace {

namespace rf = ringfence;
namespace bench = ringfence::bench;

#ifndef RINGFENCE_PERF_COLLECTIVE
#define RINGFENCE_PERF_COLLECTIVE AllReduce
#endif
constexpr bench::Collective kCollective = bench::Collective::RINGFENCE_PERF_COLLECTIVE;
const std::string kProgramName = std::string("mpi_") + bench::collective_name(kCollective) + "_perf";
const char* const kProgram = kProgramName.c_str();

MPI_Datatype mpi_type(rf::DataType type) {
  switch (type) {
    case rf::DataType::Int8: return MPI_INT8_T;
    case rf::DataType::Uint8: return MPI_UINT8_T;
    case rf::DataType::Int32: return MPI_INT32_T;
    case rf::DataType::Uint32: return MPI_UINT32_T;
    case rf::DataType::Int64: return MPI_INT64_T;
    case rf::DataType::Uint64: return MPI_UINT64_T;
    case rf::DataType::Float32: return MPI_FLOAT;
    case rf::DataType::Float64: return MPI_DOUBLE;
    case rf::DataType::Float16:
    case rf::DataType::BFloat16: break;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(rf::ReduceOp op) {
  switch (op) {
    case rf::ReduceOp::Sum:
    case rf::ReduceOp::Avg: return MPI_SUM;
    case rf::ReduceOp::Prod: return MPI_PROD;
    case rf::ReduceOp::Min: return MPI_MIN;
    case rf::ReduceOp::Max: return MPI_MAX;
  }
  return MPI_OP_NULL;
}

// Throws on a failed MPI call (the communicator's handler is MPI_ERRORS_RETURN).
void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw std::runtime_error(std::string(what) + " failed: " + std::string(text, static_cast<std::size_t>(len)));
}

// "Open MPI v4.1.4" (the library version string up to its first comma).
std::string library_name() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string s(text, static_cast<std::size_t>(len));
  if (const auto comma = s.find_first_of(",\n"); comma != std::string::npos) s.resize(comma);
  return s;
}

int run(int argc, char** argv, int rank, int size) {
  const bench::ParseOutcome parsed = bench::parse_args(argc, argv, kProgram, rank == 0);
  if (!parsed.args) return parsed.exit_code;
  if (parsed.args->backend != "ringfence") {
    if (rank == 0) std::fprintf(stderr, "%s: --backend %s: this program measures MPI only\n", kProgram, parsed.args->backend.c_str());
    return 2;
  }
  bench::Backend backend;
  backend.name = library_name();
  backend.rank = rank;
  backend.size = size;
  backend.allreduce = [size](const void* send, void* recv, std::size_t count, rf::DataType type, rf::ReduceOp op) {
    if (count > static_cast<std::size_t>(INT32_MAX)) throw std::runtime_error("MPI_Allreduce: count exceeds INT_MAX");
    const MPI_Datatype dt = mpi_type(type);
    if (dt == MPI_DATATYPE_NULL) throw std::runtime_error("MPI_Allreduce: unsupported data type");
    check(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count), dt, mpi_op(op),
                        MPI_COMM_WORLD),
          "MPI_Allreduce");
    if (op == rf::ReduceOp::Avg) bench::divide_by_ranks(recv, count, type, size);
  };
  auto int_count = [](std::size_t count, const char* what) {
    if (count > static_cast<std::size_t>(INT32_MAX)) throw std::runtime_error(std::string(what) + ": count exceeds INT_MAX");
    return static_cast<int>(count);
  };
  auto dtype = [](rf::DataType type, const char* what) {
    const MPI_Datatype dt = mpi_type(type);
    if (dt == MPI_DATATYPE_NULL) throw std::runtime_error(std::string(what) + ": unsupported data type");
    return dt;
  };
  backend.reduce_scatter = [=](const void* send, void* recv, std::size_t count, rf::DataType type, rf::ReduceOp op) {
    check(MPI_Reduce_scatter_block(send, recv, int_count(count, "MPI_Reduce_scatter_block"), dtype(type, "MPI_Reduce_scatter_block"),
                                   mpi_op(op), MPI_COMM_WORLD),
          "MPI_Reduce_scatter_block");
    if (op == rf::ReduceOp::Avg) bench::divide_by_ranks(recv, count, type, size);
  };
  backend.all_gather = [=](const void* send, void* recv, std::size_t count, rf::DataType type) {
    const int n = int_count(count, "MPI_Allgather");
    const MPI_Datatype dt = dtype(type, "MPI_Allgather");
    const bool in_place = send == static_cast<const char*>(recv) + static_cast<std::size_t>(rank) * count * rf::size_of(type);
    check(MPI_Allgather(in_place ? MPI_IN_PLACE : send, n, dt, recv, n, dt, MPI_COMM_WORLD), "MPI_Allgather");
  };
  backend.broadcast = [=](const void* send, void* recv, std::size_t count, rf::DataType type, int root) {
    if (rank == root && send != recv) std::memcpy(recv, send, count * rf::size_of(type));
    check(MPI_Bcast(recv, int_count(count, "MPI_Bcast"), dtype(type, "MPI_Bcast"), root, MPI_COMM_WORLD), "MPI_Bcast");
  };
  backend.reduce = [=](const void* send, void* recv, std::size_t count, rf::DataType type, rf::ReduceOp op, int root) {
    const void* src = rank == root && send == recv ? MPI_IN_PLACE : send;
    check(MPI_Reduce(src, recv, int_count(count, "MPI_Reduce"), dtype(type, "MPI_Reduce"), mpi_op(op), root, MPI_COMM_WORLD),
          "MPI_Reduce");
    if (op == rf::ReduceOp::Avg && rank == root) bench::divide_by_ranks(recv, count, type, size);
  };
  backend.all_to_all = [=](const void* send, void* recv, std::size_t count, rf::DataType type) {
    const int n = int_count(count, "MPI_Alltoall");
    const MPI_Datatype dt = dtype(type, "MPI_Alltoall");
    check(MPI_Alltoall(send, n, dt, recv, n, dt, MPI_COMM_WORLD), "MPI_Alltoall");
  };
  backend.send_recv = [=](const void* send, void* recv, std::size_t count, rf::DataType type, int to, int from) {
    const int n = int_count(count, "MPI_Sendrecv");
    const MPI_Datatype dt = dtype(type, "MPI_Sendrecv");
    check(MPI_Sendrecv(send, n, dt, to, 0, recv, n, dt, from, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Sendrecv");
  };
  backend.in_place_unsupported = [](bench::Collective c) {
    switch (c) {
      case bench::Collective::ReduceScatter: return std::string("MPI's in-place reduce-scatter has another buffer layout");
      case bench::Collective::AllToAll:
      case bench::Collective::SendRecv: return std::string("the send and receive buffers must not overlap");
      default: return std::string();
    }
  };
  backend.barrier = [] { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); };
  backend.unsupported = [](rf::DataType type) {
    return mpi_type(type) == MPI_DATATYPE_NULL ? std::string("MPI has no float16/bfloat16 datatype") : std::string();
  };
  backend.alloc = [](std::size_t bytes) {
    void* p = nullptr;
    check(MPI_Alloc_mem(static_cast<MPI_Aint>(bytes), MPI_INFO_NULL, &p), "MPI_Alloc_mem");
    return p;
  };
  backend.free = [](void* p) { check(MPI_Free_mem(p), "MPI_Free_mem"); };
  return bench::run_perf(kCollective, *parsed.args, backend);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int rc = 1;
  try {
    rc = run(argc, argv, rank, size);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: %s\n", kProgram, rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
