"""Scale-out the way memcached does: three pmindex-server processes on
loopback and a client with consistent hashing (pymemcache's HashClient).
Keys spread over all three; one server is killed, the others keep serving;
restarted on its pool it has all its keys back (docs/server.md)."""
import pytest
from pymemcache.client.base import Client
from pymemcache.client.hash import HashClient

import srvutil


def test_three_servers_with_consistent_hashing(tmp_path, pooldir):
    ports = [srvutil.free_port() for _ in range(3)]
    procs = [srvutil.start_pmindex(tmp_path, name="s%d" % i, pooldir=pooldir, port=port)
             for i, port in enumerate(ports)]
    try:
        servers = [("127.0.0.1", port) for port in ports]
        hc = HashClient(servers, default_noreply=False, connect_timeout=2, timeout=2)
        want = {"user:%04d" % i: b"profile-%d" % i for i in range(600)}
        assert hc.set_many(want) == []
        counts = [int(Client(s).stats()[b"curr_items"]) for s in servers]
        assert sum(counts) == len(want) and min(counts) > 60, counts
        # One server dies: keys on the others are still served; its own keys
        # answer misses (ignore_exc) rather than errors.
        procs[1].kill()
        hc2 = HashClient(servers, default_noreply=False, connect_timeout=1, timeout=1, ignore_exc=True,
                         retry_attempts=1, dead_timeout=0)
        got = hc2.get_many(list(want))
        on_dead = [k for k in want if hc.hasher.get_node(k) == "127.0.0.1:%d" % ports[1]]
        assert len(on_dead) == counts[1]
        assert {k: v for k, v in got.items()} == {k: v for k, v in want.items() if k not in on_dead}
        # Restarted on its pool, it serves every key it held.
        procs[1] = srvutil.start_pmindex(tmp_path, name="s1b", pooldir=pooldir, port=ports[1],
                                         pool=procs[1].argv[4])
        hc3 = HashClient(servers, default_noreply=False, connect_timeout=2, timeout=2)
        assert hc3.get_many(list(want)) == want
    finally:
        for p in procs:
            p.kill()
