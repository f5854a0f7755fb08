#!/usr/bin/env bash
# Builds the fuzz targets with clang's libFuzzer (plus ASan and UBSan) and runs each for a
# bounded time on its seed corpus. Exits 77 (CTest: skipped) when clang or libFuzzer is missing,
# 1 on a finding (the crashing input is left in the build directory and printed).
#   run_libfuzzer.sh [--clang clang++] [--seconds 20] [--build DIR] [--source REPO]
#   longer runs:  run_libfuzzer.sh --seconds 3600
set -uo pipefail
clang=clang++
seconds=20
here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
build=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --clang) clang=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --source) source_dir=$2; shift 2 ;;
    *) echo "run_libfuzzer.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
build=${build:-$(mktemp -d "${TMPDIR:-/tmp}/ringfence-libfuzzer.XXXXXX")}
mkdir -p "$build"
command -v "$clang" >/dev/null || { echo "no $clang: skipping"; exit 77; }
probe="$build/probe.cpp"
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe"
if ! "$clang" -fsanitize=fuzzer "$probe" -o "$build/probe" 2>"$build/probe.log"; then
  echo "libFuzzer not available with $clang (Debian: libclang-rt-*-dev): skipping"; cat "$build/probe.log"; exit 77
fi
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$source_dir/include" -I"$source_dir/transports/tcp")
declare -A sources=(
  [fault_spec]="src/fault.cpp src/error.cpp src/transport.cpp src/log.cpp src/types.cpp"
  [health_config]="src/health/config.cpp src/error.cpp src/types.cpp"
  [store_wire]="src/store_wire.cpp src/error.cpp src/types.cpp"
  [tcp_frame]=""   # transports/tcp/tcp_frame.hpp is header-only
)
status=0
for t in fault_spec health_config store_wire tcp_frame; do
  files=()
  for f in ${sources[$t]}; do files+=("$source_dir/$f"); done
  if ! "$clang" "${flags[@]}" "$here/fuzz_$t.cpp" "${files[@]}" -lfmt -o "$build/fuzz_$t" 2>"$build/$t.build.log"; then
    echo "building fuzz_$t failed:"; tail -20 "$build/$t.build.log"; status=1; continue
  fi
  mkdir -p "$build/corpus_$t" "$build/artifacts_$t"
  cp -n "$here/corpus/$t/"* "$build/corpus_$t/" 2>/dev/null
  if "$build/fuzz_$t" -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$build/artifacts_$t/" "$build/corpus_$t" >"$build/$t.log" 2>&1; then
    echo "fuzz_$t: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$build/$t.log" | grep -o '[0-9]*$') runs in ${seconds}s, no finding"
  else
    echo "fuzz_$t: FINDING"; tail -30 "$build/$t.log"; ls "$build/artifacts_$t"; status=1
  fi
done
exit $status
