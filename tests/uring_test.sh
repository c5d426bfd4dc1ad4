#!/usr/bin/env bash
# io_uring reads served at submission (shim/api/uring.c, its doors shim/hooks/uring.c).
#   uring_test.sh LIBKVSHIM KVSHIM URING_READER [SLOWFS]
#  1. tests/uring_reader.c mix (liburing through the PLT: READ, READV, READ_FIXED, registered
#     files, CQE_SKIP_SUCCESS, a linked pair, a file that is not KV, reads at and past the end
#     of files that end mid-page): every completion and every buffer byte as without the shim;
#     served (requests, copy_bytes); then 8 readers at once: storage once, a warm round 0.
#  2. fio's io_uring engine (its own ring code: set-up through syscall(), enters with an inline
#     system call) with verify=crc32c, plain and with registered files and fixed buffers: every
#     block verified; not served, counted in unserved_io_uring and said once.
#  3. A ring with SQPOLL: passed through, counted, said, bytes right.
#  4. On slowfs (2 s a read): a reader SIGKILLed inside its submit, 8 reads loading: no pin
#     left.
# Skips (77) without kernel io_uring or NOP result injection (Linux 6.10).
set -uo pipefail
reader=$3
slowfs=${4:-}
PREFIX=uring
source "$(dirname "$0")/preload_lib.sh" # lib (sanitizer runtime first), work, name, ok, fail

mkdir -p "$work/kv" "$work/src" "$work/mnt"
if ! dd if=/dev/zero of="$work/kv/probe" bs=4096 count=1 oflag=direct status=none 2>/dev/null; then
	echo "SKIP: O_DIRECT does not work in $work"
	exit 77
fi
rm -f "$work/kv/probe"
for i in 0 1 2 3; do
	head -c $((3 * 1048576 + i * 4096 + (i % 2) * 5000)) /dev/urandom >"$work/kv/blk$i"
done
head -c 65536 /dev/urandom >"$work/other"
files=("$work"/kv/blk*)
unique=$(cat "${files[@]}" | wc -c)

while read -r v; do unset "$v"; done < <(compgen -e | grep '^KVSHIM_')
export KVSHIM_CONFIG=
export KVSHIM_FILES_ROOTS=$work/kv:$work/mnt
export KVSHIM_CACHE_NAME=$name
export KVSHIM_CACHE_CAPACITY=128M
export KVSHIM_CACHE_SHARD_SIZE=1M
export KVSHIM_FILES_MIN_READ=0

want=$("$reader" mix "${files[@]}" -- "$work/other" 2>&1)
st=$?
if [ $st -ne 0 ]; then
	case "$want" in
	*io_uring_queue_init*) echo "SKIP: no io_uring here: $want" && exit 77 ;;
	esac
	fail "uring_reader without the shim: exit $st, $want"
	echo "uring: $fails failed"
	exit 1
fi

# 1. Served, answers as without the shim.
reset_region
got=$(LD_PRELOAD=$lib KVSHIM_SHIM_LOG=info "$reader" mix "${files[@]}" -- "$work/other" 2>"$work/err")
if grep -q "NOP_INJECT_RESULT" "$work/err"; then
	echo "SKIP: this kernel lacks IORING_NOP_INJECT_RESULT: io_uring reads pass through"
	exit 77
fi
req=$(totals requests)
copied=$(totals copy_bytes)
if [ "$want" = "$got" ] && [ "$req" -gt 0 ] && [ "$copied" -gt $((unique / 2)) ]; then
	ok "liburing entries of every kind: every completion and byte as without the shim; $req reads served, $copied bytes from the cache"
else
	fail "liburing entries: served $req reads, $copied bytes; differences: $(diff <(echo "$want") <(echo "$got") | grep '^[<>]' | head -6 | tr '\n' ';') $(head -c 300 "$work/err")"
fi

# 1b. 8 readers at once, then a warm round: storage once, then nothing but what the shim leaves
# to the kernel, counted: each reader's READ_FIXED entries (the first NFIXBUFS = 4 of kind 2 in
# uring_reader.c's mix) and its entries that reach the end of a file.  Per reader, the entries
# and the bytes the kernel reads for them (O_DIRECT: whole blocks up to the end of the file):
read -r left_n left_bytes < <(python3 - "${files[@]}" <<'EOF2'
import os, sys
MIB, n, nbytes, nfixed = 1 << 20, 0, 0, 0
for f, path in enumerate(sys.argv[1:]):
    size = os.path.getsize(path)
    for k in range((size + MIB - 1) // MIB + 1):
        off, fixed = k * MIB, False
        if (k + f) % 5 == 2 and nfixed < 4:
            nfixed, fixed = nfixed + 1, True
        if fixed or off + MIB > size:
            n += 1
            nbytes += (min(MIB, max(0, size - off)) + 4095) // 4096 * 4096
print(n, nbytes)
EOF2
)
# The files were written a moment ago: a load within files.settle (2 s here) of their change
# is kept only that long, and a loaded machine can spread the two rounds wider than that.
sleep 2.5
reset_region
for round in cold warm; do
	b0=$(totals backend_bytes) a0=$(totals atime_updates) k0=$(io_read_bytes)
	u0=$(totals unserved_io_uring)
	pids=()
	for r in 0 1 2 3 4 5 6 7; do
		LD_PRELOAD=$lib "$reader" mix "${files[@]}" -- "$work/other" >"$work/out.$r" 2>&1 &
		pids+=($!)
	done
	bad=0
	for r in 0 1 2 3 4 5 6 7; do
		wait "${pids[$r]}" && [ "$(cat "$work/out.$r")" = "$want" ] || bad=$((bad + 1))
	done
	kernel=$(($(io_read_bytes) - k0))
	stored=$(($(totals backend_bytes) - b0))
	if [ $round = cold ]; then
		limit=$((unique * 105 / 100))
	else
		limit=0
	fi
	left=$(($(totals unserved_io_uring) - u0))
	if ! storage_agrees $((kernel - 8 * left_bytes)) "$stored" $(($(totals atime_updates) - a0)) \
		${#files[@]}; then
		fail "8 liburing readers at once, $round: less the $((8 * left_bytes)) bytes of the entries left to the kernel, $storage_why"
	elif [ "$left" -ne $((8 * left_n)) ]; then
		fail "8 liburing readers at once, $round: unserved_io_uring moved by $left, want $((8 * left_n)) (the entries left to the kernel)"
	elif [ $bad = 0 ] && [ "$stored" -le "$limit" ]; then
		ok "8 liburing readers at once, $round: every byte right, storage $stored bytes by the shim (unique $unique), the kernel's count $kernel: that and the $left entries left to it, counted"
	else
		fail "8 liburing readers at once, $round: $bad wrong, storage $stored bytes (limit $limit)"
	fi
done

# 2. fio's io_uring engine: not served (its enters are not libc's), said and counted; verified.
if command -v fio >/dev/null; then
	(cd "$work" && fio --name=w --filename="$work/kv/fio" --size=16M --bs=1M --rw=write \
		--verify=crc32c --do_verify=0 --output=/dev/null)
	for opts in "" "--registerfiles=1 --fixedbufs=1"; do
		reset_region
		LD_PRELOAD=$lib KVSHIM_SHIM_LOG=info fio --name=r --filename="$work/kv/fio" --size=16M \
			--bs=1M --rw=read --direct=1 --ioengine=io_uring --iodepth=16 $opts \
			--verify=crc32c --verify_only=1 --output=/dev/null 2>"$work/err"
		st=$?
		said=$(grep -c "submissions the shim could not see" "$work/err")
		if [ $st = 0 ] && [ "$said" = 1 ] && [ "$(totals unserved_io_uring)" -ge 1 ]; then
			ok "fio io_uring ${opts:-plain}: every block verified; not served, said once and counted"
		else
			fail "fio io_uring ${opts:-plain}: exit $st, said $said times, unserved_io_uring $(totals unserved_io_uring): $(head -c 300 "$work/err")"
		fi
	done
else
	echo "skip - fio is not installed"
fi

# 3. SQPOLL: passed through, counted and said; bytes right.
want=$("$reader" sqpoll "${files[0]}" 2>&1)
if [ $? -ne 0 ]; then
	echo "skip - a ring with SQPOLL cannot be set up here: $want"
else
	reset_region
	got=$(LD_PRELOAD=$lib KVSHIM_SHIM_LOG=info "$reader" sqpoll "${files[0]}" 2>"$work/err")
	if [ "$want" = "$got" ] && grep -q "SQPOLL" "$work/err" && [ "$(totals unserved_io_uring)" -ge 1 ] &&
		[ "$(totals requests)" = 0 ]; then
		ok "a ring with SQPOLL: passed through, counted ($(totals unserved_io_uring)) and said; every byte right"
	else
		fail "a ring with SQPOLL: $(diff <(echo "$want") <(echo "$got") | head -4 | tr '\n' ';') requests $(totals requests), unserved $(totals unserved_io_uring): $(head -c 300 "$work/err")"
	fi
fi

# 4. A reader SIGKILLed inside its submit while 8 reads load from slowfs (2 s a read).
mnt_down() {
	fusermount3 -u "$work/mnt" 2>/dev/null || umount "$work/mnt" 2>/dev/null || umount -l "$work/mnt" 2>/dev/null
}
trap 'mnt_down; cleanup' EXIT
if [ -n "$slowfs" ] && [ -x "$slowfs" ] && [ -e /dev/fuse ] &&
	head -c $((8 * 1048576)) /dev/urandom >"$work/src/slow" &&
	"$slowfs" --latency-us 2000000 "$work/src" "$work/mnt" -o max_read=1048576 2>"$work/slowfs.log"; then
	for _ in $(seq 1 100); do grep -qs " $work/mnt fuse" /proc/mounts && break; sleep 0.05; done
	reset_region
	LD_PRELOAD=$lib "$reader" hold "$work/mnt/slow" 8 >"$work/hold" 2>&1 &
	holder=$!
	for _ in $(seq 1 100); do grep -q submitting "$work/hold" && break; sleep 0.02; done
	sleep 0.3
	kill -9 $holder # first: looking at the region takes a while on a loaded machine
	wait $holder 2>/dev/null
	pinned=$(region slots_pinned) # the dead reader's, until the next attach reaps them
	# The next process to attach reaps the dead one.
	LD_PRELOAD=$lib "$reader" hold "$work/mnt/slow" 1 >/dev/null 2>&1
	left=$(region slots_pinned)
	if [ "$left" = 0 ] && ! grep -q "^submitted" "$work/hold"; then
		ok "a reader SIGKILLed inside its submit ($pinned slots pinned then): no pin left"
	else
		fail "a reader SIGKILLed inside its submit: $left slots still pinned ($pinned then), $(cat "$work/hold" | head -3 | tr '\n' ';')"
	fi
	mnt_down
else
	echo "skip - a reader killed mid-submit: no FUSE (slowfs) here"
fi

echo "uring: $fails failed"
[ $fails -eq 0 ]
