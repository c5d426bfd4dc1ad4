#!/usr/bin/env python3
"""KV blocks written and loaded the way engines do, for the tests of fresh KV (fresh_test.sh).

    kv_ranks.py write DIR NFILES SIZE [--gen G] [--shape SHAPE] [--prefix P]
    kv_ranks.py load DIR NFILES SIZE [--gen G] [--ranks N] [--chunk BYTES] [--skew BYTES]
                [--buffered] [--prefix P] [--stagger SEC] [--threads T [--repeat R]]
    kv_ranks.py touch DIR NFILES SIZE [--how utime|atime] [--prefix P]

Every file P<i> holds 64-bit words: word w of file i, generation G is
(G << 56) | (i << 36) | w, so any byte read can be checked without a reference copy.

write: one process writes the NFILES files of SIZE bytes in the shape of a real client,
--pace SEC apart:
  tiering  vLLM's tiering fs: one O_DIRECT write of the block to NAME.tmp, then os.replace
  ucm      UCM's PosixStore: 256 KiB pwrites to NAME.tmp, fsync, rename
  lmcache  LMCache's local disk: one buffered write under the final name
  sglang   SGLang's file backend: buffered writes of 64 KiB pieces under the final name
  rename   (the default) a buffered write to NAME.tmp, close, rename: another process's save
  inplace  an O_DIRECT rewrite in place, same size (the identity may not change)
  truncate a rewrite as open(path, "wb") does it: O_TRUNC, then 1 MiB writes
  pieces   a rewrite in place in 256 KiB pwrites (two writers racing on one file)
  stdio    llama.cpp's slot save: libc's fopen, a 100-byte header fwrite, then 600 KiB
           fwrites, fclose
  hold     the tiering write, then sleeps with the file open (a writer killed before it is
           done: prints "holding" once written)

load: N ranks (forked processes, started together) each read every file with O_DIRECT preadv
into page-aligned buffers (--buffered: without O_DIRECT), rank r starting at file r, in
reads of --chunk bytes (default the whole file) from offset --skew (default 0; the bytes
before it are read first as one read), so that reads need not be aligned to the cache's
shards, as llama.cpp's tensor reads are not.  Rank r starts r * --stagger seconds after the
first.  With --threads T, each rank runs T threads that take its reads from one queue, and
every read opens the file, reads, and closes it (UCM's psync engine); --repeat R reads it all
R times.  A rank stays --linger seconds after its reads before it exits (os._exit, which runs
no exit handlers), as an engine lives on after a load.  Every byte is checked.  Prints "load: N ranks, F files, B bytes asked, ok, storage S"
where S is the sum of the ranks' /proc/self/io read_bytes over their loads (what the kernel
read from storage for them); exits 1 on a wrong byte (stderr says where).

touch: a thread of this process touches every file the way engines do, and exits:
  utime   UCM's PosixStore lookup: utime(path, NULL) from a worker thread (libc's utime)
  atime   llm-d's fs backend: futimens(fd, {UTIME_NOW, UTIME_OMIT}) on an open descriptor
          (atime only; ctime moves)
"""
import argparse
import ctypes
import mmap
import os
import sys
import threading
import time

import numpy as np

PAGE = 4096


def pattern(gen, i, off, n):
    """The n bytes of file i, generation gen, from offset off (a multiple of 8)."""
    w0 = off // 8
    words = np.arange(w0, w0 + (n + 7) // 8, dtype=np.uint64)
    words |= np.uint64((gen << 56) | (i << 36))
    return words.view(np.uint8)[:n]


def aligned(n):
    return mmap.mmap(-1, max(PAGE, (n + PAGE - 1) // PAGE * PAGE))


def write_files(a):
    os.makedirs(a.dir, exist_ok=True)
    for i in range(a.nfiles):
        if i and a.pace:
            time.sleep(a.pace)
        path = os.path.join(a.dir, f"{a.prefix}{i}")
        data = pattern(a.gen, i, 0, a.size).tobytes()
        shape = a.shape
        if shape == "tiering":
            tmp = path + ".tmp"
            buf = aligned(a.size)
            buf[: a.size] = data
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
            n = (a.size + PAGE - 1) // PAGE * PAGE
            os.pwritev(fd, [memoryview(buf)[:n]], 0)
            if n != a.size:
                os.ftruncate(fd, a.size)  # the O_DIRECT write was rounded up to a page
            os.close(fd)
            os.replace(tmp, path)
        elif shape == "ucm":
            tmp = path + ".tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            for off in range(0, a.size, 256 << 10):
                os.pwrite(fd, data[off : off + (256 << 10)], off)
            os.fsync(fd)
            os.close(fd)
            os.rename(tmp, path)
        elif shape == "lmcache":
            with open(path, "wb") as f:
                f.write(data)
        elif shape == "sglang":
            with open(path, "wb") as f:
                for off in range(0, a.size, 64 << 10):
                    f.write(data[off : off + (64 << 10)])
        elif shape == "rename":
            tmp = path + ".tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.rename(tmp, path)
        elif shape == "stdio":
            libc = ctypes.CDLL(None, use_errno=True)
            libc.fopen.restype = ctypes.c_void_p
            libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
            libc.fwrite.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
            libc.fclose.argtypes = [ctypes.c_void_p]
            fp = libc.fopen(path.encode(), b"wb")
            if not fp:
                sys.exit(f"kv_ranks: fopen {path}: errno {ctypes.get_errno()}")
            pieces = [(0, min(100, a.size))] + [(o, min(600 << 10, a.size - o)) for o in range(100, a.size, 600 << 10)]
            for off, n in pieces:
                if libc.fwrite(data[off : off + n], 1, n, fp) != n:
                    sys.exit(f"kv_ranks: fwrite {path}: errno {ctypes.get_errno()}")
            if libc.fclose(fp) != 0:
                sys.exit(f"kv_ranks: fclose {path}: errno {ctypes.get_errno()}")
        elif shape == "pieces":
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            for off in range(0, a.size, 256 << 10):
                os.pwrite(fd, data[off : off + (256 << 10)], off)
            os.close(fd)
        elif shape == "hold":
            buf = aligned(a.size)
            buf[: a.size] = data
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
            os.pwritev(fd, [memoryview(buf)[: (a.size + PAGE - 1) // PAGE * PAGE]], 0)
            print("holding", flush=True)
            time.sleep(600)
        elif shape == "truncate":
            with open(path, "wb") as f:  # O_TRUNC of the file there, then 1 MiB writes
                for off in range(0, a.size, 1 << 20):
                    f.write(data[off : off + (1 << 20)])
                    f.flush()
        elif shape == "inplace":
            buf = aligned(a.size)
            buf[: a.size] = data
            fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
            os.pwritev(fd, [memoryview(buf)[: (a.size + PAGE - 1) // PAGE * PAGE]], 0)
            os.close(fd)
        else:
            sys.exit(f"kv_ranks: unknown shape {shape}")


def read_range(fd, buf, off, n, direct):
    """Read n bytes at off into buf (O_DIRECT: a whole number of pages); return bytes got."""
    want = (n + PAGE - 1) // PAGE * PAGE if direct else n
    return os.preadv(fd, [memoryview(buf)[:want]], off)


def storage_bytes():
    """What the kernel read from storage for this process so far (/proc/self/io)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def touch(a):
    libc = ctypes.CDLL(None, use_errno=True)
    errors = []

    class Timespec(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

    UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2

    def work():
        for i in range(a.nfiles):
            path = os.path.join(a.dir, f"{a.prefix}{i}")
            if a.how == "utime":
                r = libc.utime(path.encode(), None)
            else:
                fd = os.open(path, os.O_RDONLY)
                ts = (Timespec * 2)(Timespec(0, UTIME_NOW), Timespec(0, UTIME_OMIT))
                r = libc.futimens(fd, ts)
                os.close(fd)
            if r != 0:
                errors.append(f"{path}: errno {ctypes.get_errno()}")

    t = threading.Thread(target=work)
    t.start()
    t.join()
    if errors:
        sys.exit("kv_ranks: touch: " + "; ".join(errors[:3]))
    print(f"touch: {a.nfiles} files ({a.how})")


def pieces_of(a):
    """The (offset, length) reads of one file: the skew first, then chunks."""
    chunk = a.chunk or a.size
    pieces = []
    if a.skew:
        pieces.append((0, min(a.skew, a.size)))
    off = a.skew or 0
    while off < a.size:
        pieces.append((off, min(chunk, a.size - off)))
        off += chunk
    return pieces


def check_piece(a, rank, path, i, buf, off, n, got):
    if got < n:
        print(f"kv_ranks: rank {rank}: {path} at {off}: {got} of {n} bytes", file=sys.stderr)
        os._exit(1)
    have = np.frombuffer(buf, dtype=np.uint8, count=n)
    want = pattern(a.gen, i, off, n)
    if not np.array_equal(have, want):
        bad = int(np.nonzero(have != want)[0][0])
        print(f"kv_ranks: rank {rank}: {path}: wrong byte at {off + bad}", file=sys.stderr)
        os._exit(1)


def load_threads(a, rank, flags):
    """--threads T: UCM's psync engine's shape.  T threads take the rank's reads from one
    queue (files from file rank on, in order), and each read opens the file, reads its piece
    into the thread's buffer, and closes it."""
    jobs = [((rank + k) % a.nfiles, off, n) for k in range(a.nfiles) for off, n in pieces_of(a)]
    jobs = jobs * a.repeat
    jobs.reverse()
    lock = threading.Lock()
    # The bytes each read must return, made before the threads start: checking a read is then
    # a copy and a memcmp, short beside the read, so the threads' opens, reads and closes
    # overlap as a C engine's do (numpy's check holds the GIL 10 times longer).
    want = {(i, off): pattern(a.gen, i, off, n).tobytes() for i, off, n in jobs}

    def work():
        buf = aligned(max(a.chunk or a.size, a.skew or 0) + PAGE)
        while True:
            with lock:
                if not jobs:
                    return
                i, off, n = jobs.pop()
            path = os.path.join(a.dir, f"{a.prefix}{i}")
            fd = os.open(path, flags)
            try:
                got = read_range(fd, buf, off, n, not a.buffered)
            finally:
                os.close(fd)
            if got != n or buf[:n] != want[(i, off)]:
                check_piece(a, rank, path, i, buf, off, n, got)  # says where, exits

    threads = [threading.Thread(target=work) for _ in range(a.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return a.repeat * sum(n for _ in range(a.nfiles) for _, n in pieces_of(a))


def load_rank(a, rank, go):
    flags = os.O_RDONLY | (0 if a.buffered else os.O_DIRECT)
    chunk = a.chunk or a.size
    buf = aligned(max(chunk, a.skew or 0) + PAGE)
    asked = 0
    while go[0] == 0:  # start together
        time.sleep(0.0005)
    if a.stagger:
        time.sleep(rank * a.stagger)
    if a.threads:
        return load_threads(a, rank, flags)
    for k in range(a.nfiles):
        i = (rank + k) % a.nfiles
        path = os.path.join(a.dir, f"{a.prefix}{i}")
        fd = os.open(path, flags)
        for off, n in pieces_of(a):
            got = read_range(fd, buf, off, n, not a.buffered)
            asked += n
            check_piece(a, rank, path, i, buf, off, n, got)
        os.close(fd)
    return asked


def load(a):
    go = mmap.mmap(-1, PAGE)
    done = mmap.mmap(-1, PAGE)
    asked = np.frombuffer(done, dtype=np.uint64, count=2 * a.ranks)
    pids = []
    for r in range(a.ranks):
        pid = os.fork()
        if pid == 0:
            try:
                b0 = storage_bytes()
                asked[r] = load_rank(a, r, go)
                asked[a.ranks + r] = storage_bytes() - b0
                time.sleep(a.linger)
                os._exit(0)
            except SystemExit as e:
                print(e, file=sys.stderr)
                os._exit(1)
            except BaseException as e:  # noqa: BLE001 - report anything, fail the rank
                print(f"kv_ranks: rank {r}: {e!r}", file=sys.stderr)
                os._exit(1)
        pids.append(pid)
    time.sleep(0.05)
    go[0] = 1
    bad = 0
    for pid in pids:
        _, st = os.waitpid(pid, 0)
        bad += st != 0
    if bad:
        sys.exit(1)
    print(
        f"load: {a.ranks} ranks, {a.nfiles} files, {int(asked[: a.ranks].sum())} bytes asked, ok, "
        f"storage {int(asked[a.ranks :].sum())}"
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["write", "load", "touch"])
    p.add_argument("dir")
    p.add_argument("nfiles", type=int)
    p.add_argument("size", type=int)
    p.add_argument("--gen", type=int, default=1)
    p.add_argument("--shape", default="rename")
    p.add_argument("--prefix", default="blk")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--chunk", type=int, default=0)
    p.add_argument("--skew", type=int, default=0)
    p.add_argument("--buffered", action="store_true")
    p.add_argument("--stagger", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--pace", type=float, default=0.0)
    p.add_argument("--linger", type=float, default=0.0)
    p.add_argument("--how", choices=["utime", "atime"], default="utime")
    a = p.parse_args()
    if a.cmd == "write":
        write_files(a)
    elif a.cmd == "touch":
        touch(a)
    else:
        load(a)


if __name__ == "__main__":
    main()
