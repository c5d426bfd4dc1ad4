#!/usr/bin/env bash
# Fresh KV: blocks written moments before the readers start, as engines save and reload them.
#   fresh_test.sh LIBKVSHIM KVSHIM SLOWFS
# Every load checks every byte (tests/kv_ranks.py); the figures are `kvshim stat` totals.
#  1. A store written by a process not under the shim, loaded twice in a row by 8 ranks
#     within a second: storage at most 1.05x the unique bytes (shards of files younger than
#     files.settle are kept until their expiry).
#  2. The same with reads that are not aligned to shards (llama.cpp's tensor reads): never
#     more storage bytes than the same readers read without the shim.
#  3. On FUSE (slowfs), stamps written by a clock 10 s behind this node's: a file written a
#     moment ago looks old, yet its first load is kept only until files.settle, then loaded
#     once more (judged by this node's clock), then kept for good.
#  4. On FUSE with a 30 s attribute cache, a file rewritten behind the client's back keeps its
#     old identity: with files.revalidate = 1000 a read 1.2 s after the load returns the new
#     bytes (without it, the old ones: the case the key exists for).
# Cases 3 and 4 skip without FUSE.
set -uo pipefail
slowfs=${3:-}
PREFIX=fresh
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
export KVSHIM_FILES_ROOTS=$work/kv:$work/mnt
export KVSHIM_CACHE_NAME=$name
export KVSHIM_CACHE_CAPACITY=512M
export KVSHIM_CACHE_SHARD_SIZE=1M

ranks() { python3 "$ranks_py" "$@"; }
shim_ranks() { LD_PRELOAD=$lib python3 "$ranks_py" "$@"; }
ratio() { python3 -c "print(f'{$1 / $2:.3f}')"; }

# 1. Written just before, loaded twice in a row.
reset_region
n=32 size=$((4 * MiB))
ranks write "$work/kv" $n $size --shape rename
before=$(date +%s.%N)
out1=$(shim_ranks load "$work/kv" $n $size --ranks 8 2>"$work/err1") &&
	out2=$(shim_ranks load "$work/kv" $n $size --ranks 8 2>"$work/err2")
st=$?
took=$(python3 -c "import time; print(f'{time.time() - $before:.2f}')")
backend=$(totals backend_bytes)
unique=$((n * size))
if [ $st -ne 0 ]; then
	fail "written then loaded twice: a rank failed: $(head -c 300 "$work/err1" "$work/err2")"
elif python3 -c "import sys; sys.exit(0 if $backend <= 1.05 * $unique else 1)"; then
	ok "written then loaded twice by 8 ranks in ${took} s: every byte right, storage $(ratio "$backend" $unique)x the unique bytes"
else
	fail "written then loaded twice by 8 ranks in ${took} s: storage $(ratio "$backend" $unique)x the unique bytes (want <= 1.05)"
fi

# 2. Reads not aligned to shards: 600 KiB tensors after a 12 KiB header, on a new store.
reset_region
rm -f "$work/kv"/blk*
ranks write "$work/kv" 16 $size --shape rename --gen 2
out=$(shim_ranks load "$work/kv" 16 $size --gen 2 --ranks 8 --chunk $((600 * 1024)) \
	--skew $((12 * 1024)) 2>"$work/err")
st=$?
backend=$(totals backend_bytes)
asked=$(echo "$out" | sed -n 's/.* \([0-9]*\) bytes asked.*/\1/p')
if [ $st -ne 0 ] || [ -z "$asked" ]; then
	fail "unaligned reads of a fresh store: $(head -c 300 "$work/err")"
elif [ "$backend" -le "$asked" ]; then
	ok "unaligned reads of a fresh store: every byte right, storage $backend bytes, without the shim $asked ($(ratio "$backend" "$asked")x)"
else
	fail "unaligned reads of a fresh store: storage $backend bytes, more than the $asked the readers read without the shim"
fi

# FUSE cases: slowfs over $work/src, mounted at $work/mnt.
mnt_up() { # SLOWFS_OPTIONS...
	mkdir -p "$work/src" "$work/mnt"
	"$slowfs" "$@" "$work/src" "$work/mnt" -o max_read=1048576 2>"$work/slowfs.log" || return 1
	for _ in $(seq 1 100); do
		grep -qs " $work/mnt fuse" /proc/mounts && return 0
		sleep 0.05
	done
	return 1
}
mnt_down() {
	fusermount3 -u "$work/mnt" 2>/dev/null || umount "$work/mnt" 2>/dev/null || umount -l "$work/mnt" 2>/dev/null
}
trap 'mnt_down; cleanup' EXIT
fuse_ok=1
if [ -z "$slowfs" ] || [ ! -x "$slowfs" ] || [ ! -e /dev/fuse ]; then
	fuse_ok=0
fi

# 3. Another machine's clock: stamps 10 s behind.
if [ $fuse_ok = 1 ] && mnt_up --skew-ms 10000; then
	reset_region
	rm -f "$work/src"/*
	ranks write "$work/src" 4 $size --shape rename --gen 3
	export KVSHIM_FILES_SETTLE=1500
	shim_ranks load "$work/mnt" 4 $size --gen 3 --ranks 2 >/dev/null 2>"$work/err" &&
		b1=$(totals backend_bytes) &&
		sleep 1.6 &&
		shim_ranks load "$work/mnt" 4 $size --gen 3 --ranks 2 >/dev/null 2>>"$work/err" &&
		b2=$(totals backend_bytes) &&
		shim_ranks load "$work/mnt" 4 $size --gen 3 --ranks 2 >/dev/null 2>>"$work/err" &&
		b3=$(totals backend_bytes)
	st=$?
	unset KVSHIM_FILES_SETTLE
	u=$((4 * size))
	expired=$(totals shards_expired)
	if [ $st -ne 0 ]; then
		fail "stamps 10 s behind: a load failed: $(head -c 300 "$work/err")"
	elif [ "$b1" -eq $u ] && [ "$b2" -eq $((2 * u)) ] && [ "$b3" -eq $((2 * u)) ] &&
		[ "$expired" -gt 0 ]; then
		ok "stamps 10 s behind: first load kept until files.settle by this node's clock, loaded once more, then kept ($expired shards expired)"
	else
		fail "stamps 10 s behind: storage after each load $b1, $b2, $b3 (want $u, $((2 * u)), $((2 * u))), shards_expired $expired"
	fi
	mnt_down
else
	echo "skip - stamps of another clock: no FUSE (slowfs) here"
fi

# 4. A 30 s attribute cache hides a rewrite: files.revalidate.
if [ $fuse_ok = 1 ] && mnt_up --attr-timeout 30; then
	for reval in 0 1000; do
		reset_region
		rm -f "$work/src"/*
		ranks write "$work/src" 2 $size --shape rename --gen 4
		export KVSHIM_FILES_SETTLE=0 KVSHIM_FILES_REVALIDATE=$reval
		shim_ranks load "$work/mnt" 2 $size --gen 4 --ranks 2 >/dev/null 2>"$work/err"
		ranks write "$work/src" 2 $size --shape inplace --gen 5 # behind the client's back
		sleep 1.2
		shim_ranks load "$work/mnt" 2 $size --gen 5 --ranks 1 >/dev/null 2>"$work/err5"
		got5=$?
		shim_ranks load "$work/mnt" 2 $size --gen 4 --ranks 1 >/dev/null 2>/dev/null
		got4=$?
		unset KVSHIM_FILES_SETTLE KVSHIM_FILES_REVALIDATE
		# Without the shim, the reader gets the new bytes (direct_io: data is not cached).
		ranks load "$work/mnt" 2 $size --gen 5 --ranks 1 >/dev/null 2>&1
		plain=$?
		if [ $plain -ne 0 ]; then
			fail "attribute cache, revalidate $reval: without the shim the new bytes were not read"
		elif [ $reval = 0 ] && [ $got4 -eq 0 ]; then
			ok "attribute cache of 30 s, files.revalidate = 0: the old bytes are served (the reason for the key)"
		elif [ $reval = 1000 ] && [ $got5 -eq 0 ] && [ "$(totals shards_expired)" -gt 0 ]; then
			ok "attribute cache of 30 s, files.revalidate = 1000: a read 1.2 s after the load returns the new bytes"
		else
			fail "attribute cache, revalidate $reval: new bytes $got5, old bytes $got4 (0 = read), expired $(totals shards_expired): $(head -c 300 "$work/err5")"
		fi
	done
	mnt_down
else
	echo "skip - attribute caches: no FUSE (slowfs) here"
fi

echo "fresh: $fails failed"
[ $fails -eq 0 ]
