#pragma once
/// \file registry.hpp
/// Explicit transport registration (no static self-registration: linkers drop unreferenced
/// objects from static libraries). Order of registration is the default priority.

#include <functional>
#include <memory>
#include <ringfence/transport.hpp>
#include <ringfence/transport_settings.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ringfence {

/// Creates one `Transport` for one communicator.
using TransportFactory = std::function<std::unique_ptr<Transport>(const TransportContext&)>;

/// Ordered list of named transport factories. A value type: copy it into each communicator.
class TransportRegistry {
 public:
  /// Appends a factory under `name`, with the variables the transport reads (`settings`, e.g.
  /// `transports::shm::setting_keys()`; they are known to `unknown_variables`). Throws
  /// `InvalidUsage` when `name` is already registered.
  void add(std::string name, TransportFactory factory, std::span<const SettingKey> settings = {});
  /// True when `name` is registered.
  bool contains(std::string_view name) const noexcept;
  /// Registered names in registration (priority) order.
  std::vector<std::string> names() const;
  /// Names to use for a communicator: `allowed` in its order (each must be registered, else
  /// `InvalidUsage` naming it and listing the registered ones), or all when `allowed` is empty.
  std::vector<std::string> select(const std::vector<std::string>& allowed) const;
  /// The variables every registered transport reads (for `unknown_variables`).
  std::vector<std::string> setting_variables() const;
  /// Creates the transport `name`; throws `InvalidUsage` if unknown.
  std::unique_ptr<Transport> create(std::string_view name, const TransportContext& context) const;

 private:
  struct Entry {
    std::string name;
    TransportFactory factory;
    std::vector<std::string> settings;
  };
  std::vector<Entry> entries_;
};

}  // namespace ringfence
