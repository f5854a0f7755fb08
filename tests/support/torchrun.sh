#!/bin/sh
# torchrun for the tests: one node, NPROC workers, and a rendezvous port chosen here instead of
# --standalone's. --standalone takes MASTER_PORT from the ephemeral range (32768-60999), where
# MASTER_PORT+1 (ringfence's store under torchrun) may already belong to another process's
# connection or to another test's store. This script picks a port P below that range with P and
# P+1 both free, and runs again with another port (at most 3 tries) only when a run failed on
# "Address already in use". Anything else fails at once.
#   torchrun.sh NPROC ARGS...   ARGS as for torchrun after its launcher options
set -u
n=$1; shift
py=$(command -v python3 || echo /usr/bin/python3)
log=$(mktemp)
# The workers' redirected output: torchrun's default is a new /tmp/torchelastic_* per run that
# it never removes (two left behind by every test run).
logdir=$(mktemp -d)
trap 'rm -f "$log"; rm -rf "$logdir"' EXIT
try=1
while :; do
  port=$("$py" - <<'PYEOF'
import random, socket
for _ in range(200):
    p = random.randrange(20000, 32000)
    socks = []
    try:
        for q in (p, p + 1):
            s = socket.socket()
            socks.append(s)
            s.bind(("0.0.0.0", q))
        print(p)
        break
    except OSError:
        pass
    finally:
        for s in socks:
            s.close()
PYEOF
)
  [ -n "$port" ] || { echo "torchrun.sh: no free port pair found in 20000-32000"; exit 1; }
  # torch 1.13 on Python 3.11 crashes on its default --redirects/--tee 0 (docs/launching.md).
  timeout 240 torchrun --nnodes 1 --nproc_per_node="$n" --master_addr 127.0.0.1 --master_port "$port" \
    --redirects 2 --tee 2 --log_dir "$logdir" "$@" >"$log" 2>&1
  rc=$?
  cat "$log"
  if [ "$rc" -ne 0 ] && [ "$try" -lt 3 ] && grep -q "Address already in use" "$log"; then
    echo "torchrun.sh: port $port or $((port + 1)) was taken meanwhile (try $try); again with another port"
    try=$((try + 1))
    continue
  fi
  exit "$rc"
done
