#include <ringfence/communicator.hpp>
#include <ringfence/registry.hpp>

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
