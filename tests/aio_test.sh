#!/usr/bin/env bash
# glibc POSIX aio under LD_PRELOAD=libkvshim.so: fio's posixaio engine (4 jobs reading the same
# file, every block verified) and kvshim-aio-reader (aio_read, aio_suspend, lio_listio over KV
# and non-KV files, SIGEV_SIGNAL, SIGEV_THREAD), 8 instances at once.  Output must equal the
# same run without the shim, and storage must be read once for the KV bytes.
#   aio_test.sh LIBKVSHIM KVSHIM AIO_READER
set -uo pipefail
reader=$3
PREFIX=aio
source "$(dirname "$0")/preload_lib.sh" # lib, kvshim, work, name, ok, fail

mkdir -p "$work/kv" "$work/other"
head -c $((8 * 1024 * 1024)) /dev/urandom >"$work/kv/blk"
head -c $((4 * 1024 * 1024)) /dev/urandom >"$work/other/outside"
# O_DIRECT must work where the files are (tmpfs has none).
if ! dd if="$work/kv/blk" of=/dev/null bs=1M count=1 iflag=direct status=none 2>/dev/null; then
	echo "skip - no O_DIRECT under $work"
	exit 77
fi

export KVSHIM_CONFIG=
export KVSHIM_FILES_ROOTS=$work/kv
export KVSHIM_CACHE_NAME=$name
export KVSHIM_CACHE_CAPACITY=128M
export KVSHIM_CACHE_SHARD_SIZE=1M
export KVSHIM_FILES_SETTLE=0

# stderr may hold the shim's one "attached" line and nothing else.

# --- kvshim-aio-reader, once: same digests, every check held, served.
reset_region
want=$("$reader" "$work/kv/blk" "$work/other/outside" 2>"$work/err0")
rc0=$?
got=$(LD_PRELOAD=$lib "$reader" "$work/kv/blk" "$work/other/outside" 2>"$work/err")
rc=$?
req=$(totals requests)
if [ $rc0 -ne 0 ]; then
	fail "aio_reader without the shim: $(head -c 300 "$work/err0")"
elif [ $rc -ne 0 ] || ! clean_err "$work/err"; then
	fail "aio_reader under the shim (rc $rc): $(head -c 500 "$work/err")"
elif [ "$want" != "$got" ]; then
	fail "aio_reader: output differs under the shim: $got vs $want"
elif [ "$req" -le 0 ]; then
	fail "aio_reader: the shim served nothing"
else
	ok "aio_reader: aio_read/suspend/error/return, lio_listio WAIT and NOWAIT, SIGEV_SIGNAL and SIGEV_THREAD; same bytes, $req requests served"
fi

# --- 8 instances at once on a fresh region: same output each, storage read once.
reset_region
pids=()
for r in 0 1 2 3 4 5 6 7; do
	LD_PRELOAD=$lib "$reader" "$work/kv/blk" "$work/other/outside" >"$work/out.$r" 2>"$work/err.$r" &
	pids+=($!)
done
bad=0
for p in "${pids[@]}"; do wait "$p" || bad=1; done
for r in 0 1 2 3 4 5 6 7; do
	[ "$(cat "$work/out.$r")" = "$want" ] && clean_err "$work/err.$r" || bad=1
done
unique=$(stat -c %s "$work/kv/blk")
backend=$(totals backend_bytes)
req=$(totals requests)
if [ $bad -ne 0 ]; then
	fail "8 aio_readers: some output or check differs: $(cat "$work"/err.* | head -c 500)"
elif [ "$req" -le 0 ] || [ "$backend" -ne "$unique" ]; then
	fail "8 aio_readers: storage read $backend bytes for $unique unique ($req requests)"
else
	ok "8 aio_readers at once: identical output, storage read $backend bytes for $unique unique, $req requests"
fi

# --- fio posixaio: a write job leaves crc32c headers in every 1 MiB block; 4 jobs read the
# same file at depth 16 and verify every block, with and without the shim.
if ! command -v fio >/dev/null; then
	echo "skip - fio is not installed"
else
	(cd "$work" && fio --name=w --filename="$work/kv/big" --size=32M --bs=1M --rw=write \
		--verify=crc32c --do_verify=0 --output=/dev/null)
	fio_read=(fio --name=r --filename="$work/kv/big" --size=32M --bs=1M --rw=read
		--direct=1 --ioengine=posixaio --iodepth=16 --numjobs=4 --group_reporting
		--verify=crc32c --verify_only=1 --verify_fatal=1 --output-format=json)
	summary() { # rc, bytes verified-read, errors, from fio's JSON
		python3 -c 'import json,sys
j=json.load(open(sys.argv[1])); g=j["jobs"][0]
print(sys.argv[2], g["read"]["io_bytes"], g["error"])' "$1" "$2"
	}
	(cd "$work" && "${fio_read[@]}" >"$work/fio0.json" 2>"$work/fio0.err")
	want=$(summary "$work/fio0.json" $?)
	reset_region
	k0=$(io_read_bytes)
	(cd "$work" && LD_PRELOAD=$lib "${fio_read[@]}" >"$work/fio1.json" 2>"$work/fio1.err")
	got=$(summary "$work/fio1.json" $? 2>&1)
	kernel=$(($(io_read_bytes) - k0))
	unique=$(stat -c %s "$work/kv/big")
	backend=$(totals backend_bytes)
	req=$(totals requests)
	if [ "$want" != "0 $((4 * unique)) 0" ]; then
		fail "fio posixaio without the shim: $want ($(head -c 300 "$work/fio0.err"))"
	elif [ "$got" != "$want" ] || ! clean_err "$work/fio1.err"; then
		fail "fio posixaio under the shim: $got, want $want ($(head -c 300 "$work/fio1.err"))"
	elif ! storage_agrees "$kernel" "$backend" "$(totals atime_updates)" 1; then
		fail "fio posixaio under the shim: $storage_why"
	elif [ "$req" -le 0 ] || [ "$backend" -gt $((unique + unique / 100)) ]; then
		fail "fio posixaio: storage read $backend bytes for $unique unique ($req requests)"
	else
		ok "fio posixaio 4 jobs depth 16, every block verified (rc, bytes, errors: $got); storage read $backend bytes for $unique unique, $req requests"
	fi

	# The verification can fail: a corrupted block is caught under the shim too.
	reset_region
	printf 'XXXXXXXX' | dd of="$work/kv/big" bs=1 seek=$((5 * 1048576 + 100)) conv=notrunc status=none
	(cd "$work" && LD_PRELOAD=$lib "${fio_read[@]}" --numjobs=1 >/dev/null 2>&1)
	if [ $? -ne 0 ]; then
		ok "fio posixaio under the shim catches a corrupted block"
	else
		fail "fio posixaio under the shim missed a corrupted block"
	fi
fi

echo "aio: $fails failed"
[ $fails -eq 0 ]
