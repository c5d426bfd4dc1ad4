#!/usr/bin/env bash
# The main job: on a fresh machine, install what is needed, build, write a replicated KV store
# (every rank reads the same files), and run 8 rank processes that load every block with
# O_DIRECT preadv, once without kvshim, then (after `kvshim prepare` has given the region its
# memory, untimed as the ranks' own buffers are) twice with it, and once more after the engine
# touched every block (UCM's lookup); then save a new store through
# kvshim as an engine offloads KV (timed against the same save without it) and load that back
# with the ranks: write-through kept it, so the reload reads no storage; print what changed.  Progress
# goes to stderr (in place on a terminal, every 10% in a log); the table and a closing sentence
# saying what kvshim won go to stdout.
# With --observe, a run in observe mode (shim.mode = observe: nothing served, what the cache
# would have read counted) comes first, as the first column.
#   scripts/demo.sh [--observe] [NBLOCKS] [BLOCK_MIB] [NRANKS]   (default 256 4 8: 1 GiB unique)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
observe=()
if [ "${1:-}" = --observe ]; then
	observe=(observe)
	shift
fi
nblocks=${1:-256}
block_mib=${2:-4}
nranks=${3:-8}

echo "demo: checking the packages it needs (scripts/deps.sh)" >&2
bash "$root/scripts/deps.sh"
echo "demo: building kvshim in $root/build (Release)" >&2
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j"$(nproc)" >/dev/null

# On disk, not tmpfs: O_DIRECT needs a file system that does direct I/O.
work=$(mktemp -d /var/tmp/kvshim-demo.XXXXXX)
trap 'rm -rf "$work"' EXIT
store="$work/store"
echo "demo: writing $nblocks blocks of $block_mib MiB to $store" >&2
python3 "$root/scripts/demo.py" store "$store" "$nblocks" $((block_mib << 20))

capacity=$(((nblocks * block_mib * 5 / 4) + 64))
cat >"$work/kvshim.ini" <<INI
[files]
roots = $store:$work/saved
; an engine's KV store: each block written once (tmp + rename), never rewritten in place
write_once = $store:$work/saved
[cache]
name = demo-$$
capacity = ${capacity}M
shard_size = 1M
INI
mkdir -p "$work/saved"
python3 "$root/scripts/demo.py" run "$store" "$nranks" "$root/build/tools/kvshim" "$work/kvshim.ini" \
	"$work/saved" "${observe[@]}"
