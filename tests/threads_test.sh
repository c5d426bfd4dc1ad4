#!/usr/bin/env bash
# Reads from many threads that each open their own descriptor per read (UCM's psync engine:
# open(O_DIRECT), one 1 MiB read, close, from 128 threads), and what a number means after its
# close.  Storage is the kernel's count (/proc/PID/io read_bytes of the readers).
#   threads_test.sh LIBKVSHIM KVSHIM
#  1. One process, 1, 8 and 128 threads, on a warm region, 3 rounds of 8 passes over the
#     files each: 0 bytes from storage (but the shim's atime reads), every read served
#     (requests moves by the number of reads), nothing unserved.
#     Before the anchors' lock was waited for, 8 and 128 threads read 1-7 MiB a round from
#     storage that no counter showed.
#  2. 8 ranks of 128 threads each, cold, 5 runs (the region reset before each): storage at
#     most 1.05x the unique bytes, and what the shim counted (backend_bytes) is what the
#     kernel read.
#  3. A KV file's descriptor number reused by a pipe and by /proc/self/io: their small reads
#     count nothing in unserved_small; a small read of the KV file itself counts one.
set -uo pipefail
PREFIX=threads
source "$(dirname "$0")/preload_lib.sh" # lib (sanitizer runtime first), work, name, ok, fail
ranks_py="$(dirname "$0")/kv_ranks.py"
MiB=1048576

python3 -c 'import numpy' 2>/dev/null || {
	echo "SKIP: numpy is missing (python3 -m pip install numpy)"
	exit 77
}
mkdir -p "$work/kv"
if ! dd if=/dev/zero of="$work/kv/probe" bs=4096 count=1 oflag=direct status=none 2>/dev/null; then
	echo "SKIP: O_DIRECT does not work in $work"
	exit 77
fi
rm -f "$work/kv/probe"

while read -r v; do unset "$v"; done < <(compgen -e | grep '^KVSHIM_')
export KVSHIM_CONFIG=
export KVSHIM_FILES_ROOTS=$work/kv
export KVSHIM_CACHE_NAME=$name
# The default capacity: 1 GiB for 64 MiB of blocks.  Every cold miss claims a frame before it
# knows whether another thread claimed one for the same shard; with 1024 threads missing at
# once, a much smaller region can be all claimed, and a miss then evicts (see the report of
# issue 30).
export KVSHIM_CACHE_CAPACITY=1G
export KVSHIM_CACHE_SHARD_SIZE=1M

ratio() { python3 -c "print(f'{$1 / $2:.3f}')"; }
unserved() { # the sum of every unserved_* total
	stat_json | python3 -c 'import json,sys
try: t = json.load(sys.stdin)["totals"]; print(sum(v for k, v in t.items() if k.startswith("unserved_")))
except Exception: print(0)'
}

n=16 size=$((4 * MiB))
unique=$((n * size))
python3 "$ranks_py" write "$work/kv" $n $size --shape rename
sleep 2.5 # settled (files.settle is 2 s on a local file system)

# 1. One process, many threads, warm.
reset_region
LD_PRELOAD=$lib python3 "$ranks_py" load "$work/kv" $n $size --ranks 1 >/dev/null 2>"$work/err" ||
	fail "warming the region: $(head -c 300 "$work/err")"
for threads in 1 8 128; do
	k0=$(io_read_bytes) r0=$(totals requests) u0=$(unserved)
	b0=$(totals backend_bytes) a0=$(totals atime_updates)
	bad=""
	for round in 1 2 3; do
		LD_PRELOAD=$lib python3 "$ranks_py" load "$work/kv" $n $size --ranks 1 \
			--threads $threads --chunk $MiB --repeat 8 >/dev/null 2>"$work/err" ||
			bad="round $round: $(head -c 300 "$work/err")"
	done
	kernel=$(($(io_read_bytes) - k0))
	served=$(($(totals requests) - r0))
	left=$(($(unserved) - u0))
	reads=$((3 * 8 * unique / MiB))
	if [ -n "$bad" ]; then
		fail "$threads threads, warm: $bad"
	elif ! storage_agrees "$kernel" $(($(totals backend_bytes) - b0)) \
		$(($(totals atime_updates) - a0)) $n; then
		fail "$threads threads, open/preadv 1 MiB/close, warm, 3 x 8 passes: $storage_why"
	elif [ "$(($(totals backend_bytes) - b0))" -ne 0 ] || [ "$served" -ne $reads ] ||
		[ "$left" -ne 0 ]; then
		fail "$threads threads, open/preadv 1 MiB/close, warm, 3 x 8 passes: storage $kernel bytes by the kernel's count, $served of $reads reads served, $left unserved"
	else
		ok "$threads threads, open/preadv 1 MiB/close, warm, 3 x 8 passes: $kernel bytes from storage by the kernel's count (atime and metadata), all $reads reads served, every byte right"
	fi
done

# 2. 8 ranks of 128 threads, cold, 5 runs.
worst=0 bad=""
for run in 1 2 3 4 5; do
	reset_region
	k0=$(io_read_bytes)
	if ! LD_PRELOAD=$lib python3 "$ranks_py" load "$work/kv" $n $size --ranks 8 \
		--threads 128 --chunk $MiB >/dev/null 2>"$work/err"; then
		bad="run $run: $(head -c 300 "$work/err")"
		break
	fi
	kernel=$(($(io_read_bytes) - k0))
	if ! storage_agrees "$kernel" "$(totals backend_bytes)" "$(totals atime_updates)" $n; then
		bad="run $run: $storage_why"
		break
	fi
	[ "$kernel" -gt "$worst" ] && worst=$kernel
done
if [ -n "$bad" ]; then
	fail "8 ranks x 128 threads, cold: $bad"
elif [ $((worst * 100)) -gt $((unique * 105)) ]; then
	fail "8 ranks x 128 threads, cold, 5 runs: storage up to $(ratio "$worst" $unique)x the unique bytes by the kernel's count (want <= 1.05)"
else
	ok "8 ranks x 128 threads, open/preadv 1 MiB/close, cold, 5 runs: storage at most $(ratio "$worst" $unique)x the unique bytes by the kernel's count, as the shim counted, every byte right"
fi

# 3. A number's KV hint ends at its close.
reset_region
u0=$(totals unserved_small)
if ! LD_PRELOAD=$lib python3 - "$work/kv/blk0" <<'EOF' 2>"$work/err"; then
import mmap, os, sys
path = sys.argv[1]
buf = mmap.mmap(-1, 1 << 20)
def kv_read():
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    os.preadv(fd, [buf], 0)  # served: the number is known as a KV file
    os.close(fd)
    return fd
fd = kv_read()
r, w = os.pipe()  # the lowest free numbers: the KV file's, again
assert fd in (r, w), (fd, r, w)
os.write(w, b"x" * 100)
os.read(r, 100)  # a small read of a pipe on a number that was a KV file's
os.close(r)
os.close(w)
fd2 = kv_read()
assert fd2 == fd
io = os.open("/proc/self/io", os.O_RDONLY)
assert io == fd, (io, fd)
os.read(io, 4096)  # a small read of /proc/self/io on it
os.close(io)
EOF
	fail "the number reused by a pipe and /proc/self/io: $(head -c 300 "$work/err")"
fi
small=$(($(totals unserved_small) - u0))
LD_PRELOAD=$lib python3 -c '
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 1 << 20)
os.preadv(fd, [buf], 0)  # served: the region is mapped
os.preadv(fd, [memoryview(buf)[:4096]], 0)  # small: passed through, counted' "$work/kv/blk0" 2>/dev/null
small_kv=$(($(totals unserved_small) - u0 - small))
if [ "$small" -eq 0 ] && [ "$small_kv" -eq 1 ]; then
	ok "a KV file's number reused by a pipe and by /proc/self/io: their small reads count nothing in unserved_small; a small read of the KV file counts 1"
else
	fail "a KV file's number reused: unserved_small moved by $small for a pipe and /proc/self/io (want 0), by $small_kv for the KV file itself (want 1)"
fi

echo "threads: $fails failed"
[ $fails -eq 0 ]
