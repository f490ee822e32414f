"""Fixtures for the pmindex-server tests: `server` runs a test once against
pmindex-server and once against the reference memcached, so any difference in
replies shows (docs/server.md lists the known ones); `pmserver` is a
pmindex-server on a fresh fptree pool."""
import os
import shutil

import pytest

import srvutil


def pytest_collection_modifyitems(config, items):
    if not os.path.exists(srvutil.SERVER):
        skip = pytest.mark.skip(reason="no pmindex-server at %s (build it or set PMINDEX_SERVER)" % srvutil.SERVER)
        for it in items:
            it.add_marker(skip)


@pytest.fixture
def pooldir():
    d = srvutil.shm_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(params=["pmindex", "memcached"])
def server(request, tmp_path, pooldir):
    if request.param == "memcached":
        if not srvutil.MEMCACHED:
            pytest.skip("memcached is not installed (apt install memcached)")
        p = srvutil.start_memcached(tmp_path)
    else:
        p = srvutil.start_pmindex(tmp_path, pooldir=pooldir)
    p.kind = request.param
    yield p
    p.kill()


@pytest.fixture
def pmserver(tmp_path, pooldir):
    p = srvutil.start_pmindex(tmp_path, pooldir=pooldir)
    yield p
    p.kill()
