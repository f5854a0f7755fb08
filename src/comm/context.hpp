#pragma once
// What every part of one communicator reads: its options, logger, rank, size, bootstrap store,
// who the ranks are and the transports it selected. Filled once at setup (before any part
// runs); only `seq` changes afterwards.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/store.hpp>
#include <ringfence/transport.hpp>
#include <string>
#include <vector>

namespace ringfence::detail {

/// CPUs online on this host (at least 1). Not this process's affinity mask: a rank pinned to a
/// core of its own (ringfence-run --bind-to core, mpirun's default) sees one CPU there, which
/// says nothing about how many this communicator's ranks share. A job confined to fewer CPUs
/// than ranks by other means (a cpuset) is not seen as oversubscribed.
inline int online_cpus() noexcept { return static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN))); }

/// The lowest CPU the calling thread may run on (its affinity mask), 0 when the mask cannot be
/// read; `count` gets how many it may run on (0 when unknown).
inline int first_allowed_cpu(int* count = nullptr) noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  const bool known = ::sched_getaffinity(0, sizeof set, &set) == 0;
  if (count) *count = known ? CPU_COUNT(&set) : 0;
  int cpu = 0;
  if (known)
    while (cpu < CPU_SETSIZE - 1 && !CPU_ISSET(cpu, &set)) ++cpu;
  return cpu;
}

/// The one CPU the calling thread may run on when its affinity mask holds exactly one (a
/// launcher bound the process to a core), else -1 (PeerInfo::cpu).
inline int bound_cpu() noexcept {
  int count = 0;
  const int cpu = first_allowed_cpu(&count);
  return count == 1 ? cpu : -1;
}

struct CommContext {
  CommOptions options;
  Logger log;
  int rank = 0;
  int size = 1;
  std::shared_ptr<Store> store;
  PeerInfo self;
  std::vector<PeerInfo> peer_info;  // by rank, ourselves included (moves reconnect with it)
  std::vector<std::unique_ptr<Transport>> transports;  // selected, in priority order
  /// Collectives issued so far (the call sequence number); written by the thread that runs
  /// collectives, read for messages and events.
  std::uint64_t seq = 0;
  /// The data-path options every rank must share, as exchanged when lanes connect (set at setup).
  std::string protocol;
  /// The fallback table in force: `CommOptions::fallbacks`, or the pairs the selected
  /// transports declare (`TransportTraits::fallbacks`). Set at setup.
  FallbackTable fallbacks;

  const PeerInfo& peer(int r) const { return peer_info[static_cast<std::size_t>(r)]; }
  /// Ranks of this communicator on this rank's host, itself included (peer_info must be known).
  int ranks_on_host() const noexcept {
    int n = 0;
    for (const PeerInfo& p : peer_info) n += p.host_id == self.host_id;
    return n;
  }
  /// More of this communicator's ranks on this host than it has CPUs (peer_info must be known).
  bool oversubscribed() const noexcept { return ranks_on_host() > online_cpus(); }
  /// Every rank of this communicator on this host (itself included) is bound to one CPU, and no
  /// two to the same (peer_info must be known): each has a core of its own, as far as the job
  /// can tell (CommOptions::spin).
  bool dedicated_cores() const noexcept {
    for (std::size_t i = 0; i < peer_info.size(); ++i) {
      const PeerInfo& p = peer_info[i];
      if (p.host_id != self.host_id) continue;
      if (p.cpu < 0) return false;
      for (std::size_t j = 0; j < i; ++j)
        if (peer_info[j].host_id == self.host_id && peer_info[j].cpu == p.cpu) return false;
    }
    return true;
  }
  /// True when no selected transport shares memory: every link is a network link.
  bool network_only() const noexcept {
    for (const auto& t : transports)
      if (t->traits().shares_memory) return false;
    return true;
  }
};

}  // namespace ringfence::detail
