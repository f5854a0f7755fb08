#include <algorithm>
#include <ringfence/error.hpp>
#include <ringfence/registry.hpp>

namespace ringfence {

void TransportRegistry::add(std::string name, TransportFactory factory, std::span<const SettingKey> settings) {
  RINGFENCE_EXPECTS(!name.empty(), "transport name must not be empty");
  RINGFENCE_EXPECTS(!contains(name), "transport '{}' is already registered", name);
  RINGFENCE_EXPECTS(static_cast<bool>(factory), "transport '{}': factory must not be empty", name);
  Entry e{std::move(name), std::move(factory), {}};
  for (const SettingKey& k : settings) e.settings.emplace_back(k.variable);
  entries_.push_back(std::move(e));
}

bool TransportRegistry::contains(std::string_view name) const noexcept {
  return std::any_of(entries_.begin(), entries_.end(), [&](const auto& e) { return e.name == name; });
}

std::vector<std::string> TransportRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

std::vector<std::string> TransportRegistry::select(const std::vector<std::string>& allowed) const {
  if (allowed.empty()) return names();
  std::vector<std::string> out;
  for (const auto& name : allowed) {
    RINGFENCE_EXPECTS(contains(name), "transport '{}' (from RINGFENCE_TRANSPORTS / CommOptions::transports) is not built; available: {}",
                      name, fmt::join(names(), ","));
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  return out;
}

std::vector<std::string> TransportRegistry::setting_variables() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.insert(out.end(), e.settings.begin(), e.settings.end());
  return out;
}

std::unique_ptr<Transport> TransportRegistry::create(std::string_view name, const TransportContext& context) const {
  for (const auto& e : entries_)
    if (e.name == name) return e.factory(context);
  throw InvalidUsage(fmt::format("unknown transport '{}'", name));
}

}  // namespace ringfence
