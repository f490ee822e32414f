"""Helpers for the pmindex-server tests (docs/server.md): start and stop
pmindex-server and a reference memcached as child processes on loopback, and
a raw-socket client that compares replies byte for byte.

PMINDEX_SERVER names the server binary (default: build/bin/pmindex-server of
this checkout); MEMCACHED the reference server (default: memcached on PATH).
Servers log to files in the test's temporary directory; pmindex-server binds
port 0 unless told otherwise and reports the port it got on stderr.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER = os.environ.get("PMINDEX_SERVER") or os.path.join(REPO, "build", "bin", "pmindex-server")
MEMCACHED = os.environ.get("MEMCACHED") or shutil.which("memcached")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, timeout=20.0):
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError("server exited with %s at start" % proc.returncode)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError("server did not listen on %d" % port)


class Proc:
    """A server child process; .port, .addr, stop() (SIGTERM), kill() (SIGKILL)."""

    def __init__(self, argv, log, port=None):
        self.argv, self.log_path = argv, log
        self.log = open(log, "w")
        self.p = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        if port is None:  # pmindex-server with --port 0 reports its port
            end = time.time() + 20
            while port is None:
                m = re.search(r"listening on 127\.0\.0\.1:(\d+)", open(log).read())
                if m:
                    port = int(m.group(1))
                elif self.p.poll() is not None or time.time() > end:
                    raise RuntimeError("server did not start:\n" + open(log).read())
                else:
                    time.sleep(0.02)
        self.port = port
        wait_port(port, self.p)
        self.addr = ("127.0.0.1", port)

    def check_log(self):
        """Fails on a sanitizer report in the server's output (ASan, UBSan and
        TSan builds of the server, PMINDEX_SERVER=build-asan/... or build-tsan/...)."""
        out = self.output()
        for marker in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                       "WARNING: ThreadSanitizer"):
            assert marker not in out, "sanitizer report from %s:\n%s" % (self.argv[0], out[-6000:])

    def alive(self):
        return self.p.poll() is None

    def stop(self, timeout=20):
        if self.alive():
            self.p.send_signal(signal.SIGTERM)
        rc = self.p.wait(timeout)
        self.log.close()
        self.check_log()
        return rc

    def kill(self):
        if self.alive():
            self.p.kill()
        self.p.wait(20)
        self.log.close()
        self.check_log()

    def output(self):
        return open(self.log_path).read()


def shm_dir():
    """A fresh directory for pools: /dev/shm (memory, as PM is emulated) if present."""
    return tempfile.mkdtemp(prefix="pmindex-server-test.", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)


def start_pmindex(tmp, name="srv", engine="fptree", port=0, args=(), pool=None, pooldir=None):
    pool = pool or os.path.join(pooldir or str(tmp), name + ".pool")
    argv = [SERVER, "--engine", engine, "--pool", pool, "--port", str(port), "--threads", "2", *args]
    return Proc(argv, os.path.join(str(tmp), name + ".log"), None if port == 0 else port)


def start_memcached(tmp, args=()):
    port = free_port()
    argv = [MEMCACHED, "-p", str(port), "-U", "0", "-l", "127.0.0.1", "-t", "2", *args]
    if os.geteuid() == 0:
        argv += ["-u", "root"]
    return Proc(argv, os.path.join(str(tmp), "memcached.log"), port)


class Raw:
    """A raw protocol connection: send bytes, expect exact reply bytes."""

    def __init__(self, addr, timeout=5.0):
        self.s = socket.create_connection(addr, timeout=timeout)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, data):
        self.s.sendall(data)

    def read(self, n):
        buf = b""
        while len(buf) < n:
            d = self.s.recv(n - len(buf))
            if not d:
                break
            buf += d
        return buf

    def expect(self, want):
        got = self.read(len(want))
        assert got == want, "expected %r, got %r" % (want, got)

    def line(self):
        buf = b""
        while not buf.endswith(b"\r\n"):
            d = self.s.recv(1)
            if not d:
                break
            buf += d
        return buf

    def closed(self, timeout=5.0):
        """True if the server closes the connection (after any pending reply)."""
        self.s.settimeout(timeout)
        try:
            while True:
                if not self.s.recv(65536):
                    return True
        except ConnectionResetError:  # closed with our bytes unread
            return True
        except OSError:
            return False

    def close(self):
        self.s.close()


def stats(addr):
    r = Raw(addr)
    r.send(b"stats\r\n")
    out = {}
    while True:
        ln = r.line()
        if ln in (b"END\r\n", b""):
            break
        _, k, v = ln.decode().strip().split(" ", 2)
        out[k] = v
    r.close()
    return out
