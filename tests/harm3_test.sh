#!/usr/bin/env bash
# "Never harm the host, part 3": the write path (tests/harm3.c).  Each case runs under the
# shim and, where the kernel's answer is the reference, without it: the answers must be the
# same, and every byte the cache serves afterwards the byte storage holds.
#   harm3_test.sh LIBKVSHIM KVSHIM HARM3 [SLOWFS]
# Cases that need root and a loop device (ext2's whole-second stamps), FUSE (slowfs) or a time
# namespace skip without them; the others run.
set -uo pipefail
h=$3
slowfs=${4:-}
PREFIX=harm3
source "$(dirname "$0")/preload_lib.sh" # lib (sanitizer runtime first), work, name, ok, fail

mkdir -p "$work/kv" "$work/src" "$work/mnt"
if ! dd if=/dev/zero of="$work/kv/probe" bs=4096 count=1 oflag=direct status=none 2>/dev/null; then
	echo "SKIP: O_DIRECT does not work in $work"
	exit 77
fi
rm -f "$work/kv/probe"
while read -r v; do unset "$v"; done < <(compgen -e | grep '^KVSHIM_')
export KVSHIM_CONFIG=
export KVSHIM_FILES_ROOTS=$work/kv:$work/mnt
export KVSHIM_CACHE_NAME=$name
export KVSHIM_CACHE_CAPACITY=64M
export KVSHIM_CACHE_SHARD_SIZE=1M

# HARM3_ONLY=REGEX runs only the cases whose label matches.
only() { [ -z "${HARM3_ONLY:-}" ] || [[ "$1" =~ $HARM3_ONLY ]]; }

# same LABEL CMD...: the output with the shim equals the output without it (a new region and
# new files each time).
same() {
	local label=$1 want got st
	shift
	only "$label" || return 0
	rm -rf "$work/kv"/*
	reset_region
	want=$("$@" 2>&1)
	rm -rf "$work/kv"/*
	reset_region
	got=$(LD_PRELOAD=$lib timeout 120 "$@" 2>&1)
	st=$?
	if [ $st = 0 ] && [ "$want" = "$got" ]; then
		ok "$label: as without the shim ($(echo "$got" | tr '\n' ';' | head -c 300))"
	else
		fail "$label: status $st; without the shim: $(echo "$want" | tr '\n' ';' | head -c 600); with it: $(echo "$got" | tr '\n' ';' | head -c 600)"
	fi
}

# stored LABEL FILE CMD...: under the shim, then a new process reads FILE through the cache:
# every byte served is the byte stored.
stored() {
	local label=$1 file=$2 got again st
	shift 2
	only "$label" || return 0
	rm -rf "$work/kv"/*
	reset_region
	got=$(LD_PRELOAD=$lib timeout 120 "$@" 2>&1)
	st=$?
	again=$(LD_PRELOAD=$lib timeout 60 "$h" verify "$file" 2>&1)
	if [ $st = 0 ] && [[ "$got" == *"served as stored" ]] && [[ "$again" == *"served as stored" ]]; then
		ok "$label: $(echo "$got" | tr '\n' ';' | head -c 300) (again: ${again##*: })"
	else
		fail "$label: status $st: $(echo "$got" | tr '\n' ';' | head -c 600); a new reader: $again"
	fi
}

# 1. aio writes reaped in a SIGEV_SIGNAL handler (aio_error, aio_return, close) while the main
#    thread allocates and writes: glibc alone never deadlocks, neither may the shim (before the
#    fix, about one run in two deadlocked).
if only "aio reaped in a signal handler"; then
	for run in 1 2 3 4 5; do
		rm -rf "$work/kv"/*
		reset_region
		out=$(LD_PRELOAD=$lib timeout 30 "$h" sigaio "$work/kv/sig" 20000 2>&1)
		st=$?
		[ $st = 0 ] && [[ "$out" == *"no deadlock" ]] || break
	done
	[ $st = 0 ] && [[ "$out" == *"no deadlock" ]] && ok "aio reaped in a signal handler, 5 runs: $out" ||
		fail "aio reaped in a signal handler, run $run: status $st (124: deadlocked): $out"
fi

# 2. O_APPEND: Linux appends every write, whatever offset it names.
for how in pwrite pwritev pwritev2 aio lio kaio; do
	stored "O_APPEND and an offset ($how)" "$work/kv/app" "$h" appendoff "$work/kv/app" $how
done

# 3. Append streams.
for how in a+ aseek; do
	stored "an append stream ($how)" "$work/kv/st" "$h" appendstream "$work/kv/st" $how
done

# 4. iovec and iocb arrays the kernel refuses: its answers, no crash.
same "unmapped iovec and iocb arrays" "$h" badvec "$work/kv/f"

# 8. A write far longer than its buffer: EFAULT at once, as without the shim.
same "a write of 1 << 46 bytes from a 1 MiB buffer" "$h" bigwrite "$work/kv/big"

# 12. errno after calls that succeed.
same "errno after success" "$h" errno "$work/kv/e"

# 9. A change between an asynchronous write's end and its reaping.
for how in fallocate copyrange sendfile splice pwrite8k pwrite8 truncate syscall uring kaio; do
	stored "a change before the write is reaped ($how)" "$work/kv/ch" "$h" change "$work/kv/ch" $how
done

# 10. stdio calls the shim does not hook.
for how in fputc fprintf fwrite_unlocked fputs; do
	stored "stdio: fwrite, then $how" "$work/kv/io" "$h" stdio "$work/kv/io" $how
done

# 11. Stores through a shared mapping.
stored "stores through a shared mapping around a pwrite" "$work/kv/map" "$h" mapstore "$work/kv/map"

# 7. Four writers each write 20 MiB to a file of their own and hold it open, while a reader
#    reads 16 shards again and again (a 64-slot region): staging has a bound for the node and
#    never pushes out what readers use, so the reader hits every shard on each pass.
if only "writers holding files open"; then
	rm -rf "$work/kv"/*
	reset_region
	"$h" hold "$work/kv/r" 16 >/dev/null 2>&1 & # a file of 16 MiB, written without the shim
	for _ in $(seq 1 200); do [ "$(stat -c %s "$work/kv/r" 2>/dev/null)" = 16777216 ] && break; sleep 0.05; done
	kill %1 2>/dev/null
	wait 2>/dev/null
	export KVSHIM_FILES_SETTLE=0 # its loads kept for good: only staging may take them
	LD_PRELOAD=$lib "$h" verify "$work/kv/r" >/dev/null 2>&1 # loaded: 16 shards
	holders=()
	for i in 1 2 3 4; do
		LD_PRELOAD=$lib "$h" hold "$work/kv/w$i" 20 >"$work/hold$i" 2>&1 &
		holders+=($!)
	done
	for i in 1 2 3 4; do
		for _ in $(seq 1 400); do grep -q holding "$work/hold$i" && break; sleep 0.05; done
	done
	claimed=$(region slots_claimed)
	hits=""
	for pass in 1 2 3; do
		h0=$(totals shards_hit)
		LD_PRELOAD=$lib "$h" verify "$work/kv/r" >/dev/null 2>&1
		hits="$hits $(($(totals shards_hit) - h0))"
	done
	kill "${holders[@]}" 2>/dev/null
	wait 2>/dev/null
	unset KVSHIM_FILES_SETTLE
	if [ "$hits" = " 16 16 16" ] && [ "$claimed" -le 16 ]; then
		ok "writers holding files open: $claimed of 64 slots staged, the reader hit$hits of 16"
	else
		fail "writers holding files open: $claimed of 64 slots staged (at most 16 wanted), the reader hit$hits of 16 (16 each wanted)"
	fi
fi

# Also: a writer SIGKILLed inside a write (an aio_write seen over, never reaped) leaves the
# file's write sequence busy only until it is reclaimed: the next writer's save is kept.
if only "a writer killed inside a write"; then
	rm -rf "$work/kv"/*
	reset_region
	{ # (the shell's own "Killed" line goes too)
		LD_PRELOAD=$lib timeout 60 "$h" aiokill "$work/kv/k" >/dev/null 2>&1
		st=$?
	} 2>/dev/null
	LD_PRELOAD=$lib dd if=/dev/urandom of="$work/kv/k" bs=1M count=2 status=none
	wt=$(totals write_through_bytes)
	again=$(LD_PRELOAD=$lib timeout 60 "$h" verify "$work/kv/k" 2>&1)
	if [ $st = 137 ] && [ "$wt" = 2097152 ] && [[ "$again" == *"served as stored" ]]; then
		ok "a writer killed inside a write: the next save kept ($wt bytes), $again"
	else
		fail "a writer killed inside a write (status $st): the next save kept $wt bytes (2097152 wanted); $again"
	fi
fi

# Also: the shim's probe of io_uring (a ring of 2 entries) refused by a seccomp filter: the
# thread still sees the rings it sets up and enters after through syscall() (each read it
# makes is counted as not served: the kernel said no to the probe).
if only "io_uring's probe refused"; then
	rm -rf "$work/kv"/*
	reset_region
	head -c $((1024 * 1024)) /dev/urandom >"$work/kv/u"
	out=$(LD_PRELOAD=$lib timeout 60 "$h" uringprobe "$work/kv/u" 4 2>&1)
	n=$(totals unserved_io_uring)
	if [ "$out" = "uringprobe: 4 reads, the last 1048576" ] && [ "$n" = 4 ]; then
		ok "io_uring's probe refused: $out, $n counted"
	else
		fail "io_uring's probe refused: $out; $n reads counted as not served (4 wanted)"
	fi
fi

# Also: expiries are shared times.  A reader in a time namespace whose monotonic clock runs
# 100000 s ahead loads a file written a moment ago (kept files.settle = 1 s); 1.5 s later a
# reader of the node's own namespace must find that load expired and load the file again.
if only "a time namespace"; then
	if [ "$(id -u)" = 0 ] && unshare --time --monotonic 100000 --fork true 2>/dev/null; then
		rm -rf "$work/kv"/*
		reset_region
		head -c $((4 * 1024 * 1024)) /dev/urandom >"$work/kv/t"
		KVSHIM_FILES_SETTLE=1000 unshare --time --monotonic 100000 --fork \
			env LD_PRELOAD="$lib" "$h" verify "$work/kv/t" >/dev/null 2>&1
		b1=$(totals backend_bytes)
		sleep 1.5
		out=$(KVSHIM_FILES_SETTLE=1000 LD_PRELOAD=$lib "$h" verify "$work/kv/t" 2>&1)
		b2=$(totals backend_bytes)
		expired=$(totals shards_expired)
		if [ "$b1" = 4194304 ] && [ "$b2" = 8388608 ] && [ "$expired" = 4 ]; then
			ok "a time namespace 100000 s ahead: its load expired on the node's clock ($expired shards, loaded again), $out"
		else
			fail "a time namespace 100000 s ahead: storage after each load $b1, $b2 (4194304, 8388608 wanted), $expired shards expired (4 wanted): $out"
		fi
	else
		echo "skip - a time namespace: needs root and unshare --time"
	fi
fi

# 6(b). Whole-second stamps (ext2): a file written and closed, deleted, and made again with
#       other bytes on the same inode, with the same size, in the same second: the second
#       publication must replace the first, never leave its bytes under the key.
if only "a deleted file's inode"; then
	if [ "$(id -u)" = 0 ] && command -v mkfs.ext2 >/dev/null &&
		truncate -s 64M "$work/ext2.img" && mkfs.ext2 -q -I 128 -F "$work/ext2.img" >/dev/null 2>&1 &&
		mkdir -p "$work/ext2" && mount -o loop "$work/ext2.img" "$work/ext2" 2>/dev/null; then
		reset_region
		out=$(KVSHIM_FILES_ROOTS=$work/ext2 LD_PRELOAD=$lib timeout 120 "$h" reborn "$work/ext2/f" 2>&1)
		again=$(KVSHIM_FILES_ROOTS=$work/ext2 LD_PRELOAD=$lib timeout 60 "$h" verify "$work/ext2/f" 2>&1)
		umount "$work/ext2"
		if [[ "$out" == *"the same inode, size and stamps"*"served as stored" ]] &&
			[[ "$again" == *"served as stored" ]]; then
			ok "a deleted file's inode made again in the same second: $(echo "$out" | tail -2 | tr '\n' ';')"
		else
			fail "a deleted file's inode made again in the same second: $(echo "$out" | tr '\n' ';'); a new reader: $again"
		fi
	else
		echo "skip - a deleted file's inode made again: needs root, mkfs.ext2 and a loop device"
	fi
fi

# Also: vLLM's file tier deletes a block file on any short read or error.  A reader in that
# shape (tests/harm3.c vread: 2 MiB blocks by preadv, O_DIRECT, the count checked) over slow
# storage (slowfs) must never see one where the kernel returns them all: with the region full,
# the loader failing, a waiter timing out and a dead owner.
mnt_down() {
	fusermount3 -u "$work/mnt" 2>/dev/null || umount "$work/mnt" 2>/dev/null || umount -l "$work/mnt" 2>/dev/null
}
mnt_up() { # SLOWFS_OPTIONS...
	mnt_down
	"$slowfs" "$@" "$work/src" "$work/mnt" -o max_read=1048576 2>"$work/slowfs.log" || return 1
	for _ in $(seq 1 100); do
		grep -qs " $work/mnt fuse" /proc/mounts && return 0
		sleep 0.05
	done
	return 1
}
trap 'mnt_down; cleanup' EXIT
# vreads LABEL N [ENV...]: N readers of the block file at once; every one deletes nothing.
vreads() {
	local label=$1 n=$2 bad=0 outs=""
	shift 2
	reset_region
	for i in $(seq 1 "$n"); do
		env "$@" LD_PRELOAD="$lib" timeout 120 "$h" vread "$work/mnt/blk" 2097152 \
			>"$work/vread.$i" 2>&1 &
	done
	wait
	for i in $(seq 1 "$n"); do
		grep -q "^vread: 16 blocks, 0 deleted" "$work/vread.$i" || bad=$((bad + 1))
		outs="$outs $(tr '\n' ' ' <"$work/vread.$i")"
	done
	local counts="requests $(totals requests), failures $(totals failures), fallbacks $(totals fallbacks)"
	[ $bad = 0 ] && [ "$(totals requests)" -gt 0 ] && ok "vLLM's reader, $label: $n readers deleted nothing ($counts)" ||
		fail "vLLM's reader, $label: $bad of $n readers would delete ($counts):$(echo "$outs" | head -c 600)"
}
if only "vLLM's reader"; then
	if [ -n "$slowfs" ] && [ -x "$slowfs" ] && [ -e /dev/fuse ]; then
		rm -rf "$work/src"/*
		head -c $((32 * 1024 * 1024)) /dev/urandom >"$work/src/blk"
		# The region full: 2 slots for 6 readers of 32 shards, each load 200 ms.
		mnt_up --latency-us 200000 && vreads "the region full" 6 KVSHIM_CACHE_CAPACITY=2M
		# The loader failing: every read of a thread other than the program's own is EIO.
		mnt_up --latency-us 20000 --fail-threads && vreads "the loader failing" 2
		# A waiter timing out: 100 ms of waiting for loads of 600 ms.
		mnt_up --latency-us 600000 && vreads "a waiter timing out" 2 KVSHIM_LOADER_WAIT_TIMEOUT_MS=100
		# A dead owner: the first reader SIGKILLed while it loads, the second waiting on it.
		if mnt_up --latency-us 1000000; then
			reset_region
			LD_PRELOAD=$lib "$h" vread "$work/mnt/blk" 2097152 >/dev/null 2>&1 &
			owner=$!
			sleep 0.3
			LD_PRELOAD=$lib timeout 120 "$h" vread "$work/mnt/blk" 2097152 >"$work/vread.w" 2>&1 &
			waiter=$!
			sleep 0.5
			kill -9 $owner
			{ wait $owner; } 2>/dev/null
			wait $waiter
			grep -q "^vread: 16 blocks, 0 deleted" "$work/vread.w" &&
				ok "vLLM's reader, a dead owner: the waiter deleted nothing ($(cat "$work/vread.w"), failures $(totals failures))" ||
				fail "vLLM's reader, a dead owner: $(tr '\n' ' ' <"$work/vread.w" | head -c 600)"
		fi
		mnt_down
	else
		echo "skip - vLLM's reader: no FUSE (slowfs) here"
	fi
fi

echo "harm3: $fails failed"
[ $fails -eq 0 ]
