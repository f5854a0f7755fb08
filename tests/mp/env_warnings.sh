#!/usr/bin/env bash
# The typo warning of Communicator::from_env names only variables no one reads: a transport's
# own settings (RINGFENCE_SHM_YIELD, RINGFENCE_TCP_CHUNK_BYTES, RINGFENCE_SOCKET_IFNAME) are not
# "ignored" (they take effect: a malformed one is an error naming it), a misspelt one is.
# Usage: env_warnings.sh RINGFENCE_RUN ALL_REDUCE_PERF
set -uo pipefail
run=$1 perf=$2
fail() { echo "FAIL: $*"; exit 1; }
err=$(mktemp) out=$(mktemp)
trap 'rm -f "$err" "$out"' EXIT

RINGFENCE_SHM_YIELD=8 RINGFENCE_SHM_SPIN=500 RINGFENCE_TCP_CHUNK_BYTES=256K RINGFENCE_SOCKET_IFNAME=lo \
  RINGFENCE_SHM_YEILD=8 "$run" -n 2 --timeout 60 "$perf" -b 8 -e 64 -n 5 -w 1 >"$out" 2>"$err" ||
  { cat "$err"; fail "a job with transport variables set failed"; }
grep -q "out-of-place" "$out" || { cat "$out"; fail "no perf table"; }
[ "$(grep -c 'unknown environment variable RINGFENCE_SHM_YEILD (typo?)' "$err")" -eq 2 ] ||
  { cat "$err"; fail "the misspelt RINGFENCE_SHM_YEILD was not named once per rank"; }
for v in RINGFENCE_SHM_YIELD RINGFENCE_SHM_SPIN RINGFENCE_TCP_CHUNK_BYTES RINGFENCE_SOCKET_IFNAME; do
  if grep -q "unknown environment variable $v " "$err"; then cat "$err"; fail "$v, a transport's setting, called unknown"; fi
done
echo "typo warning names only RINGFENCE_SHM_YEILD: ok"

# The setting is read, not ignored: a malformed value fails the job, naming the variable.
if RINGFENCE_SHM_YIELD=abc "$run" -n 2 --timeout 60 "$perf" -b 8 -e 8 -n 1 -w 0 >"$out" 2>"$err"; then
  fail "RINGFENCE_SHM_YIELD=abc accepted"
fi
grep -q "RINGFENCE_SHM_YIELD='abc' is invalid" "$err" || { cat "$err"; fail "the error does not name RINGFENCE_SHM_YIELD"; }
grep -q "unknown environment variable" "$err" && { cat "$err"; fail "a malformed setting also called unknown"; }
echo "environment warnings: all cases passed"
