#!/usr/bin/env bash
# UCM's own store under kvshim (docs/benchmarks.md): 8 ranks load the same blocks through
# UCM's PosixStore (tests/ucm_ranks.py; the uc-manager-cuda-cu130 wheel that scripts/deps.sh
# installs into a Python 3.12 venv), with the psync and the aio engine, without kvshim and with
# it (cold: a new region; warm: the region the cold round filled), in the same run.  Prints, per
# configuration, storage per unique byte by the kernel's count (each rank's /proc/self/io
# read_bytes around its load, summed) and the load time of the slowest rank,
# median over the runs; and checks that kvshim's backend_bytes agrees with the kernel.
#   scripts/bench_ucm.sh [--blocks N] [--runs R] [--build DIR]
#       N blocks of 4 MiB (default 32), R runs of each configuration (default 5), the build
#       with libkvshim.so and kvshim (default build/, made Release if it is missing)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
nblocks=32 runs=5 build=$root/build
while (($#)); do
	case $1 in
	--blocks) nblocks=$2 && shift ;;
	--runs) runs=$2 && shift ;;
	--build) build=$(realpath -m "$2") && shift ;;
	*) sed -n '2,12p' "$0" >&2 && exit 2 ;;
	esac
	shift
done
bash "$root/scripts/deps.sh"
venv=${KVS_UCM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvshim/ucm-venv}
py=$venv/bin/python
if ! "$py" -c 'import ucm' 2>/dev/null; then
	echo "bench_ucm: UCM's wheel is not installed in $venv (scripts/deps.sh)" >&2
	exit 1
fi
if [ ! -e "$build/shim/libkvshim.so" ]; then
	cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build "$build" -j"$(nproc)" >/dev/null
fi
lib=$build/shim/libkvshim.so
kvshim=$build/tools/kvshim
ucm_py=$root/tests/ucm_ranks.py
work=$(mktemp -d /var/tmp/kvshim-bench-ucm.XXXXXX)
export KVSHIM_CONFIG= KVSHIM_FILES_ROOTS=$work/store KVSHIM_CACHE_NAME=bench-ucm-$$
export KVSHIM_CACHE_CAPACITY=$(((nblocks * 4 + 64) * 3 / 2))M KVSHIM_CACHE_SHARD_SIZE=1M
cleanup() {
	"$kvshim" reset --force >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT
: >"$work/hangs"
unique=$((nblocks * 4 * 1048576))
totals() { { "$kvshim" stat --json 2>/dev/null || true; } | python3 -c 'import json,sys
try: print(json.load(sys.stdin)["totals"][sys.argv[1]])
except Exception: print(0)' "$1"; }

# One round: 8 ranks at once (each waits until all are ready); prints "KERNEL SLOWEST": the
# storage the kernel read for the loads, summed over ranks, and the slowest rank's load time.
round() { # ENGINE shim|plain
	local engine=$1 pre="" pids=() r
	[ "$2" = shim ] && pre=$lib
	rm -f "$work/go" "$work"/ready.* "$work"/err.*
	for r in 0 1 2 3 4 5 6 7; do
		LD_PRELOAD=$pre timeout -k 5 300 "$py" "$ucm_py" load "$work/store" "$nblocks" \
			--engine "$engine" --rank $r --ready "$work/ready.$r" --go "$work/go" \
			>/dev/null 2>"$work/err.$r" &
		pids+=($!)
	done
	until [ "$(find "$work" -maxdepth 1 -name 'ready.*' | wc -l)" -ge 8 ]; do sleep 0.01; done
	touch "$work/go"
	for r in 0 1 2 3 4 5 6 7; do
		# 142: ended by ucm_ranks.py's alarm after its load, a teardown that did not end
		wait "${pids[$r]}" || { [ $? -eq 142 ] && echo "$engine $2" >>"$work/hangs"; }
		grep -q "^ucm_ranks: load: rank $r, .*, ok," "$work/err.$r" || {
			echo "bench_ucm: rank $r failed: $(tail -c 300 "$work/err.$r")" >&2
			exit 1
		}
	done
	echo "$(cat "$work"/err.* | sed -n 's/^ucm_ranks: load: .*, storage \([0-9]*\)$/\1/p' |
		awk '{ s += $1 } END { print s + 0 }') $(cat "$work"/err.* | sed -n 's/^ucm_ranks: load: .*, ok, \([0-9.]*\) s, .*/\1/p' | sort -g | tail -n 1)"
}

# UCM's dump can leave a NAME.tmp behind (its rename race: the block's file keeps a hole, with
# or without kvshim): dump again until none is left.
for try in 1 2 3 4; do
	rm -rf "${work:?}/store"
	"$py" "$ucm_py" dump "$work/store" "$nblocks" >/dev/null 2>"$work/err.dump" || {
		echo "bench_ucm: the dump failed: $(tail -c 300 "$work/err.dump")" >&2
		exit 1
	}
	[ -z "$(find "$work/store" -name '*.tmp' | head -n 1)" ] && break
	echo "bench_ucm: UCM's dump left a NAME.tmp behind (its rename race); dumping again" >&2
done
sleep 2.5 # files.settle: the blocks are kept for good from the first load
tsv=$work/rounds.tsv
for engine in psync aio; do
	for ((run = 1; run <= runs; run++)); do
		echo "$engine without $(round $engine plain)" >>"$tsv"
		"$kvshim" reset --force >/dev/null 2>&1 || true
		b0=$(totals backend_bytes) a0=$(totals atime_updates)
		out=$(round $engine shim)
		k=${out% *} t=${out#* }
		b=$(($(totals backend_bytes) - b0)) a=$(($(totals atime_updates) - a0))
		if [ "$k" -lt "$b" ] || [ "$k" -gt $((b + 4096 * (a + nblocks) + 65536)) ]; then
			echo "bench_ucm: DIFFERENCE: $engine cold run $run: the kernel read $k bytes, kvshim's backend_bytes is $b (atime reads $a)" >&2
			exit 1
		fi
		echo "$engine cold $k $t" >>"$tsv"
		echo "$engine warm $(round $engine shim)" >>"$tsv"
	done
done
python3 - "$tsv" "$unique" "$nblocks" "$runs" <<'PY'
import statistics, sys
rows, unique = [l.split() for l in open(sys.argv[1])], int(sys.argv[2])
print(f"UCM PosixStore, {sys.argv[3]} blocks of 4 MiB in 1 MiB shards, 8 ranks, {sys.argv[4]} runs each")
print("| engine | kvshim | storage / unique bytes (kernel) | slowest rank's load, median (min-max) |")
print("|---|---|---|---|")
for engine in ("psync", "aio"):
    for mode, name in (("without", "without"), ("cold", "with, cold"), ("warm", "with, warm")):
        r = [(int(k), float(t)) for e, m, k, t in rows if e == engine and m == mode]
        ks, ts = [k / unique for k, _ in r], [t for _, t in r]
        print(f"| {engine} | {name} | {statistics.median(ks):.3f} (max {max(ks):.3f}) | "
              f"{statistics.median(ts):.3f} s ({min(ts):.3f}-{max(ts):.3f}) |")
PY
echo "kvshim's backend_bytes agreed with the kernel's count in every cold round"
# UCM's aio store can hang at teardown (its completion thread blocked in io_getevents with no
# timeout when the store joins it); ucm_ranks.py ends such a rank 5 s after its load.
for engine in psync aio; do
	for mode in plain shim; do
		n=$((8 * runs)) how=without
		[ $mode = shim ] && n=$((16 * runs)) how=with
		echo "teardown hangs, $engine, $how kvshim: $(grep -c "^$engine $mode$" "$work/hangs" || true) of $n ranks"
	done
done
