#!/bin/sh
# What `cmake --install` gives a user (docs/getting-started.md, "Installing"): installs the build
# into a temporary prefix, then from the install tree only
#   - builds and runs the consumer project with find_package(ringfence) (a header left out fails),
#   - builds and runs the same program with pkg-config (ringfence.pc),
#   - runs ringfence-run with all_reduce_perf (exact results),
#   - checks the NCCL shim exports the NCCL API (when it was built),
#   - imports ringfence_torch from the installed package (when it was built; PYTHON is the
#     interpreter it was built for).
#   install_test.sh BUILD_DIR CONSUMER_SRC GENERATOR BUILD_TYPE [PYTHON]
set -eu
build=$1; src=$2; gen=$3; type=$4; python=${5:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; exit 1; }
cmake -S "$src" -B "$tmp/consumer" -G "$gen" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE="$type"
cmake --build "$tmp/consumer"
"$tmp/consumer/consumer_allreduce"
echo "find_package consumer: built and ran"

pc=$(find "$prefix" -name ringfence.pc | head -1)
[ -n "$pc" ] || { echo "no ringfence.pc installed"; exit 1; }
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs ringfence)
${CXX:-c++} -O1 -o "$tmp/pc_consumer" "$src/main.cpp" $flags
"$tmp/pc_consumer"
echo "pkg-config consumer: built and ran ($flags)"

"$prefix/bin/ringfence-run" -n 2 "$prefix/bin/all_reduce_perf" -b 8 -e 64K -f 8 >"$tmp/perf.log" 2>&1 || { cat "$tmp/perf.log"; exit 1; }
grep -q "Out of bounds values : 0 OK" "$tmp/perf.log" || { cat "$tmp/perf.log"; exit 1; }
echo "installed all_reduce_perf under the installed ringfence-run: exact"

shim=$(find "$prefix" -name 'libringfence_nccl.so*' -o -name 'libnccl.so.2' | head -1)
if [ -f "$build/lib/libringfence_nccl.so" ] || [ -d "$build/lib/nccl-shim" ]; then
  [ -n "$shim" ] || { echo "the NCCL shim was built but not installed"; exit 1; }
  nm -D --defined-only "$shim" | grep -q " ncclAllReduce$" || { echo "$shim does not export ncclAllReduce"; exit 1; }
  echo "NCCL shim installed: $shim"
fi

if [ -n "$python" ]; then
  pkg=$(dirname "$(find "$prefix" -path '*ringfence_torch/__init__.py' | head -1)")
  [ "$pkg" != . ] || { echo "ringfence_torch was built but not installed"; exit 1; }
  (cd "$tmp" && PYTHONPATH=$(dirname "$pkg") "$python" -c "import ringfence_torch; assert ringfence_torch.__file__.startswith('$prefix')") ||
    { echo "import ringfence_torch from $pkg failed"; exit 1; }
  echo "ringfence_torch imported from $pkg"
fi
echo "consumer from the install tree: built and ran"
