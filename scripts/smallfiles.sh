#!/usr/bin/env bash
# The small-files figure (docs/benchmarks.md, "Capacity follows bytes"): FILES files of SIZE
# bytes, written just before, read twice, one O_DIRECT pread each, through a region of CAP with the
# default shard size (1 MiB); the share of the second pass served from the cache, and the
# bytes the cache holds after it.  Then the hit path for 4 MiB reads (us per pread, warm).
#   scripts/smallfiles.sh [--files N] [--size BYTES] [--cap SIZE] [BUILD...]
# Each BUILD (a build folder, default build/) is measured in turn, in the same run.  Checks no
# thresholds: compare the figures of the builds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
files=2000 size=65536 cap=512M builds=()
while (($#)); do
	case $1 in
	--files) files=$2 && shift ;;
	--size) size=$2 && shift ;;
	--cap) cap=$2 && shift ;;
	-*) sed -n '2,8p' "$0" >&2 && exit 2 ;;
	*) builds+=("$(realpath "$1")") ;;
	esac
	shift
done
((${#builds[@]})) || builds=("$root/build")
work=$(mktemp -d /var/tmp/kvshim-small.XXXXXX)
names=()
cleanup() {
	for n in "${names[@]}"; do
		KVSHIM_CACHE_NAME=$n "${builds[0]}/tools/kvshim" reset --force >/dev/null 2>&1 || true
	done
	rm -rf "$work"
}
trap cleanup EXIT
# A totals counter of region $1 (kvshim stat --json of build $2).
total() {
	KVSHIM_CACHE_NAME=$1 "$2/tools/kvshim" stat --json |
		python3 -c "import json,sys; d=json.load(sys.stdin); print(d['totals'].get('$3', d['region'].get('$3', 0)))"
}
mkdir -p "$work/small" "$work/big"
for b in "${builds[@]}"; do
	n=small-$$-${#names[@]}
	names+=("$n")
	rm -f "$work"/small/*
	# Written just before the readers start, as an engine saves KV; not through the shim, so
	# that the first pass loads them.
	python3 - "$work/small" "$files" "$size" <<'PY'
import os, sys
d, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    with open(f"{d}/f{i:05d}", "wb") as f:
        f.write(os.urandom(size))
PY
	export KVSHIM_FILES_ROOTS=$work KVSHIM_CACHE_NAME=$n KVSHIM_CACHE_CAPACITY=$cap \
		KVSHIM_FILES_SETTLE=0
	list=("$work"/small/f*)
	LD_PRELOAD=$b/shim/libkvshim.so "$b/tools/kvshim-bench-read" read --direct --bs "$size" --passes 1 \
		"${list[@]}" >/dev/null
	h1=$(total "$n" "$b" shards_hit)
	LD_PRELOAD=$b/shim/libkvshim.so "$b/tools/kvshim-bench-read" read --direct --bs "$size" --passes 1 \
		"${list[@]}" >/dev/null
	h2=$(total "$n" "$b" shards_hit)
	held=$(total "$n" "$b" bytes_ready)
	ev=$(total "$n" "$b" evictions)
	# 4 MiB hits: 16 files of 4 MiB, warm, through the same region.
	for i in $(seq 0 15); do
		[ -f "$work/big/g$i" ] || head -c $((4 << 20)) /dev/urandom >"$work/big/g$i"
	done
	hit=$(LD_PRELOAD=$b/shim/libkvshim.so "$b/tools/kvshim-bench-read" read --direct --bs $((4 << 20)) \
		--passes 5 "$work"/big/g*)
	unset KVSHIM_FILES_ROOTS KVSHIM_CACHE_NAME KVSHIM_CACHE_CAPACITY KVSHIM_FILES_SETTLE
	python3 - "$b" "$files" "$size" "$cap" "$h1" "$h2" "$held" "$ev" "$hit" <<'PY'
import sys
b, files, size, cap, h1, h2, held, ev, hit = sys.argv[1:]
files, size, h1, h2, held, ev = map(int, (files, size, h1, h2, held, ev))
second = h2 - h1
print(f"{b}: {files} files of {size // 1024} KiB twice through {cap}: second pass "
      f"{second}/{files} hits ({100.0 * second / files:.1f}%); the cache holds "
      f"{held / 2**20:.1f} MiB ({100.0 * held / (files * size):.0f}% of the files' bytes) "
      f"after {ev} evictions")
print(f"{b}: 4 MiB hits: {hit}")
PY
done
