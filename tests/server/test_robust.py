"""pmindex-server under bad input and at its limits: malformed and oversize
commands, partial lines and disconnects, byte-by-byte clients, many idle
connections, the connection limit, a full pool, the background sweep, a clean
SIGTERM, and a second server refused on the same pool (docs/server.md)."""
import resource
import socket
import time

import pytest
from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheServerError

import srvutil
from srvutil import Raw


def client(p):
    return Client(p.addr, default_noreply=False, connect_timeout=5, timeout=10)


def test_byte_by_byte_client(pmserver):
    r = Raw(pmserver.addr)
    for b in b"set slow 3 0 5\r\nhello\r\nget slow\r\n":
        r.send(bytes([b]))
    r.expect(b"STORED\r\nVALUE slow 3 5\r\nhello\r\nEND\r\n")


def test_partial_commands_then_disconnect(pmserver):
    c = client(pmserver)
    c.set("keep", b"safe")
    for part in [b"set torn 0 0 10\r\nhal", b"get ke", b"set torn 0 0", b"incr keep"]:
        r = Raw(pmserver.addr)
        r.send(part)
        time.sleep(0.05)
        r.close()
    assert c.get("torn") is None
    assert c.get("keep") == b"safe"
    assert pmserver.alive()


def test_malformed_and_oversize_do_not_hurt_others(pmserver):
    c = client(pmserver)
    c.set("keep", b"safe")
    bad = [b"\x00\xff\xfe garbage\r\n", b"set\r\n", b"set k 0 0 99999999999\r\n", b"incr\r\n",
           b"get " + b"x" * 300 + b"\r\n", b"cas k 0 0 1\r\n", b"set k x y z\r\n",
           b"set k 0 0 3\r\nabcdef\r\n", b"touch\r\n", b"delete\r\n", b"decr keep x\r\n"]
    r = Raw(pmserver.addr)
    for b in bad:
        r.send(b)
        ln = r.line()
        assert ln.startswith((b"ERROR", b"CLIENT_ERROR", b"SERVER_ERROR")), (b, ln)
    r.send(b"mn\r\n")  # a bad data chunk leaves one more error line: skip to MN
    while r.line() != b"MN\r\n":
        pass
    # An overlong line without a newline: an error, then the connection closes.
    r2 = Raw(pmserver.addr)
    r2.send(b"x" * 5000)
    assert r2.line() == b"CLIENT_ERROR line too long\r\n"
    assert r2.closed()
    # A binary-protocol request (magic 0x80) closes its connection.
    r3 = Raw(pmserver.addr)
    r3.send(b"\x80\x00\x00\x00" + b"\x00" * 20)
    assert r3.closed()
    # A value over the item limit is refused and its data skipped.
    r.send(b"set huge 0 0 %d\r\n" % (3 << 20) + b"h" * (3 << 20) + b"\r\nget keep\r\n")
    r.expect(b"SERVER_ERROR object too large for cache\r\nVALUE keep 0 4\r\nsafe\r\nEND\r\n")
    # A multi-key get may be long (up to 256 KiB).
    keys = b" ".join(b"key%05d" % i for i in range(5000))
    r.send(b"get " + keys + b" keep\r\n")
    r.expect(b"VALUE keep 0 4\r\nsafe\r\nEND\r\n")
    assert c.get("keep") == b"safe"
    assert pmserver.alive()


def test_many_idle_connections_and_the_limit(tmp_path, pooldir):
    n = 1500
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 200:
        if hard < n + 200:
            pytest.skip("the file limit is %d" % hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (n + 200, hard))
    p = srvutil.start_pmindex(tmp_path, pooldir=pooldir, args=["-c", str(n + 1)])
    try:
        idle = [socket.create_connection(p.addr) for _ in range(n)]
        c = client(p)  # connection n + 1: still served
        c.set("busy", b"yes")
        assert c.get("busy") == b"yes"
        assert int(c.stats()[b"curr_connections"]) == n + 1
        extra = Raw(p.addr)  # one too many
        assert extra.line() == b"ERROR Too many open connections\r\n"
        assert extra.closed()
        for s in idle:
            s.close()
        for _ in range(100):  # the server notices the closes
            if int(c.stats()[b"curr_connections"]) == 1:
                break
            time.sleep(0.05)
        assert int(c.stats()[b"curr_connections"]) == 1
        assert p.stop() == 0
    finally:
        p.kill()


def test_pool_full_loses_nothing(tmp_path, pooldir):
    args = ["--pool_size", "16", "-m", "16"]
    p = srvutil.start_pmindex(tmp_path, pooldir=pooldir, args=args)
    c = client(p)
    stored = {}
    full = False
    for i in range(2000):
        k, v = "fill%04d" % i, (b"%04d" % i) * 8000
        try:
            assert c.set(k, v)
            stored[k] = v
        except MemcacheServerError as e:
            assert "out of memory" in str(e)
            full = True
            break
    assert full and len(stored) > 10
    # An update and an append that do not fit leave the old value.
    k0 = next(iter(stored))
    with pytest.raises(MemcacheServerError):
        c.set(k0, b"q" * 1000000)
    assert c.get(k0) == stored[k0]
    assert c.get_many(list(stored)) == stored
    assert int(c.stats()[b"out_of_memory"]) >= 2
    # Deleting makes room again.
    for k in list(stored)[: len(stored) // 2]:
        assert c.delete(k)
        del stored[k]
    assert c.set("after", b"a" * 32000)
    stored["after"] = b"a" * 32000
    assert p.stop() == 0
    p = srvutil.start_pmindex(tmp_path, name="srv2", pooldir=pooldir, pool=p.argv[4], args=args)
    try:
        assert client(p).get_many(list(stored)) == stored
    finally:
        p.kill()


def test_background_sweep_reclaims_expired_items(tmp_path, pooldir):
    p = srvutil.start_pmindex(tmp_path, pooldir=pooldir, args=["--sweep_interval", "1"])
    try:
        c = client(p)
        c.set_many({"exp%03d" % i: b"x" for i in range(300)}, expire=1)
        c.set_many({"live%03d" % i: b"y" for i in range(50)})
        for _ in range(80):  # nobody reads the expired keys: the sweep removes them
            st = c.stats()
            if int(st[b"reclaimed"]) >= 300:
                break
            time.sleep(0.1)
        assert int(st[b"reclaimed"]) >= 300, st
        assert int(st[b"curr_items"]) == 50
    finally:
        p.kill()


def test_flush_all_survives_a_crash(tmp_path, pooldir):
    p = srvutil.start_pmindex(tmp_path, pooldir=pooldir)
    c = client(p)
    c.set_many({"old%d" % i: b"o" for i in range(100)})
    assert c.flush_all()
    c.set("new", b"n")
    p.kill()
    p = srvutil.start_pmindex(tmp_path, name="srv2", pooldir=pooldir, pool=p.argv[4])
    try:
        c = client(p)
        assert c.get_many(["old%d" % i for i in range(100)]) == {}
        assert c.get("new") == b"n"
        c.set("newer", b"m")
        assert c.get("newer") == b"m"
    finally:
        p.kill()


def test_sigterm_closes_the_pool_and_a_second_server_is_refused(tmp_path, pooldir):
    p = srvutil.start_pmindex(tmp_path, pooldir=pooldir)
    try:
        client(p).set("k", b"v")
        second = srvutil.subprocess.run(
            [srvutil.SERVER, "--engine", "fptree", "--pool", p.argv[4], "--port", "0"],
            capture_output=True, text=True, timeout=30)
        assert second.returncode == 1
        assert "already open" in second.stderr, second.stderr
        assert client(p).get("k") == b"v"  # the first one is unaffected
        assert p.stop() == 0
        assert "store closed" in p.output()
    finally:
        p.kill()


@pytest.mark.parametrize("engine", ["fptree", "fptree_single", "ptree", "fastfair", "nvtree", "wbtree",
                                    "nvc_hashmap", "dram_btree"])
def test_every_engine(tmp_path, pooldir, engine):
    p = srvutil.start_pmindex(tmp_path, pooldir=pooldir, engine=engine, args=["--sweep_interval", "1"])
    try:
        c = client(p)
        want = {"e%03d" % i: b"v" * (i * 37 % 3000) for i in range(200)}
        c.set_many(want)
        c.set("ctr", b"1")
        assert c.incr("ctr", 2) == 3
        assert c.append("e001", b"+")
        want["e001"] += b"+"
        assert c.get_many(list(want)) == want
        assert c.set("big", b"b" * 500000) and c.get("big") == b"b" * 500000
        assert int(c.stats()[b"curr_items"]) == 202
        assert p.stop() == 0
        if engine == "dram_btree":
            return
        p = srvutil.start_pmindex(tmp_path, name="again", pooldir=pooldir, engine="", pool=p.argv[4])
        assert client(p).get_many(list(want)) == want
    finally:
        p.kill()


def test_out_of_file_descriptors(tmp_path, pooldir):
    """With a file limit below the connection limit, accept fails (EMFILE):
    the server pauses accepting, keeps serving, and accepts again once
    connections close."""
    argv = [srvutil.SERVER, "--pool", pooldir + "/emfile.pool", "--port", str(srvutil.free_port()), "-c", "5000"]
    log = open(str(tmp_path / "emfile.log"), "w")
    p = srvutil.subprocess.Popen(argv, stderr=log,
                                 preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100)))
    try:
        port = int(argv[4])
        srvutil.wait_port(port, p)
        first = Raw(("127.0.0.1", port))
        first.send(b"set k 0 0 1\r\nv\r\n")
        first.expect(b"STORED\r\n")
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(150)]
        time.sleep(0.3)
        first.send(b"get k\r\n")  # an accepted connection keeps being served
        first.expect(b"VALUE k 0 1\r\nv\r\nEND\r\n")
        for s in socks:
            s.close()
        late = Raw(("127.0.0.1", port), timeout=10)
        late.send(b"get k\r\n")
        late.expect(b"VALUE k 0 1\r\nv\r\nEND\r\n")
        p.terminate()
        assert p.wait(20) == 0
    finally:
        if p.poll() is None:
            p.kill()
        log.close()
