#!/usr/bin/env bash
# The health ledger across jobs (issue #28): job 1 (4 ranks, link 1-2 flipping bits) fences
# 1-2 and records it; `ringfence-health ledger list` shows it with its evidence (exit 2: in
# quarantine); job 2, without any fault, says so at init and runs with 1-2 fenced from
# collective #1, results exact; after `ledger clear 1-2`, job 3 uses the link again.
# Usage: health_ledger.sh RINGFENCE_RUN ALL_REDUCE_PERF RINGFENCE_HEALTH
set -uo pipefail
run=$1 perf=$2 health=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export RINGFENCE_HEALTH_LEDGER="$work/ledger.jsonl"
job() {  # job NAME [env...]: a 4-rank run of exact allreduces, its health log in $work/NAME.jsonl
  local name=$1; shift
  env "$@" RINGFENCE_HEALTH_LOG="$work/$name.jsonl" "$run" -n 4 --timeout 120 "$perf" -b 1M -e 4M -f 2 -n 30 -c 1 >"$work/$name.out" 2>&1 \
    || fail "$name failed: $(tail -5 "$work/$name.out")"
  grep -q "Out of bounds values : 0 OK" "$work/$name.out" || fail "$name: wrong results: $(grep -v '^#' "$work/$name.out" | tail -3)"
}

job one RINGFENCE_FAULT='flip:rate=1e-5,link=1-2,seed=3'
grep -q '"event":"link_fenced".*"link":"1-2"' "$work/one.jsonl" || fail "job 1 did not fence 1-2"
"$health" ledger list >"$work/list1.txt"; status=$?
cat "$work/list1.txt"
[[ $status == 2 ]] || fail "ledger list exit $status with 1-2 in quarantine (want 2)"
grep -E "^1-2 +fenced .* s left .*checksum" "$work/list1.txt" >/dev/null || fail "ledger list lacks 1-2 with its evidence"

job two
grep -q "health ledger: link 1-2 .* was fenced by an earlier job .* fenced from collective #1" "$work/two.out" \
  || fail "job 2 did not say at init that 1-2 is quarantined: $(grep -i ledger "$work/two.out")"
first=$(grep -m1 '"event":"link_fenced"' "$work/two.jsonl") || fail "job 2 did not fence 1-2"
[[ $first == *'"link":"1-2"'* && $first == *'"seq":1,'* ]] || fail "job 2's first fence is not 1-2 at collective #1: $first"
grep -q '"event":"checksum_errors"' "$work/two.jsonl" && fail "job 2 saw corrupted chunks without a fault"
echo "job 2: link 1-2 fenced from collective #1 ($(grep -c link_fenced "$work/two.jsonl") fence events), results exact"

"$health" ledger clear 1-2 || fail "ledger clear 1-2"
"$health" ledger list >/dev/null; status=$?
[[ $status == 0 ]] || fail "ledger list exit $status after clear (want 0)"
job three
grep -q link_fenced "$work/three.jsonl" && fail "job 3 fenced a link after the ledger was cleared"
grep -qi "health ledger: link" "$work/three.out" && fail "job 3 still found a quarantined link"
"$health" ledger export --json | /usr/bin/python3 -c '
import json, sys
entries = json.load(sys.stdin)
actions = [e["action"] for e in entries]
assert "fenced" in actions and actions[-1] == "cleared", actions
assert all(e["link"] == "1-2" for e in entries), entries
print(f"ledger export: {len(entries)} entries, {actions}")' || fail "ledger export"
"$health" ledger clear 0-3 >/dev/null 2>&1; [[ $? == 3 ]] || fail "clearing a link with no entry is not exit 3"
RINGFENCE_HEALTH_LEDGER= "$health" ledger list >/dev/null 2>&1; [[ $? == 4 ]] || fail "no ledger path is not exit 4"
echo "health ledger: all cases passed"
