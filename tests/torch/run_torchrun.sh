#!/bin/sh
# Runs a Python program under a real torchrun (Debian python3-torch) with the ringfence_torch
# package from the build tree. Skipped (77) without torchrun or without the built module.
#   run_torchrun.sh PYTHON_DIR NPROC SCRIPT [ARGS...]
set -eu
pydir=$1; n=$2; shift 2
command -v torchrun >/dev/null 2>&1 || { echo "torchrun not installed (apt-get install python3-torch): skipped"; exit 77; }
ls "$pydir"/ringfence_torch/_C*.so >/dev/null 2>&1 || { echo "ringfence_torch not built in $pydir (torch or pybind11-dev missing at configure time): skipped"; exit 77; }
export RINGFENCE_TORCH_PATH="$pydir" OMP_NUM_THREADS=1
# tests/support/torchrun.sh picks the rendezvous port (see there why not --standalone).
exec "$(dirname "$0")/../support/torchrun.sh" "$n" "$@"
