#!/bin/sh
# examples/torch_ddp.py under a real torchrun, ringfence backend against gloo.
#   ddp_test.sh PYTHON_DIR NPROC compare   same training with backend=gloo and backend=ringfence:
#                                          final parameters equal within a relative tolerance
#                                          (float64; the two backends sum gradients in different
#                                          orders, so bit equality is not expected)
#   ddp_test.sh PYTHON_DIR NPROC fault     ringfence without and with a bit-flipping link 0-1
#                                          (RINGFENCE_CHECKSUM=on): the link is fenced (health
#                                          log event and fenced_links) and the final parameters
#                                          are bit-identical to the clean run
# Both modes print each run's step times. Skipped (77) without torchrun or the built module.
set -eu
pydir=$1; n=$2; mode=$3
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
command -v torchrun >/dev/null 2>&1 || { echo "torchrun not installed (apt-get install python3-torch): skipped"; exit 77; }
ls "$pydir"/ringfence_torch/_C*.so >/dev/null 2>&1 || { echo "ringfence_torch not built in $pydir: skipped"; exit 77; }
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export RINGFENCE_TORCH_PATH="$pydir" OMP_NUM_THREADS=1
steps=${DDP_TEST_STEPS:-20}

# run LABEL BACKEND [VAR=VALUE ...]: one torchrun job; its output in $tmp/LABEL.log
run() {
  label=$1; backend=$2; shift 2
  if ! env "$@" "$repo/tests/support/torchrun.sh" "$n" \
      "$repo/examples/torch_ddp.py" --backend "$backend" --steps "$steps" --out "$tmp/$label.pt" >"$tmp/$label.log" 2>&1; then
    cat "$tmp/$label.log"
    echo "ddp_test: run '$label' failed"
    exit 1
  fi
  grep "torch_ddp:" "$tmp/$label.log" | sed "s/^/[$label] /"
  grep -q "every rank has rank 0's parameters: True" "$tmp/$label.log" || { cat "$tmp/$label.log"; echo "ddp_test: ranks disagree in '$label'"; exit 1; }
}

# compare A B MODE: exact or rtol
compare() {
  "$py" - "$tmp/$1.pt" "$tmp/$2.pt" "$3" <<'PYEOF'
import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
assert a.keys() == b.keys(), (a.keys(), b.keys())
worst = max(((a[k] - b[k]).abs().max() / b[k].abs().max().clamp(min=1e-300)).item() for k in a)
same = all(torch.equal(a[k], b[k]) for k in a)
if sys.argv[3] == "exact":
    print(f"ddp_test: parameters bit-identical: {same} (max relative difference {worst:.3e})")
    sys.exit(0 if same else 1)
tol = 1e-12
print(f"ddp_test: parameters max relative difference {worst:.3e} (tolerance {tol:.0e}; bit-identical: {same})")
sys.exit(0 if worst <= tol else 1)
PYEOF
}

step_ms() { sed -n 's/.*step_ms median=\([0-9.]*\).*/\1/p' "$tmp/$1.log" | head -n 1; }

case "$mode" in
  compare)
    run gloo gloo
    run ringfence ringfence
    compare ringfence gloo rtol || { echo "ddp_test: ringfence and gloo parameters differ"; exit 1; }
    echo "ddp_test: step time median ms, $n ranks: gloo $(step_ms gloo) ringfence $(step_ms ringfence)"
    echo "ddp_test: ringfence matches gloo on $n ranks"
    ;;
  fault)
    # The ring keeps one summation order before and after the fence (relayed hop), so the two
    # runs can be compared bit for bit; auto would pick tree/one-shot before the fence.
    run clean ringfence RINGFENCE_ALGO=ring RINGFENCE_CHECKSUM=on
    # 20 steps are fewer collectives than the default agreement cadence (64): agree every 2.
    run faulty ringfence RINGFENCE_ALGO=ring RINGFENCE_CHECKSUM=on RINGFENCE_HEALTH_AGREE_EVERY=2 RINGFENCE_HEALTH_AGREE_MIN_US=0 \
      RINGFENCE_FAULT=flip:rate=1e-5,link=0-1,seed=7 RINGFENCE_HEALTH_LOG="$tmp/health.jsonl"
    grep -q "fenced links \[(0, 1)\]" "$tmp/faulty.log" || { cat "$tmp/faulty.log"; echo "ddp_test: link 0-1 was not fenced"; exit 1; }
    grep -q '"link_fenced"' "$tmp/health.jsonl" 2>/dev/null || { cat "$tmp/health.jsonl" 2>/dev/null; echo "ddp_test: no link_fenced event in the health log"; exit 1; }
    echo "ddp_test: health log events:"
    grep -o '"event":"[a-z_]*"' "$tmp/health.jsonl" | sort | uniq -c | sed 's/^/  /'
    grep '"link_fenced"' "$tmp/health.jsonl" | head -n 2 | sed 's/^/  /'
    compare faulty clean exact || { echo "ddp_test: the corrupting link changed the parameters"; exit 1; }
    echo "ddp_test: step time median ms, $n ranks: clean $(step_ms clean) faulty+fenced $(step_ms faulty)"
    echo "ddp_test: link 0-1 fenced, parameters unchanged"
    ;;
  *) echo "usage: ddp_test.sh PYTHON_DIR NPROC compare|fault"; exit 2 ;;
esac
