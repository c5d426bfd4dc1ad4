#!/usr/bin/env bash
# UCM's own store under the shim: PyPI's uc-manager-cuda-cu130 (0.8.1), its PosixStore built
# as UCM's connector builds it (tests/ucm_ranks.py), in a Python 3.12 virtual environment that
# scripts/deps.sh makes (KVS_UCM_VENV, default ~/.cache/kvshim/ucm-venv).  32 blocks of 4 MiB
# in 1 MiB shards; every byte loaded is checked; storage is the kernel's count (each rank's
# /proc/self/io read_bytes around its load, summed) and must agree with the shim's
# backend_bytes.
#   ucm_test.sh LIBKVSHIM KVSHIM
#  1. A dump not under the shim; 8 ranks without it, psync and aio (8x the unique bytes: the
#     baseline).
#  2. Under the shim, 8 ranks with the psync engine (128 threads, open(O_DIRECT), one 1 MiB
#     read, close per shard), cold, 5 runs: storage at most 1.05x; then warm: about 0.
#  3. The same with the aio engine (raw io_submit): cold at most 1.05x, warm about 0.
#  4. A scheduler-side lookup (device_id -1: UCM touches every block with utime from a
#     thread) under the shim, then 8 ranks: about 0 (touches keep the cache).
#  5. A dump under the shim into a files.write_once root, then 8 ranks at once, and again
#     3 s later: about 0.
# Every UCM process runs under a time bound; a teardown that does not end (UCM's aio store
# can hang joining its threads) is reported apart, with the shim and without it.
set -uo pipefail
PREFIX=ucm
ucm_py="$(dirname "$0")/ucm_ranks.py"
venv=${KVS_UCM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvshim/ucm-venv}
py=$venv/bin/python
if ! why=$("$py" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version
import ucm, importlib, os, ctypes
ctypes.CDLL(os.path.join(os.path.dirname(ucm.__file__), "shared/metrics/libmetrics.so"), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
importlib.import_module("ucm.store.pipeline.ucmpipelinestore")' 2>&1); then
	echo "SKIP: UCM's store does not load from $venv ($(echo "$why" | tail -n 1));" \
		"scripts/deps.sh installs uc-manager-cuda-cu130 into a Python 3.12 venv there"
	exit 77
fi
source "$(dirname "$0")/preload_lib.sh" # lib (sanitizer runtime first), work, name, ok, fail
MiB=1048576
nblocks=32
unique=$((nblocks * 4 * MiB))
nranks=8

mkdir -p "$work/store" "$work/once"
if ! dd if=/dev/zero of="$work/store/probe" bs=4096 count=1 oflag=direct status=none 2>/dev/null; then
	echo "SKIP: O_DIRECT does not work in $work"
	exit 77
fi
rm -f "$work/store/probe"

while read -r v; do unset "$v"; done < <(compgen -e | grep '^KVSHIM_')
export KVSHIM_CONFIG=
export KVSHIM_FILES_ROOTS=$work/store:$work/once
export KVSHIM_FILES_WRITE_ONCE=$work/once
export KVSHIM_CACHE_NAME=$name
# 4 GiB for 128 MiB: the cold herd of 1024 threads moves the CLOCK hand once per claim that
# loses its race, and in 1 GiB it went round often enough to evict what the herd still needed
# (docs/design.md, "Known limitations"); a page of the region costs memory only once touched.
export KVSHIM_CACHE_CAPACITY=4G
export KVSHIM_CACHE_SHARD_SIZE=1M

hangs_plain=0 hangs_shim=0
ratio() { python3 -c "print(f'{$1 / $2:.3f}')"; }
# ucm_run LOG [shim] ARGS: one UCM process, its stdout (UCM's logger) dropped, its stderr in
# LOG; a teardown hang (ended by ucm_ranks.py's alarm, SIGALRM: 142, after its result line)
# is counted and is not a failure of the run.
ucm_run() {
	local log=$1 shim="" rc
	shift
	[ "${1:-}" = shim ] && shim=$lib && shift
	LD_PRELOAD=$shim timeout -k 5 120 "$py" "$ucm_py" "$@" >/dev/null 2>"$log"
	rc=$?
	if [ $rc -eq 142 ] && grep -Eq '^ucm_ranks: (dump|load|lookup): ' "$log"; then
		if [ -n "$shim" ]; then hangs_shim=$((hangs_shim + 1)); else hangs_plain=$((hangs_plain + 1)); fi
		rc=0
	fi
	return $rc
}
# ranks LABEL STORE ENGINE [shim] [args...]: 8 ranks at once (each waits for the others to be
# ready, then all load together); sets $kernel (storage by the kernel's count) and $slowest
# (the longest load, s); 1 with the reason in $why when a rank failed.
ranks() {
	local label=$1 store=$2 engine=$3 shim="" r pids=() rc
	shift 3
	[ "${1:-}" = shim ] && shim=shim && shift
	rm -f "$work/go" "$work"/ready.*
	for ((r = 0; r < nranks; r++)); do
		ucm_run "$work/err.$r" $shim load "$store" $nblocks --engine "$engine" --rank $r \
			--ready "$work/ready.$r" --go "$work/go" "$@" &
		pids+=($!)
	done
	for ((t = 0; t < 6000; t++)); do
		[ "$(find "$work" -maxdepth 1 -name 'ready.*' | wc -l)" -ge $nranks ] && break
		sleep 0.01
	done
	touch "$work/go"
	why=""
	for ((r = 0; r < nranks; r++)); do
		wait "${pids[$r]}"
		rc=$?
		grep -q "^ucm_ranks: load: rank $r, .*, ok," "$work/err.$r" ||
			why="$why rank $r exit $rc: $(tail -c 300 "$work/err.$r");"
	done
	# The kernel's count for the loads themselves (each rank's /proc/self/io around its Load
	# and Wait: UCM's set-up walks its 4096 directories, and that is no KV read).
	kernel=$(cat "$work"/err.[0-7] | sed -n 's/^ucm_ranks: load: .*, storage \([0-9]*\)$/\1/p' |
		awk '{ s += $1 } END { print s + 0 }')
	slowest=$(cat "$work"/err.* | sed -n 's/^ucm_ranks: load: .*, ok, \([0-9.]*\) s, .*/\1/p' | sort -g | tail -n 1)
	[ -z "$why" ]
}
# A shim round: ranks under the shim, then the kernel's count against backend_bytes.
shim_round() { # LABEL STORE ENGINE [args...]
	local label=$1 store=$2 engine=$3 b0 a0
	shift 3
	b0=$(totals backend_bytes) a0=$(totals atime_updates)
	if ! ranks "$label" "$store" "$engine" shim "$@"; then
		fail "$label:$why"
		return 1
	fi
	backend=$(($(totals backend_bytes) - b0))
	if ! storage_agrees "$kernel" "$backend" $(($(totals atime_updates) - a0)) $nblocks; then
		fail "$label: $storage_why"
		return 1
	fi
	return 0
}

# dump LOG STORE [shim] [args]: UCM's dump, again (up to 3 times, into an emptied store) when it
# left a NAME.tmp behind.  UCM's own race, with or without the shim (1 dump in 10 without it
# here): the worker of a block's last shard renames NAME.tmp while another shard's worker has
# yet to open it, which then creates a new NAME.tmp that nothing renames, and the block's file
# keeps a hole where that shard should be.  Sets $gen, the generation of the dump that took.
# Returns 1 when UCM failed, 2 when every try hit its race (a slower run, under a sanitizer,
# widens its window): then the cases on that dump are skipped, said, not failed.
dump() {
	local log=$1 store=$2 try
	shift 2
	for try in 1 2 3 4 5; do
		gen=$((gen + 1))
		rm -rf "${store:?}"/*
		[ "${1:-}" = shim ] && reset_region # what write-through kept is this dump's alone
		ucm_run "$log" "$@" dump "$store" $nblocks --gen $gen || return 1
		[ -z "$(find "$store" -name '*.tmp' | head -n 1)" ] && return 0
		echo "note - UCM's dump left $(find "$store" -name '*.tmp' | wc -l) NAME.tmp behind (its rename race: a block's file keeps a hole); dumping again"
	done
	return 2
}
gen=0

# 1. A dump not under the shim, and the baseline.
dump "$work/err.dump" "$work/store"
case $? in
0) ;;
2)
	echo "SKIP: UCM's dump hit its own rename race in 5 tries out of 5 (not the shim's: this dump runs without it)"
	exit 77
	;;
*)
	fail "dump without the shim: $(tail -c 300 "$work/err.dump")"
	echo "ucm: $fails failed"
	exit 1
	;;
esac
gen1=$gen
files=$(find "$work/store" -type f -regextype posix-extended -regex '.*/[0-9a-f]{32}' | wc -l)
sleep 2.5 # files.settle (2 s on a local file system): the blocks are kept for good
if ranks "psync, no shim" "$work/store" psync --gen $gen1; then
	ok "UCM dumped $nblocks blocks ($files files); 8 ranks without the shim, psync: every byte right, storage $(ratio "$kernel" $unique)x the unique bytes by the kernel's count, slowest load ${slowest} s"
else
	fail "psync, no shim:$why"
fi

if ranks "aio, no shim" "$work/store" aio --gen $gen1; then
	ok "8 ranks without the shim, aio: every byte right, storage $(ratio "$kernel" $unique)x the unique bytes by the kernel's count, slowest load ${slowest} s"
else
	fail "aio, no shim:$why"
fi

# 2, 3. psync and aio under the shim, cold then warm.
for engine in psync aio; do
	runs=1
	[ $engine = psync ] && runs=5
	worst=0 bad="" worst_why=""
	for ((run = 1; run <= runs; run++)); do
		reset_region
		shim_round "$engine, shim, cold, run $run" "$work/store" $engine --gen $gen1 || {
			bad=yes
			break
		}
		if [ "$kernel" -gt "$worst" ]; then
			worst=$kernel
			worst_why="run $run: $(totals shards_loaded) shards loaded, $(totals shards_expired) expired, $(totals prefetches) prefetched, $(totals failures) failures, $(totals evictions) evictions, $(totals fallbacks) fallbacks"
		fi
	done
	[ -n "$bad" ] && continue
	if [ $((worst * 100)) -gt $((unique * 105)) ]; then
		fail "$engine, shim, cold, $runs runs: storage up to $(ratio "$worst" $unique)x the unique bytes by the kernel's count (want <= 1.05; $worst_why)"
		continue
	fi
	ok "$engine, shim, 8 ranks cold, $runs runs: every byte right, storage at most $(ratio "$worst" $unique)x the unique bytes by the kernel's count, as the shim counted; slowest load ${slowest} s"
	shim_round "$engine, shim, warm" "$work/store" $engine --gen $gen1 || continue
	if [ $((kernel * 100)) -gt $unique ]; then
		fail "$engine, shim, warm: storage $kernel bytes by the kernel's count (want about 0)"
	else
		ok "$engine, shim, 8 ranks warm: every byte right, storage $kernel bytes by the kernel's count ($(ratio "$kernel" $unique)x)"
	fi
done

# 4. The scheduler's lookup touches every block; then 8 ranks.
t0=$(totals touches_kept)
if ! ucm_run "$work/err.lookup" shim lookup "$work/store" $nblocks --gen $gen1 ||
	! grep -q "^ucm_ranks: lookup: $nblocks blocks found, $files of $files files touched" "$work/err.lookup"; then
	fail "scheduler lookup under the shim: $(tail -c 300 "$work/err.lookup")"
elif shim_round "after the lookup" "$work/store" psync --gen $gen1; then
	if [ $((kernel * 100)) -gt $unique ]; then
		fail "a scheduler-side lookup (every block touched), then 8 ranks: storage $kernel bytes by the kernel's count (want about 0); touches_kept $(($(totals touches_kept) - t0))"
	else
		ok "a scheduler-side lookup under the shim touched all $files files (touches_kept $(($(totals touches_kept) - t0))), then 8 ranks: every byte right, storage $kernel bytes by the kernel's count"
	fi
fi

# 5. A dump under the shim into a write-once root, then loads at once and 3 s later.
reset_region
dump "$work/err.dump2" "$work/once" shim
st=$?
if [ $st = 2 ]; then
	echo "ok   - # SKIP dump under the shim: UCM's dump hit its own rename race in 5 tries out of 5 (a block's file keeps a hole, with or without the shim)"
elif [ $st != 0 ]; then
	fail "dump under the shim: $(tail -c 300 "$work/err.dump2")"
else
	gen2=$gen
	wt=$(totals write_through_bytes)
	# UCM writes each shard through a descriptor of its own, out of order, into NAME.tmp:
	# holes filled, never a rewrite in place.
	[ "$(totals write_once_violations)" = 0 ] ||
		fail "a dump under the shim into a files.write_once root: write_once_violations $(totals write_once_violations) (want 0: UCM fills holes, rewrites nothing)"
	for when in "at once" "3 s later"; do
		[ "$when" = "3 s later" ] && sleep 3
		shim_round "after a dump under the shim, $when" "$work/once" psync --gen $gen2 || continue
		# KNOWN (the write path's, reported in issue 30): in about 1 dump in 3, write-through
		# keeps 4 to 32 MiB less than UCM wrote (its threads write the shards of one file
		# through descriptors of their own, and the last renames it while others may still
		# write), and the first loads read those bytes.  What was kept must be served: storage
		# at most what was not kept, plus 1%.
		# write_through_bytes counts what was staged; a shard a late write of the same dump
		# dropped after its publication (the race above, seen with every byte staged) is not
		# told apart, so the first loads may read up to the 32 MiB the race was seen to cost.
		# The loads 3 s later must find everything (what the first loads read is kept).
		lost=$((unique - wt > 0 ? unique - wt : 0))
		known=$((32 * 1048576 > lost ? 32 * 1048576 : lost))
		if [ "$when" = "at once" ] && [ $((kernel * 100)) -gt $unique ] && [ "$kernel" -le $known ]; then
			echo "note - KNOWN: write-through kept $wt of the $unique bytes UCM dumped under the shim; 8 ranks at once read $kernel bytes from storage (UCM's dump races its own rename: issue 30)"
		elif [ $((kernel * 100)) -gt $((unique + 100 * lost)) ]; then
			fail "a dump under the shim (write_through_bytes $wt), then 8 ranks $when: storage $kernel bytes by the kernel's count (want about 0, or what write-through did not keep: $lost)"
			continue
		fi
		if [ "$when" = "3 s later" ] || [ $((kernel * 100)) -le $((unique + 100 * lost)) ]; then
			ok "a dump under the shim into a files.write_once root (write_through_bytes $wt), then 8 ranks $when: every byte right, storage $kernel bytes by the kernel's count"
		fi
	done
fi

# Teardown hangs (UCM's aio store can hang joining its threads): said apart, never hidden.
if [ $hangs_plain -gt 0 ] || [ $hangs_shim -gt 0 ]; then
	echo "note - UCM teardown hangs (the store's threads not joined within 5 s; its aio completion thread can block in io_getevents with no timeout): $hangs_plain without the shim, $hangs_shim under it"
fi
if [ $hangs_shim -gt 0 ] && [ $hangs_plain -eq 0 ]; then
	echo "note - teardown hangs only under the shim this run: see whether they recur without it"
fi

echo "ucm: $fails failed"
[ $fails -eq 0 ]
