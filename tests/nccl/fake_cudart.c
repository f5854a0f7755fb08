/* A fake CUDA runtime (built as libcudart.so.13 in its own folder) for CPU-only tests of the code
 * that asks the CUDA runtime about devices and pointers: the NCCL shim (device pointers are
 * refused, ncclCommCuDevice reports the current device) and the perf programs' --backend nccl
 * device-buffer path. Put its folder first in LD_LIBRARY_PATH; dlopen("libcudart.so.13") finds it.
 *
 * What it pretends:
 *   - 4 devices; the current device is 2 until cudaSetDevice changes it;
 *   - addresses in [0x10000, 0x20000) are device memory of the current device (nothing there is
 *     ever dereferenced: the shim refuses such pointers before using them);
 *   - cudaMalloc/cudaFree/cudaMemcpy/cudaMemset work on host memory that cudaPointerGetAttributes
 *     reports as ordinary host memory (so the shim accepts it), streams are NULL and every
 *     synchronisation is immediate.
 * Signatures come from the installed cuda_runtime_api.h, so the compiler checks them.
 */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_EXPORT __attribute__((visibility("default")))

static int g_device = 2;
static const uintptr_t kDeviceLo = 0x10000, kDeviceHi = 0x20000;

FAKE_EXPORT cudaError_t cudaGetDeviceCount(int* count) {
  if (count == NULL) return cudaErrorInvalidValue;
  *count = 4;
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaGetDevice(int* device) {
  if (device == NULL) return cudaErrorInvalidValue;
  *device = g_device;
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= 4) return cudaErrorInvalidDevice;
  g_device = device;
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attributes, const void* ptr) {
  if (attributes == NULL) return cudaErrorInvalidValue;
  memset(attributes, 0, sizeof *attributes);
  const uintptr_t p = (uintptr_t)ptr;
  if (p >= kDeviceLo && p < kDeviceHi) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = g_device;
    attributes->devicePointer = (void*)ptr;
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
    attributes->hostPointer = (void*)ptr;
  }
  return cudaSuccess;
}

FAKE_EXPORT const char* cudaGetErrorString(cudaError_t error) {
  return error == cudaSuccess ? "no error (fake CUDA runtime)" : "error (fake CUDA runtime)";
}

FAKE_EXPORT cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (ptr == NULL) return cudaErrorInvalidValue;
  *ptr = size == 0 ? NULL : malloc(size);
  return size == 0 || *ptr != NULL ? cudaSuccess : cudaErrorMemoryAllocation;
}

FAKE_EXPORT cudaError_t cudaFree(void* ptr) {
  free(ptr);
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  (void)kind;
  if (count > 0) memmove(dst, src, count);
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  memset(ptr, value, count);
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  (void)stream;
  return cudaSuccess;
}

FAKE_EXPORT cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
