// Ring allreduce schedules, checked by simulating every rank's steps with bounded message
// queues. Values are bit masks of contributing ranks, so the simulation proves that every
// element of every rank ends holding every rank's contribution exactly once.
#include <deque>
#include <ringfence/schedule.hpp>
#include <vector>

#include "support/catch.hpp"

using namespace ringfence;

namespace {

struct Msg {
  std::size_t count;
  std::vector<std::uint64_t> data;
};

struct SimResult {
  std::vector<std::vector<std::uint64_t>> out;  // per rank
  std::size_t finals = 0;                       // elements produced by RecvReduceLast, all ranks
  std::size_t copies = 0;                       // elements received as final values, all ranks
  bool deadlock = false;
};

// Runs `n` schedules with at most `slots` undelivered messages per directed link. With
// `direct`, a SendFinal also writes straight into the receiver's output at send time (as the
// executor's direct-write path does), so an overwrite of data the receiver still needs shows up
// as a double contribution. `reverse` changes the order ranks are stepped in.
SimResult simulate(int n, std::size_t count, std::size_t chunk, std::size_t slots, bool direct = false, bool reverse = false) {
  std::vector<RingAllreduceSchedule> sched;
  std::vector<std::vector<std::uint64_t>> in(n), out(n);
  for (int r = 0; r < n; ++r) {
    sched.emplace_back(r, n, count, chunk);
    in[r].assign(count, std::uint64_t{1} << r);
    out[r].assign(count, 0);
  }
  std::vector<std::deque<Msg>> queue(n);  // queue[r]: messages from rank r to rank r+1
  std::vector<Step> pending(n);
  std::vector<bool> has_pending(n, false), done(n, false);
  SimResult res;
  int finished = 0;
  while (finished < n) {
    bool progress = false;
    for (int rr = 0; rr < n; ++rr) {
      const int r = reverse ? n - 1 - rr : rr;
      while (!done[r]) {
        if (!has_pending[r]) {
          if (!sched[r].next(pending[r])) {
            done[r] = true;
            ++finished;
            progress = true;
            break;
          }
          has_pending[r] = true;
        }
        Step& s = pending[r];
        REQUIRE(s.count > 0);
        REQUIRE(s.offset + s.count <= count);
        if (s.kind == StepKind::CopyInput) {
          for (std::size_t i = 0; i < s.count; ++i) out[r][s.offset + i] = in[r][s.offset + i];
        } else if (is_send(s.kind)) {
          REQUIRE(s.peer == (r + 1) % n);
          if (queue[r].size() >= slots) break;  // no credit: blocked
          const auto& src = s.kind == StepKind::SendInput ? in[r] : out[r];
          if (s.kind == StepKind::SendFinal)  // only final values may go straight to a peer's output
            for (std::size_t i = 0; i < s.count; ++i) REQUIRE(out[r][s.offset + i] == (std::uint64_t{1} << n) - 1);
          queue[r].push_back(Msg{s.count, {src.begin() + s.offset, src.begin() + s.offset + s.count}});
          if (direct && s.kind == StepKind::SendFinal)
            for (std::size_t i = 0; i < s.count; ++i) out[(r + 1) % n][s.offset + i] = src[s.offset + i];
        } else {
          const int left = (r + n - 1) % n;
          REQUIRE(s.peer == left);
          if (queue[left].empty()) break;  // no data yet: blocked
          Msg m = std::move(queue[left].front());
          queue[left].pop_front();
          REQUIRE(m.count == s.count);  // both ends agree on every message size
          for (std::size_t i = 0; i < s.count; ++i) {
            auto& dst = out[r][s.offset + i];
            if (s.kind == StepKind::RecvCopy) {
              if (direct) REQUIRE(dst == m.data[i]);  // already written by the sender
              dst = m.data[i];
            } else {
              REQUIRE((m.data[i] & in[r][s.offset + i]) == 0);  // nobody contributes twice
              dst = m.data[i] | in[r][s.offset + i];
            }
          }
          if (s.kind == StepKind::RecvReduceLast) res.finals += s.count;
          if (s.kind == StepKind::RecvCopy) res.copies += s.count;
        }
        has_pending[r] = false;
        progress = true;
      }
    }
    if (!progress) {
      res.deadlock = true;
      break;
    }
  }
  for (int r = 0; r < n; ++r) REQUIRE(queue[r].empty());
  res.out = std::move(out);
  return res;
}

}  // namespace

TEST_CASE("split covers the range with near-equal parts", "[schedule]") {
  for (std::size_t count : {0u, 1u, 5u, 7u, 64u, 1001u})
    for (std::size_t parts = 1; parts <= 9; ++parts) {
      std::size_t next = 0;
      for (std::size_t i = 0; i < parts; ++i) {
        const Range r = split(count, parts, i);
        REQUIRE(r.begin == next);
        REQUIRE((r.count == count / parts || r.count == count / parts + 1));
        next += r.count;
      }
      REQUIRE(next == count);
    }
}

TEST_CASE("ring allreduce schedule reduces every element exactly once on every rank", "[schedule]") {
  const std::size_t counts[] = {0, 1, 2, 3, 7, 8, 13, 31, 64, 97, 256, 1000};
  for (int n = 1; n <= 9; ++n)
    for (std::size_t count : counts)
      for (std::size_t chunk : {std::size_t{1}, std::size_t{3}, std::size_t{16}, std::size_t{1} << 20})
        for (std::size_t slots : {std::size_t{1}, std::size_t{4}})
          for (int mode = 0; mode < 4; ++mode) {
          const bool direct = mode & 1, reverse = mode & 2;
          INFO("n=" << n << " count=" << count << " chunk=" << chunk << " slots=" << slots << " direct=" << direct
                    << " reverse=" << reverse);
          const SimResult res = simulate(n, count, chunk, slots, direct, reverse);
          REQUIRE_FALSE(res.deadlock);
          const std::uint64_t all = (std::uint64_t{1} << n) - 1;
          for (int r = 0; r < n; ++r)
            for (std::size_t i = 0; i < count; ++i) REQUIRE(res.out[r][i] == all);
          // Each element is finished exactly once (by its segment's last rank), then copied.
          if (n > 1) REQUIRE(res.finals == count);
          if (n > 1) REQUIRE(res.copies == count * static_cast<std::size_t>(n - 1));
        }
}

TEST_CASE("ring allreduce schedule sends to the right and receives from the left", "[schedule]") {
  RingAllreduceSchedule s(2, 5, 100, 7);
  REQUIRE(s.left() == 1);
  REQUIRE(s.right() == 3);
  REQUIRE(s.chunks() == 3);  // segment of 20 elements in chunks of 7
  Step step;
  std::size_t sends = 0, recvs = 0;
  while (s.next(step)) {
    if (is_send(step.kind)) {
      ++sends;
      REQUIRE(step.peer == 3);
    } else {
      ++recvs;
      REQUIRE(step.peer == 1);
    }
    REQUIRE(step.count <= 7);
  }
  REQUIRE(sends == recvs);
  REQUIRE(sends == 3 * 2 * 4);  // chunks x 2(n-1) phases
}

TEST_CASE("single-rank schedule is one local copy, empty for count 0", "[schedule]") {
  RingAllreduceSchedule s(0, 1, 10, 4);
  Step step;
  REQUIRE(s.next(step));
  REQUIRE(step.kind == StepKind::CopyInput);
  REQUIRE(step.count == 10);
  REQUIRE_FALSE(s.next(step));
  RingAllreduceSchedule empty(0, 1, 0, 4);
  REQUIRE_FALSE(empty.next(step));
}
