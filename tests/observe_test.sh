#!/usr/bin/env bash
# Observe mode, the figures an operator reads, and what is not served (issue 29), with 8 ranks
# of tests/kv_ranks.py under LD_PRELOAD checking every byte they read:
#   observe   shim.mode = observe on a settled store: every byte comes from storage (the
#             kernel's count is 8x the unique bytes), the cache would have read them once
#             (would_read_bytes 1.00x the unique bytes), no data frame exists (the region of
#             keys is a few MiB, and no serve region is made), `kvshim stat` says so in one
#             sentence; a second observed run would read nothing more;
#   switch    the same node switched to serve, without a reset: the first run is served at
#             once (storage read once), the next all hits;
#   unserved  buffered reads with files.buffered = false: counted with their bytes, named by
#             `kvshim stat`, and the storage figure is not a success;
#   pods      100 short-lived processes in 10 PID namespaces, then 40 in 20 more: at most 16
#             pod label values, no pid label, and no read lost from the pods' sums;
#   prom      `kvshim stat --prom` of both regions passes `promtool check metrics` (skipped
#             without promtool);
#   dashboard every metric docs/examples/grafana-kvshim.json queries is one the exporter
#             exports;
#   check     `kvshim check` names, for each root, what it can tell up front: a raw block
#             device root is a problem, a FUSE mount of 3FS (slowfs mounted as one) a note.
#   observe_test.sh LIBKVSHIM KVSHIM DASHBOARD_JSON [SLOWFS]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PREFIX=observe
source "$here/preload_lib.sh" # lib, kvshim, work, name, ok, fail
dashboard=${3:?usage: observe_test.sh LIBKVSHIM KVSHIM DASHBOARD_JSON [SLOWFS]}
slowfs=${4:-}
python3 -c 'import numpy' 2>/dev/null || {
	echo "SKIP: python3 with numpy is needed (tests/kv_ranks.py)"
	exit 77
}
ranks_py="python3 $here/kv_ranks.py"

export KVSHIM_CONFIG= KVSHIM_FILES_ROOTS=$work/kv KVSHIM_FILES_SETTLE=0 KVSHIM_CACHE_NAME=$name
export KVSHIM_CACHE_SHARD_SIZE=1M KVSHIM_CACHE_CAPACITY=160M KVSHIM_SHIM_LOG=warn
NFILES=32 SIZE=$((4 << 20))
UNIQUE=$((NFILES * SIZE)) # 128 MiB
$ranks_py write "$work/kv" $NFILES $SIZE >/dev/null || {
	echo "FAIL - cannot write the store"
	exit 1
}
serve_path=/dev/shm/kvshim.$(id -u).$name
obs_path=$serve_path.observe

# json PYTHON-EXPRESSION: evaluate it over `kvshim stat --json` (as d) of shim.mode's region.
json() {
	"$kvshim" stat --json 2>/dev/null | python3 -c 'import json,sys
d = json.load(sys.stdin)
print(eval(sys.argv[1]))' "$1" 2>/dev/null || echo none
}
# storage_of OUTPUT: the kernel's count kv_ranks.py printed ("... ok, storage S").
storage_of() { sed -n 's/.*, ok, storage \([0-9]*\).*/\1/p' <<<"$1"; }

# --- observe
export KVSHIM_SHIM_MODE=observe
: >"$work/err"
out=$(LD_PRELOAD=$lib $ranks_py load "$work/kv" $NFILES $SIZE --ranks 8 2>>"$work/err")
s=$(storage_of "$out")
if [ -z "$s" ]; then
	fail "observe: the load failed: $out $(head -c 400 "$work/err")"
else
	# The kernel's count: every rank read every byte from storage (metadata aside).
	if [ "$s" -ge $((8 * UNIQUE)) ] && [ "$s" -le $((8 * UNIQUE + 1048576)) ]; then
		ok "observe: storage read $s bytes, 8x the $UNIQUE unique"
	else
		fail "observe: storage read $s bytes, not 8x the $UNIQUE unique"
	fi
fi
clean_err "$work/err" || fail "observe: stderr: $(head -c 400 "$work/err")"
read_b=$(json 'd["totals"]["read_bytes"]')
would=$(json 'd["totals"]["would_read_bytes"]')
backend=$(json 'd["totals"]["backend_bytes"]')
[ "$read_b" = $((8 * UNIQUE)) ] && ok "observe: read_bytes is 8x the unique bytes" ||
	fail "observe: read_bytes $read_b, not $((8 * UNIQUE))"
[ "$would" = $UNIQUE ] && ok "observe: would_read_bytes is 1.00x the unique bytes" ||
	fail "observe: would_read_bytes $would, not $UNIQUE"
[ "$backend" = 0 ] && [ "$(json 'd["totals"]["copy_bytes"]')" = 0 ] &&
	ok "observe: nothing read or copied through the cache" ||
	fail "observe: backend_bytes $backend"
[ "$(json 'd["region"]["mode"]')" = observe ] || fail "observe: the region's mode is not observe"
# No data frame: the region of keys is the control plane of a 160 MiB region, a few MiB.
if [ -e "$obs_path" ]; then
	size=$(stat -c %s "$obs_path")
	used=$(($(stat -c %b "$obs_path") * $(stat -c %B "$obs_path")))
	[ "$size" -lt $((4 << 20)) ] && [ "$used" -le "$size" ] &&
		ok "observe: the region of keys is $size bytes ($used allocated) for a 160 MiB cache" ||
		fail "observe: the region of keys is $size bytes, $used allocated"
else
	fail "observe: no region at $obs_path"
fi
[ ! -e "$serve_path" ] && ok "observe: no serve region was made" ||
	fail "observe: $serve_path exists"
text=$("$kvshim" stat 2>&1)
grep -q "would have read 128.0 MiB from storage instead of 1.0 GiB: 8.0x less" <<<"$text" &&
	ok "observe: stat says it in one sentence" ||
	fail "observe: stat says: $(head -5 <<<"$text")"
pods=$(json 'len(d["pods"])')
root=$(json 'd["roots"][0]["root"] + " " + str(d["roots"][0]["reads"])')
[ "$pods" = 1 ] && [ "$root" = "$work/kv 256" ] && ok "observe: one pod, the root with its 256 reads" ||
	fail "observe: pods $pods, root $root"
[ "$(json 'd["figures"]["hit_ratio"]')" = 0.875 ] &&
	[ "$(json 'd["figures"]["storage_per_unique"]')" = 8.0 ] &&
	ok "observe: hit ratio 0.875 and 8.0 storage bytes per unique byte (would be)" ||
	fail "observe: figures $(json 'd["figures"]')"
# Warm: the cache would have had everything.
out=$(LD_PRELOAD=$lib $ranks_py load "$work/kv" $NFILES $SIZE --ranks 8 2>>"$work/err")
[ -n "$(storage_of "$out")" ] && [ "$(json 'd["totals"]["would_read_bytes"]')" = $UNIQUE ] &&
	[ "$(json 'd["totals"]["would_hit_bytes"]')" -ge $((8 * UNIQUE)) ] &&
	ok "observe: a second run would have read nothing from storage" ||
	fail "observe: second run: $out, $(json 'd["totals"]["would_read_bytes"]') would-read"

# --- switch: serve, no reset
export KVSHIM_SHIM_MODE=serve
for run in cold warm; do
	before=$(io_read_bytes)
	out=$(LD_PRELOAD=$lib $ranks_py load "$work/kv" $NFILES $SIZE --ranks 8 2>>"$work/err")
	kernel=$(($(io_read_bytes) - before))
	s=$(storage_of "$out")
	if [ -z "$s" ]; then
		fail "switch: $run: the load failed: $out $(head -c 400 "$work/err")"
		continue
	fi
	want=$UNIQUE
	[ $run = warm ] && want=0
	b=$(totals backend_bytes)
	[ $run = warm ] && b=$((b - UNIQUE))
	if storage_agrees "$kernel" "$b" 0 $NFILES && [ "$b" = $want ]; then
		ok "switch: $run serve run read $s bytes from storage ($want from the cache's count)"
	else
		fail "switch: $run serve run: storage $s, backend $b, want $want; $storage_why"
	fi
done
[ "$(json 'd["region"]["mode"]')" = serve ] && [ "$(json 'd["figures"]["hit_ratio"]')" = 0.9375 ] &&
	ok "switch: the serve region's hit ratio is 0.9375 (16 reads, one from storage)" ||
	fail "switch: figures $(json 'd["figures"]')"

# --- unserved: buffered reads go to storage (or the page cache), and say so
out=$(LD_PRELOAD=$lib $ranks_py load "$work/kv" $NFILES $SIZE --ranks 2 --buffered 2>>"$work/err")
calls=$(totals unserved_buffered)
bytes=$(totals unserved_buffered_bytes)
text=$("$kvshim" stat 2>&1)
[ "$calls" = $((2 * NFILES)) ] && [ "$bytes" = $((2 * UNIQUE)) ] &&
	grep -q "^not served 64 buffered reads (no O_DIRECT, and files.buffered = false): 256.0 MiB" <<<"$text" &&
	ok "unserved: 64 buffered reads, 256 MiB, named by stat" ||
	fail "unserved: $calls calls, $bytes bytes; stat: $(grep 'not served' <<<"$text")"

# --- pods: short-lived processes in PID namespaces of their own.  A namespace's inode number
# is reused once it is gone, as a pod's host name is not: each namespace here has a UTS
# namespace and a host name of its own, as a Kubernetes pod has, and lives until its readers
# are done.
if [ "$(id -u)" = 0 ] && unshare -p -u -f true 2>/dev/null && command -v dd >/dev/null; then
	one_ns() { # NS N: N readers of one file, one after the other, in namespace pod<NS>
		unshare -p -u -f env LD_PRELOAD="$lib" sh -c 'hostname pod'"$1"' || exit 1
			i=0; while [ $i -lt '"$2"' ]; do
			dd if='"$work/kv/blk0"' of=/dev/null bs=1M iflag=direct 2>/dev/null || exit 1
			i=$((i + 1)); done'
	}
	many_ns() { # FIRST LAST N: namespaces FIRST..LAST at once, N readers each; failures
		local pids=() bad=0
		for ns in $(seq "$1" "$2"); do
			one_ns "$ns" "$3" &
			pids+=($!)
		done
		for p in "${pids[@]}"; do wait "$p" || bad=$((bad + 1)); done
		echo $bad
	}
	# One after the other: the kernel gives them one inode number, their names tell them apart.
	for ns in 1 2 3; do one_ns "seq$ns" 1 || fail "pods: a reader in namespace seq$ns failed"; done
	seq=$(json 'sorted(p["pod"] for p in d["pods"] if p["pod"].startswith("podseq"))')
	[ "$seq" = "['podseq1', 'podseq2', 'podseq3']" ] &&
		ok "pods: 3 namespaces one after the other are 3 pods" ||
		fail "pods: 3 namespaces one after the other: $seq"
	before=$(json 'sum(p["read_bytes"] for p in d["pods"])')
	bad=$(many_ns 1 10 10)
	pods=$(json 'len([p for p in d["pods"] if p["pod"][3:].isdigit()])')
	got=$(($(json 'sum(p["read_bytes"] for p in d["pods"])') - before))
	[ "$bad" = 0 ] && [ "$pods" = 10 ] && [ "$got" = $((100 * SIZE)) ] &&
		ok "pods: 100 processes in 10 namespaces: 10 pods, every byte counted" ||
		fail "pods: $bad namespaces failed, $pods pods, $got bytes for $((100 * SIZE))"
	bad=$(many_ns 11 30 2)
	n=$(json 'len(d["pods"])')
	other=$(json '[p["reads"] for p in d["pods"] if p["pod"] == "other"][0]')
	sums=$(json 'sum(p["read_bytes"] for p in d["pods"]) == sum(r["read_bytes"] for r in d["roots"]) == d["totals"]["read_bytes"]')
	"$kvshim" stat --prom >"$work/prom" 2>&1
	labels=$(grep -c '^kvshim_pod_reads_total{' "$work/prom")
	pidl=$(grep -c 'pid="' "$work/prom")
	[ "$bad" = 0 ] && [ "$n" -le 16 ] && [ "$labels" = "$n" ] && [ "$pidl" = 0 ] &&
		[ "$sums" = True ] && [ "$other" -gt 0 ] &&
		ok "pods: 30 namespaces: $n pods ($other reads in other), no pid label, no byte lost" ||
		fail "pods: $bad failed, $n pods, $labels label sets, $pidl pid labels, other $other, sums agree: $sums"
else
	echo "skip - pods: needs root, unshare -p -u and dd"
fi

# --- prom: both regions, every new series
for mode in serve observe; do
	KVSHIM_SHIM_MODE=$mode "$kvshim" stat --prom >"$work/prom.$mode" 2>&1 ||
		fail "prom: stat --prom of the $mode region failed"
done
for fam in kvshim_hit_ratio kvshim_storage_bytes_per_unique_byte kvshim_pod_read_bytes_total \
	kvshim_root_hit_ratio kvshim_would_read_bytes_total kvshim_unserved_buffered_bytes_total; do
	grep -q "^$fam{" "$work/prom.serve" "$work/prom.observe" || fail "prom: no $fam series"
done
if command -v promtool >/dev/null; then
	for mode in serve observe; do
		promtool check metrics <"$work/prom.$mode" >"$work/promtool" 2>&1 &&
			ok "prom: the $mode region passes promtool check metrics" ||
			fail "prom: $mode: $(head -c 600 "$work/promtool")"
	done
else
	echo "skip - prom: promtool is missing (scripts/deps.sh installs it)"
fi

# --- dashboard: every metric a query names is exported
missing=$(python3 - "$dashboard" "$work/prom.serve" "$work/prom.observe" <<'PY'
import json, re, sys
dash = json.load(open(sys.argv[1]))
exported = set()
for path in sys.argv[2:]:
    for line in open(path):
        if line.startswith("# TYPE "):
            exported.add(line.split()[2])
exprs = []
def walk(o):
    if isinstance(o, dict):
        for k, v in o.items():
            if k in ("expr", "query", "definition") and isinstance(v, str):
                exprs.append(v)
            else:
                walk(v)
    elif isinstance(o, list):
        for v in o:
            walk(v)
walk(dash)
names = {n for e in exprs for n in re.findall(r"\bkvshim_[a-z0-9_]+", e)}
if not names:
    print("no query names a kvshim metric")
for n in sorted(names - exported):
    print(n)
PY
)
[ -z "$missing" ] && ok "dashboard: every metric its queries name is exported" ||
	fail "dashboard: not exported: $missing"

# --- check: what each root can be told to miss before a launch
blk=$(find /dev -maxdepth 1 -type b 2>/dev/null | head -1)
if [ -n "$blk" ]; then
	out=$(KVSHIM_FILES_ROOTS=$work/kv:$blk "$kvshim" check 2>&1)
	grep -q "problem: files.roots: $blk is a raw block device: its reads go past any shim" <<<"$out" &&
		grep -q "^ok   bypass: $work/kv (" <<<"$out" &&
		ok "check: a block device root is a problem, a directory's bypasses are listed" ||
		fail "check: $(grep -E 'bypass|block' <<<"$out")"
else
	echo "skip - check: no block device in /dev"
fi
if [ -n "$slowfs" ] && [ -x "$slowfs" ] && [ -e /dev/fuse ]; then
	mkdir -p "$work/src" "$work/mnt"
	if "$slowfs" "$work/src" "$work/mnt" -o fsname=hf3fs.test,subtype=hf3fs 2>"$work/slowfs.log"; then
		for _ in $(seq 100); do
			grep -qs " $work/mnt fuse" /proc/mounts && break
			sleep 0.05
		done
		out=$(KVSHIM_FILES_ROOTS=$work/mnt "$kvshim" check 2>&1)
		fusermount3 -u "$work/mnt" 2>/dev/null || umount -l "$work/mnt" 2>/dev/null
		grep -q "^note bypass: $work/mnt is a FUSE mount of 3FS (fuse.hf3fs, hf3fs.test)" <<<"$out" &&
			ok "check: a FUSE mount of 3FS is named, with its USRBIO rings" ||
			fail "check: 3FS: $(grep bypass <<<"$out")"
	else
		echo "skip - check: slowfs did not mount ($(head -c 200 "$work/slowfs.log"))"
	fi
else
	echo "skip - check: no FUSE (slowfs) here"
fi

[ "$fails" = 0 ] || exit 1
