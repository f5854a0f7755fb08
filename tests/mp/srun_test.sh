#!/bin/sh
# Examples, unchanged, under a real Slurm srun: Communicator::from_env() reads SLURM_PROCID,
# SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_ID, SLURM_STEP_ID, SLURM_NNODES. Skipped (77) where no
# Slurm controller answers (srun missing, or `scontrol ping` not UP): CI machines have none; a
# one-node Slurm for this test is described in docs/launching.md.
#   srun_test.sh TOUR_PROGRAM DEMO_PROGRAM NTASKS
set -u
tour=$1; demo=$2; n=$3
command -v srun >/dev/null 2>&1 || { echo "srun not installed (Slurm): skipped"; exit 77; }
timeout 10 scontrol ping 2>/dev/null | grep -q "is UP" || { echo "no Slurm controller answers (scontrol ping): skipped"; exit 77; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# 1. One node, every rank on shm: all collectives exact on every rank.
timeout 240 srun -N 1 -n "$n" --overcommit --kill-on-bad-exit=1 "$tour" >"$out" 2>&1 || { cat "$out"; echo "srun_test: collectives_tour failed"; exit 1; }
exact=$(grep -c "all collectives exact" "$out")
[ "$exact" -ge 1 ] || { cat "$out"; echo "srun_test: no 'all collectives exact'"; exit 1; }
echo "srun_test: collectives_tour under srun -n $n: all collectives exact"
# 2. The same step split into two emulated hosts (RINGFENCE_HOST_ID per half): shm inside a
#    half, tcp across, the allreduce demo's results checked by the demo itself.
timeout 240 srun -N 1 -n "$n" --overcommit --kill-on-bad-exit=1 \
  sh -c 'RINGFENCE_TRANSPORTS=shm,tcp RINGFENCE_HOST_ID=node$((SLURM_PROCID * 2 / SLURM_NTASKS)) exec "$0"' "$demo" >"$out" 2>&1 \
  || { cat "$out"; echo "srun_test: allreduce_demo across two emulated hosts failed"; exit 1; }
grep -q " tcp " "$out" && grep -q " shm " "$out" || { cat "$out"; echo "srun_test: expected shm and tcp links"; exit 1; }
echo "srun_test: allreduce_demo under srun -n $n across two emulated hosts: shm and tcp links, results exact"
