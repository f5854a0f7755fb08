#pragma once
// Polls `link` until `want` completions arrived (bounded: 100 000 polls, 100 us apart when
// nothing came) and returns them in order; shared by the transport tests.
#include <chrono>
#include <ringfence/transport.hpp>
#include <thread>
#include <vector>

#include "support/catch.hpp"

namespace ringfence::test {

inline std::vector<Completion> collect_completions(Link& link, std::size_t want) {
  std::vector<Completion> got;
  for (int spins = 0; got.size() < want && spins < 100000; ++spins) {
    Completion c[8];
    std::size_t n = 0;
    REQUIRE(link.poll(c, n).is_ok());
    got.insert(got.end(), c, c + n);
    if (n == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return got;
}

}  // namespace ringfence::test
