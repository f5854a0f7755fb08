#include "call_check.hpp"

#include <cstddef>
#include <fmt/format.h>
#include <ringfence/crc32c.hpp>

namespace ringfence::detail {

std::string describe(const CallFingerprint& f) {
  using K = CallKind;
  const auto kind = static_cast<K>(f.collective);
  const char* name = kind == K::Allreduce       ? "allreduce"
                     : kind == K::ReduceScatter ? "reduce_scatter"
                     : kind == K::Allgather     ? "allgather"
                     : kind == K::Broadcast     ? "broadcast"
                     : kind == K::Reduce        ? "reduce"
                     : kind == K::Alltoall      ? "alltoall"
                     : kind == K::Barrier       ? "barrier"
                                                : "an unknown collective";
  if (kind == K::Barrier) return "barrier()";
  std::string out = fmt::format("{}(count={}, {}", name, f.count, to_string(static_cast<DataType>(f.type)));
  if (kind == K::Allreduce || kind == K::ReduceScatter || kind == K::Reduce) out += fmt::format(", {}", to_string(static_cast<ReduceOp>(f.op)));
  if (f.root >= 0) out += fmt::format(", root={}", f.root);
  return out + ")";
}

CallFingerprint make_fingerprint(CallKind kind, std::uint64_t count, DataType type, int op, int root) noexcept {
  CallFingerprint f;
  f.collective = static_cast<std::uint8_t>(kind);
  f.count = count;
  f.type = static_cast<std::uint8_t>(type);
  f.op = op < 0 ? std::uint8_t{0} : static_cast<std::uint8_t>(op);
  f.root = root;
  return f;
}

Status CallChecker::post(LaneState& lane0, CallFingerprint mine, std::uint64_t seq, Failure& failure,
                         std::span<const std::byte> carried) noexcept {
  prepare(mine, seq, carried);
  if (!from_) return Status::ok();
  RINGFENCE_TRY(post_fingerprint(lane0.engine, lane0.flags, lane0.left, lane0.right, lane0.relay_duties, to_.data(), to_.size(),
                                 check_.mine, failure, false, carried));
  check_.posted = true;
  return Status::ok();
}

void CallChecker::prepare(CallFingerprint mine, std::uint64_t seq, std::span<const std::byte> carried) noexcept {
  if (!from_) return;
  mine.sequence = seq;
  mine.carried = carried.empty() ? 0 : 1;
  mine.crc = crc32c(&mine, offsetof(CallFingerprint, crc));
  check_.from = from_;
  check_.mine = mine;
  check_.posted = false;
}

Status CallChecker::pair(LaneState& lane0, Failure& failure) noexcept {
  RINGFENCE_TRY(post_fingerprint(lane0.engine, lane0.flags, lane0.left, lane0.right, lane0.relay_duties, others_.data(), others_.size(),
                                 check_.mine, failure, true));
  check_.pairwise = true;
  return Status::ok();
}

Status CallChecker::settle(LaneState& lane0, Failure& failure) noexcept {
  if (!check_.from || check_.settled) return Status::ok();
  return settle_fingerprint(lane0.engine, lane0.flags, lane0.left, lane0.right, lane0.relay_duties, check_, failure);
}

CallChecker::Verdict CallChecker::judge(const FlagBlock& flags) noexcept {
  CallCheck& k = check_;
  if (!k.from) return {};
  if (!k.settled) read_fingerprint(flags, k);
  if (!k.settled) return {};
  if (k.intact && !k.disagree()) {  // the common verdict, without copying the fingerprints
    k.from = nullptr;
    return {};
  }
  Verdict v;
  v.from = k.from;
  v.mine = k.mine;
  v.theirs = k.theirs;
  k.from = nullptr;  // judged once
  if (!k.intact) {
    ++v.from->checksum_errors;
    k.damage_counted = true;
    v.kind = Verdict::Damaged;
  } else {  // intact and different (the agreeing case returned above)
    v.kind = Verdict::Disagree;
  }
  return v;
}

}  // namespace ringfence::detail
