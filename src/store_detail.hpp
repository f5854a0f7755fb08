#pragma once
// Private helpers shared by store.cpp and store_wire.cpp.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <ringfence/store.hpp>
#include <span>

namespace ringfence::detail {

using Clock = std::chrono::steady_clock;

/// Saturating `now + timeout` (a huge timeout must not overflow the clock).
inline Clock::time_point deadline_after(std::chrono::milliseconds timeout) noexcept {
  auto now = Clock::now();
  if (timeout.count() <= 0) return now;
  if (timeout > std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now))
    return Clock::time_point::max();
  return now + timeout;
}

inline void put_i64(Bytes& out, std::int64_t v) {
  out.resize(8);
  std::memcpy(out.data(), &v, 8);
}

inline std::int64_t get_i64(std::span<const std::byte> in) noexcept {
  std::int64_t v = 0;
  std::memcpy(&v, in.data(), 8);
  return v;
}

/// Wrapping add: a counter overflow is the caller's bug but must not be UB in the server.
inline std::int64_t wrapping_add(std::int64_t a, std::int64_t b) noexcept {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
}

}  // namespace ringfence::detail
