#!/usr/bin/env bash
# The downstream test: installs the built tree into a temporary prefix, then builds
# examples/minimal against the install tree only, twice (its own CMake project with
# find_package(coshard), and a plain g++ line from pkg-config), and trains each build on two ranks
# with the installed coshard-run. The example exits non-zero when its loss did not fall.
set -euo pipefail
build_dir=$1
source_dir=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
cmake --install "$build_dir" --prefix "$prefix" > "$work/install.log"

run() {  # LOG COMMAND...: runs it, and prints its output when it fails
  local log=$1; shift
  "$@" > "$log" 2>&1 || { echo "install test: failed: $*"; cat "$log"; exit 1; }
}

echo "== CMake: find_package(coshard) from $prefix"
run "$work/configure.log" cmake -S "$source_dir/examples/minimal" -B "$work/cmake" -G Ninja -DCMAKE_PREFIX_PATH="$prefix"
run "$work/build.log" cmake --build "$work/cmake"
run "$work/cmake-run.log" "$prefix/bin/coshard-run" --nproc-per-node 2 -- "$work/cmake/minimal"
tail -n 2 "$work/cmake-run.log"

pc=$(find "$prefix" -name coshard.pc -path '*/pkgconfig/*' | head -n 1)
[[ -n "$pc" ]] || { echo "install test: failed: no coshard.pc under $prefix"; exit 1; }
echo "== pkg-config: $pc"
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs coshard) \
  || { echo "install test: failed: pkg-config --cflags --libs coshard"; exit 1; }
run "$work/pc-build.log" g++ -std=c++20 -O1 "$source_dir/examples/minimal/main.cpp" -o "$work/minimal-pc" $flags
run "$work/pc-run.log" "$prefix/bin/coshard-run" --nproc-per-node 2 -- "$work/minimal-pc"
tail -n 2 "$work/pc-run.log"
echo "install test: ok"
