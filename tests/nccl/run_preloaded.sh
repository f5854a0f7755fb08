#!/usr/bin/env bash
# Runs a program linked against the real libnccl.so.2 under ringfence-run with the ringfence shim
# preloaded, so every nccl* call resolves to the shim. Exits 77 (skipped) when the program cannot
# be loaded at all (the real library or one of its dependencies is missing), saying why.
#   run_preloaded.sh SHIM RINGFENCE_RUN RANKS PROGRAM [ARGS...]
set -uo pipefail
shim=$1 launcher=$2 ranks=$3 program=$4
shift 4
missing=$(ldd "$program" 2>&1 | grep -E 'not found|No such file' || true)
if [[ -n "$missing" ]]; then
  echo "SKIP: $program cannot be loaded (the real NCCL or a dependency is missing):"
  echo "$missing"
  exit 77
fi
# The program's own view: which library provides ncclAllReduce once the shim is preloaded.
echo "real NCCL: $(ldd "$program" | grep -o '/[^ ]*libnccl[^ ]*' | head -1); preloading $shim"
LD_PRELOAD="$shim${LD_PRELOAD:+:$LD_PRELOAD}" exec "$launcher" -n "$ranks" --timeout 240 "$program" "$@"
