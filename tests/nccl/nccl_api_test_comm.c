/* nccl_api_test_comm.c: versions, init errors, queries, every collective exactly, groups, memory
 * and error paths on one communicator (part of nccl_api_test, see nccl_api_test.c). */
#include "nccl_api_test.h"

void test_versions_and_strings(void) {
  int version = 0;
  OK(ncclGetVersion(&version));
  CHECK(version == NCCL_VERSION_CODE, "ncclGetVersion %d, header %d", version, NCCL_VERSION_CODE);
  FAILS(ncclInvalidArgument, ncclGetVersion(NULL));
  for (int a = 0; a < (int)ncclNumResults; ++a) {
    const char* s = ncclGetErrorString((ncclResult_t)a);
    CHECK(s != NULL && s[0] != '\0', "ncclGetErrorString(%d) is empty", a);
    for (int b = 0; b < a; ++b) CHECK(strcmp(s, ncclGetErrorString((ncclResult_t)b)) != 0, "codes %d and %d share a string", a, b);
  }
  const char* last = ncclGetLastError(NULL);
  CHECK(last != NULL && strstr(last, "ncclGetVersion") != NULL, "ncclGetLastError(NULL) '%s' does not name ncclGetVersion", last ? last : "(null)");
}

void test_init_errors(const ncclUniqueId* id) {
  ncclComm_t c = NULL;
  FAILS(ncclInvalidArgument, ncclGetUniqueId(NULL));
  FAILS(ncclInvalidArgument, ncclCommInitRank(NULL, g_size, *id, g_rank));
  FAILS(ncclInvalidArgument, ncclCommInitRank(&c, 0, *id, 0));
  FAILS(ncclInvalidArgument, ncclCommInitRank(&c, g_size, *id, g_size));
  FAILS(ncclInvalidArgument, ncclCommInitRank(&c, g_size, *id, -1));
  ncclUniqueId zero;
  memset(&zero, 0, sizeof zero);
  FAILS(ncclInvalidArgument, ncclCommInitRank(&c, g_size, zero, g_rank));
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.magic = 0;
  FAILS(ncclInvalidArgument, ncclCommInitRankConfig(&c, g_size, *id, g_rank, &bad));
  CHECK(c == NULL, "a failed init left a communicator");
  FAILS(ncclInvalidArgument, ncclCommInitAll(NULL, 2, NULL));
  FAILS(ncclInvalidArgument, ncclCommInitAll(&c, 0, NULL));
  ncclComm_t two[2];
  const int dup[2] = {3, 3};
  FAILS(ncclInvalidUsage, ncclCommInitAll(two, 2, dup));
  FAILS(ncclInvalidArgument, ncclCommInitRankScalable(&c, g_size, g_rank, 0, NULL, NULL));
}

void test_queries(ncclComm_t comm, int want_device) {
  int v = -2;
  OK(ncclCommCount(comm, &v));
  CHECK(v == g_size, "ncclCommCount %d, want %d", v, g_size);
  OK(ncclCommUserRank(comm, &v));
  CHECK(v == g_rank, "ncclCommUserRank %d, want %d", v, g_rank);
  OK(ncclCommCuDevice(comm, &v));
  CHECK(v == want_device, "ncclCommCuDevice %d, want %d", v, want_device);
  ncclResult_t async = ncclInternalError;
  OK(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclSuccess, "ncclCommGetAsyncError reports %d on a healthy communicator", (int)async);
  FAILS(ncclInvalidArgument, ncclCommCount(comm, NULL));
  FAILS(ncclInvalidArgument, ncclCommUserRank(NULL, &v));
  FAILS(ncclInvalidArgument, ncclCommCuDevice(comm, NULL));
  FAILS(ncclInvalidArgument, ncclCommGetAsyncError(comm, NULL));
}

/* AllReduce, Reduce and ReduceScatter for every type and op, out of place and in place. */
void test_reductions(ncclComm_t comm, size_t count) {
  const int root = g_size - 1;
  for (int ti = 0; ti < kNumTypes; ++ti)
    for (int oi = 0; oi < kNumOps; ++oi) {
      const ncclDataType_t t = kTypes[ti];
      const ncclRedOp_t op = kOps[oi];
      const size_t es = type_size(t), total = count * (size_t)g_size;
      char* send = xmalloc(total * es);
      char* recv = xmalloc(total * es);
      for (int in_place = 0; in_place < 2; ++in_place) {
        long bad = 0;
        /* AllReduce */
        for (size_t i = 0; i < count; ++i) put(t, in_place ? recv : send, i, input(op, t, g_rank, i));
        OK(ncclAllReduce(in_place ? recv : send, recv, count, t, op, comm, NULL));
        for (size_t i = 0; i < count; ++i) bad += get(t, recv, i) != reduced(op, t, i);
        CHECK(bad == 0, "ncclAllReduce type %d op %d in_place %d: %ld wrong", (int)t, (int)op, in_place, bad);
        /* Reduce to the last rank */
        memset(recv, 0xa5, total * es);
        for (size_t i = 0; i < count; ++i) put(t, in_place ? recv : send, i, input(op, t, g_rank, i));
        OK(ncclReduce(in_place ? recv : send, recv, count, t, op, root, comm, NULL));
        bad = 0;
        if (g_rank == root)
          for (size_t i = 0; i < count; ++i) bad += get(t, recv, i) != reduced(op, t, i);
        CHECK(bad == 0, "ncclReduce type %d op %d in_place %d: %ld wrong", (int)t, (int)op, in_place, bad);
        /* ReduceScatter: block b of every rank's input is element b*count + i */
        memset(recv, 0xa5, total * es);
        for (size_t i = 0; i < total; ++i) put(t, send, i, input(op, t, g_rank, i));
        char* out = in_place ? send + (size_t)g_rank * count * es : recv;
        OK(ncclReduceScatter(send, out, count, t, op, comm, NULL));
        bad = 0;
        for (size_t i = 0; i < count; ++i) bad += get(t, out, i) != reduced(op, t, (size_t)g_rank * count + i);
        CHECK(bad == 0, "ncclReduceScatter type %d op %d in_place %d: %ld wrong", (int)t, (int)op, in_place, bad);
      }
      free(send);
      free(recv);
    }
}

/* AllGather, Broadcast, Bcast and AlltoAll for every type, and Gather/Scatter for one. */
void test_data_movement(ncclComm_t comm, size_t count) {
  const int root = 1 % g_size;
  for (int ti = 0; ti < kNumTypes; ++ti) {
    const ncclDataType_t t = kTypes[ti];
    const size_t es = type_size(t), total = count * (size_t)g_size;
    char* send = xmalloc(total * es);
    char* recv = xmalloc(total * es);
    long bad = 0;
    for (int in_place = 0; in_place < 2; ++in_place) {
      /* AllGather */
      memset(recv, 0xa5, total * es);
      char* in = in_place ? recv + (size_t)g_rank * count * es : send;
      for (size_t i = 0; i < count; ++i) put(t, in, i, pattern(g_rank, i));
      OK(ncclAllGather(in, recv, count, t, comm, NULL));
      bad = 0;
      for (int r = 0; r < g_size; ++r)
        for (size_t i = 0; i < count; ++i) bad += get(t, recv, (size_t)r * count + i) != pattern(r, i);
      CHECK(bad == 0, "ncclAllGather type %d in_place %d: %ld wrong", (int)t, in_place, bad);
      /* Broadcast from `root` */
      memset(recv, 0xa5, total * es);
      for (size_t i = 0; i < count; ++i) put(t, in_place ? recv : send, i, pattern(g_rank, i));
      OK(ncclBroadcast(in_place ? recv : send, recv, count, t, root, comm, NULL));
      bad = 0;
      for (size_t i = 0; i < count; ++i) bad += get(t, recv, i) != pattern(root, i);
      CHECK(bad == 0, "ncclBroadcast type %d in_place %d: %ld wrong", (int)t, in_place, bad);
    }
    /* Bcast (in place by definition) from rank 0 */
    for (size_t i = 0; i < count; ++i) put(t, recv, i, pattern(g_rank + 5, i));
    OK(ncclBcast(recv, count, t, 0, comm, NULL));
    bad = 0;
    for (size_t i = 0; i < count; ++i) bad += get(t, recv, i) != pattern(5, i);
    CHECK(bad == 0, "ncclBcast type %d: %ld wrong", (int)t, bad);
    /* AlltoAll: block j of rank r goes to rank j's block r */
    for (int j = 0; j < g_size; ++j)
      for (size_t i = 0; i < count; ++i) put(t, send, (size_t)j * count + i, pattern(g_rank * g_size + j, i));
    memset(recv, 0xa5, total * es);
    OK(ncclAlltoAll(send, recv, count, t, comm, NULL));
    bad = 0;
    for (int r = 0; r < g_size; ++r)
      for (size_t i = 0; i < count; ++i) bad += get(t, recv, (size_t)r * count + i) != pattern(r * g_size + g_rank, i);
    CHECK(bad == 0, "ncclAlltoAll type %d: %ld wrong", (int)t, bad);
    free(send);
    free(recv);
  }
  /* Gather to `root` and Scatter from it (int32) */
  int32_t* send = xmalloc(count * (size_t)g_size * 4);
  int32_t* recv = xmalloc(count * (size_t)g_size * 4);
  for (size_t i = 0; i < count; ++i) send[i] = (int32_t)(g_rank * 1000 + (int)i);
  OK(ncclGather(send, recv, count, ncclInt32, root, comm, NULL));
  long bad = 0;
  if (g_rank == root)
    for (int r = 0; r < g_size; ++r)
      for (size_t i = 0; i < count; ++i) bad += recv[(size_t)r * count + i] != (int32_t)(r * 1000 + (int)i);
  CHECK(bad == 0, "ncclGather: %ld wrong", bad);
  for (size_t i = 0; i < count * (size_t)g_size; ++i) send[i] = (int32_t)(7 * (int)i + g_rank);
  OK(ncclScatter(send, recv, count, ncclInt32, root, comm, NULL));
  bad = 0;
  for (size_t i = 0; i < count; ++i) bad += recv[i] != (int32_t)(7 * (int)((size_t)g_rank * count + i) + root);
  CHECK(bad == 0, "ncclScatter: %ld wrong", bad);
  free(send);
  free(recv);
}

/* 64-bit integers beyond 2^53 stay exact. */
void test_wide_integers(ncclComm_t comm) {
  int64_t v[3] = {((int64_t)1 << 60) + g_rank, -((int64_t)1 << 58) - 3 * g_rank, (int64_t)g_rank << 40};
  int64_t out[3];
  OK(ncclAllReduce(v, out, 3, ncclInt64, ncclSum, comm, NULL));
  int64_t want0 = 0, want1 = 0, want2 = 0;
  for (int r = 0; r < g_size; ++r) {
    want0 += ((int64_t)1 << 60) + r;
    want1 += -((int64_t)1 << 58) - 3 * r;
    want2 += (int64_t)r << 40;
  }
  CHECK(out[0] == want0 && out[1] == want1 && out[2] == want2, "int64 sums beyond 2^53 are not exact");
}

/* Groups: collectives and transfers mixed, nested, a ring, transfers to ourselves; ungrouped pairs. */
void test_groups(ncclComm_t comm) {
  const int n = g_size, r = g_rank, next = (r + 1) % n, prev = (r + n - 1) % n;
  enum { kCount = 3000, kBig = 1 << 18 };
  int32_t a[kCount], gathered_in[kCount];
  float b[kCount];
  int64_t* gathered = xmalloc(sizeof(int64_t) * kCount * (size_t)n);
  int64_t mine[kCount];
  int32_t ring_out[kCount], ring_in[kCount], self_out[kCount], self_in[kCount];
  int32_t* rs_in = xmalloc(sizeof(int32_t) * kCount * (size_t)n);
  int32_t rs_out[kCount];
  for (int i = 0; i < kCount; ++i) {
    a[i] = r + i;
    b[i] = (float)(r == 0 ? i % 100 : -1);
    mine[i] = (int64_t)r * 100000 + i;
    ring_out[i] = r * 10 + i;
    self_out[i] = -i - r;
    gathered_in[i] = 0;
  }
  for (size_t i = 0; i < (size_t)kCount * (size_t)n; ++i) rs_in[i] = (int32_t)i + r;
  (void)gathered_in;
  OK(ncclGroupStart());
  OK(ncclAllReduce(a, a, kCount, ncclInt32, ncclSum, comm, NULL));
  OK(ncclSend(ring_out, kCount, ncclInt32, next, comm, NULL));
  OK(ncclBroadcast(b, b, kCount, ncclFloat32, 0, comm, NULL));
  OK(ncclRecv(ring_in, kCount, ncclInt32, prev, comm, NULL));
  OK(ncclGroupStart()); /* nested */
  OK(ncclAllGather(mine, gathered, kCount, ncclInt64, comm, NULL));
  OK(ncclRecv(self_in, kCount, ncclInt32, r, comm, NULL));
  OK(ncclSend(self_out, kCount, ncclInt32, r, comm, NULL));
  OK(ncclGroupEnd());
  OK(ncclReduceScatter(rs_in, rs_out, kCount, ncclInt32, ncclSum, comm, NULL));
  OK(ncclGroupEnd());
  long bad = 0;
  for (int i = 0; i < kCount; ++i) {
    bad += a[i] != n * i + n * (n - 1) / 2;
    bad += b[i] != (float)(i % 100);
    bad += ring_in[i] != prev * 10 + i;
    bad += self_in[i] != -i - r;
    for (int q = 0; q < n; ++q) bad += gathered[(size_t)q * kCount + (size_t)i] != (int64_t)q * 100000 + i;
    bad += rs_out[i] != n * ((r * kCount) + i) + n * (n - 1) / 2;
  }
  CHECK(bad == 0, "mixed nested group: %ld wrong", bad);

  /* Every rank exchanges a large block with every rank (itself included) in one group. */
  int32_t* out = xmalloc(sizeof(int32_t) * kBig * (size_t)n);
  int32_t* in = xmalloc(sizeof(int32_t) * kBig * (size_t)n);
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < kBig; ++i) out[(size_t)q * kBig + (size_t)i] = r * 7 + q * 3 + i;
  OK(ncclGroupStart());
  for (int q = 0; q < n; ++q) {
    OK(ncclSend(out + (size_t)q * kBig, kBig, ncclInt32, q, comm, NULL));
    OK(ncclRecv(in + (size_t)q * kBig, kBig, ncclInt32, q, comm, NULL));
  }
  OK(ncclGroupEnd());
  bad = 0;
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < kBig; ++i) bad += in[(size_t)q * kBig + (size_t)i] != q * 7 + r * 3 + i;
  CHECK(bad == 0, "all-pairs group of %d-element transfers: %ld wrong", (int)kBig, bad);

  /* Ungrouped pairs: (0,1), (2,3), ...; the lower rank sends first, the higher receives first. */
  const int partner = r ^ 1;
  if (partner < n) {
    int32_t x[kCount], y[kCount];
    for (int i = 0; i < kCount; ++i) x[i] = r * 3 + i;
    if (r < partner) {
      OK(ncclSend(x, kCount, ncclInt32, partner, comm, NULL));
      OK(ncclRecv(y, kCount, ncclInt32, partner, comm, NULL));
    } else {
      OK(ncclRecv(y, kCount, ncclInt32, partner, comm, NULL));
      OK(ncclSend(x, kCount, ncclInt32, partner, comm, NULL));
    }
    bad = 0;
    for (int i = 0; i < kCount; ++i) bad += y[i] != partner * 3 + i;
    CHECK(bad == 0, "ungrouped send/recv with rank %d: %ld wrong", partner, bad);
  }
  free(gathered);
  free(rs_in);
  free(out);
  free(in);
}

/* ncclMemAlloc'ed buffers work in collectives; registration handles round-trip. */
void test_memory(ncclComm_t comm) {
  enum { kCount = 1 << 16 };
  int32_t* buf = NULL;
  OK(ncclMemAlloc((void**)&buf, sizeof(int32_t) * kCount));
  CHECK(buf != NULL && ((uintptr_t)buf % 4096) == 0, "ncclMemAlloc returned %p (want 4096-aligned)", (void*)buf);
  if (buf == NULL) return;
  void* handle = NULL;
  OK(ncclCommRegister(comm, buf, sizeof(int32_t) * kCount, &handle));
  CHECK(handle != NULL, "ncclCommRegister returned no handle");
  for (int i = 0; i < kCount; ++i) buf[i] = g_rank + i % 9;
  OK(ncclAllReduce(buf, buf, kCount, ncclInt32, ncclMax, comm, NULL));
  long bad = 0;
  for (int i = 0; i < kCount; ++i) bad += buf[i] != g_size - 1 + i % 9;
  CHECK(bad == 0, "allreduce on ncclMemAlloc memory: %ld wrong", bad);
  OK(ncclCommDeregister(comm, handle));
  FAILS(ncclInvalidArgument, ncclCommDeregister(comm, handle)); /* twice */
  FAILS(ncclInvalidArgument, ncclCommRegister(comm, NULL, 64, &handle));
  FAILS(ncclInvalidArgument, ncclCommRegister(comm, buf, 64, NULL));
  OK(ncclMemFree(buf));
  FAILS(ncclInvalidArgument, ncclMemFree(buf)); /* twice */
  int stack_var = 0;
  FAILS(ncclInvalidArgument, ncclMemFree(&stack_var));
  OK(ncclMemFree(NULL));
  void* none = &stack_var;
  OK(ncclMemAlloc(&none, 0));
  CHECK(none == NULL, "ncclMemAlloc of 0 bytes returned %p", none);
  FAILS(ncclInvalidArgument, ncclMemAlloc(NULL, 16));
}

/* Argument errors, refused memory and streams, unsupported calls: specific codes, never success. */
void test_errors(ncclComm_t comm, void* device_pointer) {
  int32_t buf[16] = {0}, out[16 * 8];
  FAILS(ncclInvalidArgument, ncclAllReduce(NULL, buf, 16, ncclInt32, ncclSum, comm, NULL));
  FAILS(ncclInvalidArgument, ncclAllReduce(buf, NULL, 16, ncclInt32, ncclSum, comm, NULL));
  FAILS(ncclInvalidArgument, ncclAllReduce(buf, buf, 16, ncclInt32, ncclSum, NULL, NULL));
  FAILS(ncclInvalidArgument, ncclAllReduce(buf, buf, 16, (ncclDataType_t)99, ncclSum, comm, NULL));
  FAILS(ncclInvalidArgument, ncclAllReduce(buf, buf, 16, ncclInt32, (ncclRedOp_t)77, comm, NULL));
  FAILS(ncclInvalidUsage, ncclAllReduce(buf, buf, 16, ncclFloat8e4m3, ncclSum, comm, NULL));
  /* A non-NULL stream makes a collective stream-ordered (docs/device.md): without a usable CUDA
   * runtime (CPU machines) or with a bogus stream (GPU machines) the CUDA call fails. On device
   * regions (the test run with RINGFENCE_DEVICE_REGIONS=on) the plain host buffer is refused
   * first, naming the argument. */
  const char* regions = getenv("RINGFENCE_DEVICE_REGIONS");
  const int on_device = regions != NULL && strcmp(regions, "on") == 0;
  FAILS(on_device ? ncclInvalidUsage : ncclUnhandledCudaError, ncclAllReduce(buf, buf, 16, ncclInt32, ncclSum, comm, (cudaStream_t)0x1));
  {
    const char* last = ncclGetLastError(comm);
    CHECK(strstr(last, on_device ? "sendbuff" : "CUDA") != NULL, "stream-ordered failure '%s' does not name %s", last,
          on_device ? "sendbuff" : "CUDA");
  }
  /* So do send/recv with a stream (stream-ordered send/recv). */
  FAILS(on_device ? ncclInvalidUsage : ncclUnhandledCudaError, ncclSend(buf, 16, ncclInt32, (g_rank + 1) % g_size, comm, (cudaStream_t)0x1));
  FAILS(ncclInvalidArgument, ncclBroadcast(buf, buf, 16, ncclInt32, g_size, comm, NULL));
  {
    const char* last = ncclGetLastError(comm);
    CHECK(strstr(last, "root") != NULL && strstr(last, "ncclBroadcast") != NULL, "ncclGetLastError(comm) = '%s'", last);
  }
  FAILS(ncclInvalidArgument, ncclBcast(buf, 16, ncclInt32, -1, comm, NULL));
  FAILS(ncclInvalidArgument, ncclReduce(buf, buf, 16, ncclInt32, ncclSum, g_size + 3, comm, NULL));
  FAILS(ncclInvalidArgument, ncclSend(buf, 16, ncclInt32, g_size, comm, NULL));
  FAILS(ncclInvalidArgument, ncclRecv(buf, 16, ncclInt32, -1, comm, NULL));
  FAILS(ncclInvalidArgument, ncclRecv(NULL, 16, ncclInt32, 0, comm, NULL));
  FAILS(ncclInvalidArgument, ncclAllGather(buf, NULL, 16, ncclInt32, comm, NULL));
  FAILS(ncclInvalidArgument, ncclReduceScatter(NULL, out, 16, ncclInt32, ncclSum, comm, NULL));
  FAILS(ncclInvalidArgument, ncclAlltoAll(buf, out, 16, (ncclDataType_t)-3, comm, NULL));
  FAILS(ncclInvalidArgument, ncclGather(buf, out, 16, ncclInt32, g_size, comm, NULL));
  FAILS(ncclInvalidArgument, ncclScatter(buf, out, 16, ncclInt32, -2, comm, NULL));
  FAILS(ncclInvalidUsage, ncclGroupEnd()); /* no group */
  /* An argument error inside a group: the call and ncclGroupEnd report it, nothing runs. */
  OK(ncclGroupStart());
  OK(ncclAllReduce(buf, buf, 16, ncclInt32, ncclSum, comm, NULL));
  FAILS(ncclInvalidArgument, ncclAllReduce(NULL, buf, 16, ncclInt32, ncclSum, comm, NULL));
  FAILS(ncclInvalidArgument, ncclGroupEnd());
  /* Device memory (reported by the CUDA runtime) makes send/recv and gather stream-ordered:
   * this fake runtime has no streams, so they fail with a CUDA error naming the stream-ordered
   * call (test_device_buffers runs them on one that has). Registration only records the range. */
  if (device_pointer != NULL) {
    FAILS(ncclUnhandledCudaError, ncclSend(device_pointer, 16, ncclInt32, (g_rank + 1) % g_size, comm, NULL));
    FAILS(ncclUnhandledCudaError, ncclRecv(device_pointer, 16, ncclInt32, (g_rank + 1) % g_size, comm, NULL));
    const char* last = ncclGetLastError(comm);
    CHECK(strstr(last, "recv on a CUDA stream") != NULL, "device pointer error '%s' does not name the stream-ordered recv", last);
    void* handle = NULL;
    OK(ncclCommRegister(comm, device_pointer, 64, &handle));
    OK(ncclCommDeregister(comm, handle));
  }
  /* Not supported by this build. */
  ncclRedOp_t op;
  float scalar = 2.0f;
  FAILS(ncclInvalidUsage, ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, comm));
  FAILS(ncclInvalidUsage, ncclRedOpDestroy((ncclRedOp_t)ncclNumOps, comm));
  ncclWindow_t win;
  FAILS(ncclInvalidUsage, ncclCommWindowRegister(comm, buf, sizeof buf, &win, NCCL_WIN_DEFAULT));
  FAILS(ncclInvalidUsage, ncclCommWindowDeregister(comm, NULL));
  FAILS(ncclInvalidUsage, ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  OK(ncclGroupStart());
  FAILS(ncclInvalidUsage, ncclGroupSimulateEnd(&sim));
  OK(ncclGroupEnd()); /* the group stayed open; it is empty */
  /* The communicator still works after all of that. */
  for (int i = 0; i < 16; ++i) buf[i] = i;
  OK(ncclAllReduce(buf, buf, 16, ncclInt32, ncclSum, comm, NULL));
  long bad = 0;
  for (int i = 0; i < 16; ++i) bad += buf[i] != i * g_size;
  CHECK(bad == 0, "allreduce after the error paths: %ld wrong", bad);
}
