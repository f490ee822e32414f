"""pytest for the pmindex Python package: every engine, the dict protocol,
ranges on ordered engines, u64 kinds, reopen, bad input and exceptions."""
import os
import random
import threading

import pytest

import pmindex

ENGINES = pmindex.engines()
NAMES = [e["name"] for e in ENGINES]
ORDERED = {e["name"]: e["ordered"] for e in ENGINES}
PERSISTENT = {e["name"]: e["persistent"] for e in ENGINES}
CONCURRENT = {e["name"]: e["concurrent"] for e in ENGINES}


@pytest.fixture
def pool(tmp_path_factory, request):
    path = f"/dev/shm/pmindex_py_test_{os.getpid()}_{request.node.name}".replace("[", "_").replace("]", "")
    if os.path.exists(path):
        os.remove(path)
    yield path
    if os.path.exists(path):
        os.remove(path)


def test_engines_listed():
    assert "fptree" in NAMES and "nvc_hashmap" in NAMES
    assert all(set(e) >= {"name", "persistent", "ordered", "concurrent"} for e in ENGINES)


@pytest.mark.parametrize("engine", NAMES)
def test_dict_protocol(pool, engine):
    with pmindex.open(pool, engine=engine) as db:
        assert db.engine == engine
        assert len(db) == 0
        db[b"apple"] = b"red"
        db[b"banana"] = bytearray(b"yellow")
        db.put(b"cherry", b"dark")
        db[b"apple"] = b"green"
        assert db[b"apple"] == b"green"
        assert b"banana" in db and b"durian" not in db
        assert len(db) == 3
        assert db.get(b"durian") is None and db.get(b"durian", b"x") == b"x"
        with pytest.raises(KeyError):
            db[b"durian"]
        with pytest.raises(pmindex.NotFoundError):
            del db[b"durian"]
        del db[b"cherry"]
        assert len(db) == 2
        assert db.get_many([b"apple", b"nope", b"banana"]) == [b"green", None, b"yellow"]
        assert db.stats()["records"] == 2
    assert db.closed


@pytest.mark.parametrize("engine", NAMES)
def test_ranges_against_dict(pool, engine):
    rng = random.Random(7)
    ref = {}
    with pmindex.open(pool, engine=engine) as db:
        for _ in range(3000):
            k = b"k%05d" % rng.randrange(1500)
            if rng.random() < 0.25:
                if k in ref:
                    del ref[k]
                    del db[k]
            else:
                v = os.urandom(rng.randrange(0, 40))
                ref[k] = v
                db[k] = v
        assert len(db) == len(ref)
        for k, v in ref.items():
            assert db[k] == v
        if not ORDERED[engine]:
            with pytest.raises(pmindex.UnsupportedError):
                list(db.items())
            with pytest.raises(NotImplementedError):
                db.count(above=b"a")
            return
        assert list(db.items()) == sorted(ref.items())
        assert list(db) == sorted(ref)
        for _ in range(20):
            lo, hi = sorted([b"k%05d" % rng.randrange(1600), b"k%05d" % rng.randrange(1600)])
            want = sorted((k, v) for k, v in ref.items() if lo <= k < hi)
            assert list(db.items(lo, hi)) == want
            assert list(db.keys(lo, hi)) == [k for k, _ in want]
            assert list(db.values(start=lo, stop=hi)) == [v for _, v in want]
            assert db.count(above=lo, below=hi) == sum(1 for k in ref if lo < k < hi)
            assert db.count(above=lo) == sum(1 for k in ref if k > lo)
            assert db.count(below=hi) == sum(1 for k in ref if k < hi)


@pytest.mark.parametrize("engine", NAMES)
def test_u64_kinds(pool, engine):
    with pmindex.open(pool, engine=engine, key_kind="u64", value_kind="u64") as db:
        for k in (300, 20, 1, 2**64 - 1, 256):
            db[k] = k * 2 % 2**64
        assert db[20] == 40
        assert 256 in db and 257 not in db
        if ORDERED[engine]:
            assert list(db.keys()) == [1, 20, 256, 300, 2**64 - 1]  # numeric, not byte, order
            assert list(db.items(20, 300)) == [(20, 40), (256, 512)]
        with pytest.raises(TypeError):
            db[b"abc"] = 1
        with pytest.raises(TypeError):
            db[1] = b"x"
        with pytest.raises(ValueError):
            db[-1] = 1
        with pytest.raises(ValueError):
            db[2**64] = 1


@pytest.mark.parametrize("engine", [n for n in NAMES if PERSISTENT[n]])
def test_reopen(pool, engine):
    with pmindex.open(pool, engine=engine) as db:
        for i in range(500):
            db[b"k%d" % i] = b"v%d" % i
        del db[b"k7"]
    with pmindex.open(pool, create=False) as db:  # the pool's own engine
        assert db.engine == engine
        assert len(db) == 499
        assert db[b"k42"] == b"v42" and b"k7" not in db
    with pytest.raises(pmindex.Error):
        pmindex.open(pool, engine=engine, error_if_exists=True)


def test_bad_input(pool):
    with pytest.raises(pmindex.InvalidArgumentError):
        pmindex.open(pool, engine="no_such_engine")
    with pytest.raises(ValueError):
        pmindex.open(pool, engine="fptree", key_kind="float")
    with pytest.raises(pmindex.Error):
        pmindex.open(pool + ".missing", engine="fptree", create=False)
    with pytest.raises(pmindex.InvalidArgumentError):
        pmindex.open(pool, engine="fptree", params={"no_such_param": "1"})
    with pmindex.open(pool, engine="fptree") as db:
        with pytest.raises(pmindex.InvalidArgumentError):
            db[b""] = b"x"
        with pytest.raises(ValueError):
            db[b"k" * 100000] = b"x"
        with pytest.raises(TypeError):
            db["text"] = b"x"
        with pytest.raises(TypeError):
            db[b"k"] = "text"
    with pytest.raises(pmindex.InvalidArgumentError):
        db[b"a"] = b"b"  # closed
    with pytest.raises(pmindex.InvalidArgumentError):
        len(db)
    db.close()  # idempotent


def test_busy_when_open_twice(pool):
    with pmindex.open(pool, engine="fptree"):
        with pytest.raises(pmindex.Error):
            pmindex.open(pool, engine="fptree")


def test_threads_share_a_store(pool):
    with pmindex.open(pool, engine="fptree", key_kind="u64", value_kind="u64") as db:
        def work(t):
            for i in range(2000):
                db[t * 10000 + i] = i
        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(db) == 8000
        assert db.count(above=9999, below=20000) == 2000
