#!/usr/bin/env bash
# Checks the compiler's output for the reduction kernels: the float32 sum loop must use packed
# SIMD (256-bit vaddps on x86-64-v3, which src/reduce.cpp is built for), and the float16 sum
# must convert in registers (vcvtph2ps / vcvtps2ph), not element by element through memory.
# Usage: check_simd.sh OBJECT_FILE...   (skips with 77 where objdump or x86-64 are missing)
set -euo pipefail
command -v objdump >/dev/null || { echo "objdump not found"; exit 77; }
[[ "$(uname -m)" == x86_64 ]] || { echo "not x86-64: nothing to check"; exit 77; }
obj=""
IFS=';' read -r -a files <<<"$*"  # CTest passes the object list as one ;-separated argument
for f in "${files[@]}"; do [[ "$f" == */reduce.cpp.o ]] && obj=$f; done
[[ -n "$obj" ]] || { echo "reduce.cpp.o not among the objects"; exit 1; }
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
echo "OK: float32 sum uses $(grep -cE 'vaddps .*%ymm' <<<"$f32") packed vaddps (ymm); float16 converts in registers"
