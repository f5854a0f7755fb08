// What CommContext derives from the peer list: the ranks sharing this host, and whether they
// outnumber its CPUs; and what the engine's waits make of that and of network links
// (EngineConfig::fit_to_host).
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
