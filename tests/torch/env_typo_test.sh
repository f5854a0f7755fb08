#!/bin/sh
# The torch backend warns about a misspelt RINGFENCE_* variable as Communicator::from_env does:
# once per rank, naming it, while a transport's own variable (RINGFENCE_SHM_SPIN, read by the shm
# transport) is not called a typo. Skipped (77) as run_torchrun.sh is.
#   env_typo_test.sh PYTHON_DIR NPROC
set -u
pydir=$1; n=$2
here=$(dirname "$0")
log=$(mktemp)
trap 'rm -f "$log"' EXIT
RINGFENCE_CHEKSUM=off RINGFENCE_SHM_SPIN=64 "$here/run_torchrun.sh" "$pydir" "$n" "$here/env_typo_test.py" >"$log" 2>&1
rc=$?
[ "$rc" = 77 ] && { cat "$log"; exit 77; }
[ "$rc" = 0 ] || { cat "$log"; echo "env_typo_test: the run failed ($rc)"; exit 1; }
grep -q "torch env: allreduce exact" "$log" || { cat "$log"; echo "env_typo_test: no exact result"; exit 1; }
typo=$(grep -c "ignoring unknown environment variable RINGFENCE_CHEKSUM (typo?)" "$log")
[ "$typo" = "$n" ] || { cat "$log"; echo "env_typo_test: RINGFENCE_CHEKSUM warned $typo times, want $n (once per rank)"; exit 1; }
if grep -q "unknown environment variable RINGFENCE_SHM_SPIN" "$log"; then
  cat "$log"; echo "env_typo_test: a transport's variable was called a typo"; exit 1
fi
echo "torch env: typo warned once per rank, transport variable accepted"
