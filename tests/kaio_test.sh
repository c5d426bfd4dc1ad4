#!/usr/bin/env bash
# Kernel AIO under LD_PRELOAD=libkvshim.so: fio's libaio engine (libaio's io_submit and
# io_getevents) and a UCM-like engine (raw syscall(), O_DIRECT, IOCB_FLAG_RESFD on an eventfd
# watched by epoll), each checked byte for byte and against the same run without the shim;
# mixed submits, io_cancel and io_destroy in flight, a rank SIGKILLed mid-read; io_uring still
# verifies with the shim loaded; two reapers that read the kernel's completion ring themselves
# (no library, and a static libaio polling with a zero timeout), 4 at once.
#   kaio_test.sh LIBKVSHIM KVSHIM UCM_AIO RING_REAPER RING_REAPER_LIBAIO [bench]
set -uo pipefail
ucm=$3
reaper=$4
reaper_libaio=$5
PREFIX=kaio
source "$(dirname "$0")/preload_lib.sh" # lib (sanitizer runtime first), work, name, ok, fail

mkdir -p "$work/kv" "$work/other"
export KVSHIM_CONFIG=
export KVSHIM_FILES_ROOTS=$work/kv
export KVSHIM_CACHE_NAME=$name
export KVSHIM_CACHE_CAPACITY=512M
export KVSHIM_CACHE_SHARD_SIZE=1M
export KVSHIM_FILES_SETTLE=0 # the files were just written

# Does the kernel do AIO here at all (and O_DIRECT on this filesystem)?
head -c $((1024 * 1024)) /dev/urandom >"$work/kv/probe"
"$ucm" read 1M "$work/kv/probe" >/dev/null 2>"$work/err"
rc=$?
if [ $rc -eq 77 ]; then
	echo "SKIP: no kernel AIO: $(head -c 200 "$work/err")"
	exit 77
elif [ $rc -ne 0 ]; then
	echo "FAIL - ucm_aio without the shim: $(head -c 300 "$work/err")"
	exit 1
fi

pinned() {
	stat_json | python3 -c 'import json,sys
try: print(json.load(sys.stdin)["region"]["slots_pinned"])
except Exception: print(0)'
}

# --- syscall() for every other number: the kernel's answer, -1 and errno as glibc sets them.
py_syscall='import ctypes,os,platform
libc=ctypes.CDLL(None,use_errno=True); libc.syscall.restype=ctypes.c_long
nr={"x86_64":(3,39),"aarch64":(57,172)}.get(platform.machine())
if not nr: print("ok"); raise SystemExit
ctypes.set_errno(0); r=libc.syscall(ctypes.c_long(nr[0]),ctypes.c_long(-1)); e=ctypes.get_errno()
ctypes.set_errno(7); p=libc.syscall(ctypes.c_long(nr[1])); e2=ctypes.get_errno()
print("ok" if (r,e,p,e2)==(-1,9,os.getpid(),7) else (r,e,p,e2))'
out=$(LD_PRELOAD=$lib python3 -c "$py_syscall" 2>&1)
[ "$out" = ok ] && ok "syscall() passes other numbers through (return, errno)" ||
	fail "syscall() pass-through: $out"

# --- fio, libaio engine ------------------------------------------------------------------
if command -v fio >/dev/null; then
	fio_size=32M
	fio_common=(--name=kv --directory="$work/kv" --size=$fio_size --bs=1M --numjobs=4
		--group_reporting --verify=crc32c)
	(cd "$work" && fio "${fio_common[@]}" --rw=write --do_verify=0 --output=/dev/null)
	fio_read() { # ENGINE OUT [FIO_ARGS...]: the read job, verifying every block; prints fio's json
		(cd "$work" && fio "${fio_common[@]}" --rw=read --direct=1 --ioengine="$1" \
			--iodepth=16 --verify_only=1 --output-format=json --output="$2" "${@:3}")
	}
	read_bytes() { # the bytes fio read (and so verified), from its json output
		python3 -c 'import json,sys
print(sum(j["read"]["io_bytes"] for j in json.load(open(sys.argv[1]))["jobs"]))' "$1"
	}
	# fio's 4 jobs share one file (its name is the job's): 4 reads of every block, which the
	# cache must take from storage once.
	unique=$(cat "$work"/kv/kv* | wc -c)
	total=$((4 * unique))
	if fio_read libaio "$work/fio.plain" 2>"$work/err" &&
		[ "$(read_bytes "$work/fio.plain")" -eq "$total" ]; then
		ok "fio libaio without the shim verifies $total bytes"
	else
		fail "fio libaio without the shim: $(head -c 300 "$work/err")"
	fi
	reset_region
	k0=$(io_read_bytes)
	if LD_PRELOAD=$lib fio_read libaio "$work/fio.shim" 2>"$work/err" && clean_err "$work/err" &&
		[ "$(read_bytes "$work/fio.shim")" -eq "$total" ]; then
		kernel=$(($(io_read_bytes) - k0))
		requests=$(totals requests)
		backend=$(totals backend_bytes)
		nf=$(ls "$work"/kv/kv* | wc -l)
		if ! storage_agrees "$kernel" "$backend" "$(totals atime_updates)" "$nf"; then
			fail "fio libaio under the shim: $storage_why"
		elif [ "$requests" -gt 0 ] && [ "$kernel" -le $((unique + unique / 100)) ]; then
			ok "fio libaio under the shim: all $total bytes verified, requests $requests," \
				"storage read $kernel bytes by the kernel's count for $unique unique, as the shim counted"
		else
			fail "fio libaio under the shim: requests $requests, storage $kernel by the kernel's count for $unique"
		fi
	else
		fail "fio libaio under the shim: $(head -c 400 "$work/err")"
	fi
	# fio's io_uring engine is not served (it sets its ring up through syscall() but enters
	# it with an inline system call: the shim never sees a submission), and must still read
	# right with the shim loaded; the ring is counted and said once when fio closes it
	# (tests/uring_test.sh has the served io_uring cases).
	if KVSHIM_SHIM_LOG=info LD_PRELOAD=$lib fio_read io_uring "$work/fio.uring" \
		--registerfiles=1 2>"$work/err" &&
		[ "$(read_bytes "$work/fio.uring")" -eq "$total" ]; then
		if [ "$(totals unserved_io_uring)" -lt 1 ]; then
			fail "fio io_uring under the shim: unserved_io_uring $(totals unserved_io_uring), want >= 1"
		elif ! grep -q "info: an io_uring whose submissions the shim could not see" "$work/err"; then
			fail "fio io_uring at info: no line saying its ring is not seen: $(grep kvshim "$work/err" | head -5)"
		else
			ok "fio io_uring under the shim verifies $total bytes; its ring, whose submissions the shim cannot see, is counted and said"
		fi
	elif grep -qi 'io_uring.*\(not supported\|Operation not permitted\|Function not impl\)' \
		"$work/err"; then
		echo "skip - io_uring is not available here"
	else
		fail "fio io_uring under the shim: $(head -c 300 "$work/err")"
	fi
else
	echo "skip - fio is not installed"
fi

# --- the UCM-like engine -------------------------------------------------------------------
files=()
for i in 0 1 2 3; do
	# Odd sizes: the last block of each file is short.
	head -c $((16 * 1024 * 1024 + i * 4096 + i * 777)) /dev/urandom >"$work/kv/ucm$i"
	files+=("$work/kv/ucm$i")
done
unique=$(cat "${files[@]}" | wc -c)
"$ucm" read 1M "${files[@]}" >"$work/want" 2>"$work/err" ||
	fail "ucm_aio without the shim: $(head -c 300 "$work/err")"
reset_region
k0=$(io_read_bytes)
pids=()
for r in $(seq 0 7); do
	LD_PRELOAD=$lib "$ucm" read 1M "${files[@]}" >"$work/out.$r" 2>"$work/err.$r" &
	pids+=($!)
done
bad=0
for r in $(seq 0 7); do
	if ! wait "${pids[$r]}" || ! cmp -s "$work/out.$r" "$work/want" || ! clean_err "$work/err.$r"; then
		bad=$((bad + 1))
		echo "  rank $r: $(head -c 300 "$work/err.$r")"
	fi
done
kernel=$(($(io_read_bytes) - k0))
backend=$(totals backend_bytes)
requests=$(totals requests)
# A short read (each file's last) is never served through a carrier (docs/design.md, "Kernel
# AIO (`api/kaio.c`)"): the kernel reads each file's tail, rounded up to 4 KiB, once for
# every rank.
tails=0
for f in "${files[@]}"; do
	t=$(($(stat -c %s "$f") % (1024 * 1024)))
	tails=$((tails + 8 * ((t + 4095) / 4096 * 4096)))
done
if [ $bad -ne 0 ]; then
	fail "UCM-like engine, 8 processes: $bad went wrong"
elif ! storage_agrees "$kernel" "$backend" "$(totals atime_updates)" ${#files[@]} "$tails"; then
	fail "UCM-like engine, 8 processes: $storage_why"
elif [ "$backend" -ne "$unique" ] || [ "$requests" -eq 0 ]; then
	fail "UCM-like engine, 8 processes: storage read $backend bytes for $unique unique," \
		"requests $requests"
else
	ok "UCM-like engine, 8 processes at once: every byte right, storage read $backend bytes" \
		"for $unique unique ($kernel by the kernel's count), requests $requests"
fi

# One submit, served and unserved iocbs alternating (a file under the roots, one outside).
head -c $((4 * 1024 * 1024 + 512)) /dev/urandom >"$work/other/outside"
before=$(totals requests)
if LD_PRELOAD=$lib "$ucm" mixed 1M "${files[1]}" "$work/other/outside" 2>"$work/err" &&
	clean_err "$work/err" && [ "$(totals requests)" -gt "$before" ]; then
	ok "one io_submit of served and unserved iocbs"
else
	fail "mixed submit: $(head -c 300 "$work/err")"
fi

# io_cancel and io_destroy with reads in flight (a cold region: they load from storage).
for what in cancel destroy; do
	reset_region
	if LD_PRELOAD=$lib "$ucm" $what 1M "${files[2]}" 2>"$work/err" && clean_err "$work/err"; then
		ok "io_$what with served reads in flight"
	else
		fail "io_$what with reads in flight: $(head -c 300 "$work/err")"
	fi
done

# SIGKILL two of eight ranks while their served reads are in flight.
reset_region
head -c $((128 * 1024 * 1024)) /dev/urandom >"$work/kv/big"
pids=()
for r in $(seq 0 7); do
	LD_PRELOAD=$lib "$ucm" loop 1M 3 "$work/kv/big" >/dev/null 2>"$work/err.$r" &
	pids+=($!)
done
sleep 0.4
kill -9 "${pids[0]}" "${pids[5]}" 2>/dev/null
wait "${pids[0]}" "${pids[5]}" 2>/dev/null
bad=0
for r in 1 2 3 4 6 7; do
	wait "${pids[$r]}" || {
		bad=$((bad + 1))
		echo "  survivor $r: $(head -c 300 "$work/err.$r")"
	}
done
LD_PRELOAD=$lib "$ucm" read 1M "$work/kv/big" >/dev/null 2>"$work/err" || bad=$((bad + 1))
p=$(pinned)
if [ $bad -eq 0 ] && [ "$p" = 0 ]; then
	ok "2 of 8 ranks SIGKILLed mid-read: the others and a late reader read right, no pin left"
else
	fail "SIGKILL mid-read: $bad readers went wrong, slots_pinned $p"
fi

# --- reapers that read the kernel's ring --------------------------------------------------
# runai-model-streamer's libaio_direct: O_DIRECT reads, many in flight, reaped by a static
# libaio's io_getevents(ctx, 0, N, ev, {0, 0}), which looks at the ring in the program's memory
# and makes no system call while it is empty.  Every served read must complete there.  4
# replicas at once on a cold region, a file whose last read is short; 120 s is a hang (the
# reaper itself gives up after 30 s without an event).
size=$((40 * 1024 * 1024 + 12 * 1024))
"$reaper" mk "$work/kv/ring" $size || fail "ring_reaper mk"
for mode in peek libaio; do
	exe=$reaper
	[ $mode = libaio ] && exe=$reaper_libaio
	out=$("$exe" $mode "$work/kv/ring" 2M 16 2>&1)
	rc=$?
	if [ $rc -eq 77 ]; then
		echo "skip - ring reaper $mode: $out"
		continue
	elif [ $rc -ne 0 ]; then
		fail "ring reaper $mode without the shim: $out"
		continue
	fi
	reset_region
	k0=$(io_read_bytes)
	pids=()
	for r in 0 1 2 3; do
		LD_PRELOAD=$lib timeout 120 "$exe" $mode "$work/kv/ring" 2M 16 >"$work/out.$r" \
			2>"$work/err.$r" &
		pids+=($!)
	done
	bad=0
	for r in 0 1 2 3; do
		if ! wait "${pids[$r]}" || ! grep -q "^$mode: 21 reads, $size bytes, right" "$work/out.$r" ||
			! clean_err "$work/err.$r"; then
			bad=$((bad + 1))
			echo "  replica $r: $(head -c 300 "$work/err.$r")"
		fi
	done
	kernel=$(($(io_read_bytes) - k0))
	backend=$(totals backend_bytes)
	hit=$(totals shards_hit)
	if [ $bad -ne 0 ]; then
		fail "ring reaper $mode, 4 replicas: $bad went wrong"
	elif ! storage_agrees "$kernel" "$backend" "$(totals atime_updates)" 1; then
		fail "ring reaper $mode, 4 replicas: $storage_why"
	elif [ "$backend" -ne $size ] || [ "$hit" -eq 0 ]; then
		fail "ring reaper $mode, 4 replicas: storage $backend bytes for $size, shards_hit $hit"
	else
		ok "ring reaper $mode, 4 replicas at once: every event in the kernel's ring, every" \
			"byte right, storage read $backend bytes for $size ($kernel by the kernel's count)"
	fi
done

# A served iocb reads as its carrier once submitted (docs/design.md, "Kernel AIO
# (`api/kaio.c`)"): one prepared once and submitted again as it is must read again, not
# write to the shim's /dev/null.
reset_region
out=$(LD_PRELOAD=$lib timeout 120 "$reaper" again "$work/kv/ring" 1M 4 2>&1)
[ "$out" = "again: 4 submissions of one iocb, right" ] &&
	ok "one iocb submitted 4 times as it is: read right each time" ||
	fail "one iocb submitted again as it is: $out"

if [ "${6:-}" = bench ]; then
	LD_PRELOAD=$lib "$ucm" bench 1M 21 "${files[0]}"
fi

echo "kaio: $fails failed"
[ $fails -eq 0 ]
