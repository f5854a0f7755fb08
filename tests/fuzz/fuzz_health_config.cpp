// Fuzz target: the health config file parser (RINGFENCE_HEALTH_CONFIG, src/health/config.cpp).
// Any input is applied or refused with InvalidUsage naming the line; nothing else may happen.
#include <cstddef>
#include <cstdint>
#include <ringfence/error.hpp>
#include <ringfence/health/config.hpp>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ringfence::health::HealthOptions options;
  try {
    ringfence::health::apply_health_config(text, options, "<fuzz>");
  } catch (const ringfence::InvalidUsage&) {
  }
  return 0;
}
