/* nccl_api_test_util.c: the shared part of nccl_api_test (nccl_api_test.h): counters, exact
 * element access for every type, allocation and the bootstrap. */
#include "nccl_api_test.h"

int g_rank = -1, g_size = 0;
long g_checks = 0, g_failures = 0;

void expect(ncclResult_t got, ncclResult_t want, const char* what, int line, const char* file, ncclComm_t comm) {
  ++g_checks;
  if (got != want) {
    ++g_failures;
    fprintf(stderr, "rank %d: FAIL line %d (%s): %s returned %d (%s), expected %d; last error: %s\n", g_rank, line, file, what, (int)got,
            ncclGetErrorString(got), (int)want, ncclGetLastError(comm));
  }
}

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

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}
int is_signed_type(ncclDataType_t t) { return t != ncclUint8 && t != ncclUint32 && t != ncclUint64; }
int is_float_type(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32 || t == ncclFloat64;
}

void put(ncclDataType_t t, void* buf, size_t i, double v) {
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
double get(ncclDataType_t t, const void* buf, size_t i) {
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
double input(ncclRedOp_t op, ncclDataType_t t, int r, size_t i) {
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
double reduced(ncclRedOp_t op, ncclDataType_t t, size_t i) {
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
double pattern(int r, size_t i) { return (double)((r * 13 + (int)(i % 17)) % 23); }

const ncclDataType_t kTypes[kNumTypes] = {ncclInt8,    ncclUint8,    ncclInt32,   ncclUint32,  ncclInt64,
                                        ncclUint64,  ncclFloat16,  ncclBfloat16, ncclFloat32, ncclFloat64};
const ncclRedOp_t kOps[kNumOps] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};

void* xmalloc(size_t bytes) {
  void* p = malloc(bytes ? bytes : 1);
  if (p == NULL) {
    fprintf(stderr, "rank %d: out of memory\n", g_rank);
    exit(1);
  }
  memset(p, 0xa5, bytes ? bytes : 1);
  return p;
}

/* ---- bootstrap: rank 0's ncclUniqueId travels in a file named after the job token ---- */

char g_id_path[512];

void share_id(ncclUniqueId* id) {
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
int expected_device(void) {
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
