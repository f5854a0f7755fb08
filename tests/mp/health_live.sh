#!/usr/bin/env bash
# ringfence-health on a running job and on logs (issue #28):
#  - a 4-rank job with link 1-2 throttled refreshes its Prometheus files every 500 ms; while it
#    runs, `ringfence-health --live` shows link 1-2 far below the others within 2 s of
#    the job's first collective, with exit status 1 (suspect) or 2 (fenced);
#  - a clean job at the default refresh reads healthy (0), and a real parser
#    (python3-prometheus-client) reads its files while it runs and finds per-link series;
#    an empty directory is "no data" (3);
#  - the log mode's --json and exit statuses (0 healthy, 1 suspect, 2 fenced, 3 no data, 4 usage).
# Usage: health_live.sh RINGFENCE_RUN ALL_REDUCE_PERF RINGFENCE_HEALTH
set -uo pipefail
run=$1 perf=$2 health=$3
py=/usr/bin/python3
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
$py -c 'import prometheus_client.parser' 2>/dev/null || { echo "python3-prometheus-client missing (scripts/install-deps.sh)"; exit 77; }

# --- a throttled job, watched live ---------------------------------------------------------
mkdir -p "$work/slow"
RINGFENCE_HEALTH_PROMETHEUS="$work/slow/job-{rank}.prom" RINGFENCE_HEALTH_PROMETHEUS_INTERVAL_MS=500 \
  RINGFENCE_FAULT='throttle:mbps=300,link=1-2' "$run" -n 4 --timeout 120 "$perf" -b 4M -e 4M -n 2000 -w 1 -c 0 \
  >"$work/slow.out" 2>&1 &
job=$!
# The job's first collective writes the files: wait for them (startup), then give it 2 s.
for _ in $(seq 200); do [[ $(ls "$work/slow"/*.prom 2>/dev/null | wc -l) -eq 4 ]] && break; sleep 0.1; done
[[ $(ls "$work/slow"/*.prom 2>/dev/null | wc -l) -eq 4 ]] || fail "no Prometheus files after 20 s: $(cat "$work/slow.out")"
sleep 1
"$health" --live "$work/slow" --count 1 --interval 1 --json >"$work/live.json"
status=$?
"$health" --live "$work/slow" --count 1 --interval 0.5 >"$work/live.txt"
cat "$work/live.txt"
[[ $status == 1 || $status == 2 ]] || fail "--live exit status $status on a throttled job (want 1 suspect or 2 fenced)"
$py - "$work/live.json" <<'PY' || fail "live JSON"
import json, statistics, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
links = r["links"]
assert len(links) == 12, len(links)
timed = [l for l in links if l["gbps"] is not None]
slow = [l for l in timed if {l["rank"], l["peer"]} == {1, 2}]
fast = [l["gbps"] for l in timed if {l["rank"], l["peer"]} != {1, 2}]
assert slow and fast, (slow, fast)
median = statistics.median(fast)
assert all(l["gbps"] * 3 < median for l in slow), (slow, median)
assert any(l["state"] in ("slow", "fenced") for l in slow), slow
assert r["verdict"] in ("suspect", "fenced"), r["verdict"]
print(f"live: link 1-2 at {max(l['gbps'] for l in slow):.2f} GB/s, the other links' median {median:.2f} GB/s, "
      f"state {sorted(set(l['state'] for l in slow))}, verdict {r['verdict']}")
PY
kill $job 2>/dev/null; wait $job 2>/dev/null

# --- a clean job reads healthy; an empty directory is no data -----------------------------
mkdir -p "$work/clean" "$work/empty"
RINGFENCE_HEALTH_PROMETHEUS="$work/clean/job-{rank}.prom" \
  "$run" -n 2 --timeout 120 "$perf" -b 1M -e 1M -n 100000 -w 1 -c 0 >"$work/clean.out" 2>&1 &  # killed after the scrape
job=$!
for _ in $(seq 200); do [[ $(ls "$work/clean"/*.prom 2>/dev/null | wc -l) -eq 2 ]] && break; sleep 0.1; done
"$health" --live "$work/clean" --count 1 --interval 0.5 >"$work/clean.txt"
status=$?
# A scrape while a default run goes on (only RINGFENCE_HEALTH_PROMETHEUS set): every file parses
# with Prometheus' own parser and has per-link series.
kill -0 $job 2>/dev/null || fail "the job ended before the scrape (make it longer)"
$py - "$work/clean"/*.prom <<'PY' || fail "Prometheus parser"
import sys
from prometheus_client.parser import text_string_to_metric_families
for path in sys.argv[1:]:
    families = {f.name: f for f in text_string_to_metric_families(open(path).read())}
    for name in ("ringfence_link_state", "ringfence_link_timed_bytes", "ringfence_link_timed_seconds",
                 "ringfence_link_write_gbps", "ringfence_link_checksum_errors", "ringfence_link_resends"):
        samples = families[name].samples
        assert len(samples) == 1, (path, name, samples)          # one series per peer (2 ranks)
        assert all("peer" in s.labels and "rank" in s.labels for s in samples), samples
print(f"prometheus_client parsed {len(sys.argv) - 1} files while the job ran, per-link series present")
PY
kill $job 2>/dev/null; wait $job 2>/dev/null
[[ $status == 0 ]] || { cat "$work/clean.txt"; fail "--live exit status $status on a clean job (want 0)"; }
grep -q "verdict healthy" "$work/clean.txt" || fail "clean job: $(cat "$work/clean.txt")"
"$health" --live "$work/empty" --count 1 --interval 0.1 >"$work/empty.txt"
status=$?
[[ $status == 3 ]] || fail "--live on an empty directory: exit $status (want 3)"
grep -q "no link figures" "$work/empty.txt" || fail "empty directory: $(cat "$work/empty.txt")"

# --- hardware counter events of a mapped link make it suspect (figures written by hand) -------
mkdir -p "$work/hw"
for r in 0 1; do
  p=$((1 - r))
  {
    echo "ringfence_link_state{rank=\"$r\",peer=\"$p\",transport=\"shm\"} 1"
    echo "ringfence_link_checksum_errors_total{rank=\"$r\",peer=\"$p\"} 0"
    echo "ringfence_hw_counter_window_events{rank=\"$r\",link=\"0-1\",source=\"nvml\",device=\"$r\",port=\"0\",counter=\"nvlink_replay\"} $((3 * (1 - r)))"
  } >"$work/hw/job-$r.prom"
done
"$health" --live "$work/hw" --count 1 --interval 0.1 --json >"$work/hw.json"
status=$?
[[ $status == 1 ]] || fail "--live with hardware counter events: exit $status (want 1 suspect): $(cat "$work/hw.json")"
$py -c 'import json,sys; r=json.load(open(sys.argv[1])); l={(x["rank"],x["peer"]):x for x in r["links"]}; assert l[(0,1)]["hw_counter_events"]==3 and l[(0,1)]["state"]=="suspect" and l[(1,0)]["state"]=="ok", r' \
  "$work/hw.json" || fail "hardware counter events: $(cat "$work/hw.json")"

# --- the log mode ------------------------------------------------------------------------------
ev() { printf '{"event":"%s","rank":%s,"link":"%s","seq":%s,"epoch":%s,"count":%s,"detail":"%s","time":1.0}\n' "$@"; }
ev link_healthy 0 0-1 10 0 0 fine >"$work/healthy.jsonl"
ev link_suspect 1 1-2 10 0 0 "bandwidth low" >"$work/suspect.jsonl"
{ ev checksum_errors 1 0-1 8 0 5 ""; ev link_fenced 0 0-1 12 1 0 agreed; } >"$work/fenced.jsonl"
: >"$work/none.jsonl"
for case in healthy:0 suspect:1 fenced:2 none:3; do
  name=${case%%:*} want=${case##*:}
  "$health" "$work/$name.jsonl" >/dev/null 2>&1
  status=$?
  [[ $status == "$want" ]] || fail "log $name: exit $status (want $want)"
done
"$health" --json "$work/fenced.jsonl" >"$work/fenced.json"
$py -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["verdict"]=="fenced" and r["links"][0]["link"]=="0-1" and r["links"][0]["state"]=="fenced" and r["links"][0]["fenced_at"]==12 and r["links"][0]["checksum_errors"]==5, r' \
  "$work/fenced.json" || fail "log --json: $(cat "$work/fenced.json")"
"$health" "$work/missing.jsonl" >/dev/null 2>&1; [[ $? == 3 ]] || fail "a missing log is not 'no data'"
"$health" --bogus >/dev/null 2>&1; [[ $? == 4 ]] || fail "a bad option is not exit 4"
"$health" --live "$work/empty" --interval 0 >/dev/null 2>&1; [[ $? == 4 ]] || fail "--interval 0 is not refused"
echo "health live: all cases passed"
