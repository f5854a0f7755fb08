// The MPI bootstrap adapter under mpirun: communicators built with
// `ringfence::mpi::make_communicator` (no TCP store, no launcher variables read for rank, size
// or store address) on MPI_COMM_WORLD and on split sub-communicators, a UniqueId shared with
// MPI_Bcast, exact allreduce (every dtype x op) and allgather results, and the MpiStore's rules:
// rounds per setup, add as a barrier, a missing key, mixed calls and a timed-out round that a
// later call resumes -- each a clear error, never a hang.
//
//   mpirun -np 4 --oversubscribe build/bin/mpi_bootstrap_test
//
// Rank 0 prints "mpi bootstrap: N checks passed, 0 failed"; exit status 0 only when every rank
// passed every check.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ringfence/mpi.hpp>
#include <ringfence/ringfence.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/verifiable.hpp"

using namespace ringfence;
using namespace std::chrono_literals;

namespace {

int world_rank = 0;
int passed = 0, failed = 0;

void check(bool ok, const std::string& what) {
  ok ? ++passed : ++failed;
  if (!ok) std::printf("rank %d: FAIL %s\n", world_rank, what.c_str());
}

// Every dtype x op, in place and out of place, a few counts (one above the chunk size).
void check_allreduce(Communicator& comm, const char* name) {
  const int n = comm.size();
  std::uint64_t wrong = 0;
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{4099}, std::size_t{(1u << 17) + 3}})
    for (int t = 0; t < kNumDataTypes; ++t)
      for (int o = 0; o < kNumReduceOps; ++o) {
        const auto type = static_cast<DataType>(t);
        const auto op = static_cast<ReduceOp>(o);
        std::vector<std::byte> in(count * size_of(type)), out(in.size());
        test::fill_input(type, op, comm.rank(), n, in.data(), count);
        comm.allreduce(in.data(), out.data(), count, type, op);
        wrong += test::count_wrong(type, op, n, out.data(), count);
        comm.allreduce(in.data(), in.data(), count, type, op);
        wrong += test::count_wrong(type, op, n, in.data(), count);
      }
  check(wrong == 0, std::string(name) + ": allreduce exact for every dtype and op (" + std::to_string(wrong) + " wrong)");
}

void check_allgather(Communicator& comm, const char* name) {
  const int n = comm.size(), r = comm.rank();
  const std::size_t block = 1000;
  std::vector<std::int32_t> mine(block), all(block * static_cast<std::size_t>(n), -1);
  for (std::size_t i = 0; i < block; ++i) mine[i] = static_cast<std::int32_t>(r * 100000 + static_cast<int>(i));
  comm.allgather(mine.data(), all.data(), block, DataType::Int32);
  bool ok = true;
  for (int j = 0; j < n; ++j)
    for (std::size_t i = 0; i < block; ++i)
      ok = ok && all[static_cast<std::size_t>(j) * block + i] == static_cast<std::int32_t>(j * 100000 + static_cast<int>(i));
  check(ok, std::string(name) + ": allgather exact");
}

template <class F>
std::string error_of(F&& f, ErrorCode* code = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  } catch (const std::exception& e) {
    return std::string("non-ringfence exception: ") + e.what();
  }
  return {};
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  try {
    // 1. MPI_COMM_WORLD through make_communicator.
    {
      Communicator comm = mpi::make_communicator(MPI_COMM_WORLD);
      check(comm.rank() == world_rank && comm.size() == world_size, "world: rank and size from MPI_COMM_WORLD");
      check_allreduce(comm, "world");
      check_allgather(comm, "world");
      comm.barrier();
      if (world_rank == 0) std::printf("%s", comm.link_table().c_str());
    }

    // 2. Split sub-communicators (even and odd world ranks) built at the same time: rank and
    //    size come from the MPI communicator, not from OMPI_COMM_WORLD_*.
    {
      MPI_Comm half = MPI_COMM_NULL;
      MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_rank, &half);
      {
        Communicator comm = mpi::make_communicator(half);
        const int expect_size = world_size / 2 + (world_size % 2 && world_rank % 2 == 0 ? 1 : 0);
        check(comm.rank() == world_rank / 2 && comm.size() == expect_size, "split: rank and size from the sub-communicator");
        check_allreduce(comm, "split");
        check_allgather(comm, "split");
      }
      MPI_Comm_free(&half);
    }

    // 3. Rounds of one setup: peer, addr, regions and the setup barrier (one lane, no
    //    heartbeat) ...
    {
      CommOptions options = CommOptions::from_env();
      options.channels = 1;
      options.heartbeat_interval = std::chrono::milliseconds(0);
      auto store = std::make_shared<MpiStore>(MPI_COMM_WORLD, options.timeout);
      Communicator comm(store, world_rank, world_size, builtin_transports(), options);
      check(store->rounds() == (world_size > 1 ? 4u : 0u), "setup takes 4 exchange rounds (got " + std::to_string(store->rounds()) + ")");
      check_allgather(comm, "store-built");
    }
    {  // ... and 2 more per extra lane (addr and regions of lane 1) and for the heartbeat's links.
      CommOptions options = CommOptions::from_env();
      options.channels = 2;
      auto store = std::make_shared<MpiStore>(MPI_COMM_WORLD, options.timeout);
      Communicator comm(store, world_rank, world_size, builtin_transports(), options);
      check(store->rounds() == (world_size > 1 ? 8u : 0u), "setup with 2 lanes and the heartbeat takes 8 rounds (got " + std::to_string(store->rounds()) + ")");
      check_allgather(comm, "store-built, 2 lanes");
    }

    // 4. UniqueId shared through MPI_Bcast (the NCCL pattern), TCP store hosted by rank 0.
    {
      UniqueId id;
      if (world_rank == 0) id = get_unique_id();
      MPI_Bcast(id.bytes.data(), static_cast<int>(id.bytes.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
      Communicator comm(id, world_rank, world_size);
      check_allgather(comm, "unique-id");
    }

    // 5. The store's rules.
    {
      MpiStore store(MPI_COMM_WORLD, 10s);
      const int n = world_size, r = world_rank;
      // set/get: one round delivers every rank's keys.
      store.set("k/" + std::to_string(r), to_bytes("v" + std::to_string(r)));
      bool ok = to_string(store.get("k/" + std::to_string(r), 0ms)) == "v" + std::to_string(r);  // own key: local
      for (int p = 0; p < n; ++p) ok = ok && to_string(store.get("k/" + std::to_string(p), 10s)) == "v" + std::to_string(p);
      check(ok && store.rounds() == (n > 1 ? 1u : 0u), "set/get: every key after one round");
      // add: every rank's delta, the same total everywhere (a barrier).
      const std::int64_t total = store.add("counter", r + 1);
      check(total == static_cast<std::int64_t>(n) * (n + 1) / 2, "add: sum of every rank's delta on every rank");
      check(store.add("counter", 1) == total + n, "add: a second round adds again");
      // A key nobody set: a clear error naming it on every rank, at once (not after the timeout).
      ErrorCode code = ErrorCode::Ok;
      auto t0 = std::chrono::steady_clock::now();
      std::string e = error_of([&] { (void)store.get("never-set", 10s); }, &code);
      check(code == ErrorCode::InvalidUsage && contains(e, "'never-set'") && contains(e, "still missing") &&
                std::chrono::steady_clock::now() - t0 < 5s,
            "missing key: InvalidUsage naming it: " + e);
      // Mixed calls in one round (rank 0 adds, the others get): every rank says so.
      code = ErrorCode::Ok;
      e = error_of([&] {
        if (r == 0)
          (void)store.add("x", 1);
        else
          (void)store.get("y", 10s);
      }, &code);
      check(n == 1 || (code == ErrorCode::InvalidUsage && contains(e, "mixes different store calls")),
            "mixed calls: InvalidUsage on every rank: " + e);
      // A round rank 0 enters alone times out (naming the key); when the others arrive later,
      // rank 0's next call resumes the posted round and gets their keys.
      if (n > 1) {
        if (r == 0) {
          store.set("from0", to_bytes("zero"));
          code = ErrorCode::Ok;
          t0 = std::chrono::steady_clock::now();
          e = error_of([&] { (void)store.get("late", 300ms); }, &code);
          const auto waited = std::chrono::steady_clock::now() - t0;
          check(code == ErrorCode::Timeout && contains(e, "get('late')") && waited >= 300ms && waited < 1500ms,
                "timeout: TimeoutError naming the key after 300 ms: " + e);
          check(to_string(store.get("late", 10s)) == "others", "timeout: the next call resumes the round");
        } else {
          std::this_thread::sleep_for(2000ms);
          store.set("late", to_bytes("others"));
          check(to_string(store.get("from0", 10s)) == "zero", "timeout: late ranks complete rank 0's round");
        }
        check(store.add("end", 1) == n, "timeout: rounds aligned again afterwards");
      }
      if (r == 0) std::printf("store: %llu rounds\n", static_cast<unsigned long long>(store.rounds()));
    }
  } catch (const std::exception& e) {
    std::printf("rank %d: error: %s\n", world_rank, e.what());
    ++failed;
  }
  int totals[2] = {passed, failed}, sums[2] = {0, 0};
  MPI_Allreduce(totals, sums, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (world_rank == 0) std::printf("mpi bootstrap: %d checks passed, %d failed\n", sums[0], sums[1]);
  std::fflush(stdout);
  MPI_Finalize();
  return sums[1] == 0 ? 0 : 1;
}
