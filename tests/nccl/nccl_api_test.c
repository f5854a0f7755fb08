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
#include "nccl_api_test.h"

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
