#!/usr/bin/env bash
# kvshim prefetch: a node warmed before the engines start.
#   prefetch_test.sh LIBKVSHIM KVSHIM
# Storage is the kernel's count (/proc/$$/io read_bytes around the processes this script
# started and reaped); every byte the ranks read is checked (tests/kv_ranks.py).
#  1. A cold region, a prefetch of the store's directory, then 8 ranks: the ranks read at most
#     1% of the unique bytes from storage, and the prefetch read them once.
#  2. A prefetch of what is warm reads nothing, and says so.
#  3. A path outside files.roots is refused by name (exit status 1), and the paths beside it
#     are still loaded; a missing path fails the same way.
#  4. A prefetch of more than the region holds, by default, evicts nothing: the shards the
#     ranks hit just before are still there (no storage read when they load again), and the
#     summary says what did not fit.
#  5. A prefetch into a region left full by that loads nothing and evicts nothing.
#  6. 6000 files, their paths and their answers more than a pipe holds: every one answered.
set -uo pipefail
PREFIX=prefetch
source "$(dirname "$0")/preload_lib.sh" # lib (sanitizer runtime first), work, name, ok, fail
ranks_py="$(dirname "$0")/kv_ranks.py"
MiB=1048576

python3 -c 'import numpy' 2>/dev/null || {
	echo "SKIP: numpy is missing (python3 -m pip install numpy)"
	exit 77
}
mkdir -p "$work/kv/store" "$work/kv/hot" "$work/other"
if ! dd if=/dev/zero of="$work/kv/probe" bs=4096 count=1 oflag=direct status=none 2>/dev/null; then
	echo "SKIP: O_DIRECT does not work in $work"
	exit 77
fi
rm -f "$work/kv/probe"

while read -r v; do unset "$v"; done < <(compgen -e | grep '^KVSHIM_')
export KVSHIM_CONFIG=
export KVSHIM_FILES_ROOTS=$work/kv
export KVSHIM_CACHE_NAME=$name
export KVSHIM_CACHE_CAPACITY=512M
export KVSHIM_CACHE_SHARD_SIZE=1M
# kvshim prefetch finds the library as `kvshim run` does: this build's.  In the sanitizer pass
# the runtime goes first in LD_PRELOAD, which the worker keeps ahead of the shim.
export KVSHIM_LIBRARY=${lib##*:}
[ -n "${KVS_E2E_PRELOAD:-}" ] && export LD_PRELOAD=$KVS_E2E_PRELOAD

shim_ranks() { LD_PRELOAD=$lib python3 "$ranks_py" "$@"; }
storage_of() { sed -n 's/.*storage \([0-9]*\).*/\1/p' <<<"$1"; }
at_most() { python3 -c "import sys; sys.exit(0 if $1 <= $2 else 1)"; }
prefetch() { # ARGS...: kvshim prefetch, its summary in $said, its storage in $read; its status
	local before st
	before=$(io_read_bytes)
	said=$("$kvshim" prefetch "$@" 2>"$work/err")
	st=$?
	read=$(($(io_read_bytes) - before))
	return $st
}

n=32 size=$((4 * MiB))
unique=$((n * size))
python3 "$ranks_py" write "$work/kv/store" $n $size --gen 1
sleep 2.5 # settled (files.settle is 2 s on a local file system): kept for good once loaded

# 1. Cold, then 8 ranks.
reset_region
if ! prefetch "$work/kv/store"; then
	fail "cold prefetch: status $?: $(head -c 300 "$work/err")"
elif ! out=$(shim_ranks load "$work/kv/store" $n $size --gen 1 --ranks 8 2>"$work/err2"); then
	fail "ranks after a prefetch: $(head -c 300 "$work/err2")"
else
	st=$(storage_of "$out")
	if at_most "$st" "$unique / 100" && at_most "$read" "$unique * 1.02" &&
		at_most "$unique" "$read"; then
		ok "prefetch of a cold region read $read bytes for $unique; then 8 ranks read $st from storage, every byte right ($said)"
	else
		fail "prefetch read $read for $unique unique bytes, then 8 ranks read $st (at most $((unique / 100))): $said"
	fi
fi

# 2. What is warm is not read again.
if ! prefetch "$work/kv/store"; then
	fail "warm prefetch: status $?: $(head -c 300 "$work/err")"
elif [ "$read" -le $((64 * 1024)) ] && grep -q ' 0 B loaded from storage' <<<"$said"; then
	ok "a prefetch of a warm set read $read bytes: $said"
else
	fail "a prefetch of a warm set read $read bytes: $said"
fi

# 3. Outside the roots: refused by name, the rest loaded.
head -c $MiB /dev/urandom >"$work/other/outside"
python3 "$ranks_py" write "$work/kv/hot" 4 $size --gen 2 --prefix late
sleep 2.5
if prefetch "$work/other/outside" "$work/kv/hot"; then
	fail "a path outside files.roots: status 0 ($said)"
elif ! grep -q "$work/other/outside: not under files.roots" "$work/err"; then
	fail "a path outside files.roots: not named: $(head -c 300 "$work/err")"
elif ! grep -q '^prefetch: 4 files' <<<"$said" || [ "$read" -lt $((4 * size)) ]; then
	fail "the paths beside a refused one: read $read: $said"
else
	ok "a path outside files.roots refused by name; the 4 files beside it loaded ($read bytes)"
fi
if prefetch "$work/kv/missing"; then
	fail "a missing path: status 0"
else
	ok "a missing path: status 1 ($(head -c 120 "$work/err"))"
fi

# 4. More than the region holds: nothing evicted.
export KVSHIM_CACHE_CAPACITY=64M
reset_region
if ! out=$(shim_ranks load "$work/kv/hot" 4 $size --gen 2 --prefix late --ranks 2 2>"$work/err2") ||
	! out=$(shim_ranks load "$work/kv/hot" 4 $size --gen 2 --prefix late --ranks 2 2>"$work/err2"); then
	fail "the hot set: $(head -c 300 "$work/err2")"
elif ! prefetch "$work/kv/store"; then
	fail "a prefetch larger than the region: status $?: $(head -c 300 "$work/err")"
else
	evictions=$(totals evictions)
	if ! out=$(shim_ranks load "$work/kv/hot" 4 $size --gen 2 --prefix late --ranks 2 2>"$work/err2"); then
		fail "the hot set after the prefetch: $(head -c 300 "$work/err2")"
	else
		st=$(storage_of "$out")
		if [ "$st" -le $((64 * 1024)) ] && [ "$evictions" = 0 ] &&
			grep -q 'past the budget' <<<"$said" && [ "$read" -gt $((16 * MiB)) ]; then
			ok "a prefetch of 128 MiB into a 64 MiB region loaded $read bytes and evicted nothing; the hot set then read $st from storage ($said)"
		else
			fail "a prefetch larger than the region: loaded $read, evictions $evictions, the hot set then read $st from storage: $said"
		fi
	fi
fi

# 5. A full region (the prefetch above took the room there was): nothing more is loaded.
before=$(totals evictions)
if ! prefetch "$work/kv/store"; then
	fail "a full region: status $?: $(head -c 300 "$work/err")"
elif [ "$read" -gt $((64 * 1024)) ] || [ "$(totals evictions)" != "$before" ]; then
	fail "a prefetch into a full region read $read bytes, evictions $before -> $(totals evictions): $said"
else
	ok "a prefetch into a full region read $read bytes and evicted nothing ($said)"
fi

# 6. Many files (their paths and the answers more than a pipe holds): all answered, no deadlock.
export KVSHIM_FILES_MIN_READ=4K
python3 - "$work/kv/many" <<'PY'
import os, sys
d = sys.argv[1]
os.makedirs(d)
for i in range(6000):
    with open(os.path.join(d, "a-file-name-long-enough-to-fill-a-pipe-with-paths-%05d" % i), "wb") as f:
        f.write(os.urandom(4096))
PY
reset_region
if ! timeout 120 "$kvshim" prefetch "$work/kv/many" >"$work/out" 2>"$work/err"; then
	fail "6000 files: status $?: $(head -c 300 "$work/err")"
elif ! grep -q "^prefetch: 6000 files (23.4 MiB), 23.4 MiB loaded" "$work/out"; then
	fail "6000 files: $(cat "$work/out")"
else
	ok "6000 files, 600 KB of paths, 70 KB of answers: $(cat "$work/out")"
fi
unset KVSHIM_FILES_MIN_READ

[ "$fails" -eq 0 ] || exit 1
