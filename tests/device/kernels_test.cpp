// Device regions in the engine, on the CPU: the kernel module's C interface (src/device_kernels.hpp)
// against the fake module (fake_kernels.cpp: the host functors, run in stream order on the fake
// runtime), and the ring executor (src/ring_executor.cpp) running collectives on "device"
// buffers, staging slots and scratch over the nvlink and pcie transports, thread ranks in one
// process. The fake delays every copy (0.5 ms) and every reduction (0.3 ms), so an executor
// that sent a chunk before its reduction ran, or credited a slot a reduction still reads, gets
// wrong results here.
#include <dlfcn.h>

#include <cstring>
#include <functional>
#include <memory>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/reduce_ops.hpp>
#include <ringfence/transports/cuda_ipc.hpp>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include <ringfence/detail/cuda_api.hpp>
#include "device_kernels.hpp"
#include "engine.hpp"
#include "support/catch.hpp"

extern "C" {
int cudaMalloc(void**, std::size_t);
int cudaFree(void*);
int cudaMemcpy(void*, const void*, std::size_t, int);
void fake_cuda_hold(void* stream, int hold);
}

using namespace ringfence;
using namespace ringfence::detail;
namespace cuda_ipc = transports::cuda_ipc;

namespace {

constexpr int kHostToDevice = 1, kDeviceToHost = 2;

const CudaApi& fake_cuda() {
  static const CudaApi api = load_cuda_api(RINGFENCE_FAKE_CUDART_PATH);
  return api;
}

const DeviceKernels& fake_kernels() {
  static const DeviceKernels k = load_device_kernels(RINGFENCE_FAKE_KERNELS_PATH);
  return k;
}

unsigned long kernel_launches() {
  void* h = ::dlopen(RINGFENCE_FAKE_KERNELS_PATH, RTLD_NOW | RTLD_LOCAL);  // already loaded: same handle
  REQUIRE(h != nullptr);
  auto* f = reinterpret_cast<unsigned long (*)()>(::dlsym(h, "fake_kernels_launches"));
  REQUIRE(f != nullptr);
  return f();
}

// Device memory (the fake's: host-addressable shared memory), freed at scope exit.
struct DeviceBuffer {
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit DeviceBuffer(std::size_t n) : bytes(n) { REQUIRE(cudaMalloc(&p, n == 0 ? 1 : n) == 0); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void put(const std::vector<std::uint8_t>& v) { REQUIRE(cudaMemcpy(p, v.data(), v.size(), kHostToDevice) == 0); }
  std::vector<std::uint8_t> get() const {
    std::vector<std::uint8_t> v(bytes);
    REQUIRE(cudaMemcpy(v.data(), p, bytes, kDeviceToHost) == 0);
    return v;
  }
};

// Element `i` of rank `r`'s input, as `T`: 1, 2 or 3, so every sum (at most 12) and product (at
// most 81) of up to 4 ranks is exact in every type, in any order.
template <class T>
T value_at(int r, std::size_t i) {
  return static_cast<T>(static_cast<float>(1 + (static_cast<std::size_t>(r) + i) % 3));
}

template <DataType D>
std::vector<std::uint8_t> input_bytes(int r, std::size_t count) {
  using T = typename StorageOf<D>::type;
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = value_at<T>(r, i);
  std::vector<std::uint8_t> out(count * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::vector<std::uint8_t> input_of(DataType type, int r, std::size_t count) {
  switch (type) {
    case DataType::Int8: return input_bytes<DataType::Int8>(r, count);
    case DataType::Uint8: return input_bytes<DataType::Uint8>(r, count);
    case DataType::Int32: return input_bytes<DataType::Int32>(r, count);
    case DataType::Uint32: return input_bytes<DataType::Uint32>(r, count);
    case DataType::Int64: return input_bytes<DataType::Int64>(r, count);
    case DataType::Uint64: return input_bytes<DataType::Uint64>(r, count);
    case DataType::Float16: return input_bytes<DataType::Float16>(r, count);
    case DataType::BFloat16: return input_bytes<DataType::BFloat16>(r, count);
    case DataType::Float32: return input_bytes<DataType::Float32>(r, count);
    case DataType::Float64: return input_bytes<DataType::Float64>(r, count);
  }
  return {};
}

// The reduction of every rank's input by the host functors, rank by rank (exact inputs: any
// order gives the same bytes).
std::vector<std::uint8_t> reference(DataType type, ReduceOp op, int n, std::size_t count) {
  const Reducer red = host_reducer(type, op);
  std::vector<std::uint8_t> acc = input_of(type, 0, count);
  for (int r = 1; r < n; ++r) {
    const std::vector<std::uint8_t> next = input_of(type, r, count);
    (r == n - 1 ? red.finish : red.combine)(acc.data(), acc.data(), next.data(), count, n);
  }
  return acc;
}

// One rank of an in-process ring over a CUDA IPC transport, wired as the communicator wires a
// lane (connect_lane): host flag block, device staging slots per peer and device scratch from
// the transport's allocate(), regions registered and imported, a link to every peer.
struct Rank {
  CommOptions options;
  Logger log;
  PeerInfo self;
  std::unique_ptr<Transport> transport;
  std::unique_ptr<ListenHandle> listener;
  EngineConfig config;
  FlagBlock flags;
  void* flags_mem = nullptr;
  void* inbox_mem = nullptr;
  void* scratch_mem = nullptr;
  std::vector<std::unique_ptr<Connection>> channel;  // by rank; null for ourselves
  std::vector<Connection*> by_position;              // the ring is 0, 1, ..., n-1
  RelayDuties relays;
  void* stream = nullptr;

  ~Rank() {
    channel.clear();  // links and regions before the memory under them
    if (stream) fake_cuda().stream_destroy(stream);
    for (void* p : {scratch_mem, inbox_mem, flags_mem})
      if (p) transport->deallocate(p);
  }
};

std::size_t inbox_bytes(const EngineConfig& c) { return c.slot_stride() * static_cast<std::size_t>(c.slots); }

std::vector<std::unique_ptr<Rank>> make_ring(std::string_view transport, int n, std::size_t slot_bytes = 4096, int slots = 2) {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < n; ++r) {
    auto R = std::make_unique<Rank>();
    R->options.cuda_runtime = RINGFENCE_FAKE_CUDART_PATH;
    R->self = PeerInfo{r, "h", static_cast<std::int32_t>(::getpid())};
    const TransportContext ctx{R->self, n, &R->options, &R->log};
    R->transport = transport == cuda_ipc::kNvlinkName ? cuda_ipc::make_nvlink_transport(ctx) : cuda_ipc::make_pcie_transport(ctx);
    R->listener = R->transport->listen();
    R->config.rank = r;
    R->config.size = n;
    R->config.position = r;
    R->config.slots = slots;
    R->config.slot_bytes = slot_bytes;
    R->config.timeout = std::chrono::seconds(20);
    R->flags_mem = R->transport->allocate(FlagBlock::bytes(n), MemoryKind::Host);
    REQUIRE(R->flags_mem != nullptr);
    std::memset(R->flags_mem, 0, FlagBlock::bytes(n));
    R->flags.bind(R->flags_mem, n);
    R->inbox_mem = R->transport->allocate(inbox_bytes(R->config) * static_cast<std::size_t>(n), MemoryKind::Device);
    R->scratch_mem = R->transport->allocate(slot_bytes * static_cast<std::size_t>(slots + 1), MemoryKind::Device);
    REQUIRE((R->inbox_mem != nullptr && R->scratch_mem != nullptr));
    R->config.scratch = static_cast<std::byte*>(R->scratch_mem);
    REQUIRE(fake_cuda().stream_create(&R->stream, kCudaStreamNonBlocking) == 0);
    R->channel.resize(static_cast<std::size_t>(n));
    ranks.push_back(std::move(R));
  }
  for (int r = 0; r < n; ++r) {
    Rank& R = *ranks[static_cast<std::size_t>(r)];
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      auto ch = std::make_unique<Connection>();
      ch->peer = p;
      ch->transport_name = std::string(transport);
      ch->transport = R.transport.get();
      ch->inbox = static_cast<std::byte*>(R.inbox_mem) + static_cast<std::size_t>(p) * inbox_bytes(R.config);
      auto pending = R.transport->connect(*R.listener, ranks[static_cast<std::size_t>(p)]->self,
                                          ranks[static_cast<std::size_t>(p)]->listener->address());
      Status s = Status(ErrorCode::InProgress);
      for (int i = 0; i < 20000 && s.in_progress(); ++i) {
        s = pending->try_finish(ch->link);
        if (s.in_progress()) ::usleep(100);
      }
      REQUIRE(s.is_ok());
      ch->flags_region = R.transport->register_memory(R.flags_mem, FlagBlock::bytes(n), MemoryKind::Host);
      ch->inbox_region = R.transport->register_memory(ch->inbox, inbox_bytes(R.config), MemoryKind::Device);
      R.channel[static_cast<std::size_t>(p)] = std::move(ch);
    }
  }
  for (int r = 0; r < n; ++r) {
    Rank& R = *ranks[static_cast<std::size_t>(r)];
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      Connection& mine = *R.channel[static_cast<std::size_t>(p)];
      const Connection& theirs = *ranks[static_cast<std::size_t>(p)]->channel[static_cast<std::size_t>(r)];
      mine.peer_inbox = R.transport->import_region(theirs.inbox_region.key());
      mine.peer_flags = R.transport->import_region(theirs.flags_region.key());
    }
    for (int p = 0; p < n; ++p) R.by_position.push_back(R.channel[static_cast<std::size_t>(p)].get());
  }
  return ranks;
}

// Runs `call(r)` on every rank at once through run_ring, on device regions of `type`/`op`.
// Returns each rank's status; `failures` gets what went wrong.
std::vector<Status> run_all(std::vector<std::unique_ptr<Rank>>& ranks, DataType type, ReduceOp op,
                            const std::function<RingCall(int)>& call, std::vector<Failure>* failures = nullptr,
                            bool device = true) {
  const int n = static_cast<int>(ranks.size());
  std::vector<Status> status(static_cast<std::size_t>(n));
  std::vector<Failure> failure(static_cast<std::size_t>(n));
  std::vector<DeviceRegions> regions(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  const Reducer reducer = host_reducer(type, op);
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      Rank& R = *ranks[static_cast<std::size_t>(r)];
      const auto i = static_cast<std::size_t>(r);
      regions[i] = DeviceRegions{&fake_cuda(), &fake_kernels(), R.stream};
      RingCall c = call(r);
      c.device = device ? &regions[i] : nullptr;
      if (!c.by_position) {
        c.by_position = R.by_position.data();
        c.by_rank = R.by_position.data();
      }
      Connection* left = R.channel[static_cast<std::size_t>((r + n - 1) % n)].get();
      Connection* right = R.channel[static_cast<std::size_t>((r + 1) % n)].get();
      status[i] = run_ring(R.config, R.flags, left, right, c, reducer, DirectWrite{}, R.relays, failure[i]);
    });
  for (auto& t : threads) t.join();
  if (failures) *failures = failure;
  return status;
}

void require_all_ok(const std::vector<Status>& status) {
  for (std::size_t r = 0; r < status.size(); ++r) {
    INFO("rank " << r << ": " << to_string(status[r].code()));
    REQUIRE(status[r].is_ok());
  }
}

const DataType kTypes[] = {DataType::Int8,    DataType::Uint8,    DataType::Int32,   DataType::Uint32,  DataType::Int64,
                           DataType::Uint64,  DataType::Float16,  DataType::BFloat16, DataType::Float32, DataType::Float64};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg};

}  // namespace

TEST_CASE("device kernels: the module's combine equals the host functors for every type and op, in stream order", "[kernels]") {
  const CudaApi& cuda = fake_cuda();
  const DeviceKernels& k = fake_kernels();
  REQUIRE(cuda.usable);
  INFO(k.why_not);
  REQUIRE(k.usable);
  void* stream = nullptr;
  REQUIRE(cuda.stream_create(&stream, kCudaStreamNonBlocking) == 0);
  REQUIRE(k.preload() == 0);  // loaded first: a lazy load at the first launch would wait for the held stream
  const std::size_t count = 1001;  // odd: a scalar head or tail around the 16-byte packs
  for (DataType type : kTypes)
    for (ReduceOp op : kOps)
      for (bool finish : {false, true}) {
        INFO(to_string(type) << " " << to_string(op) << (finish ? " finish" : ""));
        const std::vector<std::uint8_t> a = input_of(type, 0, count), b = input_of(type, 1, count);
        std::vector<std::uint8_t> want(a.size());
        const Reducer red = host_reducer(type, op);
        (finish ? red.finish : red.combine)(want.data(), a.data(), b.data(), count, 3);
        DeviceBuffer da(a.size()), db(b.size()), dd(a.size());
        da.put(a);
        db.put(b);
        dd.put(std::vector<std::uint8_t>(a.size(), 0xee));
        fake_cuda_hold(stream, 1);  // the launch must not run before the stream gets there
        REQUIRE(k.launch(type, op, finish, 3, dd.p, da.p, db.p, count, stream) == 0);
        ::usleep(2000);
        REQUIRE(dd.get() == std::vector<std::uint8_t>(a.size(), 0xee));
        fake_cuda_hold(stream, 0);
        REQUIRE(cuda.stream_synchronize(stream) == 0);
        REQUIRE(dd.get() == want);
        // In place (dst == a), as the engine's accumulating steps do.
        REQUIRE(k.launch(type, op, finish, 3, da.p, da.p, db.p, count, stream) == 0);
        REQUIRE(cuda.stream_synchronize(stream) == 0);
        REQUIRE(da.get() == want);
      }
  REQUIRE(cuda.stream_destroy(stream) == 0);
}

TEST_CASE("device kernels: bad arguments and a missing module are refused with the reason", "[kernels]") {
  const DeviceKernels& k = fake_kernels();
  REQUIRE(k.usable);
  DeviceBuffer d(64);
  REQUIRE(k.combine(10, 0, 0, 1, d.p, d.p, d.p, 4, nullptr) == 1);   // no DataType 10
  REQUIRE(k.combine(0, 5, 0, 1, d.p, d.p, d.p, 4, nullptr) == 1);    // no ReduceOp 5
  REQUIRE(k.combine(0, static_cast<int>(ReduceOp::Avg), 1, 0, d.p, d.p, d.p, 4, nullptr) == 1);  // avg by 0
  const DeviceKernels none = load_device_kernels("/nonexistent/libringfence_kernels.so");
  REQUIRE_FALSE(none.usable);
  REQUIRE_THAT(none.why_not, Catch::Contains("no device kernel module") && Catch::Contains("/nonexistent/libringfence_kernels.so"));
  // A library without the entry points (the fake runtime) is not a module.
  const DeviceKernels wrong = load_device_kernels(RINGFENCE_FAKE_CUDART_PATH);
  REQUIRE_FALSE(wrong.usable);
  REQUIRE_THAT(wrong.why_not, Catch::Contains("lacks ringfence_kernels_abi_version"));
}

TEST_CASE("device regions: ring allreduce on device buffers over nvlink is exact for every type and op", "[kernels][engine]") {
  auto ranks = make_ring(cuda_ipc::kNvlinkName, 3);
  const std::size_t count = 2500;  // not a multiple of 3 ranks; several chunks per step for 1-byte types
  const unsigned long launches_before = kernel_launches();
  for (DataType type : kTypes)
    for (ReduceOp op : kOps) {
      INFO(to_string(type) << " " << to_string(op));
      const std::size_t bytes = count * size_of(type);
      std::vector<std::unique_ptr<DeviceBuffer>> in, out;
      for (int r = 0; r < 3; ++r) {
        in.push_back(std::make_unique<DeviceBuffer>(bytes));
        out.push_back(std::make_unique<DeviceBuffer>(bytes));
        in.back()->put(input_of(type, r, count));
        out.back()->put(std::vector<std::uint8_t>(bytes, 0xee));
      }
      require_all_ok(run_all(ranks, type, op, [&](int r) {
        return RingCall{RingCollective::Allreduce, in[static_cast<std::size_t>(r)]->p, out[static_cast<std::size_t>(r)]->p, count};
      }));
      const std::vector<std::uint8_t> want = reference(type, op, 3, count);
      for (int r = 0; r < 3; ++r) {
        INFO("rank " << r);
        REQUIRE(out[static_cast<std::size_t>(r)]->get() == want);
        REQUIRE(in[static_cast<std::size_t>(r)]->get() == input_of(type, r, count));  // input untouched
      }
    }
  // Every reduction ran through the kernel module (on the device), none on the host.
  REQUIRE(kernel_launches() - launches_before >= 50u * 2u * 3u);
}

TEST_CASE("device regions: every ring collective on device buffers over nvlink and pcie is exact", "[kernels][engine]") {
  for (std::string_view name : {cuda_ipc::kNvlinkName, cuda_ipc::kPcieName}) {
    INFO(std::string(name));
    const int n = 4;
    auto ranks = make_ring(name, n);
    const DataType type = DataType::Float32;
    const std::size_t count = 3001;
    const std::size_t bytes = count * sizeof(float);
    std::vector<std::unique_ptr<DeviceBuffer>> in, out;
    for (int r = 0; r < n; ++r) {
      in.push_back(std::make_unique<DeviceBuffer>(bytes * n));
      out.push_back(std::make_unique<DeviceBuffer>(bytes * n));
    }
    auto fill = [&] {
      for (int r = 0; r < n; ++r) {
        in[static_cast<std::size_t>(r)]->put(input_of(type, r, count * n));
        out[static_cast<std::size_t>(r)]->put(std::vector<std::uint8_t>(bytes * n, 0xee));
      }
    };
    auto out_bytes = [&](int r, std::size_t from, std::size_t len) {
      const std::vector<std::uint8_t> all = out[static_cast<std::size_t>(r)]->get();
      return std::vector<std::uint8_t>(all.begin() + static_cast<std::ptrdiff_t>(from), all.begin() + static_cast<std::ptrdiff_t>(from + len));
    };
    auto slice = [](const std::vector<std::uint8_t>& v, std::size_t from, std::size_t len) {
      return std::vector<std::uint8_t>(v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(from + len));
    };
    const std::vector<std::uint8_t> sum_all = reference(type, ReduceOp::Sum, n, count * n);

    SECTION("reduce_scatter: block r of the sum lands on rank r") {
      fill();
      require_all_ok(run_all(ranks, type, ReduceOp::Sum, [&](int r) {
        return RingCall{RingCollective::ReduceScatter, in[static_cast<std::size_t>(r)]->p, out[static_cast<std::size_t>(r)]->p, count};
      }));
      for (int r = 0; r < n; ++r) REQUIRE(out_bytes(r, 0, bytes) == slice(sum_all, static_cast<std::size_t>(r) * bytes, bytes));
    }
    SECTION("allgather: every rank gets every block") {
      fill();
      require_all_ok(run_all(ranks, type, ReduceOp::Sum, [&](int r) {
        return RingCall{RingCollective::Allgather, in[static_cast<std::size_t>(r)]->p, out[static_cast<std::size_t>(r)]->p, count};
      }));
      for (int r = 0; r < n; ++r)
        for (int b = 0; b < n; ++b)
          REQUIRE(out_bytes(r, static_cast<std::size_t>(b) * bytes, bytes) == slice(input_of(type, b, count), 0, bytes));
    }
    SECTION("broadcast from rank 2 and reduce to rank 1") {
      fill();
      require_all_ok(run_all(ranks, type, ReduceOp::Sum, [&](int r) {
        return RingCall{RingCollective::Broadcast, in[static_cast<std::size_t>(r)]->p, out[static_cast<std::size_t>(r)]->p, count, 2};
      }));
      for (int r = 0; r < n; ++r) REQUIRE(out_bytes(r, 0, bytes) == input_of(type, 2, count));
      fill();
      require_all_ok(run_all(ranks, type, ReduceOp::Max, [&](int r) {
        return RingCall{RingCollective::Reduce, in[static_cast<std::size_t>(r)]->p, out[static_cast<std::size_t>(r)]->p, count, 1};
      }));
      REQUIRE(out_bytes(1, 0, bytes) == reference(type, ReduceOp::Max, n, count));
    }
    SECTION("tree and direct allreduce in place, one-shot out of place (one slot at most)") {
      for (RingCollective kind : {RingCollective::TreeAllreduce, RingCollective::DirectAllreduce, RingCollective::OneShotAllreduce}) {
        INFO("kind " << static_cast<int>(kind));
        fill();
        const bool oneshot = kind == RingCollective::OneShotAllreduce;
        const std::size_t c = oneshot ? 1000 : count;  // one-shot: the input fits one 4 KiB slot
        require_all_ok(run_all(ranks, type, ReduceOp::Sum, [&](int r) {
          DeviceBuffer& b = *in[static_cast<std::size_t>(r)];
          return RingCall{kind, b.p, oneshot ? out[static_cast<std::size_t>(r)]->p : b.p, c};
        }));
        const std::vector<std::uint8_t> want = reference(type, ReduceOp::Sum, n, c);
        for (int r = 0; r < n; ++r) {
          INFO("rank " << r);
          const std::vector<std::uint8_t> got = (oneshot ? out : in)[static_cast<std::size_t>(r)]->get();
          REQUIRE(slice(got, 0, c * sizeof(float)) == want);
        }
      }
    }
  }
}

TEST_CASE("device regions: checksums are refused with InvalidUsage, not run on device chunks", "[kernels][engine]") {
  auto ranks = make_ring(cuda_ipc::kNvlinkName, 2);
  for (auto& R : ranks) R->config.checksum = true;
  DeviceBuffer a(4096), b(4096);
  std::vector<Failure> failures;
  const auto status = run_all(ranks, DataType::Float32, ReduceOp::Sum, [&](int r) {
    return RingCall{RingCollective::Allreduce, r == 0 ? a.p : b.p, r == 0 ? a.p : b.p, 1024};
  }, &failures);
  for (std::size_t r = 0; r < status.size(); ++r) {
    REQUIRE(status[r].code() == ErrorCode::InvalidUsage);
    REQUIRE_THAT(failures[r].what, Catch::Contains("device regions without checksums"));
  }
}

TEST_CASE("device regions: point-to-point groups on device buffers over nvlink are exact", "[kernels][engine][p2p]") {
  const int n = 3;
  auto ranks = make_ring(cuda_ipc::kNvlinkName, n);
  const std::size_t block = 10000 + 13;  // several 4 KiB slots per transfer, odd length
  std::vector<std::unique_ptr<DeviceBuffer>> in, out;
  auto byte_of = [](int from, int to, std::size_t i) { return static_cast<std::uint8_t>(from * 31 + to * 7 + i % 251); };
  for (int r = 0; r < n; ++r) {
    in.push_back(std::make_unique<DeviceBuffer>(block * n));
    out.push_back(std::make_unique<DeviceBuffer>(block * n));
    std::vector<std::uint8_t> v(block * n);
    for (int to = 0; to < n; ++to)
      for (std::size_t i = 0; i < block; ++i) v[static_cast<std::size_t>(to) * block + i] = byte_of(r, to, i);
    in.back()->put(v);
    out.back()->put(std::vector<std::uint8_t>(block * n, 0xee));
  }
  for (int round = 0; round < 2; ++round) {  // twice: the channels' counters carry over between groups
    std::vector<Status> status(n);
    std::vector<Failure> failure(n);
    std::vector<DeviceRegions> regions(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        Rank& R = *ranks[static_cast<std::size_t>(r)];
        const auto i = static_cast<std::size_t>(r);
        regions[i] = DeviceRegions{&fake_cuda(), &fake_kernels(), R.stream};
        auto* src = static_cast<std::byte*>(in[i]->p);
        auto* dst = static_cast<std::byte*>(out[i]->p);
        std::vector<P2POp> ops;
        for (int k = 0; k < n; ++k) {  // every peer and ourselves, sends and receives interleaved
          const int to = (r + k) % n, from = (r + n - k) % n;
          ops.push_back(P2POp{true, to, src + static_cast<std::size_t>(to) * block, block, 0});
          ops.push_back(P2POp{false, from, dst + static_cast<std::size_t>(from) * block, block, 0});
        }
        status[i] = run_p2p(R.config, R.flags, R.by_position.data(), ops.data(), ops.size(), P2PDirect{}, failure[i], &regions[i]);
      });
    for (auto& t : threads) t.join();
    require_all_ok(status);
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r << " round " << round);
      const std::vector<std::uint8_t> got = out[static_cast<std::size_t>(r)]->get();
      for (int from = 0; from < n; ++from)
        for (std::size_t i = 0; i < block; ++i)
          if (got[static_cast<std::size_t>(from) * block + i] != byte_of(from, r, i)) FAIL("block from " << from << " wrong at " << i);
    }
  }
}
