// The stream-ordered calls (src/device_staging.cpp) on thread ranks over the fake CUDA runtime
// of fake_cudart_streams.cpp, whose streams are threads: a call returns before its stream ran,
// the result lands only when the stream reaches it, several calls may be in flight, and a
// stream that never gets there, abort(), or a missing runtime end in clear errors, never a hang.
// The fake runs the host functions of all streams on one thread, as CUDA may: thread ranks in
// one process (every test here) would deadlock if a call's progress needed another call's host
// function.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ringfence/ringfence.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/thread_ranks.hpp"
#include "fake_device.hpp"
#include "support/verifiable.hpp"

extern "C" {
int cudaStreamSynchronize(void*);
void fake_cuda_hold(void*, int);
int fake_cuda_pinned_live();
}

using namespace ringfence;
using test::DeviceBuffer;
using test::Stream;
using Clock = std::chrono::steady_clock;

using test::staged_options;

TEST_CASE("a stream-ordered allreduce returns before its stream runs and lands when it does", "[device]") {
  const int n = 3;
  const std::size_t count = 10007;
  const int pinned_before = fake_cuda_pinned_live();
  const std::string err = test::run_ranks(n, staged_options(), [&](Communicator& comm) {
    const std::size_t bytes = count * sizeof(float);
    std::vector<float> host(count), back(count, -1.0f);
    test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), n, host.data(), count);
    DeviceBuffer send(bytes), recv(bytes);
    T_CHECK(cudaMemcpy(send.p, host.data(), bytes, 1) == 0);
    std::vector<float> sentinel(count, -7.0f);
    T_CHECK(cudaMemcpy(recv.p, sentinel.data(), bytes, 1) == 0);
    Stream stream;
    fake_cuda_hold(stream.s, 1);
    comm.allreduce(send.p, recv.p, count, DataType::Float32, ReduceOp::Sum, stream.handle());
    // The stream is held: nothing was copied, the output is untouched.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    T_CHECK(std::memcmp(recv.p, sentinel.data(), bytes) == 0);
    fake_cuda_hold(stream.s, 0);
    T_CHECK(cudaStreamSynchronize(stream.s) == 0);
    T_CHECK(test::count_wrong(DataType::Float32, ReduceOp::Sum, n, recv.p, count) == 0);
    T_CHECK(comm.async_error().is_ok());
    T_CHECK(comm.device_staging_bytes() >= 2 * bytes);
    T_CHECK(fake_cuda_pinned_live() > pinned_before);
  });
  REQUIRE(err == "");
  // The communicators are gone: their staging went back (cudaFreeHost) with them.
  REQUIRE(fake_cuda_pinned_live() == pinned_before);
}

TEST_CASE("stream-ordered collectives are exact for every dtype and op, in place too", "[device]") {
  const int n = 3;
  const std::size_t count = 1001;
  const std::string err = test::run_ranks(n, staged_options(), [&](Communicator& comm) {
    Stream stream;
    test::allreduce_every_type_and_op(comm, stream, count);
  });
  REQUIRE(err == "");
}

TEST_CASE("many stream-ordered calls in flight on one stream reuse a bounded staging pool", "[device]") {
  const int n = 2;
  const std::size_t count = 4096, calls = 24;
  CommOptions o = staged_options();
  o.device_staging_slots = 3;
  const std::string err = test::run_ranks(n, o, [&](Communicator& comm) {
    Stream stream;
    std::vector<std::unique_ptr<DeviceBuffer>> bufs;
    std::vector<std::int32_t> host(count);
    for (std::size_t c = 0; c < calls; ++c) {
      bufs.push_back(std::make_unique<DeviceBuffer>(count * 4));
      for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<std::int32_t>(c * 1000 + i + static_cast<std::size_t>(comm.rank()));
      T_CHECK(cudaMemcpy(bufs.back()->p, host.data(), count * 4, 1) == 0);
    }
    fake_cuda_hold(stream.s, 1);
    // Three calls fit the pool while the stream is held; the fourth would wait for a slot.
    for (std::size_t c = 0; c < 3; ++c) comm.allreduce(bufs[c]->p, bufs[c]->p, count, DataType::Int32, ReduceOp::Sum, stream.handle());
    fake_cuda_hold(stream.s, 0);
    for (std::size_t c = 3; c < calls; ++c)
      comm.allreduce(bufs[c]->p, bufs[c]->p, count, DataType::Int32, ReduceOp::Sum, stream.handle());
    T_CHECK(cudaStreamSynchronize(stream.s) == 0);
    for (std::size_t c = 0; c < calls; ++c) {
      const auto* p = static_cast<const std::int32_t*>(bufs[c]->p);
      for (std::size_t i = 0; i < count; ++i)
        if (p[i] != static_cast<std::int32_t>(2 * (c * 1000 + i) + 1)) throw std::runtime_error(fmt::format("call {} element {} wrong", c, i));
    }
    T_CHECK(comm.device_staging_bytes() <= 3 * (2 * count * 4 + 256));
  });
  REQUIRE(err == "");
}

TEST_CASE("a stream that never reaches a call's input copy times out instead of hanging", "[device][failure]") {
  const int n = 2;
  std::vector<std::string> seen(n);
  const auto start = Clock::now();
  const std::string err = test::run_ranks(n, staged_options(std::chrono::milliseconds(500)), [&](Communicator& comm) {
    Stream stream;
    DeviceBuffer buf(4096);
    if (comm.rank() == 1) fake_cuda_hold(stream.s, 1);  // rank 1's stream is stuck behind "earlier work"
    comm.allreduce(buf.p, buf.p, 1024, DataType::Float32, ReduceOp::Sum, stream.handle());
    for (int i = 0; i < 400 && comm.async_error().is_ok(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    seen[static_cast<std::size_t>(comm.rank())] = std::string(to_string(comm.async_error().code()));
    try {
      comm.allreduce(buf.p, buf.p, 1024, DataType::Float32, ReduceOp::Sum, stream.handle());
      seen[static_cast<std::size_t>(comm.rank())] += " / next call accepted";
    } catch (const Error& e) {
      seen[static_cast<std::size_t>(comm.rank())] += std::string(" / ") + e.what();
    }
    fake_cuda_hold(stream.s, 0);
    T_CHECK(cudaStreamSynchronize(stream.s) == 0);
  });
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  INFO(seen[0] << "\n" << seen[1]);
  REQUIRE(err == "");
  REQUIRE(secs < 5.0);
  REQUIRE(seen[1].find("timeout") == 0);
  REQUIRE(seen[1].find("rank 1: allreduce on a CUDA stream: the copy of the input to host staging did not finish") != std::string::npos);
  REQUIRE(seen[0].find("next call accepted") == std::string::npos);  // rank 0 failed too, and says so
  REQUIRE(seen[0].find("rank 1") != std::string::npos);
}

TEST_CASE("abort() ends a call waiting for its stream at once", "[device][failure]") {
  const std::string err = test::run_ranks(1, staged_options(std::chrono::seconds(30)), [&](Communicator& comm) {
    Stream stream;
    DeviceBuffer buf(4096);
    fake_cuda_hold(stream.s, 1);
    comm.allreduce(buf.p, buf.p, 1024, DataType::Float32, ReduceOp::Sum, stream.handle());
    const auto t0 = Clock::now();
    comm.abort();
    while (comm.async_error().is_ok() && Clock::now() - t0 < std::chrono::seconds(5)) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    T_CHECK(comm.async_error().code() == ErrorCode::Aborted);
    fake_cuda_hold(stream.s, 0);
    T_CHECK(cudaStreamSynchronize(stream.s) == 0);  // the stream's host functions return: no hang
    T_CHECK(Clock::now() - t0 < std::chrono::seconds(2));
  });
  REQUIRE(err == "");
}

TEST_CASE("stream-ordered calls without a usable CUDA runtime fail with CudaError naming the rank", "[device]") {
  CommOptions o = staged_options();
  o.cuda_runtime = "/nonexistent/libcudart.so.13";
  std::string msg;
  const std::string err = test::run_ranks(1, o, [&](Communicator& comm) {
    std::vector<float> buf(16);
    try {
      comm.allreduce(buf.data(), buf.data(), 16, DataType::Float32, ReduceOp::Sum, CudaStream{});
      msg = "no error";
    } catch (const CudaError& e) {
      msg = e.what();
    }
  });
  REQUIRE(err == "");
  REQUIRE(msg.find("rank 0: allreduce on a CUDA stream: no usable CUDA runtime: no CUDA runtime library (tried /nonexistent/libcudart.so.13)") ==
          0);

  // A runtime without a driver, as on the CI machines.
  ::setenv("FAKE_CUDA_DEVICES", "driver", 1);
  const std::string err2 = test::run_ranks(1, staged_options(), [&](Communicator& comm) {
    std::vector<float> buf(16);
    try {
      comm.allgather(buf.data(), buf.data(), 16, DataType::Float32, CudaStream{});
      msg = "no error";
    } catch (const CudaError& e) {
      msg = e.what();
    }
  });
  ::unsetenv("FAKE_CUDA_DEVICES");
  REQUIRE(err2 == "");
  REQUIRE(msg.find("rank 0: allgather on a CUDA stream: no usable CUDA runtime: cudaGetDeviceCount failed: CUDA driver version is "
                   "insufficient") == 0);
  REQUIRE(msg.find("(code 35)") != std::string::npos);
}

TEST_CASE("stream-ordered calls check their arguments like the host calls", "[device]") {
  std::vector<std::string> msgs;
  const std::string err = test::run_ranks(2, staged_options(), [&](Communicator& comm) {
    if (comm.rank() != 1) {
      comm.barrier();
      return;
    }
    std::vector<float> buf(64);
    auto expect = [&](auto call) {
      try {
        call();
        msgs.push_back("no error");
      } catch (const InvalidUsage& e) {
        msgs.push_back(e.what());
      }
    };
    expect([&] { comm.allreduce(buf.data(), nullptr, 16, DataType::Float32, ReduceOp::Sum, CudaStream{}); });
    expect([&] { comm.broadcast(buf.data(), buf.data(), 16, DataType::Float32, 2, CudaStream{}); });
    expect([&] { comm.alltoall(buf.data(), buf.data() + 1, 8, DataType::Float32, CudaStream{}); });
    expect([&] { comm.reduce(buf.data(), buf.data(), 4, DataType::Float32, static_cast<ReduceOp>(9), 0, CudaStream{}); });
    comm.barrier();
  });
  REQUIRE(err == "");
  REQUIRE(msgs.size() == 4);
  CHECK(msgs[0] == "rank 1: allreduce: recvbuff is null with 64 bytes to move");
  CHECK(msgs[1] == "rank 1: broadcast: root 2 is out of range [0, 2)");
  CHECK(msgs[2].find("rank 1: alltoall: sendbuff") == 0);
  CHECK(msgs[3].find("rank 1: reduce:") == 0);
}

// ---- stream-ordered send/recv -------------------------------------------------------------

namespace {
std::uint8_t p2p_byte(int from, int to, std::size_t i) { return static_cast<std::uint8_t>(i * 7 + static_cast<std::size_t>(from) * 31 + static_cast<std::size_t>(to) * 3 + 1); }
}  // namespace

TEST_CASE("stream-ordered send/recv: a ring exchange in one group returns before its stream runs and lands when it does",
          "[device][p2p]") {
  const int n = 3;
  const std::size_t bytes = 70001;  // a few chunks, not a multiple of anything
  const std::string err = test::run_ranks(n, staged_options(), [&](Communicator& comm) {
    const int r = comm.rank(), right = (r + 1) % n, left = (r + n - 1) % n;
    DeviceBuffer to_right(bytes), to_left(bytes), from_left(bytes), from_right(bytes);
    std::vector<std::uint8_t> host(bytes), sentinel(bytes, 0xee), back(bytes);
    for (std::size_t i = 0; i < bytes; ++i) host[i] = p2p_byte(r, right, i);
    T_CHECK(cudaMemcpy(to_right.p, host.data(), bytes, 1) == 0);
    for (std::size_t i = 0; i < bytes; ++i) host[i] = p2p_byte(r, left, i);
    T_CHECK(cudaMemcpy(to_left.p, host.data(), bytes, 1) == 0);
    T_CHECK(cudaMemcpy(from_left.p, sentinel.data(), bytes, 1) == 0);
    T_CHECK(cudaMemcpy(from_right.p, sentinel.data(), bytes, 1) == 0);
    Stream stream;
    fake_cuda_hold(stream.s, 1);
    comm.group_start();
    comm.send(to_right.p, bytes, DataType::Uint8, right, stream.handle());
    comm.recv(from_left.p, bytes, DataType::Uint8, left, stream.handle());
    comm.send(to_left.p, bytes / 2, DataType::Uint8, left, stream.handle());
    comm.recv(from_right.p, bytes / 2, DataType::Uint8, right, stream.handle());
    comm.group_end();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    T_CHECK(std::memcmp(from_left.p, sentinel.data(), bytes) == 0);  // held stream: nothing landed
    fake_cuda_hold(stream.s, 0);
    T_CHECK(cudaStreamSynchronize(stream.s) == 0);
    T_CHECK(cudaMemcpy(back.data(), from_left.p, bytes, 2) == 0);
    for (std::size_t i = 0; i < bytes; ++i)
      if (back[i] != p2p_byte(left, r, i)) throw std::runtime_error(fmt::format("rank {}: byte {} from the left is wrong", r, i));
    T_CHECK(cudaMemcpy(back.data(), from_right.p, bytes, 2) == 0);
    for (std::size_t i = 0; i < bytes; ++i) {
      const std::uint8_t want = i < bytes / 2 ? p2p_byte(right, r, i) : 0xee;  // only half was sent back
      if (back[i] != want) throw std::runtime_error(fmt::format("rank {}: byte {} from the right is wrong", r, i));
    }
    T_CHECK(comm.async_error().is_ok());
  });
  REQUIRE(err == "");
}

TEST_CASE("stream-ordered send/recv outside a group, and to ourselves inside one", "[device][p2p]") {
  const std::size_t count = 5000;
  const std::string err = test::run_ranks(2, staged_options(), [&](Communicator& comm) {
    Stream stream;
    DeviceBuffer a(count * 4), b(count * 4);
    std::vector<std::int32_t> host(count), back(count);
    for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<std::int32_t>(i) * (comm.rank() + 2) - 77;
    T_CHECK(cudaMemcpy(a.p, host.data(), count * 4, 1) == 0);
    if (comm.rank() == 0) {
      comm.send(a.p, count, DataType::Int32, 1, stream.handle());
    } else {
      comm.recv(b.p, count, DataType::Int32, 0, stream.handle());
    }
    T_CHECK(cudaStreamSynchronize(stream.s) == 0);
    if (comm.rank() == 1) {
      T_CHECK(cudaMemcpy(back.data(), b.p, count * 4, 2) == 0);
      for (std::size_t i = 0; i < count; ++i) T_CHECK(back[i] == static_cast<std::int32_t>(i) * 2 - 77);
    }
    // Ourselves: a send and its receive in one group.
    comm.group_start();
    comm.send(a.p, count, DataType::Int32, comm.rank(), stream.handle());
    comm.recv(b.p, count, DataType::Int32, comm.rank(), stream.handle());
    comm.group_end();
    T_CHECK(cudaStreamSynchronize(stream.s) == 0);
    T_CHECK(cudaMemcpy(back.data(), b.p, count * 4, 2) == 0);
    T_CHECK(back == host);
    T_CHECK(comm.async_error().is_ok());
  });
  REQUIRE(err == "");
}

TEST_CASE("stream-ordered send/recv: one stream and one kind per group, arguments checked like the host calls", "[device][p2p]") {
  const std::string err = test::run_ranks(2, staged_options(), [&](Communicator& comm) {
    Stream s1, s2;
    DeviceBuffer buf(256);
    std::vector<std::byte> host(256);
    const int peer = 1 - comm.rank();
    auto message = [](auto&& f) -> std::string {
      try {
        f();
      } catch (const InvalidUsage& e) {
        return e.what();
      }
      return "no error";
    };
    comm.group_start();
    comm.send(buf.p, 16, DataType::Uint8, peer, s1.handle());
    T_CHECK(message([&] { comm.recv(buf.p, 16, DataType::Uint8, peer, s2.handle()); }).find("differs from stream") != std::string::npos);
    T_CHECK(message([&] { comm.send(host.data(), 16, DataType::Uint8, peer); }).find("holds send/recv on a CUDA stream") !=
            std::string::npos);
    comm.recv(static_cast<std::byte*>(buf.p) + 64, 16, DataType::Uint8, peer, s1.handle());
    comm.group_end();  // the group still runs: both ranks queued the same pair
    T_CHECK(cudaStreamSynchronize(s1.s) == 0);
    comm.group_start();
    comm.send(host.data(), 16, DataType::Uint8, peer);
    T_CHECK(message([&] { comm.recv(buf.p, 16, DataType::Uint8, peer, s1.handle()); }).find("holds send/recv on host memory") !=
            std::string::npos);
    comm.recv(host.data() + 64, 16, DataType::Uint8, peer);
    comm.group_end();
    const std::string bad_peer = message([&] { comm.send(buf.p, 16, DataType::Uint8, 7, s1.handle()); });
    T_CHECK(bad_peer.find(fmt::format("rank {}", comm.rank())) != std::string::npos);
    T_CHECK(bad_peer.find("peer") != std::string::npos);
    T_CHECK(message([&] { comm.send(buf.p, 16, DataType::Uint8, comm.rank(), s1.handle()); }).find("needs its match") !=
            std::string::npos);
    T_CHECK(comm.async_error().is_ok());
  });
  REQUIRE(err == "");
}
