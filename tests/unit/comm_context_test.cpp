// What CommContext derives from the peer list: the ranks sharing this host, whether they
// outnumber its CPUs, whether each is bound to a CPU of its own; and what the engine's waits
// make of that and of network links (EngineConfig::fit_to_host).
#include <sched.h>

#include <thread>

#include "comm/context.hpp"
#include "engine.hpp"
#include "support/catch.hpp"

using namespace ringfence;
using ringfence::detail::CommContext;

TEST_CASE("communicator context: ranks on this host, and oversubscription against the online CPUs", "[setup]") {
  const int cpus = detail::online_cpus();
  REQUIRE(cpus >= 1);
  CommContext ctx;
  ctx.self = PeerInfo{0, "host-a", 1};
  auto job = [&](int here, int elsewhere) {
    ctx.peer_info.assign(1, ctx.self);
    for (int i = 1; i < here; ++i) ctx.peer_info.push_back(PeerInfo{i, "host-a", 1 + i});
    for (int i = 0; i < elsewhere; ++i) ctx.peer_info.push_back(PeerInfo{here + i, "host-b", 100 + i});
  };
  job(1, 3);
  CHECK(ctx.ranks_on_host() == 1);
  CHECK_FALSE(ctx.oversubscribed());
  job(cpus, 5);  // one rank per CPU here, more elsewhere: not oversubscribed
  CHECK(ctx.ranks_on_host() == cpus);
  CHECK_FALSE(ctx.oversubscribed());
  job(cpus + 1, 0);
  CHECK(ctx.ranks_on_host() == cpus + 1);
  CHECK(ctx.oversubscribed());
}

TEST_CASE("engine waits fit the host: a CPU per rank spins longer and waits for its receivers, shared CPUs yield and copy aside",
          "[setup]") {
  detail::EngineConfig engine;
  engine.fit_to_host(false, false);
  CHECK(engine.spin_polls == detail::kSpinPolls);
  CHECK(engine.retain_max_bytes == detail::kRunningRetainMaxBytes);
  engine.fit_to_host(true, false);
  CHECK(engine.spin_polls == detail::kOversubscribedSpinPolls);
  CHECK(engine.retain_max_bytes == detail::kRetainMaxBytes);
  // The two settings differ, or the host's load would change nothing.
  CHECK(detail::kSpinPolls != detail::kOversubscribedSpinPolls);
  CHECK(detail::kRunningRetainMaxBytes < detail::kRetainMaxBytes);
  engine.fit_to_host(false, false);  // and back: nothing sticks from an earlier call
  CHECK(engine.spin_polls == detail::kSpinPolls);
  CHECK(engine.retain_max_bytes == detail::kRunningRetainMaxBytes);
}

TEST_CASE("engine waits fit the links: over a network link a checked call copies aside rather than wait a round trip",
          "[setup]") {
  detail::EngineConfig engine;
  engine.fit_to_host(false, false);  // from the shared-memory setting, so each assignment shows
  engine.fit_to_host(false, true);
  CHECK(engine.spin_polls == detail::kSpinPolls);  // spinning depends on the CPUs alone
  CHECK(engine.retain_max_bytes == detail::kRetainMaxBytes);
  engine.spin_polls = 0;  // whatever came before, both are set
  engine.retain_max_bytes = 0;
  engine.fit_to_host(true, true);
  CHECK(engine.spin_polls == detail::kOversubscribedSpinPolls);
  CHECK(engine.retain_max_bytes == detail::kRetainMaxBytes);
}

TEST_CASE("communicator context: cores are dedicated when every rank of this host is bound to a CPU of its own", "[setup]") {
  CommContext ctx;
  ctx.self = PeerInfo{0, "host-a", 1};
  auto rank = [](int r, const char* host, int cpu) {
    PeerInfo p{r, host, 10 + r};
    p.cpu = cpu;
    return p;
  };
  ctx.self.cpu = 0;
  ctx.peer_info = {ctx.self, rank(1, "host-a", 1)};
  CHECK(ctx.dedicated_cores());
  ctx.peer_info = {ctx.self, rank(1, "host-a", -1)};  // a peer of this host that may run anywhere
  CHECK_FALSE(ctx.dedicated_cores());
  ctx.peer_info = {ctx.self, rank(1, "host-a", 1), rank(2, "host-a", 0)};  // 3 ranks on 2 CPUs (ringfence-run wraps)
  CHECK_FALSE(ctx.dedicated_cores());
  ctx.peer_info = {ctx.self, rank(1, "host-a", 1), rank(2, "host-b", 0), rank(3, "host-b", -1)};  // other hosts do not count
  CHECK(ctx.dedicated_cores());
  ctx.self.cpu = -1;  // this rank unbound
  ctx.peer_info = {ctx.self, rank(1, "host-a", 1)};
  CHECK_FALSE(ctx.dedicated_cores());
}

TEST_CASE("bound_cpu names the one CPU a thread is bound to, and none while it may run on several", "[setup]") {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  REQUIRE(::sched_getaffinity(0, sizeof allowed, &allowed) == 0);
  int last = -1;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) last = c;
  REQUIRE(last >= 0);
  if (CPU_COUNT(&allowed) == 1) {
    CHECK(detail::bound_cpu() == last);
  } else {
    CHECK(detail::bound_cpu() == -1);
  }
  int seen = -2;
  std::thread pinned([&] {  // affinity is per thread: this one alone is bound
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(last, &one);
    if (::sched_setaffinity(0, sizeof one, &one) == 0) seen = detail::bound_cpu();
  });
  pinned.join();
  CHECK(seen == last);
}

TEST_CASE("engine waits fit the host: every rank on a core of its own spins long, unless the CPUs are oversubscribed", "[setup]") {
  detail::EngineConfig engine;
  engine.fit_to_host(false, false, true);
  CHECK(engine.spin_polls == detail::kDedicatedSpinPolls);
  CHECK(engine.retain_max_bytes == detail::kRunningRetainMaxBytes);
  CHECK(detail::kDedicatedSpinPolls > detail::kSpinPolls);
  engine.fit_to_host(false, true, true);  // network links change the copies aside, not the spin
  CHECK(engine.spin_polls == detail::kDedicatedSpinPolls);
  CHECK(engine.retain_max_bytes == detail::kRetainMaxBytes);
  engine.fit_to_host(true, false, true);  // ranks outnumbering the CPUs: the peer must run first
  CHECK(engine.spin_polls == detail::kOversubscribedSpinPolls);
  engine.fit_to_host(false, false, false);
  CHECK(engine.spin_polls == detail::kSpinPolls);
}
