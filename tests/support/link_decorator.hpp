#pragma once
// Test decorators of links: a transport that wraps every link it connects, and a link that
// forwards every call to the one it wraps, so a test overrides only what it watches or changes
// (link_move_test's slow readers, stream_choice_test's count of streamed writes).
#include <memory>
#include <ringfence/transport.hpp>
#include <ringfence/transport_util.hpp>
#include <span>
#include <utility>

namespace ringfence::test {

/// A link that forwards every call to `inner()`.
class ForwardingLink : public Link {
 public:
  explicit ForwardingLink(std::unique_ptr<Link> inner) noexcept : inner_(std::move(inner)) {}
  Status write(const WriteOp& op) noexcept override { return inner_->write(op); }
  Status signal(const SignalOp& op) noexcept override { return inner_->signal(op); }
  void flush_wakes() noexcept override { inner_->flush_wakes(); }
  Status poll(std::span<Completion> out, std::size_t& n) noexcept override { return inner_->poll(out, n); }
  Status wait(SignalFlag& flag, std::uint32_t target, std::chrono::nanoseconds max) noexcept override {
    return inner_->wait(flag, target, max);
  }
  void fence(FenceReason why) noexcept override { inner_->fence(why); }
  bool can_reopen() const noexcept override { return inner_->can_reopen(); }
  void reopen() noexcept override { inner_->reopen(); }
  LinkState state() const noexcept override { return inner_->state(); }
  int peer() const noexcept override { return inner_->peer(); }
  const LinkStats& stats() const noexcept override { return inner_->stats(); }
  bool times_writes() const noexcept override { return inner_->times_writes(); }
  bool idle() noexcept override { return inner_->idle(); }

 protected:
  Link& inner() const noexcept { return *inner_; }

 private:
  std::unique_ptr<Link> inner_;
};

/// A transport that hands out `wrap(link)` for every link the wrapped transport connects.
/// `Wrap`: callable as `std::unique_ptr<Link>(std::unique_ptr<Link>)`.
template <class Wrap>
class LinkWrappingTransport final : public transport_util::ForwardingTransport {
 public:
  LinkWrappingTransport(std::unique_ptr<Transport> inner, Wrap wrap) : ForwardingTransport(std::move(inner)), wrap_(std::move(wrap)) {}
  std::unique_ptr<PendingLink> connect(ListenHandle& local, const PeerInfo& peer, std::span<const std::byte> address) override {
    struct Pending final : PendingLink {
      Pending(std::unique_ptr<PendingLink> i, Wrap w) : inner(std::move(i)), wrap(std::move(w)) {}
      std::unique_ptr<PendingLink> inner;
      Wrap wrap;
      Status try_finish(std::unique_ptr<Link>& out) noexcept override {
        std::unique_ptr<Link> link;
        const Status s = inner->try_finish(link);
        if (s.is_ok()) out = wrap(std::move(link));
        return s;
      }
    };
    return std::make_unique<Pending>(inner().connect(local, peer, address), wrap_);
  }

 private:
  Wrap wrap_;
};

}  // namespace ringfence::test
