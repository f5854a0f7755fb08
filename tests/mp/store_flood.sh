#!/usr/bin/env bash
# A job starts while its bootstrap store is flooded (issue #26): a stranger holds 4,200 silent
# connections to the store's port (more than its 4,096 slots) and re-opens every one the server
# closes. Four ranks (rank 0 hosts the store, as under ringfence-run) must still rendezvous and
# finish an exact allreduce within their setup deadline.
# Usage: store_flood.sh ALLREDUCE_DEMO. Exits 77 (skip) when this process may not hold enough
# descriptors for the flood.
set -uo pipefail
demo=$1
n=4 connections=4200
flood_log=$(mktemp) out_dir=$(mktemp -d)
cleanup() {
  [ -n "${flooder:-}" ] && kill "$flooder" 2>/dev/null
  rm -rf "$flood_log" "$out_dir"
}
trap cleanup EXIT
# A port below the ephemeral range that nothing listens on.
port=""
for _ in $(seq 50); do
  p=$((21000 + RANDOM % 10000))
  if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then port=$p; break; fi
done
[ -n "$port" ] || { echo "FAIL: no free port"; exit 1; }

python3 - "$port" "$connections" >"$flood_log" 2>&1 <<'EOF' &
import resource, socket, sys, time
port, want = int(sys.argv[1]), int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if hard != resource.RLIM_INFINITY and hard < want + 64:
    print(f"SKIP: descriptor limit {hard} < {want + 64}", flush=True)
    sys.exit(0)
resource.setrlimit(resource.RLIMIT_NOFILE, (want + 64, hard))
socks, opened = [], 0
deadline = time.time() + 60
while time.time() < deadline:
    # Keep `want` connections open: re-open the ones the server closed.
    alive = []
    for s in socks:
        try:
            if s.recv(1, socket.MSG_DONTWAIT) == b"":
                s.close()
                continue
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            continue
        alive.append(s)
    socks = alive
    while len(socks) < want:
        s = socket.socket()
        s.settimeout(0.5)
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            s.close()
            time.sleep(0.001)
            break
        s.setblocking(False)
        socks.append(s)
        opened += 1
    if opened and opened % 1000 < 50:
        print(f"flood: {len(socks)} open, {opened} opened", flush=True)
    time.sleep(0.001)
EOF
flooder=$!
sleep 0.3
grep -q SKIP "$flood_log" && { cat "$flood_log"; exit 77; }

token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
start=$SECONDS
pids=()
for r in $(seq 0 $((n - 1))); do
  host=0
  [ "$r" = 0 ] && host=1
  RINGFENCE_RANK=$r RINGFENCE_WORLD_SIZE=$n RINGFENCE_LOCAL_RANK=$r RINGFENCE_LOCAL_SIZE=$n \
    RINGFENCE_STORE_ADDR=127.0.0.1:$port RINGFENCE_STORE_HOST=$host RINGFENCE_JOB_TOKEN=$token RINGFENCE_TIMEOUT_MS=30000 \
    timeout 120 "$demo" >"$out_dir/$r.out" 2>&1 &
  pids+=($!)
  [ "$r" = 0 ] && sleep 1  # the flood fills rank 0's store before the other ranks arrive
done
failed=0
for i in "${!pids[@]}"; do wait "${pids[$i]}" || failed=1; done
took=$((SECONDS - start))
opened=$(grep -o "[0-9]* opened" "$flood_log" | tail -1)
for r in $(seq 0 $((n - 1))); do sed "s/^/[$r] /" "$out_dir/$r.out" | tail -3; done
[ $failed = 0 ] || { echo "FAIL: a rank failed under the flood"; tail -3 "$flood_log"; exit 1; }
echo "store flood: $n ranks started and finished in ${took} s while $connections silent connections were held (${opened:-0 opened})"
