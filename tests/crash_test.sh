#!/usr/bin/env bash
# Ranks killed mid-load, end to end: six readers load the same files from slow storage (the
# slowfs FUSE file system) under LD_PRELOAD; two are SIGKILLed while they own loads.  The
# survivors must return the right bytes without waiting out loader.wait_timeout_ms, a reader
# that starts afterwards must too, and no pin may be left behind.
#   crash_test.sh LIBKVSHIM KVSHIM SLOWFS
set -uo pipefail
lib=${KVS_E2E_PRELOAD:+$KVS_E2E_PRELOAD:}$1
kvshim=$2
slowfs=$3
name="crash-$$"
work=$(mktemp -d /var/tmp/kvshim-crash.XXXXXX)
mnt=$work/mnt
fs_pid=
cleanup() {
	mountpoint -q "$mnt" 2>/dev/null && fusermount3 -u "$mnt" 2>/dev/null
	[ -n "$fs_pid" ] && kill "$fs_pid" 2>/dev/null
	KVSHIM_CONFIG= KVSHIM_CACHE_NAME=$name "$kvshim" reset --force >/dev/null 2>&1
	rm -rf "$work"
}
trap cleanup EXIT

if [ ! -x "$slowfs" ] || [ ! -w /dev/fuse ] || ! command -v fusermount3 >/dev/null; then
	echo "SKIP: slowfs or FUSE is unavailable here"
	exit 77
fi
mkdir -p "$work/src" "$mnt"
for i in $(seq 1 24); do head -c $((2 * 1024 * 1024)) /dev/urandom >"$work/src/f$i"; done
"$slowfs" --latency-us 40000 "$work/src" "$mnt" -f &
fs_pid=$!
for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.05; done
if ! mountpoint -q "$mnt"; then
	echo "SKIP: slowfs did not mount"
	exit 77
fi

export KVSHIM_CONFIG=
export KVSHIM_FILES_ROOTS=$mnt
export KVSHIM_CACHE_NAME=$name
export KVSHIM_CACHE_CAPACITY=128M
export KVSHIM_CACHE_SHARD_SIZE=256K
export KVSHIM_LOADER_IO_DEPTH=2
export KVSHIM_LOADER_PREFETCH=off

reader='import os,sys,mmap,hashlib
b=mmap.mmap(-1,2<<20)
for p in sorted(sys.argv[1:], key=lambda p: int(p.rsplit("f",1)[1])):
    fd=os.open(p,os.O_RDONLY|os.O_DIRECT); n=os.preadv(fd,[b],0); os.close(fd)
    print(os.path.basename(p), hashlib.sha256(b[:n]).hexdigest(), flush=True)'
files=("$mnt"/f*)
(cd "$work/src" && for i in $(seq 1 24); do echo "f$i $(sha256sum <"f$i" | cut -d' ' -f1)"; done) >"$work/want"

start=$(date +%s%N)
pids=()
for r in 0 1 2 3 4 5; do
	LD_PRELOAD=$lib python3 -c "$reader" "${files[@]}" >"$work/out.$r" 2>"$work/err.$r" &
	pids+=($!)
done
# Kill them mid-load: once each has loaded a few files, and before it has loaded them all.
for _ in $(seq 400); do
	[ "$(wc -l <"$work/out.0")" -ge 3 ] && [ "$(wc -l <"$work/out.3")" -ge 3 ] && break
	sleep 0.01
done
for r in 0 3; do
	n=$(wc -l <"$work/out.$r")
	if [ "$n" -lt 3 ] || [ "$n" -ge 24 ]; then
		echo "SKIP: rank $r was not mid-load when it was to be killed ($n files)"
		exit 77
	fi
done
kill -9 "${pids[0]}" "${pids[3]}" 2>/dev/null
wait "${pids[0]}" "${pids[3]}" 2>/dev/null
fails=0
for r in 1 2 4 5; do
	wait "${pids[$r]}" || { echo "FAIL - survivor $r exited $?: $(head -c 300 "$work/err.$r")"; fails=$((fails + 1)); }
	cmp -s "$work/out.$r" "$work/want" || { echo "FAIL - survivor $r returned wrong bytes"; fails=$((fails + 1)); }
done
ms=$((($(date +%s%N) - start) / 1000000))
# A wait for a dead owner would add loader.wait_timeout_ms (30 s): deaths must be noticed
# within a second or so (the liveness check runs every 50 ms of waiting).
if [ "$ms" -gt 20000 ]; then
	echo "FAIL - survivors took $ms ms: someone waited for a dead owner"
	fails=$((fails + 1))
else
	echo "ok   - 4 survivors of 2 killed ranks returned the right bytes in $ms ms"
fi
LD_PRELOAD=$lib timeout 120 python3 -c "$reader" "${files[@]}" >"$work/out.late" 2>/dev/null
cmp -s "$work/out.late" "$work/want" && echo "ok   - a reader after the crash returns the right bytes" ||
	{ echo "FAIL - a reader after the crash returned wrong bytes"; fails=$((fails + 1)); }
"$kvshim" stat --json | python3 -c 'import json,sys
t=json.load(sys.stdin)["totals"]
print("info - loads failed by owner death or error: %d, shards read past the cache: %d"
      % (t["failures"], t["fallbacks"]))'
pinned=$("$kvshim" stat --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["region"]["slots_pinned"])')
if [ "$pinned" = 0 ]; then
	echo "ok   - no pin left behind by the killed ranks"
else
	echo "FAIL - $pinned slots still pinned after the killed ranks were reclaimed"
	fails=$((fails + 1))
fi
echo "crash: $fails failed"
[ $fails -eq 0 ]
