#!/usr/bin/env python3
"""Read KV files into host memory through NVIDIA NIXL's POSIX backend and check every byte.

usage: nixl_reader.py [--api aio|uring|posixaio] [--depth N] [--block BYTES] [--direct] FILE...

Each FILE is opened with os.open(O_RDONLY [| O_DIRECT]) and read whole, file -> DRAM, by NIXL
(package nixl_cu13) into one page-aligned numpy buffer per file, in blocks of --block bytes
(default 4 MiB).  NIXL calls made:
  nixl_agent(name, nixl_agent_config(enable_prog_thread=False, backends=[]))
  agent.get_plugin_list()                      -- is the POSIX plugin there at all
  agent.create_backend("POSIX", params)        -- params picks the I/O method:
      aio -> {"use_aio": "true"} (libaio io_submit, NIXL's default)
      uring -> {"use_uring": "true"} (io_uring)   posixaio -> {"use_posix_aio": "true"} (glibc aio_read)
    plus "kernel_queue_size" (NIXL default 256, range 16..1024) raised to --depth if larger.
    These names come from agent.get_plugin_params("POSIX"), which also lists ios_pool_size.
  agent.register_memory([(0, len, fd, "")], "FILE") and ([(addr, len, 0, "")], "DRAM")
    -- FILE descriptors are fd-mode: devId = fd, addr = file offset (metaInfo "" so NIXL
       does not take it for a "<modes>:<path>" path-mode string and open the file itself).
  agent.prep_xfer_dlist("NIXL_INIT_AGENT", Nx3 DRAM descs) and
  agent.prep_xfer_dlist(agent.name, Nx3 FILE descs)  -- one row per block, loopback
  agent.make_prepped_xfer("READ", dram, [i], file, [i]) -- ONE transfer request per block i;
  agent.transfer(h) / agent.check_xfer_state(h) / h.release() -- the script keeps up to
    --depth (default 64) such requests posted at once, refilling as they complete; each poll
    of any request lets the backend reap completions from its shared queue.
With --direct, buffers are 4096-aligned and --block must be a multiple of 4096.  A file's
short last block can NOT be rounded up to 4096: this NIXL (1.5.1) fails the whole transfer
when any read completes short ("an io completed short or with an error"), which a read
past EOF always does.  So the last block is split: its 4096-aligned head is read through
the O_DIRECT fd and the tail (size % 4096 bytes) through a second, buffered fd of the same
file that is also registered as FILE memory -- every byte still comes through NIXL.
After NIXL finishes, every file is read again with os.pread on a new descriptor opened
WITHOUT O_DIRECT and compared byte for byte with the buffer (buffers start filled with 0xA5
so a read that never landed cannot pass by chance on zeroed memory).
stdout: exactly "nixl: N files, B bytes, api A, ok" (exit 0) or "SKIP: <why>" (exit 77, the
method or NIXL's POSIX plugin is unavailable); anything NIXL itself prints goes to stderr.
"MISMATCH FILE at OFFSET" on stderr -> exit 1; any other failure -> message on stderr, exit 2.
"""
import argparse
import logging
import os
import sys
import time

import numpy as np

ALIGN = 4096
PARAMS = {"aio": "use_aio", "uring": "use_uring", "posixaio": "use_posix_aio"}
OUT = os.dup(1)      # the one result line goes here; NIXL's own output goes to stderr
os.dup2(2, 1)


def result(line, rc):
    os.write(OUT, (line + "\n").encode())
    sys.exit(rc)


def fail(msg):
    print(f"nixl_reader: {msg}", file=sys.stderr)
    sys.exit(2)


def up(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def read_bytes():
    """What the kernel has read from storage for this process (its threads, the shim's too)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))


def main():
    ap = argparse.ArgumentParser(description="read files via NIXL POSIX and verify")
    ap.add_argument("--api", choices=list(PARAMS), default="aio")
    ap.add_argument("--depth", type=int, default=64)
    ap.add_argument("--block", type=int, default=4 << 20)
    ap.add_argument("--direct", action="store_true")
    ap.add_argument("files", nargs="+", metavar="FILE")
    a = ap.parse_args()
    if a.depth < 1 or a.block < 1:
        fail("--depth and --block must be positive")
    if a.direct and a.block % ALIGN:
        fail(f"--direct needs --block to be a multiple of {ALIGN}")

    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    try:
        from nixl_cu13._api import nixl_agent, nixl_agent_config
    except ImportError as e:
        result(f"SKIP: cannot import nixl_cu13: {e}", 77)
    logging.getLogger("nixl").setLevel(logging.WARNING)

    agent = nixl_agent("kvshim-nixl-reader",
                       nixl_agent_config(enable_prog_thread=False, backends=[]))
    if "POSIX" not in agent.get_plugin_list():
        result("SKIP: NIXL has no POSIX plugin", 77)
    known = agent.get_plugin_params("POSIX")
    if PARAMS[a.api] not in known:
        result(f"SKIP: POSIX plugin has no {PARAMS[a.api]} parameter", 77)
    params = {PARAMS[a.api]: "true"}
    if "kernel_queue_size" in known:
        params["kernel_queue_size"] = str(min(1024, max(int(known["kernel_queue_size"]), a.depth)))
    try:
        agent.create_backend("POSIX", params)
    except Exception as e:
        result(f"SKIP: NIXL POSIX backend with {params} unavailable: {e}", 77)
    bk = ["POSIX"]

    flags = os.O_RDONLY | (os.O_DIRECT if a.direct else 0)
    files = []                                # (path, fd, size, buffer, tail fd or None)
    for path in a.files:
        try:
            fd = os.open(path, flags)
        except OSError as e:
            fail(f"open {path}: {e}")
        size = os.fstat(fd).st_size
        cap = max(up(size), ALIGN)
        raw = np.empty(cap + ALIGN, dtype=np.uint8)
        skip = -raw.ctypes.data % ALIGN
        buf = raw[skip:skip + cap]
        buf.fill(0xA5)
        tfd = os.open(path, os.O_RDONLY) if a.direct and size % ALIGN else None
        files.append((path, fd, size, buf, tfd))

    live = [f for f in files if f[2] > 0]     # empty files: nothing to transfer
    file_reg = dram_reg = None
    local, remote = [], []
    for path, fd, size, buf, tfd in live:
        for off in range(0, size, a.block):
            n = min(a.block, size - off)
            if tfd is not None and off + n == size:
                n -= size % ALIGN             # aligned head here, tail below
            if n:
                local.append((buf.ctypes.data + off, n, 0))
                remote.append((off, n, fd))
        if tfd is not None:
            local.append((buf.ctypes.data + size - size % ALIGN, size % ALIGN, 0))
            remote.append((size - size % ALIGN, size % ALIGN, tfd))
    handles = []
    try:
        if live:
            regs = [(0, len(f[3]), f[1], "") for f in live]
            regs += [(0, f[2], f[4], "") for f in live if f[4] is not None]
            file_reg = agent.register_memory(regs, "FILE", backends=bk)
            dram_reg = agent.register_memory([(f[3].ctypes.data, len(f[3]), 0, "") for f in live],
                                             "DRAM", backends=bk)
            lh = agent.prep_xfer_dlist("NIXL_INIT_AGENT", np.array(local, dtype=np.uint64),
                                       "DRAM", backends=bk)
            rh = agent.prep_xfer_dlist(agent.name, np.array(remote, dtype=np.uint64),
                                       "FILE", backends=bk)
            handles = [lh, rh]
        nxt, inflight = 0, []
        io0 = read_bytes()
        while nxt < len(local) or inflight:
            while nxt < len(local) and len(inflight) < a.depth:
                h = agent.make_prepped_xfer("READ", lh, [nxt], rh, [nxt], backends=bk)
                st = agent.transfer(h)
                if st == "ERR":
                    fail(f"posting block {nxt} failed")
                inflight.append((nxt, h))
                nxt += 1
            still = []
            for i, h in inflight:
                st = agent.check_xfer_state(h)
                if st == "ERR":
                    fail(f"transfer of block {i} ({remote[i][1]} bytes at {remote[i][0]}) failed")
                if st == "DONE":
                    h.release()
                else:
                    still.append((i, h))
            if len(still) == len(inflight):
                time.sleep(0.0001)
            inflight = still
        storage = read_bytes() - io0
        for h in handles:
            h.release()
        for reg in (file_reg, dram_reg):
            if reg is not None:
                agent.deregister_memory(reg, backends=bk)
    except SystemExit:
        raise
    except Exception as e:
        fail(f"NIXL error: {type(e).__name__}: {e}")
    for f in files:
        os.close(f[1])
        if f[4] is not None:
            os.close(f[4])

    bad = False
    for path, _, size, buf, _ in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            off = 0
            while off < size:
                data = os.pread(fd, min(16 << 20, size - off), off)
                if not data:
                    fail(f"{path}: short plain read at {off} (file shrank?)")
                diff = np.flatnonzero(np.frombuffer(data, np.uint8) != buf[off:off + len(data)])
                if diff.size:
                    print(f"MISMATCH {path} at {off + int(diff[0])}", file=sys.stderr)
                    bad = True
                    break
                off += len(data)
        finally:
            os.close(fd)
    if bad:
        sys.exit(1)
    # The storage the transfers made the kernel read (not the checks' buffered reads above).
    print(f"nixl_reader: storage {storage}", file=sys.stderr)
    result(f"nixl: {len(files)} files, {sum(f[2] for f in files)} bytes, api {a.api}, ok", 0)


if __name__ == "__main__":
    main()
