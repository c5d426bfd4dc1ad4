#!/usr/bin/env bash
# One fio libaio read of a 256 MiB KV file under a shim, for timing against another shim (or
# none): docs/benchmarks.md, "Kernel AIO completed by the kernel".
#   scripts/bench_kaio.sh LIB|"" cold|warm DEPTH BATCH [JOBS]
# LIB: the libkvshim.so to preload ("" for none); cold: the region reset first (every read a
# load); DEPTH: fio's iodepth; BATCH: its iodepth_batch_submit; JOBS: readers of the one file.
# The file and the region (named after the library's build folder) live in
# ${KVS_BENCH_DIR:-/var/tmp/kvshim-bench-kaio}; the kvshim command is the one beside LIB's build.
set -euo pipefail
lib=$1 mode=$2 depth=$3 batch=$4 jobs=${5:-1}
dir=${KVS_BENCH_DIR:-/var/tmp/kvshim-bench-kaio}
mkdir -p "$dir/kv"
[ -s "$dir/kv/big" ] || head -c $((256 * 1024 * 1024)) /dev/urandom >"$dir/kv/big"
export KVSHIM_CONFIG= KVSHIM_FILES_ROOTS=$dir/kv KVSHIM_FILES_SETTLE=0 KVSHIM_CACHE_CAPACITY=512M
export KVSHIM_CACHE_NAME=bench-kaio-$(basename "$(dirname "$(dirname "${lib:-x/x/none}")")")
if [ "$mode" = cold ] && [ -n "$lib" ]; then
	"$(dirname "$(dirname "$lib")")/tools/kvshim" reset --force >/dev/null 2>&1 || true
fi
cd "$dir" && LD_PRELOAD=$lib fio --name=b --filename=kv/big --rw=read --direct=1 --bs=1M \
	--ioengine=libaio --iodepth="$depth" --iodepth_batch_submit="$batch" \
	--iodepth_batch_complete_min=1 --size=256M --numjobs="$jobs" --output=/dev/null
