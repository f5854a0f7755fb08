// Multi-process allreduce over shm: every dtype x op, in place and out of place, counts that
// are 0, 1, prime, not divisible by the rank count, and large; user and alloc() buffers.
// Run under ringfence-run; prints "N passed, M failed" on rank 0 and exits non-zero on failure.
#include <cstdio>
#include <ringfence/ringfence.hpp>
#include <vector>

#include "support/verifiable.hpp"

using namespace ringfence;

int main() {
  try {
    Communicator comm = Communicator::from_env();
    const int n = comm.size();
    std::size_t passed = 0, failed = 0;
    auto* shared = static_cast<std::byte*>(comm.alloc((1u << 20) * 8));
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{13}, std::size_t{4099},
                              std::size_t{(1u << 20) + 3}}) {
      for (int t = 0; t < kNumDataTypes; ++t)
        for (int o = 0; o < kNumReduceOps; ++o) {
          const auto type = static_cast<DataType>(t);
          const auto op = static_cast<ReduceOp>(o);
          if (count > 4099 && !(type == DataType::Float32 || type == DataType::BFloat16 || type == DataType::Int64)) continue;
          const std::size_t bytes = count * size_of(type);
          std::vector<std::byte> in(bytes), out(bytes);
          test::fill_input(type, op, comm.rank(), n, in.data(), count);
          comm.allreduce(in.data(), out.data(), count, type, op);
          std::uint64_t wrong[3] = {test::count_wrong(type, op, n, out.data(), count), 0, 0};
          test::fill_input(type, op, comm.rank(), n, out.data(), count);
          comm.allreduce(out.data(), out.data(), count, type, op);
          wrong[1] = test::count_wrong(type, op, n, out.data(), count);
          if (bytes <= (1u << 20) * 8) {  // registered (alloc) memory, in place
            test::fill_input(type, op, comm.rank(), n, shared, count);
            comm.allreduce(shared, shared, count, type, op);
            wrong[2] = test::count_wrong(type, op, n, shared, count);
          }
          // Sum the wrong counts over ranks so every rank agrees on the verdict.
          comm.allreduce(wrong, wrong, 3, DataType::Uint64, ReduceOp::Sum);
          const bool ok = wrong[0] == 0 && wrong[1] == 0 && wrong[2] == 0;
          ok ? ++passed : ++failed;
          if (!ok && comm.rank() == 0)
            std::printf("FAIL ranks=%d count=%zu type=%s op=%s wrong out-of-place=%llu in-place=%llu alloc=%llu\n", n, count,
                        std::string(to_string(type)).c_str(), std::string(to_string(op)).c_str(),
                        static_cast<unsigned long long>(wrong[0]), static_cast<unsigned long long>(wrong[1]),
                        static_cast<unsigned long long>(wrong[2]));
        }
    }
    comm.free(shared);
    comm.barrier();
    if (comm.rank() == 0) {
      std::printf("%s", comm.link_table().c_str());
      std::printf("%zu passed, %zu failed\n", passed, failed);
    }
    return failed == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
