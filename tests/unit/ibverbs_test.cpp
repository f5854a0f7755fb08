// The ibverbs transport's pure parts, on a machine without an HCA: the RINGFENCE_IB_HCA filter,
// the connection blob and region key (round trips, truncated/oversize/garbage input refused),
// remote-write bounds, every field and mask bit of the INIT/RTR/RTS transitions, and the
// classification of completion statuses and asynchronous events. Plus: with no HCA (or no
// library) the transport is created, reaches nobody and says why.
#include <cstring>
#include <ringfence/error.hpp>
#include <ringfence/options.hpp>
#include <ringfence/transports/ibverbs.hpp>

#include "ibverbs_detail.hpp"
#include "support/catch.hpp"

using namespace ringfence;
using namespace ringfence::transports::ibverbs;
using namespace ringfence::transports::ibverbs::detail;

namespace {

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const InvalidUsage& e) {
    return e.what();
  }
  return "(no InvalidUsage thrown)";
}

ConnInfo sample_info() {
  ConnInfo c;
  c.rank = 1;
  c.lid = 0x1234;
  c.port = 2;
  c.mtu = IBV_MTU_4096;
  c.link_layer = IBV_LINK_LAYER_INFINIBAND;
  for (std::size_t i = 0; i < c.gid.size(); ++i) c.gid[i] = static_cast<std::uint8_t>(0xf0 + i);
  c.psn = 0xabcdef;
  c.qpns = {0x111, 0, 0xffffff, 0x42};
  return c;
}

}  // namespace

TEST_CASE("ibverbs: RINGFENCE_IB_HCA follows NCCL_IB_HCA", "[ibverbs]") {
  SECTION("empty = every device and port") {
    const HcaFilter f = parse_hca_filter("");
    REQUIRE(f.entries.empty());
    REQUIRE(hca_matches(f, "mlx5_0", 1));
    REQUIRE(hca_matches(f, "anything", 7));
  }
  SECTION("prefixes and ports") {
    const HcaFilter f = parse_hca_filter("mlx5_0:1,mlx4");
    REQUIRE_FALSE(f.exclude);
    REQUIRE_FALSE(f.exact);
    REQUIRE(f.entries == std::vector<HcaEntry>{{"mlx5_0", 1}, {"mlx4", -1}});
    REQUIRE(hca_matches(f, "mlx5_0", 1));
    REQUIRE_FALSE(hca_matches(f, "mlx5_0", 2));   // port given: only that port
    REQUIRE(hca_matches(f, "mlx5_01", 1));        // prefix match, as NCCL
    REQUIRE(hca_matches(f, "mlx4_3", 2));         // no port: every port
    REQUIRE_FALSE(hca_matches(f, "mlx5_1", 1));
    REQUIRE_FALSE(hca_matches(f, "bnxt_re0", 1));
  }
  SECTION("^ excludes") {
    const HcaFilter f = parse_hca_filter("^mlx5_1,mlx5_2:2");
    REQUIRE(f.exclude);
    REQUIRE_FALSE(f.exact);
    REQUIRE(hca_matches(f, "mlx5_0", 1));
    REQUIRE_FALSE(hca_matches(f, "mlx5_1", 1));
    REQUIRE_FALSE(hca_matches(f, "mlx5_2", 2));
    REQUIRE(hca_matches(f, "mlx5_2", 1));
  }
  SECTION("= matches exactly, ^= excludes exactly") {
    const HcaFilter f = parse_hca_filter("=mlx5_1");
    REQUIRE(f.exact);
    REQUIRE(hca_matches(f, "mlx5_1", 1));
    REQUIRE_FALSE(hca_matches(f, "mlx5_10", 1));
    const HcaFilter g = parse_hca_filter("^=mlx5_1");
    REQUIRE(g.exclude);
    REQUIRE(g.exact);
    REQUIRE_FALSE(hca_matches(g, "mlx5_1", 1));
    REQUIRE(hca_matches(g, "mlx5_10", 1));
  }
  SECTION("malformed lists are errors naming the variable and the text") {
    for (const char* text : {"mlx5_0,", ",mlx5_0", "mlx5_0::1", "mlx5_0:0", "mlx5_0:256", "mlx5_0:x", ":1", "^", "=", "mlx5_0:"}) {
      INFO(text);
      const std::string msg = error_of([&] { (void)parse_hca_filter(text); });
      REQUIRE_THAT(msg, Catch::Contains("RINGFENCE_IB_HCA") && Catch::Contains(std::string("'") + text + "'"));
    }
  }
  SECTION("choose_port: first active port that passes, in the host's order") {
    const std::vector<HcaPort> host = {{"mlx5_0", 1, false}, {"mlx5_0", 2, true}, {"mlx5_1", 1, true}, {"mlx5_10", 1, true}};
    REQUIRE(choose_port(host, parse_hca_filter(""))->device == "mlx5_0");
    REQUIRE(choose_port(host, parse_hca_filter(""))->port == 2);
    REQUIRE(choose_port(host, parse_hca_filter("mlx5_0:1")) == std::nullopt);  // down
    REQUIRE(choose_port(host, parse_hca_filter("^mlx5_0"))->device == "mlx5_1");
    REQUIRE(choose_port(host, parse_hca_filter("=mlx5_10"))->device == "mlx5_10");
    REQUIRE(choose_port(host, parse_hca_filter("mlx5_1"))->device == "mlx5_1");  // prefix: mlx5_1 before mlx5_10
    REQUIRE(choose_port({}, parse_hca_filter("")) == std::nullopt);
  }
}

TEST_CASE("ibverbs: connection info round-trips and refuses garbage", "[ibverbs]") {
  const ConnInfo c = sample_info();
  const Bytes b = serialize(c);
  REQUIRE(b.size() == 39 + 4 * c.qpns.size());
  REQUIRE(parse_conn_info(b) == c);

  SECTION("truncated at every length") {
    for (std::size_t n = 0; n < b.size(); ++n) {
      INFO(n);
      REQUIRE_THROWS_AS(parse_conn_info(std::span(b).first(n)), InvalidUsage);
    }
  }
  SECTION("trailing bytes") {
    Bytes longer = b;
    longer.push_back(std::byte{0});
    REQUIRE_THAT(error_of([&] { (void)parse_conn_info(longer); }), Catch::Contains("trailing"));
  }
  SECTION("a count that promises more than is there, or more than any job") {
    Bytes lying = b;
    lying[35] = std::byte{0xff};  // count's low byte: 255 queue pairs, 4 present
    REQUIRE_THAT(error_of([&] { (void)parse_conn_info(lying); }), Catch::Contains("truncated"));
    Bytes huge = b;
    huge[38] = std::byte{0x7f};  // count's high byte: far above kMaxRanks
    REQUIRE_THAT(error_of([&] { (void)parse_conn_info(huge); }), Catch::Contains("more than"));
  }
  SECTION("bad fields") {
    auto with = [&](auto edit) {
      ConnInfo x = sample_info();
      edit(x);
      return serialize(x);
    };
    REQUIRE_THAT(error_of([&] { (void)parse_conn_info(with([](ConnInfo& x) { x.mtu = 0; })); }), Catch::Contains("MTU"));
    REQUIRE_THAT(error_of([&] { (void)parse_conn_info(with([](ConnInfo& x) { x.mtu = 6; })); }), Catch::Contains("MTU"));
    REQUIRE_THAT(error_of([&] { (void)parse_conn_info(with([](ConnInfo& x) { x.port = 0; })); }), Catch::Contains("port 0"));
    REQUIRE_THAT(error_of([&] { (void)parse_conn_info(with([](ConnInfo& x) { x.psn = 0x1000000; })); }), Catch::Contains("PSN"));
    REQUIRE_THAT(error_of([&] { (void)parse_conn_info(with([](ConnInfo& x) { x.qpns[2] = 0x1000000; })); }),
                 Catch::Contains("queue pair number"));
    REQUIRE_THAT(error_of([&] { (void)parse_conn_info(with([](ConnInfo& x) { x.rank = 4; })); }), Catch::Contains("rank 4"));
    Bytes magic = b;
    magic[0] = std::byte{'X'};
    REQUIRE_THAT(error_of([&] { (void)parse_conn_info(magic); }), Catch::Contains("magic"));
    Bytes version = b;
    version[4] = std::byte{2};
    REQUIRE_THAT(error_of([&] { (void)parse_conn_info(version); }), Catch::Contains("version"));
    // A region key is not an address.
    REQUIRE_THROWS_AS(parse_conn_info(serialize(RegionKey{1, 2, 3})), InvalidUsage);
  }
}

TEST_CASE("ibverbs: region keys round-trip and refuse garbage, writes are bounds-checked", "[ibverbs]") {
  const RegionKey k{0x7f0000001000, 1 << 20, 0xdeadbeef};
  const Bytes b = serialize(k);
  REQUIRE(b.size() == 26);
  REQUIRE(parse_region_key(b) == k);
  for (std::size_t n = 0; n < b.size(); ++n) REQUIRE_THROWS_AS(parse_region_key(std::span(b).first(n)), InvalidUsage);
  Bytes longer = b;
  longer.push_back(std::byte{1});
  REQUIRE_THAT(error_of([&] { (void)parse_region_key(longer); }), Catch::Contains("trailing"));
  REQUIRE_THAT(error_of([&] { (void)parse_region_key(serialize(RegionKey{UINT64_MAX - 10, 11, 1})); }), Catch::Contains("wraps"));
  REQUIRE(parse_region_key(serialize(RegionKey{UINT64_MAX - 10, 10, 1})).length == 10);
  Bytes magic = b;
  magic[3] = std::byte{'B'};  // "RFIB": an address, not a key
  REQUIRE_THAT(error_of([&] { (void)parse_region_key(magic); }), Catch::Contains("magic"));

  REQUIRE(range_ok(0, 100, 100));
  REQUIRE(range_ok(100, 0, 100));
  REQUIRE(range_ok(60, 40, 100));
  REQUIRE_FALSE(range_ok(60, 41, 100));
  REQUIRE_FALSE(range_ok(101, 0, 100));
  REQUIRE_FALSE(range_ok(8, SIZE_MAX, 100));         // offset + bytes would wrap
  REQUIRE_FALSE(range_ok(SIZE_MAX, 2, SIZE_MAX - 1));
}

TEST_CASE("ibverbs: queue pair transitions set every field and mask bit", "[ibverbs]") {
  QpParams p;
  p.port = 2;
  p.pkey_index = 3;
  p.timeout = 18;
  p.retry_count = 5;
  p.rnr_retry = 6;
  p.min_rnr_timer = 14;
  p.service_level = 4;
  p.traffic_class = 106;
  p.gid_index = 3;
  p.max_rd_atomic = 1;
  p.local_mtu = IBV_MTU_2048;
  p.local_link_layer = IBV_LINK_LAYER_INFINIBAND;

  SECTION("RESET -> INIT") {
    const QpTransition t = init_transition(p);
    REQUIRE(t.mask == (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
    REQUIRE(t.mask == 0x39);  // 1<<0 | 1<<3 | 1<<4 | 1<<5 as in rdma-core
    REQUIRE(t.attr.qp_state == IBV_QPS_INIT);
    REQUIRE(t.attr.pkey_index == 3);
    REQUIRE(t.attr.port_num == 2);
    REQUIRE(t.attr.qp_access_flags == (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
    REQUIRE_FALSE((t.attr.qp_access_flags & IBV_ACCESS_REMOTE_READ));
  }
  SECTION("INIT -> RTR over InfiniBand (LID routed)") {
    ConnInfo remote = sample_info();  // MTU 4096, lid 0x1234, IB
    const QpTransition t = rtr_transition(p, remote, 0x42);
    REQUIRE(t.mask == (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                       IBV_QP_MIN_RNR_TIMER));
    REQUIRE(t.mask == ((1 << 0) | (1 << 7) | (1 << 8) | (1 << 20) | (1 << 12) | (1 << 17) | (1 << 15)));
    REQUIRE(t.attr.qp_state == IBV_QPS_RTR);
    REQUIRE(t.attr.path_mtu == IBV_MTU_2048);  // min(local 2048, remote 4096)
    REQUIRE(t.attr.dest_qp_num == 0x42);
    REQUIRE(t.attr.rq_psn == 0xabcdef);
    REQUIRE(t.attr.max_dest_rd_atomic == 1);
    REQUIRE(t.attr.min_rnr_timer == 14);
    REQUIRE(t.attr.ah_attr.dlid == 0x1234);
    REQUIRE(t.attr.ah_attr.sl == 4);
    REQUIRE(t.attr.ah_attr.src_path_bits == 0);
    REQUIRE(t.attr.ah_attr.port_num == 2);
    REQUIRE(t.attr.ah_attr.is_global == 0);
    REQUIRE(t.attr.ah_attr.grh.hop_limit == 0);
    // Fields of other transitions stay zero.
    REQUIRE(t.attr.sq_psn == 0);
    REQUIRE(t.attr.timeout == 0);
    REQUIRE(t.attr.retry_cnt == 0);
    remote.mtu = IBV_MTU_1024;
    REQUIRE(rtr_transition(p, remote, 0x42).attr.path_mtu == IBV_MTU_1024);
  }
  SECTION("INIT -> RTR over RoCE (GRH with the remote GID)") {
    ConnInfo remote = sample_info();
    remote.lid = 0;
    remote.link_layer = IBV_LINK_LAYER_ETHERNET;
    QpParams roce = p;
    roce.local_link_layer = IBV_LINK_LAYER_ETHERNET;
    const QpTransition t = rtr_transition(roce, remote, 0x111);
    REQUIRE(t.attr.ah_attr.is_global == 1);
    REQUIRE(std::memcmp(t.attr.ah_attr.grh.dgid.raw, remote.gid.data(), 16) == 0);
    REQUIRE(t.attr.ah_attr.grh.sgid_index == 3);
    REQUIRE(t.attr.ah_attr.grh.hop_limit == 255);
    REQUIRE(t.attr.ah_attr.grh.traffic_class == 106);
    REQUIRE(t.attr.ah_attr.grh.flow_label == 0);
    REQUIRE(t.attr.ah_attr.dlid == 0);
    REQUIRE(t.attr.dest_qp_num == 0x111);
    // IB across subnets (remote LID 0) also routes by GID.
    ConnInfo routed = sample_info();
    routed.lid = 0;
    REQUIRE(rtr_transition(p, routed, 1).attr.ah_attr.is_global == 1);
  }
  SECTION("RTR -> RTS") {
    const QpTransition t = rts_transition(p, 0x123456);
    REQUIRE(t.mask == (IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC));
    REQUIRE(t.mask == ((1 << 0) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 16) | (1 << 13)));
    REQUIRE(t.attr.qp_state == IBV_QPS_RTS);
    REQUIRE(t.attr.timeout == 18);
    REQUIRE(t.attr.retry_cnt == 5);
    REQUIRE(t.attr.rnr_retry == 6);
    REQUIRE(t.attr.sq_psn == 0x123456);
    REQUIRE(t.attr.max_rd_atomic == 1);
    REQUIRE(t.attr.rq_psn == 0);
    REQUIRE(t.attr.dest_qp_num == 0);
  }
  SECTION("defaults follow NCCL") {
    const QpParams d;
    REQUIRE(d.timeout == 20);
    REQUIRE(d.retry_count == 7);
    REQUIRE(d.rnr_retry == 7);
    REQUIRE(d.min_rnr_timer == 12);
  }
}

TEST_CASE("ibverbs: completion statuses are classified for the health layer", "[ibverbs]") {
  REQUIRE(classify_wc_status(IBV_WC_SUCCESS).action == WcAction::Complete);
  REQUIRE(classify_wc_status(IBV_WC_SUCCESS).code == ErrorCode::Ok);
  for (int s : {IBV_WC_RETRY_EXC_ERR, IBV_WC_RNR_RETRY_EXC_ERR, IBV_WC_RESP_TIMEOUT_ERR}) {
    INFO(wc_status_name(s));
    const WcClass c = classify_wc_status(s);
    REQUIRE(c.action == WcAction::LinkError);
    REQUIRE(c.code == ErrorCode::Transient);
    REQUIRE(c.timeout);
  }
  REQUIRE(classify_wc_status(12).action == WcAction::LinkError);  // RETRY_EXC_ERR's value
  const WcClass flush = classify_wc_status(IBV_WC_WR_FLUSH_ERR);
  REQUIRE(flush.action == WcAction::Fence);
  REQUIRE(flush.code == ErrorCode::Fenced);
  for (int s : std::initializer_list<int>{IBV_WC_LOC_LEN_ERR, IBV_WC_LOC_QP_OP_ERR, IBV_WC_LOC_PROT_ERR, IBV_WC_MW_BIND_ERR, IBV_WC_BAD_RESP_ERR,
                IBV_WC_LOC_ACCESS_ERR, IBV_WC_REM_INV_REQ_ERR, IBV_WC_REM_ACCESS_ERR, IBV_WC_REM_OP_ERR, IBV_WC_REM_ABORT_ERR,
                IBV_WC_FATAL_ERR, IBV_WC_GENERAL_ERR, 999, -1}) {
    INFO(s << " " << wc_status_name(s));
    const WcClass c = classify_wc_status(s);
    REQUIRE(c.action == WcAction::Fence);
    REQUIRE(c.code == ErrorCode::Ibv);
    REQUIRE_FALSE(c.timeout);
  }
  REQUIRE(wc_status_name(IBV_WC_REM_ACCESS_ERR) == "remote-access");
  REQUIRE(wc_status_name(IBV_WC_RETRY_EXC_ERR) == "retry-exceeded");
  REQUIRE(wc_status_name(12345) == "unknown");
}

TEST_CASE("ibverbs: asynchronous events map to health actions", "[ibverbs]") {
  for (int e : {IBV_EVENT_QP_FATAL, IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR, IBV_EVENT_CQ_ERR, IBV_EVENT_WQ_FATAL}) {
    INFO(e);
    REQUIRE(classify_async_event(e).action == AsyncAction::FenceQp);
  }
  REQUIRE(classify_async_event(IBV_EVENT_DEVICE_FATAL).action == AsyncAction::FenceDevice);
  REQUIRE(classify_async_event(IBV_EVENT_PORT_ERR).action == AsyncAction::PortDown);
  REQUIRE(classify_async_event(IBV_EVENT_PORT_ERR).name == "port-error");
  REQUIRE(classify_async_event(IBV_EVENT_PORT_ACTIVE).action == AsyncAction::PortUp);
  REQUIRE(classify_async_event(IBV_EVENT_COMM_EST).action == AsyncAction::Ignore);
  for (int e : std::initializer_list<int>{IBV_EVENT_LID_CHANGE, IBV_EVENT_PKEY_CHANGE, IBV_EVENT_SM_CHANGE, IBV_EVENT_GID_CHANGE, IBV_EVENT_CLIENT_REREGISTER,
                IBV_EVENT_PATH_MIG, IBV_EVENT_PATH_MIG_ERR, IBV_EVENT_SQ_DRAINED, IBV_EVENT_SRQ_ERR, IBV_EVENT_SRQ_LIMIT_REACHED,
                IBV_EVENT_QP_LAST_WQE_REACHED, 20 /* DEVICE_SPEED_CHANGE */, 4242}) {
    INFO(e);
    REQUIRE(classify_async_event(e).action == AsyncAction::Log);
  }
  // The values the reference lists (rdma-core / NCCL ibvcore.h).
  REQUIRE(IBV_EVENT_PORT_ERR == 10);
  REQUIRE(IBV_EVENT_DEVICE_FATAL == 8);
  REQUIRE(IBV_EVENT_QP_FATAL == 1);
}

TEST_CASE("ibverbs: port rate from width and speed codes", "[ibverbs]") {
  REQUIRE(port_gbps(2, 64) == Approx(4 * 53.125 / 8));   // 4x HDR = 200 Gb/s class
  REQUIRE(port_gbps(2, 128) == Approx(4 * 106.25 / 8));  // 4x NDR
  REQUIRE(port_gbps(1, 1) == Approx(2.5 / 8));           // 1x SDR
  REQUIRE(port_gbps(16, 32) == Approx(2 * 25.78125 / 8));
  REQUIRE(port_gbps(3, 64) == 0);
  REQUIRE(port_gbps(2, 3) == 0);
}

TEST_CASE("ibverbs: without an HCA (or library) the transport reaches nobody", "[ibverbs]") {
  CommOptions o;
  Logger log(LogLevel::Error);
  SECTION("missing library") {
    o.transport_settings["RINGFENCE_IB_LIBRARY"] = "libringfence-no-such-verbs.so.1";
    auto t = make_transport(TransportContext{PeerInfo{0, "h", 1}, 2, &o, &log});
    REQUIRE(t->name() == "ibverbs");
    const Reachability r = t->can_reach(PeerInfo{0, "h", 1}, PeerInfo{1, "g", 2});
    REQUIRE_FALSE(r.ok);
    REQUIRE_THAT(r.reason, Catch::Contains("libringfence-no-such-verbs.so.1"));
    REQUIRE_THAT(error_of([&] { (void)t->listen(); }), Catch::Contains("rank 0") && Catch::Contains("no usable HCA"));
    int x = 0;
    REQUIRE_THAT(error_of([&] { (void)t->register_memory(&x, sizeof x, MemoryKind::Host); }), Catch::Contains("no usable HCA"));
    // Device memory (GPUDirect RDMA) needs the HCA first, and says so.
    REQUIRE_THAT(error_of([&] { (void)t->register_memory(&x, sizeof x, MemoryKind::Device); }),
                 Catch::Contains("rank 0") && Catch::Contains("no usable HCA"));
    // Keys are parsed (and validated) without hardware.
    const RemoteRegion rr = t->import_region(serialize(RegionKey{4096, 128, 7}));
    REQUIRE(rr.size() == 128);
    REQUIRE_THROWS_AS(t->import_region(Bytes(5)), InvalidUsage);
  }
  SECTION("this machine's libibverbs, whatever it finds") {
    auto t = make_transport(TransportContext{PeerInfo{0, "h", 1}, 2, &o, &log});
    const Reachability r = t->can_reach(PeerInfo{0, "h", 1}, PeerInfo{1, "g", 2});
    // On a CI box without an HCA this is false with a reason; with one it is true.
    if (!r.ok) REQUIRE_FALSE(r.reason.empty());
    REQUIRE_FALSE(t->can_reach(PeerInfo{0, "h", 1}, PeerInfo{0, "h", 1}).ok);
  }
  SECTION("a malformed RINGFENCE_IB_HCA fails creation, naming it") {
    o.transport_settings["RINGFENCE_IB_HCA"] = "mlx5_0:0";
    REQUIRE_THAT(error_of([&] { (void)make_transport(TransportContext{PeerInfo{0, "h", 1}, 2, &o, &log}); }),
                 Catch::Contains("RINGFENCE_IB_HCA"));
  }
}
