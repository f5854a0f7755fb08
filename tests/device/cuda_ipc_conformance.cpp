// The CUDA IPC transports (nvlink, pcie) across two processes, as two ranks of one host use
// them: each rank allocates device memory through the transport, shares it by region key
// (cudaIpcGetMemHandle / cudaIpcOpenMemHandle), and both write into each other at once:
//   1. one large device -> device write (not a multiple of pcie's chunk: bounce slots reused),
//   2. 96 small device -> device writes of the same bytes (more than a link holds in flight:
//      write() returns InProgress and the test polls), then host -> device writes at both ends
//      of the region (bytes no earlier write carries),
//   3. a signal after all of them; the peer waits for it and at once reads its region back.
// Checked: every byte, completion ids in order and all Ok, the link's byte counters. The CUDA
// runtime is RINGFENCE_CUDART (the fake with threads for streams in CI) or libcudart (a GPU:
// tests/gpu, scripts/device-check.sh). Both ranks use the current device: one GPU suffices.
// Exits 77 when no CUDA IPC is usable.
//   cuda_ipc_conformance nvlink|pcie [BYTES]
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/transports/cuda_ipc.hpp>
#include <string>
#include <vector>

#include "cuda_rt.hpp"

using namespace ringfence;

namespace {

constexpr std::size_t kFlagBytes = 4096;
constexpr int kSmallWrites = 96;
constexpr std::size_t kSmallBytes = 1024;

std::uint8_t device_byte(int rank, std::size_t i) { return static_cast<std::uint8_t>(i * 131 + static_cast<std::size_t>(rank) * 7 + 1); }
std::uint8_t host_byte(int rank, std::size_t i) { return static_cast<std::uint8_t>(i * 17 + static_cast<std::size_t>(rank) * 3 + 200); }

struct Channel {
  int rd = -1, wr = -1;
  void send(const Bytes& b) const {
    const auto len = static_cast<std::uint32_t>(b.size());
    if (::write(wr, &len, 4) != 4 || (len > 0 && ::write(wr, b.data(), len) != static_cast<ssize_t>(len))) std::exit(3);
  }
  Bytes recv() const {
    std::uint32_t len = 0;
    if (::read(rd, &len, 4) != 4) std::exit(3);
    Bytes b(len);
    std::size_t got = 0;
    while (got < len) {
      const ssize_t n = ::read(rd, b.data() + got, len - got);
      if (n <= 0) std::exit(3);
      got += static_cast<std::size_t>(n);
    }
    return b;
  }
};

int fail(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: FAILED: %s\n", rank, what.c_str());
  return 1;
}

int run(int rank, const std::string& name, std::size_t bytes, const Channel& ch) {
  CommOptions options;
  if (const char* p = std::getenv("RINGFENCE_CUDART")) options.cuda_runtime = p;
  Logger log;
  const PeerInfo self{rank, "conformance-host", static_cast<std::int32_t>(::getpid())};
  const TransportContext ctx{self, 2, &options, &log};
  auto t = name == "nvlink" ? transports::cuda_ipc::make_nvlink_transport(ctx) : transports::cuda_ipc::make_pcie_transport(ctx);
  const Reachability r = t->can_reach(self, PeerInfo{1 - rank, "conformance-host", 0});
  if (!r.ok) {
    std::printf("rank %d: skipped: %s\n", rank, r.reason.c_str());
    return 77;
  }
  tools::CudaRt cuda;
  if (const std::string why = cuda.load(options.cuda_runtime); !why.empty()) return fail(rank, why);

  // Own memory: the source, the region the peer writes into, the flag block.
  const std::size_t region = bytes + 128;
  auto* src = static_cast<std::byte*>(t->allocate(bytes, MemoryKind::Device));
  auto* dst = static_cast<std::byte*>(t->allocate(region, MemoryKind::Device));
  auto* flags = static_cast<std::byte*>(t->allocate(kFlagBytes, MemoryKind::Host));
  std::vector<std::uint8_t> host(region, 0);
  cuda.check(cuda.memcpy_(dst, host.data(), region, tools::CudaRt::kHostToDevice), "cudaMemcpy");
  for (std::size_t i = 0; i < bytes; ++i) host[i] = device_byte(rank, i);
  cuda.check(cuda.memcpy_(src, host.data(), bytes, tools::CudaRt::kHostToDevice), "cudaMemcpy");
  std::memset(flags, 0, kFlagBytes);
  std::vector<std::uint8_t> head(64), tail(64);
  for (std::size_t i = 0; i < 64; ++i) head[i] = host_byte(rank, i), tail[i] = host_byte(rank, i + 64);

  MemoryRegion src_reg = t->register_memory(src, bytes, MemoryKind::Device);
  MemoryRegion dst_reg = t->register_memory(dst, region, MemoryKind::Device);
  MemoryRegion flag_reg = t->register_memory(flags, kFlagBytes, MemoryKind::Host);
  auto listen = t->listen();
  ch.send(listen->address());
  ch.send(dst_reg.key());
  ch.send(flag_reg.key());
  const Bytes peer_address = ch.recv(), peer_dst_key = ch.recv(), peer_flag_key = ch.recv();
  RemoteRegion peer_dst = t->import_region(peer_dst_key);
  RemoteRegion peer_flags = t->import_region(peer_flag_key);
  if (peer_dst.size() != region || peer_flags.size() != kFlagBytes) return fail(rank, "imported sizes differ");
  std::unique_ptr<Link> link;
  if (!t->connect(*listen, PeerInfo{1 - rank, "conformance-host", 0}, peer_address)->try_finish(link).is_ok())
    return fail(rank, "connect did not finish");

  std::vector<Completion> done;
  auto drain = [&] {
    Completion c[16];
    std::size_t n = 0;
    if (!link->poll(c, n).is_ok()) std::exit(fail(rank, "poll failed"));
    done.insert(done.end(), c, c + n);
  };
  std::uint64_t id = 0;
  auto submit = [&](auto&& op) {  // retries while the link is full (the id is taken once)
    ++id;
    for (;;) {
      const Status s = op();
      if (s.is_ok()) return;
      if (!s.in_progress()) std::exit(fail(rank, std::string("operation refused: ") + std::string(to_string(s.code()))));
      drain();
    }
  };
  const auto start = std::chrono::steady_clock::now();
  submit([&] { return link->write(WriteOp{src, &src_reg, &peer_dst, 64, bytes, id}); });
  for (int k = 0; k < kSmallWrites; ++k) {  // same bytes as the large write: any order lands the same
    const std::size_t off = (static_cast<std::size_t>(k) * 7919 * kSmallBytes) % (bytes - kSmallBytes);
    submit([&] { return link->write(WriteOp{src + off, nullptr, &peer_dst, 64 + off, kSmallBytes, id}); });
  }
  submit([&] { return link->write(WriteOp{head.data(), nullptr, &peer_dst, 0, 64, id}); });
  submit([&] { return link->write(WriteOp{tail.data(), nullptr, &peer_dst, 64 + bytes, 64, id}); });
  submit([&] { return link->signal(SignalOp{&peer_flags, 0, 1, id}); });
  const std::uint64_t ops = id;

  auto& flag = *reinterpret_cast<SignalFlag*>(flags);
  for (;;) {
    const Status s = link->wait(flag, 1, std::chrono::milliseconds(100));
    if (s.is_ok()) break;
    if (!s.in_progress()) return fail(rank, std::string("wait: ") + std::string(to_string(s.code())));
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(60)) return fail(rank, "no signal within 60 s");
  }
  // The peer's bytes, as the signal promised them: read at once, before our own copies are waited for.
  cuda.check(cuda.memcpy_(host.data(), dst, region, tools::CudaRt::kDeviceToHost), "cudaMemcpy");
  const int peer = 1 - rank;
  for (std::size_t i = 0; i < region; ++i) {
    const std::uint8_t want = i < 64 ? host_byte(peer, i) : i < 64 + bytes ? device_byte(peer, i - 64) : host_byte(peer, i - bytes);
    if (host[i] != want)
      return fail(rank, "byte " + std::to_string(i) + " is " + std::to_string(host[i]) + ", expected " + std::to_string(want));
  }
  while (done.size() < ops) {
    drain();
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(60))
      return fail(rank, "completions missing after 60 s: " + std::to_string(done.size()) + " of " + std::to_string(ops));
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

  for (std::size_t i = 0; i < done.size(); ++i) {
    if (done[i].wr_id != i + 1) return fail(rank, "completion " + std::to_string(i) + " has id " + std::to_string(done[i].wr_id));
    if (!done[i].status.is_ok()) return fail(rank, "completion " + std::to_string(i) + " failed");
  }
  const std::uint64_t want_bytes = bytes + 128 + kSmallWrites * kSmallBytes;
  if (link->stats().bytes_written != want_bytes || link->stats().signals != 1 || link->stats().errors != 0)
    return fail(rank, "link counters differ");

  // Hold the memory until the peer read its region too.
  ch.send(Bytes{std::byte{1}});
  (void)ch.recv();
  std::printf("rank %d: %s: %zu + %d writes and a signal to rank %d exact, %.1f ms\n", rank, name.c_str(), bytes, 2 + kSmallWrites,
              peer, ms);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || (std::strcmp(argv[1], "nvlink") != 0 && std::strcmp(argv[1], "pcie") != 0)) {
    std::fprintf(stderr, "usage: cuda_ipc_conformance nvlink|pcie [BYTES]\n");
    return 2;
  }
  const std::size_t bytes = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (std::size_t{5} << 20) + 333;
  if (bytes < 4 * kSmallBytes) return 2;
  int a[2], b[2];  // a: 0 -> 1, b: 1 -> 0; made before fork, no CUDA call before it either
  if (::pipe(a) != 0 || ::pipe(b) != 0) return 3;
  const pid_t child = ::fork();
  if (child < 0) return 3;
  if (child == 0) {
    int rc = 1;
    try {
      rc = run(1, argv[1], bytes, Channel{a[0], b[1]});
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank 1: FAILED: %s\n", e.what());
    }
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(rc);
  }
  int rc = 1;
  try {
    rc = run(0, argv[1], bytes, Channel{b[0], a[1]});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank 0: FAILED: %s\n", e.what());
  }
  int status = 0;
  ::close(a[1]);  // unblocks a child still waiting for us
  ::waitpid(child, &status, 0);
  const int child_rc = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  if (rc == 77 && child_rc == 77) return 77;
  return rc == 0 && child_rc == 0 ? 0 : 1;
}
