// The CUDA IPC transports (nvlink, pcie) against the SPI contract, in one process over the fake
// CUDA runtime (fake_cudart_streams.cpp: streams are threads, copies are delayed, "device"
// memory is shared memory): ordering of a signal behind its writes, completion ids, bounds,
// fencing, malformed keys, which device pointers can be shared, and peer access between GPUs.
// The two-process path (IPC handles opened by another process) is cuda_ipc_conformance.cpp.
#include <cstdlib>
#include <cstring>
#include <ringfence/error.hpp>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/transports/cuda_ipc.hpp>
#include <string>
#include <unistd.h>
#include <vector>

#include "support/catch.hpp"
#include "support/completions.hpp"
#include "support/scoped_env.hpp"

extern "C" {
int cudaMalloc(void**, std::size_t);
int cudaFree(void*);
int cudaMemcpy(void*, const void*, std::size_t, int);
int cudaSetDevice(int);
void fake_cuda_set_copy_delay_us(unsigned);
}

using namespace ringfence;
namespace cuda_ipc = transports::cuda_ipc;

namespace {

constexpr int kHostToDevice = 1, kDeviceToHost = 2;

std::unique_ptr<Transport> make(std::string_view name, const TransportContext& ctx) {
  return name == cuda_ipc::kNvlinkName ? cuda_ipc::make_nvlink_transport(ctx) : cuda_ipc::make_pcie_transport(ctx);
}

using test::ScopedEnv;

// Two transports of one process (ranks 0 and 1) on devices `dev_a`, `dev_b`, and a link 0 -> 1.
struct Pair {
  CommOptions options;
  Logger log;
  std::unique_ptr<Transport> a, b;
  std::unique_ptr<ListenHandle> la, lb;
  std::unique_ptr<Link> a_to_b;
  PeerInfo pa{0, "h", static_cast<std::int32_t>(::getpid())}, pb{1, "h", static_cast<std::int32_t>(::getpid())};
  explicit Pair(std::string_view name, int dev_a = 0, int dev_b = 0, bool connect = true) {
    options.cuda_runtime = RINGFENCE_FAKE_CUDART_PATH;
    REQUIRE(cudaSetDevice(dev_a) == 0);
    a = make(name, TransportContext{pa, 2, &options, &log});
    REQUIRE(cudaSetDevice(dev_b) == 0);
    b = make(name, TransportContext{pb, 2, &options, &log});
    REQUIRE(cudaSetDevice(0) == 0);
    la = a->listen();
    lb = b->listen();
    if (connect) REQUIRE(a->connect(*la, pb, lb->address())->try_finish(a_to_b).is_ok());
  }
  std::unique_ptr<PendingLink> connect_again() { return a->connect(*la, pb, lb->address()); }
};

using test::collect_completions;

std::vector<std::uint8_t> read_device(const void* p, std::size_t n) {
  std::vector<std::uint8_t> out(n);
  REQUIRE(cudaMemcpy(out.data(), p, n, kDeviceToHost) == 0);
  return out;
}

}  // namespace

TEST_CASE("cuda_ipc: reachability needs one host and a usable CUDA runtime, and says why not", "[cuda_ipc][conformance]") {
  for (std::string_view name : {cuda_ipc::kNvlinkName, cuda_ipc::kPcieName}) {
    Pair p(name, 0, 0, false);
    REQUIRE(p.a->name() == name);
    REQUIRE(p.a->traits().shares_memory);
    REQUIRE(p.a->traits().writes_device_memory);
    // nvlink declares pcie as where its links move (the default fallback table); pcie none.
    REQUIRE(p.a->traits().fallbacks == (name == cuda_ipc::kNvlinkName ? std::vector<std::string>{"pcie"} : std::vector<std::string>{}));
    REQUIRE(p.a->can_reach(p.pa, p.pb).ok);
    const Reachability other = p.a->can_reach(p.pa, PeerInfo{1, "elsewhere", 1});
    REQUIRE_FALSE(other.ok);
    REQUIRE_THAT(other.reason, Catch::Contains("elsewhere"));

    CommOptions no_runtime;
    no_runtime.cuda_runtime = "/nonexistent/libcudart.so.13";
    Logger log;
    auto t = make(name, TransportContext{p.pa, 2, &no_runtime, &log});
    const Reachability none = t->can_reach(p.pa, p.pb);
    REQUIRE_FALSE(none.ok);
    REQUIRE_THAT(none.reason, Catch::Contains("no usable CUDA IPC") && Catch::Contains("/nonexistent/libcudart.so.13"));
    REQUIRE_THROWS_WITH(t->allocate(64, MemoryKind::Device), Catch::Contains("rank 0") && Catch::Contains(std::string(name)));
  }
}

TEST_CASE("nvlink: the expected bandwidth of a pair follows its GPUs' NVML facts", "[cuda_ipc][topology]") {
  Pair nv(cuda_ipc::kNvlinkName, 0, 0, false);
  Pair pc(cuda_ipc::kPcieName, 0, 0, false);
  auto with_gpu = [](PeerInfo p, std::string bus, std::vector<std::string> links, std::uint32_t switches) {
    p.gpu_bus_id = std::move(bus);
    p.nvlink_bus_ids = std::move(links);
    p.nvswitch_links = switches;
    return p;
  };
  auto gbps = [](Pair& p, const PeerInfo& a, const PeerInfo& b) {
    const Reachability r = p.a->can_reach(a, b);
    REQUIRE(r.ok);
    return r.bandwidth_gbps;
  };
  const PeerInfo a2 = with_gpu(nv.pa, "0000:3b:00.0", {"0000:3c:00.0", "0000:3c:00.0"}, 0);
  const PeerInfo b = with_gpu(nv.pb, "0000:3c:00.0", {}, 0);
  const PeerInfo c = with_gpu(nv.pb, "0000:3d:00.0", {}, 0);
  REQUIRE(gbps(nv, nv.pa, nv.pb) == cuda_ipc::kNominalNvlinkGbps);      // GPUs not named
  REQUIRE(gbps(nv, a2, b) == 2 * cuda_ipc::kNvlinkLinkGbps);            // two direct NVLinks
  REQUIRE(gbps(nv, b, a2) == 2 * cuda_ipc::kNvlinkLinkGbps);            // the same from the other end
  REQUIRE(gbps(nv, a2, c) == cuda_ipc::kPcieGbps);                      // no NVLink: peer to peer over PCIe
  REQUIRE(gbps(nv, with_gpu(nv.pa, "0000:3b:00.0", {}, 18), with_gpu(nv.pb, "0000:3c:00.0", {}, 12)) ==
          12 * cuda_ipc::kNvlinkLinkGbps);                              // NVSwitch: the narrower end
  REQUIRE(gbps(nv, b, with_gpu(nv.pb, "0000:3c:00.0", {}, 0)) == cuda_ipc::kNominalNvlinkGbps);  // one GPU shared
  REQUIRE(gbps(pc, a2, b) == cuda_ipc::kPcieGbps);                      // pcie stages through the host whatever joins the GPUs
}

TEST_CASE("cuda_ipc: a signal is stored only after the writes before it landed, completions in order", "[cuda_ipc][conformance]") {
  for (std::string_view name : {cuda_ipc::kNvlinkName, cuda_ipc::kPcieName}) {
    INFO(name);
    Pair p(name);
    fake_cuda_set_copy_delay_us(3000);  // every copy waits 3 ms before it lands
    const std::size_t bytes = 3 * cuda_ipc::kPcieChunkBytes + 77;  // pcie: four chunks, slot reuse
    auto* src = static_cast<std::byte*>(p.a->allocate(bytes, MemoryKind::Device));
    auto* dst = static_cast<std::byte*>(p.b->allocate(bytes + 64, MemoryKind::Device));
    auto* flags = static_cast<std::byte*>(p.b->allocate(4096, MemoryKind::Host));
    std::memset(flags, 0, 4096);
    std::vector<std::uint8_t> pattern(bytes), zeros(bytes + 64, 0);
    for (std::size_t i = 0; i < bytes; ++i) pattern[i] = static_cast<std::uint8_t>(i * 29 + 3);
    REQUIRE(cudaMemcpy(src, pattern.data(), bytes, kHostToDevice) == 0);
    REQUIRE(cudaMemcpy(dst, zeros.data(), bytes + 64, kHostToDevice) == 0);
    MemoryRegion src_reg = p.a->register_memory(src, bytes, MemoryKind::Device);
    MemoryRegion dst_reg = p.b->register_memory(dst, bytes + 64, MemoryKind::Device);
    MemoryRegion flag_reg = p.b->register_memory(flags, 4096, MemoryKind::Host);
    RemoteRegion rdst = p.a->import_region(dst_reg.key());
    RemoteRegion rflags = p.a->import_region(flag_reg.key());
    REQUIRE(rdst.size() == bytes + 64);

    REQUIRE(p.a_to_b->write(WriteOp{src, &src_reg, &rdst, 64, bytes, 7}).is_ok());
    REQUIRE(p.a_to_b->signal(SignalOp{&rflags, 128, 1, 8}).is_ok());
    auto& flag = *reinterpret_cast<SignalFlag*>(flags + 128);
    // The copies are still sleeping: the flag must not be there yet, whoever polls.
    Completion c[4];
    std::size_t n = 0;
    REQUIRE(p.a_to_b->poll(c, n).is_ok());
    REQUIRE(n == 0);
    REQUIRE(p.a_to_b->wait(flag, 1, std::chrono::microseconds(200)).in_progress());
    REQUIRE(flag.value.load() == 0);
    // Once it is, every byte before it is.
    for (int i = 0; i < 2000 && !p.a_to_b->wait(flag, 1, std::chrono::milliseconds(5)).is_ok(); ++i) {
    }
    REQUIRE(flag.value.load() == 1);
    const auto got = read_device(dst, bytes + 64);
    REQUIRE(std::memcmp(got.data() + 64, pattern.data(), bytes) == 0);
    REQUIRE(std::all_of(got.begin(), got.begin() + 64, [](std::uint8_t b) { return b == 0; }));
    const auto done = collect_completions(*p.a_to_b, 2);
    REQUIRE(done.size() == 2);
    REQUIRE(done[0].wr_id == 7);
    REQUIRE(done[1].wr_id == 8);
    REQUIRE((done[0].status.is_ok() && done[1].status.is_ok()));
    REQUIRE(p.a_to_b->stats().bytes_written == bytes);
    REQUIRE(p.a_to_b->stats().signals == 1);
    // With nothing before it in flight a signal is stored at once, without a poll or wait on
    // this link (a rank whose next wait is on another link must not hold back a credit).
    REQUIRE(p.a_to_b->signal(SignalOp{&rflags, 192, 5, 9}).is_ok());
    REQUIRE(reinterpret_cast<SignalFlag*>(flags + 192)->value.load() == 5);
    REQUIRE(collect_completions(*p.a_to_b, 1).at(0).wr_id == 9);
    REQUIRE(p.a_to_b->stats().signals == 2);
    fake_cuda_set_copy_delay_us(500);
    REQUIRE(p.b->deallocate(dst));
    REQUIRE_FALSE(p.b->deallocate(dst));
    REQUIRE_FALSE(p.a->deallocate(flags));  // b's memory
  }
}

TEST_CASE("cuda_ipc: copies of at least kTimedCopyBytes are timed with CUDA events for the bandwidth evidence", "[cuda_ipc][health]") {
  for (std::string_view name : {cuda_ipc::kNvlinkName, cuda_ipc::kPcieName}) {
    INFO(name);
    Pair p(name);
    REQUIRE(p.a_to_b->times_writes());  // the executor leaves the clock to the link
    fake_cuda_set_copy_delay_us(2000);  // every copy (pcie: every hop) sleeps 2 ms before it lands
    const std::size_t big = cuda_ipc::kTimedCopyBytes, small = cuda_ipc::kTimedCopyBytes - 1;
    auto* src = static_cast<std::byte*>(p.a->allocate(big, MemoryKind::Device));
    auto* dst = static_cast<std::byte*>(p.b->allocate(2 * big, MemoryKind::Device));
    MemoryRegion src_reg = p.a->register_memory(src, big, MemoryKind::Device);
    MemoryRegion dst_reg = p.b->register_memory(dst, 2 * big, MemoryKind::Device);
    RemoteRegion rdst = p.a->import_region(dst_reg.key());
    REQUIRE(p.a_to_b->write(WriteOp{src, &src_reg, &rdst, 0, small, 1}).is_ok());
    REQUIRE(p.a_to_b->write(WriteOp{src, &src_reg, &rdst, big, big, 2}).is_ok());
    REQUIRE(p.a_to_b->stats().timed_bytes == 0);  // nothing landed yet: nothing timed
    REQUIRE(collect_completions(*p.a_to_b, 2).size() == 2);
    // Only the large copy counts, with at least its 2 ms; the small one neither adds bytes nor time.
    REQUIRE(p.a_to_b->stats().timed_bytes == big);
    REQUIRE(p.a_to_b->stats().timed_ns >= 2'000'000);
    REQUIRE(p.a_to_b->stats().timed_ns < 2'000'000'000);
    REQUIRE(p.a_to_b->stats().bytes_written == big + small);
    fake_cuda_set_copy_delay_us(500);
  }
}

TEST_CASE("cuda_ipc: out-of-bounds writes, misplaced signals and device sources into host regions are refused",
          "[cuda_ipc][conformance]") {
  for (std::string_view name : {cuda_ipc::kNvlinkName, cuda_ipc::kPcieName}) {
    Pair p(name);
    auto* src = p.a->allocate(256, MemoryKind::Device);
    auto* dst = p.b->allocate(256, MemoryKind::Device);
    auto* flags = static_cast<std::byte*>(p.b->allocate(4096, MemoryKind::Host));
    MemoryRegion dst_reg = p.b->register_memory(dst, 256, MemoryKind::Device);
    MemoryRegion flag_reg = p.b->register_memory(flags, 4096, MemoryKind::Host);
    RemoteRegion rdst = p.a->import_region(dst_reg.key());
    RemoteRegion rflags = p.a->import_region(flag_reg.key());
    std::vector<std::uint8_t> host(512, 1);
    REQUIRE(p.a_to_b->write(WriteOp{host.data(), nullptr, &rdst, 200, 57, 1}).code() == ErrorCode::InvalidUsage);
    REQUIRE(p.a_to_b->write(WriteOp{host.data(), nullptr, &rdst, 257, 0, 1}).code() == ErrorCode::InvalidUsage);
    REQUIRE(p.a_to_b->write(WriteOp{host.data(), nullptr, nullptr, 0, 8, 1}).code() == ErrorCode::InvalidUsage);
    REQUIRE(p.a_to_b->signal(SignalOp{&rflags, 4096 - 32, 1, 1}).code() == ErrorCode::InvalidUsage);  // runs past the end
    REQUIRE(p.a_to_b->signal(SignalOp{&rflags, 8, 1, 1}).code() == ErrorCode::InvalidUsage);          // misaligned
    REQUIRE(p.a_to_b->signal(SignalOp{&rdst, 0, 1, 1}).code() == ErrorCode::InvalidUsage);            // device flag
    REQUIRE(p.a_to_b->write(WriteOp{src, nullptr, &rflags, 0, 64, 1}).code() == ErrorCode::InvalidUsage);  // device -> host
    REQUIRE(p.a_to_b->stats().errors == 7);
    REQUIRE(p.a_to_b->stats().writes == 0);
    REQUIRE(std::all_of(flags, flags + 4096, [](std::byte b) { return b == std::byte{0}; }));
    // A host source into a host region is a plain shared-memory copy.
    REQUIRE(p.a_to_b->write(WriteOp{host.data(), nullptr, &rflags, 1024, 64, 2}).is_ok());
    REQUIRE(flags[1024 + 63] == std::byte{1});
  }
}

TEST_CASE("cuda_ipc: fence completes pending operations with Fenced and refuses later ones, reopen resumes", "[cuda_ipc][conformance]") {
  for (std::string_view name : {cuda_ipc::kNvlinkName, cuda_ipc::kPcieName}) {
    Pair p(name);
    auto* src = p.a->allocate(4096, MemoryKind::Device);
    auto* dst = p.b->allocate(4096, MemoryKind::Device);
    auto* flags = static_cast<std::byte*>(p.b->allocate(4096, MemoryKind::Host));
    std::memset(flags, 0, 4096);
    MemoryRegion dst_reg = p.b->register_memory(dst, 4096, MemoryKind::Device);
    MemoryRegion flag_reg = p.b->register_memory(flags, 4096, MemoryKind::Host);
    RemoteRegion rdst = p.a->import_region(dst_reg.key());
    RemoteRegion rflags = p.a->import_region(flag_reg.key());
    REQUIRE(p.a_to_b->write(WriteOp{src, nullptr, &rdst, 0, 4096, 1}).is_ok());
    REQUIRE(p.a_to_b->signal(SignalOp{&rflags, 0, 9, 2}).is_ok());
    p.a_to_b->fence(FenceReason::User);
    p.a_to_b->fence(FenceReason::User);  // idempotent
    REQUIRE(p.a_to_b->state() == LinkState::Fenced);
    const auto done = collect_completions(*p.a_to_b, 2);
    REQUIRE(done.size() == 2);
    REQUIRE(done[0].status.code() == ErrorCode::Fenced);
    REQUIRE(done[1].status.code() == ErrorCode::Fenced);
    REQUIRE(reinterpret_cast<SignalFlag*>(flags)->value.load() == 0);  // a fenced signal is never stored
    REQUIRE(p.a_to_b->write(WriteOp{src, nullptr, &rdst, 0, 64, 3}).code() == ErrorCode::Fenced);
    REQUIRE(p.a_to_b->signal(SignalOp{&rflags, 0, 9, 4}).code() == ErrorCode::Fenced);
    REQUIRE(p.a_to_b->can_reopen());
    p.a_to_b->reopen();
    REQUIRE(p.a_to_b->state() == LinkState::Up);
    REQUIRE(p.a_to_b->signal(SignalOp{&rflags, 0, 9, 5}).is_ok());
    REQUIRE(p.a_to_b->wait(*reinterpret_cast<SignalFlag*>(flags), 9, std::chrono::seconds(5)).is_ok());
  }
}

TEST_CASE("cuda_ipc: malformed region keys and addresses are rejected", "[cuda_ipc][hostile]") {
  Pair p(cuda_ipc::kNvlinkName);
  auto* dst = p.b->allocate(256, MemoryKind::Device);
  const Bytes key = p.b->register_memory(dst, 256, MemoryKind::Device).key();
  REQUIRE_THROWS_AS(p.a->import_region(Bytes{}), InvalidUsage);
  Bytes bad_tag = key;
  bad_tag[0] = std::byte{9};
  REQUIRE_THROWS_WITH(p.a->import_region(bad_tag), Catch::Contains("malformed region key (tag 9)"));
  Bytes short_key(key.begin(), key.end() - 1);
  REQUIRE_THROWS_WITH(p.a->import_region(short_key), Catch::Contains("malformed device region key"));
  Bytes no_base = key;
  std::memset(no_base.data() + 16, 0, 8);
  REQUIRE_THROWS_WITH(p.a->import_region(no_base), Catch::Contains("base 0x0"));
  Bytes overflow = key;
  std::memset(overflow.data() + 24, 0xff, 8);  // offset + bytes wraps around
  REQUIRE_THROWS_AS(p.a->import_region(overflow), InvalidUsage);
  Bytes host_key{std::byte{2}, std::byte{1}};  // a host tag followed by a truncated shm key
  REQUIRE_THROWS_AS(p.a->import_region(host_key), InvalidUsage);
  Bytes address = p.lb->address();
  address.pop_back();
  REQUIRE_THROWS_WITH(p.a->connect(*p.la, p.pb, address), Catch::Contains("malformed address of rank 1"));
}

TEST_CASE("cuda_ipc: device memory is shared by allocation: interior pointers of allocate() are placed, foreign ones refused",
          "[cuda_ipc][conformance]") {
  for (std::string_view name : {cuda_ipc::kNvlinkName, cuda_ipc::kPcieName}) {
    Pair p(name);
    auto* dst = static_cast<std::byte*>(p.b->allocate(8192, MemoryKind::Device));
    std::vector<std::uint8_t> zeros(8192, 0), ones(100, 0xab);
    REQUIRE(cudaMemcpy(dst, zeros.data(), zeros.size(), kHostToDevice) == 0);
    MemoryRegion inner = p.b->register_memory(dst + 1000, 5000, MemoryKind::Device);  // interior of allocate()
    RemoteRegion rinner = p.a->import_region(inner.key());
    REQUIRE(rinner.size() == 5000);
    REQUIRE(p.a_to_b->write(WriteOp{ones.data(), nullptr, &rinner, 4900, 100, 1}).is_ok());
    REQUIRE(collect_completions(*p.a_to_b, 1).size() == 1);
    const auto got = read_device(dst, 8192);
    REQUIRE(got[5899] == 0);
    REQUIRE(got[5900] == 0xab);
    REQUIRE(got[5999] == 0xab);
    REQUIRE(got[6000] == 0);
    REQUIRE_THROWS_WITH(p.b->register_memory(dst + 1000, 7193, MemoryKind::Device), Catch::Contains("runs past its allocation"));

    void* foreign = nullptr;
    REQUIRE(cudaMalloc(&foreign, 4096) == 0);
    MemoryRegion whole = p.b->register_memory(foreign, 4096, MemoryKind::Device);  // a cudaMalloc base: fine
    REQUIRE(p.a->import_region(whole.key()).size() == 4096);
    REQUIRE_THROWS_WITH(p.b->register_memory(static_cast<std::byte*>(foreign) + 64, 128, MemoryKind::Device),
                        Catch::Contains("rank 1") && Catch::Contains("base pointer of a whole cudaMalloc allocation"));
    REQUIRE(cudaFree(foreign) == 0);
  }
}

TEST_CASE("nvlink: GPUs without peer access are refused at connect, pcie connects them", "[cuda_ipc][conformance]") {
  ScopedEnv devices("FAKE_CUDA_DEVICES", "2");
  {
    ScopedEnv no_p2p("FAKE_CUDA_P2P", "0");
    Pair nv(cuda_ipc::kNvlinkName, 0, 1, false);
    REQUIRE_THROWS_WITH(nv.connect_again(), Catch::Contains("rank 0: nvlink: GPU 0 cannot access GPU 1 of rank 1 peer to peer") &&
                                                Catch::Contains("use the pcie transport"));
    Pair pc(cuda_ipc::kPcieName, 0, 1);
    auto* src = pc.a->allocate(cuda_ipc::kPcieChunkBytes + 5, MemoryKind::Device);
    auto* dst = pc.b->allocate(cuda_ipc::kPcieChunkBytes + 5, MemoryKind::Device);
    std::vector<std::uint8_t> pattern(cuda_ipc::kPcieChunkBytes + 5);
    for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::uint8_t>(i % 251);
    REQUIRE(cudaMemcpy(src, pattern.data(), pattern.size(), kHostToDevice) == 0);
    MemoryRegion reg = pc.b->register_memory(dst, pattern.size(), MemoryKind::Device);
    RemoteRegion r = pc.a->import_region(reg.key());
    REQUIRE(pc.a_to_b->write(WriteOp{src, nullptr, &r, 0, pattern.size(), 1}).is_ok());
    const auto done = collect_completions(*pc.a_to_b, 1);
    REQUIRE(done.size() == 1);
    REQUIRE(done[0].status.is_ok());
    REQUIRE(read_device(dst, pattern.size()) == pattern);
  }
  Pair nv(cuda_ipc::kNvlinkName, 0, 1);  // with peer access: connects (and enables it once)
  std::unique_ptr<Link> second;
  REQUIRE(nv.connect_again()->try_finish(second).is_ok());
}
