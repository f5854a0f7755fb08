// Pure parts of the ibverbs transport: HCA filter, connection blob and region key, queue pair
// transitions, error classification. No device is touched here (see ibverbs_detail.hpp).
#include "ibverbs_detail.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <ringfence/error.hpp>
#include <ringfence/transports/ibverbs.hpp>

namespace ringfence::transports::ibverbs {

HcaFilter parse_hca_filter(std::string_view text) {
  HcaFilter filter;
  const std::string_view original = text;
  if (text.starts_with('^')) {
    filter.exclude = true;
    text.remove_prefix(1);
  }
  if (text.starts_with('=')) {
    filter.exact = true;
    text.remove_prefix(1);
  }
  if (original.empty()) return filter;
  auto bad = [&](std::string_view why) {
    throw InvalidUsage(fmt::format("RINGFENCE_IB_HCA='{}' is invalid: {} (expected name[:port],... with optional ^ and =, "
                                   "e.g. mlx5_0:1,mlx5_1 or ^=mlx5_2)",
                                   original, why));
  };
  std::size_t start = 0;
  for (;;) {
    const auto comma = text.find(',', start);
    const std::string_view item = text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    HcaEntry entry;
    std::string_view name = item;
    if (const auto colon = item.find(':'); colon != std::string_view::npos) {
      name = item.substr(0, colon);
      const std::string_view digits = item.substr(colon + 1);
      int port = 0;
      const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
      if (digits.empty() || ec != std::errc() || ptr != digits.data() + digits.size() || port < 1 || port > 255)
        bad(fmt::format("port '{}' of '{}' is not a number in [1, 255]", digits, item));
      entry.port = port;
    }
    if (name.empty()) bad("an entry has an empty device name");
    entry.name = std::string(name);
    filter.entries.push_back(std::move(entry));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return filter;
}

bool hca_matches(const HcaFilter& filter, std::string_view device, int port) noexcept {
  if (filter.entries.empty()) return true;
  // NCCL's matchIfList: an entry with a port matches only that port; names match as prefixes
  // unless the filter is exact. `^` inverts the result.
  const bool listed = std::any_of(filter.entries.begin(), filter.entries.end(), [&](const HcaEntry& e) {
    if (e.port != -1 && e.port != port) return false;
    return filter.exact ? device == e.name : device.starts_with(e.name);
  });
  return listed != filter.exclude;
}

std::optional<HcaPort> choose_port(const std::vector<HcaPort>& ports, const HcaFilter& filter) {
  for (const auto& p : ports)
    if (p.active && hca_matches(filter, p.device, p.port)) return p;
  return std::nullopt;
}

namespace detail {
namespace {

constexpr std::uint16_t kVersion = 1;
constexpr char kConnMagic[4] = {'R', 'F', 'I', 'B'};
constexpr char kKeyMagic[4] = {'R', 'F', 'I', 'K'};
// magic, version, rank, lid, port, mtu, link layer, gid, psn, count
constexpr std::size_t kConnHeader = 4 + 2 + 4 + 2 + 1 + 1 + 1 + 16 + 4 + 4;
constexpr std::size_t kKeyBytes = 4 + 2 + 8 + 8 + 4;
constexpr std::uint32_t k24Bits = 0xffffff;

class Writer {
 public:
  explicit Writer(std::size_t n) { out_.reserve(n); }
  void raw(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  template <class T>
  void le(T v) {
    for (std::size_t i = 0; i < sizeof(T); ++i) out_.push_back(static_cast<std::byte>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xff));
  }
  Bytes take() { return std::move(out_); }

 private:
  Bytes out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  void raw(void* p, std::size_t n) {
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
  }
  template <class T>
  T le() {
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<std::uint64_t>(in_[pos_ + i]) << (8 * i);
    pos_ += sizeof(T);
    return static_cast<T>(v);
  }

 private:
  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
};

[[noreturn]] void bad_blob(std::string_view what, std::string_view why) {
  throw InvalidUsage(fmt::format("ibverbs: malformed {} from the bootstrap store: {}", what, why));
}

}  // namespace

Bytes serialize(const ConnInfo& info) {
  Writer w(kConnHeader + 4 * info.qpns.size());
  w.raw(kConnMagic, 4);
  w.le<std::uint16_t>(kVersion);
  w.le<std::uint32_t>(info.rank);
  w.le<std::uint16_t>(info.lid);
  w.le<std::uint8_t>(info.port);
  w.le<std::uint8_t>(info.mtu);
  w.le<std::uint8_t>(info.link_layer);
  w.raw(info.gid.data(), info.gid.size());
  w.le<std::uint32_t>(info.psn);
  w.le<std::uint32_t>(static_cast<std::uint32_t>(info.qpns.size()));
  for (std::uint32_t q : info.qpns) w.le<std::uint32_t>(q);
  return w.take();
}

ConnInfo parse_conn_info(std::span<const std::byte> bytes) {
  constexpr std::string_view kWhat = "connection info";
  if (bytes.size() < kConnHeader)
    bad_blob(kWhat, fmt::format("{} bytes, shorter than the {}-byte header (truncated)", bytes.size(), kConnHeader));
  Reader r(bytes);
  char magic[4];
  r.raw(magic, 4);
  if (std::memcmp(magic, kConnMagic, 4) != 0) bad_blob(kWhat, "bad magic (not an ibverbs address)");
  if (const auto v = r.le<std::uint16_t>(); v != kVersion) bad_blob(kWhat, fmt::format("version {}, expected {}", v, kVersion));
  ConnInfo info;
  info.rank = r.le<std::uint32_t>();
  info.lid = r.le<std::uint16_t>();
  info.port = r.le<std::uint8_t>();
  info.mtu = r.le<std::uint8_t>();
  info.link_layer = r.le<std::uint8_t>();
  r.raw(info.gid.data(), info.gid.size());
  info.psn = r.le<std::uint32_t>();
  const auto count = r.le<std::uint32_t>();
  if (count > kMaxRanks) bad_blob(kWhat, fmt::format("{} queue pairs, more than {}", count, kMaxRanks));
  if (info.rank >= count) bad_blob(kWhat, fmt::format("rank {} outside its {} queue pairs", info.rank, count));
  const std::size_t expected = kConnHeader + 4 * static_cast<std::size_t>(count);
  if (bytes.size() != expected)
    bad_blob(kWhat, fmt::format("{} bytes for {} queue pairs, expected {} ({})", bytes.size(), count, expected,
                                bytes.size() < expected ? "truncated" : "trailing bytes"));
  if (info.port == 0) bad_blob(kWhat, "port 0");
  if (info.mtu < IBV_MTU_256 || info.mtu > IBV_MTU_4096) bad_blob(kWhat, fmt::format("MTU code {} outside 1..5", info.mtu));
  if (info.psn > k24Bits) bad_blob(kWhat, fmt::format("PSN {:#x} wider than 24 bits", info.psn));
  info.qpns.resize(count);
  for (auto& q : info.qpns) {
    q = r.le<std::uint32_t>();
    if (q > k24Bits) bad_blob(kWhat, fmt::format("queue pair number {:#x} wider than 24 bits", q));
  }
  return info;
}

Bytes serialize(const RegionKey& key) {
  Writer w(kKeyBytes);
  w.raw(kKeyMagic, 4);
  w.le<std::uint16_t>(kVersion);
  w.le<std::uint64_t>(key.addr);
  w.le<std::uint64_t>(key.length);
  w.le<std::uint32_t>(key.rkey);
  return w.take();
}

RegionKey parse_region_key(std::span<const std::byte> bytes) {
  constexpr std::string_view kWhat = "region key";
  if (bytes.size() != kKeyBytes)
    bad_blob(kWhat, fmt::format("{} bytes, expected {} ({})", bytes.size(), kKeyBytes, bytes.size() < kKeyBytes ? "truncated" : "trailing bytes"));
  Reader r(bytes);
  char magic[4];
  r.raw(magic, 4);
  if (std::memcmp(magic, kKeyMagic, 4) != 0) bad_blob(kWhat, "bad magic (not an ibverbs region key)");
  if (const auto v = r.le<std::uint16_t>(); v != kVersion) bad_blob(kWhat, fmt::format("version {}, expected {}", v, kVersion));
  RegionKey key;
  key.addr = r.le<std::uint64_t>();
  key.length = r.le<std::uint64_t>();
  key.rkey = r.le<std::uint32_t>();
  if (key.length > UINT64_MAX - key.addr) bad_blob(kWhat, fmt::format("region {:#x}+{} wraps around", key.addr, key.length));
  return key;
}

QpTransition init_transition(const QpParams& p) noexcept {
  QpTransition t;
  t.attr.qp_state = IBV_QPS_INIT;
  t.attr.pkey_index = p.pkey_index;
  t.attr.port_num = p.port;
  t.attr.qp_access_flags = p.access;
  t.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  return t;
}

QpTransition rtr_transition(const QpParams& p, const ConnInfo& remote, std::uint32_t remote_qpn) noexcept {
  QpTransition t;
  t.attr.qp_state = IBV_QPS_RTR;
  t.attr.path_mtu = static_cast<ibv_mtu>(std::min(p.local_mtu, remote.mtu));
  t.attr.dest_qp_num = remote_qpn;
  t.attr.rq_psn = remote.psn;
  t.attr.max_dest_rd_atomic = p.max_rd_atomic;
  t.attr.min_rnr_timer = p.min_rnr_timer;
  t.attr.ah_attr.dlid = remote.lid;
  t.attr.ah_attr.sl = p.service_level;
  t.attr.ah_attr.src_path_bits = 0;
  t.attr.ah_attr.port_num = p.port;
  // RoCE has no LIDs: the GRH (destination GID) routes. IB uses it only across subnets, which
  // shows up as a zero LID here.
  const bool global = p.local_link_layer == IBV_LINK_LAYER_ETHERNET || remote.link_layer == IBV_LINK_LAYER_ETHERNET ||
                      remote.lid == 0;
  if (global) {
    t.attr.ah_attr.is_global = 1;
    std::memcpy(t.attr.ah_attr.grh.dgid.raw, remote.gid.data(), remote.gid.size());
    t.attr.ah_attr.grh.sgid_index = p.gid_index;
    t.attr.ah_attr.grh.hop_limit = 255;
    t.attr.ah_attr.grh.traffic_class = p.traffic_class;
    t.attr.ah_attr.grh.flow_label = 0;
  }
  t.mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
           IBV_QP_MIN_RNR_TIMER;
  return t;
}

QpTransition rts_transition(const QpParams& p, std::uint32_t local_psn) noexcept {
  QpTransition t;
  t.attr.qp_state = IBV_QPS_RTS;
  t.attr.timeout = p.timeout;
  t.attr.retry_cnt = p.retry_count;
  t.attr.rnr_retry = p.rnr_retry;
  t.attr.sq_psn = local_psn;
  t.attr.max_rd_atomic = p.max_rd_atomic;
  t.mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
  return t;
}

WcClass classify_wc_status(int status) noexcept {
  switch (status) {
    case IBV_WC_SUCCESS: return {WcAction::Complete, ErrorCode::Ok, false};
    // No ACK after retry_cnt + 1 tries, the receiver kept answering RNR, or no response: the
    // path or the peer is in trouble. Retryable from the health layer's point of view (NCCL's
    // resiliency treats RETRY_EXC_ERR as recoverable); the queue pair itself is now in ERR.
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_RESP_TIMEOUT_ERR: return {WcAction::LinkError, ErrorCode::Transient, true};
    // Flushed: the queue pair was already in ERR (a fence, an async fatal event). The link must
    // not be trusted any more.
    case IBV_WC_WR_FLUSH_ERR: return {WcAction::Fence, ErrorCode::Fenced, false};
    default: return {WcAction::Fence, ErrorCode::Ibv, false};
  }
}

std::string_view wc_status_name(int status) noexcept {
  switch (status) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_LEN_ERR: return "local-length";
    case IBV_WC_LOC_QP_OP_ERR: return "local-qp-operation";
    case IBV_WC_LOC_EEC_OP_ERR: return "local-eec-operation";
    case IBV_WC_LOC_PROT_ERR: return "local-protection";
    case IBV_WC_WR_FLUSH_ERR: return "flushed";
    case IBV_WC_MW_BIND_ERR: return "memory-window-bind";
    case IBV_WC_BAD_RESP_ERR: return "bad-response";
    case IBV_WC_LOC_ACCESS_ERR: return "local-access";
    case IBV_WC_REM_INV_REQ_ERR: return "remote-invalid-request";
    case IBV_WC_REM_ACCESS_ERR: return "remote-access";
    case IBV_WC_REM_OP_ERR: return "remote-operation";
    case IBV_WC_RETRY_EXC_ERR: return "retry-exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "rnr-retry-exceeded";
    case IBV_WC_LOC_RDD_VIOL_ERR: return "local-rdd-violation";
    case IBV_WC_REM_INV_RD_REQ_ERR: return "remote-invalid-read-request";
    case IBV_WC_REM_ABORT_ERR: return "remote-abort";
    case IBV_WC_INV_EECN_ERR: return "invalid-eecn";
    case IBV_WC_INV_EEC_STATE_ERR: return "invalid-eec-state";
    case IBV_WC_FATAL_ERR: return "fatal";
    case IBV_WC_RESP_TIMEOUT_ERR: return "response-timeout";
    case IBV_WC_GENERAL_ERR: return "general";
    default: return "unknown";
  }
}

AsyncClass classify_async_event(int event_type) noexcept {
  switch (event_type) {
    case IBV_EVENT_QP_FATAL: return {AsyncAction::FenceQp, "qp-fatal"};
    case IBV_EVENT_QP_REQ_ERR: return {AsyncAction::FenceQp, "qp-request-error"};
    case IBV_EVENT_QP_ACCESS_ERR: return {AsyncAction::FenceQp, "qp-access-error"};
    case IBV_EVENT_CQ_ERR: return {AsyncAction::FenceQp, "cq-error"};
    case IBV_EVENT_WQ_FATAL: return {AsyncAction::FenceQp, "wq-fatal"};
    case IBV_EVENT_DEVICE_FATAL: return {AsyncAction::FenceDevice, "device-fatal"};
    case IBV_EVENT_PORT_ERR: return {AsyncAction::PortDown, "port-error"};
    case IBV_EVENT_PORT_ACTIVE: return {AsyncAction::PortUp, "port-active"};
    case IBV_EVENT_COMM_EST: return {AsyncAction::Ignore, "communication-established"};
    case IBV_EVENT_SQ_DRAINED: return {AsyncAction::Log, "sq-drained"};
    case IBV_EVENT_PATH_MIG: return {AsyncAction::Log, "path-migrated"};
    case IBV_EVENT_PATH_MIG_ERR: return {AsyncAction::Log, "path-migration-error"};
    case IBV_EVENT_LID_CHANGE: return {AsyncAction::Log, "lid-change"};
    case IBV_EVENT_PKEY_CHANGE: return {AsyncAction::Log, "pkey-change"};
    case IBV_EVENT_SM_CHANGE: return {AsyncAction::Log, "sm-change"};
    case IBV_EVENT_SRQ_ERR: return {AsyncAction::Log, "srq-error"};
    case IBV_EVENT_SRQ_LIMIT_REACHED: return {AsyncAction::Log, "srq-limit"};
    case IBV_EVENT_QP_LAST_WQE_REACHED: return {AsyncAction::Log, "last-wqe"};
    case IBV_EVENT_CLIENT_REREGISTER: return {AsyncAction::Log, "client-reregister"};
    case IBV_EVENT_GID_CHANGE: return {AsyncAction::Log, "gid-change"};
    default: return {AsyncAction::Log, "unknown"};
  }
}

double port_gbps(std::uint8_t active_width, std::uint32_t active_speed) noexcept {
  double lanes = 0;
  switch (active_width) {
    case 1: lanes = 1; break;
    case 2: lanes = 4; break;
    case 4: lanes = 8; break;
    case 8: lanes = 12; break;
    case 16: lanes = 2; break;
    default: return 0;
  }
  double gbit = 0;  // per lane, Gb/s
  switch (active_speed) {
    case 1: gbit = 2.5; break;       // SDR
    case 2: gbit = 5.0; break;       // DDR
    case 4: gbit = 10.0; break;      // QDR
    case 8: gbit = 10.3125; break;   // FDR10
    case 16: gbit = 14.0625; break;  // FDR
    case 32: gbit = 25.78125; break; // EDR
    case 64: gbit = 53.125; break;   // HDR
    case 128: gbit = 106.25; break;  // NDR
    case 256: gbit = 212.5; break;   // XDR
    default: return 0;
  }
  return lanes * gbit / 8.0;
}

}  // namespace detail
}  // namespace ringfence::transports::ibverbs
