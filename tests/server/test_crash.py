"""SIGKILL under write load: every write the server acknowledged (STORED,
DELETED, an incr result) is found after a restart (docs/server.md,
durability). Writers on several connections set fresh keys, overwrite a
per-writer key with a rising version, delete keys they stored, and incr a
shared counter, recording what was acknowledged, until the server is killed
in the middle of it."""
import threading
import time

import pytest
from pymemcache.client.base import Client

import srvutil


@pytest.mark.parametrize("engine", ["fptree", "fastfair"])
def test_sigkill_under_write_load(tmp_path, pooldir, engine):
    p = srvutil.start_pmindex(tmp_path, pooldir=pooldir, engine=engine)
    pool = p.argv[4]
    writers = 4
    acked = [dict() for _ in range(writers)]     # key -> value acknowledged
    deleted = [set() for _ in range(writers)]    # keys whose delete was acknowledged
    # A delete in flight when the server dies may or may not have been
    # applied: its key is moved out of acked before the request is sent, and
    # checked afterwards to hold either its acknowledged value or nothing.
    uncertain = [dict() for _ in range(writers)]
    version = [0] * writers                      # last acknowledged version of "ver-<w>"
    incr_acked = [0] * writers                   # incr calls acknowledged
    sent_incr = [0] * writers                    # incr calls sent
    started = threading.Event()

    def work(w):
        c = Client(p.addr, default_noreply=False, connect_timeout=5, timeout=5)
        i = 0
        try:
            while True:
                k, v = "w%d-%06d" % (w, i), b"%d:%d" % (w, i) * (1 + i % 50)
                if c.set(k, v):
                    acked[w][k] = v
                if c.set("ver-%d" % w, b"%d" % i):
                    version[w] = i
                if i % 5 == 4:
                    dk = "w%d-%06d" % (w, i - 2)
                    if dk in acked[w]:
                        uncertain[w][dk] = acked[w].pop(dk)
                    if c.delete(dk):
                        deleted[w].add(dk)
                        uncertain[w].pop(dk, None)
                sent_incr[w] += 1
                if c.incr("counter", 1) is not None:
                    incr_acked[w] += 1
                i += 1
                if i == 50:
                    started.set()
        except Exception:
            return  # the server died

    c = Client(p.addr, default_noreply=False)
    c.set("counter", b"0")
    ts = [threading.Thread(target=work, args=(w,)) for w in range(writers)]
    for t in ts:
        t.start()
    assert started.wait(20)
    time.sleep(1.0)
    p.kill()
    for t in ts:
        t.join(20)
    p = srvutil.start_pmindex(tmp_path, name="after", pooldir=pooldir, engine=engine, pool=pool)
    try:
        c = Client(p.addr, default_noreply=False)
        total = 0
        for w in range(writers):
            total += len(acked[w])
            got = c.get_many(list(acked[w]))
            missing = [k for k in acked[w] if got.get(k) != acked[w][k]]
            assert not missing, "%d acknowledged items lost or changed, e.g. %s" % (len(missing), missing[:5])
            assert c.get_many(list(deleted[w])) == {}
            assert len(uncertain[w]) <= 1  # at most the one delete in flight
            for k, v in uncertain[w].items():
                assert c.get(k) in (None, v), "in-flight delete of %s left a changed value" % k
            assert int(c.get("ver-%d" % w)) >= version[w]
        ctr = int(c.get("counter"))
        assert sum(incr_acked) <= ctr <= sum(sent_incr)
        assert total > 100
        assert c.set("after-restart", b"ok") and c.get("after-restart") == b"ok"
    finally:
        p.kill()
