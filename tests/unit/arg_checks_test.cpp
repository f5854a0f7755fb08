// Argument checks (src/comm/arg_checks.hpp): pure, so tested without ranks or links. Each bad
// argument is refused with InvalidUsage naming the call, the argument and the rank; good ones
// return the bytes the call moves.
#include <cstdint>
#include <limits>
#include <ringfence/error.hpp>
#include <string>
#include <vector>

#include "comm/arg_checks.hpp"
#include "support/catch.hpp"

using namespace ringfence;
using ringfence::detail::ArgChecks;

namespace {
// The message of the InvalidUsage `f` throws ("" when it throws nothing).
template <class F>
std::string refusal(F f) {
  try {
    f();
  } catch (const InvalidUsage& e) {
    return e.what();
  }
  return {};
}
}  // namespace

TEST_CASE("arg checks: checked_bytes refuses overflow and invalid types", "[arg_checks]") {
  CHECK(detail::checked_bytes(3, DataType::Float32) == 12u);
  CHECK(detail::checked_bytes(3, DataType::Float64, 4) == 96u);
  CHECK(detail::checked_bytes(0, DataType::Int8) == 0u);
  CHECK(detail::checked_bytes(5, DataType::Int32, 0) == 0u);  // no blocks: nothing to move
  CHECK_FALSE(detail::checked_bytes(std::numeric_limits<std::size_t>::max() / 2, DataType::Float32).has_value());
  CHECK_FALSE(detail::checked_bytes(static_cast<std::size_t>(PTRDIFF_MAX) / 8 + 1, DataType::Float64).has_value());
  CHECK_FALSE(detail::checked_bytes(1, static_cast<DataType>(99)).has_value());
}

TEST_CASE("arg checks: the bytes each collective moves", "[arg_checks]") {
  const ArgChecks c(1, 4);
  std::vector<float> a(64), b(64);
  auto io = c.allreduce("allreduce", a.data(), b.data(), 16, DataType::Float32, ReduceOp::Sum);
  CHECK(io.in == 64);
  CHECK(io.out == 64);
  io = c.reduce_scatter("reduce_scatter", a.data(), b.data(), 4, DataType::Float32, ReduceOp::Sum);
  CHECK(io.in == 64);  // size() blocks in
  CHECK(io.out == 16);
  io = c.allgather("allgather", a.data(), b.data(), 4, DataType::Float32);
  CHECK(io.in == 16);
  CHECK(io.out == 64);
  io = c.broadcast("broadcast", nullptr, b.data(), 16, DataType::Float32, 0);  // not the root: no input
  CHECK(io.in == 0);
  CHECK(io.out == 64);
  io = c.reduce("reduce", a.data(), nullptr, 16, DataType::Float32, ReduceOp::Max, 0);  // not the root: no output
  CHECK(io.in == 64);
  CHECK(io.out == 0);
  io = c.alltoall("alltoall", a.data(), b.data(), 4, DataType::Float32);
  CHECK(io.in == 64);
  CHECK(io.out == 64);
  CHECK(c.p2p("send", a.data(), 5, DataType::Int64, 3) == 40);
}

TEST_CASE("arg checks: in-place forms are accepted, other overlaps refused", "[arg_checks]") {
  const ArgChecks c(2, 4);
  std::vector<std::int32_t> buf(64);
  // NCCL's in-place reduce-scatter: recv is block `rank` of send.
  CHECK_NOTHROW(c.reduce_scatter("reduce_scatter", buf.data(), buf.data() + 2 * 4, 4, DataType::Int32, ReduceOp::Sum));
  // ... and allgather: send is block `rank` of recv.
  CHECK_NOTHROW(c.allgather("allgather", buf.data() + 2 * 4, buf.data(), 4, DataType::Int32));
  CHECK_NOTHROW(c.allreduce("allreduce", buf.data(), buf.data(), 8, DataType::Int32, ReduceOp::Sum));
  const std::string bad = refusal([&] { c.allreduce("allreduce", buf.data(), buf.data() + 1, 8, DataType::Int32, ReduceOp::Sum); });
  CHECK(bad.find("rank 2: allreduce: sendbuff") != std::string::npos);
  CHECK(bad.find("overlap without being the in-place form (sendbuff == recvbuff") != std::string::npos);
  const std::string block =
      refusal([&] { c.reduce_scatter("reduce_scatter", buf.data(), buf.data() + 4, 4, DataType::Int32, ReduceOp::Sum); });
  CHECK(block.find("recvbuff == sendbuff + rank * recvcount elements") != std::string::npos);
  const std::string none = refusal([&] { c.alltoall("alltoall", buf.data(), buf.data(), 4, DataType::Int32); });
  CHECK(none.find("(none for this call)") != std::string::npos);
}

TEST_CASE("arg checks: bad arguments are named with the call and the rank", "[arg_checks]") {
  const ArgChecks c(3, 4);
  float x = 0;
  CHECK(refusal([&] { c.allreduce("allreduce", &x, &x, 1, static_cast<DataType>(77), ReduceOp::Sum); }) ==
        "rank 3: allreduce: invalid datatype value 77");
  CHECK(refusal([&] { c.allreduce("allreduce", &x, &x, 1, DataType::Float32, static_cast<ReduceOp>(9)); }) ==
        "rank 3: allreduce: invalid reduce op value 9");
  CHECK(refusal([&] { c.broadcast("broadcast", &x, &x, 1, DataType::Float32, 4); }) ==
        "rank 3: broadcast: root 4 is out of range [0, 4)");
  CHECK(refusal([&] { c.p2p("recv", &x, 1, DataType::Float32, -1); }) == "rank 3: recv: peer -1 is out of range [0, 4)");
  CHECK(refusal([&] { c.allreduce("allreduce", nullptr, &x, 1, DataType::Float32, ReduceOp::Sum); }) ==
        "rank 3: allreduce: sendbuff is null with 4 bytes to move");
  CHECK(refusal([&] { c.reduce("reduce", &x, nullptr, 1, DataType::Float32, ReduceOp::Sum, 3); }) ==
        "rank 3: reduce: recvbuff (on the root) is null with 4 bytes to move");
  CHECK(refusal([&] { c.reduce("reduce", &x, nullptr, 1, DataType::Float32, ReduceOp::Sum, 0); }).empty());  // not the root
  const std::string overflow =
      refusal([&] { c.alltoall("alltoall", &x, &x, std::numeric_limits<std::size_t>::max() / 8, DataType::Float32); });
  CHECK(overflow.find("rank 3: alltoall: count") != std::string::npos);
  CHECK(overflow.find("overflows the address space") != std::string::npos);
  // Null with nothing to move is fine (count 0).
  CHECK_NOTHROW(c.allgather("allgather", nullptr, nullptr, 0, DataType::Float32));
}

// ArgChecks::allreduce accepts the common call in one test and leaves everything else to the
// checks that name the argument: at the edges of that test both must give the same answer.
TEST_CASE("arg checks: allreduce's one-test path and the naming checks agree at its edges", "[arg_checks]") {
  const ArgChecks c(1, 2);
  std::vector<float> buf(32);
  float* const p = buf.data();
  // Accepted by the one test: the bytes are count x the type's size.
  CHECK(c.allreduce("allreduce", p, p + 16, 16, DataType::Float32, ReduceOp::Max).in == 64u);
  CHECK(c.allreduce("allreduce", p + 16, p, 16, DataType::Float32, ReduceOp::Avg).out == 64u);  // recv before send, touching
  CHECK(c.allreduce("allreduce", p, p, 32, DataType::Float32, ReduceOp::Sum).in == 128u);        // in place
  // Left to the naming checks, which accept it as well.
  CHECK(c.allreduce("allreduce", nullptr, nullptr, 0, DataType::Int8, ReduceOp::Sum).in == 0u);  // nothing to move
  // A count far beyond any real buffer that still fits the address space: accepted.
  const std::size_t past = (std::size_t{1} << 40) + 1;
  const auto* far_a = reinterpret_cast<const void*>(std::uintptr_t{1} << 20);
  const auto* far_b = reinterpret_cast<const void*>((std::uintptr_t{1} << 20) + past);
  CHECK(c.allreduce("allreduce", far_a, far_b, past, DataType::Uint8, ReduceOp::Sum).in == past);
  // Refused by them, each named: overlap from either side, overflow (one element past
  // PTRDIFF_MAX bytes, and a product that wraps), a null buffer, bad enums.
  CHECK(refusal([&] { c.allreduce("allreduce", p + 1, p, 16, DataType::Float32, ReduceOp::Sum); }).find("overlap") != std::string::npos);
  CHECK(refusal([&] { c.allreduce("allreduce", p, p + 15, 16, DataType::Float32, ReduceOp::Sum); }).find("overlap") != std::string::npos);
  const std::string overflow =
      refusal([&] { c.allreduce("allreduce", far_a, far_b, std::numeric_limits<std::size_t>::max() / 4, DataType::Float64, ReduceOp::Sum); });
  CHECK(overflow.find("rank 1: allreduce: count") != std::string::npos);
  CHECK(overflow.find("overflows the address space") != std::string::npos);
  const auto max_bytes = static_cast<std::size_t>(PTRDIFF_MAX);
  CHECK(detail::checked_bytes(max_bytes, DataType::Uint8) == max_bytes);
  CHECK_FALSE(detail::checked_bytes(max_bytes + 1, DataType::Uint8).has_value());
  CHECK_FALSE(detail::checked_bytes(std::numeric_limits<std::size_t>::max() / 3, DataType::Int32).has_value());  // wraps
  CHECK(refusal([&] { c.allreduce("allreduce", far_a, far_a, max_bytes + 1, DataType::Uint8, ReduceOp::Sum); }).find("overflows") !=
        std::string::npos);
  CHECK(refusal([&] { c.allreduce("allreduce", p, nullptr, 1, DataType::Float32, ReduceOp::Sum); }) ==
        "rank 1: allreduce: recvbuff is null with 4 bytes to move");
  CHECK(refusal([&] { c.allreduce("allreduce", p, p, 1, static_cast<DataType>(10), ReduceOp::Sum); }) ==
        "rank 1: allreduce: invalid datatype value 10");
  CHECK(refusal([&] { c.allreduce("allreduce", p, p, 1, DataType::Float32, static_cast<ReduceOp>(5)); }) ==
        "rank 1: allreduce: invalid reduce op value 5");
}
