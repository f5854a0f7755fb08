/* nccl_api_test: a C11 program written against the installed nccl.h that calls every entry point
 * of the NCCL C API the ringfence shim exports and checks every result exactly (integer-valued
 * data), plus the error paths (bad arguments, device pointers, unsupported calls).
 *
 * Run under ringfence-run (one process per rank; RINGFENCE_RANK, RINGFENCE_WORLD_SIZE and
 * RINGFENCE_JOB_TOKEN name this rank, the job and the file that carries rank 0's ncclUniqueId):
 *
 *   build/bin/ringfence-run -n 4 build/bin/nccl_api_test                       (linked to the shim)
 *   LD_PRELOAD=build/lib/libringfence_nccl.so build/bin/ringfence-run -n 4 build/bin/nccl_api_test_real
 *                                              (linked to the real libnccl.so.2, shim preloaded)
 *
 * Options:
 *   --device-pointer ADDR   ADDR is CUDA device memory (tests/nccl/fake_cudart.c reports it so):
 *                           every call given it must fail with ncclInvalidUsage.
 * Prints "nccl api test: rank R: N checks passed, F failed"; exits 1 when F > 0.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep, strtoull under -std=c11 */
#include <dlfcn.h>
#include <math.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_rank = -1, g_size = 0;
static long g_checks = 0, g_failures = 0;

#define CHECK(cond, ...)                                                \
  do {                                                                  \
    ++g_checks;                                                         \
    if (!(cond)) {                                                      \
      ++g_failures;                                                     \
      fprintf(stderr, "rank %d: FAIL line %d: ", g_rank, __LINE__);     \
      fprintf(stderr, __VA_ARGS__);                                     \
      fputc('\n', stderr);                                              \
    }                                                                   \
  } while (0)

static void expect(ncclResult_t got, ncclResult_t want, const char* what, int line, ncclComm_t comm) {
  ++g_checks;
  if (got != want) {
    ++g_failures;
    fprintf(stderr, "rank %d: FAIL line %d: %s returned %d (%s), expected %d; last error: %s\n", g_rank, line, what, (int)got,
            ncclGetErrorString(got), (int)want, ncclGetLastError(comm));
  }
}
/* A call that must succeed / must fail with `code` (never success). */
#define OK(call) expect((call), ncclSuccess, #call, __LINE__, NULL)
#define FAILS(code, call) expect((call), (code), #call, __LINE__, NULL)

/* A call whose failure makes the rest meaningless. */
#define MUST(call)                                                                                   \
  do {                                                                                               \
    ncclResult_t must_r_ = (call);                                                                   \
    if (must_r_ != ncclSuccess) {                                                                    \
      fprintf(stderr, "rank %d: FATAL line %d: %s returned %d (%s): %s\n", g_rank, __LINE__, #call, \
              (int)must_r_, ncclGetErrorString(must_r_), ncclGetLastError(NULL));                    \
      exit(1);                                                                                       \
    }                                                                                                \
  } while (0)

/* ---- element access for every type (values are small integers or dyadic fractions, exact) ---- */

static uint16_t float_to_half(float f) { /* exact for the values used here (normal or zero) */
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  if ((x & 0x7fffffffu) == 0) return (uint16_t)sign;
  const int exp = (int)((x >> 23) & 0xff) - 127 + 15;
  return (uint16_t)(sign | ((uint32_t)exp << 10) | ((x & 0x7fffffu) >> 13));
}
static float half_to_float(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const float mant = (float)(h & 0x3ff);
  float v = exp == 0 ? mant / 16777216.0f : (1.0f + mant / 1024.0f) * (float)ldexp(1.0, exp - 15);
  return (h & 0x8000u) ? -v : v;
}
static uint16_t float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return (uint16_t)(x >> 16);
}
static float bf16_to_float(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}
static int is_signed_type(ncclDataType_t t) { return t != ncclUint8 && t != ncclUint32 && t != ncclUint64; }
static int is_float_type(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32 || t == ncclFloat64;
}

static void put(ncclDataType_t t, void* buf, size_t i, double v) {
  switch (t) {
    case ncclInt8: ((int8_t*)buf)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t*)buf)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t*)buf)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t*)buf)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t*)buf)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t*)buf)[i] = (uint64_t)v; break;
    case ncclFloat16: ((uint16_t*)buf)[i] = float_to_half((float)v); break;
    case ncclBfloat16: ((uint16_t*)buf)[i] = float_to_bf16((float)v); break;
    case ncclFloat32: ((float*)buf)[i] = (float)v; break;
    default: ((double*)buf)[i] = v; break;
  }
}
static double get(ncclDataType_t t, const void* buf, size_t i) {
  switch (t) {
    case ncclInt8: return ((const int8_t*)buf)[i];
    case ncclUint8: return ((const uint8_t*)buf)[i];
    case ncclInt32: return ((const int32_t*)buf)[i];
    case ncclUint32: return ((const uint32_t*)buf)[i];
    case ncclInt64: return (double)((const int64_t*)buf)[i];
    case ncclUint64: return (double)((const uint64_t*)buf)[i];
    case ncclFloat16: return half_to_float(((const uint16_t*)buf)[i]);
    case ncclBfloat16: return bf16_to_float(((const uint16_t*)buf)[i]);
    case ncclFloat32: return ((const float*)buf)[i];
    default: return ((const double*)buf)[i];
  }
}

/* Rank r's input element i for reductions with `op` (chosen so every result is exact in every type). */
static double input(ncclRedOp_t op, ncclDataType_t t, int r, size_t i) {
  switch (op) {
    case ncclProd: return (double)(1 + (r + (int)(i % 5)) % 2);
    case ncclMax:
    case ncclMin: {
      const double v = (double)((r * 7 + (int)(i % 11) * 3) % 11);
      return is_signed_type(t) ? v - 5.0 : v;
    }
    case ncclAvg: return (double)((int)(i % 5) + r); /* the mean is a multiple of 1/2 for any rank count */
    default: return (double)((r + (int)(i % 7)) % 5);
  }
}
/* The reduction of every rank's element i (avg: divided by the rank count as the type does it). */
static double reduced(ncclRedOp_t op, ncclDataType_t t, size_t i) {
  double acc = input(op, t, 0, i);
  for (int r = 1; r < g_size; ++r) {
    const double v = input(op, t, r, i);
    if (op == ncclProd) acc *= v;
    else if (op == ncclMax) acc = v > acc ? v : acc;
    else if (op == ncclMin) acc = v < acc ? v : acc;
    else acc += v;
  }
  if (op == ncclAvg) {
    if (is_float_type(t)) return acc / g_size;  /* exact: see input() */
    return (double)((long long)acc / g_size);    /* integer division */
  }
  return acc;
}
/* Data for non-reducing collectives: element i of rank r's block. */
static double pattern(int r, size_t i) { return (double)((r * 13 + (int)(i % 17)) % 23); }

static const ncclDataType_t kTypes[] = {ncclInt8,    ncclUint8,    ncclInt32,   ncclUint32,  ncclInt64,
                                        ncclUint64,  ncclFloat16,  ncclBfloat16, ncclFloat32, ncclFloat64};
static const ncclRedOp_t kOps[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
enum { kNumTypes = sizeof kTypes / sizeof kTypes[0], kNumOps = sizeof kOps / sizeof kOps[0] };

static void* xmalloc(size_t bytes) {
  void* p = malloc(bytes ? bytes : 1);
  if (p == NULL) {
    fprintf(stderr, "rank %d: out of memory\n", g_rank);
    exit(1);
  }
  memset(p, 0xa5, bytes ? bytes : 1);
  return p;
}

/* ---- bootstrap: rank 0's ncclUniqueId travels in a file named after the job token ---- */

static char g_id_path[512];

static void share_id(ncclUniqueId* id) {
  const char* token = getenv("RINGFENCE_JOB_TOKEN");
  const char* dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(g_id_path, sizeof g_id_path, "%s/nccl_api_test.%s.id", dir, token ? token : "notoken");
  if (g_rank == 0) {
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", g_id_path);
    FILE* f = fopen(tmp, "wb");
    if (f == NULL || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, g_id_path) != 0) {
      perror("writing the unique id");
      exit(1);
    }
    return;
  }
  for (int tries = 0; tries < 6000; ++tries) {  /* 60 s */
    FILE* f = fopen(g_id_path, "rb");
    if (f != NULL) {
      const size_t got = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (got == 1) return;
    }
    const struct timespec ten_ms = {0, 10 * 1000 * 1000};
    nanosleep(&ten_ms, NULL);
  }
  fprintf(stderr, "rank %d: no unique id in %s after 60 s\n", g_rank, g_id_path);
  exit(1);
}

/* The CUDA device the shim should report: asks libcudart the way the shim does, -1 without one. */
static int expected_device(void) {
  static const char* const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"};
  for (size_t k = 0; k < sizeof names / sizeof names[0]; ++k) {
    void* h = dlopen(names[k], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) continue;
    cudaError_t (*count_fn)(int*) = NULL;
    cudaError_t (*device_fn)(int*) = NULL;
    void* sym = dlsym(h, "cudaGetDeviceCount"); /* memcpy: ISO C has no object-to-function cast */
    memcpy(&count_fn, &sym, sizeof sym);
    sym = dlsym(h, "cudaGetDevice");
    memcpy(&device_fn, &sym, sizeof sym);
    int count = 0, device = -1;
    if (count_fn == NULL || device_fn == NULL || count_fn(&count) != cudaSuccess || count <= 0) return -1;
    return device_fn(&device) == cudaSuccess ? device : -1;
  }
  return -1;
}

/* ---- sections ---- */

static void test_versions_and_strings(void) {
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

static void test_init_errors(const ncclUniqueId* id) {
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

static void test_queries(ncclComm_t comm, int want_device) {
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
static void test_reductions(ncclComm_t comm, size_t count) {
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
static void test_data_movement(ncclComm_t comm, size_t count) {
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
static void test_wide_integers(ncclComm_t comm) {
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
static void test_groups(ncclComm_t comm) {
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
static void test_memory(ncclComm_t comm) {
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
static void test_errors(ncclComm_t comm, void* device_pointer) {
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

/* Several communicators of one process: ncclCommInitAll, and ncclCommInitRank inside a group. */
static void test_local_communicators(void) {
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
static void test_split(ncclComm_t comm) {
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
static void test_shrink(ncclComm_t comm) {
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

/* Collectives on CUDA device buffers with a stream (the stream-ordered path, docs/device.md):
 * exact results after cudaStreamSynchronize. Needs a CUDA runtime with devices: in CI the fake
 * of tests/device, whose streams are threads (LD_LIBRARY_PATH). The runtime's functions are
 * looked up with dlsym so the program links no CUDA library. */
typedef int (*cuda_malloc_fn)(void**, size_t);
typedef int (*cuda_free_fn)(void*);
typedef int (*cuda_memcpy_fn)(void*, const void*, size_t, int);
typedef int (*cuda_stream_create_fn)(void**);
typedef int (*cuda_stream_fn)(void*);
static void* cuda_sym(void* h, const char* name) {
  void* f = dlsym(h, name);
  if (f == NULL) {
    fprintf(stderr, "nccl_api_test: the CUDA runtime lacks %s\n", name);
    exit(1);
  }
  return f;
}
/* A GPU lost under a group (the fake runtime of tests/device only, found by its test hook
 * fake_cuda_slow_copies; FAKE_CUDA_DEVICES is the device count it reports at every call). Two
 * one-rank communicators are made on GPUs 0 and 1; GPU 1 then disappears. The group's worker
 * for its communicator cannot make GPU 1 current: ncclGroupEnd returns ncclUnhandledCudaError
 * naming the GPU, the other communicator's operation still ran, and once GPU 1 is back the
 * communicator works. */
typedef int (*cuda_set_device_fn)(int);
static void test_lost_device(void* h) {
  if (dlsym(h, "fake_cuda_slow_copies") == NULL) return;
  cuda_set_device_fn setdev;
  void* f = cuda_sym(h, "cudaSetDevice");
  memcpy(&setdev, &f, sizeof f);
  const char* was = getenv("FAKE_CUDA_DEVICES");
  char saved[32] = "";
  if (was != NULL) snprintf(saved, sizeof saved, "%s", was);
  setenv("FAKE_CUDA_DEVICES", "2", 1);
  ncclUniqueId id0, id1;
  ncclComm_t c0 = NULL, c1 = NULL;
  MUST(ncclGetUniqueId(&id0));
  MUST(ncclGetUniqueId(&id1));
  CHECK(setdev(1) == 0, "cudaSetDevice(1)");
  MUST(ncclCommInitRank(&c1, 1, id1, 0));
  CHECK(setdev(0) == 0, "cudaSetDevice(0)");
  MUST(ncclCommInitRank(&c0, 1, id0, 0));
  int dev = -1;
  OK(ncclCommCuDevice(c1, &dev));
  CHECK(dev == 1, "communicator made on GPU 1 reports device %d", dev);
  int32_t a[8], b[8];
  for (int i = 0; i < 8; ++i) a[i] = b[i] = i;
  setenv("FAKE_CUDA_DEVICES", "1", 1); /* GPU 1 is gone */
  OK(ncclGroupStart());
  OK(ncclAllReduce(a, a, 8, ncclInt32, ncclSum, c0, NULL));
  OK(ncclAllReduce(b, b, 8, ncclInt32, ncclMax, c1, NULL));
  FAILS(ncclUnhandledCudaError, ncclGroupEnd());
  CHECK(strstr(ncclGetLastError(NULL), "cannot make GPU 1") != NULL && strstr(ncclGetLastError(NULL), "cudaSetDevice(1)") != NULL,
        "ncclGetLastError(NULL) after the lost GPU: '%s'", ncclGetLastError(NULL));
  CHECK(strstr(ncclGetLastError(c1), "cannot make GPU 1") != NULL, "ncclGetLastError(c1): '%s'", ncclGetLastError(c1));
  long bad = 0;
  for (int i = 0; i < 8; ++i) bad += a[i] != i;
  CHECK(bad == 0, "the other communicator's allreduce beside the lost GPU: %ld wrong", bad);
  setenv("FAKE_CUDA_DEVICES", "2", 1); /* back */
  for (int i = 0; i < 8; ++i) b[i] = 3 * i;
  OK(ncclGroupStart());
  OK(ncclAllReduce(a, a, 8, ncclInt32, ncclSum, c0, NULL));
  OK(ncclAllReduce(b, b, 8, ncclInt32, ncclMax, c1, NULL));
  OK(ncclGroupEnd());
  bad = 0;
  for (int i = 0; i < 8; ++i) bad += (a[i] != i) + (b[i] != 3 * i);
  CHECK(bad == 0, "grouped allreduces once GPU 1 is back: %ld wrong", bad);
  OK(ncclCommDestroy(c0));
  OK(ncclCommDestroy(c1));
  if (was != NULL)
    setenv("FAKE_CUDA_DEVICES", saved, 1);
  else
    unsetenv("FAKE_CUDA_DEVICES");
  CHECK(setdev(0) == 0, "cudaSetDevice(0)");
}

static void test_device_buffers(ncclComm_t comm) {
  void* h = dlopen("libcudart.so.13", RTLD_NOW);
  CHECK(h != NULL, "--device-buffers: cannot load libcudart.so.13: %s", dlerror());
  if (h == NULL) return;
  cuda_malloc_fn cmalloc;
  cuda_free_fn cfree;
  cuda_memcpy_fn cmemcpy;
  cuda_stream_create_fn screate;
  cuda_stream_fn ssync, sdestroy;
  void* f;
  f = cuda_sym(h, "cudaMalloc"); memcpy(&cmalloc, &f, sizeof f);
  f = cuda_sym(h, "cudaFree"); memcpy(&cfree, &f, sizeof f);
  f = cuda_sym(h, "cudaMemcpy"); memcpy(&cmemcpy, &f, sizeof f);
  f = cuda_sym(h, "cudaStreamCreate"); memcpy(&screate, &f, sizeof f);
  f = cuda_sym(h, "cudaStreamSynchronize"); memcpy(&ssync, &f, sizeof f);
  f = cuda_sym(h, "cudaStreamDestroy"); memcpy(&sdestroy, &f, sizeof f);
  enum { N = 1000, H2D = 1, D2H = 2 };
  const int n = g_size, r = g_rank;
  void* stream = NULL;
  CHECK(screate(&stream) == 0, "cudaStreamCreate");
  int32_t* host = malloc(sizeof(int32_t) * N * (size_t)n);
  int32_t* back = malloc(sizeof(int32_t) * N * (size_t)n);
  void *dsend = NULL, *drecv = NULL;
  CHECK(cmalloc(&dsend, sizeof(int32_t) * N * (size_t)n) == 0 && cmalloc(&drecv, sizeof(int32_t) * N * (size_t)n) == 0, "cudaMalloc");
  cudaStream_t s = (cudaStream_t)stream;
  long bad;
  /* allreduce, in a group with a second one on the same stream */
  for (int i = 0; i < N; ++i) host[i] = i + r;
  cmemcpy(dsend, host, sizeof(int32_t) * N, H2D);
  OK(ncclGroupStart());
  OK(ncclAllReduce(dsend, drecv, N, ncclInt32, ncclSum, comm, s));
  OK(ncclAllReduce(dsend, dsend, N, ncclInt32, ncclMax, comm, s));
  OK(ncclGroupEnd());
  CHECK(ssync(stream) == 0, "cudaStreamSynchronize");
  cmemcpy(back, drecv, sizeof(int32_t) * N, D2H);
  bad = 0;
  for (int i = 0; i < N; ++i) bad += back[i] != n * i + n * (n - 1) / 2;
  CHECK(bad == 0, "device allreduce sum: %ld wrong", bad);
  cmemcpy(back, dsend, sizeof(int32_t) * N, D2H);
  bad = 0;
  for (int i = 0; i < N; ++i) bad += back[i] != i + n - 1;
  CHECK(bad == 0, "device allreduce max in place: %ld wrong", bad);
  /* broadcast from the last rank, on the default (NULL) stream */
  for (int i = 0; i < N; ++i) host[i] = 7 * i + r;
  cmemcpy(dsend, host, sizeof(int32_t) * N, H2D);
  OK(ncclBroadcast(dsend, drecv, N, ncclInt32, n - 1, comm, NULL));
  CHECK(ssync(NULL) == 0, "cudaStreamSynchronize(NULL)");
  cmemcpy(back, drecv, sizeof(int32_t) * N, D2H);
  bad = 0;
  for (int i = 0; i < N; ++i) bad += back[i] != 7 * i + n - 1;
  CHECK(bad == 0, "device broadcast: %ld wrong", bad);
  /* reduce to rank 0 */
  for (int i = 0; i < N; ++i) host[i] = i % 5 + r;
  cmemcpy(dsend, host, sizeof(int32_t) * N, H2D);
  OK(ncclReduce(dsend, drecv, N, ncclInt32, ncclSum, 0, comm, s));
  CHECK(ssync(stream) == 0, "cudaStreamSynchronize");
  if (r == 0) {
    cmemcpy(back, drecv, sizeof(int32_t) * N, D2H);
    bad = 0;
    for (int i = 0; i < N; ++i) bad += back[i] != n * (i % 5) + n * (n - 1) / 2;
    CHECK(bad == 0, "device reduce: %ld wrong", bad);
  }
  /* allgather, then reduce-scatter of the gathered vector, then alltoall */
  for (int i = 0; i < N; ++i) host[i] = 1000 * r + i;
  cmemcpy(dsend, host, sizeof(int32_t) * N, H2D);
  OK(ncclAllGather(dsend, drecv, N, ncclInt32, comm, s));
  OK(ncclReduceScatter(drecv, dsend, N, ncclInt32, ncclSum, comm, s));
  CHECK(ssync(stream) == 0, "cudaStreamSynchronize");
  cmemcpy(back, drecv, sizeof(int32_t) * N * (size_t)n, D2H);
  bad = 0;
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < N; ++i) bad += back[q * N + i] != 1000 * q + i;
  CHECK(bad == 0, "device allgather: %ld wrong", bad);
  cmemcpy(back, dsend, sizeof(int32_t) * N, D2H);
  bad = 0;
  for (int i = 0; i < N; ++i) bad += back[i] != n * (1000 * r + i);
  CHECK(bad == 0, "device reduce_scatter: %ld wrong", bad);
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < N; ++i) host[q * N + i] = 10000 * r + 100 * q + i % 100;
  cmemcpy(dsend, host, sizeof(int32_t) * N * (size_t)n, H2D);
  OK(ncclAlltoAll(dsend, drecv, N, ncclInt32, comm, s));
  CHECK(ssync(stream) == 0, "cudaStreamSynchronize");
  cmemcpy(back, drecv, sizeof(int32_t) * N * (size_t)n, D2H);
  bad = 0;
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < N; ++i) bad += back[q * N + i] != 10000 * q + 100 * r + i % 100;
  CHECK(bad == 0, "device alltoall: %ld wrong", bad);
  /* send/recv: a ring exchange both ways in one group on the stream, then to the right alone
   * (outside a group: send, then receive from the left) on the NULL stream */
  for (int i = 0; i < N; ++i) host[i] = 31 * r + i, host[N + i] = -31 * r - i;
  cmemcpy(dsend, host, sizeof(int32_t) * N * 2, H2D);
  OK(ncclGroupStart());
  OK(ncclSend(dsend, N, ncclInt32, (r + 1) % n, comm, s));
  OK(ncclRecv(drecv, N, ncclInt32, (r + n - 1) % n, comm, s));
  OK(ncclSend((int32_t*)dsend + N, N, ncclInt32, (r + n - 1) % n, comm, s));
  OK(ncclRecv((int32_t*)drecv + N, N, ncclInt32, (r + 1) % n, comm, s));
  OK(ncclGroupEnd());
  CHECK(ssync(stream) == 0, "cudaStreamSynchronize");
  cmemcpy(back, drecv, sizeof(int32_t) * N * 2, D2H);
  bad = 0;
  for (int i = 0; i < N; ++i) bad += (back[i] != 31 * ((r + n - 1) % n) + i) + (back[N + i] != -31 * ((r + 1) % n) - i);
  CHECK(bad == 0, "device send/recv group: %ld wrong", bad);
  OK(ncclSend(dsend, N / 2, ncclInt32, (r + 1) % n, comm, NULL));
  OK(ncclRecv((int32_t*)drecv + 1, N / 2, ncclInt32, (r + n - 1) % n, comm, NULL));
  CHECK(ssync(NULL) == 0, "cudaStreamSynchronize(NULL)");
  cmemcpy(back, drecv, sizeof(int32_t) * (N / 2 + 1), D2H);
  bad = back[0] != 31 * ((r + n - 1) % n);  /* untouched from the group */
  for (int i = 0; i < N / 2; ++i) bad += back[1 + i] != 31 * ((r + n - 1) % n) + i;
  CHECK(bad == 0, "device send/recv outside a group: %ld wrong", bad);
  /* gather to rank 0 and scatter from the last rank, on the stream */
  for (int i = 0; i < N; ++i) host[i] = 500 * r + i;
  cmemcpy(dsend, host, sizeof(int32_t) * N, H2D);
  OK(ncclGather(dsend, drecv, N, ncclInt32, 0, comm, s));
  CHECK(ssync(stream) == 0, "cudaStreamSynchronize");
  if (r == 0) {
    cmemcpy(back, drecv, sizeof(int32_t) * N * (size_t)n, D2H);
    bad = 0;
    for (int q = 0; q < n; ++q)
      for (int i = 0; i < N; ++i) bad += back[q * N + i] != 500 * q + i;
    CHECK(bad == 0, "device gather: %ld wrong", bad);
  }
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < N; ++i) host[q * N + i] = 70 * q + i + r;
  cmemcpy(dsend, host, sizeof(int32_t) * N * (size_t)n, H2D);
  OK(ncclScatter(dsend, drecv, N, ncclInt32, n - 1, comm, s));
  CHECK(ssync(stream) == 0, "cudaStreamSynchronize");
  cmemcpy(back, drecv, sizeof(int32_t) * N, D2H);
  bad = 0;
  for (int i = 0; i < N; ++i) bad += back[i] != 70 * r + i + n - 1;
  CHECK(bad == 0, "device scatter: %ld wrong", bad);
  cfree(dsend);
  cfree(drecv);
  sdestroy(stream);
  free(host);
  free(back);
  test_lost_device(h);
}

int main(int argc, char** argv) {
  void* device_pointer = NULL;
  int device_buffers = 0;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--device-pointer") == 0 && i + 1 < argc) {
      device_pointer = (void*)(uintptr_t)strtoull(argv[++i], NULL, 0);
    } else if (strcmp(argv[i], "--device-buffers") == 0) {
      device_buffers = 1;
    } else {
      fprintf(stderr, "usage: %s [--device-pointer ADDR] [--device-buffers]\n", argv[0]);
      return 2;
    }
  }
  const char* rank_s = getenv("RINGFENCE_RANK");
  const char* size_s = getenv("RINGFENCE_WORLD_SIZE");
  if (rank_s == NULL || size_s == NULL) {
    fprintf(stderr, "nccl_api_test: run it under ringfence-run (RINGFENCE_RANK / RINGFENCE_WORLD_SIZE are not set)\n");
    return 2;
  }
  g_rank = atoi(rank_s);
  g_size = atoi(size_s);

  test_versions_and_strings();
  ncclUniqueId id;
  if (g_rank == 0) MUST(ncclGetUniqueId(&id));
  share_id(&id);
  test_init_errors(&id);
  ncclComm_t comm = NULL;
  MUST(ncclCommInitRank(&comm, g_size, id, g_rank));
  {
    int joined = 1; /* every rank has read the id file once this allreduce completes */
    MUST(ncclAllReduce(&joined, &joined, 1, ncclInt32, ncclSum, comm, NULL));
    CHECK(joined == g_size, "join barrier: %d", joined);
    if (g_rank == 0) unlink(g_id_path);
  }
  test_queries(comm, expected_device());
  test_reductions(comm, 1031);
  test_data_movement(comm, 517);
  test_reductions(comm, 0); /* empty calls are legal */
  test_wide_integers(comm);
  test_groups(comm);
  test_memory(comm);
  test_errors(comm, device_pointer);
  if (device_buffers) test_device_buffers(comm);
  test_local_communicators();
  test_split(comm);
  test_shrink(comm);

  int one = 1;
  OK(ncclAllReduce(&one, &one, 1, ncclInt32, ncclSum, comm, NULL));
  CHECK(one == g_size, "final barrier: %d", one);
  OK(ncclCommFinalize(comm));
  OK(ncclCommDestroy(comm));

  printf("nccl api test: rank %d: %ld checks passed, %ld failed\n", g_rank, g_checks - g_failures, g_failures);
  return g_failures == 0 ? 0 : 1;
}
