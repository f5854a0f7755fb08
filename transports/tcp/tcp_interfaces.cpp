// The tcp transport's choice of interface: RINGFENCE_SOCKET_IFNAME filters and the host's up
// IPv4 interfaces (the pure helpers declared in <ringfence/transports/tcp.hpp>).
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <ringfence/error.hpp>
#include <ringfence/transports/tcp.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace ringfence::transports::tcp {

InterfaceFilter parse_interface_filter(std::string_view text) {
  InterfaceFilter f;
  if (!text.empty() && text.front() == '^') f.exclude = true, text.remove_prefix(1);
  if (!text.empty() && text.front() == '=') f.exact = true, text.remove_prefix(1);
  while (!text.empty()) {
    const auto comma = text.find(',');
    const std::string_view name = text.substr(0, comma);
    RINGFENCE_EXPECTS(!name.empty(), "RINGFENCE_SOCKET_IFNAME: empty interface name in '{}'", text);
    f.names.emplace_back(name);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
  }
  return f;
}

bool interface_matches(const InterfaceFilter& filter, std::string_view name) noexcept {
  if (filter.names.empty()) return true;
  bool hit = false;
  for (const auto& n : filter.names) hit |= filter.exact ? name == n : name.starts_with(n);
  return filter.exclude ? !hit : hit;
}

std::optional<Interface> choose_interface(const std::vector<Interface>& candidates, const InterfaceFilter& filter) {
  if (!filter.names.empty()) {
    for (const auto& c : candidates)
      if (interface_matches(filter, c.name)) return c;
    return std::nullopt;
  }
  for (const auto& c : candidates)
    if (!c.loopback) return c;
  for (const auto& c : candidates)
    if (c.loopback) return c;
  return std::nullopt;
}

std::vector<Interface> host_interfaces() {
  std::vector<Interface> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) throw SystemError(fmt::format("tcp: getifaddrs failed: {}", std::strerror(errno)), errno);
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    out.push_back(Interface{i->ifa_name, text, (i->ifa_flags & IFF_LOOPBACK) != 0});
  }
  ::freeifaddrs(list);
  return out;
}

}  // namespace ringfence::transports::tcp
