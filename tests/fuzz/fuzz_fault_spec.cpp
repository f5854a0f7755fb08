// Fuzz target: the RINGFENCE_FAULT grammar (src/fault.cpp). Any input either parses into rules
// that satisfy the grammar's invariants or is refused with InvalidUsage; nothing else may
// happen (no crash, no other exception, no unbounded allocation).
#include <cstddef>
#include <cstdint>
#include <ringfence/error.hpp>
#include <ringfence/fault.hpp>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto rules = ringfence::parse_fault_spec(text);
    if (rules.size() > text.size() + 1) __builtin_trap();  // at most one rule per character
    for (const auto& r : rules)
      if (r.rate < 0.0 || r.rate > 1.0) __builtin_trap();  // rates are probabilities
  } catch (const ringfence::InvalidUsage&) {
  }
  return 0;
}
