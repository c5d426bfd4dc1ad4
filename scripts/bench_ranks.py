#!/usr/bin/env python3
"""The ranks sweep's table and plot (scripts/bench.sh --ranks [--plot FILE.png]).

   bench_ranks.py table TSV         print the sweep as a Markdown table
   bench_ranks.py plot TSV PNG MIB  load time against ranks, one panel per destination shape

TSV has one row per shape and rank count: the storage term (the unique bytes read once between
the ranks with O_DIRECT), the copy term (each rank copies the unique bytes out of shared memory
into its destinations), and the load's time without kvshim, with kvshim cold (an empty region
whose memory `kvshim prepare` gave it first), warm, and cold on an unprepared region ("raw":
its pages are allocated as the loads claim them) (s).  The storage term does not depend on the
shape (its reads go into one reused buffer), so each rank count's is the best over both shapes'
rounds.  A cold kvshim load is limited by max(storage, copy): the two overlap.  A warm one reads
no storage: its limit is the copy.  A fraction is limit / measured: 1 is the limit reached.
The limit has no term for the region's page allocation, so the fraction is stated for the
prepared region; the unprepared one is shown beside it.
"""
import csv
import sys


def rows(path):
    out = []
    with open(path) as f:
        for r in csv.DictReader(f, delimiter="\t"):
            for k in ("storage", "copy", "plain", "cold", "warm", "raw"):
                r[k] = float(r[k])
            r["ranks"] = int(r["ranks"])
            out.append(r)
    for r in out:
        r["storage"] = min(o["storage"] for o in out if o["ranks"] == r["ranks"])
        r["limit"] = max(r["storage"], r["copy"])
    return out


def table(path):
    print("| shape | ranks | storage (s) | copy (s) | limit (s) | no kvshim (s) | "
          "kvshim cold (s) | cold / limit | kvshim warm (s) | warm / copy | "
          "cold, unprepared (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows(path):
        shape = "one buffer reused" if r["shape"] == "reused" else "distinct per block"
        print("| %s | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f | %.3f | %.2f | %.3f |" % (
            shape, r["ranks"], r["storage"], r["copy"], r["limit"], r["plain"], r["cold"],
            r["limit"] / r["cold"], r["warm"], r["copy"] / r["warm"], r["raw"]))


def plot(path, png, mib):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = rows(path)
    shapes = [("reused", "one destination reused (ranks N --direct)"),
              ("distinct", "a destination per block (ranks N --direct --distinct)")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, (shape, title) in zip(axes, shapes):
        rs = sorted((r for r in data if r["shape"] == shape), key=lambda r: r["ranks"])
        n = [r["ranks"] for r in rs]
        ax.plot(n, [r["plain"] for r in rs], "o-", color="tab:red", label="no kvshim (cold)")
        ax.plot(n, [r["raw"] for r in rs], "s:", color="tab:purple",
                label="kvshim cold, region unprepared")
        ax.plot(n, [r["cold"] for r in rs], "s-", color="tab:blue",
                label="kvshim cold (kvshim prepare first)")
        ax.plot(n, [r["warm"] for r in rs], "^-", color="tab:green", label="kvshim warm")
        ax.plot(n, [r["limit"] for r in rs], "k--",
                label="limit, cold: max(storage, copy)")
        ax.plot(n, [r["copy"] for r in rs], "k:", label="limit, warm: copy")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("ranks")
        ax.set_xticks(n)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("load time, last rank done (s)")
    axes[0].set_ylim(bottom=0)
    axes[1].legend(fontsize=8, loc="upper left")
    fig.suptitle("%d MiB unique, 16 MiB files, O_DIRECT, best of 3 (scripts/bench.sh --ranks)"
                 % mib, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=100)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "table":
        table(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "plot":
        plot(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(__doc__)
