// StreamChoice: streaming slot writes chosen again while the job runs. The trial schedule (the
// same on every rank: it depends on the calls made, never on their times), the margin a trial
// must win by, which calls are compared, that ranks left on different kinds come together; on a
// communicator, that collectives stay exact across trials and which kind of store each call used
// around a trial (its links count their streamed writes).
#include <array>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <ringfence/communicator.hpp>
#include <vector>

#include "comm/stream_choice.hpp"
#include "comm/context.hpp"
#include "support/catch.hpp"
#include "support/link_decorator.hpp"
#include "support/temp_dir.hpp"
#include "support/thread_ranks.hpp"
#include "support/verifiable.hpp"

using namespace ringfence;
using detail::StreamChoice;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kMiB = 1024 * 1024;

// Collectives from..upto of one kind and size, each taking `took`, until one is planned as a
// trial: that call, not ended (a call that is no trial if none was).
StreamChoice::Call run_until_trial(StreamChoice& s, std::uint64_t from, std::uint64_t upto, std::chrono::nanoseconds took) {
  for (std::uint64_t seq = from; seq <= upto; ++seq) {
    const StreamChoice::Call c = s.begin(0, kMiB, seq);
    if (c.trial) return c;
    s.end(c, took);
  }
  return {};
}

// A link that counts the writes it makes with streaming stores (`WriteOp::stream`): what a test
// can see of the kind of store the engine chose for a call.
class StreamCountingLink final : public test::ForwardingLink {
 public:
  StreamCountingLink(std::unique_ptr<Link> inner, std::atomic<std::uint64_t>* streamed)
      : ForwardingLink(std::move(inner)), streamed_(streamed) {}
  Status write(const WriteOp& op) noexcept override {
    if (op.stream) ++*streamed_;
    return inner().write(op);
  }

 private:
  std::atomic<std::uint64_t>* streamed_;
};

// The trials a rank's log names, in order: {"collective #N", whether it switched}.
std::vector<std::pair<std::string, bool>> logged_trials(const std::filesystem::path& path) {
  std::ifstream f(path);
  std::vector<std::pair<std::string, bool>> found;
  for (std::string line; std::getline(f, line);) {
    const auto at = line.find("stream writes o");
    if (at == std::string::npos) continue;
    const auto c = line.find("collective #", at);
    if (c == std::string::npos) continue;
    const std::string rest = line.substr(c);
    found.emplace_back(rest.substr(0, rest.find(' ', std::string("collective #").size())), line.find(" tried them ", c) == std::string::npos);
  }
  return found;
}

}  // namespace

TEST_CASE("without auto, or for small calls, nothing is timed and the setup's choice stays", "[stream][stream_choice]") {
  StreamChoice s;
  s.start(true, false);
  for (std::uint64_t seq = 1; seq < 3000; ++seq) {
    const StreamChoice::Call c = s.begin(0, kMiB, seq);
    REQUIRE(c.stream);
    REQUIRE_FALSE(c.timed);
    REQUIRE_FALSE(c.trial);
  }
  s.start(false, true);
  for (std::uint64_t seq = 1; seq < 3000; ++seq) {
    const StreamChoice::Call c = s.begin(0, StreamChoice::kMinBytes - 1, seq);
    REQUIRE_FALSE(c.stream);
    REQUIRE_FALSE(c.timed);
    s.end(c, 1ns);
  }
  CHECK(s.switches() == 0);
}

TEST_CASE("a trial that beats the best recent call by the margin switches, one that does not keeps", "[stream][stream_choice]") {
  const bool initial = GENERATE(false, true);
  CAPTURE(initial);
  StreamChoice s;
  s.start(initial, true);
  // The first trial comes at kFirstTrial, on the kind the probe did not choose.
  StreamChoice::Call c = run_until_trial(s, 1, 5000, 100us);
  REQUIRE(c.trial);
  REQUIRE(c.seq == StreamChoice::kFirstTrial);
  REQUIRE(c.stream == !initial);
  // Not under kWin of the best (100 us): kept.
  StreamChoice kept = s;
  CHECK_FALSE(kept.end(c, 81us).switched);
  CHECK(kept.current() == initial);
  // Under it: switched, with both times for the log.
  const StreamChoice::Outcome o = s.end(c, 79us);
  REQUIRE(o.switched);
  CHECK(o.trial_ns == Approx(79000.0));
  CHECK(o.previous_ns == Approx(100000.0));
  CHECK(s.current() == !initial);
  CHECK(s.switches() == 1);
  // Calls now use the new kind; the next trial, kFirstTrial + 2 * kFirstTrial on, tries the
  // probe's kind again and loses against the faster calls since.
  const std::uint64_t next = StreamChoice::kFirstTrial + 2 * StreamChoice::kFirstTrial;
  REQUIRE(s.next_trial() == next);
  for (std::uint64_t seq = StreamChoice::kFirstTrial + 1; seq < next; ++seq) {
    c = s.begin(0, kMiB, seq);
    REQUIRE_FALSE(c.trial);
    REQUIRE(c.stream == !initial);
    s.end(c, 79us);
  }
  c = s.begin(0, kMiB, next);
  REQUIRE(c.trial);
  REQUIRE(c.stream == initial);
  CHECK_FALSE(s.end(c, 100us).switched);
  CHECK(s.current() == !initial);
}

TEST_CASE("trials compare like with like: the same kind, size and recent calls", "[stream][stream_choice]") {
  StreamChoice s;
  s.start(false, true);
  std::uint64_t seq = 1;
  for (; seq <= 3; ++seq) s.end(s.begin(0, kMiB, seq), 100us);
  for (; seq < StreamChoice::kFirstTrial; ++seq) s.end(s.begin(1, 4 * kMiB, seq), 400us);  // another kind and size
  // Three calls of kind 0 at 1 MiB are not enough to judge a trial by.
  StreamChoice::Call c = s.begin(0, kMiB, seq);
  CHECK_FALSE(c.trial);
  s.end(c, 100us);
  // Kind 1 has no 1.5 MiB calls yet (1 MiB up to 2 MiB share a size; its calls were 4 MiB).
  c = s.begin(1, 3 * kMiB / 2, ++seq);
  CHECK_FALSE(c.trial);
  s.end(c, 150us);
  // Its 4 MiB calls are the trial, judged per byte against those: 300 us beats 400 by the margin.
  c = s.begin(1, 4 * kMiB, ++seq);
  REQUIRE(c.trial);
  CHECK(c.stream);
  CHECK(s.end(c, 300us).switched);

  // Old calls do not judge: a size whose last kKeep calls are not all within kFresh
  // collectives waits until they are.
  StreamChoice stale;
  stale.start(false, true);
  for (seq = 1; seq <= 4; ++seq) stale.end(stale.begin(0, kMiB, seq), 100us);
  seq = StreamChoice::kFirstTrial + StreamChoice::kFresh;
  for (int k = 0; k < StreamChoice::kKeep; ++k, ++seq) {
    c = stale.begin(0, kMiB, seq);
    CHECK_FALSE(c.trial);  // the ring still holds a call from collective 4 or earlier
    stale.end(c, 100us);
  }
  CHECK(stale.begin(0, kMiB, seq).trial);
}

TEST_CASE("the trial schedule depends on the calls made, not on their times", "[stream][stream_choice]") {
  // Two ranks making the same calls, one fast and noisy, one slow: the same calls are trials.
  StreamChoice a, b;
  a.start(false, true);
  b.start(false, true);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> us(20, 400);
  std::vector<std::uint64_t> trials_a, trials_b;
  for (std::uint64_t seq = 1; seq < 40000; ++seq) {
    const std::size_t bytes = seq % 3 == 0 ? 64 * 1024 : seq % 3 == 1 ? kMiB : 16;
    const StreamChoice::Call ca = a.begin(static_cast<int>(seq % 2), bytes, seq), cb = b.begin(static_cast<int>(seq % 2), bytes, seq);
    if (ca.trial) trials_a.push_back(seq);
    if (cb.trial) trials_b.push_back(seq);
    a.end(ca, std::chrono::microseconds(us(rng)));
    b.end(cb, 1ms);
  }
  CHECK(trials_a == trials_b);
  REQUIRE(trials_a.size() >= 8);
  // Gaps double up to kMaxGap.
  CHECK(trials_a[0] == StreamChoice::kFirstTrial);
  for (std::size_t i = 1; i < trials_a.size(); ++i) CHECK(trials_a[i] - trials_a[i - 1] <= StreamChoice::kMaxGap + 3);
  CHECK(trials_a.back() - trials_a[trials_a.size() - 2] >= StreamChoice::kMaxGap);
}

TEST_CASE("ranks left on different kinds of store come together at a later trial", "[stream][stream_choice]") {
  // A host where streaming makes the exchange twice as fast, but only when both ranks stream.
  auto exchange = [](bool a, bool b) { return a && b ? 50us : 100us; };
  StreamChoice a, b;
  a.start(false, true);
  b.start(false, true);
  bool forced_apart = false;
  for (std::uint64_t seq = 1; seq < 20000; ++seq) {
    const StreamChoice::Call ca = a.begin(0, kMiB, seq), cb = b.begin(0, kMiB, seq);
    REQUIRE(ca.trial == cb.trial);
    if (ca.trial && !forced_apart) {
      // The first trial: rank a saw the gain, rank b's call was disturbed (its time counted
      // from a late start): a streams, b does not.
      forced_apart = true;
      REQUIRE(a.end(ca, exchange(ca.stream, cb.stream)).switched);
      REQUIRE_FALSE(b.end(cb, 200us).switched);
      continue;
    }
    a.end(ca, exchange(ca.stream, cb.stream));
    b.end(cb, exchange(ca.stream, cb.stream));
  }
  CHECK(a.current());
  CHECK(b.current());
}

TEST_CASE("collectives stay exact through the trials of stream writes, tried by every rank at the same call",
          "[stream][stream_choice][engine]") {
  test::TempDir dir("rf-stream-choice");
  CommOptions o;
  o.stream_writes = StreamWritesMode::Auto;
  o.host_id = "stream-choice";
  o.timeout = std::chrono::seconds(30);
  o.log_level = LogLevel::Debug;
  o.log_file = (dir.path() / "rank%r.log").string();
  std::atomic<std::size_t> wrong{0};
  const std::string error = test::run_ranks(2, o, [&](Communicator& comm) {
    constexpr std::size_t count = 32 * 1024;  // 128 KiB of floats: timed, trials among them
    std::vector<float> in(count), out(count), a(2 * count), b(2 * count);
    const auto n = static_cast<std::size_t>(comm.size()), r = static_cast<std::size_t>(comm.rank());
    const std::size_t block = 2 * count / n;
    for (int it = 0; it < static_cast<int>(StreamChoice::kFirstTrial) + 40; ++it) {
      const auto first = static_cast<std::size_t>(it);
      test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), comm.size(), in.data(), count, first);
      comm.allreduce(in.data(), out.data(), count, DataType::Float32, ReduceOp::Sum);
      wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, comm.size(), out.data(), count, first);
      // alltoall, 256 KiB a rank: timed too (its own kind of call).
      for (std::size_t j = 0; j < n; ++j) test::fill_pattern(DataType::Float32, comm.rank(), a.data() + j * block, block, (j * n + r) * block + first);
      comm.alltoall(a.data(), b.data(), block, DataType::Float32);
      for (std::size_t s = 0; s < n; ++s)
        wrong += test::count_wrong_pattern(DataType::Float32, static_cast<int>(s), b.data() + s * block, block, (r * n + s) * block + first);
    }
  });
  INFO(error);
  REQUIRE(error.empty());
  CHECK(wrong == 0);
  if (detail::online_cpus() < 2) return;  // no probe, nothing tried
  // Each trial is logged (at debug, or at info where it switched) with its collective number.
  const auto r0 = logged_trials(dir.path() / "rank0.log"), r1 = logged_trials(dir.path() / "rank1.log");
  REQUIRE_FALSE(r0.empty());
  CHECK(r0.size() == r1.size());
  for (std::size_t i = 0; i < std::min(r0.size(), r1.size()); ++i) CHECK(r0[i].first == r1[i].first);
}

TEST_CASE("a trial's call, and only it, runs on the trial's kind of store, and later calls on the kind chosen",
          "[stream][stream_choice][engine]") {
  // The links count their streamed writes, so the test sees each call's kind of store: every
  // call before the first trial on the setup's kind, the trial's call (collective #1024) on the
  // other one, and every later call on the setup's kind again unless the trial switched (then
  // on the new one). Dropping the lanes' update at a trial, or its undoing after, fails here.
  constexpr int n = 2;
  constexpr int calls = static_cast<int>(StreamChoice::kFirstTrial) + 64;  // one trial, none more before #3072
  test::TempDir dir("rf-stream-kinds");
  std::array<std::atomic<std::uint64_t>, n> streamed{};  // each rank's links count into its own
  const TransportRegistry builtin = builtin_transports();
  TransportRegistry registry;
  registry.add("shm", [&](const TransportContext& ctx) {
    std::atomic<std::uint64_t>* mine = &streamed[static_cast<std::size_t>(ctx.self.rank)];
    auto wrap = [mine](std::unique_ptr<Link> link) -> std::unique_ptr<Link> {
      return std::make_unique<StreamCountingLink>(std::move(link), mine);
    };
    return std::make_unique<test::LinkWrappingTransport<decltype(wrap)>>(builtin.create("shm", ctx), wrap);
  });
  CommOptions o;
  o.stream_writes = StreamWritesMode::Auto;
  o.transports = {"shm"};
  o.host_id = "stream-kinds";
  o.timeout = std::chrono::seconds(30);
  o.log_level = LogLevel::Debug;
  o.log_file = (dir.path() / "rank%r.log").string();
  std::array<std::vector<bool>, n> kinds;  // per call: whether it made streamed writes
  std::atomic<std::size_t> wrong{0};
  const std::string error = test::run_ranks(
      n, [&](int) { return o; },
      [&](Communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        constexpr std::size_t count = 256 * 1024;  // 1 MiB of floats: chunks far above the streaming threshold
        std::vector<float> in(count), out(count);
        for (int it = 0; it < calls; ++it) {
          const auto first = static_cast<std::size_t>(it);
          test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), n, in.data(), count, first);
          const std::uint64_t before = streamed[r].load();
          comm.allreduce(in.data(), out.data(), count, DataType::Float32, ReduceOp::Sum);
          kinds[r].push_back(streamed[r].load() > before);
          wrong += test::count_wrong(DataType::Float32, ReduceOp::Sum, n, out.data(), count, first);
        }
      },
      &registry);
  INFO(error);
  REQUIRE(error.empty());
  CHECK(wrong == 0);
  if (detail::online_cpus() < 2) return;  // no probe, nothing tried
  std::array<std::size_t, n> trial_call{};
  std::array<std::string, n> trial_logged;  // "collective #N"
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    const std::vector<bool>& k = kinds[static_cast<std::size_t>(r)];
    const auto trials = logged_trials(dir.path() / fmt::format("rank{}.log", r));
    REQUIRE(trials.size() == 1);
    const bool switched = trials[0].second;
    trial_logged[static_cast<std::size_t>(r)] = trials[0].first;
    // The trial's call: the first whose kind differs from the setup's (call 0's).
    std::size_t at = 0;
    while (at < k.size() && k[at] == k[0]) ++at;
    REQUIRE(at < k.size());
    CHECK(at >= static_cast<std::size_t>(StreamChoice::kFirstTrial) - 16);  // not before the first trial (setup makes a few collectives)
    trial_call[static_cast<std::size_t>(r)] = at;
    for (std::size_t i = at + 1; i < k.size(); ++i) {
      INFO("call " << i << ", trial at call " << at << (switched ? ", switched" : ", kept"));
      REQUIRE(k[i] == (switched ? k[at] : k[0]));
    }
  }
  // The same call is the trial on both ranks. What each adopts may differ (each judges its own
  // times; one left apart joins the other at a later trial), so their kinds after it may too.
  CHECK(trial_call[0] == trial_call[1]);
  CHECK(trial_logged[0] == trial_logged[1]);
}
