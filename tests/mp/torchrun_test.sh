#!/bin/sh
# An example, unchanged, under a real torchrun (Debian python3-torch): Communicator::from_env()
# reads RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT / TORCHELASTIC_RUN_ID and
# hosts its store on MASTER_PORT + 1. Skipped (77) where torchrun is not installed.
#   torchrun_test.sh PROGRAM NPROC
command -v torchrun >/dev/null 2>&1 || { echo "torchrun not installed (apt-get install python3-torch): skipped"; exit 77; }
# torch 1.13 on Python 3.11 (Debian 12) cannot parse --redirects/--tee 0, its default (an enum
# iteration change in 3.11 makes the value None); 2 (stderr only) avoids the crash.
exec timeout 240 torchrun --standalone --nproc_per_node="$2" --redirects 2 --tee 2 --no_python "$1"
