#!/usr/bin/env bash
# Configures and builds one flavour of pmindex.
#   scripts/build.sh [release|asan|tsan] [ninja targets...]   (default: release, everything)
# release: GCC, build/      asan: clang ASan+UBSan, build-asan/      tsan: clang TSan, build-tsan/
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=${1:-release}
common=(-G Ninja -DPMINDEX_WERROR=ON -DPMINDEX_FAULT_INJECTION=ON)  # fault switches: tests and pmcheck need them
case "$flavour" in
  release) dir=build; args=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=g++ -DCMAKE_C_COMPILER=gcc) ;;
  asan) dir=build-asan; args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_C_COMPILER=clang-14 "-DPMINDEX_SANITIZE=address,undefined") ;;
  tsan) dir=build-tsan; args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_C_COMPILER=clang-14 -DPMINDEX_SANITIZE=thread) ;;
  *) echo "usage: $0 [release|asan|tsan]" >&2; exit 2 ;;
esac
cmake -S . -B "$dir" "${common[@]}" "${args[@]}" >/dev/null
ninja -C "$dir" -j"$(nproc)" "${@:2}" >&2
echo "$dir"
