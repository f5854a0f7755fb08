// Uses the installed/exported package: one process, two thread ranks, an exact allreduce.
#include <ringfence/ringfence.hpp>
#include <thread>

int main() {
  auto store = std::make_shared<ringfence::InProcessStore>();
  int bad = 0;
  auto rank_main = [&](int rank) {
    ringfence::Communicator comm(store, rank, 2, ringfence::builtin_transports(), ringfence::CommOptions{.host_id = "consumer"});
    int v[3] = {rank + 1, 10 * (rank + 1), -rank};
    comm.allreduce(v, v, 3, ringfence::DataType::Int32, ringfence::ReduceOp::Sum);
    if (v[0] != 3 || v[1] != 30 || v[2] != -1) ++bad;
  };
  std::thread t(rank_main, 1);
  rank_main(0);
  t.join();
  return bad == 0 ? 0 : 1;
}
