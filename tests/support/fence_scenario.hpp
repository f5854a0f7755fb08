#pragma once
// The fence scenario shared by the fence and relay tests (tests/unit/integrity_test.cpp) and
// the link-move tests (CommOptions::fallbacks: shm -> tcp in tests/unit/link_move_test.cpp,
// nvlink -> pcie over the fake CUDA runtime in tests/device): thread ranks run allreduces of
// random floats (sums exact only in one fixed order, so any change of the reduction order or
// any corruption changes bytes) with checksums and fence agreement, then send/recv to every
// peer whose link is not fenced; the faulty run must match the fault-free run byte for byte.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <ringfence/communicator.hpp>
#include <ringfence/events.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"

namespace ringfence::test {


struct FenceRun {
  std::vector<std::vector<std::vector<float>>> outputs;  // [rank][iteration]
  std::vector<std::vector<LinkId>> fences;
  std::vector<std::vector<Relay>> relays;
  std::vector<std::vector<int>> rings;
  std::vector<std::uint64_t> epochs;
  std::vector<std::map<int, std::string>> transport_to;  // [rank][peer]
  std::vector<std::map<int, LinkState>> state_to;
  std::vector<std::uint64_t> errors_after_first_epoch;  // checksum errors seen after the first re-plan or move
  std::vector<std::vector<std::string>> moved;           // link_moved events: "a-b detail"
  std::vector<std::size_t> p2p_wrong;                    // send/recv to every peer after the collectives
  std::string error;
};

// `n` thread ranks run `iterations` allreduces of random floats (sums exact only in one fixed
// order: any change of plan or corruption changes bytes), then send/recv to every peer.
inline FenceRun run_scenario(int n, const std::string& fault, const std::function<void(int, CommOptions&)>& tweak,
                            const TransportRegistry& registry = builtin_transports(), int iterations = 24, std::size_t count = 30000,
                            std::shared_ptr<Store> store = std::make_shared<InProcessStore>()) {
  FenceRun run;
  run.outputs.assign(n, {});
  run.fences.resize(n);
  run.relays.resize(n);
  run.rings.resize(n);
  run.epochs.resize(n);
  run.transport_to.resize(n);
  run.state_to.resize(n);
  run.errors_after_first_epoch.resize(n);
  run.moved.resize(n);
  run.p2p_wrong.resize(n);
  std::mutex mutex;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        CommOptions o;
        o.chunk_bytes = 4096;
        o.timeout = std::chrono::seconds(20);
        o.checksum = true;
        o.health_agree_every = 4;
        o.health_agree_min_interval = std::chrono::microseconds(0);  // by count only: these agreements fall at set calls
        o.fault = fault;
        o.host_id = "fence-scenario";
        if (tweak) tweak(r, o);
        Communicator comm(store, r, n, registry, o);
        std::vector<std::string> moved;
        comm.on_health_event([&](const HealthEvent& e) {
          if (e.kind == EventKind::LinkMoved) moved.push_back(fmt::format("{}-{} {}", e.a, e.b, e.detail));
        });
        std::mt19937 rng(1234 + static_cast<unsigned>(r));
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        std::vector<float> buf(count);
        std::uint64_t errors_at_change = 0;
        bool changed = false;
        for (int it = 0; it < iterations; ++it) {
          for (auto& v : buf) v = dist(rng);
          comm.allreduce(buf.data(), buf.data(), count, DataType::Float32, ReduceOp::Sum);
          run.outputs[r].push_back(buf);
          if (comm.epoch() >= 1 && !changed) {
            changed = true;
            for (const auto& l : comm.links()) errors_at_change += l.checksum_errors;
          }
        }
        std::uint64_t errors_now = 0;
        for (const auto& l : comm.links()) errors_now += l.checksum_errors;
        // Point-to-point over every link that is not fenced (a moved one included), both ways.
        const std::vector<LinkId> fenced = comm.fenced_links();
        std::vector<std::vector<std::uint32_t>> in(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
        comm.group_start();
        for (int p = 0; p < n; ++p) {
          if (p == r || std::find(fenced.begin(), fenced.end(), LinkId::of(r, p)) != fenced.end()) continue;
          out[p].resize(50000);
          in[p].assign(50000, 0);
          for (std::size_t i = 0; i < out[p].size(); ++i) out[p][i] = static_cast<std::uint32_t>(r * 1000003 + p * 7919 + i);
          comm.send(out[p].data(), out[p].size(), DataType::Uint32, p);
          comm.recv(in[p].data(), in[p].size(), DataType::Uint32, p);
        }
        comm.group_end();
        std::size_t wrong = 0;
        for (int p = 0; p < n; ++p)
          for (std::size_t i = 0; i < in[p].size(); ++i) wrong += in[p][i] != static_cast<std::uint32_t>(p * 1000003 + r * 7919 + i);
        std::lock_guard lock(mutex);
        run.fences[r] = fenced;
        run.relays[r] = comm.relays();
        run.rings[r] = comm.ring();
        run.epochs[r] = comm.epoch();
        run.errors_after_first_epoch[r] = errors_now - errors_at_change;
        for (const auto& l : comm.links()) {
          run.transport_to[r][l.peer] = l.transport;
          run.state_to[r][l.peer] = l.state;
        }
        run.moved[r] = moved;
        run.p2p_wrong[r] = wrong;
      } catch (const std::exception& e) {
        std::lock_guard lock(mutex);
        if (run.error.empty()) run.error = fmt::format("rank {}: {}", r, e.what());
      }
    });
  for (auto& t : threads) t.join();
  return run;
}

// Every rank of `faulty` moved `link` from `from` to `to` once and nothing else changed: no
// fence, no relay, the fault-free ring, no corrupted chunk since; the pair's links are on `to`,
// every other link on `from`, all up. (Catch2 assertions: call from the test thread.)
inline void require_moved_once(const FenceRun& clean, const FenceRun& faulty, int n, LinkId link, const std::string& from,
                               const std::string& to) {
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    const auto i = static_cast<std::size_t>(r);
    REQUIRE(clean.epochs[i] == 0);
    REQUIRE(faulty.epochs[i] == 1);
    REQUIRE(faulty.fences[i].empty());
    REQUIRE(faulty.relays[i].empty());
    REQUIRE(faulty.rings[i] == clean.rings[i]);
    REQUIRE(faulty.errors_after_first_epoch[i] == 0);  // the moved link no longer corrupts
    REQUIRE(faulty.moved[i].size() == 1);
    REQUIRE_THAT(faulty.moved[i][0], Catch::StartsWith(fmt::format("{}-{} to {}", link.a, link.b, to)));
    if (r == link.a || r == link.b) REQUIRE_THAT(faulty.moved[i][0], Catch::EndsWith(fmt::format("(was {})", from)));
    for (const auto& [peer, transport] : faulty.transport_to[i]) {
      INFO("peer " << peer);
      REQUIRE(transport == (LinkId::of(r, peer) == link ? to : from));
      REQUIRE(faulty.state_to[i].at(peer) == LinkState::Up);
    }
  }
}

// True when rank r's end of every link in its fence list shows "fenced".
inline bool fenced_ends_show_fenced(const FenceRun& run, int r) {
  for (const LinkId& f : run.fences[static_cast<std::size_t>(r)])
    if (f.a == r || f.b == r)
      if (run.state_to[static_cast<std::size_t>(r)].at(f.a == r ? f.b : f.a) != LinkState::Fenced) return false;
  return true;
}

// Runs fault-free and with `fault`; every output of the faulty run must be byte-identical to
// the fault-free run's, on every rank.
inline std::pair<FenceRun, FenceRun> run_against_clean(int n, const std::string& fault, const std::function<void(int, CommOptions&)>& tweak,
                                                     const TransportRegistry& registry = builtin_transports(), int iterations = 24,
                                                     std::size_t count = 30000) {
  FenceRun clean = run_scenario(n, "", tweak, registry, iterations, count);
  FenceRun faulty = run_scenario(n, fault, tweak, registry, iterations, count);
  INFO(clean.error << " | " << faulty.error);
  REQUIRE(clean.error.empty());
  REQUIRE(faulty.error.empty());
  std::size_t differing = 0;
  for (int r = 0; r < n; ++r) {
    REQUIRE(faulty.outputs[r].size() == clean.outputs[r].size());
    for (std::size_t it = 0; it < clean.outputs[r].size(); ++it) {
      differing += std::memcmp(clean.outputs[r][it].data(), faulty.outputs[r][it].data(), clean.outputs[r][it].size() * sizeof(float)) != 0;
      differing += std::memcmp(faulty.outputs[0][it].data(), faulty.outputs[r][it].data(), clean.outputs[r][it].size() * sizeof(float)) != 0;
    }
  }
  REQUIRE(differing == 0);
  for (int r = 0; r < n; ++r) {
    REQUIRE(clean.p2p_wrong[r] == 0);
    REQUIRE(faulty.p2p_wrong[r] == 0);
  }
  return {std::move(clean), std::move(faulty)};
}


}  // namespace ringfence::test
