#!/bin/sh
# find_package(ringfence) from an INSTALL tree: installs the build into a temporary prefix, then
# builds and runs the consumer project against it (a header left out of the install fails here).
#   install_test.sh BUILD_DIR CONSUMER_SRC GENERATOR BUILD_TYPE
set -eu
build=$1; src=$2; gen=$3; type=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; exit 1; }
cmake -S "$src" -B "$tmp/consumer" -G "$gen" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE="$type"
cmake --build "$tmp/consumer"
"$tmp/consumer/consumer_allreduce"
echo "consumer from the install tree: built and ran"
