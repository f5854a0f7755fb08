// Reduce-scatter, allgather, broadcast and reduce schedules, simulated for n = 1..16 with
// bounded message queues per ring link. Values carry their global element index (bits 20+) and
// the set of contributing ranks (bits 0..15), so the simulation proves that every element ends
// in the right place with every contribution exactly once, and that no schedule deadlocks.
#include <deque>
#include <functional>
#include <ringfence/schedule.hpp>
#include <vector>

#include "support/catch.hpp"

using namespace ringfence;

namespace {

using Vec = std::vector<std::uint64_t>;
constexpr std::uint64_t kMask = (std::uint64_t{1} << 20) - 1;
constexpr std::uint64_t value(std::size_t index, int rank) { return std::uint64_t{index} << 20 | std::uint64_t{1} << rank; }

std::uint64_t combine(std::uint64_t a, std::uint64_t b) {
  REQUIRE((a >> 20) == (b >> 20));  // same element
  REQUIRE((a & b & kMask) == 0);    // nobody contributes twice
  return a | b;
}

struct World {
  std::vector<Vec> in, out;
};

// Runs one schedule per rank (`make(rank)`), at most `slots` undelivered messages per directed
// link. `ring`: sends must go right and receives come from the left. Returns false on deadlock.
template <class Make>
bool simulate(int n, World& w, std::size_t slots, Make make, bool ring = true) {
  using Schedule = decltype(make(0));
  const auto un = static_cast<std::size_t>(n);
  std::vector<Schedule> sched;
  for (int r = 0; r < n; ++r) sched.push_back(make(r));
  std::vector<std::deque<Vec>> queue(un * un);  // queue[a * n + b]: a -> b
  auto link = [&](int a, int b) -> std::deque<Vec>& {
    REQUIRE(a >= 0);
    REQUIRE(b >= 0);
    REQUIRE(a < n);
    REQUIRE(b < n);
    REQUIRE(a != b);
    return queue[static_cast<std::size_t>(a) * un + static_cast<std::size_t>(b)];
  };
  std::vector<Step> pending(un);
  std::vector<bool> has(un, false), done(un, false);
  // RecvReduceSend consumes first (freeing the inbox slot), then waits for room to send.
  std::vector<Vec> outgoing(un);
  std::vector<bool> consumed(un, false);
  int finished = 0;
  while (finished < n) {
    bool progress = false;
    for (int r = 0; r < n; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      Vec& in = w.in[ur];
      Vec& out = w.out[ur];
      while (!done[ur]) {
        if (!has[ur]) {
          if (!sched[ur].next(pending[ur])) {
            done[ur] = true;
            ++finished;
            progress = true;
            break;
          }
          has[ur] = true;
        }
        const Step& s = pending[ur];
        REQUIRE(s.count > 0);
        auto in_at = [&](std::size_t i) -> std::uint64_t& {
          REQUIRE(s.offset + i < in.size());
          return in[s.offset + i];
        };
        auto out_at = [&](std::size_t i) -> std::uint64_t& {
          REQUIRE(s.out_offset + i < out.size());
          return out[s.out_offset + i];
        };
        if (s.kind == StepKind::CopyInput) {
          for (std::size_t i = 0; i < s.count; ++i) out_at(i) = in_at(i);
        } else if (s.kind == StepKind::ReduceInputAcc || s.kind == StepKind::ReduceInputAccLast) {
          for (std::size_t i = 0; i < s.count; ++i) out_at(i) = combine(in_at(i), out_at(i));
        } else if (is_send(s.kind)) {
          if (ring) REQUIRE(s.peer == (r + 1) % n);
          auto& q = link(r, s.peer);
          if (q.size() >= slots) break;
          Vec m(s.count);
          for (std::size_t i = 0; i < s.count; ++i) m[i] = s.kind == StepKind::SendInput ? in_at(i) : out_at(i);
          q.push_back(std::move(m));
        } else {
          if (ring) REQUIRE(s.peer == (r + n - 1) % n);
          if (s.kind == StepKind::RecvReduceSend && consumed[ur]) {
            if (ring) REQUIRE(s.to == (r + 1) % n);
            auto& q = link(r, s.to);
            if (q.size() >= slots) break;
            q.push_back(std::move(outgoing[ur]));
            consumed[ur] = false;
            has[ur] = false;
            progress = true;
            continue;
          }
          auto& q = link(s.peer, r);
          if (q.empty()) break;
          Vec m = std::move(q.front());
          q.pop_front();
          REQUIRE(m.size() == s.count);  // both ends agree on every message size
          switch (s.kind) {
            case StepKind::RecvCopy:
              for (std::size_t i = 0; i < s.count; ++i) out_at(i) = m[i];
              break;
            case StepKind::RecvReduceSend:
              for (std::size_t i = 0; i < s.count; ++i) m[i] = combine(m[i], in_at(i));
              outgoing[ur] = std::move(m);
              consumed[ur] = true;
              progress = true;
              continue;  // the same step, now waiting to send
            case StepKind::RecvReduceAcc:
            case StepKind::RecvReduceAccLast:
              for (std::size_t i = 0; i < s.count; ++i) out_at(i) = combine(m[i], out_at(i));
              break;
            default:
              for (std::size_t i = 0; i < s.count; ++i) out_at(i) = combine(m[i], in_at(i));
          }
        }
        has[ur] = false;
        progress = true;
      }
    }
    if (!progress) return false;
  }
  for (auto& q : queue) REQUIRE(q.empty());
  return true;
}

const std::size_t kCounts[] = {0, 1, 2, 5, 13, 64, 100};
const std::size_t kChunks[] = {1, 3, 16, std::size_t{1} << 20};
const std::size_t kSlots[] = {1, 4};

// One simulated configuration: `n` ranks, `count` elements (per block where the collective has
// blocks), a root for rooted collectives.
struct Config {
  int n;
  std::size_t count;
  int root;
};

// Simulates `make(config, rank)` for every n in [1, 16], count, chunk, slot count (and, with
// `rooted`, roots 0, n/2 and n-1): rank r's input element k is `input(config, r, k)` for
// k < in_len(config), its output has out_len(config) zeros, and afterwards output element j must
// equal `want(config, r, j)`. `ring`: peers must be the ring neighbours.
template <class Make, class Input, class Want>
void check_schedules(bool ring, bool rooted, std::size_t (*in_len)(const Config&), std::size_t (*out_len)(const Config&), Make make,
                     Input input, Want want) {
  for (int n = 1; n <= 16; ++n)
    for (int root : rooted ? std::vector<int>{0, n / 2, n - 1} : std::vector<int>{0})
      for (std::size_t count : kCounts)
        for (std::size_t chunk : kChunks)
          for (std::size_t slots : kSlots) {
            const Config c{n, count, root};
            INFO("n=" << n << " root=" << root << " count=" << count << " chunk=" << chunk << " slots=" << slots);
            const auto un = static_cast<std::size_t>(n);
            World w{std::vector<Vec>(un), std::vector<Vec>(un)};
            for (int r = 0; r < n; ++r) {
              for (std::size_t k = 0; k < in_len(c); ++k) w.in[static_cast<std::size_t>(r)].push_back(input(c, r, k));
              w.out[static_cast<std::size_t>(r)].assign(out_len(c), 0);
            }
            REQUIRE(simulate(n, w, slots, [&](int r) { return make(c, r, chunk); }, ring));
            for (int r = 0; r < n; ++r)
              for (std::size_t j = 0; j < out_len(c); ++j) REQUIRE(w.out[static_cast<std::size_t>(r)][j] == want(c, r, j));
          }
}

std::size_t count_of(const Config& c) { return c.count; }
std::size_t blocks_of(const Config& c) { return static_cast<std::size_t>(c.n) * c.count; }
std::uint64_t all_of(const Config& c) { return (std::uint64_t{1} << c.n) - 1; }
// Element k of every rank's input carries k (reductions).
std::uint64_t by_index(const Config&, int r, std::size_t k) { return value(k, r); }
// The reduction of every rank's element j.
std::uint64_t reduced(const Config& c, int, std::size_t j) { return std::uint64_t{j} << 20 | all_of(c); }

}  // namespace

TEST_CASE("ring reduce-scatter schedule: rank r ends with block r reduced over all ranks", "[schedule]") {
  check_schedules(
      true, false, blocks_of, count_of,
      [](const Config& c, int r, std::size_t chunk) { return RingReduceScatterSchedule(r, c.n, c.count, chunk); }, by_index,
      [](const Config& c, int r, std::size_t j) { return reduced(c, r, static_cast<std::size_t>(r) * c.count + j); });
}

TEST_CASE("ring allgather schedule: every rank ends with every block in place", "[schedule]") {
  check_schedules(
      true, false, count_of, blocks_of,
      [](const Config& c, int r, std::size_t chunk) { return RingAllgatherSchedule(r, c.n, c.count, chunk); },
      [](const Config& c, int r, std::size_t k) { return value(static_cast<std::size_t>(r) * c.count + k, r); },
      [](const Config& c, int, std::size_t j) { return value(j, static_cast<int>(j / std::max<std::size_t>(c.count, 1))); });
}

TEST_CASE("chain broadcast schedule: every rank ends with the root's data, nobody reads another input", "[schedule]") {
  check_schedules(
      true, true, count_of, count_of,
      [](const Config& c, int r, std::size_t chunk) { return ChainBroadcastSchedule(r, c.n, c.root, c.count, chunk); },
      [](const Config& c, int r, std::size_t k) { return r == c.root ? value(k, r) : ~std::uint64_t{0}; },  // poison elsewhere
      [](const Config& c, int, std::size_t j) { return value(j, c.root); });
}

TEST_CASE("chain reduce schedule: the root ends with every contribution, others' outputs untouched", "[schedule]") {
  check_schedules(
      true, true, count_of, count_of,
      [](const Config& c, int r, std::size_t chunk) { return ChainReduceSchedule(r, c.n, c.root, c.count, chunk); }, by_index,
      [](const Config& c, int r, std::size_t j) { return r == c.root ? reduced(c, r, j) : 0; });
}

TEST_CASE("ring schedules send n-1 messages per chunk on every link (relays count them)", "[schedule]") {
  // Reduce-scatter: every rank sends n-1 messages per chunk (the first from its input, the
  // rest as partial results); sends_of counts both kinds.
  for (int n = 2; n <= 8; ++n) {
    RingReduceScatterSchedule s(1 % n, n, 10, 3);
    int sends = 0, recvs = 0;
    for (Step st; s.next(st);) {
      sends += sends_of(st.kind);
      recvs += is_recv(st.kind) ? 1 : 0;
    }
    REQUIRE(sends == (n - 1) * 4);
    REQUIRE(recvs == (n - 1) * 4);
  }
}

TEST_CASE("double binary tree: every rank has at most two children and each tree spans all ranks", "[schedule][tree]") {
  for (int n = 1; n <= 64; ++n)
    for (int t = 0; t < 2; ++t) {
      INFO("n=" << n << " tree=" << t);
      int roots = 0;
      for (int r = 0; r < n; ++r) {
        const TreeNode nd = double_tree_node(t, r, n);
        if (nd.parent < 0) ++roots;
        for (int c : nd.child)
          if (c >= 0) REQUIRE(double_tree_node(t, c, n).parent == r);  // children and parents agree
        // Walking up reaches the root within ceil(log2 n) + 1 hops (no cycles, shallow).
        int hops = 0;
        for (int v = r; double_tree_node(t, v, n).parent >= 0; v = double_tree_node(t, v, n).parent) REQUIRE(++hops <= 8);
      }
      REQUIRE(roots == 1);
    }
}

TEST_CASE("double binary tree allreduce schedule: every element reduced once, identical everywhere", "[schedule][tree]") {
  check_schedules(
      false, false, count_of, count_of,
      [](const Config& c, int r, std::size_t chunk) { return DoubleTreeAllreduceSchedule(r, c.n, c.count, chunk); }, by_index,
      reduced);
}

TEST_CASE("direct allreduce schedule: every element reduced once, identical everywhere", "[schedule][direct]") {
  check_schedules(
      false, false, count_of, count_of,
      [](const Config& c, int r, std::size_t chunk) { return DirectAllreduceSchedule(r, c.n, c.count, chunk); }, by_index,
      reduced);
}

TEST_CASE("one-shot allreduce schedule: every element reduced once, identical everywhere", "[schedule][oneshot]") {
  check_schedules(
      false, false, count_of, count_of,
      [](const Config& c, int r, std::size_t chunk) { return OneShotAllreduceSchedule(r, c.n, c.count, chunk); }, by_index,
      reduced);
}

TEST_CASE("reduce-scatter and allgather schedules of a channel's slice step through every block by the stride",
          "[schedule][channels]") {
  // A channel moves elements [lo, lo + count) of each block of `stride` elements: every offset
  // into the blocked buffer must be block * stride + (something below count), and with the
  // stride equal to the count the steps are exactly the unsliced schedule's.
  for (int n : {2, 3, 5})
    for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{40}}) {
      const std::size_t stride = count + 13;
      for (int r = 0; r < n; ++r) {
        RingReduceScatterSchedule rs(r, n, count, 4, stride), rs_plain(r, n, count, 4), rs_same(r, n, count, 4, count);
        Step a, b, c;
        while (rs.next(a)) {
          REQUIRE(rs_plain.next(b));
          REQUIRE(rs_same.next(c));
          REQUIRE(a.kind == b.kind);
          REQUIRE(a.offset / stride == b.offset / count);  // the same block
          REQUIRE(a.offset % stride == b.offset % count);  // the same place in it
          REQUIRE(a.out_offset == b.out_offset);           // the output holds one block
          REQUIRE((c.offset == b.offset && c.out_offset == b.out_offset && c.kind == b.kind));
        }
        REQUIRE_FALSE(rs_plain.next(b));
        RingAllgatherSchedule ag(r, n, count, 4, stride), ag_plain(r, n, count, 4);
        while (ag.next(a)) {
          REQUIRE(ag_plain.next(b));
          REQUIRE(a.kind == b.kind);
          REQUIRE(a.offset == b.offset);  // the input holds one block
          REQUIRE(a.out_offset / stride == b.out_offset / count);
          REQUIRE(a.out_offset % stride == b.out_offset % count);
        }
        REQUIRE_FALSE(ag_plain.next(b));
      }
    }
}
