// Health events as JSON lines (include/ringfence/events.hpp): written by the library, read by
// ringfence-health with a real JSON parser, so a log that a shipper re-formatted still reads.
#include <ringfence/events.hpp>
#include <string>

#include "support/catch.hpp"

using namespace ringfence;

TEST_CASE("health events round-trip through JSON", "[health][events]") {
  HealthEvent e{EventKind::LinkFenced, 2, 0, 1, 1008, 1, 73, "agreed \"by\" all", 1700000000.25};
  const std::string line = to_json(e);
  REQUIRE(line.find('\n') == std::string::npos);
  const auto back = parse_event_json(line);
  REQUIRE(back.has_value());
  REQUIRE(back->kind == EventKind::LinkFenced);
  REQUIRE(back->rank == 2);
  REQUIRE(back->a == 0);
  REQUIRE(back->b == 1);
  REQUIRE(back->sequence == 1008);
  REQUIRE(back->epoch == 1);
  REQUIRE(back->count == 73);
  REQUIRE(back->detail == "agreed \"by\" all");
  HealthEvent r{EventKind::Replanned, 0, -1, -1, 5, 2, 0, "0-2-1-3", 0};
  const auto rb = parse_event_json(to_json(r));
  REQUIRE(rb.has_value());
  REQUIRE(rb->a == -1);
  REQUIRE(rb->detail == "0-2-1-3");
  for (const char* bad : {"", "{}", "not json", "{\"event\":\"nope\",\"rank\":1}", "{\"event\":\"replanned\",\"rank\":x}"})
    REQUIRE_FALSE(parse_event_json(bad).has_value());
}

TEST_CASE("health events: a re-formatted line (spaces, key order, escapes) reads the same, broken lines do not", "[health][events]") {
  const char* shipped =
      R"(  { "time" : 1700000000.5 , "detail" : "slow \u0022link\u0022\n", "count": 3, "epoch" : 2,
          "seq" : 77, "link" : "1-2", "rank" : 2, "event" : "link_slow", "host" : "extra keys are ignored" } )";
  const auto e = parse_event_json(shipped);
  REQUIRE(e.has_value());
  CHECK(e->kind == EventKind::LinkSlow);
  CHECK(e->rank == 2);
  CHECK(e->a == 1);
  CHECK(e->b == 2);
  CHECK(e->sequence == 77);
  CHECK(e->epoch == 2);
  CHECK(e->count == 3);
  CHECK(e->detail == "slow \"link\"\n");
  CHECK(e->unix_time == 1700000000.5);
  // Truncated (a torn write), wrong types, a negative count, a bad link, an array.
  for (const char* bad : {R"({"event":"link_slow","rank":2,"seq":77,"epoch":2,"count":3,"link":"1-)",
                          R"({"event":"link_slow","rank":"2","seq":77,"epoch":2,"count":3})",
                          R"({"event":"link_slow","rank":2,"seq":77,"epoch":2,"count":-3})",
                          R"({"event":"link_slow","rank":2,"seq":77,"epoch":2,"count":3,"link":"1-x"})",
                          R"([{"event":"link_slow"}])"}) {
    INFO(bad);
    CHECK_FALSE(parse_event_json(bad).has_value());
  }
}
