"""kvshim's remote helper: one per node (per region), the node's only Mooncake Store client.

Started by `kvshim remote [--config FILE]`, which execs it as
    PYTHON kvshim_remote.py LIBKVSHIM_REMOTE_SO
with KVSHIM_CONFIG set.  It runs in the foreground until SIGTERM or SIGINT.

Everything that touches the region or the request ring is in C (libkvshim_remote.so,
remote/helper.c, remote/ring.c); this program only moves bytes between the ring's staging
buffers and the pool, and decides where the node's misses go (the ring's route word):

  - gets: engines post them (one shard each) and wait up to remote.timeout_ms; this program
    gets each into the entry's staging buffer (batch_get_into), checks its length, answers.
  - puts: engines offer shards they loaded from storage that are kept for good; the C side
    stages the shard if it is still READY, this program asks whether the pool has the key
    (is_exist) and puts it into this node's own segment (put_from, preferred_segments).
  - route: the pool's speed here (its gets' bytes over time) against storage's (the region's
    backend_bytes over storage_ns, every process's), each second: misses go to the faster;
    while routed to storage one miss in 16 still asks, so the pool's speed stays measured.
  - breaker: BREAK_ERRORS errors (not misses) within BREAK_WINDOW_S open it for BREAK_OPEN_S:
    engines stop asking, offers are dropped; then it closes on its own.

Mooncake's own bounds are set from remote.timeout_ms before the client exists (whole seconds,
at least 1: MC_TCP_PROGRESS_TIMEOUT_SEC, MC_TCP_STATUS_TIMEOUT_SEC; MC_RPC_TIMEOUT_MS); its
health_check() is not used (it reports the last ping: healthy with a stopped master).
Messages go to stderr, prefixed "kvshim: remote: ", once per cause.
"""

import ctypes
import errno
import math
import os
import signal
import sys
import threading
import time

GET, PUT = 1, 2
ROUTE_ASK, ROUTE_STORAGE, ROUTE_BROKEN = 0, 1, 2
OBJECT_NOT_FOUND = -704  # Mooncake's ErrorCode for a key the pool does not hold
BREAK_ERRORS, BREAK_WINDOW_S, BREAK_OPEN_S = 3, 2.0, 5.0
KEY_MAX = 160
BATCH = 16

_said = set()


def say(cause, text):
    if cause in _said:
        return
    _said.add(cause)
    print("kvshim: remote: " + text, file=sys.stderr, flush=True)


class Job(ctypes.Structure):
    _fields_ = [("entry", ctypes.c_uint32), ("len", ctypes.c_uint32),
                ("staging", ctypes.c_uint64), ("key", ctypes.c_char * KEY_MAX)]


def load(path):
    lib = ctypes.CDLL(path)
    lib.kvr_open.restype = ctypes.c_void_p
    lib.kvr_open.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.kvr_close.argtypes = [ctypes.c_void_p]
    lib.kvr_setting.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                ctypes.c_size_t]
    lib.kvr_staging.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64),
                                ctypes.POINTER(ctypes.c_uint64)]
    lib.kvr_take.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(Job), ctypes.c_int,
                             ctypes.c_uint32]
    lib.kvr_done.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_int64]
    lib.kvr_route.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.kvr_storage.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64),
                                ctypes.POINTER(ctypes.c_uint64)]
    return lib


class Breaker:
    """Open after BREAK_ERRORS errors within BREAK_WINDOW_S, for BREAK_OPEN_S."""

    def __init__(self):
        self.lock = threading.Lock()
        self.errors = []
        self.until = 0.0

    def is_open(self):
        return time.monotonic() < self.until

    def error(self):
        now = time.monotonic()
        with self.lock:
            self.errors = [t for t in self.errors if now - t < BREAK_WINDOW_S] + [now]
            if len(self.errors) >= BREAK_ERRORS and not self.is_open():
                self.until = now + BREAK_OPEN_S
                self.errors = []
                return True
        return False


class Helper:
    def __init__(self, lib, h):
        self.lib, self.h = lib, h
        self.stop = threading.Event()
        self.breaker = Breaker()
        self.lock = threading.Lock()
        self.pool_bytes = 0  # the pool's hits, this window
        self.pool_ns = 0
        self.route = ROUTE_ASK

    def setting(self, name):
        buf = ctypes.create_string_buffer(4096)
        if self.lib.kvr_setting(self.h, name.encode(), buf, 4096) != 0:
            raise KeyError(name)
        return buf.value.decode()

    def connect(self):
        """Bounds and bind address first (Mooncake reads them at setup), then the client."""
        timeout_ms = int(self.setting("remote.timeout_ms"))
        bound_s = str(max(1, math.ceil(timeout_ms / 1000)))
        host = self.setting("remote.host")
        if not host:
            say("host", "remote.host is not set: give the address this node's peers reach "
                "it at (its data port binds there, never to every interface by default)")
            return None
        os.environ["MC_TCP_BIND_ADDRESS"] = host
        os.environ["MC_TCP_PROGRESS_TIMEOUT_SEC"] = bound_s
        os.environ["MC_TCP_STATUS_TIMEOUT_SEC"] = bound_s
        os.environ["MC_RPC_TIMEOUT_MS"] = str(max(1000, timeout_ms))
        os.environ["MC_RPC_CONNECT_TIMEOUT_MS"] = str(max(1000, timeout_ms))
        os.environ.setdefault("GLOG_minloglevel", "2")  # Mooncake says every setup step at INFO
        os.environ.setdefault("MC_STORE_RPC_CLIENT_IO_THREADS", "2")
        os.environ.setdefault("MC_TE_RPC_CLIENT_IO_THREADS", "2")
        try:
            from mooncake.store import MooncakeDistributedStore, ReplicateConfig
        except ImportError as e:
            say("import", "cannot import mooncake.store (%s): set remote.python to the Python "
                "of a venv with mooncake-transfer-engine installed (scripts/deps.sh)" % e)
            return None
        store = MooncakeDistributedStore()
        rc = store.setup(host, self.setting("remote.metadata"),
                         int(self.setting("remote.segment")), 16 << 20, "tcp", "",
                         self.setting("remote.master"))
        if rc != 0:
            say("setup", "Mooncake setup failed (%d): master %s, metadata %s"
                % (rc, self.setting("remote.master"), self.setting("remote.metadata")))
            return None
        base, length = ctypes.c_uint64(), ctypes.c_uint64()
        self.lib.kvr_staging(self.h, ctypes.byref(base), ctypes.byref(length))
        rc = store.register_buffer(base.value, length.value)
        if rc != 0:
            say("register", "cannot register the staging memory with Mooncake (%d)" % rc)
            return None
        self.rcfg = ReplicateConfig()
        self.rcfg.replica_num = 1
        self.rcfg.preferred_segments = [store.get_hostname()]
        self.store = store
        return store

    def failed(self, what, rc):
        say("err%d" % rc, "%s failed (%d); such failures are counted (remote_errors, "
            "remote_dropped) and not said again" % (what, rc))
        if self.breaker.error():
            say("breaker", "errors keep coming: the pool is not asked for %g s at a time "
                "until it answers again" % BREAK_OPEN_S)
            self.set_route(ROUTE_BROKEN)

    def set_route(self, route):
        self.route = route
        self.lib.kvr_route(self.h, route)

    def gets(self):
        jobs = (Job * BATCH)()
        while not self.stop.is_set():
            n = self.lib.kvr_take(self.h, GET, jobs, BATCH, 100)
            if n <= 0:
                continue
            if self.breaker.is_open():
                for i in range(n):
                    self.lib.kvr_done(self.h, GET, jobs[i].entry, -errno.EAGAIN)
                continue
            keys = [jobs[i].key.decode() for i in range(n)]
            t0 = time.monotonic_ns()
            try:
                if n == 1:
                    res = [self.store.get_into(keys[0], jobs[0].staging, jobs[0].len)]
                else:
                    res = self.store.batch_get_into(keys, [jobs[i].staging for i in range(n)],
                                                    [jobs[i].len for i in range(n)])
            except Exception as e:  # a binding error is an error of the pool, never a crash
                say("exc", "a get raised %r" % e)
                res = [-errno.EIO] * n
            dt = time.monotonic_ns() - t0
            got = 0
            for i in range(n):
                r = res[i]
                if r == jobs[i].len:
                    got += r
                    self.lib.kvr_done(self.h, GET, jobs[i].entry, r)
                elif r == OBJECT_NOT_FOUND:
                    self.lib.kvr_done(self.h, GET, jobs[i].entry, -errno.ENOENT)
                else:
                    if r >= 0:
                        say("len", "the pool gave %d bytes for %d of %s: not used"
                            % (r, jobs[i].len, keys[i]))
                    else:
                        self.failed("a get", r)
                    self.lib.kvr_done(self.h, GET, jobs[i].entry, -errno.EIO)
            if got:
                with self.lock:
                    self.pool_bytes += got
                    self.pool_ns += dt

    def puts(self):
        jobs = (Job * BATCH)()
        while not self.stop.is_set():
            n = self.lib.kvr_take(self.h, PUT, jobs, BATCH, 100)
            for i in range(n):
                j = jobs[i]
                if self.breaker.is_open():
                    self.lib.kvr_done(self.h, PUT, j.entry, -1)
                    continue
                key = j.key.decode()
                try:
                    if self.store.is_exist(key) == 1:
                        self.lib.kvr_done(self.h, PUT, j.entry, 0)  # there already
                        continue
                    r = self.store.put_from(key, j.staging, j.len, self.rcfg)
                except Exception as e:
                    say("exc", "a put raised %r" % e)
                    r = -errno.EIO
                if r != 0 and r != -200:  # -200: no room in the pool, an ordinary drop
                    self.failed("a put", r)
                self.lib.kvr_done(self.h, PUT, j.entry, j.len if r == 0 else -1)

    def steer(self, last):
        """Once a second: the breaker, then the faster of the pool and storage."""
        if self.route == ROUTE_BROKEN:
            if self.breaker.is_open():
                return last
            self.set_route(ROUTE_ASK)
        sb, sn = ctypes.c_uint64(), ctypes.c_uint64()
        if self.lib.kvr_storage(self.h, ctypes.byref(sb), ctypes.byref(sn)) != 0:
            return last
        with self.lock:
            pb, pn = self.pool_bytes, self.pool_ns
            self.pool_bytes = self.pool_ns = 0
        db, dn = sb.value - last[0], sn.value - last[1]
        # Both as ns per byte of one request's wait; judged only on enough of each.
        if pb >= (4 << 20) and db >= (4 << 20):
            pool, storage = pn / pb, dn / db
            route = ROUTE_STORAGE if pool > 1.25 * storage else ROUTE_ASK
            if route != self.route:
                say("route%d" % route, "misses now go to %s: the pool %.2f GB/s, storage "
                    "%.2f GB/s per request" % ("storage" if route else "the pool",
                                               1 / pool, 1 / storage))
                self.set_route(route)
            return (sb.value, sn.value)
        return last if db < (4 << 20) else (sb.value, sn.value)


def main():
    if len(sys.argv) != 2:
        print("usage: kvshim remote [--config FILE]", file=sys.stderr)
        return 2
    lib = load(sys.argv[1])
    msg = ctypes.create_string_buffer(512)
    h = lib.kvr_open(msg, 512)
    if not h:
        say("open", msg.value.decode(errors="replace"))
        return 1
    helper = Helper(lib, h)
    stop = helper.stop
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    signal.signal(signal.SIGINT, lambda *a: stop.set())
    if helper.connect() is None:
        lib.kvr_close(h)
        return 1
    threads = [threading.Thread(target=helper.gets, name="gets", daemon=True),
               threading.Thread(target=helper.puts, name="puts", daemon=True)]
    for t in threads:
        t.start()
    print("kvshim: remote: serving %s for region %s through %s"
          % (helper.setting("ring"), helper.setting("cache.name"),
             helper.setting("remote.master")), file=sys.stderr, flush=True)
    last = (0, 0)
    sb, sn = ctypes.c_uint64(), ctypes.c_uint64()
    if lib.kvr_storage(h, ctypes.byref(sb), ctypes.byref(sn)) == 0:
        last = (sb.value, sn.value)
    while not stop.wait(1.0):
        last = helper.steer(last)
    lib.kvr_route(h, ROUTE_BROKEN)  # nobody asks from here on
    for t in threads:
        t.join(timeout=5)
    lib.kvr_close(h)  # the beat stops: engines that were asking go to storage
    try:
        helper.store.close()
    except Exception:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
