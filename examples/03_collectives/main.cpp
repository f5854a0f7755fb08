// A tour of the collectives: every rank checks what it received and prints one line per call.
//
//   build/bin/ringfence-run -n 4 build/bin/collectives_tour
//
// A ZeRO-style step shows why reduce_scatter and allgather exist: each rank owns one shard of
// the parameters, reduce_scatter hands it the summed gradient of its shard, it updates only
// that shard, and allgather rebuilds the full parameters everywhere. The gradient exchange of
// the next layer overlaps with this one through the asynchronous calls.
#include <cstdio>
#include <numeric>
#include <ringfence/ringfence.hpp>
#include <string>
#include <vector>

namespace rf = ringfence;

namespace {

int failures = 0;

void report(const rf::Communicator& comm, const char* what, bool ok) {
  if (!ok) ++failures;
  std::printf("rank %d: %-44s %s\n", comm.rank(), what, ok ? "ok" : "WRONG");
}

}  // namespace

int main() {
  try {
    rf::Communicator comm = rf::Communicator::from_env();
    const int n = comm.size(), r = comm.rank();
    const std::size_t shard = 1000, total = shard * static_cast<std::size_t>(n);

    // ZeRO-style step on layer 1 while layer 2's gradients are reduced in the background.
    std::vector<float> params(total, 1.0f), grad(total), mine(shard), grad2(total);
    for (std::size_t i = 0; i < total; ++i) grad[i] = static_cast<float>(r + 1);  // exact sums
    for (std::size_t i = 0; i < total; ++i) grad2[i] = static_cast<float>(i % 7);
    rf::Work layer2 = comm.allreduce_async(grad2.data(), grad2.data(), total, rf::DataType::Float32, rf::ReduceOp::Sum);
    comm.reduce_scatter(grad.data(), mine.data(), shard, rf::DataType::Float32, rf::ReduceOp::Sum);
    const float sum_of_ranks = static_cast<float>(n * (n + 1) / 2);
    report(comm, "reduce_scatter: my shard of the summed grads", mine[0] == sum_of_ranks && mine[shard - 1] == sum_of_ranks);
    for (auto& g : mine) g = 1.0f - 0.5f * g / static_cast<float>(n);  // update my shard only
    comm.allgather(mine.data(), params.data(), shard, rf::DataType::Float32);
    bool same = true;
    for (float p : params) same = same && p == 1.0f - 0.5f * sum_of_ranks / static_cast<float>(n);
    report(comm, "allgather: every shard updated everywhere", same);
    layer2.wait();
    report(comm, "allreduce_async: layer 2 gradients summed", grad2[6] == 6.0f * static_cast<float>(n));

    // Broadcast from the last rank, reduce (max) into rank 0.
    std::vector<int> seed(4, r == n - 1 ? 42 : 0);
    comm.broadcast(seed.data(), seed.data(), seed.size(), rf::DataType::Int32, n - 1);
    report(comm, "broadcast: the last rank's seed", seed[3] == 42);
    int best = r * 10, best_out = -1;
    comm.reduce(&best, &best_out, 1, rf::DataType::Int32, rf::ReduceOp::Max, 0);
    report(comm, "reduce: max into rank 0", r != 0 || best_out == (n - 1) * 10);

    // alltoall: block j of rank r goes to rank j (a transpose).
    std::vector<int> out(static_cast<std::size_t>(n)), in(static_cast<std::size_t>(n));
    for (int j = 0; j < n; ++j) out[static_cast<std::size_t>(j)] = r * 100 + j;
    comm.alltoall(out.data(), in.data(), 1, rf::DataType::Int32);
    bool transposed = true;
    for (int j = 0; j < n; ++j) transposed = transposed && in[static_cast<std::size_t>(j)] == j * 100 + r;
    report(comm, "alltoall: a transpose", transposed);

    // A ring exchange in both directions, grouped so it cannot deadlock.
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    std::vector<double> to_right(1 << 18, r), to_left(1 << 18, -r), from_left(1 << 18), from_right(1 << 18);
    comm.group_start();
    comm.send(to_right.data(), to_right.size(), rf::DataType::Float64, right);
    comm.send(to_left.data(), to_left.size(), rf::DataType::Float64, left);
    comm.recv(from_left.data(), from_left.size(), rf::DataType::Float64, left);
    comm.recv(from_right.data(), from_right.size(), rf::DataType::Float64, right);
    comm.group_end();
    report(comm, "grouped send/recv: both neighbours (2 MiB each)",
           from_left.back() == left && from_right.back() == -right);

    comm.barrier();
    if (r == 0) std::printf("%s\n", failures ? "some results were WRONG" : "all collectives exact");
    return failures ? 1 : 0;
  } catch (const rf::Error& e) {
    std::fprintf(stderr, "collectives_tour: %s\n", e.what());
    return 1;
  }
}
