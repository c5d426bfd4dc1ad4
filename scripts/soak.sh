#!/usr/bin/env bash
# The soak (not in CI): 8 reader processes x 4 threads under LD_PRELOAD read random 1 MiB
# chunks (or the tail) of 16 files (a working set 3x the cache; one in four smaller than a
# shard, one in four with a tail, so packed slots are in play) while a writer that never loads the shim
# rewrites them, and a chaos loop SIGKILLs (and restarts) or SIGSTOPs (1-4 s, then SIGCONT)
# random readers.  Every chunk is checked: the right file and offset, one generation, and no
# generation older than the last write that returned files.settle before the read began (a read
# within files.settle of a write may see older bytes: that is the documented rule).
# At the end it checks that every reader finished (no hang) and that no pin is left.
# KVS_SOAK_ONCE=1: the store is a files.write_once root, written as such stores are (each
# generation a new file, renamed into place; its inode often the one just freed), and read as
# engines read (open, read, close); then no read may see a generation older than the last rename
# that returned before its open began, with no settle window.
#   scripts/soak.sh [SECONDS] [BUILD_DIR]      (default 600 s, build-soak)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-600}
build=${2:-$root/build-soak}
bash "$root/scripts/deps.sh"
if [ ! -x "$build/tests/kvshim-hostile" ]; then
	cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build "$build" -j"$(nproc)" >/dev/null
fi
h=$build/tests/kvshim-hostile
kvshim=$build/tools/kvshim
lib=$build/shim/libkvshim.so
work=$(mktemp -d /var/tmp/kvshim-soak.XXXXXX)
export KVSHIM_CONFIG= KVSHIM_FILES_ROOTS=$work/kv KVSHIM_CACHE_NAME=soak-$$
export KVSHIM_CACHE_CAPACITY=32M KVSHIM_CACHE_SHARD_SIZE=1M KVSHIM_LOADER_WAIT_TIMEOUT_MS=2000
settle=2000 # the default for local file systems (files.settle = auto)
export KVSHIM_FILES_SETTLE=$settle
once=()
if [ -n "${KVS_SOAK_ONCE:-}" ]; then
	export KVSHIM_FILES_WRITE_ONCE=$work/kv
	once=(once)
fi
pids=()
cleanup() {
	kill -CONT "${pids[@]}" 2>/dev/null || true
	kill -9 "${pids[@]}" 2>/dev/null || true
	"$kvshim" reset --force >/dev/null 2>&1 || true
	[ -n "${KVS_SOAK_KEEP:-}" ] && echo "soak: kept $work" >&2 || rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/kv" "$work/log"
nfiles=${KVS_SOAK_FILES:-16}
"$h" soakwriter "$work/kv" $nfiles 8 $((secs + 5)) "$work/state" "${once[@]}" >"$work/writer" \
	2>"$work/log/writes" &
writer=$!
sleep 1
start=$(date +%s)
end=$((start + secs))
spawn() { # N: start reader N for the time that is left; its log keeps every life's last line
	local left=$((end - $(date +%s)))
	((left > 0)) || left=1
	LD_PRELOAD=$lib "$h" soakreader "$work/kv" $nfiles $left "$work/state" $settle "${once[@]}" \
		>>"$work/log/r$1.$RANDOM" 2>>"$work/log/err" &
	pids[$1]=$!
}
for i in 0 1 2 3 4 5 6 7; do spawn $i; done
kills=0 stops=0
while (($(date +%s) < end - 5)); do
	sleep "0.$((RANDOM % 9 + 1))"
	i=$((RANDOM % 8))
	case "${KVS_SOAK_CHAOS:-both}" in
	none) continue ;;
	kill) act=1 ;;
	stop) act=0 ;;
	*) act=$((RANDOM % 2)) ;;
	esac
	if ((act)); then
		kill -9 "${pids[$i]}" 2>/dev/null && kills=$((kills + 1))
		wait "${pids[$i]}" 2>/dev/null || true
		spawn $i
	else
		kill -STOP "${pids[$i]}" 2>/dev/null && stops=$((stops + 1))
		(sleep "$((RANDOM % 4 + 1))"; kill -CONT "${pids[$i]}" 2>/dev/null) &
	fi
done
sleep 6
hangs=0
for i in 0 1 2 3 4 5 6 7; do
	kill -CONT "${pids[$i]}" 2>/dev/null || true
	for t in $(seq 60); do kill -0 "${pids[$i]}" 2>/dev/null || break; sleep 1; done
	if kill -0 "${pids[$i]}" 2>/dev/null; then
		hangs=$((hangs + 1))
		echo "soak: reader $i (pid ${pids[$i]}) still running 60 s past its end" >&2
	fi
done
wait "$writer" || true
# A last reader reaps the dead; then no pin may be left.
LD_PRELOAD=$lib "$h" soakreader "$work/kv" $nfiles 1 "$work/state" $settle "${once[@]}" >/dev/null
sleep 0.5
pinned=$("$kvshim" stat --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["region"]["slots_pinned"])')
read -r reads bad stale torn early < <(for f in "$work"/log/r*; do tail -n 1 "$f"; done |
	awk '{r+=$1; b+=$2; s+=$3; t+=$4; e+=$5} END {print r+0, b+0, s+0, t+0, e+0}')
echo "soak: ${secs} s, 8 processes x 4 threads, $nfiles files of 8 MiB (one in four of 192 KiB, one in four with a 320 KiB tail) over a 32 MiB cache, settle ${settle} ms${once:+, write-once root (tmp + rename, open per read)}"
echo "soak: reads $reads; wrong (another file's, offset's, or torn with no write near) $bad; stale $stale"
echo "soak: allowed: torn by a write overlapping the read $torn, older bytes within settle of a write $early"
echo "soak: SIGKILLs $kills, SIGSTOPs $stops, hangs $hangs, pins left $pinned"
echo "soak: writer: $(cat "$work/writer")"
"$kvshim" stat | sed 's/^/soak: stat: /' | sed -n '1,20p' # reads it all: head would cut stat off (SIGPIPE, pipefail)
[ "$bad" = 0 ] && [ "$stale" = 0 ] && [ "$hangs" = 0 ] && [ "$pinned" = 0 ]
