#!/usr/bin/env python3
"""kvshim demo: N rank processes load the same KV blocks, without and with the shim.

Each rank loads every block the way vLLM's file tier does (os.open with O_DIRECT, os.preadv
into a page-aligned buffer), checks every byte against the manifest written with the store,
and reports its load time.  The orchestrator runs the ranks once without the shim and once
under `kvshim run`, reads `kvshim stat --json`, and prints a table.

  demo.py store  DIR NBLOCKS BLOCK_BYTES      write a KV store and its manifest
  demo.py rank   DIR                          one rank (used by `run`)
  demo.py run    DIR NRANKS KVSHIM CONFIG     both runs and the table
"""
import hashlib
import json
import mmap
import os
import subprocess
import sys
import time


def write_store(d, nblocks, block_bytes):
    os.makedirs(d, exist_ok=True)
    manifest = []
    for i in range(nblocks):
        name = "block-%05d.kv" % i
        data = os.urandom(block_bytes)
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
        manifest.append([name, len(data), hashlib.blake2b(data, digest_size=16).hexdigest()])
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    os.sync()


def rank(d):
    with open(os.path.join(d, "manifest.json")) as f:
        manifest = json.load(f)
    start_at = float(os.environ.get("DEMO_START_AT", "0"))
    biggest = max(size for _, size, _ in manifest)
    buf = mmap.mmap(-1, (biggest + 4095) // 4096 * 4096)  # page aligned for O_DIRECT
    while time.time() < start_at:
        time.sleep(0.001)
    load_s, nbytes, bad = 0.0, 0, 0
    for name, size, digest in manifest:
        t0 = time.perf_counter()
        fd = os.open(os.path.join(d, name), os.O_RDONLY | os.O_DIRECT)
        try:
            n = os.preadv(fd, [buf], 0)
        finally:
            os.close(fd)
        load_s += time.perf_counter() - t0
        nbytes += n
        if n != size or hashlib.blake2b(buf[:n], digest_size=16).hexdigest() != digest:
            bad += 1
    print(json.dumps({"load_s": load_s, "bytes": nbytes, "bad_blocks": bad}))


def run_ranks(d, nranks, prefix):
    env = dict(os.environ, DEMO_START_AT=str(time.time() + 0.5))
    t0 = time.perf_counter()
    procs = [subprocess.Popen(prefix + [sys.executable, __file__, "rank", d], env=env,
                              stdout=subprocess.PIPE) for _ in range(nranks)]
    outs = [json.loads(p.communicate()[0]) for p in procs]
    wall = time.perf_counter() - t0 - 0.5
    if any(p.returncode for p in procs):
        sys.exit("demo: a rank failed")
    return wall, outs


def stat(kvshim, config):
    out = subprocess.run([kvshim, "stat", "--json"], env=dict(os.environ, KVSHIM_CONFIG=config),
                         check=True, stdout=subprocess.PIPE).stdout
    return json.loads(out)


def run(d, nranks, kvshim, config):
    with open(os.path.join(d, "manifest.json")) as f:
        manifest = json.load(f)
    unique = sum(size for _, size, _ in manifest)
    env_cfg = dict(os.environ, KVSHIM_CONFIG=config)
    subprocess.run([kvshim, "reset", "--force"], env=env_cfg, stderr=subprocess.DEVNULL)
    wall0, outs0 = run_ranks(d, nranks, [])
    wall1, outs1 = run_ranks(d, nranks, [kvshim, "run", "--config", config, "--"])
    st = stat(kvshim, config)
    tot = st["totals"]
    bad = sum(o["bad_blocks"] for o in outs0 + outs1)
    mib = 1 << 20

    rows = [
        ("wall time (s)", "%.2f" % wall0, "%.2f" % wall1, "%.2fx faster" % (wall0 / wall1)),
        ("slowest rank's load time (s)", "%.2f" % max(o["load_s"] for o in outs0),
         "%.2f" % max(o["load_s"] for o in outs1), ""),
        ("bytes read from storage (MiB)", "%d" % (nranks * unique // mib),
         "%d" % (tot["backend_bytes"] // mib),
         "%.3fx unique" % (tot["backend_bytes"] / unique)),
        ("bytes delivered to ranks (MiB)", "%d" % (sum(o["bytes"] for o in outs0) // mib),
         "%d" % (sum(o["bytes"] for o in outs1) // mib), ""),
        ("shards loaded / waited / hit", "-", "%d / %d / %d" % (
            tot["shards_loaded"], tot["shards_waited"], tot["shards_hit"]), ""),
        ("fallbacks / failures", "-", "%d / %d" % (tot["fallbacks"], tot["failures"]), ""),
        ("blocks with wrong bytes", "%d" % sum(o["bad_blocks"] for o in outs0),
         "%d" % sum(o["bad_blocks"] for o in outs1), ""),
    ]
    print("\n%d ranks, %d blocks, %d MiB unique (O_DIRECT preadv, every byte checked)\n" %
          (nranks, len(manifest), unique // mib))
    print("%-32s %14s %16s   %s" % ("", "without kvshim", "with kvshim", "ratio"))
    for r in rows:
        print("%-32s %14s %16s   %s" % r)
    subprocess.run([kvshim, "reset", "--force"], env=env_cfg)
    if bad:
        sys.exit("demo: %d blocks came back wrong" % bad)


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "store" and len(sys.argv) == 5:
        write_store(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "rank" and len(sys.argv) == 3:
        rank(sys.argv[2])
    elif cmd == "run" and len(sys.argv) == 6:
        run(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
