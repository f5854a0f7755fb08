#pragma once
/// \file store.hpp
/// Bootstrap key-value stores: the TCP store hosted by one process of the job (authenticated by
/// the job token, every frame length-bounded, every wait bounded by a deadline) and an
/// in-process store for thread ranks. Control plane: these calls block and throw.

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <ringfence/env.hpp>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace ringfence {

class Logger;

/// Bytes, as stored and exchanged.
using Bytes = std::vector<std::byte>;

/// Converts a string's characters to bytes.
Bytes to_bytes(std::string_view text);
/// Converts bytes back to a string.
std::string to_string(std::span<const std::byte> bytes);

/// Key-value store used to exchange addresses and region keys at setup. Implementations are
/// thread-safe. Keys are at most `kMaxStoreKeyBytes`; values at most the store's limit.
class Store {
 public:
  virtual ~Store() = default;
  /// Sets `key` to `value`, replacing any earlier value. Blocks for one round trip.
  virtual void set(std::string_view key, std::span<const std::byte> value) = 0;
  /// Waits until `key` exists and returns its value. Throws `TimeoutError` naming the key after
  /// `timeout`.
  virtual Bytes get(std::string_view key, std::chrono::milliseconds timeout) = 0;
  /// Adds `delta` to the 64-bit counter at `key` (created as 0) and returns the new value.
  virtual std::int64_t add(std::string_view key, std::int64_t delta) = 0;
  /// True when every rank must make the same sequence of calls (`MpiStore`): two ranks cannot
  /// use the store alone, so a communicator on it fences a link instead of moving it to a
  /// fallback transport (docs/health.md "Moving a link"). Default: false.
  virtual bool collective_only() const noexcept { return false; }
};

/// A view of another store whose keys all start with `prefix`: communicators built on the same
/// store (e.g. by `Communicator::shrink`) keep their setup keys apart.
class PrefixStore final : public Store {
 public:
  /// `inner` must not be null.
  PrefixStore(std::shared_ptr<Store> inner, std::string prefix);
  void set(std::string_view key, std::span<const std::byte> value) override;
  Bytes get(std::string_view key, std::chrono::milliseconds timeout) override;
  std::int64_t add(std::string_view key, std::int64_t delta) override;
  bool collective_only() const noexcept override { return inner_->collective_only(); }

 private:
  std::string key(std::string_view k) const;
  std::shared_ptr<Store> inner_;
  std::string prefix_;
};

/// Longest key a store accepts, in bytes.
inline constexpr std::size_t kMaxStoreKeyBytes = 1024;
/// Default longest value the TCP store accepts, in bytes.
inline constexpr std::size_t kDefaultMaxStoreValueBytes = 16u << 20;

/// A store living in this process, for thread ranks (tests, single-process jobs).
/// Share one instance between ranks through `std::shared_ptr`.
class InProcessStore final : public Store {
 public:
  void set(std::string_view key, std::span<const std::byte> value) override;
  Bytes get(std::string_view key, std::chrono::milliseconds timeout) override;
  std::int64_t add(std::string_view key, std::int64_t delta) override;

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, Bytes, std::less<>> values_;
};

/// Wire format of the TCP store (exposed for tests and fuzzers).
namespace store_wire {
/// Frame magic, "RFS1" little-endian.
inline constexpr std::uint32_t kMagic = 0x31534652u;
/// Request opcodes.
enum class Op : std::uint8_t { Hello = 1, Set = 2, Get = 3, Add = 4 };
/// Response codes.
enum class Reply : std::uint8_t { Ok = 0, NotFound = 1, BadRequest = 2, Denied = 3 };
/// Header of every request: magic, op, key length, value length; key and value bytes follow.
struct RequestHeader {
  std::uint32_t magic;
  std::uint8_t op;
  std::uint8_t reserved;
  std::uint16_t key_len;
  std::uint32_t value_len;
};
static_assert(sizeof(RequestHeader) == 12);
/// Header of every response; `value_len` value bytes follow.
struct ResponseHeader {
  std::uint32_t magic;
  std::uint8_t reply;
  std::uint8_t reserved[3];
  std::uint32_t value_len;
};
static_assert(sizeof(ResponseHeader) == 12);
/// Encodes one request frame.
Bytes encode_request(Op op, std::string_view key, std::span<const std::byte> value);

/// Outcome of feeding bytes to a `RequestParser`.
enum class ParseResult { NeedMore, Frame, Malformed };
/// Incremental, bounded request parser: it never buffers more than one frame and rejects a
/// header whose lengths exceed the limits before reading the body.
class RequestParser {
 public:
  /// `max_value` bounds `value_len`; keys are bounded by `kMaxStoreKeyBytes`.
  explicit RequestParser(std::size_t max_value) : max_value_(max_value) {}
  /// Consumes bytes from `in` (advancing it) until one frame is complete or `in` is empty.
  ParseResult feed(std::span<const std::byte>& in);
  /// The completed frame's fields (valid after `Frame`, until the next `feed`).
  Op op() const noexcept { return static_cast<Op>(header_.op); }
  std::string_view key() const noexcept;
  std::span<const std::byte> value() const noexcept;
  /// Why the last frame was malformed.
  std::string_view error() const noexcept { return error_; }

 private:
  std::size_t max_value_;
  RequestHeader header_{};
  std::size_t header_got_ = 0;
  Bytes body_;
  std::size_t body_got_ = 0;
  bool frame_done_ = false;
  std::string_view error_;
};
}  // namespace store_wire

/// Limits and timeouts of a TCP store server.
struct TcpStoreServerOptions {
  std::size_t max_value_bytes = kDefaultMaxStoreValueBytes;  ///< longest value accepted
  /// Connections open at once. When full, the unauthenticated connection open the longest is
  /// closed to make room; a newcomer is refused only when every slot holds an authenticated one.
  std::size_t max_connections = 4096;
  /// Unauthenticated connections from one IP address; past it that address's oldest is closed.
  std::size_t max_unauthenticated_per_address = 1024;
  /// A client must authenticate (send the Hello with the job token) within this; ringfence's own
  /// clients send it right after connecting.
  std::chrono::milliseconds hello_timeout{1000};
};

/// The TCP store server. Owns one background thread, started by the constructor and stopped
/// (joined) by `stop()` or the destructor. Refuses connections whose first frame is not a
/// Hello with the job token; closes connections that send malformed or oversized frames.
class TcpStoreServer {
 public:
  /// Binds `bind_host:port` (port 0 = any free port; see `port()`) and starts serving.
  /// `log` (optional) is copied: the server logs refusals through its copy for as long as it runs.
  /// Throws `SystemError` when the address cannot be bound.
  TcpStoreServer(const JobToken& token, const std::string& bind_host, std::uint16_t port,
                 TcpStoreServerOptions options = {}, const Logger* log = nullptr);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  /// The bound port.
  std::uint16_t port() const noexcept { return port_; }
  /// Number of connections refused so far (bad token, malformed frames, too many).
  std::uint64_t refused() const noexcept;
  /// Stops serving and joins the thread. Idempotent.
  void stop() noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::uint16_t port_ = 0;
};

/// A client of a `TcpStoreServer`. Thread-safe (one request at a time on one connection).
class TcpStoreClient final : public Store {
 public:
  /// Connects to `host:port`, retrying until `timeout`, and authenticates with `token`.
  /// Throws `TimeoutError` when the server cannot be reached in time and `Error(InvalidUsage)`
  /// when the server refuses the token.
  TcpStoreClient(const std::string& host, std::uint16_t port, const JobToken& token,
                 std::chrono::milliseconds timeout);
  ~TcpStoreClient() override;
  void set(std::string_view key, std::span<const std::byte> value) override;
  Bytes get(std::string_view key, std::chrono::milliseconds timeout) override;
  std::int64_t add(std::string_view key, std::int64_t delta) override;

 private:
  bool hello(const JobToken& token);
  Bytes request(store_wire::Op op, std::string_view key, std::span<const std::byte> value,
                store_wire::Reply& reply);
  std::mutex mutex_;
  int fd_ = -1;
  std::chrono::milliseconds io_timeout_;
  std::string peer_;
};

/// NCCL-style unique id: 128 opaque bytes naming the store address and the job token.
/// Create it on one rank with `get_unique_id()`, share it out of band, and pass it to every
/// rank's `Communicator(id, rank, size)`.
struct UniqueId {
  std::array<std::byte, 128> bytes{};  ///< opaque

  /// Serialises `host:port` and `token`. Throws `InvalidUsage` if the host name is too long.
  static UniqueId make(const std::string& host, std::uint16_t port, const JobToken& token);
  /// Store host, port and token read back.
  std::string host() const;
  std::uint16_t port() const noexcept;
  JobToken token() const noexcept;
};

/// Creates a unique id with a fresh random token and a free TCP port on `host` (the port is
/// found by binding port 0; rank 0's communicator binds it again to host the store).
UniqueId get_unique_id(const std::string& host = "127.0.0.1");

/// A cryptographically random job token (from getrandom).
JobToken random_token();

}  // namespace ringfence
