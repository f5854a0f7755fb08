// MpiStore: the bootstrap store over MPI collectives (see include/ringfence/mpi.hpp for the
// supported usage). Part of the optional `ringfence::mpi` target; the core never sees MPI.
//
// Why rounds are safe for `Communicator` setup (src/comm/setup.cpp, src/comm/lanes.cpp): every rank runs
//   [nvlink_map: set gpu/<r>; get gpu/<every other rank>]      (only with a link map of `auto`)
//   set peer/<r>;                     get peer/<every other rank>
//   per lane (Lanes::connect_connections): set conn/<a>-<b>/addr/<r> for every peer;
//             get conn/<a>-<b>/addr/<peer> for every peer (connect between the gets);
//             set conn/<a>-<b>/regions/<r> for every peer; get conn/<a>-<b>/regions/<peer>...
//   store_barrier: add barrier/setup 1; set barrier/setup/done; get barrier/setup/done
// Each phase sets all of its keys before its first get, and its keys are new, so on every rank
// the first get of a phase misses and runs a round, that round delivers every rank's keys of
// the phase (all ranks are in the same phase: induction over rounds), and the phase's other
// gets are served locally. `add` is a round in which every rank adds 1, so everyone gets
// `size`, sets `done` itself and reads it locally: 4 rounds for one lane, 2 more per extra lane
// (+1 for the NVLink map). Ranks whose options differ (lane count, link map) fail the protocol
// fingerprint check in the regions round, on every rank, or see a key missing after a round.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <ringfence/error.hpp>
#include <ringfence/mpi.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "store_detail.hpp"

namespace ringfence {

namespace {

using Clock = std::chrono::steady_clock;

std::string mpi_error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", rc);
  return std::string(text, static_cast<std::size_t>(std::max(len, 0)));
}

void check_mpi(int rc, std::string_view what) {
  if (rc != MPI_SUCCESS) throw Error(ErrorCode::System, fmt::format("MpiStore: {} failed: {}", what, mpi_error_text(rc)), rc);
}

// Contribution of one rank to a round (native byte order: every rank runs the same binary on
// the same architecture, which the transports already assume):
//   u8 kind (0 = get, 1 = add), u32 key length, key (the key asked for or added to),
//   i64 delta (add only), u32 pair count, then per pair: u32 key length, key, u64 value length, value.
enum class Kind : std::uint8_t { Get = 0, Add = 1 };

void put_raw(Bytes& out, const void* p, std::size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  out.insert(out.end(), b, b + n);
}
template <class T>
void put(Bytes& out, T v) {
  put_raw(out, &v, sizeof(v));
}

struct Reader {
  std::span<const std::byte> in;
  std::size_t pos = 0;
  int from = 0;
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::span<const std::byte> bytes(std::size_t n) {
    need(n);
    auto s = in.subspan(pos, n);
    pos += n;
    return s;
  }
  void need(std::size_t n) const {
    if (in.size() - pos < n) malformed();
  }
  [[noreturn]] void malformed() const {
    throw InvalidUsage(fmt::format("MpiStore: malformed round contribution from rank {} (a different ringfence build?)", from));
  }
};

struct Contribution {
  Kind kind = Kind::Get;
  std::string key;
  std::int64_t delta = 0;
  std::vector<std::pair<std::string, Bytes>> pairs;
};

Contribution parse(std::span<const std::byte> in, int from) {
  Reader r{in, 0, from};
  Contribution c;
  const auto kind = r.get<std::uint8_t>();
  if (kind > 1) r.malformed();
  c.kind = static_cast<Kind>(kind);
  const auto klen = r.get<std::uint32_t>();
  const auto key = r.bytes(klen);
  c.key.assign(reinterpret_cast<const char*>(key.data()), key.size());
  if (c.kind == Kind::Add) c.delta = r.get<std::int64_t>();
  const auto n = r.get<std::uint32_t>();
  for (std::uint32_t i = 0; i < n; ++i) {
    const auto kl = r.get<std::uint32_t>();
    const auto k = r.bytes(kl);
    const auto vl = r.get<std::uint64_t>();
    const auto v = r.bytes(static_cast<std::size_t>(std::min<std::uint64_t>(vl, SIZE_MAX)));
    c.pairs.emplace_back(std::string(reinterpret_cast<const char*>(k.data()), k.size()), Bytes(v.begin(), v.end()));
  }
  if (r.pos != in.size()) r.malformed();
  return c;
}

std::string describe(const Contribution& c) {
  return c.kind == Kind::Add ? fmt::format("add('{}')", c.key) : fmt::format("get('{}')", c.key);
}

}  // namespace

struct MpiStore::Impl {
  MPI_Comm comm = MPI_COMM_NULL;  // private duplicate (valid once dup_request completed)
  MPI_Request dup_request = MPI_REQUEST_NULL;  // MPI_Comm_idup, completed by the first round
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{60000};
  mutable std::mutex mutex;
  std::map<std::string, Bytes, std::less<>> values;         // everything known here
  std::vector<std::pair<std::string, Bytes>> pending;       // set here since the last round
  std::uint64_t rounds_done = 0;

  // A posted round: its buffers must live until MPI completes it (MPI may write into them).
  struct Round {
    enum class Phase { Sizes, Data } phase = Phase::Sizes;
    MPI_Request request = MPI_REQUEST_NULL;
    Kind kind = Kind::Get;
    std::string key;                    // what it was started for (messages)
    std::uint64_t my_bytes = 0;
    std::vector<std::uint64_t> sizes;   // every rank's contribution size
    Bytes send, recv;
    std::vector<int> counts, displs;
  };
  std::unique_ptr<Round> round;        // posted and not completed
  std::int64_t last_add_result = 0;    // counter value after the last completed add round

  void check_thread() const {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) throw InvalidUsage(fmt::format("MpiStore: rank {}: used after MPI_Finalize", rank));
    int level = MPI_THREAD_SINGLE, is_main = 0;
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_SERIALIZED) {
      MPI_Is_thread_main(&is_main);
      if (!is_main)
        throw InvalidUsage(fmt::format(
            "MpiStore: rank {}: called from a thread that is not MPI's main thread, but MPI was initialised with a thread "
            "level below MPI_THREAD_SERIALIZED (use the main thread or MPI_Init_thread with SERIALIZED/MULTIPLE)",
            rank));
    }
  }

  // Completes the duplication of the communicator posted by the constructor (non-blocking, so a
  // rank that never constructs its store cannot hang the others: they time out here).
  void ensure_comm(Clock::time_point deadline, std::string_view waiting_for, std::chrono::milliseconds timeout_used) {
    if (dup_request == MPI_REQUEST_NULL) return;
    if (!wait_request(dup_request, deadline))
      throw TimeoutError(fmt::format(
          "MpiStore: rank {}: {} timed out after {} ms while duplicating the MPI communicator (MPI_Comm_idup): not every rank "
          "created its MpiStore (make_communicator) in time",
          rank, waiting_for, timeout_used.count()));
    // Errors come back as return codes (turned into exceptions), never abort the job from here.
    check_mpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  }

  // Starts a round contributing everything set since the last one (plus the add, if any).
  void start_round(Kind kind, std::string_view key, std::int64_t delta) {
    auto r = std::make_unique<Round>();
    r->kind = kind;
    r->key = std::string(key);
    put(r->send, static_cast<std::uint8_t>(kind));
    put(r->send, static_cast<std::uint32_t>(key.size()));
    put_raw(r->send, key.data(), key.size());
    if (kind == Kind::Add) put(r->send, delta);
    put(r->send, static_cast<std::uint32_t>(pending.size()));
    for (const auto& [k, v] : pending) {
      put(r->send, static_cast<std::uint32_t>(k.size()));
      put_raw(r->send, k.data(), k.size());
      put(r->send, static_cast<std::uint64_t>(v.size()));
      put_raw(r->send, v.data(), v.size());
    }
    r->my_bytes = r->send.size();
    r->sizes.assign(static_cast<std::size_t>(size), 0);
    check_mpi(MPI_Iallgather(&r->my_bytes, 1, MPI_UINT64_T, r->sizes.data(), 1, MPI_UINT64_T, comm, &r->request),
              "MPI_Iallgather (round sizes)");
    pending.clear();  // now carried by the posted round (resumed by a later call, never dropped)
    round = std::move(r);
  }

  // Polls `request` until it completes (true) or `deadline` passes (false).
  static bool wait_request(MPI_Request& request, Clock::time_point deadline) {
    for (std::uint64_t polls = 0;; ++polls) {
      int done = 0;
      check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return true;
      if (Clock::now() >= deadline) return false;
      if (polls < 1000)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(polls < 20000 ? 50 : 500));
    }
  }

  // Drives the posted round to completion and applies it; returns the contributions.
  // Throws TimeoutError (round left posted) when `deadline` passes first.
  std::vector<Contribution> finish_round(Clock::time_point deadline, std::string_view waiting_for,
                                         std::chrono::milliseconds timeout_used) {
    auto timed_out = [&] {
      return TimeoutError(fmt::format(
          "MpiStore: rank {}: {} timed out after {} ms in exchange round {} (started for {}('{}')): not every rank of the MPI "
          "communicator reached the matching store call (a rank failed or is slower than the timeout, or the ranks do "
          "not call the same sequence of get/add; see ringfence/mpi.hpp). The round stays posted.",
          rank, waiting_for, timeout_used.count(), rounds_done + 1, round->kind == Kind::Add ? "add" : "get",
          round->key));
    };
    if (round->phase == Round::Phase::Sizes) {
      if (!wait_request(round->request, deadline)) throw timed_out();
      std::uint64_t total = 0;
      for (auto s : round->sizes) total += s;
      if (total > static_cast<std::uint64_t>(INT_MAX)) {
        // Every rank computes the same total and stops here: the round ends consistently.
        round.reset();
        throw InvalidUsage(fmt::format("MpiStore: rank {}: exchange round {} would move {} bytes (MPI counts are int: at most {})",
                                       rank, rounds_done + 1, total, INT_MAX));
      }
      round->counts.resize(static_cast<std::size_t>(size));
      round->displs.resize(static_cast<std::size_t>(size));
      int offset = 0;
      for (int i = 0; i < size; ++i) {
        round->counts[static_cast<std::size_t>(i)] = static_cast<int>(round->sizes[static_cast<std::size_t>(i)]);
        round->displs[static_cast<std::size_t>(i)] = offset;
        offset += round->counts[static_cast<std::size_t>(i)];
      }
      round->recv.resize(std::max<std::size_t>(static_cast<std::size_t>(total), 1));
      check_mpi(MPI_Iallgatherv(round->send.data(), static_cast<int>(round->my_bytes), MPI_BYTE, round->recv.data(),
                                round->counts.data(), round->displs.data(), MPI_BYTE, comm, &round->request),
                "MPI_Iallgatherv (round data)");
      round->phase = Round::Phase::Data;
    }
    if (!wait_request(round->request, deadline)) throw timed_out();

    // Complete: parse every rank's contribution and apply the pairs in rank order.
    const std::unique_ptr<Round> r = std::move(round);
    ++rounds_done;
    std::vector<Contribution> all;
    all.reserve(static_cast<std::size_t>(size));
    for (int i = 0; i < size; ++i)
      all.push_back(parse(std::span<const std::byte>(r->recv).subspan(static_cast<std::size_t>(r->displs[static_cast<std::size_t>(i)]),
                                                                       static_cast<std::size_t>(r->counts[static_cast<std::size_t>(i)])),
                          i));
    for (auto& c : all)
      for (auto& [k, v] : c.pairs) values.insert_or_assign(std::move(k), std::move(v));

    // Every rank must have made the same kind of call (and added to the same key).
    for (int i = 1; i < size; ++i) {
      const auto& a = all[0];
      const auto& b = all[static_cast<std::size_t>(i)];
      if (a.kind != b.kind || (a.kind == Kind::Add && a.key != b.key))
        throw InvalidUsage(fmt::format(
            "MpiStore: rank {}: exchange round {} mixes different store calls: rank 0 {}, rank {} {}. Every rank must call the "
            "same sequence of get/add (see ringfence/mpi.hpp)",
            rank, rounds_done, describe(a), i, describe(b)));
    }
    if (all[0].kind == Kind::Add) {
      auto it = values.find(all[0].key);
      if (it == values.end()) it = values.emplace(all[0].key, Bytes(8, std::byte{0})).first;
      if (it->second.size() != 8)
        throw InvalidUsage(fmt::format("MpiStore: rank {}: add on key '{}', which holds a value that is not a 64-bit counter", rank,
                                       all[0].key));
      std::int64_t v = detail::get_i64(it->second);
      for (const auto& c : all) v = detail::wrapping_add(v, c.delta);
      detail::put_i64(it->second, v);
      last_add_result = v;
    }
    return all;
  }
};

MpiStore::MpiStore(MPI_Comm comm, std::chrono::milliseconds timeout) : impl_(std::make_unique<Impl>()) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) throw InvalidUsage("MpiStore: MPI is not initialised (call MPI_Init before, MPI_Finalize after)");
  if (comm == MPI_COMM_NULL) throw InvalidUsage("MpiStore: comm is MPI_COMM_NULL");
  if (timeout.count() <= 0) throw InvalidUsage(fmt::format("MpiStore: timeout must be positive (got {} ms)", timeout.count()));
  int inter = 0;
  check_mpi(MPI_Comm_test_inter(comm, &inter), "MPI_Comm_test_inter");
  if (inter) throw InvalidUsage("MpiStore: comm is an intercommunicator (use an intracommunicator such as MPI_COMM_WORLD)");
  impl_->timeout = timeout;
  check_mpi(MPI_Comm_rank(comm, &impl_->rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &impl_->size), "MPI_Comm_size");
  impl_->check_thread();
  // Non-blocking: MPI_Comm_dup would wait, without a deadline, for every rank to get here.
  check_mpi(MPI_Comm_idup(comm, &impl_->comm, &impl_->dup_request), "MPI_Comm_idup");
}

MpiStore::~MpiStore() {
  if (!impl_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && impl_->dup_request != MPI_REQUEST_NULL) {  // never used (e.g. one rank): finished yet?
    int done = 0;
    if (MPI_Test(&impl_->dup_request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 0;
    (void)done;
  }
  if (impl_->round || impl_->dup_request != MPI_REQUEST_NULL) {
    // MPI may still complete the posted collective into these buffers (or the duplicate's
    // handle): keep them, a deliberate leak, and the communicator it runs on.
    (void)impl_->round.release();
    (void)impl_.release();
    return;
  }
  if (!finalized && impl_->comm != MPI_COMM_NULL) MPI_Comm_free(&impl_->comm);
}

void MpiStore::set(std::string_view key, std::span<const std::byte> value) {
  RINGFENCE_EXPECTS(!key.empty() && key.size() <= kMaxStoreKeyBytes, "MpiStore: rank {}: key length {} is not in [1, {}]",
                    impl_->rank, key.size(), kMaxStoreKeyBytes);
  RINGFENCE_EXPECTS(value.size() <= kDefaultMaxStoreValueBytes, "MpiStore: rank {}: value of key '{}' has {} bytes (at most {})",
                    impl_->rank, key, value.size(), kDefaultMaxStoreValueBytes);
  std::lock_guard lock(impl_->mutex);
  Bytes v(value.begin(), value.end());
  impl_->values.insert_or_assign(std::string(key), v);
  impl_->pending.emplace_back(std::string(key), std::move(v));
}

Bytes MpiStore::get(std::string_view key, std::chrono::milliseconds timeout) {
  auto& m = *impl_;
  std::lock_guard lock(m.mutex);
  if (auto it = m.values.find(key); it != m.values.end()) return it->second;
  m.check_thread();
  const auto deadline = detail::deadline_after(timeout);
  const std::string what = fmt::format("get('{}')", key);
  // A round posted by an earlier call that timed out comes first; it may bring the key.
  m.ensure_comm(deadline, what, timeout);
  if (m.round) {
    (void)m.finish_round(deadline, what, timeout);
    if (auto it = m.values.find(key); it != m.values.end()) return it->second;
  }
  m.start_round(Kind::Get, key, 0);
  const std::vector<Contribution> all = m.finish_round(deadline, what, timeout);
  if (auto it = m.values.find(key); it != m.values.end()) return it->second;
  std::string others;
  for (int i = 0; i < m.size && i < 8; ++i)
    others += fmt::format("{}rank {} {}", i ? ", " : "", i, describe(all[static_cast<std::size_t>(i)]));
  if (m.size > 8) others += ", ...";
  throw InvalidUsage(fmt::format(
      "MpiStore: rank {}: key '{}' is still missing after exchange round {} (no rank set it before this round; the ranks were waiting for: {}). MpiStore "
      "supports only the bootstrap pattern in which every rank calls the same sequence of set/get/add and sets each key "
      "before any rank's get of it (see ringfence/mpi.hpp)",
      m.rank, key, m.rounds_done, others));
}

std::int64_t MpiStore::add(std::string_view key, std::int64_t delta) {
  RINGFENCE_EXPECTS(!key.empty() && key.size() <= kMaxStoreKeyBytes, "MpiStore: rank {}: key length {} is not in [1, {}]",
                    impl_->rank, key.size(), kMaxStoreKeyBytes);
  auto& m = *impl_;
  std::lock_guard lock(m.mutex);
  m.check_thread();
  const auto deadline = detail::deadline_after(m.timeout);
  const std::string what = fmt::format("add('{}')", key);
  m.ensure_comm(deadline, what, m.timeout);
  if (m.round) (void)m.finish_round(deadline, what, m.timeout);
  m.start_round(Kind::Add, key, delta);
  (void)m.finish_round(deadline, what, m.timeout);
  return m.last_add_result;
}

int MpiStore::rank() const noexcept { return impl_->rank; }
int MpiStore::size() const noexcept { return impl_->size; }
std::uint64_t MpiStore::rounds() const noexcept {
  std::lock_guard lock(impl_->mutex);
  return impl_->rounds_done;
}

namespace mpi {

Communicator make_communicator(MPI_Comm comm, CommOptions options) {
  auto store = std::make_shared<MpiStore>(comm, options.timeout);
  const int rank = store->rank(), size = store->size();
  return Communicator(std::move(store), rank, size, builtin_transports(), std::move(options));
}

}  // namespace mpi
}  // namespace ringfence
