// ReportCoalescer ([log]): a repeating report goes out at once the first time, then at most once
// per interval with the sum held back; nothing is lost (take_held gives the rest).
#include "report_coalescer.hpp"

#include "support/catch.hpp"

using ringfence::detail::ReportCoalescer;
using namespace std::chrono_literals;

TEST_CASE("report coalescer: the first at once, then one per interval carrying what was held back", "[log]") {
  ReportCoalescer c(1s);
  const auto t0 = ReportCoalescer::Clock::time_point{} + 100s;
  REQUIRE(c.add(0, t0) == 0);  // nothing to report: no report, the interval does not start
  REQUIRE(c.add(3, t0) == 3);  // the first report is not held
  REQUIRE(c.last_report() == t0);
  REQUIRE(c.add(2, t0 + 200ms) == 0);
  REQUIRE(c.add(5, t0 + 999ms) == 0);
  REQUIRE(c.add(0, t0 + 999ms) == 0);
  REQUIRE(c.add(1, t0 + 1s) == 8);  // the interval has passed: 2 + 5 + 1
  REQUIRE(c.last_report() == t0 + 1s);
  REQUIRE(c.add(4, t0 + 1500ms) == 0);
  REQUIRE(c.add(0, t0 + 2100ms) == 4);  // a count of 0 lets out what is held once the interval passed
  REQUIRE(c.add(0, t0 + 5s) == 0);      // nothing held: nothing reported
  REQUIRE(c.add(7, t0 + 5s) == 7);      // a long quiet spell: reported at once
  REQUIRE(c.add(6, t0 + 5100ms) == 0);
  REQUIRE(c.take_held() == 6);
  REQUIRE(c.take_held() == 0);
  REQUIRE(c.add(0, t0 + 10s) == 0);  // what was taken is not reported again
}

TEST_CASE("report coalescer: sums add up to everything added", "[log]") {
  ReportCoalescer c(10ms);
  auto t = ReportCoalescer::Clock::time_point{} + 1s;
  std::uint64_t added = 0, reported = 0, reports = 0;
  for (int i = 0; i < 1000; ++i, t += 1ms) {
    const std::uint64_t n = static_cast<std::uint64_t>(i % 7);
    added += n;
    if (const std::uint64_t out = c.add(n, t)) {
      reported += out;
      ++reports;
    }
  }
  reported += c.take_held();
  REQUIRE(reported == added);
  REQUIRE(reports <= 101);  // 1 s of adds at most one per 10 ms (and the first)
  REQUIRE(reports >= 90);
}
