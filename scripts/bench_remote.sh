#!/usr/bin/env bash
# bench_remote.sh - node B's cold load with the remote tier against the tier off, on this
# machine's disk and on slow storage: the figures of issue 37.
#
#   bash scripts/bench_remote.sh [BUILD_DIR] [FILES] [MIB_EACH] [SLOWFS_LATENCY_US]
#
# Node A (a region and a helper) loads FILES files of MIB_EACH MiB and publishes them to a
# Mooncake pool (a master on loopback, TCP); then node B (its own region) loads them cold, 2
# ranks, every byte checked (tests/kv_ranks.py), with the tier on (its own helper, the pool)
# and off (remote.kind = none), in turn, through farm-bench (median of pairs), after
# `kvshim evict` each time.  Two kinds of storage, each seen by the nodes through two mounts
# of their own (different st_dev):
#   disk    one ext4 image on two read-only loop devices with direct I/O (the VM's disk)
#   slowfs  two slowfs mounts of one directory, SLOWFS_LATENCY_US per read (default 20000)
# Storage bytes are the kernel's count inside the ranks (disk) and slowfs' own count (slowfs).
# Needs root (loop devices), FUSE, the mooncake venv (scripts/deps.sh) and farm-bench.
set -euo pipefail

build=$(realpath "${1:-build}")
nfiles=${2:-8}
mib=${3:-32}
lat=${4:-20000}
src=$(cd "$(dirname "$0")/.." && pwd)
venv=${KVS_MOONCAKE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvshim/mooncake-venv}
kvshim=$build/tools/kvshim
ranks="python3 $src/tests/kv_ranks.py"
size=$((mib << 20))
work=$(mktemp -d /var/tmp/kvs_bench_remote.XXXXXX)
tag=br$$
pids=()
mounts=()
loops=()
cleanup() {
	set +e
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
	sleep 0.5
	for m in "${mounts[@]}"; do fusermount3 -u "$m" 2>/dev/null || umount -l "$m"; done
	for l in "${loops[@]}"; do losetup -d "$l"; done
	rm -f /dev/shm/kvshim.$(id -u).$tag*
	rm -rf "$work"
}
trap cleanup EXIT
export MC_TCP_BIND_ADDRESS=127.0.0.1 KVSHIM_SHIM_LOG=warn
unset KVSHIM_CONFIG
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rpc=$(port) http=$(port) met=$(port)
"$venv/bin/mooncake_master" --rpc_address=127.0.0.1 --rpc_port="$rpc" --metrics_host=127.0.0.1 \
	--metrics_port="$met" --enable_http_metadata_server=true --http_metadata_server_host=127.0.0.1 \
	--http_metadata_server_port="$http" >"$work/master.log" 2>&1 &
pids+=($!)
sleep 1.5

config() { # FILE NAME ROOT KIND
	cat >"$1" <<EOF
[files]
roots = $3
write_once = $3
[cache]
name = $tag$2
capacity = $((2 * nfiles * mib + 64))M
[remote]
kind = $4
master = 127.0.0.1:$rpc
metadata = http://127.0.0.1:$http/metadata
host = 127.0.0.1
segment = $((2 * nfiles * mib + 64))M
publish = $([ "$2" = a ] && echo true || echo false)
python = $venv/bin/python
EOF
}
helper() { # CONFIG LOG
	KVSHIM_CONFIG=$1 "$kvshim" remote >"$2" 2>&1 &
	pids+=($!)
	for _ in $(seq 1 150); do grep -q "remote: serving" "$2" && return 0; sleep 0.1; done
	echo "helper did not start: $(tail -c 400 "$2")" >&2
	return 1
}
total() { KVSHIM_CONFIG=$1 "$kvshim" stat --json | python3 -c "import json,sys; print(json.load(sys.stdin)['totals']['$2'])"; }

bench() { # KIND A_DIR B_DIR [COUNT_B]
	local kind=$1 adir=$2 bdir=$3 count=${4:-}
	config "$work/a.ini" a "$adir" mooncake
	config "$work/b.ini" b "$bdir" mooncake
	config "$work/boff.ini" b "$bdir" none
	helper "$work/a.ini" "$work/ha.log"
	helper "$work/b.ini" "$work/hb.log"
	local hb=${pids[-1]}
	KVSHIM_CONFIG=$work/a.ini "$kvshim" run -- $ranks load "$adir" "$nfiles" "$size" --gen 1 --ranks 2
	sleep 2
	echo "== $kind: node A published $(total "$work/a.ini" remote_published_bytes) bytes"
	# One cold load each way, with the storage counts, before the timed pairs.
	KVSHIM_CONFIG=$work/b.ini "$kvshim" evict "$bdir"/[!l]* >/dev/null
	local c0=0
	[ -n "$count" ] && c0=$(sed -n 's/^bytes //p' "$count")
	echo "node B, tier on:  $(KVSHIM_CONFIG=$work/b.ini "$kvshim" run -- $ranks load "$bdir" "$nfiles" "$size" --gen 1 --ranks 2)${count:+, slowfs read $(($(sed -n 's/^bytes //p' "$count") - c0))}"
	KVSHIM_CONFIG=$work/b.ini "$kvshim" evict "$bdir"/[!l]* >/dev/null
	[ -n "$count" ] && c0=$(sed -n 's/^bytes //p' "$count")
	echo "node B, tier off: $(KVSHIM_CONFIG=$work/boff.ini "$kvshim" run -- $ranks load "$bdir" "$nfiles" "$size" --gen 1 --ranks 2)${count:+, slowfs read $(($(sed -n 's/^bytes //p' "$count") - c0))}"
	KVSHIM_CONFIG=$work/b.ini "$kvshim" stat | grep -A1 "^remote "
	farm-bench -n 5 --timeout 900 \
		--vs "sh -c 'KVSHIM_CONFIG=$work/boff.ini $kvshim evict $bdir/[!l]* >/dev/null; KVSHIM_CONFIG=$work/boff.ini exec $kvshim run -- $ranks load $bdir $nfiles $size --gen 1 --ranks 2'" \
		-- sh -c "KVSHIM_CONFIG=$work/b.ini $kvshim evict $bdir/[!l]* >/dev/null; KVSHIM_CONFIG=$work/b.ini exec $kvshim run -- $ranks load $bdir $nfiles $size --gen 1 --ranks 2"
	echo "helper A: $(grep -E '^(Threads|VmRSS)' /proc/${pids[-2]}/status | tr -s '\t\n ' '  ')"
	for p in "${pids[-1]}" "${pids[-2]}"; do
		kill -0 "$p" 2>/dev/null || echo "a helper (pid $p) died during the runs: its log is in /var/tmp/kvs_bench_remote.h*.log"
	done
	cp "$work/ha.log" /var/tmp/kvs_bench_remote.ha.log
	cp "$work/hb.log" /var/tmp/kvs_bench_remote.hb.log
	kill -TERM "${pids[-1]}" "${pids[-2]}" 2>/dev/null
	sleep 1
	rm -f /dev/shm/kvshim.$(id -u).$tag*
}

# ---- disk: one ext4 image, two read-only loop devices with direct I/O
img=$work/kv.img
truncate -s $((nfiles * mib * 2 + 128))M "$img"
mkfs.ext4 -q -F "$img"
mkdir -p "$work/img" "$work/da/kv" "$work/db/kv"
mount -o loop "$img" "$work/img"
$ranks write "$work/img" "$nfiles" "$size" --gen 1 >/dev/null
umount "$work/img"
la=$(losetup -r --direct-io=on -f --show "$img")
lb=$(losetup -r --direct-io=on -f --show "$img")
loops+=("$la" "$lb")
mount -o ro "$la" "$work/da/kv"
mount -o ro "$lb" "$work/db/kv"
mounts+=("$work/da/kv" "$work/db/kv")
bench disk "$work/da/kv" "$work/db/kv"

# ---- slowfs
mkdir -p "$work/src/kv" "$work/sa" "$work/sb"
$ranks write "$work/src/kv" "$nfiles" "$size" --gen 1 >/dev/null
for n in a b; do
	"$build/tests/slowfs" --latency-us "$lat" --attr-timeout 0 --count-file "$work/count_$n" \
		"$work/src" "$work/s$n" -o max_read=1048576
	mounts+=("$work/s$n")
done
sleep 0.5
bench "slowfs ($lat us a read)" "$work/sa/kv" "$work/sb/kv" "$work/count_b"
