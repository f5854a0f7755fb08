// Uses ringfence::mpi from the exported package: compiles against <ringfence/mpi.hpp> and links
// ringfence::mpi::make_communicator (not run: that needs an MPI launch).
#include <ringfence/mpi.hpp>

int main(int argc, char**) {
  ringfence::Communicator (*make)(MPI_Comm, ringfence::CommOptions) = &ringfence::mpi::make_communicator;
  return argc > 100 && make != nullptr ? 1 : 0;
}
