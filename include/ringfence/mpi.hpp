#pragma once
/// \file mpi.hpp
/// Optional MPI bootstrap adapter (target `ringfence::mpi`, built only when CMake finds MPI).
/// The only ringfence header that includes `<mpi.h>`.
///
/// `ringfence::mpi::make_communicator(MPI_COMM_WORLD)` builds a communicator whose setup
/// exchanges addresses and region keys through MPI collectives (`MpiStore`) instead of the TCP
/// store: no store host, no port, no `MASTER_ADDR`/`RINGFENCE_STORE_ADDR`. Rank and size come
/// from the MPI communicator; transports from `builtin_transports()`; the data path is
/// ringfence's own (MPI is not used after setup).
///
/// ```cpp
/// MPI_Init(&argc, &argv);
/// {
///   ringfence::Communicator comm = ringfence::mpi::make_communicator(MPI_COMM_WORLD);
///   comm.allreduce(buf, buf, n, ringfence::DataType::Float32, ringfence::ReduceOp::Sum);
/// }  // destroy the communicator before MPI_Finalize
/// MPI_Finalize();
/// ```

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <ringfence/communicator.hpp>
#include <ringfence/options.hpp>
#include <ringfence/store.hpp>
#include <span>
#include <string_view>

namespace ringfence {

/// A bootstrap `Store` over an MPI communicator, without any TCP store.
///
/// Supported usage (exactly what `Communicator` setup does): **every rank of the MPI
/// communicator calls the same sequence of store operations**, where each `get` asks for a key
/// that some rank `set` before reaching that `get`, and each `add` is made by every rank on the
/// same key at the same point of the sequence (a counter every rank adds to once acts as a
/// barrier).
///
/// How it works: `set` only records the pair locally (it never communicates). A `get` of a key
/// this rank already knows (set here or received earlier) returns at once. A `get` of an
/// unknown key, and every `add`, runs one *exchange round*: every rank contributes the pairs it
/// set since its previous round (plus, for `add`, its key and delta) through `MPI_Iallgather`
/// of the sizes and `MPI_Iallgatherv` of the packed bytes, on a private duplicate of the
/// communicator, polled with `MPI_Test` against the deadline. Afterwards every rank holds the
/// same pairs (where two ranks set the same key in one round, the higher rank's value wins).
/// `add` returns the counter's value after the round, i.e. with every rank's delta of that
/// round applied (the same value on every rank).
///
/// Errors, never hangs:
/// - a key still unknown after a complete round (nobody set it before the `get`) throws
///   `InvalidUsage` naming the key, on every rank that asked for it, and lists what the other
///   ranks were waiting for;
/// - a round in which the ranks disagree on the kind of call (`add` here, `get` there) or on the
///   `add` key throws `InvalidUsage` on every rank (each sees every contribution);
/// - a round that does not complete by the deadline (some rank never reached the matching
///   call: it failed earlier, is slower than the timeout, or uses the store differently) throws
///   `TimeoutError` naming the key and the round (or the duplication of the communicator). MPI cannot cancel a collective, so the round
///   stays posted: the next `get`/`add` on this store first tries to complete it (if the late
///   ranks do arrive, nothing is lost; an `add` whose round timed out may still be applied).
///   A store destroyed with a round still posted leaks the round's buffers and its duplicate
///   communicator on purpose (MPI may still write into them); the MPI job is then best ended
///   with `MPI_Abort`.
///
/// Not supported: `Communicator::shrink` (the excluded ranks do not take part in the rounds, so
/// the survivors time out), several communicators sharing one `MpiStore` concurrently, and
/// store calls from threads MPI forbids (with `MPI_THREAD_SINGLE`/`FUNNELED` only the main
/// thread may use the store: other threads get `InvalidUsage`). Thread-safe otherwise (one
/// call at a time).
class MpiStore final : public Store {
 public:
  /// Starts duplicating `comm` with `MPI_Comm_idup` (collective: every rank of `comm` constructs
  /// its store at the same point; non-blocking, so a rank that never gets here makes the others'
  /// first `get`/`add` time out instead of hanging in `MPI_Comm_dup`); the first round completes
  /// it and sets `MPI_ERRORS_RETURN` on the duplicate. `timeout` bounds every `add` (a `get`
  /// uses its own argument). Throws `InvalidUsage` when MPI is not initialised
  /// (or already finalised), `comm` is `MPI_COMM_NULL` or an intercommunicator, or `timeout`
  /// is not positive; `Error(System)` when an MPI call fails.
  explicit MpiStore(MPI_Comm comm, std::chrono::milliseconds timeout = std::chrono::milliseconds(60000));
  /// Frees the duplicate communicator unless MPI is finalised or a round (or the duplication)
  /// is still posted; then the store's state is leaked on purpose (MPI may still write into it).
  ~MpiStore() override;
  MpiStore(const MpiStore&) = delete;
  MpiStore& operator=(const MpiStore&) = delete;

  /// Records `key = value` locally; other ranks see it after this rank's next round.
  void set(std::string_view key, std::span<const std::byte> value) override;
  /// The value of `key`; runs an exchange round when it is not known here yet (see above).
  Bytes get(std::string_view key, std::chrono::milliseconds timeout) override;
  /// Adds `delta` to the counter at `key` in an exchange round that every rank joins with the
  /// same key; returns the counter after every rank's delta of the round.
  std::int64_t add(std::string_view key, std::int64_t delta) override;
  /// True: every rank must make the same calls (a link that must be fenced is not moved).
  bool collective_only() const noexcept override { return true; }

  /// This rank in the MPI communicator.
  int rank() const noexcept;
  /// Number of ranks of the MPI communicator.
  int size() const noexcept;
  /// Exchange rounds completed so far (the communicator's setup takes 4 + 2 per extra lane).
  std::uint64_t rounds() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

namespace mpi {

/// Joins a ringfence communicator of the ranks of `comm` (rank and size from `comm`), with the
/// built-in transports and `MpiStore` as the bootstrap store (timeout: `options.timeout`).
/// Collective over `comm`: every rank calls it. Same errors as the store-based `Communicator`
/// constructor, plus those of `MpiStore(comm)`. Destroy the communicator before
/// `MPI_Finalize`.
Communicator make_communicator(MPI_Comm comm, CommOptions options = CommOptions::from_env());

}  // namespace mpi
}  // namespace ringfence
