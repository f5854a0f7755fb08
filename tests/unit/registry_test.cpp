#include <cstring>
#include <ringfence/communicator.hpp>
#include <ringfence/registry.hpp>
#include <ringfence/transport.hpp>

#include "support/catch.hpp"

using namespace ringfence;

TEST_CASE("registry keeps order, rejects duplicates and unknown names", "[registry]") {
  TransportRegistry reg = builtin_transports();
  REQUIRE(reg.names() == std::vector<std::string>{"shm", "tcp"});  // priority order: shm first
  REQUIRE(reg.contains("shm"));
  REQUIRE(reg.contains("tcp"));
  REQUIRE_FALSE(reg.contains("nvlink"));
  REQUIRE_THROWS_AS(reg.add("shm", [](const TransportContext&) { return std::unique_ptr<Transport>{}; }), InvalidUsage);
  REQUIRE(reg.select({}) == std::vector<std::string>{"shm", "tcp"});
  REQUIRE(reg.select({"shm", "shm"}) == std::vector<std::string>{"shm"});
  REQUIRE(reg.select({"tcp", "shm"}) == std::vector<std::string>{"tcp", "shm"});
  try {
    (void)reg.select({"shm", "nvlink"});
    FAIL("expected InvalidUsage");
  } catch (const InvalidUsage& e) {
    REQUIRE_THAT(e.what(), Catch::Contains("'nvlink'") && Catch::Contains("available: shm,tcp"));
  }
}

TEST_CASE("peer info round-trips through its bytes and malformed bytes are refused", "[registry][topology]") {
  PeerInfo p{3, "node-7", 4242};
  p.gpu_bus_id = "0000:3b:00.0";
  p.nvlink_bus_ids = {"0000:3c:00.0", "0000:5d:00.0"};
  p.nvswitch_links = 18;
  p.cpu = 5;
  const Bytes b = serialize(p);
  const PeerInfo q = deserialize_peer_info(b);
  REQUIRE(q.rank == 3);
  REQUIRE(q.pid == 4242);
  REQUIRE(q.host_id == "node-7");
  REQUIRE(q.gpu_bus_id == "0000:3b:00.0");
  REQUIRE(q.nvlink_bus_ids == p.nvlink_bus_ids);
  REQUIRE(q.nvswitch_links == 18u);
  REQUIRE(q.cpu == 5);
  const PeerInfo plain = deserialize_peer_info(serialize(PeerInfo{0, "h", 1}));
  REQUIRE(plain.gpu_bus_id.empty());
  REQUIRE(plain.nvlink_bus_ids.empty());
  REQUIRE(plain.nvswitch_links == 0u);
  REQUIRE(plain.cpu == -1);  // not bound to one CPU
  // Every truncation, and a trailing byte, is an error naming the problem.
  for (std::size_t n = 0; n < b.size(); ++n)
    REQUIRE_THROWS_WITH(deserialize_peer_info(std::span(b.data(), n)), Catch::Contains("malformed peer info"));
  Bytes longer = b;
  longer.push_back(std::byte{0});
  REQUIRE_THROWS_WITH(deserialize_peer_info(longer), Catch::Contains("1 trailing bytes"));
  // A huge NVLink count cannot make it allocate: refused before reading the ids. (With no ids
  // the count is the u32 before the NVSwitch link count and the CPU.)
  Bytes huge = serialize(PeerInfo{0, "h", 1});
  const std::uint32_t count = 0xffffffffu;
  std::memcpy(huge.data() + huge.size() - 12, &count, 4);
  REQUIRE_THROWS_WITH(deserialize_peer_info(huge), Catch::Contains("4294967295 NVLinks"));
  // A CPU below -1 is no CPU number.
  Bytes bad_cpu = serialize(PeerInfo{0, "h", 1});
  const std::int32_t minus_two = -2;
  std::memcpy(bad_cpu.data() + bad_cpu.size() - 4, &minus_two, 4);
  REQUIRE_THROWS_WITH(deserialize_peer_info(bad_cpu), Catch::Contains("CPU -2"));
}
