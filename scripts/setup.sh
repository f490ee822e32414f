#!/usr/bin/env bash
# Installs pmindex's build and run dependencies (Debian 12 packages only).
# Idempotent and quick when everything is already there. Needs root (or sudo).
set -euo pipefail

PKGS=(
  g++ cmake ninja-build pkg-config git
  clang-14 libclang-rt-14-dev            # second compiler + sanitizer runtimes
  libgtest-dev libgmock-dev              # tests
  libabsl-dev                            # dram_btree baseline (absl::btree_map)
  libcli11-dev nlohmann-json3-dev libfmt-dev
  libtbb-dev                             # tbb::concurrent_hash_map baseline
  libjemalloc-dev libpmemobj-dev libpmem-dev  # allocator comparison baselines
  python3 python3-matplotlib python3-venv             # pmbench-plot
  libevent-dev                           # pmindex-server
  memcached libmemcached-tools           # pmindex-server tests (reference server, client tools)
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup: dependencies present" >&2
