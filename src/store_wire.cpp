// InProcessStore and the TCP store's wire format (encoder and bounded, incremental parser).
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <ringfence/error.hpp>
#include <ringfence/store.hpp>

#include "store_detail.hpp"

namespace ringfence {
using detail::deadline_after;
using detail::get_i64;
using detail::put_i64;
using detail::wrapping_add;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Bytes helpers
// ---------------------------------------------------------------------------------------------

Bytes to_bytes(std::string_view text) {
  auto bytes = std::as_bytes(std::span(text.data(), text.size()));
  return Bytes(bytes.begin(), bytes.end());
}

std::string to_string(std::span<const std::byte> bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// ---------------------------------------------------------------------------------------------
// InProcessStore
// ---------------------------------------------------------------------------------------------

void InProcessStore::set(std::string_view key, std::span<const std::byte> value) {
  RINGFENCE_EXPECTS(key.size() <= kMaxStoreKeyBytes, "store key of {} bytes exceeds the {}-byte limit", key.size(),
                    kMaxStoreKeyBytes);
  {
    std::lock_guard lock(mutex_);
    auto it = values_.find(key);
    if (it == values_.end())
      values_.emplace(std::string(key), Bytes(value.begin(), value.end()));
    else
      it->second.assign(value.begin(), value.end());
  }
  changed_.notify_all();
}

Bytes InProcessStore::get(std::string_view key, std::chrono::milliseconds timeout) {
  const auto deadline = deadline_after(timeout);
  std::unique_lock lock(mutex_);
  auto it = values_.find(key);
  while (it == values_.end()) {
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
      it = values_.find(key);
      if (it != values_.end()) break;
      throw TimeoutError(fmt::format("store key '{}' was not set within {} ms", key, timeout.count()));
    }
    it = values_.find(key);
  }
  return it->second;
}

std::int64_t InProcessStore::add(std::string_view key, std::int64_t delta) {
  RINGFENCE_EXPECTS(key.size() <= kMaxStoreKeyBytes, "store key of {} bytes exceeds the {}-byte limit", key.size(),
                    kMaxStoreKeyBytes);
  std::int64_t result = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = values_.find(key);
    if (it == values_.end()) it = values_.emplace(std::string(key), Bytes(8, std::byte{0})).first;
    RINGFENCE_EXPECTS(it->second.size() == 8, "store key '{}' holds {} bytes, not a 64-bit counter", key,
                      it->second.size());
    result = wrapping_add(get_i64(it->second), delta);
    put_i64(it->second, result);
  }
  changed_.notify_all();
  return result;
}

// ---------------------------------------------------------------------------------------------
// Wire format
// ---------------------------------------------------------------------------------------------

namespace store_wire {

Bytes encode_request(Op op, std::string_view key, std::span<const std::byte> value) {
  RINGFENCE_EXPECTS(key.size() <= kMaxStoreKeyBytes, "store key of {} bytes exceeds the {}-byte limit", key.size(),
                    kMaxStoreKeyBytes);
  RINGFENCE_EXPECTS(value.size() <= 0xffffffffu, "store value of {} bytes does not fit a frame", value.size());
  RequestHeader header{};
  header.magic = kMagic;
  header.op = static_cast<std::uint8_t>(op);
  header.key_len = static_cast<std::uint16_t>(key.size());
  header.value_len = static_cast<std::uint32_t>(value.size());
  Bytes frame(sizeof(header) + key.size() + value.size());
  std::memcpy(frame.data(), &header, sizeof(header));
  if (!key.empty()) std::memcpy(frame.data() + sizeof(header), key.data(), key.size());
  if (!value.empty()) std::memcpy(frame.data() + sizeof(header) + key.size(), value.data(), value.size());
  return frame;
}

ParseResult RequestParser::feed(std::span<const std::byte>& in) {
  // A malformed stream cannot be resynchronised: stay failed.
  if (!error_.empty()) return ParseResult::Malformed;
  if (frame_done_) {
    header_got_ = 0;
    body_.clear();
    body_got_ = 0;
    frame_done_ = false;
  }
  if (header_got_ < sizeof(RequestHeader)) {
    const std::size_t n = std::min(in.size(), sizeof(RequestHeader) - header_got_);
    std::memcpy(reinterpret_cast<std::byte*>(&header_) + header_got_, in.data(), n);
    header_got_ += n;
    in = in.subspan(n);
    if (header_got_ < sizeof(RequestHeader)) return ParseResult::NeedMore;
    // Validate every length before sizing the body, so a hostile header cannot make us allocate.
    if (header_.magic != kMagic) {
      error_ = "bad magic";
      return ParseResult::Malformed;
    }
    if (header_.op < static_cast<std::uint8_t>(Op::Hello) || header_.op > static_cast<std::uint8_t>(Op::Add)) {
      error_ = "unknown op";
      return ParseResult::Malformed;
    }
    if (header_.key_len > kMaxStoreKeyBytes) {
      error_ = "key longer than kMaxStoreKeyBytes";
      return ParseResult::Malformed;
    }
    if (header_.value_len > max_value_) {
      error_ = "value longer than the store's limit";
      return ParseResult::Malformed;
    }
    body_.resize(std::size_t{header_.key_len} + header_.value_len);
  }
  const std::size_t n = std::min(in.size(), body_.size() - body_got_);
  if (n > 0) std::memcpy(body_.data() + body_got_, in.data(), n);
  body_got_ += n;
  in = in.subspan(n);
  if (body_got_ < body_.size()) return ParseResult::NeedMore;
  frame_done_ = true;
  return ParseResult::Frame;
}

std::string_view RequestParser::key() const noexcept {
  return std::string_view(reinterpret_cast<const char*>(body_.data()),
                          std::min<std::size_t>(header_.key_len, body_.size()));
}

std::span<const std::byte> RequestParser::value() const noexcept {
  const std::size_t k = std::min<std::size_t>(header_.key_len, body_.size());
  return std::span<const std::byte>(body_).subspan(k);
}

}  // namespace store_wire

}  // namespace ringfence
