#!/usr/bin/env bash
# One command that proves the GPU path on a GPU machine (docs/device.md, tests/gpu/README.md):
#   scripts/device-check.sh OUT_DIR                 build for sm_90 here (CMake, nvcc, fmt, Catch2), then check
#   scripts/device-check.sh OUT_DIR --prebuilt DIR  use binaries bundled by --bundle (machines without the
#                                                   build dependencies, e.g. the device machines of this project)
#   scripts/device-check.sh --bundle DIR            build here and bundle the binaries + libfmt into DIR
#   scripts/device-check.sh --watch-selftest OUT BIN  check that a run outliving DEVICE_CHECK_STACK_AFTER gets its stacks
# The check, each step logged to OUT_DIR and summarised in OUT_DIR/summary.md:
#   1. the GPUs (nvidia-smi -L, topology);
#   2. every GPU test: reduce kernels bit-exact against the host kernels (every dtype x op,
#      aligned and misaligned), stream-ordered device collectives on 2 and 4 ranks (ranks share
#      the GPUs round-robin), exact; the nvlink and pcie transports between two processes
#      (CUDA IPC, 64 MiB + 13 B each way), exact; a pair whose NVLink corrupts (fault rule) moved
#      to pcie at the fence agreement, 2 processes, every collective exact; the same move on device
#      regions (a replay storm on the fake NVML of tests/support moves the pair's host-lane and
#      device-lane links to pcie, 2 processes, every stream-ordered allreduce exact); the same device
#      collectives on device regions (RINGFENCE_DEVICE_REGIONS=on: the engine on device memory,
#      nvlink/pcie links, the kernel module's reductions), 2 and 4 ranks, exact; the NCCL shim's
#      API test on device buffers with streams, on device regions, 2 ranks (what frameworks run);
#   3. compute-sanitizer --tool memcheck on one small device collective (2 ranks);
#   4. all_reduce_perf --memory device for 2 and 4 ranks, on device regions (checksums off) and with
#      the defaults (checksums on, host-staged), next to the device-to-device and pinned
#      host<->device cudaMemcpy bandwidths, and NCCL's ncclAllReduce (all_reduce_perf --backend
#      nccl) on the same GPUs when there are at least 2.
# Testing the script itself without a GPU (CTest device_check_script_fake_cuda): DEVICE_CHECK_CUDART
# names the CUDA runtime to use (the fake of tests/device), DEVICE_CHECK_MAX_BYTES caps the sizes
# of all_reduce_perf, DEVICE_CHECK_COPY_MIB the copies of device_memcpy_bw (default 256),
# DEVICE_CHECK_IPC_BYTES the writes of cuda_ipc_conformance (default 64 MiB + 13), DEVICE_CHECK_KERNELS
# the kernel module (the fake of tests/device; default: libringfence_kernels.so next to the binaries).
# Bounds: every run has its own timeout (75-120 s; communicator timeouts 15 s unless RINGFENCE_TIMEOUT_MS
# says otherwise), so a hang costs about a minute of a lease, not three (the first H200 run lost ~6
# minutes to hung device-region runs). Budget: under 6 minutes on one H200 (the build dominates on a machine with few cores: use
# --prebuilt there). Exit status: 0 when every check that ran passed, 1 otherwise.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bins=(ringfence-run device_collectives reduce_functors_gpu_test cuda_ipc_conformance move_mp all_reduce_perf device_memcpy_bw
  nccl_api_test)
kernels=libringfence_kernels.so  # the device reductions' module (target ringfence_kernels, in lib/)
shim=libringfence_nccl.so        # the NCCL shim nccl_api_test links (target ringfence_nccl, in lib/)
fake_nvml=libringfence_fake_nvml.so  # move_mp --device-regions' evidence (target ringfence_fake_nvml, in lib/)

build() {  # build BUILD_DIR: configure for sm_90 and build only what the check runs
  local b=$1
  cmake -S "$repo" -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRINGFENCE_WITH_CUDA=ON -DRINGFENCE_WITH_TORCH=OFF \
    -DRINGFENCE_WITH_MPI=OFF -DRINGFENCE_BUILD_TESTS=ON -DRINGFENCE_BUILD_BENCH=ON >"$b.configure.log" 2>&1 ||
    { tail -30 "$b.configure.log"; return 1; }
  cmake --build "$b" --target "${bins[@]}" ringfence_kernels ringfence_nccl ringfence_fake_nvml >"$b.build.log" 2>&1 || { tail -40 "$b.build.log"; return 1; }
}

# A run still going after $stack_after s (DEVICE_CHECK_STACK_AFTER, default 8: the watched runs take
# 1-2 s on an H200) gets its processes' threads recorded once, in LOG's .stacks file: every
# thread's state, wait channel and system call (/proc), and for each rank, where cuda-gdb exists,
# every thread's backtrace. The first H200 run needed a second lease to learn where its hang sat
# (docs/device.md "Kernel loading"); now the run that hangs says where.
stack_after=${DEVICE_CHECK_STACK_AFTER:-8}
descendants() {  # descendants PID: every process under PID
  local c
  for c in $(pgrep -P "$1"); do
    echo "$c"
    descendants "$c"
  done
}
take_stacks() {  # take_stacks PID
  local p t
  for p in $(descendants "$1"); do
    [ -r "/proc/$p/cmdline" ] || continue
    echo "=== pid $p: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null) $(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -E '^RINGFENCE_RANK=')"
    for t in /proc/"$p"/task/*; do
      echo "  tid ${t##*/} $(cat "$t/comm" 2>/dev/null) state=$(awk '{print $3}' "$t/stat" 2>/dev/null) wchan=$(cat "$t/wchan" 2>/dev/null) syscall=$(cut -d' ' -f1 "$t/syscall" 2>/dev/null)"
    done
    if command -v cuda-gdb >/dev/null 2>&1 && grep -qa '^RINGFENCE_RANK=' <(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null); then
      timeout 30 cuda-gdb -q -nx -batch -p "$p" -ex "set pagination off" -ex "thread apply all bt 16" 2>&1 |
        grep -v -E '^\[New LWP|^warning: |Reading symbols|^$' | head -300
    fi
  done
}
watched() {  # watched LOG CMD...: runs CMD, stdout and stderr to LOG; returns CMD's status
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  local pid=$! ticks=0
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$ticks" -eq $((stack_after * 10)) ]; then
      take_stacks "$pid" >"${log%.*}.stacks" 2>&1
      echo "device-check: $(basename "$log"): still running after $stack_after s; threads in $(basename "${log%.*}.stacks")"
    fi
    sleep 0.1
    ticks=$((ticks + 1))
  done
  wait "$pid"
}

# --watch-selftest OUT BIN: `watched` on ringfence-run of two ranks that sleep 3 s, stacks after 1 s;
# passes when the .stacks file shows both ranks' threads (CTest device_check_watch_selftest).
if [ "${1:-}" = "--watch-selftest" ]; then
  dir=${2:?usage: device-check.sh --watch-selftest OUT BIN}
  mkdir -p "$dir"
  stack_after=1
  watched "$dir/selftest.log" timeout 30 "${3:?usage: device-check.sh --watch-selftest OUT BIN}/ringfence-run" -n 2 --timeout 25 sleep 3 || exit 1
  ranks=$(cat "$dir/selftest.stacks" 2>/dev/null | grep -c '^=== pid .*RINGFENCE_RANK=')
  threads=$(cat "$dir/selftest.stacks" 2>/dev/null | grep -c '^  tid .* state=[A-Z]')
  echo "device-check: watch self-test: $ranks rank processes, $threads threads recorded"
  [ "$ranks" -eq 2 ] && [ "$threads" -ge 2 ]
  exit
fi

if [ "${1:-}" = "--bundle" ]; then
  dir=${2:?usage: device-check.sh --bundle DIR}
  mkdir -p "$dir"
  build "$dir.build" || exit 1
  for b in "${bins[@]}"; do cp "$dir.build/bin/$b" "$dir/"; done
  cp "$dir.build/lib/$kernels" "$dir/"
  cp -L "$dir.build/lib/$shim" "$dir/"
  cp -L "$dir.build/lib/$fake_nvml" "$dir/"
  # The one shared library the binaries need beyond libc/libstdc++ (ringfence links statically).
  fmt=$(ldd "$dir/ringfence-run" | awk '/libfmt/ {print $3}')
  [ -n "$fmt" ] && cp -L "$fmt" "$dir/"
  echo "bundled into $dir: $(ls "$dir" | tr '\n' ' ')"
  exit 0
fi

out=${1:?usage: device-check.sh OUT_DIR [--prebuilt DIR] | --bundle DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
start=$(date +%s)
summary=$out/summary.md
fails=0
status() {  # status NAME RC LOG: one summary row
  local verdict
  case $2 in 0) verdict=passed ;; 77) verdict=skipped ;; 124) verdict="TIMED OUT" ;; *) verdict="FAILED (exit $2)" ;; esac
  [ "$2" -ne 0 ] && [ "$2" -ne 77 ] && fails=$((fails + 1))
  echo "| $1 | $verdict | $(basename "$3") |" >>"$summary"
  echo "device-check: $1: $verdict ($(($(date +%s) - start)) s)"
}

if [ "${2:-}" = "--prebuilt" ]; then
  bin=$(cd "${3:?--prebuilt needs a directory}" && pwd)
  export LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  echo "device-check: building for sm_90 into $out/build"
  build "$out/build" || { echo "device-check: build failed (logs in $out)"; exit 1; }
  bin=$out/build/bin
fi
# The CUDA runtime: from the toolkit when the loader does not find one by itself.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -e "$d/libcudart.so.13" ] || [ -e "$d/libcudart.so.12" ] || continue
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
  break
done
if [ -n "${DEVICE_CHECK_CUDART:-}" ]; then
  export RINGFENCE_CUDART=$DEVICE_CHECK_CUDART
else
  unset RINGFENCE_CUDART  # never the fake of tests/device by accident
fi
# The kernel module: next to the binaries (--prebuilt) or in the build's lib/.
if [ -n "${DEVICE_CHECK_KERNELS:-}" ]; then
  export RINGFENCE_CUDA_KERNELS=$DEVICE_CHECK_KERNELS
elif [ -e "$bin/$kernels" ]; then
  export RINGFENCE_CUDA_KERNELS=$bin/$kernels
elif [ -e "$bin/../lib/$kernels" ]; then
  export RINGFENCE_CUDA_KERNELS=$(cd "$bin/../lib" && pwd)/$kernels
else
  unset RINGFENCE_CUDA_KERNELS
fi
max=${DEVICE_CHECK_MAX_BYTES:-256M}
export RINGFENCE_TIMEOUT_MS=${RINGFENCE_TIMEOUT_MS:-15000}

{
  echo "# device-check $(date -u +%FT%TZ)"
  echo
  echo "commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo
  echo "| check | result | log |"
  echo "|---|---|---|"
} >"$summary"

# 1. The GPUs.
{ nvidia-smi -L; nvidia-smi topo -m; nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv; } \
  >"$out/gpus.txt" 2>&1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
echo "device-check: $gpus GPU(s)"

# 2. Every GPU test (the ctest label gpu).
if [ -x "$bin/reduce_functors_gpu_test" ]; then
  timeout 120 "$bin/reduce_functors_gpu_test" >"$out/gpu_reduce_kernels.log" 2>&1
else
  echo "reduce_functors_gpu_test was not built (no nvcc at configure time)" >"$out/gpu_reduce_kernels.log"
  false || (exit 77)
fi
status "reduce kernels = host kernels, every dtype x op, aligned + misaligned" $? "$out/gpu_reduce_kernels.log"
for n in 2 4; do
  watched "$out/gpu_device_collectives_${n}ranks.log" timeout 75 "$bin/ringfence-run" -n $n --timeout 70 "$bin/device_collectives"
  status "stream-ordered device collectives, $n ranks on $gpus GPU(s), exact" $? "$out/gpu_device_collectives_${n}ranks.log"
  watched "$out/gpu_device_regions_${n}ranks.log" env RINGFENCE_DEVICE_REGIONS=on RINGFENCE_CHECKSUM=off \
    timeout 75 "$bin/ringfence-run" -n $n --timeout 70 "$bin/device_collectives" --device-transports
  status "the same on device regions (engine on device memory, nvlink/pcie), $n ranks, exact" $? "$out/gpu_device_regions_${n}ranks.log"
done
# The NCCL shim on device regions: every collective and send/recv on device buffers with a stream
# (nccl_api_test --device-buffers, which also runs the host-buffer API checks). It loads the
# runtime by soname, so a DEVICE_CHECK_CUDART fake is put first on the loader's path.
if [ -x "$bin/nccl_api_test" ]; then
  watched "$out/gpu_nccl_shim_device_regions.log" \
    env LD_LIBRARY_PATH="${DEVICE_CHECK_CUDART:+$(dirname "$DEVICE_CHECK_CUDART"):}${LD_LIBRARY_PATH:-}" RINGFENCE_DEVICE_REGIONS=on RINGFENCE_CHECKSUM=off \
    timeout 75 "$bin/ringfence-run" -n 2 --timeout 70 "$bin/nccl_api_test" --device-buffers
  rc=$?
  grep -q "rank 0: [0-9]* checks passed, 0 failed" "$out/gpu_nccl_shim_device_regions.log" || [ $rc -ne 0 ] || rc=1
else
  echo "nccl_api_test was not built (no nccl.h at configure time)" >"$out/gpu_nccl_shim_device_regions.log"
  rc=77
fi
status "NCCL shim API test on device buffers, device regions, 2 ranks ($(grep -ao 'rank 0: [0-9]* checks passed, [0-9]* failed' \
  "$out/gpu_nccl_shim_device_regions.log" | head -1))" $rc "$out/gpu_nccl_shim_device_regions.log"

ipc_bytes=${DEVICE_CHECK_IPC_BYTES:-67108877}
for t in nvlink pcie; do
  timeout 120 "$bin/cuda_ipc_conformance" $t "$ipc_bytes" >"$out/gpu_${t}_conformance.log" 2>&1
  status "$t transport (CUDA IPC), 2 processes on one GPU, $ipc_bytes B each way, exact" $? "$out/gpu_${t}_conformance.log"
done
watched "$out/gpu_move_nvlink_to_pcie.log" timeout 75 "$bin/ringfence-run" -n 2 --timeout 70 "$bin/move_mp"
status "corrupting nvlink pair moved to pcie at the fence agreement, 2 processes, exact" $? "$out/gpu_move_nvlink_to_pcie.log"
nvml_lib=$bin/$fake_nvml
[ -e "$nvml_lib" ] || nvml_lib=$bin/../lib/$fake_nvml
if [ -e "$nvml_lib" ]; then
  watched "$out/gpu_move_device_regions.log" \
    env RINGFENCE_NVML_LIBRARY="$nvml_lib" RINGFENCE_FAKE_NVML_STATE="$out/move_device_regions.nvml" RINGFENCE_DEVICE_REGIONS=on \
    timeout 75 "$bin/ringfence-run" -n 2 --timeout 70 "$bin/move_mp" --device-regions
  rc=$?
else
  echo "$fake_nvml was not built" >"$out/gpu_move_device_regions.log"
  rc=77
fi
status "NVLink replay storm (fake NVML): pair moved to pcie on host and device lanes, device regions, 2 processes, exact" $rc \
  "$out/gpu_move_device_regions.log"

# 3. compute-sanitizer memcheck on one small device collective (every rank process).
if command -v compute-sanitizer >/dev/null 2>&1; then
  timeout 120 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 \
    "$bin/ringfence-run" -n 2 --timeout 110 "$bin/device_collectives" 257 >"$out/memcheck.log" 2>&1
  rc=$?
  grep -q "ERROR SUMMARY: 0 errors" "$out/memcheck.log" || [ $rc -ne 0 ] || rc=1
  status "compute-sanitizer memcheck, 2 ranks, 257 elements" $rc "$out/memcheck.log"
else
  echo "compute-sanitizer not found" >"$out/memcheck.log"
  status "compute-sanitizer memcheck (not installed)" 77 "$out/memcheck.log"
fi

# 4. Bandwidths: copies, ringfence's device allreduce at 2 and 4 ranks, NCCL on >= 2 GPUs.
# Warm-up 10 calls: host-staged calls in flight each hold a pinned staging slot (up to
# RINGFENCE_DEVICE_STAGING_SLOTS = 8), so a shorter warm-up leaves cudaHostAlloc calls in the timed loop
# (the first H200 run's out-of-place column, docs/device.md "GPU runs").
timeout 60 "$bin/device_memcpy_bw" "${DEVICE_CHECK_COPY_MIB:-256}" 20 ${RINGFENCE_CUDART:+"$RINGFENCE_CUDART"} >"$out/memcpy_bw.txt" 2>&1
status "device_memcpy_bw" $? "$out/memcpy_bw.txt"
for n in 2 4; do
  # Device regions verify no checksums yet (docs/device.md): they run with checksums off.
  RINGFENCE_CHECKSUM=off timeout 100 "$bin/ringfence-run" -n $n --timeout 90 "$bin/all_reduce_perf" --memory device -b 1M -e "$max" -f 4 \
    -n 10 -w 10 >"$out/all_reduce_perf_${n}ranks.txt" 2>&1
  status "all_reduce_perf --memory device, $n ranks ($(grep -ao 'device path: [a-z -]*' "$out/all_reduce_perf_${n}ranks.txt" | head -1))" $? \
    "$out/all_reduce_perf_${n}ranks.txt"
  timeout 100 "$bin/ringfence-run" -n $n --timeout 90 "$bin/all_reduce_perf" --memory device -b 1M -e "$max" \
    -f 4 -n 10 -w 10 >"$out/all_reduce_perf_staged_${n}ranks.txt" 2>&1
  status "all_reduce_perf --memory device, $n ranks, the defaults (checksums on: host-staged, every chunk checked)" $? \
    "$out/all_reduce_perf_staged_${n}ranks.txt"
done
if [ "$gpus" -ge 2 ]; then
  nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
  [ -n "$nccl" ] && [ -e "$nccl" ] || nccl=libnccl.so.2
  n=$gpus
  [ "$n" -gt 4 ] && n=4
  timeout 100 "$bin/ringfence-run" -n $n --timeout 90 "$bin/all_reduce_perf" --backend nccl --nccl-lib "$nccl" -b 1M -e "$max" -f 4 \
    -n 10 -w 10 >"$out/nccl_all_reduce_perf_${n}ranks.txt" 2>&1
  status "NCCL ncclAllReduce, $n ranks on $n GPUs" $? "$out/nccl_all_reduce_perf_${n}ranks.txt"
else
  echo "one GPU: NCCL needs one GPU per rank, so its allreduce is not run" >"$out/nccl_all_reduce_perf.txt"
  echo "| NCCL ncclAllReduce | not run: $gpus GPU (NCCL needs one GPU per rank) | nccl_all_reduce_perf.txt |" >>"$summary"
fi

# The table: busbw per size for each run, and the copy bandwidths.
{
  echo
  echo '```'
  cat "$out/memcpy_bw.txt"
  echo '```'
  echo
  printf '| size (B) |'
  for f in "$out"/all_reduce_perf_*ranks.txt "$out"/nccl_all_reduce_perf_*ranks.txt; do
    [ -e "$f" ] && printf ' %s busbw GB/s (out-of-place) |' "$(basename "$f" .txt)"
  done
  echo
  printf '|---|'
  for f in "$out"/all_reduce_perf_*ranks.txt "$out"/nccl_all_reduce_perf_*ranks.txt; do [ -e "$f" ] && printf -- '---|'; done
  echo
  for size in 1048576 4194304 16777216 67108864 268435456; do
    printf '| %s |' "$size"
    for f in "$out"/all_reduce_perf_*ranks.txt "$out"/nccl_all_reduce_perf_*ranks.txt; do
      [ -e "$f" ] || continue
      v=$(sed 's/^\[[0-9]*\] //' "$f" | awk -v s="$size" '$1 == s {print $8; exit}')
      printf ' %s |' "${v:--}"
    done
    echo
  done
  echo
  echo "total $(($(date +%s) - start)) s"
} >>"$summary"
cat "$summary"
[ "$fails" -eq 0 ]
