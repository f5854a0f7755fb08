/* nccl_api_test_device.c: a lost CUDA device and collectives on device buffers over the fake
 * runtime (part of nccl_api_test, see nccl_api_test.c). */
#include "nccl_api_test.h"

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

void test_device_buffers(ncclComm_t comm) {
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
