#!/usr/bin/env bash
# install_test.sh: installs a built pmindex into a temporary prefix and builds
# and runs examples/ against it twice: as a CMake project (find_package(pmindex)
# -> pmindex::pmindex) and by hand with pkg-config. Also checks the soname
# chain and that the library exports no internal symbols.
#   install_test.sh <build dir> <source dir> <C compiler> <C++ compiler> [sanitizers]
# (The sanitizers of an instrumented build apply to the examples too.)
set -euo pipefail
build=$1 src=$2 cc=$3 cxx=$4 san=${5:-}
tmp=$(mktemp -d /tmp/pmindex-install-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
flags=""
[ -n "$san" ] && flags="-fsanitize=$san -fno-omit-frame-pointer"

cmake --install "$build" --prefix "$prefix" >/dev/null
pc=$(find "$prefix" -name pmindex.pc)
libdir=$(dirname "$(dirname "$pc")")
test -f "$prefix/include/pmindex/kv.h"
test -f "$prefix/include/pmindex/pmindex_c.h"
test -f "$libdir/cmake/pmindex/pmindexConfigVersion.cmake"
# Soname chain: libpmindex.so -> libpmindex.so.0 -> libpmindex.so.X.Y.Z
test -L "$libdir/libpmindex.so"
soname=$(objdump -p "$libdir/libpmindex.so" | awk '/SONAME/ {print $2}')
[ "$soname" = "libpmindex.so.0" ] || { echo "soname is '$soname'"; exit 1; }
test -L "$libdir/libpmindex.so.0"
real=$(readlink -f "$libdir/libpmindex.so")
[[ "$real" =~ libpmindex\.so\.0\.[0-9]+\.[0-9]+$ ]] || { echo "not versioned: $real"; exit 1; }
# Only the public API: nothing from pmindex::internal, no Abseil.
syms=$(nm -DC --defined-only "$real")
if grep -E 'pmindex::internal|absl::' <<<"$syms"; then
  echo "libpmindex.so exports internal symbols (above)"; exit 1
fi
grep -q 'pmindex::KV::Open' <<<"$syms" || { echo "KV::Open not exported"; exit 1; }
grep -q ' pmindex_open$' <<<"$syms" || { echo "pmindex_open not exported"; exit 1; }

# 1. find_package
cmake -S "$src/examples" -B "$tmp/cmake-build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" >/dev/null
cmake --build "$tmp/cmake-build" >/dev/null
pool=/dev/shm/pmindex-install-test-$$.pool
out=$("$tmp/cmake-build/kv_example" "$pool")
grep -q "fruit:3 = value 3" <<<"$out"
out=$("$tmp/cmake-build/kv_example" "$pool")  # reopened: the records survived
rm -f "$pool"
grep -q "9 records at open" <<<"$out"
grep -q "city:2 = population 2000" <<<"$("$tmp/cmake-build/kv_c_example")"

# 2. pkg-config
export PKG_CONFIG_PATH=$libdir/pkgconfig
[ "$(pkg-config --modversion pmindex)" != "" ]
# shellcheck disable=SC2046
"$cxx" -std=c++20 $flags "$src/examples/kv_example.cpp" -o "$tmp/kv_example_pc" $(pkg-config --cflags --libs pmindex)
# shellcheck disable=SC2046
"$cc" -std=c11 $flags -c "$src/examples/kv_c_example.c" -o "$tmp/kv_c_example.o" $(pkg-config --cflags pmindex)
# A sanitized library needs UBSan's C++ runtime, which the C++ driver links.
link=$cc
[ -n "$san" ] && link=$cxx
# shellcheck disable=SC2046
"$link" $flags "$tmp/kv_c_example.o" -o "$tmp/kv_c_example_pc" $(pkg-config --libs pmindex)
grep -q "fruit:3 = value 3" <<<"$(LD_LIBRARY_PATH=$libdir "$tmp/kv_example_pc")"
grep -q "city:2 = population 2000" <<<"$(LD_LIBRARY_PATH=$libdir "$tmp/kv_c_example_pc")"
echo "install test passed ($prefix: find_package and pkg-config)"
