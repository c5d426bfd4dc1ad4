#!/usr/bin/env bash
# Fresh KV: blocks written moments before the readers start, as engines save and reload them.
#   fresh_test.sh LIBKVSHIM KVSHIM WEDGE [SLOWFS]
# Every load checks every byte (tests/kv_ranks.py); storage is the kernel's count (the ranks'
# /proc/self/io read_bytes), which must agree with `kvshim stat`'s backend_bytes.
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
# Write-through, files saved by a writer under the shim:
#  - the four ways real clients save a block (vLLM's tiering fs, UCM's PosixStore, LMCache's
#    local disk, SGLang's file backend), and llama.cpp's stdio save (fwrite, fclose), then 8
#    ranks load them: storage at most 5%;
#  - fio saves through libaio and POSIX aio, then reads them back verifying every block;
#  - two writers racing on one file: the cache never serves the loser's bytes;
#  - a writer SIGKILLed before it is done: nothing published, no slot left staged;
#  - a save that fails with ENOSPC: nothing kept beyond what storage got;
#  - the edges (tests/wedge.c): buffers reused once lio_listio(LIO_WAIT) returns, a write no
#    hook sees between the writer's own, a file truncated and grown again, writes from
#    buffers the kernel cannot read (answers as without the shim), a fork child asking after
#    its parent's aio_write: every byte served is the byte stored.
set -uo pipefail
wedge=$3
slowfs=${4:-}
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
# The storage the kernel read for a kv_ranks load (its ranks' /proc/self/io read_bytes).
storage_of() { sed -n 's/.*storage \([0-9]*\).*/\1/p' <<<"$1"; }

# 1. Written just before, loaded twice in a row.
reset_region
n=32 size=$((4 * MiB))
ranks write "$work/kv" $n $size --shape rename
before=$(date +%s.%N)
# files.settle 30 s, not the 2 s default: the two loads must fall within one expiry even on a
# loaded machine (past it, loading again is the contract, and the figure would say nothing).
# 10 s was not enough: under the sanitizers in a slow CI run the two loads took 11.89 s.
out1=$(KVSHIM_FILES_SETTLE=30000 shim_ranks load "$work/kv" $n $size --ranks 8 2>"$work/err1") &&
	out2=$(KVSHIM_FILES_SETTLE=30000 shim_ranks load "$work/kv" $n $size --ranks 8 2>"$work/err2")
st=$?
took=$(python3 -c "import time; print(f'{time.time() - $before:.2f}')")
backend=$(totals backend_bytes)
unique=$((n * size))
kernel=$(($(storage_of "$out1") + $(storage_of "${out2:-storage 0}")))
if [ $st -ne 0 ]; then
	fail "written then loaded twice: a rank failed: $(head -c 300 "$work/err1" "$work/err2")"
elif ! storage_agrees "$kernel" "$backend" "$(totals atime_updates)" $n; then
	fail "written then loaded twice by 8 ranks: $storage_why"
elif python3 -c "import sys; sys.exit(0 if $kernel <= 1.05 * $unique else 1)"; then
	ok "written then loaded twice by 8 ranks in ${took} s: every byte right, storage $(ratio "$kernel" $unique)x the unique bytes by the kernel's count, as the shim counted"
else
	fail "written then loaded twice by 8 ranks in ${took} s: storage $(ratio "$kernel" $unique)x the unique bytes by the kernel's count (want <= 1.05)"
fi

# 2. Reads not aligned to shards: 600 KiB tensors after a 12 KiB header, on a new store.
reset_region
rm -f "$work/kv"/blk*
ranks write "$work/kv" 16 $size --shape rename --gen 2
small0=$(totals unserved_small)
out=$(shim_ranks load "$work/kv" 16 $size --gen 2 --ranks 8 --chunk $((600 * 1024)) \
	--skew $((12 * 1024)) 2>"$work/err")
st=$?
backend=$(totals backend_bytes)
asked=$(echo "$out" | sed -n 's/.* \([0-9]*\) bytes asked.*/\1/p')
kernel=$(storage_of "$out")
# The 12 KiB headers are shorter than files.min_read: read by the kernel, and counted but for
# each rank's first (read before the rank has mapped the region: the small-read rule of
# docs/design.md, "What the shim does not serve, and how it says so").
small=$(($(totals unserved_small) - small0))
if [ $st -ne 0 ] || [ -z "$asked" ]; then
	fail "unaligned reads of a fresh store: $(head -c 300 "$work/err")"
elif [ "$small" -lt $((8 * 15)) ]; then
	fail "unaligned reads of a fresh store: unserved_small moved by $small, want at least $((8 * 15)) (the headers)"
elif ! storage_agrees "$kernel" "$backend" "$(totals atime_updates)" 16 $((8 * 16 * 12 * 1024)); then
	fail "unaligned reads of a fresh store: less the $small headers of 12 KiB, $storage_why"
elif [ "$kernel" -le "$asked" ]; then
	ok "unaligned reads of a fresh store: every byte right, storage $kernel bytes by the kernel's count, as the shim counted; without the shim $asked ($(ratio "$kernel" "$asked")x)"
else
	fail "unaligned reads of a fresh store: storage $kernel bytes by the kernel's count, more than the $asked the readers read without the shim"
fi

# 3. Write-through: each real client's way of saving a block, under the shim, then 8 ranks
#    load what was saved: storage at most 5% of the unique bytes.  files.settle 30 s, as in
#    case 1: what a save keeps is kept until the save's time plus settle, and under the
#    sanitizers on a loaded machine (ctest -j2) save and load took more than the 2 s default.
for shape in tiering ucm lmcache sglang stdio; do
	reset_region
	rm -rf "$work/kv"/*
	out=""
	KVSHIM_FILES_SETTLE=30000 shim_ranks write "$work/kv" 16 $size --shape $shape --gen 6 \
		2>"$work/err" &&
		out=$(KVSHIM_FILES_SETTLE=30000 shim_ranks load "$work/kv" 16 $size --gen 6 --ranks 8 \
			2>>"$work/err")
	st=$?
	backend=$(totals backend_bytes)
	wt=$(totals write_through_bytes)
	u=$((16 * size))
	kernel=$(storage_of "$out")
	if [ $st -ne 0 ]; then
		fail "saved as $shape, then loaded: $(head -c 300 "$work/err")"
	elif ! storage_agrees "$kernel" "$backend" "$(totals atime_updates)" 16; then
		fail "saved as $shape under the shim, then loaded by 8 ranks: $storage_why"
	elif python3 -c "import sys; sys.exit(0 if $kernel <= 0.05 * $u else 1)"; then
		ok "saved as $shape under the shim, then loaded by 8 ranks: every byte right, storage $kernel bytes of $u by the kernel's count, as the shim counted ($wt kept at the save)"
	else
		fail "saved as $shape under the shim, then loaded by 8 ranks: storage $kernel bytes of $u by the kernel's count (want <= 5%); write_through_bytes $wt"
	fi
done

# 3b. fio saves through its asynchronous engines (kernel AIO through libaio, glibc's POSIX aio),
#     O_DIRECT, 4 in flight, with crc32c headers in every block; then fio reads it back with
#     the same engine, verifying every block: served without storage.
if command -v fio >/dev/null; then
	for eng in libaio posixaio; do
		reset_region
		rm -rf "$work/kv"/*
		fio_job=(fio --name=save --filename="$work/kv/fio.$eng" --size=32M --bs=1M --direct=1
			--ioengine=$eng --iodepth=4 --verify=crc32c --output-format=json)
		(cd "$work" && LD_PRELOAD=$lib "${fio_job[@]}" --rw=write --do_verify=0 \
			>"$work/fio.w" 2>"$work/err") &&
			(cd "$work" && LD_PRELOAD=$lib "${fio_job[@]}" --rw=read --verify_only=0 \
				>"$work/fio.r" 2>>"$work/err")
		st=$?
		vbytes=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["jobs"][0]["read"]["io_bytes"], j["jobs"][0]["error"])' "$work/fio.r" 2>/dev/null)
		backend=$(totals backend_bytes)
		if [ $st -ne 0 ] || [ "$vbytes" != "33554432 0" ]; then
			fail "fio $eng save then verified read: status $st, read bytes and error: $vbytes; $(head -c 300 "$work/err")"
		elif [ "$backend" -le $((32 * MiB / 20)) ]; then
			ok "fio $eng, saved under the shim then read back verifying every block: storage $backend bytes of 32 MiB ($(totals write_through_bytes) kept at the save)"
		else
			fail "fio $eng saved under the shim, then read: storage $backend bytes of 32 MiB (want <= 5%), write_through_bytes $(totals write_through_bytes)"
		fi
	done
else
	echo "skip - fio saves: fio is not installed"
fi

# 4. Two processes write the same file at once, 10 rounds: whatever the cache serves after
#    is what storage holds (never the loser's bytes).
reset_region
rm -rf "$work/kv"/*
ranks write "$work/kv" 2 $size --shape rename --gen 7
bad=0
for round in $(seq 1 10); do
	shim_ranks write "$work/kv" 2 $size --shape pieces --gen $((20 + round)) &
	a=$!
	shim_ranks write "$work/kv" 2 $size --shape pieces --gen $((40 + round)) &
	b=$!
	wait $a $b
	for f in "$work/kv"/blk0 "$work/kv"/blk1; do
		want=$(dd if="$f" bs=1M iflag=direct status=none | sha256sum)
		got=$(LD_PRELOAD=$lib dd if="$f" bs=1M iflag=direct status=none | sha256sum)
		[ "$want" = "$got" ] || bad=$((bad + 1))
	done
done
wt=$(totals write_through_bytes)
hit=$(totals shards_hit)
[ $bad = 0 ] && ok "two writers racing on one file, 10 rounds: the cache served storage's bytes every time ($wt bytes kept, $hit shards hit)" ||
	fail "two writers racing on one file: $bad of 20 reads differ from storage"

# 5. A writer SIGKILLed after its write, before it is done with the file: nothing published,
#    no slot left staged once it is reclaimed.
reset_region
rm -rf "$work/kv"/*
LD_PRELOAD=$lib python3 "$ranks_py" write "$work/kv" 1 $size --shape hold --gen 8 >"$work/hold" 2>&1 &
holder=$!
for _ in $(seq 1 200); do grep -q holding "$work/hold" && break; sleep 0.05; done
claimed=$(region slots_claimed)
kill -9 $holder
wait $holder 2>/dev/null
shim_ranks load "$work/kv" 1 $size --gen 8 --ranks 2 >/dev/null 2>"$work/err"
st=$?
if [ $st -eq 0 ] && [ "$claimed" -ge 4 ] && [ "$(region slots_claimed)" = 0 ] &&
	[ "$(totals write_through_bytes)" = 0 ] && [ "$(totals backend_bytes)" = $size ]; then
	ok "a writer SIGKILLed before it was done: $claimed slots were staged, none left, nothing published, the load read storage"
else
	fail "a writer SIGKILLed: staged $claimed, claimed after $(region slots_claimed), write_through_bytes $(totals write_through_bytes), backend_bytes $(totals backend_bytes) (want $size), load status $st"
fi

# 6. A save that fails with ENOSPC (a 12 MiB file on an 8 MiB file system): nothing kept
#    beyond what storage got, and the cache serves what storage holds.
if [ "$(id -u)" = 0 ] && command -v mkfs.ext4 >/dev/null && truncate -s 8M "$work/small.img" &&
	mkfs.ext4 -q -F "$work/small.img" >/dev/null 2>&1 && mkdir -p "$work/kv/small" &&
	mount -o loop "$work/small.img" "$work/kv/small" 2>/dev/null; then
	reset_region
	LD_PRELOAD=$lib python3 -c '
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
chunk = os.urandom(1 << 20)
try:
    for i in range(12):
        os.write(fd, chunk)
except OSError as e:
    print("write failed:", e.strerror)
os.close(fd)' "$work/kv/small/f" >"$work/enospc" 2>&1
	ondisk=$(stat -c %s "$work/kv/small/f")
	wt=$(totals write_through_bytes)
	want=$(dd if="$work/kv/small/f" bs=1M iflag=direct status=none | sha256sum)
	got=$(LD_PRELOAD=$lib dd if="$work/kv/small/f" bs=1M iflag=direct status=none | sha256sum)
	umount "$work/kv/small"
	if grep -q "write failed" "$work/enospc" && [ "$wt" -le "$ondisk" ] && [ "$want" = "$got" ]; then
		ok "a save that hit ENOSPC: $(cat "$work/enospc"); $wt bytes kept of the $ondisk on storage, served bytes right"
	else
		fail "a save that hit ENOSPC: $(cat "$work/enospc"); kept $wt, on storage $ondisk, served bytes right: $([ "$want" = "$got" ] && echo yes || echo no)"
	fi
else
	echo "skip - a save that hits ENOSPC: needs root, mkfs.ext4 and a loop device"
fi

# 7. The edges of write-through (tests/wedge.c): every byte served after the save is the byte
#    stored; the answers the program gets are those it gets without the shim; and what the
#    shim can keep, it keeps (the least kept, in bytes, after each case's name: a write no hook
#    saw, or one from a buffer the kernel could not read, leaves its file unkept).
for case in liowait:4194304 foreign:0 regrow:1048576 badwrite:0 forkaio:4194304; do
	c=${case%:*} least=${case#*:}
	rm -rf "$work/kv"/*
	want=$("$wedge" $c "$work/kv/$c" 2>&1)
	reset_region
	rm -rf "$work/kv"/*
	got=$(LD_PRELOAD=$lib "$wedge" $c "$work/kv/$c" 2>&1)
	wt=$(totals write_through_bytes)
	hit=$(totals shards_hit)
	if [ "$want" = "$got" ] && [ "$wt" -ge "$least" ]; then
		ok "write-through edge $c: as without the shim, $wt bytes kept, $hit shards hit ($(echo "$got" | tr '\n' ';' | head -c 240))"
	else
		fail "write-through edge $c: kept $wt (at least $least wanted); without the shim: $(echo "$want" | tr '\n' ';'); with it: $(echo "$got" | tr '\n' ';')"
	fi
done

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
