// mpi_all_reduce_perf: the same benchmark as all_reduce_perf, with MPI_Allreduce as the
// collective, so ringfence and the installed MPI print comparable rows:
//
//   mpirun -np 4 --oversubscribe --bind-to none --mca pml ob1 --mca btl self,vader
//          build/bin/mpi_all_reduce_perf -b 64K -e 256M -f 4 -d float -o sum
//
// MPI has no avg: it runs as MPI_SUM followed by ringfence's division on the host (timed, as
// it is part of the operation). MPI has no float16/bfloat16: those types are skipped.
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#include "perf_common.hpp"

namespace {

namespace rf = ringfence;
namespace bench = ringfence::bench;

constexpr const char* kProgram = "mpi_all_reduce_perf";

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
  return bench::run_all_reduce_perf(*parsed.args, backend);
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
