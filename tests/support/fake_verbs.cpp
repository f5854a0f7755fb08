// A fake libibverbs (libringfence_fake_verbs.so) for CPU-only tests of the ibverbs transport,
// which dlopens it through RINGFENCE_IB_LIBRARY (tests/conformance). Built against the real
// <infiniband/verbs.h>: the structs and the context's ops table are the real ABI.
// Fakes: one HCA, "fake_mlx0", with one ACTIVE InfiniBand port (port 1, LID 0x11, 4x HDR), and
// RC queue pairs whose peers live in the same process. RDMA WRITE and RDMA WRITE WITH IMM run at
// post time, in posting order, as a memcpy into the peer's (directly addressable) memory, after
// the checks an HCA makes: QP states and the attributes each transition needs; the connection
// (the destination QP of RTR, connected back, in RTR/RTS, at the PSN we send; the path's LID or
// GID); lkeys and rkeys against registered regions (range, access flags, protection domain);
// inline size; send/receive queue and CQ depths. Errors come back as from an HCA: an errno from
// the post, or an error completion (LOC_PROT_ERR, LOC_LEN_ERR, REM_ACCESS_ERR, RETRY_EXC_ERR,
// RNR_RETRY_EXC_ERR) that moves the QP to ERR, which flushes every outstanding WR (WR_FLUSH_ERR).
// Does not fake: other processes (no wire, no real DMA), async events (none ever comes), other
// opcodes (SEND, READ, atomics), other QP types, SRQs, completion channels, dma-buf registration
// (ibv_reg_dmabuf_mr is not exported), RoCE, time: nothing waits (a missing peer fails at once,
// and so does a WRITE WITH IMM finding no posted receive, which an HCA with infinite RNR retry
// would hold back until the peer posts one).
#include <endian.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

namespace {

constexpr std::uint16_t kLid = 0x11;
constexpr std::uint64_t kGuid = 0x0002c90300abcdefULL;
constexpr int kGidTableLen = 4;  // index 0 holds the port GID, the others are empty
constexpr ibv_mtu kActiveMtu = IBV_MTU_4096;
constexpr std::uint32_t kMaxWr = 16384, kMaxSge = 30, kMaxInline = 256, k24Bits = 0xffffff;
constexpr std::uint64_t kMaxMsg = std::uint64_t{1} << 31;
constexpr int kMaxCqe = 1 << 22;

struct Mr : ibv_mr {
  int access = 0;
};
struct Entry {
  ibv_wc wc;
  std::uint32_t send_wqes;  // send queue entries of QP wc.qp_num it retires when polled (0: a receive)
};
struct Cq : ibv_cq {
  std::deque<Entry> entries;
  bool overrun = false;
};
struct Qp : ibv_qp {
  ibv_qp_cap cap{};
  bool sig_all = false, path_ok = false;  // path_ok: RTR's address vector names our port
  int access = 0;                         // qp_access_flags (INIT)
  std::uint32_t dest_qpn = 0, rq_psn = 0, sq_psn = 0;
  std::uint8_t rnr_retry = 0;
  std::deque<std::uint64_t> rq;  // posted receives (wr_ids, FIFO)
  std::uint32_t sq_used = 0;     // send WQEs not yet retired by a polled completion
  std::uint32_t unsignaled = 0;  // run unsignalled WRs, retired with the next completion
};

// The fabric: every QP and MR of the process, by number and key. A process-wide global stands in
// for the hardware: both ranks of a test live in one process and must reach each other's queue
// pairs and regions as an HCA does over the wire, whichever context made them. One mutex
// serialises every verb (the fake models behaviour, not speed).
struct Fabric {
  std::mutex mu;
  std::map<std::uint32_t, Qp*> qps;  // by qp_num
  std::map<std::uint32_t, Mr*> mrs;  // by lkey (even) and by rkey (odd)
  std::uint32_t next_qpn = 0x100, next_key = 0x1000;
};
Fabric& fabric() {
  static Fabric f;
  return f;
}

template <class T>
T* fail(int err) {
  errno = err;
  return nullptr;
}

ibv_device& device() {
  static ibv_device d = [] {
    ibv_device x{};
    x.node_type = IBV_NODE_CA;
    x.transport_type = IBV_TRANSPORT_IB;
    std::snprintf(x.name, sizeof x.name, "%s", "fake_mlx0");
    std::snprintf(x.dev_name, sizeof x.dev_name, "%s", "uverbs0");
    return x;
  }();
  return d;
}

ibv_gid port_gid() {  // link-local prefix, then the port GUID
  ibv_gid g{};
  g.raw[0] = 0xfe;
  g.raw[1] = 0x80;
  for (int i = 0; i < 8; ++i) g.raw[8 + i] = static_cast<std::uint8_t>(kGuid >> (56 - 8 * i));
  return g;
}

Qp* find_qp(std::uint32_t qpn) {
  const auto it = fabric().qps.find(qpn);
  return it == fabric().qps.end() ? nullptr : it->second;
}

// True when `key` (an lkey, or an rkey when `remote`) names a region of `pd` allowing `need`
// and covering [addr, addr + len).
bool covers(std::uint32_t key, bool remote, const ibv_pd* pd, std::uint64_t addr, std::uint64_t len, int need) {
  const auto it = fabric().mrs.find(key);
  if (it == fabric().mrs.end()) return false;
  const Mr* mr = it->second;
  const auto base = reinterpret_cast<std::uintptr_t>(mr->addr);
  return (remote ? mr->rkey : mr->lkey) == key && mr->pd == pd && (mr->access & need) == need && addr >= base &&
         len <= mr->length && addr - base <= mr->length - len;
}

void push(ibv_cq* ibcq, std::uint64_t wr_id, ibv_wc_status status, ibv_wc_opcode opcode, std::uint32_t qpn,
          std::uint32_t send_wqes, ibv_wc wc = {}) {
  auto* cq = static_cast<Cq*>(ibcq);
  if (static_cast<int>(cq->entries.size()) >= cq->cqe) {
    // An HCA raises CQ_ERR here; the fake has no async events: the CQ fails every later poll.
    if (!cq->overrun) std::fprintf(stderr, "fake_verbs: CQ overrun (%d entries): later polls fail\n", cq->cqe);
    cq->overrun = true;
    return;
  }
  wc.wr_id = wr_id;
  wc.status = status;
  wc.opcode = opcode;
  wc.qp_num = qpn;
  cq->entries.push_back(Entry{wc, send_wqes});
}

void push_send(Qp* qp, std::uint64_t wr_id, ibv_wc_status status) {
  push(qp->send_cq, wr_id, status, IBV_WC_RDMA_WRITE, qp->qp_num, 1 + qp->unsignaled);
  qp->unsignaled = 0;
}

// ERR: every outstanding work request completes with WR_FLUSH_ERR (sends never wait here).
void to_error(Qp* qp) {
  qp->state = IBV_QPS_ERR;
  for (std::uint64_t id : qp->rq) push(qp->recv_cq, id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, qp->qp_num, 0);
  qp->rq.clear();
}

// Runs one posted WR of `length` bytes as the HCA would.
ibv_wc_status run(Qp* qp, const ibv_send_wr& wr, std::uint64_t length) {
  if (length > kMaxMsg) return IBV_WC_LOC_LEN_ERR;
  const bool inl = wr.send_flags & IBV_SEND_INLINE;  // inline data is read now, by the CPU: no lkey
  for (int i = 0; i < wr.num_sge && !inl; ++i)
    if (!covers(wr.sg_list[i].lkey, false, qp->pd, wr.sg_list[i].addr, wr.sg_list[i].length, 0)) return IBV_WC_LOC_PROT_ERR;
  // The responder: exists, connected back to us, receiving, at the PSN we send; or no ACK comes.
  Qp* peer = find_qp(qp->dest_qpn);
  if (!qp->path_ok || !peer || peer->dest_qpn != qp->qp_num ||
      (peer->state != IBV_QPS_RTR && peer->state != IBV_QPS_RTS) || peer->rq_psn != qp->sq_psn)
    return IBV_WC_RETRY_EXC_ERR;
  const std::uint64_t to = wr.wr.rdma.remote_addr;
  if (length > 0 &&  // a zero-length write checks no rkey (IB spec)
      (!(peer->access & IBV_ACCESS_REMOTE_WRITE) ||
       !covers(wr.wr.rdma.rkey, true, peer->pd, to, length, IBV_ACCESS_REMOTE_WRITE)))
    return IBV_WC_REM_ACCESS_ERR;
  const bool imm = wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  if (imm && peer->rq.empty()) {
    if (qp->rnr_retry == 7) std::fprintf(stderr, "fake_verbs: receiver not ready; an HCA would retry forever\n");
    return IBV_WC_RNR_RETRY_EXC_ERR;
  }
  auto* dst = reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(to));
  for (int i = 0; i < wr.num_sge; ++i) {
    std::memmove(dst, reinterpret_cast<const void*>(static_cast<std::uintptr_t>(wr.sg_list[i].addr)), wr.sg_list[i].length);
    dst += wr.sg_list[i].length;
  }
  qp->sq_psn = (qp->sq_psn + 1) & k24Bits;  // one PSN per message on both ends (there are no packets)
  peer->rq_psn = (peer->rq_psn + 1) & k24Bits;
  if (imm) {
    ibv_wc wc{};
    wc.wc_flags = IBV_WC_WITH_IMM;
    wc.imm_data = wr.imm_data;
    wc.byte_len = static_cast<std::uint32_t>(length);
    wc.src_qp = qp->qp_num;
    wc.slid = kLid;
    push(peer->recv_cq, peer->rq.front(), IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, peer->qp_num, 0, wc);
    peer->rq.pop_front();
  }
  return IBV_WC_SUCCESS;
}

// Each WR runs at once, in order; an error moves the QP to ERR, so the ones after it flush.
int post_send(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad) {
  std::lock_guard lock(fabric().mu);
  auto* qp = static_cast<Qp*>(ibqp);
  for (; wr; wr = wr->next) {
    std::uint64_t length = 0;
    for (int i = 0; i < wr->num_sge; ++i) length += wr->sg_list[i].length;
    int err = 0;
    if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR) err = EINVAL;  // RESET, INIT, RTR: cannot send
    else if (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM) err = EINVAL;  // not faked
    else if (wr->num_sge < 0 || static_cast<std::uint32_t>(wr->num_sge) > qp->cap.max_send_sge) err = EINVAL;
    else if ((wr->send_flags & IBV_SEND_INLINE) && length > qp->cap.max_inline_data) err = EINVAL;
    else if (qp->sq_used >= qp->cap.max_send_wr) err = ENOMEM;
    if (err) {
      if (bad) *bad = wr;
      return err;
    }
    ++qp->sq_used;
    const ibv_wc_status status = qp->state == IBV_QPS_ERR ? IBV_WC_WR_FLUSH_ERR : run(qp, *wr, length);
    if (status != IBV_WC_SUCCESS || qp->sig_all || (wr->send_flags & IBV_SEND_SIGNALED))
      push_send(qp, wr->wr_id, status);  // an error completes even when unsignalled
    else
      ++qp->unsignaled;
    if (status != IBV_WC_SUCCESS && qp->state != IBV_QPS_ERR) to_error(qp);
  }
  return 0;
}

int post_recv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  std::lock_guard lock(fabric().mu);
  auto* qp = static_cast<Qp*>(ibqp);
  for (; wr; wr = wr->next) {
    int err = 0;
    if (qp->state == IBV_QPS_RESET) err = EINVAL;
    else if (wr->num_sge < 0 || static_cast<std::uint32_t>(wr->num_sge) > qp->cap.max_recv_sge) err = EINVAL;
    else if (qp->rq.size() >= qp->cap.max_recv_wr) err = ENOMEM;
    if (err) {
      if (bad) *bad = wr;
      return err;
    }
    if (qp->state == IBV_QPS_ERR)
      push(qp->recv_cq, wr->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, qp->qp_num, 0);
    else
      qp->rq.push_back(wr->wr_id);
  }
  return 0;
}

int poll_cq(ibv_cq* ibcq, int n, ibv_wc* wc) {
  std::lock_guard lock(fabric().mu);
  auto* cq = static_cast<Cq*>(ibcq);
  if (cq->overrun) return -1;
  int got = 0;
  for (; got < n && !cq->entries.empty(); cq->entries.pop_front()) {
    const Entry& e = cq->entries.front();
    if (Qp* qp = e.send_wqes ? find_qp(e.wc.qp_num) : nullptr) qp->sq_used -= std::min(qp->sq_used, e.send_wqes);
    wc[got++] = e.wc;
  }
  return got;
}

int req_notify_cq(ibv_cq*, int) { return EOPNOTSUPP; }  // no completion channels

}  // namespace

extern "C" {

// ibv_get_device_list, ibv_query_port and ibv_reg_mr are also macros in verbs.h: the names are
// parenthesised so that these define the exported functions.
ibv_device** (ibv_get_device_list)(int* num_devices) {
  auto** list = static_cast<ibv_device**>(std::calloc(2, sizeof(ibv_device*)));
  if (!list) return fail<ibv_device*>(ENOMEM);
  list[0] = &device();
  if (num_devices) *num_devices = 1;
  return list;
}

void ibv_free_device_list(ibv_device** list) { std::free(list); }

const char* ibv_get_device_name(ibv_device* dev) { return dev ? dev->name : nullptr; }

ibv_context* ibv_open_device(ibv_device* dev) {
  if (dev != &device()) return fail<ibv_context>(ENODEV);
  const int fd = ::eventfd(0, EFD_CLOEXEC);  // the async fd: never written, no event ever comes
  if (fd < 0) return nullptr;
  auto* ctx = new ibv_context();
  ctx->device = dev;
  ctx->cmd_fd = -1;
  ctx->async_fd = fd;
  ctx->num_comp_vectors = 1;
  ctx->ops.poll_cq = poll_cq;
  ctx->ops.req_notify_cq = req_notify_cq;
  ctx->ops.post_send = post_send;
  ctx->ops.post_recv = post_recv;
  return ctx;
}

int ibv_close_device(ibv_context* ctx) {
  ::close(ctx->async_fd);
  delete ctx;
  return 0;
}

int ibv_query_device(ibv_context* ctx, ibv_device_attr* a) {
  if (!ctx || !a) return EINVAL;
  *a = ibv_device_attr{};
  std::snprintf(a->fw_ver, sizeof a->fw_ver, "%s", "0.0.0-fake");
  a->node_guid = a->sys_image_guid = htobe64(kGuid);
  a->max_mr_size = UINT64_MAX;
  a->max_qp = a->max_cq = a->max_pd = a->max_mr = 1 << 16;
  a->max_qp_wr = static_cast<int>(kMaxWr);
  a->max_sge = static_cast<int>(kMaxSge);
  a->max_cqe = kMaxCqe;
  a->max_pkeys = a->phys_port_cnt = 1;
  return 0;
}

int (ibv_query_port)(ibv_context* ctx, std::uint8_t port, _compat_ibv_port_attr* out) {
  if (!ctx || !out || port != 1) return EINVAL;
  // The exported symbol's struct is the old one, a prefix of ibv_port_attr (up to `flags`): only
  // its fields are written.
  auto* a = reinterpret_cast<ibv_port_attr*>(out);
  std::memset(a, 0, offsetof(ibv_port_attr, port_cap_flags2));
  a->state = IBV_PORT_ACTIVE;
  a->max_mtu = a->active_mtu = kActiveMtu;
  a->gid_tbl_len = kGidTableLen;
  a->max_msg_sz = static_cast<std::uint32_t>(kMaxMsg);
  a->pkey_tbl_len = a->sm_lid = 1;
  a->lid = kLid;
  a->max_vl_num = 4;
  a->subnet_timeout = 18;
  a->active_width = 2;   // 4x
  a->active_speed = 64;  // HDR: 4 x 53.125 Gb/s
  a->phys_state = 5;     // LinkUp
  a->link_layer = IBV_LINK_LAYER_INFINIBAND;
  return 0;
}

int ibv_query_gid(ibv_context* ctx, std::uint8_t port, int index, ibv_gid* gid) {
  if (!ctx || !gid || port != 1 || index < 0 || index >= kGidTableLen) return errno = EINVAL, -1;
  *gid = index == 0 ? port_gid() : ibv_gid{};
  return 0;
}

ibv_pd* ibv_alloc_pd(ibv_context* ctx) {
  if (!ctx) return fail<ibv_pd>(EINVAL);
  auto* pd = new ibv_pd();
  pd->context = ctx;
  return pd;
}

int ibv_dealloc_pd(ibv_pd* pd) {
  delete pd;
  return 0;
}

ibv_mr* (ibv_reg_mr)(ibv_pd* pd, void* addr, std::size_t length, int access) {
  // Remote write needs local write (IB spec); an empty range is refused.
  if (!pd || !addr || length == 0 || ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE)))
    return fail<ibv_mr>(EINVAL);
  std::lock_guard lock(fabric().mu);
  auto* mr = new Mr();
  mr->context = pd->context;
  mr->pd = pd;
  mr->addr = addr;
  mr->length = length;
  mr->access = access;
  mr->handle = fabric().next_key++;
  mr->lkey = 2 * mr->handle;  // distinct lkey and rkey: a key used on the wrong side is refused
  mr->rkey = 2 * mr->handle + 1;
  fabric().mrs[mr->lkey] = fabric().mrs[mr->rkey] = mr;
  return mr;
}

int ibv_dereg_mr(ibv_mr* ibmr) {
  std::lock_guard lock(fabric().mu);
  fabric().mrs.erase(ibmr->lkey);
  fabric().mrs.erase(ibmr->rkey);
  delete static_cast<Mr*>(ibmr);
  return 0;
}

ibv_cq* ibv_create_cq(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* channel, int comp_vector) {
  if (!ctx || cqe < 1 || cqe > kMaxCqe || comp_vector < 0 || comp_vector >= ctx->num_comp_vectors)
    return fail<ibv_cq>(EINVAL);
  if (channel) return fail<ibv_cq>(EOPNOTSUPP);  // not faked
  auto* cq = new Cq();
  cq->context = ctx;
  cq->cq_context = cq_context;
  cq->cqe = cqe;  // exactly what was asked (an HCA may round up)
  return cq;
}

int ibv_destroy_cq(ibv_cq* cq) {
  delete static_cast<Cq*>(cq);
  return 0;
}

ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* init) {
  if (!pd || !init || init->qp_type != IBV_QPT_RC || init->srq) return fail<ibv_qp>(EOPNOTSUPP);  // RC, no SRQ
  const ibv_qp_cap& c = init->cap;
  if (!init->send_cq || !init->recv_cq || init->send_cq->context != pd->context || init->recv_cq->context != pd->context ||
      c.max_send_wr > kMaxWr || c.max_recv_wr > kMaxWr || c.max_send_sge > kMaxSge || c.max_recv_sge > kMaxSge ||
      c.max_inline_data > kMaxInline)
    return fail<ibv_qp>(EINVAL);
  std::lock_guard lock(fabric().mu);
  auto* qp = new Qp();
  qp->context = pd->context;
  qp->qp_context = init->qp_context;
  qp->pd = pd;
  qp->send_cq = init->send_cq;
  qp->recv_cq = init->recv_cq;
  qp->handle = qp->qp_num = fabric().next_qpn++ & k24Bits;
  qp->state = IBV_QPS_RESET;
  qp->qp_type = IBV_QPT_RC;
  qp->cap = c;  // granted exactly as asked, so init->cap already says what was granted
  qp->sig_all = init->sq_sig_all != 0;
  fabric().qps[qp->qp_num] = qp;
  return qp;
}

// State transitions of an RC QP with the attributes each one requires (ibv_modify_qp(3)).
int ibv_modify_qp(ibv_qp* ibqp, ibv_qp_attr* a, int mask) {
  std::lock_guard lock(fabric().mu);
  auto* qp = static_cast<Qp*>(ibqp);
  if (!(mask & IBV_QP_STATE)) return EINVAL;  // only state transitions are faked
  const auto has = [&](int bits) { return (mask & bits) == bits; };
  const ibv_qp_state from = qp->state;
  switch (a->qp_state) {
    case IBV_QPS_RESET:
      qp->rq.clear();
      qp->sq_used = qp->unsignaled = qp->dest_qpn = 0;
      qp->path_ok = false;
      break;
    case IBV_QPS_INIT:
      if (from != IBV_QPS_INIT && (from != IBV_QPS_RESET || !has(IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)))
        return EINVAL;
      if (((mask & IBV_QP_PORT) && a->port_num != 1) || ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index != 0)) return EINVAL;
      if (mask & IBV_QP_ACCESS_FLAGS) qp->access = static_cast<int>(a->qp_access_flags);
      break;
    case IBV_QPS_RTR: {
      if (from != IBV_QPS_INIT ||
          !has(IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        return EINVAL;
      if (a->path_mtu < IBV_MTU_256 || a->path_mtu > kActiveMtu || a->ah_attr.port_num != 1) return EINVAL;
      qp->dest_qpn = a->dest_qp_num & k24Bits;
      qp->rq_psn = a->rq_psn & k24Bits;
      // The one port of this fabric: addressed by its LID, or by its GID in a GRH.
      const ibv_gid gid = port_gid();
      qp->path_ok = a->ah_attr.is_global ? std::memcmp(a->ah_attr.grh.dgid.raw, gid.raw, sizeof gid.raw) == 0
                                         : a->ah_attr.dlid == kLid;
      break;
    }
    case IBV_QPS_RTS:
      if ((from != IBV_QPS_RTR && from != IBV_QPS_RTS) ||
          (from == IBV_QPS_RTR &&
           !has(IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC)))
        return EINVAL;
      if (mask & IBV_QP_SQ_PSN) qp->sq_psn = a->sq_psn & k24Bits;
      if (mask & IBV_QP_RNR_RETRY) qp->rnr_retry = a->rnr_retry;
      break;
    case IBV_QPS_ERR: return to_error(qp), 0;
    default: return EINVAL;  // SQD, SQE: not faked
  }
  qp->state = a->qp_state;
  return 0;
}

int ibv_destroy_qp(ibv_qp* ibqp) {
  std::lock_guard lock(fabric().mu);
  auto* qp = static_cast<Qp*>(ibqp);
  fabric().qps.erase(qp->qp_num);
  delete qp;
  return 0;
}

int ibv_get_async_event(ibv_context* ctx, ibv_async_event* event) {
  (void)event;
  // No event ever comes. On a blocking async fd the real call would never return: fail loudly.
  const int flags = ::fcntl(ctx->async_fd, F_GETFL);
  if (flags >= 0 && !(flags & O_NONBLOCK)) {
    std::fprintf(stderr, "fake_verbs: ibv_get_async_event on a blocking async_fd would block forever\n");
    std::abort();
  }
  errno = EAGAIN;
  return -1;
}

void ibv_ack_async_event(ibv_async_event* event) { (void)event; }

}  // extern "C"
