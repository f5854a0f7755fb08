#pragma once
// Exactness checks shared by the tests of the copy paths (streaming results, streaming slot
// writes): an allgather and an in-place broadcast from rank 0 of `count` floats, with patterns
// whose every element is known (verifiable.hpp).
#include <cstddef>
#include <ringfence/communicator.hpp>
#include <vector>

#include "verifiable.hpp"

namespace ringfence::test {

/// Runs the allgather and then the broadcast on `comm` (every rank calls it with the same
/// `count`); returns the number of wrong elements this rank received.
inline std::size_t wrong_after_allgather_broadcast(Communicator& comm, std::size_t count) {
  const int n = comm.size();
  std::size_t wrong = 0;
  std::vector<float> in(count), gathered(static_cast<std::size_t>(n) * count, -1.0f), out(count, -1.0f);
  fill_pattern(DataType::Float32, comm.rank(), in.data(), count, 3);
  comm.allgather(in.data(), gathered.data(), count, DataType::Float32);
  for (int r = 0; r < n; ++r)
    wrong += count_wrong_pattern(DataType::Float32, r, gathered.data() + static_cast<std::size_t>(r) * count, count, 3);
  if (comm.rank() == 0) fill_pattern(DataType::Float32, 0, out.data(), count, 4);
  comm.broadcast(out.data(), out.data(), count, DataType::Float32, 0);
  wrong += count_wrong_pattern(DataType::Float32, 0, out.data(), count, 4);
  return wrong;
}

}  // namespace ringfence::test
