/* nccl_api_test_local.c: communicators made inside the process (ncclCommInitAll and friends),
 * split and shrink (part of nccl_api_test, see nccl_api_test.c). */
#include "nccl_api_test.h"

/* Several communicators of one process: ncclCommInitAll, and ncclCommInitRank inside a group. */
void test_local_communicators(void) {
  enum { kDev = 3, kCount = 5000 };
  ncclComm_t comms[kDev];
  const int devlist[kDev] = {5, 7, 9};
  OK(ncclCommInitAll(comms, kDev, devlist));
  int32_t bufs[kDev][kCount], ring_out[kDev][kCount], ring_in[kDev][kCount];
  for (int d = 0; d < kDev; ++d) {
    int v = -1;
    OK(ncclCommUserRank(comms[d], &v));
    CHECK(v == d, "ncclCommInitAll comm %d has rank %d", d, v);
    OK(ncclCommCount(comms[d], &v));
    CHECK(v == kDev, "ncclCommInitAll comm %d has %d ranks", d, v);
    OK(ncclCommCuDevice(comms[d], &v));
    CHECK(v == devlist[d], "ncclCommInitAll comm %d reports device %d, want %d", d, v, devlist[d]);
    for (int i = 0; i < kCount; ++i) {
      bufs[d][i] = d * 100 + i + g_rank;
      ring_out[d][i] = d * 1000 - i;
    }
  }
  /* One thread drives every rank: collectives and a ring of transfers in one group. */
  OK(ncclGroupStart());
  for (int d = 0; d < kDev; ++d) {
    OK(ncclAllReduce(bufs[d], bufs[d], kCount, ncclInt32, ncclSum, comms[d], NULL));
    OK(ncclSend(ring_out[d], kCount, ncclInt32, (d + 1) % kDev, comms[d], NULL));
    OK(ncclRecv(ring_in[d], kCount, ncclInt32, (d + kDev - 1) % kDev, comms[d], NULL));
  }
  OK(ncclGroupEnd());
  long bad = 0;
  for (int d = 0; d < kDev; ++d)
    for (int i = 0; i < kCount; ++i) {
      bad += bufs[d][i] != 300 + 3 * i + 3 * g_rank;
      bad += ring_in[d][i] != ((d + kDev - 1) % kDev) * 1000 - i;
    }
  CHECK(bad == 0, "grouped collectives over ncclCommInitAll communicators: %ld wrong", bad);
  /* A failure found when the group runs (overlapping buffers, which ringfence checks) comes back
   * from ncclGroupEnd and from this thread's ncclGetLastError, although worker threads ran it. */
  OK(ncclGroupStart());
  for (int d = 0; d < kDev; ++d) OK(ncclAllReduce(bufs[d], bufs[d] + 1, 16, ncclInt32, ncclSum, comms[d], NULL));
  FAILS(ncclInvalidUsage, ncclGroupEnd());
  CHECK(strstr(ncclGetLastError(NULL), "overlap") != NULL, "ncclGetLastError(NULL) after the group: '%s'", ncclGetLastError(NULL));
  /* One thread splits every rank in one group (keys reverse the order). */
  ncclComm_t sub[kDev];
  OK(ncclGroupStart());
  for (int d = 0; d < kDev; ++d) OK(ncclCommSplit(comms[d], 0, kDev - d, &sub[d], NULL));
  OK(ncclGroupEnd());
  for (int d = 0; d < kDev; ++d) {
    int v = -1;
    OK(ncclCommUserRank(sub[d], &v));
    CHECK(v == kDev - 1 - d, "grouped split of ncclCommInitAll comm %d: rank %d, want %d", d, v, kDev - 1 - d);
    OK(ncclCommCuDevice(sub[d], &v));
    CHECK(v == devlist[d], "split of comm %d reports device %d, want %d", d, v, devlist[d]);
    OK(ncclCommDestroy(sub[d]));
  }
  OK(ncclCommFinalize(comms[0]));
  FAILS(ncclInvalidUsage, ncclAllReduce(bufs[0], bufs[0], 1, ncclInt32, ncclSum, comms[0], NULL));
  OK(ncclCommDestroy(comms[0]));
  OK(ncclCommAbort(comms[1]));
  OK(ncclCommDestroy(comms[2]));

  /* Two ranks of a private communicator created inside one group (NCCL's multi-device init). */
  ncclUniqueId id;
  MUST(ncclGetUniqueId(&id));
  ncclComm_t pair[2] = {NULL, NULL};
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  OK(ncclGroupStart());
  OK(ncclCommInitRank(&pair[0], 2, id, 0));
  OK(ncclCommInitRankConfig(&pair[1], 2, id, 1, &config));
  ncclResult_t state = ncclSuccess;
  OK(ncclCommGetAsyncError(pair[0], &state));
  CHECK(state == ncclInProgress, "a queued init reports %d, want ncclInProgress", (int)state);
  OK(ncclGroupEnd());
  OK(ncclCommGetAsyncError(pair[1], &state));
  CHECK(state == ncclSuccess, "the grouped init reports %d", (int)state);
  int32_t x[2][64];
  for (int i = 0; i < 64; ++i) {
    x[0][i] = i;
    x[1][i] = 1000 - i;
  }
  OK(ncclGroupStart());
  OK(ncclAllReduce(x[0], x[0], 64, ncclInt32, ncclMin, pair[0], NULL));
  OK(ncclAllReduce(x[1], x[1], 64, ncclInt32, ncclMin, pair[1], NULL));
  OK(ncclGroupEnd());
  bad = 0;
  for (int i = 0; i < 64; ++i) bad += (x[0][i] != (i < 1000 - i ? i : 1000 - i)) + (x[1][i] != x[0][i]);
  CHECK(bad == 0, "allreduce over a group-initialised pair: %ld wrong", bad);
  OK(ncclCommDestroy(pair[0]));
  OK(ncclCommDestroy(pair[1]));

  /* Creation and split of both ranks in one group: the splits run after the inits. */
  MUST(ncclGetUniqueId(&id));
  ncclComm_t halves[2] = {NULL, NULL};
  OK(ncclGroupStart());
  OK(ncclCommInitRank(&pair[0], 2, id, 0));
  OK(ncclCommInitRank(&pair[1], 2, id, 1));
  OK(ncclCommSplit(pair[0], 0, 1, &halves[0], NULL));
  OK(ncclCommSplit(pair[1], 0, 0, &halves[1], NULL));
  OK(ncclGroupEnd());
  int hr[2] = {-1, -1};
  OK(ncclCommUserRank(halves[0], &hr[0]));
  OK(ncclCommUserRank(halves[1], &hr[1]));
  CHECK(hr[0] == 1 && hr[1] == 0, "init and split in one group: ranks %d, %d (want 1, 0)", hr[0], hr[1]);
  for (int d = 0; d < 2; ++d) {
    OK(ncclCommDestroy(halves[d]));
    OK(ncclCommDestroy(pair[d]));
  }
  OK(ncclCommDestroy(NULL));
  FAILS(ncclInvalidArgument, ncclCommFinalize(NULL));
}

/* ncclCommSplit: colours rank % 2 (the last of 3+ ranks passes NCCL_SPLIT_NOCOLOR), keys reverse
 * the order; then a split queued in a group. */
void test_split(ncclComm_t comm) {
  const int nocolor = g_size > 2 ? g_size - 1 : -1;
  const int color = g_rank == nocolor ? NCCL_SPLIT_NOCOLOR : g_rank % 2;
  ncclComm_t sub = NULL;
  FAILS(ncclInvalidArgument, ncclCommSplit(comm, -7, 0, &sub, NULL));
  FAILS(ncclInvalidArgument, ncclCommSplit(comm, 0, 0, NULL, NULL));
  OK(ncclCommSplit(comm, color, -g_rank, &sub, NULL));
  /* Members of my colour in new-rank order: keys -r descend with r, so the highest old rank first. */
  int members[64], m = 0;
  for (int r = g_size - 1; r >= 0; --r)
    if (r != nocolor && r % 2 == g_rank % 2) members[m++] = r;
  if (color == NCCL_SPLIT_NOCOLOR) {
    CHECK(sub == NULL, "NCCL_SPLIT_NOCOLOR returned a communicator");
  } else if (sub != NULL) {
    int n = 0, r = -1;
    OK(ncclCommCount(sub, &n));
    OK(ncclCommUserRank(sub, &r));
    int want_rank = -1;
    for (int i = 0; i < m; ++i)
      if (members[i] == g_rank) want_rank = i;
    CHECK(n == m && r == want_rank, "split: rank %d of %d, want %d of %d", r, n, want_rank, m);
    int32_t old_ranks[64] = {0};
    int32_t mine = g_rank;
    OK(ncclAllGather(&mine, old_ranks, 1, ncclInt32, sub, NULL));
    long bad = 0;
    for (int i = 0; i < m; ++i) bad += old_ranks[i] != members[i];
    CHECK(bad == 0 && n == m, "split: allgather of old ranks in new-rank order is wrong");
    OK(ncclCommDestroy(sub));
  } else {
    CHECK(0, "split returned no communicator for colour %d", color);
  }
  /* A split queued in a group: known once the group ends. */
  OK(ncclGroupStart());
  OK(ncclCommSplit(comm, 3, g_rank, &sub, NULL));
  ncclResult_t state = ncclSuccess;
  int n = 0;
  OK(ncclCommGetAsyncError(sub, &state));
  CHECK(state == ncclInProgress, "a queued split reports %d, want ncclInProgress", (int)state);
  FAILS(ncclInvalidUsage, ncclCommCount(sub, &n));
  OK(ncclGroupEnd());
  OK(ncclCommCount(sub, &n));
  CHECK(n == g_size, "grouped split: %d ranks", n);
  int64_t v = g_rank + 1;
  OK(ncclAllReduce(&v, &v, 1, ncclInt64, ncclProd, sub, NULL));
  int64_t want = 1;
  for (int r = 1; r <= g_size; ++r) want *= r;
  CHECK(v == want, "allreduce on the grouped split: %lld, want %lld", (long long)v, (long long)want);
  OK(ncclCommDestroy(sub));
}

/* ncclCommShrink: every rank but the last makes a communicator without it. */
void test_shrink(ncclComm_t comm) {
  int exclude[1] = {g_size - 1};
  ncclComm_t small = NULL;
  if (g_rank != g_size - 1) {
    FAILS(ncclInvalidArgument, ncclCommShrink(comm, exclude, 1, &small, NULL, 0x40));
    FAILS(ncclInvalidArgument, ncclCommShrink(comm, NULL, 1, &small, NULL, NCCL_SHRINK_DEFAULT));
    OK(ncclCommShrink(comm, exclude, 1, &small, NULL, NCCL_SHRINK_DEFAULT));
    int n = 0, r = -1;
    OK(ncclCommCount(small, &n));
    OK(ncclCommUserRank(small, &r));
    CHECK(n == g_size - 1 && r == g_rank, "shrunk communicator: rank %d of %d", r, n);
    int64_t v[4] = {g_rank, 2 * g_rank, 3, -g_rank};
    OK(ncclAllReduce(v, v, 4, ncclInt64, ncclSum, small, NULL));
    const int64_t s = (int64_t)(g_size - 1) * (g_size - 2) / 2;
    CHECK(v[0] == s && v[1] == 2 * s && v[2] == 3 * (g_size - 1) && v[3] == -s, "allreduce on the shrunk communicator is wrong");
    OK(ncclCommDestroy(small));
  }
  OK(ncclAllReduce(exclude, exclude, 1, ncclInt32, ncclMax, comm, NULL)); /* the parent still works for everyone */
  CHECK(exclude[0] == g_size - 1, "parent allreduce after shrink: %d", exclude[0]);

  /* NCCL_SHRINK_ABORT on a copy of the communicator: the copy is aborted, the shrunk one works. */
  ncclComm_t copy = NULL;
  MUST(ncclCommSplit(comm, 0, g_rank, &copy, NULL));
  if (g_rank != g_size - 1) {
    OK(ncclCommShrink(copy, exclude, 1, &small, NULL, NCCL_SHRINK_ABORT));
    int32_t v = 2 * g_rank;
    OK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, small, NULL));
    CHECK(v == (g_size - 1) * (g_size - 2), "allreduce after NCCL_SHRINK_ABORT: %d", v);
    /* The copy is aborted: here (ncclInvalidUsage), or first by a peer's abort (ncclRemoteError). */
    const ncclResult_t r = ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, copy, NULL);
    CHECK(r == ncclInvalidUsage || r == ncclRemoteError, "allreduce on the aborted parent returned %d", (int)r);
    OK(ncclCommDestroy(small));
  }
  OK(ncclCommDestroy(copy));
}
