#!/usr/bin/env bash
# Compares protection's cost between two builds: runs build A's and build B's
# health_cost_paired alternately, RUNS times each, with the same arguments, and prints per size
# the median (over the runs) of each build's off and on times and of its on/off ratio. Use it
# for changes worth a few per cent: this VM drifts between fast and slow phases for minutes,
# and alternating puts both builds in the same ones.
#
#   bench/health_cost_ab.sh BUILD_A BUILD_B RUNS [health_cost_paired arguments...]
#   e.g. bench/health_cost_ab.sh /tmp/base/build build 5 -n 2 -b 8 -e 64K -r 7
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
a=$1 b=$2 runs=$3
shift 3
for d in "$a" "$b"; do
  [ -x "$d/bin/health_cost_paired" ] || { echo "health_cost_ab.sh: no $d/bin/health_cost_paired (build it: ninja -C $d bin/health_cost_paired)" >&2; exit 2; }
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq "$runs"); do
  "$a/bin/health_cost_paired" "$@" 2>/dev/null | grep '^| [0-9]' >"$out/a.$i"
  "$b/bin/health_cost_paired" "$@" 2>/dev/null | grep '^| [0-9]' >"$out/b.$i"
done
python3 - "$out" "$runs" "$a" "$b" <<'PY'
import re, statistics, sys
d, runs, name_a, name_b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def load(tag):
    rows = {}
    for i in range(1, runs + 1):
        for line in open(f"{d}/{tag}.{i}"):
            c = [x.strip() for x in line.strip().strip("|").split("|")]
            # | ranks | bytes | off time | on time | **ratio** (metric) | ...
            ratio = float(re.sub(r"[^0-9.]", "", c[4].split("(")[0]))
            metric = c[4].split("(")[1].rstrip(")") if "(" in c[4] else ""
            rows.setdefault((c[0], c[1]), []).append((ratio, float(c[2]), float(c[3]), metric))
    return rows
A, B = load("a"), load("b")
med = lambda rows, i: statistics.median(r[i] for r in rows)
print(f"A = {name_a}, B = {name_b}; {runs} runs each, alternated; medians of the runs")
print("| ranks | bytes | ratio of | A off (us) | A on (us) | A on/off | B off (us) | B on (us) | B on/off |")
print("|---|---|---|---|---|---|---|---|---|")
for k, a in A.items():
    b = B.get(k)
    if not b:
        continue
    print(f"| {k[0]} | {k[1]} | {a[0][3]} | {med(a,1):.2f} | {med(a,2):.2f} | {med(a,0):.2f} | {med(b,1):.2f} | {med(b,2):.2f} | {med(b,0):.2f} |")
PY
