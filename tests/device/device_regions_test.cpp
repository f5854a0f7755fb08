// Device regions through the communicator (docs/device.md "Device regions in the engine"): with
// a device transport (nvlink, pcie) to every peer and the kernel module, stream-ordered
// collectives run the engine on the user's device buffers instead of staging through pinned
// host memory; every rank decides together, at the first one. Thread ranks over the fake CUDA
// runtime (streams are threads, copies delayed 0.5 ms) and the fake kernel module (reductions
// run on the stream's thread, delayed 0.3 ms).
#include <dlfcn.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstring>
#include <ringfence/ringfence.hpp>
#include <ringfence/transports/cuda_ipc.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/fake_nvml_state.hpp"
#include "support/scoped_env.hpp"
#include "support/thread_ranks.hpp"
#include "fake_device.hpp"
#include "support/verifiable.hpp"
#include "device_regions_support.hpp"

using namespace ringfence;
using test::DeviceBuffer;
using test::Stream;
namespace cuda_ipc = transports::cuda_ipc;
using Clock = std::chrono::steady_clock;

using namespace ringfence::test::regions;

TEST_CASE("device regions: stream-ordered allreduce runs on device buffers, exact for every dtype and op", "[device][regions]") {
  const int n = 3;
  const std::size_t count = 5001;  // several 4 KiB chunks, not a multiple of the ranks
  const TransportRegistry registry = with_device_transports();
  const unsigned long launches_before = kernel_launches();
  std::vector<std::string> path(n);
  const std::string err = test::run_ranks(
      n, [](int) { return options(); },
      [&](Communicator& comm) {
        Stream stream;
        test::allreduce_every_type_and_op(comm, stream, count);
        T_CHECK(comm.async_error().is_ok());
        path[static_cast<std::size_t>(comm.rank())] = comm.device_path();
      },
      &registry);
  REQUIRE(err == "");
  for (const std::string& p : path) REQUIRE(p == "device regions");
  // The reductions ran in the kernel module (on the device), not on the host.
  REQUIRE(kernel_launches() - launches_before >= static_cast<unsigned long>(kNumDataTypes * kNumReduceOps * 2 * n));
}

TEST_CASE("device regions: tree, direct and one-shot allreduce run on the device lane, exact for every dtype and op", "[device][regions]") {
  // Forced algorithms (RINGFENCE_ALGO) on 4 ranks, 500 elements (one 4 KiB chunk even for
  // 8-byte types, so one-shot runs for every type, in place from a device copy of the input).
  // Unlike the ring (each rank sends to its right neighbour only), each of them sends over
  // device-lane links between ranks that are not ring neighbours.
  const int n = 4;
  const std::size_t count = 500;
  const TransportRegistry registry = with_device_transports();
  for (Algorithm algo : {Algorithm::Tree, Algorithm::Direct, Algorithm::OneShot, Algorithm::Ring}) {
    INFO("algorithm " << static_cast<int>(algo));
    std::atomic<std::uint64_t> off_ring_bytes{0};
    const std::string err = test::run_ranks(
        n,
        [algo](int) {
          CommOptions o = options();
          o.algorithm = algo;
          return o;
        },
        [&](Communicator& comm) {
          Stream stream;
          test::allreduce_every_type_and_op(comm, stream, count);
          T_CHECK(comm.async_error().is_ok());
          T_CHECK(comm.device_path() == "device regions");
          const int r = comm.rank(), right = (r + 1) % n;
          for (const LinkInfo& l : comm.links())
            if (l.device_lane && l.peer != right) off_ring_bytes += l.bytes_written;
        },
        &registry);
    REQUIRE(err == "");
    if (algo == Algorithm::Ring) REQUIRE(off_ring_bytes == 0);
    else REQUIRE(off_ring_bytes > 0);
  }
}

TEST_CASE("device regions: reduce_scatter, allgather, broadcast and reduce on device buffers are exact", "[device][regions]") {
  const int n = 4;
  const std::size_t count = 3001;
  const TransportRegistry registry = with_device_transports();
  // Two GPUs, ranks on GPU rank % 2: the progress thread must make the lane's GPU current
  // before it launches kernels (the fake refuses a launch into another GPU's stream).
  const test::ScopedEnv devices("FAKE_CUDA_DEVICES", "2");
  const std::string err = test::run_ranks(
      n, [](int) { return options(); },
      [&](Communicator& comm) {
        const int r = comm.rank();
        T_CHECK(cudaSetDevice(r % 2) == 0);
        Stream stream;
        const std::size_t bytes = count * sizeof(float);
        DeviceBuffer in(bytes * n), out(bytes * n);
        std::vector<float> host(count * static_cast<std::size_t>(n));
        auto value = [](int rank, std::size_t i) { return static_cast<float>(1 + (static_cast<std::size_t>(rank) * 7 + i) % 13); };
        for (std::size_t i = 0; i < host.size(); ++i) host[i] = value(r, i);
        in.put(host.data(), bytes * n);
        auto out_floats = [&](std::size_t elems) {
          const std::vector<std::byte> b = out.get(elems * sizeof(float));
          std::vector<float> f(elems);
          std::memcpy(f.data(), b.data(), b.size());
          return f;
        };
        // reduce_scatter: block r of the sum of every rank's n blocks.
        comm.reduce_scatter(in.p, out.p, count, DataType::Float32, ReduceOp::Sum, stream.handle());
        T_CHECK(cudaStreamSynchronize(stream.s) == 0);
        std::vector<float> got = out_floats(count);
        for (std::size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int q = 0; q < n; ++q) want += value(q, static_cast<std::size_t>(r) * count + i);
          T_CHECK(got[i] == want);
        }
        // allgather: block q is rank q's first block.
        comm.allgather(in.p, out.p, count, DataType::Float32, stream.handle());
        T_CHECK(cudaStreamSynchronize(stream.s) == 0);
        got = out_floats(count * static_cast<std::size_t>(n));
        for (int q = 0; q < n; ++q)
          for (std::size_t i = 0; i < count; ++i) T_CHECK(got[static_cast<std::size_t>(q) * count + i] == value(q, i));
        // broadcast from rank 2.
        comm.broadcast(in.p, out.p, count, DataType::Float32, 2, stream.handle());
        T_CHECK(cudaStreamSynchronize(stream.s) == 0);
        got = out_floats(count);
        for (std::size_t i = 0; i < count; ++i) T_CHECK(got[i] == value(2, i));
        // reduce (max) to rank 1.
        comm.reduce(in.p, r == 1 ? out.p : nullptr, count, DataType::Float32, ReduceOp::Max, 1, stream.handle());
        T_CHECK(cudaStreamSynchronize(stream.s) == 0);
        if (r == 1) {
          got = out_floats(count);
          for (std::size_t i = 0; i < count; ++i) {
            float want = 0;
            for (int q = 0; q < n; ++q) want = std::max(want, value(q, i));
            T_CHECK(got[i] == want);
          }
        }
        T_CHECK(comm.device_path() == "device regions");
      },
      &registry);
  REQUIRE(err == "");
}

TEST_CASE("device regions: a call returns before its stream reaches it and lands when it does", "[device][regions]") {
  const int n = 2;
  const std::size_t count = 20000;
  const TransportRegistry registry = with_device_transports();
  // The kernels unloaded (the fake loads them lazily, as CUDA does): the communicators' setup must
  // load them, since a load at the first call would wait for this held stream, and one at the
  // first launch for the host function holding it (docs/device.md "Kernel loading").
  unload_kernels();
  const std::string err = test::run_ranks(
      n, [](int) { return options(); },
      [&](Communicator& comm) {
        const std::size_t bytes = count * sizeof(float);
        std::vector<float> host(count);
        test::fill_input(DataType::Float32, ReduceOp::Sum, comm.rank(), n, host.data(), count);
        DeviceBuffer send(bytes), recv(bytes);
        send.put(host.data(), bytes);
        const std::vector<float> sentinel(count, -7.0f);
        recv.put(sentinel.data(), bytes);
        Stream stream;
        fake_cuda_hold(stream.s, 1);
        // Earlier work the held stream has not run yet (a copy of the same sentinel).
        T_CHECK(cudaMemcpyAsync(recv.p, sentinel.data(), bytes, 1, stream.s) == 0);
        comm.allreduce(send.p, recv.p, count, DataType::Float32, ReduceOp::Sum, stream.handle());
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        T_CHECK(std::memcmp(recv.get(bytes).data(), sentinel.data(), bytes) == 0);  // held: not started
        fake_cuda_hold(stream.s, 0);
        T_CHECK(cudaStreamSynchronize(stream.s) == 0);
        T_CHECK(test::count_wrong(DataType::Float32, ReduceOp::Sum, n, recv.get(bytes).data(), count) == 0);
        T_CHECK(comm.async_error().is_ok());
        T_CHECK(comm.device_path() == "device regions");
      },
      &registry);
  REQUIRE(err == "");
}

// One stream-ordered Int32 sum allreduce in place on a device buffer of `count` elements on a job
// that ended up host-staged: checks the result exactly and that it went through pinned staging,
// and returns the rank's device_path() (its reason for staging).
static std::string staged_allreduce(Communicator& comm, int n, std::size_t count) {
  Stream stream;
  std::vector<std::int32_t> host(count);
  test::fill_input(DataType::Int32, ReduceOp::Sum, comm.rank(), n, host.data(), count);
  DeviceBuffer buf(count * 4);
  buf.put(host.data(), count * 4);
  comm.allreduce(buf.p, buf.p, count, DataType::Int32, ReduceOp::Sum, stream.handle());
  T_CHECK(cudaStreamSynchronize(stream.s) == 0);
  T_CHECK(test::count_wrong(DataType::Int32, ReduceOp::Sum, n, buf.get(count * 4).data(), count) == 0);
  T_CHECK(comm.device_staging_bytes() >= count * 4);
  return comm.device_path();
}

TEST_CASE("device regions: when one rank cannot, every rank stages, exact, and says why", "[device][regions]") {
  const int n = 3;
  const std::size_t count = 3000;
  const TransportRegistry registry = with_device_transports();
  struct Case {
    const char* what;
    void (*spoil)(CommOptions&);  // what rank 1 lacks
    const char* why;              // what every rank's device_path() must then say
  };
  const Case cases[] = {
      {"no kernel module", [](CommOptions& o) { o.cuda_kernels = "/nonexistent/libringfence_kernels.so"; },
       "host-staged: rank 1: no device kernel module (tried /nonexistent/libringfence_kernels.so"},
      // Off on one rank only: it must still tell the others (they wait for every rank's answer).
      {"RINGFENCE_DEVICE_REGIONS=off", [](CommOptions& o) { o.device_regions = DeviceRegionsMode::Off; },
       "host-staged: rank 1: RINGFENCE_DEVICE_REGIONS=off"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    std::vector<std::string> path(n);
    const std::string err = test::run_ranks(
        n,
        [&](int r) {
          CommOptions o = options(DeviceRegionsMode::Auto, std::chrono::seconds(5));
          if (r == 1) c.spoil(o);
          return o;
        },
        [&](Communicator& comm) { path[static_cast<std::size_t>(comm.rank())] = staged_allreduce(comm, n, count); },
        &registry);
    REQUIRE(err == "");
    for (const std::string& p : path) REQUIRE_THAT(p, Catch::StartsWith(c.why));
  }
}

TEST_CASE("device regions: kernels that fail to load at setup leave every rank host-staged, exact, saying why", "[device][regions]") {
  // The module's preload runs at communicator setup (docs/device.md "Kernel loading"); when it
  // fails the ranks stage, and each names the module and the CUDA error.
  const int n = 2;
  const std::size_t count = 3000;
  const TransportRegistry registry = with_device_transports();
  test::ScopedEnv fail("FAKE_KERNELS_PRELOAD_ERROR", "3");
  std::vector<std::string> path(n);
  const std::string err = test::run_ranks(
      n, [](int) { return options(DeviceRegionsMode::Auto, std::chrono::seconds(5)); },
      [&](Communicator& comm) { path[static_cast<std::size_t>(comm.rank())] = staged_allreduce(comm, n, count); },
      &registry);
  REQUIRE(err == "");
  for (int r = 0; r < n; ++r) {  // a rank that cannot gives its own reason
    const std::string& p = path[static_cast<std::size_t>(r)];
    REQUIRE_THAT(p, Catch::StartsWith("host-staged: rank " + std::to_string(r) + ": "));
    REQUIRE_THAT(p, Catch::Contains("libringfence_kernels.so: loading its kernels failed (ringfence_kernels_preload: CUDA error 3)"));
  }
}

TEST_CASE("device regions: fault rules keep the device lane off the transports they name, and only those", "[device][regions]") {
  // Fault links read payloads on the host, so a transport with rules carries no device lane; a
  // rule for another transport leaves it alone (it is not wrapped at all).
  const int n = 2;
  const std::size_t count = 3000;
  const TransportRegistry registry = with_device_transports();
  struct Case {
    const char* fault;
    const char* path;    // what device_path() must contain
    const char* device;  // the device lane's transport ("" when staged)
  };
  const Case cases[] = {
      {"delay:us=1,transport=shm", "device regions", "nvlink"},
      {"delay:us=1,transport=nvlink", "device regions", "pcie"},
      {"delay:us=1,transport=nvlink;delay:us=1,transport=pcie", "no transport writes device memory to rank", ""},
  };
  for (const Case& c : cases) {
    INFO(c.fault);
    std::vector<std::string> path(n), device(n);
    const std::string err = test::run_ranks(
        n,
        [&](int) {
          CommOptions o = options(DeviceRegionsMode::Auto, std::chrono::seconds(5));
          o.fault = c.fault;
          return o;
        },
        [&](Communicator& comm) {
          Stream stream;
          DeviceBuffer buf(count * 4);
          T_CHECK(allreduce_in_place_wrong(comm, stream, buf, count) == 0);
          const auto r = static_cast<std::size_t>(comm.rank());
          path[r] = comm.device_path();
          for (const auto& l : comm.links())
            if (l.device_lane) device[r] = l.transport;
        },
        &registry);
    REQUIRE(err == "");
    for (std::size_t r = 0; r < n; ++r) {
      REQUIRE_THAT(path[r], Catch::Contains(c.path));
      REQUIRE(device[r] == c.device);
    }
  }
}

TEST_CASE("device regions: RINGFENCE_DEVICE_REGIONS=on without a device transport fails with CudaError saying why", "[device][regions]") {
  const int n = 2;
  std::vector<std::string> seen(n);
  const std::string err = test::run_ranks(n, [](int) { return options(DeviceRegionsMode::On); }, [&](Communicator& comm) {
    Stream stream;
    DeviceBuffer buf(4096);
    try {
      comm.allreduce(buf.p, buf.p, 1024, DataType::Float32, ReduceOp::Sum, stream.handle());
      seen[static_cast<std::size_t>(comm.rank())] = "accepted";
    } catch (const CudaError& e) {
      seen[static_cast<std::size_t>(comm.rank())] = e.what();
    }
  });
  REQUIRE(err == "");
  for (int r = 0; r < n; ++r) {
    INFO(seen[static_cast<std::size_t>(r)]);
    REQUIRE_THAT(seen[static_cast<std::size_t>(r)],
                 Catch::StartsWith(fmt::format("rank {}: allreduce on a CUDA stream: device regions are required", r)) &&
                     Catch::Contains("no transport writes device memory to rank"));
  }
}

TEST_CASE("device regions: a stream that never reaches the call times out on its rank and fails the peer", "[device][regions][failure]") {
  const int n = 2;
  const TransportRegistry registry = with_device_transports();
  std::vector<std::string> seen(n);
  const auto start = Clock::now();
  const std::string err = test::run_ranks(
      n, [](int) { return options(DeviceRegionsMode::On, std::chrono::milliseconds(500)); },
      [&](Communicator& comm) {
        Stream stream;
        DeviceBuffer buf(4096);
        if (comm.rank() == 1) fake_cuda_hold(stream.s, 1);  // stuck behind "earlier work"
        comm.allreduce(buf.p, buf.p, 1024, DataType::Float32, ReduceOp::Sum, stream.handle());
        for (int i = 0; i < 400 && comm.async_error().is_ok(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        seen[static_cast<std::size_t>(comm.rank())] = std::string(to_string(comm.async_error().code()));
        fake_cuda_hold(stream.s, 0);
        T_CHECK(cudaStreamSynchronize(stream.s) == 0);  // the stream is not left blocked
        seen[static_cast<std::size_t>(comm.rank())] += " / " + comm.device_path();
      },
      &registry);
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  INFO(seen[0] << "\n" << seen[1]);
  REQUIRE(err == "");
  REQUIRE(secs < 8.0);
  REQUIRE(seen[1] == "timeout / device regions");
  REQUIRE(seen[0].find("ok") != 0);  // rank 0 failed too (its peer aborted or timed out)
}

TEST_CASE("device regions: a peer that stops coming times out naming the device-lane link", "[device][regions][failure]") {
  // Rank 1 joins the first stream-ordered allreduce (the decision: device regions) and not the
  // second. Rank 0 waits for its chunk on the device lane and times out; the error names the
  // link it waited on, the device lane's nvlink link (not lane 0's shm link to the same rank).
  const int n = 2;
  const TransportRegistry registry = with_device_transports();
  std::atomic<bool> done{false};
  std::string seen;
  const std::string err = test::run_ranks(
      n,
      [](int) {
        CommOptions o = options(DeviceRegionsMode::On, std::chrono::milliseconds(500));
        o.check_calls = false;  // else the call fingerprint, over lane 0 (shm), is what times out first
        return o;
      },
      [&](Communicator& comm) {
        Stream stream;
        DeviceBuffer buf(4096);
        comm.allreduce(buf.p, buf.p, 1024, DataType::Float32, ReduceOp::Sum, stream.handle());
        T_CHECK(cudaStreamSynchronize(stream.s) == 0);
        T_CHECK(comm.device_path() == "device regions");
        if (comm.rank() == 1) {
          for (int i = 0; i < 1000 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          return;
        }
        comm.allreduce(buf.p, buf.p, 1024, DataType::Float32, ReduceOp::Sum, stream.handle());
        T_CHECK(cudaStreamSynchronize(stream.s) == 0);  // the stream is released on failure too
        T_CHECK(comm.async_error().code() == ErrorCode::Timeout);
        try {
          comm.allreduce(buf.p, buf.p, 1024, DataType::Float32, ReduceOp::Sum, stream.handle());
          seen = "next call accepted";
        } catch (const Error& e) {
          seen = e.what();
        }
        done = true;
      },
      &registry);
  INFO(err);
  REQUIRE(err == "");
  REQUIRE_THAT(seen, Catch::Contains("allreduce #2 failed: timed out after 500 ms waiting for") &&
                         Catch::Contains("from rank 1") && Catch::Contains("(nvlink link rank 0 <-> rank 1"));
}

TEST_CASE("device regions: plain host buffers are refused with InvalidUsage naming the argument and the rank", "[device][regions]") {
  const int n = 2;
  const TransportRegistry registry = with_device_transports();
  std::vector<std::string> seen(n);
  const std::string err = test::run_ranks(
      n, [](int) { return options(); },
      [&](Communicator& comm) {
        Stream stream;
        DeviceBuffer dev(4096);
        std::vector<float> host(1024, 1.0f);
        comm.allreduce(dev.p, dev.p, 1024, DataType::Float32, ReduceOp::Sum, stream.handle());  // decides: device regions
        T_CHECK(cudaStreamSynchronize(stream.s) == 0);
        try {
          comm.allreduce(dev.p, host.data(), 1024, DataType::Float32, ReduceOp::Sum, stream.handle());
          seen[static_cast<std::size_t>(comm.rank())] = "accepted";
        } catch (const InvalidUsage& e) {
          seen[static_cast<std::size_t>(comm.rank())] = e.what();
        }
        // Refused before anything was queued: the communicator still works.
        comm.allreduce(dev.p, dev.p, 1024, DataType::Float32, ReduceOp::Sum, stream.handle());
        T_CHECK(cudaStreamSynchronize(stream.s) == 0);
        T_CHECK(comm.async_error().is_ok());
      },
      &registry);
  REQUIRE(err == "");
  for (int r = 0; r < n; ++r)
    REQUIRE_THAT(seen[static_cast<std::size_t>(r)],
                 Catch::StartsWith(fmt::format("rank {}: allreduce on a CUDA stream: recvbuff", r)) &&
                     Catch::Contains("is not device, managed or pinned host memory") && Catch::Contains("RINGFENCE_DEVICE_REGIONS=off"));
}

TEST_CASE("device regions: a communicator of one rank copies on the device", "[device][regions]") {
  const TransportRegistry registry = with_device_transports();
  const std::string err = test::run_ranks(
      1, [](int) { return options(); },
      [&](Communicator& comm) {
        Stream stream;
        const std::size_t count = 5000;
        std::vector<float> host(count);
        test::fill_input(DataType::Float32, ReduceOp::Max, 0, 1, host.data(), count);
        DeviceBuffer send(count * 4), recv(count * 4);
        send.put(host.data(), count * 4);
        comm.allreduce(send.p, recv.p, count, DataType::Float32, ReduceOp::Max, stream.handle());
        T_CHECK(cudaStreamSynchronize(stream.s) == 0);
        T_CHECK(test::count_wrong(DataType::Float32, ReduceOp::Max, 1, recv.get(count * 4).data(), count) == 0);
        T_CHECK(comm.device_path() == "device regions");
      },
      &registry);
  REQUIRE(err == "");
}

TEST_CASE("device regions: alltoall and send/recv run on the device lane once a collective chose it", "[device][regions][p2p]") {
  const int n = 3;
  const std::size_t count = 100000;  // 400 KB blocks, many 4 KiB chunks
  const TransportRegistry registry = with_device_transports();
  const std::string err = test::run_ranks(
      n, [](int) { return options(DeviceRegionsMode::On, std::chrono::seconds(5)); },
      [&](Communicator& comm) {
        Stream stream;
        const int r = comm.rank();
        const std::size_t block = count * sizeof(std::int32_t), whole = block * n;
        DeviceBuffer in(whole), out(whole);
        std::vector<std::int32_t> host(count * n);
        auto value = [](int from, int to, std::size_t i) { return static_cast<std::int32_t>(from * 1000003 + to * 1009 + static_cast<int>(i % 997)); };
        for (int to = 0; to < n; ++to)
          for (std::size_t i = 0; i < count; ++i) host[static_cast<std::size_t>(to) * count + i] = value(r, to, i);
        in.put(host.data(), whole);
        // Before any collective: send/recv stage (the decision is a collective's).
        T_CHECK(comm.device_path().empty());
        // alltoall decides: device regions.
        comm.alltoall(in.p, out.p, count, DataType::Int32, stream.handle());
        T_CHECK(cudaStreamSynchronize(stream.s) == 0);
        T_CHECK(comm.device_path() == "device regions");
        auto check_block = [&](const std::vector<std::byte>& got, std::size_t at, int from, int to) {
          std::vector<std::int32_t> v(count);
          std::memcpy(v.data(), got.data() + at, block);
          for (std::size_t i = 0; i < count; ++i)
            if (v[i] != value(from, to, i)) throw std::runtime_error(fmt::format("rank {}: block from {} wrong at {}", to, from, i));
        };
        std::vector<std::byte> got = out.get(whole);
        for (int from = 0; from < n; ++from) check_block(got, static_cast<std::size_t>(from) * block, from, r);
        // A ring exchange both ways plus a transfer to ourselves, in one group.
        const int right = (r + 1) % n, left = (r + n - 1) % n;
        comm.group_start();
        comm.send(static_cast<std::byte*>(in.p) + static_cast<std::size_t>(right) * block, count, DataType::Int32, right, stream.handle());
        comm.send(static_cast<std::byte*>(in.p) + static_cast<std::size_t>(left) * block, count, DataType::Int32, left, stream.handle());
        comm.send(static_cast<std::byte*>(in.p) + static_cast<std::size_t>(r) * block, count, DataType::Int32, r, stream.handle());
        comm.recv(static_cast<std::byte*>(out.p) + static_cast<std::size_t>(left) * block, count, DataType::Int32, left, stream.handle());
        comm.recv(static_cast<std::byte*>(out.p) + static_cast<std::size_t>(right) * block, count, DataType::Int32, right, stream.handle());
        comm.recv(static_cast<std::byte*>(out.p) + static_cast<std::size_t>(r) * block, count, DataType::Int32, r, stream.handle());
        comm.group_end();
        T_CHECK(cudaStreamSynchronize(stream.s) == 0);
        got = out.get(whole);
        for (int from = 0; from < n; ++from) check_block(got, static_cast<std::size_t>(from) * block, from, r);
        // Outside a group every rank sends to its right, then receives from its left: a send that
        // fits the peer's staging slots ends before its receive runs (its copies landed, its
        // signal stored), as on the host lanes; waiting for the peer to consume it would stall
        // the ring until the timeout.
        const std::size_t small = 1000;  // 4000 bytes: one slot
        comm.send(static_cast<std::byte*>(in.p) + static_cast<std::size_t>(right) * block, small, DataType::Int32, right, stream.handle());
        comm.recv(out.p, small, DataType::Int32, left, stream.handle());
        T_CHECK(cudaStreamSynchronize(stream.s) == 0);
        T_CHECK(comm.async_error().is_ok());
        {
          std::vector<std::int32_t> v(small);
          std::memcpy(v.data(), out.get(small * sizeof(std::int32_t)).data(), small * sizeof(std::int32_t));
          for (std::size_t i = 0; i < small; ++i)
            if (v[i] != value(left, r, i)) throw std::runtime_error(fmt::format("rank {}: send-then-recv wrong at {}", r, i));
        }
        T_CHECK(comm.async_error().is_ok());
        // Nothing went through pinned staging: the device path allocates none.
        T_CHECK(comm.device_staging_bytes() == 0);
      },
      &registry);
  REQUIRE(err == "");
}
