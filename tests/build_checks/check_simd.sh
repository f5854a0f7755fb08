#!/usr/bin/env bash
# Checks the compiler's output for the reduction kernels: in the x86-64-v3 variant
# (src/reduce_x86_64_v3.cpp) the float32 sum loop must use packed 256-bit SIMD (vaddps) and the
# float16 sum must convert in registers (vcvtph2ps / vcvtps2ph), not element by element through
# memory; the baseline variant (src/reduce.cpp) and every other object of the core must not use
# AVX outside code chosen by CPUID (the default build runs on any x86-64);
# and neither object may define a weak (COMDAT) symbol: an inline function shared by the two
# could be kept from the AVX2 object and then run on a CPU without AVX2.
# Usage: check_simd.sh OBJECT_FILE...   (skips with 77 where objdump or x86-64 are missing)
set -euo pipefail
command -v objdump >/dev/null || { echo "objdump not found"; exit 77; }
[[ "$(uname -m)" == x86_64 ]] || { echo "not x86-64: nothing to check"; exit 77; }
obj=""
IFS=';' read -r -a files <<<"$*"  # CTest passes the object list as one ;-separated argument
base=""
for f in "${files[@]}"; do
  [[ "$f" == */reduce_x86_64_v3.cpp.o ]] && obj=$f
  [[ "$f" == */reduce.cpp.o ]] && base=$f
done
[[ -n "$obj" && -n "$base" ]] || { echo "reduce.cpp.o or reduce_x86_64_v3.cpp.o not among the objects"; exit 1; }
for o in "$obj" "$base"; do
  weak=$(nm -C --defined-only "$o" | awk '$2 ~ /^[WVu]$/ && $3 !~ /^DW\.ref\./' || true)
  [[ -z "$weak" ]] || { echo "FAIL: $o defines weak symbols (shared with the other variant):"; echo "$weak" | head; exit 1; }
done
# The baseline kernels, and every other object of the core but the two whose AVX-512 paths sit
# behind target attributes and a CPUID check (crc32c, checked_ops), must not use AVX registers.
if [[ -z "${RINGFENCE_ARCH_SET:-}" ]]; then
  for f in "${files[@]}"; do
    case "$f" in */reduce_x86_64_v3.cpp.o|*/crc32c.cpp.o|*/checked_ops.cpp.o) continue ;; esac
    if objdump -d --no-show-raw-insn "$f" | grep -qE '%ymm|%zmm'; then
      echo "FAIL: $f uses AVX registers (the default build must run on any x86-64)"; exit 1
    fi
  done
fi
dis=$(objdump -d --no-show-raw-insn -C "$obj")
fn() { awk -v pat="$1" 'index($0, pat) && /^[0-9a-f]+ </ {on=1; next} /^$/ {on=0} on' <<<"$dis"; }
f32=$(fn "combine<float, ringfence::SumOp>")
[[ -n "$f32" ]] || { echo "combine<float, SumOp> not found in $obj"; exit 1; }
if ! grep -qE 'vaddps .*%ymm' <<<"$f32"; then
  echo "FAIL: the float32 sum loop has no packed 256-bit vaddps:"; grep -E 'add' <<<"$f32" | head; exit 1
fi
f16=$(fn "combine<ringfence::Half, ringfence::SumOp>")
if [[ -n "$f16" ]] && ! grep -q 'vcvtph2ps' <<<"$f16"; then
  echo "FAIL: the float16 sum does not convert with vcvtph2ps"; exit 1
fi
echo "OK: no weak symbols in either variant; no AVX outside the dispatched code (${#files[@]} objects); x86-64-v3 float32 sum uses $(grep -cE 'vaddps .*%ymm' <<<"$f32") packed vaddps (ymm); float16 converts in registers"
