#!/usr/bin/env python3
"""kvshim demo: N rank processes load the same KV blocks, without and with the shim.

Each rank loads every block the way vLLM's file tier does (os.open with O_DIRECT, os.preadv
into a page-aligned buffer), checks every byte against the manifest written with the store,
and reports its load time.  The orchestrator runs the ranks once without the shim, then
prepares the region's memory with `kvshim prepare` (untimed, as each rank faults its own buffer
in before its clock starts), then runs them twice under `kvshim run`: the first run finds the
region empty, the second warm.  Then the engine touches every block (UCM's lookup:
utime(path, NULL) from a thread of a process under the shim) and the ranks load again.  Then
an engine saves a new store of the same size through the
shim (vLLM's tiering fs: an O_DIRECT write of each block to NAME.tmp, then os.replace; timed
against the same save without the shim), and the ranks load what it saved: write-through kept
it, so that reload should read nothing from storage.  With `observe`, a first run under the
shim in observe mode (KVSHIM_SHIM_MODE=observe: every read goes to storage, the shim counts
what the cache would have done) comes before all of them, as the first column.  It reads
`kvshim stat --json`, prints a table and one sentence saying what kvshim won.  Progress goes to stderr: one line rewritten in place on a terminal, a
plain line every 10% otherwise (a log file), so stdout holds only the table and the sentence.

  demo.py store  DIR NBLOCKS BLOCK_BYTES      write a KV store and its manifest
  demo.py save   DIR NBLOCKS BLOCK_BYTES      save one as an engine does (tmp + os.replace)
  demo.py touch  DIR                          touch every block as UCM's lookup does
  demo.py rank   DIR                          one rank (used by `run`)
  demo.py run    DIR NRANKS KVSHIM CONFIG SAVED [observe]
                                              the runs and the table; SAVED: where the
                                              engine saves (under the config's roots)
"""
import ctypes
import hashlib
import json
import mmap
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time


class Progress:
    """A count of done items out of total, said on stderr: on a terminal one line rewritten in
    place (a carriage return) at every step, otherwise (a log file) a plain line for the first
    step and each time another tenth is done, so a log gets at most a dozen lines."""

    def __init__(self, label, total, unit):
        self.label, self.total, self.unit = label, max(total, 1), unit
        self.tty = sys.stderr.isatty()
        self.tenth = -1
        self.width = 0

    def update(self, done, extra=""):
        line = "demo: %s: %d/%d %s%s" % (self.label, done, self.total, self.unit, extra)
        if self.tty:
            sys.stderr.write("\r" + line.ljust(self.width))
            self.width = max(self.width, len(line))
            if done >= self.total:
                sys.stderr.write("\n")
        else:
            tenth = done * 10 // self.total  # 10 only when all are done
            if tenth <= self.tenth:
                return
            self.tenth = tenth
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def human(n):
    """Bytes as GiB (from 1 GiB on) or MiB, one decimal."""
    return "%.1f GiB" % (n / (1 << 30)) if n >= 1 << 30 else "%.1f MiB" % (n / (1 << 20))


def write_store(d, nblocks, block_bytes):
    os.makedirs(d, exist_ok=True)
    manifest = []
    progress = Progress("writing the store", nblocks, "blocks")
    mib = 1 << 20
    for i in range(nblocks):
        name = "block-%05d.kv" % i
        data = os.urandom(block_bytes)
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
        manifest.append([name, len(data), hashlib.blake2b(data, digest_size=16).hexdigest()])
        progress.update(i + 1, " (%d/%d MiB)" % ((i + 1) * block_bytes // mib,
                                                 nblocks * block_bytes // mib))
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    os.sync()


def save_store(d, nblocks, block_bytes):
    """Save a store as vLLM's tiering fs saves a block: one O_DIRECT write of it to NAME.tmp,
    then os.replace; print the seconds the saving took (the data is made before the clock)."""
    os.makedirs(d, exist_ok=True)
    blocks = [os.urandom(block_bytes) for _ in range(nblocks)]
    span = (block_bytes + 4095) // 4096 * 4096
    buf = mmap.mmap(-1, span)
    manifest = []
    t0 = time.perf_counter()
    for i, data in enumerate(blocks):
        name = "block-%05d.kv" % i
        path = os.path.join(d, name)
        buf[:block_bytes] = data
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        try:
            os.pwritev(fd, [memoryview(buf)[:span]], 0)
            if span != block_bytes:
                os.ftruncate(fd, block_bytes)
        finally:
            os.close(fd)
        os.replace(path + ".tmp", path)
        manifest.append([name, block_bytes, hashlib.blake2b(data, digest_size=16).hexdigest()])
    save_s = time.perf_counter() - t0
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    print(json.dumps({"save_s": save_s}))


def touch_store(d):
    """Touch every block of the store as UCM's PosixStore does on a lookup hit: utime(path,
    NULL) from a worker thread (libc's utime, as its C++ calls it)."""
    with open(os.path.join(d, "manifest.json")) as f:
        manifest = json.load(f)
    libc = ctypes.CDLL(None, use_errno=True)
    failed = []

    def work():
        for name, _, _ in manifest:
            if libc.utime(os.path.join(d, name).encode(), None) != 0:
                failed.append(name)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    if failed:
        sys.exit("demo: utime failed on %d blocks" % len(failed))


def storage_read():
    """Bytes the kernel read from storage for this process so far (/proc/self/io)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def rank(d):
    """Load every block into its own page-aligned buffer (timed), then check them (untimed).

    Loading first and checking after keeps the check's CPU out of the figure: on a small
    machine hashing 8 ranks' bytes would otherwise dominate the wall time of both runs."""
    with open(os.path.join(d, "manifest.json")) as f:
        manifest = json.load(f)
    sync = os.environ.get("DEMO_SYNC_DIR")
    spans = [(size + 4095) // 4096 * 4096 for _, size, _ in manifest]
    buf = mmap.mmap(-1, sum(spans))
    for off in range(0, len(buf), 4096):  # fault the buffer in before the clock starts
        buf[off] = 0
    views, off = [], 0
    for span in spans:
        views.append(memoryview(buf)[off:off + span])
        off += span
    if sync:  # a barrier: say we are ready, wait for "go"
        open(os.path.join(sync, "ready.%d" % os.getpid()), "w").close()
        while not os.path.exists(os.path.join(sync, "go")):
            time.sleep(0.0005)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    io0 = storage_read()
    t0 = time.perf_counter()
    got = []
    for (name, size, _), view in zip(manifest, views):
        fd = os.open(os.path.join(d, name), os.O_RDONLY | os.O_DIRECT)
        try:
            got.append(os.preadv(fd, [view], 0))
        finally:
            os.close(fd)
    load_s = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    io1 = storage_read()
    end = time.time()
    bad = sum(1 for (_, size, digest), view, n in zip(manifest, views, got)
              if n != size or hashlib.blake2b(view[:n], digest_size=16).hexdigest() != digest)
    print(json.dumps({"load_s": load_s, "end": end, "bytes": sum(got), "bad_blocks": bad,
                      "user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime,
                      "storage": io1 - io0}))


def run_ranks(d, nranks, prefix, label):
    """Start nranks ranks, release them together once all are ready, say on stderr how many
    have finished; return (the time from release until the last rank has loaded everything,
    their reports).  A rank's report is a line of JSON, far below a pipe's capacity, so a rank
    never blocks on its stdout while we poll."""
    sync = tempfile.mkdtemp(prefix="kvshim-demo-sync.")
    env = dict(os.environ, DEMO_SYNC_DIR=sync)
    procs = [subprocess.Popen(prefix + [sys.executable, __file__, "rank", d], env=env,
                              stdout=subprocess.PIPE) for _ in range(nranks)]
    while len([n for n in os.listdir(sync) if n.startswith("ready.")]) < nranks:
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.005)
    start = time.time()
    open(os.path.join(sync, "go"), "w").close()
    progress = Progress(label, nranks, "ranks done")
    done = 0
    progress.update(0)
    while done < nranks:
        time.sleep(0.02)
        now = sum(1 for p in procs if p.poll() is not None)
        if now != done:
            done = now
            progress.update(done)
    outs = [json.loads(p.communicate()[0] or "{}") for p in procs]
    shutil.rmtree(sync)
    if any(p.returncode for p in procs):
        sys.exit("demo: a rank failed")
    return max(o["end"] for o in outs) - start, outs


def stat(kvshim, config, mode="serve"):
    out = subprocess.run([kvshim, "stat", "--json"],
                         env=dict(os.environ, KVSHIM_CONFIG=config, KVSHIM_SHIM_MODE=mode),
                         check=True, stdout=subprocess.PIPE).stdout
    return json.loads(out)


def limits(d, manifest, nranks, kvshim):
    """The two terms of the limit, measured now without kvshim by kvshim-bench-read (built
    beside kvshim): the storage reading the unique bytes once, split between the ranks, with
    O_DIRECT; and the ranks each copying the unique bytes out of shared memory.  A cold load
    overlaps them (its limit is the larger), a warm one only copies."""
    bench = os.path.join(os.path.dirname(kvshim), "kvshim-bench-read")
    mib = (sum(size for _, size, _ in manifest) + (1 << 20) - 1) >> 20

    def seconds(args):
        out = subprocess.run([bench] + args, check=True, stdout=subprocess.PIPE, text=True).stdout
        words = out.split()
        return float(words[words.index("time") + 1])

    print("demo: measuring the limit (storage once, copy) without kvshim", file=sys.stderr)
    storage = seconds(["ranks", str(nranks), "--direct", "--split"] +
                      [os.path.join(d, name) for name, _, _ in manifest])
    return storage, seconds(["copy", str(nranks), str(mib)])


def timed_save(prefix, d, nblocks, block_bytes, label):
    print("demo: %s: saving %d blocks to %s" % (label, nblocks, d), file=sys.stderr)
    out = subprocess.run(prefix + [sys.executable, __file__, "save", d, str(nblocks),
                                   str(block_bytes)], check=True, stdout=subprocess.PIPE).stdout
    return json.loads(out)["save_s"]


def run(d, nranks, kvshim, config, saved, observe=False):
    with open(os.path.join(d, "manifest.json")) as f:
        manifest = json.load(f)
    unique = sum(size for _, size, _ in manifest)
    env_cfg = dict(os.environ, KVSHIM_CONFIG=config)
    subprocess.run([kvshim, "reset", "--force"], env=env_cfg, stderr=subprocess.DEVNULL)
    storage_s, copy_s = limits(d, manifest, nranks, kvshim)
    shim = [kvshim, "run", "--config", config, "--"]
    if observe:
        # Observe mode first, as an operator tries it: every read goes to storage.
        wallo, outso = run_ranks(d, nranks, ["env", "KVSHIM_SHIM_MODE=observe"] + shim,
                                 "run 0/5 (kvshim observe)")
        to = stat(kvshim, config, "observe")["totals"]
    wall0, outs0 = run_ranks(d, nranks, [], "run 1/5 (without kvshim)")
    # The region's memory, before the clock, as the ranks' own buffers are (see rank()): an
    # operator runs `kvshim prepare` before the engines start.
    t = time.perf_counter()
    subprocess.run([kvshim, "prepare", "--config", config], check=True, stdout=sys.stderr)
    prepare_s = time.perf_counter() - t
    wall1, outs1 = run_ranks(d, nranks, shim, "run 2/5 (kvshim, region empty)")
    t1 = stat(kvshim, config)["totals"]
    # the cache outlives its processes
    wall2, outs2 = run_ranks(d, nranks, shim, "run 3/5 (kvshim, region warm)")
    t2a = stat(kvshim, config)["totals"]
    t2 = {k: t2a[k] - t1[k] for k in t2a}
    # The engine's scheduler looks the blocks up, which touches them (UCM), then the ranks load.
    print("demo: touching every block as UCM's lookup does", file=sys.stderr)
    subprocess.run(shim + [sys.executable, __file__, "touch", d], check=True)
    wallt, outst = run_ranks(d, nranks, shim, "run 4/5 (kvshim, every block touched)")
    tta = stat(kvshim, config)["totals"]
    tt = {k: tta[k] - t2a[k] for k in tta}
    # An engine saves new KV through the shim, then the ranks load it back.
    nblocks, block_bytes = len(manifest), manifest[0][1]
    save_plain_s = timed_save([], saved + "-plain", nblocks, block_bytes, "save without kvshim")
    shutil.rmtree(saved + "-plain")
    save_s = timed_save(shim, saved, nblocks, block_bytes, "save through kvshim")
    t3a = stat(kvshim, config)["totals"]
    wall3, outs3 = run_ranks(saved, nranks, shim, "run 5/5 (kvshim, after the save)")
    t3b = stat(kvshim, config)["totals"]
    t3 = {k: t3b[k] - t3a[k] for k in t3b}
    kept = t3a["write_through_bytes"] - tta["write_through_bytes"]
    bad = sum(o["bad_blocks"] for o in outs0 + outs1 + outs2 + outst + outs3 +
              (outso if observe else []))
    mib = 1 << 20

    def slowest(outs):
        return "%.2f" % max(o["load_s"] for o in outs)

    def cpu(outs):
        return "%.2f" % sum(o["user_s"] + o["sys_s"] for o in outs)

    def shards(t):
        return "%d / %d / %d" % (t["shards_loaded"], t["shards_waited"], t["shards_hit"])

    runs = [(wall0, outs0, None), (wall1, outs1, t1), (wall2, outs2, t2), (wallt, outst, tt),
            (wall3, outs3, t3)]

    def row(label, f, first="-"):
        return (label, first) + tuple(f(w, o, t) for w, o, t in runs[1:])

    def kernel(outs):
        return sum(o["storage"] for o in outs)

    rows = [
        ("wall time, all ranks loaded (s)",) + tuple("%.2f" % w for w, _, _ in runs),
        row("  speed-up over no kvshim", lambda w, o, t: "%.2fx" % (wall0 / w), ""),
        ("slowest rank's load time (s)",) + tuple(slowest(o) for _, o, _ in runs),
        ("ranks' CPU while loading (s)",) + tuple(cpu(o) for _, o, _ in runs),
        ("region memory prepared before (s)", "-", "%.2f" % prepare_s, "-", "-", "-"),
        ("the engine's save (s) [m]", "%.2f" % save_plain_s, "", "", "", "%.2f" % save_s),
        ("limit: storage once (s) [m]", "", "%.2f" % storage_s, "-", "-", "-"),
        row("limit: copy (s) [m]", lambda w, o, t: "%.2f" % copy_s, ""),
        ("  wall time / limit [c]", "", "%.2fx" % (wall1 / max(storage_s, copy_s)),
         "%.2fx" % (wall2 / copy_s), "%.2fx" % (wallt / copy_s), "%.2fx" % (wall3 / copy_s)),
        ("bytes read from storage (MiB) [k]",) +
        tuple("%d" % (kernel(o) // mib) for _, o, _ in runs),
        ("  per unique byte",) + tuple("%.3f" % (kernel(o) / unique) for _, o, _ in runs),
        row("  as kvshim counts it (MiB)", lambda w, o, t: "%d" % (t["backend_bytes"] // mib)),
        ("bytes kept at the save (MiB)", "-", "-", "-", "-", "%d" % (kept // mib)),
        ("bytes delivered to ranks (MiB)",) +
        tuple("%d" % (sum(x["bytes"] for x in o) // mib) for _, o, _ in runs),
        row("shards loaded / waited / hit", lambda w, o, t: shards(t)),
        row("fallbacks / failures",
            lambda w, o, t: "%d / %d" % (t["fallbacks"], t["failures"])),
        ("blocks with wrong bytes",) +
        tuple("%d" % sum(x["bad_blocks"] for x in o) for _, o, _ in runs),
    ]
    if observe:
        # The first column: what observe mode read, and what it said the cache would read.
        ocol = {
            "wall time, all ranks loaded (s)": "%.2f" % wallo,
            "  speed-up over no kvshim": "%.2fx" % (wall0 / wallo),
            "slowest rank's load time (s)": slowest(outso),
            "ranks' CPU while loading (s)": cpu(outso),
            "bytes read from storage (MiB) [k]": "%d" % (kernel(outso) // mib),
            "  per unique byte": "%.3f" % (kernel(outso) / unique),
            "  as kvshim counts it (MiB)": "%d [o]" % (to["would_read_bytes"] // mib),
            "bytes delivered to ranks (MiB)": "%d" % (sum(x["bytes"] for x in outso) // mib),
            "shards loaded / waited / hit": shards(to),
            "fallbacks / failures": "%d / %d" % (to["fallbacks"], to["failures"]),
            "blocks with wrong bytes": "%d" % sum(x["bad_blocks"] for x in outso),
        }
        rows = [(r[0], ocol.get(r[0], "-")) + r[1:] for r in rows]
    print("\n%d ranks, %d blocks, %d MiB unique (O_DIRECT preadv, every byte checked)\n" %
          (nranks, len(manifest), unique // mib))
    fmt = "%-34s" + (" %16s" if observe else "") + " %14s %16s %16s %16s %16s"
    head = ("", "without kvshim", "kvshim, 1st", "kvshim, 2nd", "kvshim, 3rd", "kvshim, reload")
    head2 = ("", "", "(region empty)", "(region warm)", "(all touched)", "(after a save)")
    if observe:
        head = head[:1] + ("kvshim observe",) + head[1:]
        head2 = head2[:1] + ("(nothing served)",) + head2[1:]
    print(fmt % head)
    print(fmt % head2)
    for r in rows:
        print(fmt % r)
    print("\n[k] the kernel's count (the ranks' /proc/self/io read_bytes).  [m] measured without"
          " kvshim just\nbefore (kvshim-bench-read), or timed by the saving process; [c]"
          " computed.\nThe limit of a load from an empty region is max(storage, copy): the"
          " two overlap; a warm\nload, and a reload of what was saved through kvshim, only"
          " copy.")
    if observe:
        print("[o] observe mode: what the cache would have read from storage (would_read_bytes);"
              " every byte\ncame from storage, as without kvshim.")
    # reset says what it removed: housekeeping, so stderr, and the sentence follows the table
    subprocess.run([kvshim, "reset", "--force"], env=env_cfg, stdout=sys.stderr)
    if bad:
        sys.exit("demo: %d blocks came back wrong" % bad)

    def pace(wall):
        return ("%.1fx faster" % (wall0 / wall) if wall <= wall0 else
                "%.1fx slower" % (wall / wall0))

    if observe:
        print("\nIn observe mode kvshim served nothing and said it would read %s from storage"
              " instead of %s." % (human(to["would_read_bytes"]), human(kernel(outso))))
    print("\nkvshim read %s from storage instead of %s, and the ranks loaded %s on the first"
          " run and %s with the region warm (%s after the engine touched every block, reading"
          " %s); reloading what the engine had just saved through kvshim read %s from storage,"
          " %s." %
          (human(kernel(outs1)), human(kernel(outs0)), pace(wall1), pace(wall2), pace(wallt),
           human(kernel(outst)), human(kernel(outs3)), pace(wall3)))


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "store" and len(sys.argv) == 5:
        write_store(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "rank" and len(sys.argv) == 3:
        rank(sys.argv[2])
    elif cmd == "touch" and len(sys.argv) == 3:
        touch_store(sys.argv[2])
    elif cmd == "save" and len(sys.argv) == 5:
        save_store(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "run" and len(sys.argv) in (7, 8) and sys.argv[7:] in ([], ["observe"]):
        run(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6],
            len(sys.argv) == 8)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
