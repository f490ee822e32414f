"""pmindex: crash-consistent persistent-memory indexes as a key-value store.

    import pmindex
    with pmindex.open("/dev/shm/my.pool", engine="fptree") as db:
        db[b"apple"] = b"red"
        for key, value in db.items(b"a", b"b"):
            ...

Keys and values are bytes by default; key_kind="u64" / value_kind="u64" make
them ints (unsigned 64-bit, keys in numeric order). Errors raise subclasses of
pmindex.Error (see pmindex._errors). docs/python.md has the whole surface.
"""

import struct as _struct

from . import _errors
from ._errors import (AlreadyExistsError, BusyError, CorruptError, Error, InvalidArgumentError, IOError,
                      NotFoundError, PoolFullError, UnsupportedError)
from ._pmindex import Iter as _Iter
from ._pmindex import Store as _Store
from ._pmindex import engines as _engines

__all__ = ["open", "engines", "Store", "Error", "NotFoundError", "AlreadyExistsError", "InvalidArgumentError",
           "PoolFullError", "CorruptError", "UnsupportedError", "IOError", "BusyError"]
__version__ = "0.1.0"

_U64 = _struct.Struct("=Q")  # native endian, as the C++ API passes u64 keys
_BATCH = 256


def engines():
    """The engines built into the library: a list of dicts (name, persistent, ordered, concurrent, description)."""
    return _engines()


class _Codec:
    def __init__(self, kind, what):
        if kind not in ("bytes", "u64"):
            raise InvalidArgumentError(f"InvalidArgument: {what}_kind must be 'bytes' or 'u64', got {kind!r}")
        self.u64 = kind == "u64"
        self.what = what

    def encode(self, x):
        if self.u64:
            if isinstance(x, bool) or not isinstance(x, int):
                raise TypeError(f"{self.what} must be an int on a u64 store, got {type(x).__name__}")
            if not 0 <= x < 1 << 64:
                raise InvalidArgumentError(f"InvalidArgument: {self.what} {x} is not an unsigned 64-bit integer")
            return _U64.pack(x)
        if isinstance(x, (bytearray, memoryview)):
            return bytes(x)
        if not isinstance(x, bytes):
            raise TypeError(f"{self.what} must be bytes, got {type(x).__name__}")
        return x

    def decode(self, b):
        return _U64.unpack(b)[0] if self.u64 else b


class Store:
    """An open store. Use pmindex.open(); close() (or the with block) flushes and closes it."""

    def __init__(self, path, engine="", *, size=64 << 20, create=True, error_if_exists=False, key_kind="bytes",
                 value_kind="bytes", params=None):
        self._k = _Codec(key_kind, "key")
        self._v = _Codec(value_kind, "value")
        params = {str(k): str(v) for k, v in (params or {}).items()}
        self._s = _Store(str(path), engine or "", int(size), bool(create), bool(error_if_exists), self._k.u64,
                         self._v.u64, params)
        # An existing pool keeps its own kinds.
        self._k.u64 = self._s.u64_keys
        self._v.u64 = self._s.u64_values

    # context manager
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        self._s.close()

    @property
    def closed(self):
        return self._s.closed

    @property
    def engine(self):
        return self._s.engine

    @property
    def ordered(self):
        return self._s.ordered

    def stats(self):
        return self._s.stats()

    # dict protocol
    def __getitem__(self, key):
        return self._v.decode(self._s.get(self._k.encode(key)))

    def __setitem__(self, key, value):
        self._s.put(self._k.encode(key), self._v.encode(value))

    def __delitem__(self, key):
        self._s.remove(self._k.encode(key))

    def __contains__(self, key):
        return self._s.exists(self._k.encode(key))

    def __len__(self):
        return self._s.count(None, None)

    def __iter__(self):
        return self.keys()

    def get(self, key, default=None):
        try:
            return self[key]
        except NotFoundError:
            return default

    def put(self, key, value):
        self[key] = value

    def remove(self, key):
        del self[key]

    def get_many(self, keys):
        """Values of many keys in one call: a list with None for absent keys."""
        out = self._s.get_many([self._k.encode(k) for k in keys])
        return [None if v is None else self._v.decode(v) for v in out]

    def count(self, above=None, below=None):
        """Records with above < key < below (either bound may be None)."""
        a = None if above is None else self._k.encode(above)
        b = None if below is None else self._k.encode(below)
        return self._s.count(a, b)

    def items(self, start=None, stop=None):
        """(key, value) pairs with start <= key < stop in key order (ordered engines)."""
        it = _Iter(self._s)
        it.seek(None if start is None else self._k.encode(start))
        stop_key = None if stop is None else self._k.encode(stop)
        stop_val = None if stop is None else stop
        while True:
            batch = it.batch(_BATCH)
            if not batch:
                return
            for k, v in batch:
                key = self._k.decode(k)
                if stop_key is not None and not key < stop_val:
                    return
                yield key, self._v.decode(v)

    def keys(self, start=None, stop=None):
        for k, _ in self.items(start, stop):
            yield k

    def values(self, start=None, stop=None):
        for _, v in self.items(start, stop):
            yield v


def open(path, engine="", **kwargs):  # noqa: A001 - the module's entry point, like gzip.open
    """Opens (creating if missing) the store at path; usable as a context manager.

    engine: "fptree", "fastfair", "nvc_hashmap", ... ("" : the engine that owns an existing pool).
    size: initial pool size in bytes; create: create if missing; error_if_exists;
    key_kind / value_kind: "bytes" (default) or "u64"; params: engine parameters.
    """
    return Store(path, engine, **kwargs)
