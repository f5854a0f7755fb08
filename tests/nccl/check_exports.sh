#!/usr/bin/env bash
# The shim exports exactly the functions nccl.h declares (ncclX and pnccl X), and nothing else.
#   check_exports.sh NM SHIM NCCL_H
set -euo pipefail
nm=$1 shim=$2 header=$3
declared=$(grep -oE '^[a-zA-Z_][a-zA-Z_ *]*p?nccl[A-Za-z0-9_]+\(' "$header" | grep -oE 'p?nccl[A-Za-z0-9_]+\($' | tr -d '(' | sort -u)
exported=$("$nm" -D --defined-only "$shim" | awk '{print $3}' | grep -v '^_' | sort -u)
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
extra=$(comm -13 <(echo "$declared") <(echo "$exported"))
echo "declared in $(basename "$header"): $(echo "$declared" | wc -l); exported: $(echo "$exported" | wc -l)"
[[ -z "$missing" ]] || { echo "declared but not exported:"; echo "$missing"; }
[[ -z "$extra" ]] || { echo "exported but not declared:"; echo "$extra"; }
[[ -z "$missing" && -z "$extra" ]] && echo "exports match nccl.h"
