// NVLink topology without NVML: canonical PCI bus ids, and NVLink peers mapped to rank edges
// (shared GPUs, this rank's own GPU, unknown bus ids, links to GPUs of no rank).
#include <ringfence/health/topology.hpp>

#include "support/catch.hpp"

using namespace ringfence::health;
using namespace std::string_literals;

TEST_CASE("PCI bus ids are normalised to the Linux sysfs form", "[health][topology]") {
  REQUIRE(normalize_pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0");  // NVML busId
  REQUIRE(normalize_pci_bus_id("0000:3B:00.0") == "0000:3b:00.0");      // NVML busIdLegacy
  REQUIRE(normalize_pci_bus_id("0000:3b:00.0") == "0000:3b:00.0");      // Linux sysfs
  REQUIRE(normalize_pci_bus_id("3b:00.0") == "0000:3b:00.0");           // lspci, no domain
  REQUIRE(normalize_pci_bus_id("0001:C1:1f.7") == "0001:c1:1f.7");
  REQUIRE(normalize_pci_bus_id("00010000:3b:00.0") == "10000:3b:00.0");  // wide (VMD) domain
  REQUIRE(normalize_pci_bus_id("FFFFFFFF:ff:1F.7") == "ffffffff:ff:1f.7");
  REQUIRE(normalize_pci_bus_id(" 0000:3b:00.0\n") == "0000:3b:00.0");
  REQUIRE(normalize_pci_bus_id("00000000:3B:00.0\0\0\0"s) == "0000:3b:00.0");  // a C buffer's NULs

  for (const std::string& bad :
       {""s, "\0\0\0\0"s, "garbage"s, "0000:3b:00"s, "0000:3b.0"s, "0000:3b:20.0"s, "0000:3b:00.8"s, "0000:100:00.0"s,
        "100000000:3b:00.0"s, "0000:3b:00.0x"s, "0000:3b:0g.0"s, "+000:3b:00.0"s, "0000:-3:00.0"s, "0000::00.0"s,
        "0:0:3b:00.0"s, "0000:3b:00.0 junk"s, "0000:3b\x01:00.0"s, "\xc3\xa9:3b:00.0"s}) {
    INFO("'" << bad << "'");
    REQUIRE_FALSE(normalize_pci_bus_id(bad));
  }
}

TEST_CASE("NVLink peers become edges to every other rank on the far GPU", "[health][topology]") {
  // Rank 0 and 3 share GPU 3b; ranks 1 and 2 share GPU 3c (spelled two ways); rank 4's GPU is
  // unknown; rank 5 is on 3e.
  const std::vector<std::string> bus = {"0000:3b:00.0", "0000:3c:00.0", "00000000:3C:00.0", "0000:3b:00.0", "",
                                        "0000:3e:00.0"};
  const std::vector<NvLinkPeer> links = {
      {0, "0000:3c:00.0"},  // ranks 1 and 2
      {1, "0000:3c:00.0"},  // again: two links to the same GPU give two edges per rank
      {2, "0000:3b:00.0"},  // our own GPU (a loop): no edge, not even to rank 3 on it
      {3, "0000:3f:00.0"},  // an NVSwitch or a GPU of no rank: no edge
      {4, ""},              // unknown far end: no edge
      {5, "0000:3e:00.0"},  // rank 5
      {6, "garbage"},       // unparseable: no edge
  };
  const std::vector<NvlinkEdge> expected = {{1, 2, 0}, {1, 2, 1}, {2, 2, 0}, {2, 2, 1}, {5, 2, 5}};
  REQUIRE(nvlink_edges(0, 2, links, bus) == expected);

  // Order is by peer, then link, whatever the input order; duplicates collapse.
  std::vector<NvLinkPeer> shuffled(links.rbegin(), links.rend());
  shuffled.push_back({5, "0000:3E:00.0"});
  REQUIRE(nvlink_edges(0, 2, shuffled, bus) == expected);

  // Rank 3 (same GPU as rank 0) sees the same peers, and never rank 0.
  REQUIRE(nvlink_edges(3, 2, links, bus) == expected);

  // Rank 1 on 3c: a link to 3c is its own GPU (rank 2 shares it: no edge); a link to 3b gives
  // edges to ranks 0 and 3.
  REQUIRE(nvlink_edges(1, 0, {{7, "0000:3c:00.0"}, {8, "0000:3b:00.0"}}, bus) ==
          std::vector<NvlinkEdge>{{0, 0, 8}, {3, 0, 8}});

  // Rank 4 does not know its own GPU: only itself is excluded.
  REQUIRE(nvlink_edges(4, 1, {{0, "0000:3b:00.0"}}, bus) == std::vector<NvlinkEdge>{{0, 1, 0}, {3, 1, 0}});
  // A rank outside the table is allowed (its own GPU is unknown).
  REQUIRE(nvlink_edges(9, 1, {{0, "0000:3e:00.0"}}, bus) == std::vector<NvlinkEdge>{{5, 1, 0}});

  // Nothing to map.
  REQUIRE(nvlink_edges(0, 0, {}, bus).empty());
  REQUIRE(nvlink_edges(0, 0, links, {}).empty());
  REQUIRE(nvlink_edges(0, 0, links, {"", "", ""}).empty());
}
