#pragma once
/// \file shim.hpp
/// Internals of the NCCL shim (`libringfence_nccl.so`, docs/nccl-compat.md): the object behind
/// `ncclComm_t`, the mapping of ringfence exceptions onto `ncclResult_t`, the bookkeeping behind
/// `ncclGetLastError`, and the per-thread group queue. Not installed; only src/nccl/*.cpp see it.
///
/// The C API has no context object, so the shim keeps a little process state: the stores hosted
/// for `ncclGetUniqueId`, the `ncclMemAlloc` allocations, and (per thread, like NCCL) the group
/// depth and the operations queued inside a group. Everything else hangs off a communicator.

// Every nccl.h declaration gets default visibility, so the definitions in src/nccl/*.cpp are
// exported although the shim is compiled with -fvisibility=hidden (exports.map lists them).
#pragma GCC visibility push(default)
#include <nccl.h>
#pragma GCC visibility pop

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <ringfence/communicator.hpp>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/store.hpp>
#include <ringfence/types.hpp>
#include <map>
#include <string>
#include <vector>

/// The communicator behind `ncclComm_t` (nccl.h declares `struct ncclComm` incomplete).
struct ncclComm {
  /// Tag that tells a live shim communicator from a stray or destroyed pointer.
  static constexpr std::uint64_t kMagic = 0x6d6d6f436c63636eull;  // "ncclComm"
  std::uint64_t magic = kMagic;  ///< `kMagic` while alive, 0 after destroy
  /// The ringfence communicator; null while an init queued in a group is pending, or after that
  /// init failed (`init_error`).
  std::unique_ptr<ringfence::Communicator> comm;
  /// The bootstrap store this process hosts for the communicator's unique id (null when another
  /// process hosts it); passed on to communicators split or shrunk from this one.
  std::shared_ptr<ringfence::TcpStoreServer> server;
  /// Why a grouped init failed (ncclSuccess otherwise).
  ncclResult_t init_error = ncclSuccess;
  int rank = -1;    ///< this rank (known at the call, even when the init is queued)
  int size = 0;     ///< number of ranks; 0 = not known yet (a split queued in a group)
  int device = -1;  ///< CUDA device current at init (or the ncclCommInitAll device); -1 = none
  /// `device` was the runtime's current device at init (so it existed then), not a
  /// ncclCommInitAll devlist entry: a group worker that cannot make it current fails the task.
  bool device_checked = false;
  bool finalized = false;  ///< ncclCommFinalize was called: no more operations
  ringfence::CommOptions options;  ///< options the communicator was made with (children inherit)

  /// A buffer recorded by ncclCommRegister (ringfence registers memory lazily on first use).
  struct Registration {
    void* buff = nullptr;
    std::size_t size = 0;
  };
  mutable std::mutex mutex;  ///< guards `last_error` and `registrations`
  std::string last_error;    ///< the last failure reported on this communicator
  /// Live ncclCommRegister handles (the handle is the Registration's address).
  std::map<void*, std::unique_ptr<Registration>> registrations;
};

namespace ringfence::nccl {

/// A failure with its NCCL code, thrown inside the shim and turned into a return value at the
/// C boundary (never crosses it).
class ShimError : public std::exception {
 public:
  /// `message` is a complete sentence naming the argument or reason.
  ShimError(ncclResult_t code, std::string message) : code_(code), message_(std::move(message)) {}
  /// The NCCL code to return.
  ncclResult_t code() const noexcept { return code_; }
  /// The reason.
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  ncclResult_t code_;
  std::string message_;
};

/// NCCL code of a ringfence error code: InvalidUsage -> ncclInvalidUsage; Timeout,
/// PeerUnreachable, Fenced, Transient -> ncclRemoteError; System, Ibv -> ncclSystemError; Cuda ->
/// ncclUnhandledCudaError; Aborted -> ncclInvalidUsage (the communicator was aborted); InProgress
/// -> ncclInProgress; Fatal -> ncclInternalError; Ok -> ncclSuccess.
ncclResult_t result_of(ErrorCode code) noexcept;

/// The shim's logger: level from RINGFENCE_LOG, else NCCL_DEBUG (WARN, INFO, TRACE), else warn;
/// `rank` is shown in the prefix (-1: none).
Logger logger(int rank = -1) noexcept;

/// Records a failure of `call` (on `comm` when not null): logs it at warn level, stores it as
/// this thread's and the communicator's last error, and returns `code`.
ncclResult_t fail(const char* call, ncclComm* comm, ncclResult_t code, const std::string& reason) noexcept;

/// Runs `body` (returning ncclResult_t) and turns any exception into a recorded failure of
/// `call`: ShimError keeps its code, ringfence errors map through `result_of`, bad_alloc is
/// ncclSystemError, anything else ncclInternalError.
ncclResult_t guarded(const char* call, ncclComm* comm, const std::function<ncclResult_t()>& body) noexcept;

/// Throws ShimError(ncclInvalidArgument) unless `comm` is a live shim communicator.
ncclComm& check_comm(const char* call, ncclComm_t comm);
/// `check_comm`, and the communicator must be usable for operations: initialised (or with its
/// init queued in this thread's group), not finalized.
ncclComm& check_usable(const char* call, ncclComm_t comm);

/// ringfence type of an NCCL type; ShimError: ncclInvalidArgument for values outside the
/// enum, ncclInvalidUsage for the float8 types (not supported by this build). Taken by
/// reference and read as an int: a C caller's out-of-range value must not be loaded as the enum.
DataType data_type(const char* call, const ncclDataType_t& datatype);
/// ringfence operator of a built-in NCCL operator; ShimError(ncclInvalidArgument) for any other
/// value (this build creates no custom operators).
ReduceOp reduce_op(const char* call, ncclRedOp_t op);
/// `count * size_of(type)`; ShimError(ncclInvalidArgument) when it overflows.
std::size_t bytes_of(const char* call, const char* what, std::size_t count, DataType type);
/// Checks a collective's buffer argument: null with `bytes > 0` is ncclInvalidArgument. Returns
/// true for CUDA device or managed memory (asked of the CUDA runtime when one is loaded): the
/// call then takes the stream-ordered path (docs/device.md).
bool check_buffer(const char* call, const ncclComm& comm, const char* what, const void* ptr, std::size_t bytes);
/// One send (`is_send`) or receive on `c`: host with a NULL stream, or stream-ordered on
/// `stream` when `staged` (device memory or a stream).
void transfer(Communicator& c, bool is_send, void* buf, std::size_t count, DataType type, int peer, bool staged, CudaStream stream);
/// Checks `root`/`peer` against the communicator size (skipped while the size is unknown).
void check_rank_arg(const char* call, const ncclComm& comm, const char* what, int value);

// ---- groups ----

/// An operation queued inside a group, run at the outermost ncclGroupEnd.
struct PendingOp {
  enum class Kind { Collective, Send, Recv };
  const char* call = "";          ///< NCCL entry point, for errors
  ncclComm* comm = nullptr;       ///< communicator it runs on
  Kind kind = Kind::Collective;   ///< collectives run in issue order, then the transfers as one group
  std::function<void(Communicator&)> run;  ///< collectives: the call
  const void* send = nullptr;     ///< Send: source
  void* recv = nullptr;           ///< Recv: destination
  std::size_t count = 0;          ///< Send/Recv: elements
  DataType type = DataType::Uint8;  ///< Send/Recv: element type
  int peer = -1;                  ///< Send/Recv: peer rank
  bool staged = false;            ///< Send/Recv: stream-ordered (device memory or a stream)
  CudaStream stream;              ///< Send/Recv: its stream
};

/// A communicator creation queued inside a group (ncclCommInitRank*, ncclCommSplit): `make` builds
/// the communicator; it runs concurrently with the group's other creations at ncclGroupEnd.
struct PendingInit {
  const char* call = "";
  ncclComm* created = nullptr;  ///< the handle being filled in (null: a split without a color)
  ncclComm* report = nullptr;   ///< where a failure is recorded (the handle, or a split's parent)
  std::function<void()> make;   ///< fills `created` (comm, and rank/size for splits) or throws
  bool from_parent = false;     ///< a split: runs after the group's other creations (its parent may be one)
};

/// True while this thread is inside ncclGroupStart/ncclGroupEnd.
bool in_group() noexcept;
/// Queues `op` in this thread's group.
void enqueue(PendingOp op);
/// Queues `init` in this thread's group.
void enqueue(PendingInit init);
/// True when `comm` has an init queued in this thread's group.
bool init_pending(const ncclComm* comm) noexcept;
/// Remembers an argument error raised inside a group: the group's operations are then dropped at
/// ncclGroupEnd, which returns this error.
void note_group_error(ncclResult_t code) noexcept;

/// ncclGroupStart: one level deeper.
ncclResult_t group_start() noexcept;
/// ncclGroupEnd: one level up; at the outermost level runs the queued creations (concurrently;
/// splits after the others, since their parents may be among them), then the queued operations (communicators concurrently; per communicator the collectives in
/// issue order, then every send and recv as one ringfence group). Returns the first failure.
ncclResult_t group_end() noexcept;

/// ncclGetLastError: the last failure on `comm` when it is a live communicator, else this
/// thread's last failure. The pointer stays valid until this thread's next call.
const char* last_error_of(ncclComm* comm) noexcept;

/// The ringfence communicator of an initialised `comm`, or ShimError naming why there is none.
Communicator& live(const char* call, ncclComm& comm);

}  // namespace ringfence::nccl

/// Defines `pncclX` as an alias of `ncclX` (NCCL's profiling interface exports both names).
#define RINGFENCE_NCCL_PROFILING_ALIAS(ret, name, params) \
  extern "C" ret p##name params __attribute__((alias(#name)))
