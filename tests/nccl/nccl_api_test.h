/* nccl_api_test.h: what the parts of nccl_api_test share: the rank, the check counters and
 * macros, exact element access for every NCCL type, the bootstrap, and the test sections (one
 * file per group of sections; nccl_api_test.c runs them in order). */
#ifndef RINGFENCE_NCCL_API_TEST_H
#define RINGFENCE_NCCL_API_TEST_H
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

extern int g_rank, g_size;
extern long g_checks, g_failures;
extern char g_id_path[512]; /* where rank 0's ncclUniqueId is shared (rank 0 removes it) */

#define CHECK(cond, ...)                                                \
  do {                                                                  \
    ++g_checks;                                                         \
    if (!(cond)) {                                                      \
      ++g_failures;                                                     \
      fprintf(stderr, "rank %d: FAIL line %d (%s): ", g_rank, __LINE__, __FILE__); \
      fprintf(stderr, __VA_ARGS__);                                     \
      fputc('\n', stderr);                                              \
    }                                                                   \
  } while (0)

void expect(ncclResult_t got, ncclResult_t want, const char* what, int line, const char* file, ncclComm_t comm);
/* A call that must succeed / must fail with `code` (never success). */
#define OK(call) expect((call), ncclSuccess, #call, __LINE__, __FILE__, NULL)
#define FAILS(code, call) expect((call), (code), #call, __LINE__, __FILE__, NULL)

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

enum { kNumTypes = 10, kNumOps = 5 };
extern const ncclDataType_t kTypes[kNumTypes];
extern const ncclRedOp_t kOps[kNumOps];

size_t type_size(ncclDataType_t t);
int is_signed_type(ncclDataType_t t);
int is_float_type(ncclDataType_t t);
void put(ncclDataType_t t, void* buf, size_t i, double v);
double get(ncclDataType_t t, const void* buf, size_t i);
double input(ncclRedOp_t op, ncclDataType_t t, int r, size_t i);
double reduced(ncclRedOp_t op, ncclDataType_t t, size_t i);
double pattern(int r, size_t i);
void* xmalloc(size_t bytes);
void share_id(ncclUniqueId* id);
int expected_device(void);

/* The test sections (main() runs them; test_device_buffers only with --device-buffers). */
void test_versions_and_strings(void);
void test_init_errors(const ncclUniqueId* id);
void test_queries(ncclComm_t comm, int want_device);
void test_reductions(ncclComm_t comm, size_t count);
void test_data_movement(ncclComm_t comm, size_t count);
void test_wide_integers(ncclComm_t comm);
void test_groups(ncclComm_t comm);
void test_memory(ncclComm_t comm);
void test_errors(ncclComm_t comm, void* device_pointer);
void test_local_communicators(void);
void test_split(ncclComm_t comm);
void test_shrink(ncclComm_t comm);
void test_device_buffers(ncclComm_t comm);

#endif
