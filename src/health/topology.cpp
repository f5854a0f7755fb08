// NVLink topology: canonical PCI bus ids and the mapping from NVLink peers to rank edges.
#include <ringfence/health/topology.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdint>

namespace ringfence::health {

namespace {

// One hex field of 1..8 digits (no sign, no prefix), or nullopt.
std::optional<std::uint32_t> hex_field(std::string_view s) {
  if (s.empty() || s.size() > 8) return std::nullopt;
  std::uint32_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace

std::optional<std::string> normalize_pci_bus_id(std::string_view id) {
  // Fixed-size C buffers arrive with their NULs; blanks around the id are tolerated.
  while (!id.empty() && (id.back() == '\0' || id.back() == ' ' || id.back() == '\t' || id.back() == '\n'))
    id.remove_suffix(1);
  while (!id.empty() && (id.front() == ' ' || id.front() == '\t')) id.remove_prefix(1);
  if (id.empty()) return std::nullopt;
  for (const char c : id)
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f) return std::nullopt;

  const auto dot = id.rfind('.');
  if (dot == std::string_view::npos) return std::nullopt;
  const std::string_view head = id.substr(0, dot), fn_text = id.substr(dot + 1);
  const auto last_colon = head.rfind(':');
  if (last_colon == std::string_view::npos) return std::nullopt;
  const std::string_view dev_text = head.substr(last_colon + 1), rest = head.substr(0, last_colon);
  std::string_view domain_text = "0", bus_text = rest;
  if (const auto first_colon = rest.rfind(':'); first_colon != std::string_view::npos) {
    domain_text = rest.substr(0, first_colon);
    bus_text = rest.substr(first_colon + 1);
  }
  const auto domain = hex_field(domain_text), bus = hex_field(bus_text), dev = hex_field(dev_text),
             fn = hex_field(fn_text);
  if (!domain || !bus || !dev || !fn || *bus > 0xff || *dev > 0x1f || *fn > 7) return std::nullopt;
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", *domain, *bus, *dev, *fn);
}

std::vector<NvlinkEdge> nvlink_edges(int rank, unsigned gpu, const std::vector<NvLinkPeer>& links,
                                     const std::vector<std::string>& bus_id_of_rank) {
  std::vector<std::optional<std::string>> ids;
  ids.reserve(bus_id_of_rank.size());
  for (const std::string& b : bus_id_of_rank) ids.push_back(normalize_pci_bus_id(b));
  const bool rank_known = rank >= 0 && static_cast<std::size_t>(rank) < ids.size();
  const std::optional<std::string> self = rank_known ? ids[static_cast<std::size_t>(rank)] : std::nullopt;

  std::vector<NvlinkEdge> edges;
  for (const NvLinkPeer& l : links) {
    if (l.far_end == NvLinkFarEnd::Switch) continue;  // shared by every pair of the GPU: no one edge
    const std::optional<std::string> remote = normalize_pci_bus_id(l.remote_bus_id);
    if (!remote || (self && *remote == *self)) continue;  // unknown far end, or a loop to our own GPU
    for (std::size_t r = 0; r < ids.size(); ++r) {
      if (static_cast<int>(r) == rank || !ids[r] || *ids[r] != *remote) continue;
      edges.push_back(NvlinkEdge{static_cast<int>(r), gpu, l.link});
    }
  }
  std::sort(edges.begin(), edges.end(), [](const NvlinkEdge& a, const NvlinkEdge& b) {
    return a.peer != b.peer ? a.peer < b.peer : a.link < b.link;
  });
  edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
  return edges;
}

}  // namespace ringfence::health
