// Multi-host run (network namespaces as hosts, see netns_multihost.sh): every collective with
// exact checks, then the links: ranks on one host must talk over shm, ranks on different hosts
// over tcp, and the ring must keep each host's ranks together (one crossing per host). The
// placement comes from MULTIHOST_HOST_OF ("0,1,0,1": host of rank 0, 1, ...).
#include <cstdio>
#include <cstdlib>
#include <ringfence/ringfence.hpp>
#include <string>
#include <vector>

#include "support/verifiable.hpp"

using namespace ringfence;

int main() {
  try {
    Communicator comm = Communicator::from_env();
    const int n = comm.size(), r = comm.rank();
    const auto un = static_cast<std::size_t>(n), ur = static_cast<std::size_t>(r);
    std::vector<int> host_of;
    if (const char* s = std::getenv("MULTIHOST_HOST_OF")) {
      for (std::string text = s; !text.empty();) {
        const auto comma = text.find(',');
        host_of.push_back(std::stoi(text.substr(0, comma)));
        text = comma == std::string::npos ? "" : text.substr(comma + 1);
      }
    }
    if (static_cast<int>(host_of.size()) != n) {
      std::fprintf(stderr, "rank %d: MULTIHOST_HOST_OF must list %d hosts\n", r, n);
      return 2;
    }
    std::uint64_t wrong = 0;
    for (std::size_t count : {std::size_t{1}, std::size_t{1031}, std::size_t{1} << 20}) {
      std::vector<float> in(un * count), out(un * count);
      test::fill_input(DataType::Float32, ReduceOp::Sum, r, n, in.data(), count);
      comm.allreduce(in.data(), out.data(), count, DataType::Float32, ReduceOp::Sum);
      wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, n, out.data(), count);
      test::fill_input(DataType::Float32, ReduceOp::Sum, r, n, in.data(), un * count);
      comm.reduce_scatter(in.data(), out.data(), count, DataType::Float32, ReduceOp::Sum);
      wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, n, out.data(), count, ur * count);
      test::fill_pattern(DataType::Float32, r, in.data(), count, ur * count);
      comm.allgather(in.data(), out.data(), count, DataType::Float32);
      for (std::size_t b = 0; b < un; ++b)
        wrong += test::count_wrong_pattern(DataType::Float32, static_cast<int>(b), out.data() + b * count, count, b * count);
      for (int root = 0; root < n; ++root) {
        test::fill_pattern(DataType::Float32, r, in.data(), count);
        comm.broadcast(in.data(), out.data(), count, DataType::Float32, root);
        wrong += test::count_wrong_pattern(DataType::Float32, root, out.data(), count);
      }
      // alltoall: block j of rank r goes to rank j's block r.
      for (std::size_t j = 0; j < un; ++j)
        for (std::size_t i = 0; i < count; ++i) in[j * count + i] = static_cast<float>(ur * 1000 + j + i % 7);
      comm.alltoall(in.data(), out.data(), count, DataType::Float32);
      for (std::size_t j = 0; j < un; ++j)
        for (std::size_t i = 0; i < count; ++i) wrong += out[j * count + i] != static_cast<float>(j * 1000 + ur + i % 7);
    }
    comm.allreduce(&wrong, &wrong, 1, DataType::Uint64, ReduceOp::Sum);

    // Which transport each link used, and that it carried data.
    int bad_links = 0;
    for (const auto& l : comm.links()) {
      const bool same_host = host_of[ur] == host_of[static_cast<std::size_t>(l.peer)];
      const std::string want = same_host ? "shm" : "tcp";
      const bool ok = l.transport == want && l.bytes_written > 0;
      bad_links += !ok;
      std::printf("rank %d -> rank %d (%s host): %s, %llu bytes%s\n", r, l.peer, same_host ? "same" : "other", l.transport.c_str(),
                  static_cast<unsigned long long>(l.bytes_written), ok ? "" : "  <-- WRONG");
    }
    // The ring crosses between hosts once per host (each host's ranks contiguous).
    const std::vector<int> ring = comm.ring();
    int crossings = 0, hosts = 0;
    for (std::size_t i = 0; i < ring.size(); ++i)
      crossings += host_of[static_cast<std::size_t>(ring[i])] != host_of[static_cast<std::size_t>(ring[(i + 1) % ring.size()])];
    for (int h : host_of) hosts = std::max(hosts, h + 1);
    const bool ring_ok = hosts == 1 ? crossings == 0 : crossings == hosts;
    std::uint64_t verdict[2] = {static_cast<std::uint64_t>(bad_links), ring_ok ? 0u : 1u};
    comm.allreduce(verdict, verdict, 2, DataType::Uint64, ReduceOp::Sum);
    if (r == 0) {
      std::string order;
      for (int x : ring) order += (order.empty() ? "" : "-") + std::to_string(x);
      std::printf("ring %s: %d host crossings for %d hosts\n", order.c_str(), crossings, hosts);
    }
    if (wrong != 0 || verdict[0] != 0 || verdict[1] != 0) {
      if (r == 0)
        std::printf("multihost: FAILED (%llu wrong elements, %llu links on the wrong transport, ring %s)\n",
                    static_cast<unsigned long long>(wrong), static_cast<unsigned long long>(verdict[0]), verdict[1] ? "not host-contiguous" : "ok");
      return 1;
    }
    if (r == 0) std::printf("multihost: exact results, shm within hosts, tcp across hosts, host-contiguous ring\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "multihost_test: %s\n", e.what());
    return 1;
  }
}
