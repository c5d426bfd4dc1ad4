#!/usr/bin/env python3
"""UCM's own PosixStore (the uc-manager wheel), driven as UCM's connector drives it, for
ucm_test.sh and scripts/bench_ucm.sh.  Runs under the Python the wheel is installed in (3.12).

    ucm_ranks.py dump STORE NBLOCKS [--gen G] [--first F] [--engine psync|aio]
    ucm_ranks.py load STORE NBLOCKS [--gen G] [--first F] [--engine psync|aio] [--rank R]
                 [--ready FILE --go FILE]
    ucm_ranks.py lookup STORE NBLOCKS [--first F]

The store is built as ucm/store/pipeline/connector.py's _posix_pipeline_builder builds it:
shared/metrics/libmetrics.so loaded with RTLD_GLOBAL, then
PipelineStore.Stack("Posix", store/posix/libposixstore.so, config), with UCM's defaults but
io_direct = true.  Blocks are BLOCK bytes in shards of SHARD (one tensor a shard), at
page-aligned host addresses (device_id 0: a transfer store; no CUDA call is made for host
addresses).  Block F+i of generation G holds 32-byte records (G, F+i, shard, page) repeated
over each 4 KiB page, so every byte loaded can be checked without a copy of the store.

dump: one process dumps the blocks (UCM writes each to NAME.tmp from several threads, then
renames it).  load: one rank loads every block, starting at block R (the rank's turn), checks
every byte, and says how long the load took and what the kernel read from storage for the
process meanwhile (/proc/self/io: not UCM's set-up, which walks its 4096 directories).  lookup: a scheduler-side store (device_id -1) looks every block up; UCM touches
each block it finds (utime from a worker thread): waits until every file's mtime moved.

UCM's logger writes to stdout, so results go to stderr, one line each, prefixed "ucm_ranks:".
Teardown (the store's threads joined) runs under an alarm: if it has not ended after
--teardown seconds the process is ended by SIGALRM (exit status 142 in a shell), after its
result line.  UCM's aio store can hang there: its completion thread may be blocked in
io_getevents(min_nr 1, no timeout) when the store joins it.
"""
import argparse
import array
import ctypes
import importlib
import mmap
import os
import signal
import struct
import sys
import time

SHARD = 1 << 20
BLOCK = 4 << 20
PAGE = 4096


def say(msg):
    print(f"ucm_ranks: {msg}", file=sys.stderr, flush=True)


def make_store(root, device_id, engine):
    import ucm  # noqa: F401 - the package, to find its libraries

    pkg = os.path.dirname(ucm.__file__)
    ctypes.CDLL(os.path.join(pkg, "shared/metrics/libmetrics.so"), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    mod = importlib.import_module("ucm.store.pipeline.ucmpipelinestore")
    store = mod.PipelineStore()
    config = {
        "storage_backends": [root],
        "device_id": device_id,
        "tensor_size": SHARD,
        "shard_size": SHARD,
        "block_size": BLOCK,
        "posix_io_engine": engine,
        "io_direct": True,
    }
    store.Stack("Posix", os.path.join(pkg, "store/posix/libposixstore.so"), config)
    return store


def read_bytes():
    """What the kernel has read from storage for this process: its threads, UCM's and the
    shim's (/proc/self/io)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))


def block_id(gen, i):
    return struct.pack("<QQ", 0x6B76736869D2D75, (gen << 32) | i)


def shard_bytes(gen, blk, shard):
    return b"".join(struct.pack("<QQQQ", gen, blk, shard, page) * (PAGE // 32) for page in range(SHARD // PAGE))


def plan(a):
    """The shards of a transfer, rank's turn first: ids (16 bytes each), shard indexes."""
    nshard = BLOCK // SHARD
    order = [(a.first + (a.rank + k) % a.nblocks) for k in range(a.nblocks)]
    pairs = [(b, s) for b in order for s in range(nshard)]
    ids = b"".join(block_id(a.gen, b) for b, _ in pairs)
    idx = array.array("Q", [s for _, s in pairs])
    return pairs, ids, idx


def addresses(buf, n):
    """A 2-D buffer of n rows of one address each: shard k at buf + k * SHARD."""
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    rows = array.array("Q", [base + k * SHARD for k in range(n)])
    return memoryview(rows).cast("B").cast("Q", shape=[n, 1])


def transfer(store, what, ids, idx, addrs):
    ids_view = memoryview(ids)
    task = what(ids_view, idx, addrs)
    store.Wait(task)


def teardown(store, seconds):
    """Drop the store (its destructor joins UCM's threads, holding the GIL: a Python watchdog
    thread could not run), under an alarm whose default action ends the process: SIGALRM's
    status (142 in a shell) says the teardown hung, after the result line."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(max(1, int(seconds)))
    del store


def dump(a):
    os.makedirs(a.store, exist_ok=True)
    store = make_store(a.store, 0, a.engine)
    pairs, ids, idx = plan(a)
    buf = mmap.mmap(-1, len(pairs) * SHARD)
    for k, (b, s) in enumerate(pairs):
        buf[k * SHARD : (k + 1) * SHARD] = shard_bytes(a.gen, b, s)
    t0 = time.monotonic()
    transfer(store, store.Dump, ids, idx, addresses(buf, len(pairs)))
    say(f"dump: {a.nblocks} blocks, {len(pairs) * SHARD} bytes, {time.monotonic() - t0:.3f} s")
    teardown(store, a.teardown)


def load(a):
    store = make_store(a.store, 0, a.engine)
    pairs, ids, idx = plan(a)
    buf = mmap.mmap(-1, len(pairs) * SHARD)
    addrs = addresses(buf, len(pairs))
    want = {p: shard_bytes(a.gen, *p) for p in pairs}
    if a.ready:
        open(a.ready, "w").close()
        while not os.path.exists(a.go):
            time.sleep(0.001)
    io0 = read_bytes()
    t0 = time.monotonic()
    transfer(store, store.Load, ids, idx, addrs)
    took = time.monotonic() - t0
    storage = read_bytes() - io0
    for k, p in enumerate(pairs):
        got = buf[k * SHARD : (k + 1) * SHARD]
        if got != want[p]:
            bad = next(i for i in range(SHARD) if got[i] != want[p][i])
            say(f"rank {a.rank}: block {p[0]} shard {p[1]}: wrong byte at {bad}")
            os._exit(1)
    say(f"load: rank {a.rank}, {len(pairs)} shards, {len(pairs) * SHARD} bytes, ok, {took:.3f} s, storage {storage}")
    teardown(store, a.teardown)


def lookup(a):
    store = make_store(a.store, -1, a.engine)
    pairs, ids, _ = plan(a)
    blocks = sorted({b for b, _ in pairs})
    paths = []
    for dirpath, _, files in os.walk(a.store):
        paths += [os.path.join(dirpath, f) for f in files if len(f) == 32 and f.isalnum()]  # blocks
    before = {p: os.stat(p).st_mtime_ns for p in paths}
    found = store.Lookup(memoryview(b"".join(block_id(a.gen, b) for b in blocks)))
    if not all(found):
        say(f"lookup: {sum(bool(x) for x in found)} of {len(blocks)} blocks found")
        os._exit(1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if all(os.stat(p).st_mtime_ns != m for p, m in before.items()):
            break
        time.sleep(0.01)
    moved = sum(os.stat(p).st_mtime_ns != m for p, m in before.items())
    say(f"lookup: {len(blocks)} blocks found, {moved} of {len(before)} files touched")
    teardown(store, a.teardown)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["dump", "load", "lookup"])
    p.add_argument("store")
    p.add_argument("nblocks", type=int)
    p.add_argument("--gen", type=int, default=1)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--engine", choices=["psync", "aio"], default="psync")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--ready")
    p.add_argument("--go")
    p.add_argument("--teardown", type=float, default=5.0)
    a = p.parse_args()
    {"dump": dump, "load": load, "lookup": lookup}[a.cmd](a)


if __name__ == "__main__":
    main()
