"""kv_example.py: the pmindex Python package in a few lines.

    pip install ./python            (in a virtual environment; docs/python.md)
    python examples/kv_example.py [pool path] [engine]
"""
import sys

import pmindex

path = sys.argv[1] if len(sys.argv) > 1 else ""          # "" : a temporary pool
engine = sys.argv[2] if len(sys.argv) > 2 else "fptree"

with pmindex.open(path, engine=engine) as db:
    print(f"engine {db.engine}, {len(db)} records at open")
    for i in range(10):
        db[b"fruit:%d" % i] = b"value %d" % i               # durable once it returns
    print("fruit:3 =", db[b"fruit:3"])
    print("vegetable:", db.get(b"vegetable", b"not found"))
    del db[b"fruit:9"]
    if db.ordered:                                        # hash engines raise UnsupportedError
        for key, value in db.items(b"fruit:4", b"fruit:7"):  # start <= key < stop
            print(" ", key, value)

with pmindex.open("", engine="fastfair", key_kind="u64", value_kind="u64") as ids:
    ids[42] = 7
    print("42 ->", ids[42])
