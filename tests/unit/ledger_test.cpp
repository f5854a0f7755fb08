// The health ledger's file (src/health/ledger.hpp): concurrent appenders, torn lines, the
// latest state of a link, quarantine, endpoint identities. The cross-job behaviour (a fence in
// one job, fenced from collective #1 in the next, cleared for the one after) is
// tests/mp/health_ledger.sh.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "health/ledger.hpp"
#include "support/catch.hpp"

using namespace ringfence;
using namespace ringfence::detail;

namespace {
std::string temp_ledger(const char* name) {
  const auto path = std::filesystem::temp_directory_path() / (std::string(name) + "-" + std::to_string(::getpid()) + ".jsonl");
  std::filesystem::remove(path);
  return path.string();
}
LedgerEntry entry(const std::string& action, double time, std::string evidence = "why") {
  LedgerEntry e;
  e.time = time;
  e.action = action;
  e.a = "hostA/gpu:0000:3b:00.0";
  e.b = "hostB/gpu:0000:5e:00.0";
  e.link = "1-2";
  e.evidence = std::move(evidence);
  e.quarantine_s = 100;
  e.writer = "test";
  return e;
}
}  // namespace

TEST_CASE("ledger: 20 processes appending at once lose no entry and leave no torn line", "[ledger]") {
  const std::string path = temp_ledger("ledger-concurrent");
  constexpr int kWriters = 20, kEach = 50;
  std::vector<pid_t> children;
  for (int w = 0; w < kWriters; ++w) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int failed = 0;
      for (int i = 0; i < kEach; ++i) {
        // Long evidence: lines of a few KiB, beyond what a single small write keeps whole by luck.
        LedgerEntry e = entry("fenced", 1000 + i, std::string(2000 + 37 * w, static_cast<char>('a' + w)));
        e.writer = std::to_string(w) + ":" + std::to_string(i);
        try {
          append_ledger(path, e);
        } catch (...) {
          ++failed;
        }
      }
      ::_exit(failed == 0 ? 0 : 1);
    }
    children.push_back(pid);
  }
  for (const pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
  }
  const LedgerRead r = read_ledger(path);
  CHECK(r.skipped == 0);
  REQUIRE(r.entries.size() == static_cast<std::size_t>(kWriters * kEach));
  std::set<std::string> writers;
  for (const auto& e : r.entries) {
    writers.insert(e.writer);
    const int w = std::stoi(e.writer.substr(0, e.writer.find(':')));
    CHECK(e.evidence == std::string(2000 + 37 * w, static_cast<char>('a' + w)));  // whole, not mixed
  }
  CHECK(writers.size() == static_cast<std::size_t>(kWriters * kEach));
  std::filesystem::remove(path);
}

TEST_CASE("ledger: torn and foreign lines are skipped, the rest is read", "[ledger]") {
  const std::string path = temp_ledger("ledger-torn");
  append_ledger(path, entry("fenced", 10));
  {
    std::ofstream out(path, std::ios::app);
    out << "{\"time\":11,\"action\":\"fenced\",\"a\":\"x\",\"b\n";  // torn by a crash
    out << "garbage that is not JSON\n";
    out << "{\"time\":12,\"action\":\"exploded\",\"a\":\"x\",\"b\":\"y\"}\n";  // an unknown action
  }
  append_ledger(path, entry("readmitted", 20));
  const LedgerRead r = read_ledger(path);
  CHECK(r.skipped == 3);
  REQUIRE(r.entries.size() == 2);
  CHECK(r.entries[1].action == "readmitted");
  CHECK(read_ledger(path + ".missing").entries.empty());  // no ledger yet: nothing known
  std::filesystem::remove(path);
}

TEST_CASE("ledger: the latest entry of a link decides its quarantine, and keeps the evidence of its decision", "[ledger]") {
  std::vector<LedgerEntry> entries{entry("fenced", 100, "665 checksum mismatches"),
                                   entry("fenced", 100.5, std::string(kAgreedElsewhere))};
  auto latest = latest_by_link(entries);
  REQUIRE(latest.size() == 1);
  const LedgerEntry& e = latest.begin()->second;
  CHECK(e.evidence == "665 checksum mismatches");  // the other end's "agreed" line does not hide why
  CHECK(quarantine_left(e, 150) == Approx(50.5));
  CHECK(quarantine_left(e, 250) < 0);  // served
  entries.push_back(entry("cleared", 120));
  CHECK(quarantine_left(latest_by_link(entries).begin()->second, 150) == 0);
  entries.push_back(entry("moved", 130));
  CHECK(quarantine_left(latest_by_link(entries).begin()->second, 150) == Approx(80));
}

TEST_CASE("ledger: of one decision's two lines the evidence is kept, in whichever order and time they came", "[ledger]") {
  const LedgerEntry evidence = entry("fenced", 200.0001, "657 checksum mismatches");
  const LedgerEntry agreed = entry("fenced", 200.0002, std::string(kAgreedElsewhere));
  // Every file order, and the clock of either end ahead.
  for (const bool agreed_first : {false, true})
    for (const bool evidence_later : {false, true}) {
      CAPTURE(agreed_first, evidence_later);
      LedgerEntry ev = evidence, ag = agreed;
      if (evidence_later) std::swap(ev.time, ag.time);
      const std::vector<LedgerEntry> entries = agreed_first ? std::vector{ag, ev} : std::vector{ev, ag};
      const LedgerEntry e = latest_by_link(entries).begin()->second;
      CHECK(e.evidence == "657 checksum mismatches");
      CHECK(e.time == Approx(200.0002));
    }
  // A later decision of the same action, or another action, is not merged into an older one.
  std::vector<LedgerEntry> entries{evidence, entry("fenced", 400, std::string(kAgreedElsewhere))};
  CHECK(latest_by_link(entries).begin()->second.evidence == kAgreedElsewhere);
  entries = {entry("cleared", 200.0003, "cleared by ringfence-health ledger clear"), agreed};
  CHECK(latest_by_link(entries).begin()->second.action == "cleared");
}

TEST_CASE("ledger: endpoints are named by host and GPU, or by place on the host", "[ledger]") {
  std::vector<PeerInfo> peers(4);
  peers[0].host_id = "n1";
  peers[1].host_id = "n2";
  peers[2].host_id = "n1";
  peers[3].host_id = "n2";
  peers[3].gpu_bus_id = "0000:3b:00.0";
  const auto ids = endpoint_identities(peers);
  CHECK(ids == std::vector<std::string>{"n1/rank-on-host:0", "n2/rank-on-host:0", "n1/rank-on-host:1", "n2/gpu:0000:3b:00.0"});
}
