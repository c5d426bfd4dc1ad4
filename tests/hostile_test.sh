#!/usr/bin/env bash
# Never harm the host (issue "Never harm the host"): an engine that races dup2 against its own
# reads, shares a file position between threads, passes bad buffers, cancels readers, reads from
# a signal handler, forks, holds record locks, and a writer that rewrites files under readers.
# Each case runs kvshim-hostile under LD_PRELOAD; where the kernel's answer is the reference,
# the output must equal the run without the shim.
#   hostile_test.sh LIBKVSHIM KVSHIM KVSHIM-HOSTILE [LIBKVSHIM-REENTER]
set -uo pipefail
h=$3
reenter=${4:-}
PREFIX=hostile
source "$(dirname "$0")/preload_lib.sh"

mkdir -p "$work/kv"
if ! "$h" mkfile "$work/kv/f0" 0 32 1 2>/dev/null; then
	echo "hostile: no O_DIRECT on /var/tmp here; skipped"
	exit 77
fi
"$h" mkfile "$work/kv/f1" 1 32 1
"$h" mkfile "$work/kv/a" 2 8 1
"$h" mkfile "$work/kv/b" 3 8 1

export KVSHIM_CONFIG=
export KVSHIM_FILES_ROOTS=$work/kv
export KVSHIM_CACHE_NAME=$name
export KVSHIM_CACHE_CAPACITY=64M
export KVSHIM_CACHE_SHARD_SIZE=1M
export KVSHIM_FILES_SETTLE=0 # the files were just written; settling has a case of its own
served() { "$kvshim" stat --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["totals"]["requests"])'; }

# same LABEL CMD...: the output under the shim equals the output without it, and it served.
same() {
	local label=$1
	shift
	local want got
	want=$("$@" 2>&1)
	reset_region
	got=$(LD_PRELOAD=$lib "$@" 2>&1)
	if [ "$want" != "$got" ]; then
		fail "$label: under the shim: $got; without: $want"
	elif [ "$(served)" -eq 0 ]; then
		fail "$label: the shim served nothing"
	else
		ok "$label: $(echo "$got" | tr '\n' ';')"
	fi
}

# 1. dup2 racing reads: bytes published under a key are that file's.  Each round loads every
# shard of both files once while fd 100 flips, then a fresh process reads them all from the
# cache.
bad=0
for round in 1 2 3; do
	reset_region
	out=$(LD_PRELOAD=$lib timeout 60 "$h" dup2race "$work/kv/f0" "$work/kv/f1" 1 2>&1) || bad=1
	for t in 0 1; do
		v=$(LD_PRELOAD=$lib "$h" verify "$work/kv/f$t" $t 1 2>&1) || {
			bad=1
			out="$out; $v"
		}
	done
	[ $bad = 0 ] || break
done
[ $bad = 0 ] && ok "dup2 races: $out" || fail "dup2 races: $out"

# 2. read() from four threads on one open file description.
reset_region
out=$(LD_PRELOAD=$lib timeout 60 "$h" posrace "$work/kv/f0" 2>&1) && ok "$out" || fail "$out"

# 3. An O_PATH descriptor, and bad buffers: the kernel's answers, no crash.
# O_PATH with files.buffered (an O_PATH descriptor has no O_DIRECT): the kernel's EBADF.
want=$(KVSHIM_FILES_BUFFERED=1 "$h" opath "$work/kv/f0" 2>&1)
got=$(KVSHIM_FILES_BUFFERED=1 LD_PRELOAD=$lib "$h" opath "$work/kv/f0" 2>&1)
[ "$want" = "$got" ] && ok "O_PATH: $(echo "$got" | tr '\n' ';')" ||
	fail "O_PATH: under the shim: $got; without: $want"
same "bad buffers" "$h" efault "$work/kv/f0"

# 4. Readers cancelled mid-read (one waiting slot, so they queue on the loader's lock).
reset_region
# The region is far smaller than what the readers load: the shim says so once (serve.c), the
# one line allowed besides the program's.
out=$(KVSHIM_CACHE_CAPACITY=8M KVSHIM_LOADER_WAITING_QUEUE_DEPTH=1 LD_PRELOAD=$lib \
	timeout 120 "$h" cancel "$work/kv/f0" 2>&1 |
	grep -v "warn: this process has read more from storage than the region holds")
[ "$out" = "cancel: after 240 cancels, a read: 4194304" ] && ok "$out" || fail "cancel: $out (status $?)"

# 5. Served reads of 17 shards from a signal handler while the program mallocs.
reset_region
out=$(LD_PRELOAD=$lib timeout 60 "$h" signal "$work/kv/f0" 3 2>&1)
case "$out" in
signal:*no\ deadlock) ok "$out" ;;
*) fail "signal handler: ${out:-hung} (status $?)" ;;
esac

# 6. A fork child holds none of the shim's descriptors (region, io_uring, anchors).
reset_region
out=$(KVSHIM_LOADER_PREFETCH=read LD_PRELOAD=$lib timeout 60 "$h" forkfds "$work/kv/f0" 2>&1) &&
	ok "$out" || fail "$out"

# 7. Record locks survive the shim's descriptors (anchors, read-ahead).
reset_region
out=$(KVSHIM_LOADER_PREFETCH=read LD_PRELOAD=$lib timeout 60 "$h" locks "$work/kv/a" "$work/kv/b" 2>&1) &&
	ok "$out" || fail "$out"

# 7b. Rewriting a file under an open descriptor does not make the shim hold more descriptors.
reset_region
out=$(LD_PRELOAD=$lib timeout 60 "$h" fdleak "$work/kv/b" 2>&1) && ok "$out" || fail "$out"

# 7c. A descriptor number moved to another file: the old file's anchor is closed once the
#     program holds nothing of it.
reset_region
out=$(LD_PRELOAD=$lib timeout 60 "$h" anchors "$work/kv/a" "$work/kv/b" 2>&1) && ok "$out" ||
	fail "$out"

# 7d. A sandbox that hides /proc/self/fd: the shim cannot tell where a descriptor points, so it
#     passes every read through, and the bytes are right (the ASan pass sees any stray write).
if [ "$(id -u)" = 0 ] && unshare -m --propagation private true 2>/dev/null; then
	reset_region
	# (The mount hides the fd folder of this pid only: exec, never fork, the reader.)
	out=$(timeout 60 unshare -m --propagation private sh -c 'mount -t tmpfs tmpfs /proc/$$/fd &&
		exec env LD_PRELOAD="$0" "$1" verify "$2" 0 1' "$lib" "$h" "$work/kv/f0" 2>&1)
	if [ $? = 0 ] && [ "$(region total_bytes)" = none ]; then
		ok "no /proc/self/fd: every read passed through, right ($out)"
	else
		fail "no /proc/self/fd: $out (region: $(region total_bytes))"
	fi
else
	echo "  skip: no /proc/self/fd (needs root and unshare -m)"
fi

# 8. A writer that never loads the shim rewrites a file under readers.  A read that starts
# files.settle after a write returned must see that generation or a later one; a new process
# afterwards reads the last generation.
reset_region
settle_ms=300
"$h" mkfile "$work/kv/w" 5 32 0
sleep 0.4
"$h" writer "$work/kv/w" 5 32 10 "$work/writes" &
for r in 1 2; do
	KVSHIM_FILES_SETTLE=$settle_ms LD_PRELOAD=$lib "$h" reader "$work/kv/w" 5 "$work/reads$r" &
done
wait
out=$(python3 - "$work/writes" "$work/reads1" "$work/reads2" $settle_ms <<'PY'
import sys
writes = [tuple(map(float, l.split())) for l in open(sys.argv[1])]
settle = int(sys.argv[4]) / 1000
reads = stale = 0
for path in sys.argv[2:4]:
    for line in open(path):
        t, g = line.split()
        t, g = float(t), int(g)
        done = [gen for gen, r in writes if r + settle <= t]
        reads += 1
        if done and 0 <= g < max(done):
            stale += 1
print(f"{reads} reads, {stale} stale")
PY
)
case "$out" in
*" 0 stale") ok "rewrites under readers (settle ${settle_ms} ms): $out" ;;
*) fail "rewrites under readers (settle ${settle_ms} ms): $out" ;;
esac
out=$(KVSHIM_FILES_SETTLE=$settle_ms LD_PRELOAD=$lib "$h" verify "$work/kv/w" 5 10 2>&1) &&
	ok "after the rewrites: $out" || fail "after the rewrites: $out"

# 9. Every stripe's lock word names a thread that does not exist (corruption, or a peer gone
# wrong): reads still return the right bytes, from storage, within seconds, and the engine's
# stderr says so exactly once.
reset_region
LD_PRELOAD=$lib "$h" verify "$work/kv/f0" 0 1 >/dev/null 2>&1 # builds the region
python3 - "/dev/shm/kvshim.$(id -u).$name" <<'PY'
import mmap, struct, sys
with open(sys.argv[1], "r+b") as f:
    m = mmap.mmap(f.fileno(), 0)
    nstripes, = struct.unpack_from("<I", m, 52)
    off_stripes, = struct.unpack_from("<Q", m, 80)
    for i in range(nstripes):
        struct.pack_into("<I", m, off_stripes + 64 * i, 0x3ffffff0)  # a TID no thread has
PY
start=$(date +%s)
out=$(LD_PRELOAD=$lib timeout 60 "$h" verify "$work/kv/f0" 0 1 2>"$work/err")
st=$?
took=$(($(date +%s) - start))
lines=$(grep -c '^kvshim: .*stuck or corrupt' "$work/err")
others=$(grep -v 'stuck or corrupt' "$work/err" | grep -c .)
if [ $st = 0 ] && [ "$lines" = 1 ] && [ "$others" = 0 ] && [ $took -le 20 ]; then
	ok "stuck lock words: $out in ${took} s, one warning"
else
	fail "stuck lock words: status $st in ${took} s, $lines warnings: $(head -c 300 "$work/err")"
fi

# 10. Coarse timestamps: on ext2 (whole seconds), a same-size rewrite in the same second keeps
# the file's identity, and so can a deleted file's inode that comes back.  A shard loaded then
# is kept only until files.settle (auto: 2 s, +2 s for stamps with no sub-second part) after
# its load, so a read that starts files.settle after a write returned must see that write:
# rounds of rewrites a moment apart, each read at once (any generation the contract allows),
# and twice a pause of files.settle and a read that must see the last one (the shard loaded
# in the same second as the last rewrite has expired by then, and is loaded again).  Root and
# a loop device are needed.
if [ "$(id -u)" = 0 ] && command -v mkfs.ext2 >/dev/null &&
	truncate -s 64M "$work/ext2.img" && mkfs.ext2 -q -I 128 -F "$work/ext2.img" >/dev/null 2>&1 &&
	mkdir -p "$work/kv/ext2" && mount -o loop "$work/ext2.img" "$work/kv/ext2" 2>/dev/null; then
	reset_region
	: >"$work/ext2.writes"
	: >"$work/ext2.reads"
	complain=0
	read_ext2() {
		env -u KVSHIM_FILES_SETTLE LD_PRELOAD=$lib "$h" reader "$work/kv/ext2/f" 0.000001 \
			"$work/ext2.r" 2>"$work/err"
		cat "$work/ext2.r" >>"$work/ext2.reads"
		[ -s "$work/err" ] && complain=$((complain + 1)) # the shim must not complain
	}
	for round in $(seq 1 12); do
		if ((round % 2)); then
			"$h" mkfile "$work/kv/ext2/f" 8 4 $round # rewrite in place, same size
		else
			rm -f "$work/kv/ext2/f"
			"$h" mkfile "$work/kv/ext2/f" 8 4 $round # delete and recreate: the inode returns
		fi
		echo "$round $(date +%s.%N)" >>"$work/ext2.writes"
		read_ext2
		read_ext2
		if [ $round = 6 ] || [ $round = 12 ]; then
			sleep 4.1
			read_ext2
		fi
	done
	umount "$work/kv/ext2"
	out=$(python3 - "$work/ext2.writes" "$work/ext2.reads" <<'PY'
import sys
writes = [tuple(map(float, l.split())) for l in open(sys.argv[1])]
settle = 4.0  # auto for whole-second stamps
reads = stale = late = 0
for line in open(sys.argv[2]):
    t, g = float(line.split()[0]), int(line.split()[1])
    done = [gen for gen, r in writes if r + settle <= t]
    reads += 1
    if g < 0 or (done and g < max(done)):
        stale += 1
    if done and max(done) == max(gen for gen, r in writes if r <= t):
        late += 1  # a read files.settle after the last write before it
print(f"{reads} reads, {late} of them files.settle after the last write, {stale} stale")
PY
)
	[ "$(served)" -gt 0 ] || out="$out (and the shim served nothing)"
	case "$out" in
	*" 0 stale") [ $complain = 0 ] && ok "ext2, 12 rewrites in the same seconds: $out" ||
		fail "ext2: the shim printed something $complain times: $(head -c 300 "$work/err")" ;;
	*) fail "ext2, 12 rewrites in the same seconds: $out" ;;
	esac
else
	echo "skip - ext2 coarse timestamps: needs root, mkfs.ext2 and a loop device"
fi

# 11. A dlsym that re-enters the shim's hooks while the shim resolves the real functions with
# it (as every lookup will once the shim interposes dlsym): no deadlock, right bytes.
if [ -n "$reenter" ] && [ -n "${KVS_E2E_PRELOAD:-}" ]; then
	# The sanitizer runtime looks its interceptors up through the first dlsym in the process,
	# ours, before it is initialised itself.
	echo "skip - a re-entering dlsym: not under a sanitizer runtime"
elif [ -n "$reenter" ]; then
	reset_region
	want=$(sha256sum <"$work/kv/f0")
	got=$(LD_PRELOAD=$reenter:$1 timeout 20 \
		dd if="$work/kv/f0" bs=1M iflag=direct status=none | sha256sum)
	[ "$want" = "$got" ] && [ "$(served)" -gt 0 ] && ok "a re-entering dlsym: no deadlock, same bytes, served" ||
		fail "a re-entering dlsym: ${got:-hung} (status $?)"
fi

echo "$fails failed"
[ $fails = 0 ]
