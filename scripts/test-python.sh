#!/usr/bin/env bash
# Builds and installs the Python package (python/) into a virtual environment
# under build/python-venv and runs its pytest suite (docs/python.md).
#   bash scripts/test-python.sh [pytest args...]
# Works as root on Debian 12 (PEP 668): nothing is installed into the system
# Python. Needs python3-venv and a C++20 compiler with the library's own
# dependencies (scripts/setup.sh installs them); pip fetches scikit-build-core,
# pybind11, pytest and pymemcache (tests/server) from PyPI. The CMake build directory is kept under
# build/python-ext, so a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  apt-get install -y -q python3-venv >/dev/null
fi
venv=build/python-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q pytest pymemcache
"$venv/bin/python" -m pip install -q ./python -C build-dir="$PWD/build/python-ext" -C cmake.build-type=Release
(cd python/tests && "../../$venv/bin/python" -m pytest -q "$@" .)  # the installed package, not the source tree's
# pmindex-server against real clients (tests/server, docs/server.md): needs
# the release build's server (built here if missing or stale), memcached and
# libmemcached-tools (scripts/setup.sh).
server="$PWD/$(bash scripts/build.sh release pmindex-server)/bin/pmindex-server"
rc=0
PMINDEX_SERVER="$server" "$venv/bin/python" -m pytest -q "$@" tests/server || rc=$?
[ "$rc" -eq 0 ] || [ "$rc" -eq 5 ] || exit "$rc"  # 5: pytest args that select none of these tests
