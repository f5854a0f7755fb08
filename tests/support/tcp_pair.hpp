#pragma once
// Two tcp transports in one process over loopback, for the tcp transport's tests
// (tcp_transport_test.cpp, tcp_hostile_test.cpp): options, a connected pair, a registered
// target and a bounded wait.
#include <chrono>
#include <memory>
#include <ringfence/error.hpp>
#include <ringfence/fault.hpp>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/transports/tcp.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "catch.hpp"

namespace tcp_test {

using namespace ringfence;
using namespace ringfence::transports;
inline CommOptions loopback_options(int sockets) {
  CommOptions o;
  o.transport_settings["RINGFENCE_SOCKET_IFNAME"] = "lo";
  o.transport_settings["RINGFENCE_TCP_SOCKETS"] = std::to_string(sockets);
  o.transport_settings["RINGFENCE_TCP_STRIPE_MIN_BYTES"] = "4096";
  o.timeout = std::chrono::seconds(5);
  o.transport_settings["RINGFENCE_SHM_SPIN"] = "10";
  return o;
}

// Two tcp transports in one process (ranks 0 and 1), connected: a.link writes into b's memory.
struct Pair {
  CommOptions options;
  Logger log;
  std::unique_ptr<Transport> a, b;
  std::unique_ptr<Link> a_to_b, b_to_a;
  // `fault`: RINGFENCE_FAULT rules for a's side (empty: none). `buffer_bytes`: the sockets'
  // buffers (0: the default). `spin_us`: RINGFENCE_TCP_SPIN_US (-1: the default).
  explicit Pair(int sockets = 2, std::string_view fault = {}, int buffer_bytes = 0, int spin_us = -1)
      : options(loopback_options(sockets)) {
    if (buffer_bytes > 0) options.transport_settings["RINGFENCE_TCP_BUFFER_BYTES"] = std::to_string(buffer_bytes);
    if (spin_us >= 0) options.transport_settings["RINGFENCE_TCP_SPIN_US"] = std::to_string(spin_us);
    const PeerInfo pa{0, "ha", 1}, pb{1, "hb", 2};
    a = tcp::make_transport(TransportContext{pa, 2, &options, &log});
    if (!fault.empty()) a = make_fault_transport(std::move(a), parse_fault_spec(fault), 0);
    b = tcp::make_transport(TransportContext{pb, 2, &options, &log});
    auto la = a->listen(), lb = b->listen();
    auto pa_pending = a->connect(*la, pb, lb->address());
    auto pb_pending = b->connect(*lb, pa, la->address());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!a_to_b || !b_to_a) {
      if (!a_to_b) {
        const Status s = pa_pending->try_finish(a_to_b);
        REQUIRE((s.is_ok() || s.in_progress()));
      }
      if (!b_to_a) {
        const Status s = pb_pending->try_finish(b_to_a);
        REQUIRE((s.is_ok() || s.in_progress()));
      }
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
};

// `bytes` of memory and a signal flag of b, registered with b and imported by a.
struct Target {
  std::vector<std::byte> mem;
  SignalFlag flag;
  MemoryRegion data_region, flag_region;
  RemoteRegion dst, fdst;
  Target(Pair& p, std::size_t bytes)
      : mem(bytes),
        data_region(p.b->register_memory(mem.data(), mem.size(), MemoryKind::Host)),
        flag_region(p.b->register_memory(&flag, sizeof flag, MemoryKind::Host)),
        dst(p.a->import_region(data_region.key())),
        fdst(p.a->import_region(flag_region.key())) {}
};

inline Status wait_for(Link& link, SignalFlag& flag, std::uint32_t target) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    const Status s = link.wait(flag, target, std::chrono::milliseconds(20));
    if (!s.in_progress()) return s;
    if (std::chrono::steady_clock::now() > deadline) return Status(ErrorCode::Timeout);
  }
}

}  // namespace tcp_test
