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
  - route: the pool's speed here against storage's, as the node's loads saw them (the
    region's remote_bytes over remote_ns, backend_bytes over storage_wall_ns, every
    process's), each second: misses go to the faster; while routed to storage one miss in 16
    still asks, so the pool's speed stays measured.
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
REPLICA_IS_NOT_READY = -703  # another node's put of the key is still in flight
NO_AVAILABLE_HANDLE = -200  # no room in the pool (its eviction runs behind)
BREAK_ERRORS, BREAK_WINDOW_S, BREAK_OPEN_S = 3, 2.0, 5.0
KEY_MAX = 160
BATCH = 16  # gets: a piece of a read is at most 16 shards
PUT_BATCH = 64  # offers: as many as wait, so that a load faster than the pool drops fewer

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
    lib.kvr_leave.argtypes = [ctypes.c_void_p]
    lib.kvr_setting.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                ctypes.c_size_t]
    lib.kvr_staging.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64),
                                ctypes.POINTER(ctypes.c_uint64)]
    lib.kvr_region.argtypes = lib.kvr_staging.argtypes
    lib.kvr_take.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(Job), ctypes.c_int,
                             ctypes.c_uint32]
    lib.kvr_done.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_int64]
    lib.kvr_route.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.kvr_speeds.argtypes = [ctypes.c_void_p] + [ctypes.POINTER(ctypes.c_uint64)] * 4
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
        self.lib.kvr_region(self.h, ctypes.byref(base), ctypes.byref(length))
        if length.value:  # remote.zero_copy: the region itself, readable and writable by peers
            rc = store.register_buffer(base.value, length.value)
            if rc != 0:
                say("register", "cannot register the region with Mooncake (%d)" % rc)
                return None
            say("zero", "remote.zero_copy: the region is registered with the pool: every peer "
                "of the fabric can read and write it")
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

    def serve(self, op, batch, work):
        """Take batches of op and answer every entry taken, whatever work() raises.

        work(jobs, n, keys) returns one result per job: for a get the bytes got or -errno
        (-ENOENT: not in the pool), for a put the bytes put, 0 (there already) or -1 (dropped).
        An entry taken is always answered: an exception answers the batch with errors, so no
        entry stays the helper's; a get answered with an error keeps its buffer out of use for
        longer than the client's transfer bound (remote/ring.c), in case it still lands.
        """
        jobs = (Job * batch)()
        while not self.stop.is_set():
            n = self.lib.kvr_take(self.h, op, jobs, batch, 100)
            if n <= 0:
                continue
            res = None
            refused = self.breaker.is_open()
            try:
                if not refused:
                    res = work(jobs, n, [jobs[i].key.decode() for i in range(n)])
            except Exception as e:  # an error of the pool or its binding, never a crash
                say("exc%d" % op, "a %s raised %r" % ("get" if op == GET else "put", e))
            finally:
                for i in range(n):
                    # No result: the breaker refused the batch (no transfer started:
                    # -ECANCELED, nothing held) or work() raised (-EIO: one may have).
                    r = res[i] if res is not None and i < len(res) else \
                        -1 if op == PUT else -errno.ECANCELED if refused else -errno.EIO
                    self.lib.kvr_done(self.h, op, jobs[i].entry, int(r))

    def get_batch(self, jobs, n, keys):
        if n == 1:
            res = [self.store.get_into(keys[0], jobs[0].staging, jobs[0].len)]
        else:
            res = self.store.batch_get_into(keys, [jobs[i].staging for i in range(n)],
                                            [jobs[i].len for i in range(n)])
        out = []
        for i in range(n):
            r = int(res[i])
            if r == jobs[i].len:
                out.append(r)
            elif r in (OBJECT_NOT_FOUND, REPLICA_IS_NOT_READY):
                out.append(-errno.ENOENT)  # not there, or another node's put in flight
            else:
                if r >= 0:
                    say("len", "the pool gave %d bytes for %d of %s: not used"
                        % (r, jobs[i].len, keys[i]))
                else:
                    self.failed("a get", r)
                out.append(-errno.EIO)
        return out

    def put_batch(self, jobs, n, keys):
        """One is_exist and one put RPC round for all the offers taken at once."""
        there = self.store.batch_is_exist(keys)
        todo = [i for i in range(n) if there[i] != 1]
        res = self.store.batch_put_from([keys[i] for i in todo],
                                        [jobs[i].staging for i in todo],
                                        [jobs[i].len for i in todo], self.rcfg) if todo else []
        put = dict(zip(todo, res))
        out = []
        for i in range(n):
            r = int(put.get(i, 1))  # 1: the pool had it already
            if r < 0 and r != NO_AVAILABLE_HANDLE:  # a full pool is an ordinary drop
                self.failed("a put", r)
            out.append(0 if r == 1 else jobs[i].len if r == 0 else -1)
        return out

    def speeds(self):
        v = [ctypes.c_uint64() for _ in range(4)]
        if self.lib.kvr_speeds(self.h, *[ctypes.byref(x) for x in v]) != 0:
            return None
        return [x.value for x in v]

    def steer(self, seen):
        """Once a second: the breaker, then the faster of the pool and storage.

        Both speeds as the node's loads saw them (the region's totals, every process's):
        storage's bytes over the wall time of the pieces that read them (storage_wall_ns),
        the pool's over the time owners waited for it (remote_ns).  Each is judged on at
        least 4 MiB since it was last judged (the pool also on a second of waiting, whatever
        it gave); one not measured lately keeps its last figure.
        """
        if self.route == ROUTE_BROKEN:
            if self.breaker.is_open():
                return seen
            self.set_route(ROUTE_ASK)
        now = self.speeds()
        if now is None:
            return seen
        for k in (0, 2):  # (bytes, ns) of storage, then of the pool
            db, dn = now[k] - seen["at"][k], now[k + 1] - seen["at"][k + 1]
            # Judged on 4 MiB, or for the pool on a second of waiting whatever it gave: a
            # pool that only times out must look slow, not unmeasured.
            if (db >= (4 << 20) or (k == 2 and dn >= 1000000000)) and dn > 0:
                seen["ns_per_byte"][k // 2] = dn / max(db, 1 << 20)
                seen["at"][k], seen["at"][k + 1] = now[k], now[k + 1]
        storage, pool = seen["ns_per_byte"]
        if storage and pool:
            route = ROUTE_STORAGE if pool > 1.25 * storage else ROUTE_ASK
            if route != self.route:
                say("route%d" % route, "misses now go to %s: the pool %.2f GB/s, storage "
                    "%.2f GB/s as loads see them" % ("storage" if route else "the pool",
                                                     1 / pool, 1 / storage))
                self.set_route(route)
        return seen


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
    threads = [threading.Thread(target=helper.serve, args=(GET, BATCH, helper.get_batch),
                                name="gets", daemon=True),
               threading.Thread(target=helper.serve, args=(PUT, PUT_BATCH, helper.put_batch),
                                name="puts", daemon=True)]
    for t in threads:
        t.start()
    print("kvshim: remote: serving %s for region %s through %s"
          % (helper.setting("ring"), helper.setting("cache.name"),
             helper.setting("remote.master")), file=sys.stderr, flush=True)
    seen = {"at": helper.speeds() or [0, 0, 0, 0], "ns_per_byte": [0.0, 0.0]}
    status = 0
    while not stop.wait(1.0):
        if not all(t.is_alive() for t in threads):
            say("thread", "a worker thread of the helper died: leaving (restart it)")
            status = 1
            stop.set()
            break
        seen = helper.steer(seen)
    # Engines stop asking now.  Nothing is closed: a thread may still be inside the pool's
    # client, writing a staging buffer; the process's exit ends them all at once, and only
    # then does the kernel drop the helper's lock, so no other helper can take the ring over
    # while a transfer of this one could still land (remote/ring.c, "Crashes").
    lib.kvr_leave(h)
    for t in threads:
        t.join(timeout=2)
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
