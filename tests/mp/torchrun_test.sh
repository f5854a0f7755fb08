#!/bin/sh
# An example, unchanged, under a real torchrun (Debian python3-torch): Communicator::from_env()
# reads RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT / TORCHELASTIC_RUN_ID and
# hosts its store on MASTER_PORT + 1. Skipped (77) where torchrun is not installed.
#   torchrun_test.sh PROGRAM NPROC
command -v torchrun >/dev/null 2>&1 || { echo "torchrun not installed (apt-get install python3-torch): skipped"; exit 77; }
# tests/support/torchrun.sh picks the rendezvous port (see there why not --standalone).
exec "$(dirname "$0")/../support/torchrun.sh" "$2" --no_python "$1"
