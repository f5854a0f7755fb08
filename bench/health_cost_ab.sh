#!/usr/bin/env bash
# Compares protection's cost between two builds: runs build A's and build B's
# health_cost_paired alternately (A first in odd runs, B first in even ones), RUNS times each,
# with the same arguments, and prints per size the median over the runs of each run's figures
# (health_cost_paired's off and on times and its median on/off ratio) for both builds. Use it
# for changes worth a few per cent: this VM drifts between fast and slow phases for minutes,
# and alternating puts both builds in the same ones.
#
#   bench/health_cost_ab.sh BUILD_A BUILD_B RUNS [health_cost_paired arguments...]
#   e.g. bench/health_cost_ab.sh /tmp/base/build build 5 -n 2 -b 8 -e 64K -r 7
set -euo pipefail
usage() {
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
[ $# -ge 3 ] || usage
a=$1 b=$2 runs=$3
shift 3
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "health_cost_ab.sh: RUNS must be a positive count (got '$runs')" >&2; usage; }
for arg in "$@"; do
  [ "$arg" != --only ] || { echo "health_cost_ab.sh: --only measures one side; this script needs both" >&2; exit 2; }
done
for d in "$a" "$b"; do
  [ -x "$d/bin/health_cost_paired" ] || { echo "health_cost_ab.sh: no $d/bin/health_cost_paired (build it: ninja -C $d bin/health_cost_paired)" >&2; exit 2; }
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# One run of build $1's program into $out/$2.$3; on failure its output and exit status.
run_one() {
  local rc=0
  "$1/bin/health_cost_paired" "${@:4}" >"$out/$2.$3.txt" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    cat "$out/$2.$3.txt" >&2
    echo "health_cost_ab.sh: $1/bin/health_cost_paired exited with status $rc" >&2
    exit "$rc"
  fi
  grep '^| [0-9]' "$out/$2.$3.txt" >"$out/$2.$3" || { echo "health_cost_ab.sh: no table from $1/bin/health_cost_paired" >&2; exit 1; }
}
for i in $(seq "$runs"); do
  if [ $((i % 2)) -eq 1 ]; then
    run_one "$a" a "$i" "$@"
    run_one "$b" b "$i" "$@"
  else
    run_one "$b" b "$i" "$@"
    run_one "$a" a "$i" "$@"
  fi
done
python3 - "$out" "$runs" "$a" "$b" <<'PY'
import re, statistics, sys
d, runs, name_a, name_b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def load(tag):
    rows = {}
    for i in range(1, runs + 1):
        for line in open(f"{d}/{tag}.{i}", encoding="utf-8"):
            c = [x.strip() for x in line.strip().strip("|").split("|")]
            # | ranks | bytes | off time | on time | **ratio** (metric) | ...
            ratio = float(re.sub(r"[^0-9.]", "", c[4].split("(")[0]))
            metric = c[4].split("(")[1].rstrip(")") if "(" in c[4] else ""
            rows.setdefault((c[0], c[1]), []).append((ratio, float(c[2]), float(c[3]), metric))
    return rows
A, B = load("a"), load("b")
med = lambda rows, i: statistics.median(r[i] for r in rows)
print(f"A = {name_a}, B = {name_b}; {runs} runs each, alternated; per size the median over the runs")
print("| ranks | bytes | ratio of | A off (us) | A on (us) | A on/off | B off (us) | B on (us) | B on/off |")
print("|---|---|---|---|---|---|---|---|---|")
for k, a in A.items():
    b = B.get(k)
    if not b:
        continue
    print(f"| {k[0]} | {k[1]} | {a[0][3]} | {med(a,1):.2f} | {med(a,2):.2f} | {med(a,0):.2f} | {med(b,1):.2f} | {med(b,2):.2f} | {med(b,0):.2f} |")
PY
