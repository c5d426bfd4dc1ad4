#!/usr/bin/env bash
# remote_test.sh - the remote tier (remote.kind = mooncake) with a real Mooncake Store, two
# "nodes" on one machine.
#
#   bash remote_test.sh LIBKVSHIM KVSHIM SLOWFS SOURCE_DIR
#
# One mooncake_master on loopback (its HTTP metadata server embedded, client_ttl 2 s); two
# regions (two cache.names), each with its own helper (`kvshim remote`); the same files seen
# by the two nodes through two mounts of their own, so with different st_dev:
#   - two slowfs (FUSE) mounts of one directory, each with its own count of the bytes that
#     reached storage through it (slowfs --count-file), 10 ms per read: slow storage; FUSE
#     gives no inode generation, so write-once files are kept (and shared) once settled;
#   - where loop devices work, one ext4 image on two read-only loop devices: storage counted
#     by the kernel (/proc/PID/io read_bytes, summed over the ranks by kv_ranks.py).
# Cases: node B reads nothing from storage after node A loaded, every byte right; a file
# rewritten under its name never comes back from the pool, nor does a file of a root keyed by
# change; and the faults, each bounded: A's helper stopped, A's helper killed, the master
# stopped, the master killed and restarted, B's own helper killed mid-load.
# Skips (77) without the mooncake wheel (scripts/deps.sh: KVS_MOONCAKE_VENV), FUSE or slowfs.
set -u
set -o pipefail

lib=${1:?usage: remote_test.sh LIB KVSHIM SLOWFS SOURCE_DIR}
kvshim=${2:?}
slowfs=${3:?}
src_dir=${4:?}
venv=${KVS_MOONCAKE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvshim/mooncake-venv}
py=$venv/bin/python
ranks_py=$src_dir/tests/kv_ranks.py
size=$((4 << 20))
nfiles=8
total=$((nfiles * size))
failed=0

skip() {
	echo "SKIP: $*"
	exit 77
}
ok() { echo "ok - $*"; }
fail() {
	echo "not ok - $*"
	failed=1
}

[ -x "$py" ] && "$py" -c 'import mooncake.store' 2>/dev/null ||
	skip "no Python with the mooncake wheel at $venv (scripts/deps.sh installs it)"
[ -x "$venv/bin/mooncake_master" ] || skip "no mooncake_master in $venv/bin"
[ -x "$slowfs" ] && [ -e /dev/fuse ] || skip "no FUSE or no slowfs: the nodes' mounts are slowfs"

work=$(mktemp -d /var/tmp/kvs_remote.XXXXXX)
tag=rt$$
pids=()
mounts=()
cleanup() {
	for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill -TERM "$p" 2>/dev/null; done
	sleep 0.5
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
	for m in "${mounts[@]}"; do
		fusermount3 -u "$m" 2>/dev/null || umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
	done
	[ -n "${loops:-}" ] && for l in $loops; do losetup -d "$l" 2>/dev/null; done
	rm -f /dev/shm/kvshim.$(id -u).$tag*
	rm -rf "$work"
}
trap cleanup EXIT
export MC_TCP_BIND_ADDRESS=127.0.0.1 KVSHIM_SHIM_LOG=warn
unset KVSHIM_CONFIG
# A sanitizer build: its runtime first in the processes that load our libraries (the ranks
# under the shim, the helper's Python with libkvshim_remote.so), not in Mooncake's master.
san=${KVS_E2E_PRELOAD:-}
[ -n "$san" ] && export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rpc=$(free_port)
http=$(free_port)
metrics=$(free_port)

start_master() {
	"$venv/bin/mooncake_master" --rpc_address=127.0.0.1 --rpc_port=$rpc \
		--metrics_host=127.0.0.1 --metrics_port=$metrics --enable_http_metadata_server=true \
		--http_metadata_server_host=127.0.0.1 --http_metadata_server_port=$http \
		--client_ttl=2 >>"$work/master.log" 2>&1 &
	master=$!
	pids+=($master)
	for _ in $(seq 1 100); do
		python3 -c "import socket; socket.create_connection(('127.0.0.1',$rpc),0.2)" 2>/dev/null &&
			return 0
		sleep 0.1
	done
	return 1
}

# config NODE ROOT WONCE [KIND [PUBLISH]]: node NODE's configuration file.  files.settle is
# 1 s: on FUSE a node keeps its first load of a file for files.settle only, and a put that the
# helper takes after that finds the shard gone and is dropped.  With 200 ms, one CI run of
# many (under ASan) dropped one put of 32, most likely so: the window starts before the pool
# is asked, so files.settle must stay well above remote.timeout_ms (300 ms).
config() {
	cat >"$work/$1.ini" <<EOF
[files]
roots = $2
write_once = $3
settle = 1000
[cache]
name = $tag$1
capacity = 256M
[loader]
wait_timeout_ms = 20000
[remote]
kind = ${4:-mooncake}
master = 127.0.0.1:$rpc
metadata = http://127.0.0.1:$http/metadata
host = 127.0.0.1
segment = 256M
timeout_ms = 300
publish = ${5:-true}
python = $py
EOF
}

# helper NODE: start NODE's helper, wait until it serves; its pid in helper_NODE.
helper() {
	: >"$work/h$1.log"
	KVSHIM_CONFIG="$work/$1.ini" LD_PRELOAD=$san "$kvshim" remote >>"$work/h$1.log" 2>&1 &
	eval "helper_$1=$!"
	pids+=($!)
	for _ in $(seq 1 150); do
		grep -q "remote: serving" "$work/h$1.log" && return 0
		sleep 0.1
	done
	echo "# helper $1 did not start: $(tail -c 600 "$work/h$1.log")"
	return 1
}

# stat NODE KEY: a counter of NODE's region, every process's.
stat() {
	KVSHIM_CONFIG="$work/$1.ini" "$kvshim" stat --json |
		python3 -c "import json,sys; print(json.load(sys.stdin)['totals']['$2'])"
}

# load NODE DIR GEN [RANKS]: NODE's ranks load the files of DIR under the shim, every byte
# checked; prints kv_ranks.py's storage count (the kernel's).  Status: the load's.
load() {
	local out
	out=$(KVSHIM_CONFIG="$work/$1.ini" LD_PRELOAD=$san timeout 120 "$kvshim" run -- \
		python3 "$ranks_py" load "$2" $nfiles $size --gen "$3" --ranks "${4:-2}" 2>"$work/err")
	local st=$?
	echo "$out" | sed -n 's/.*storage \([0-9]*\).*/\1/p'
	return $st
}

count() { sed -n 's/^bytes //p' "$1" 2>/dev/null || echo 0; }

# evict NODE DIR: drop NODE's cached shards of the files (a cold node again).
evict() { KVSHIM_CONFIG="$work/$1.ini" "$kvshim" evict "$2"/* >/dev/null; }

# wait_published NODE BYTES: until NODE's helper has put that much (10 s at most).
wait_published() {
	for _ in $(seq 1 100); do
		[ "$(stat "$1" remote_published_bytes)" -ge "$2" ] && return 0
		sleep 0.1
	done
	return 1
}

start_master || skip "mooncake_master did not start: $(tail -c 400 "$work/master.log")"

# ---------------------------------------------------------------- the slowfs nodes
mkdir -p "$work/src/kv" "$work/src/chg" "$work/a/m" "$work/b/m"
python3 "$ranks_py" write "$work/src/kv" $nfiles $size --gen 1 >/dev/null
python3 "$ranks_py" write "$work/src/chg" $nfiles $size --gen 1 >/dev/null
sleep 1.1 # files.settle: FUSE gives no inode generation, so write-once files are kept once settled
for n in a b; do
	"$slowfs" --latency-us 10000 --attr-timeout 0 --count-file "$work/count_$n" \
		"$work/src" "$work/$n/m" -o max_read=1048576 2>>"$work/slowfs.log" ||
		skip "slowfs did not mount: $(tail -c 300 "$work/slowfs.log")"
	mounts+=("$work/$n/m")
done
for _ in $(seq 1 100); do
	[ "$(grep -c " $work/[ab]/m fuse" /proc/mounts)" -eq 2 ] && break
	sleep 0.05
done
dev_a=$(command stat -c %d "$work/a/m/kv")
dev_b=$(command stat -c %d "$work/b/m/kv")
[ "$dev_a" != "$dev_b" ] || skip "the two slowfs mounts share st_dev"

config a "$work/a/m" "$work/a/m/kv"
# Node B does not publish: every shard it gets from the pool is one node A put there.
config b "$work/b/m" "$work/b/m/kv" mooncake false
config boff "$work/b/m" "$work/b/m/kv" none
sed -i "s/name = ${tag}boff/name = ${tag}b/" "$work/boff.ini" # node B's region, the tier off
helper a || exit 1
helper b || exit 1

# 1. Node A loads from storage and publishes; node B then reads nothing from storage.
t0=$(date +%s%N)
load a "$work/a/m/kv" 1 >/dev/null || fail "node A's load: $(head -c 300 "$work/err")"
ta=$((($(date +%s%N) - t0) / 1000000))
a_read=$(count "$work/count_a")
if wait_published a $total; then
	ok "node A loaded $a_read bytes from storage for $total in $ta ms and published them all"
else
	fail "node A published $(stat a remote_published_bytes) of $total bytes (dropped $(stat a remote_dropped), expired $(stat a shards_expired)); $(tail -c 300 "$work/ha.log")"
fi
b0=$(count "$work/count_b")
t0=$(date +%s%N)
load b "$work/b/m/kv" 1 >/dev/null
st=$?
tb=$((($(date +%s%N) - t0) / 1000000))
b_read=$(($(count "$work/count_b") - b0))
hits=$(stat b remote_bytes)
if [ $st -ne 0 ]; then
	fail "node B's load from the pool: $(head -c 300 "$work/err")"
# At least the whole set: FUSE gives no inode generation, so a shard this node first saw less
# than files.settle ago is kept only that long, and a slow rank may load it again (from the pool).
elif [ "$b_read" -eq 0 ] && [ "$(stat b backend_bytes)" -eq 0 ] && [ "$hits" -ge $total ]; then
	ok "node B read 0 bytes from storage (slowfs' count, backend_bytes 0), $hits from the pool, every byte right, in $tb ms"
else
	fail "node B read $b_read bytes from storage (backend_bytes $(stat b backend_bytes)), $hits from the pool, for $total"
fi
# The same load with the tier off, for the figure (not asserted: timing is for benchmarks).
evict b "$work/b/m/kv"
t0=$(date +%s%N)
load boff "$work/b/m/kv" 1 >/dev/null || fail "node B, tier off: $(head -c 300 "$work/err")"
toff=$((($(date +%s%N) - t0) / 1000000))
echo "# node B over slowfs (10 ms a read): $tb ms from the pool, $toff ms with the tier off"

# 2. A file rewritten under its name (new mtime, new birth) never comes back from the pool.
python3 "$ranks_py" write "$work/src/kv" $nfiles $size --gen 2 >/dev/null
sleep 1.1
evict b "$work/b/m/kv"
h0=$(stat b remote_hits)
load b "$work/b/m/kv" 2 >/dev/null
st=$?
if [ $st -eq 0 ] && [ "$(stat b remote_hits)" -eq "$h0" ]; then
	ok "files rewritten under their names: node B read the new bytes, none from the pool"
else
	fail "rewritten files: load status $st, pool hits $h0 -> $(stat b remote_hits): $(head -c 300 "$work/err")"
fi
# A root keyed by change: node A's loads are not published, node B's do not ask.
p0=$(stat a remote_published_bytes)
load a "$work/a/m/chg" 1 >/dev/null || fail "node A, root keyed by change: $(head -c 300 "$work/err")"
python3 "$ranks_py" write "$work/src/chg" $nfiles $size --gen 3 --shape inplace >/dev/null
sleep 1.1
q0=$(($(stat b remote_hits) + $(stat b remote_misses)))
load b "$work/b/m/chg" 3 >/dev/null
st=$?
q1=$(($(stat b remote_hits) + $(stat b remote_misses)))
if [ $st -eq 0 ] && [ "$(stat a remote_published_bytes)" -eq "$p0" ] && [ "$q1" -eq "$q0" ]; then
	ok "a root keyed by change: nothing published, nothing asked, the rewrite read right"
else
	fail "root keyed by change: status $st, published $p0 -> $(stat a remote_published_bytes), asks $q0 -> $q1"
fi

# Both helpers steer once a second from what the loads counted: still serving after seeing
# both kinds of load.
sleep 1.5
if kill -0 "$helper_a" 2>/dev/null && kill -0 "$helper_b" 2>/dev/null; then
	ok "both helpers still serve after the loads (their route judged on both speeds)"
else
	fail "a helper died: A: $(tail -c 300 "$work/ha.log"); B: $(tail -c 300 "$work/hb.log")"
fi

# Faults.  Node A loads gen 2 and publishes it; B is made cold before each case.
p0=$(stat a remote_published_bytes)
load a "$work/a/m/kv" 2 >/dev/null || fail "node A's load of gen 2: $(head -c 300 "$work/err")"
wait_published a $((p0 + total)) || fail "node A published $(($(stat a remote_published_bytes) - p0)) of gen 2's $total bytes"
restart_b() { # a new helper for B, whose breaker has not seen the last fault (takes the ring over)
	kill -TERM "$helper_b" 2>/dev/null
	wait "$helper_b" 2>/dev/null
	helper b || fail "node B's helper did not start again"
}
fault_load() { # NAME BOUND_MS: B loads gen 2, right bytes within BOUND_MS
	evict b "$work/b/m/kv"
	local t0 st ms e0=$(stat b remote_errors)
	t0=$(date +%s%N)
	load b "$work/b/m/kv" 2 >/dev/null
	st=$?
	ms=$((($(date +%s%N) - t0) / 1000000))
	if [ $st -ne 0 ]; then
		fail "$1: node B's load: $(head -c 300 "$work/err")"
	elif [ $ms -gt "$2" ]; then
		fail "$1: node B's load took $ms ms (bound $2 ms)"
	else
		ok "$1: node B's load right in $ms ms (bound $2 ms; pool errors $(($(stat b remote_errors) - e0)), each bounded by remote.timeout_ms 300)"
	fi
}
# 3. A's helper stopped: its segment holds the bytes, and nobody answers for them.
restart_b
kill -STOP "$helper_a"
fault_load "node A's helper stopped" 15000
kill -CONT "$helper_a"
# 4. A's helper killed.
restart_b
kill -KILL "$helper_a"
wait "$helper_a" 2>/dev/null
fault_load "node A's helper killed" 15000
helper a || fail "node A's helper did not start again after a kill"
# 5. The master stopped.
restart_b
kill -STOP "$master"
fault_load "the master stopped" 15000
kill -CONT "$master"
# 6. The master killed and restarted: the pool is empty; A's next load publishes again.
restart_b
kill -KILL "$master"
wait "$master" 2>/dev/null
fault_load "the master killed" 15000
start_master || fail "the master did not restart"
sleep 3 # the clients remount their segments
evict a "$work/a/m/kv"
p0=$(stat a remote_published_bytes)
load a "$work/a/m/kv" 2 >/dev/null || fail "node A after the restart: $(head -c 300 "$work/err")"
if wait_published a $((p0 + total)); then
	restart_b
	evict b "$work/b/m/kv"
	h0=$(stat b remote_bytes)
	load b "$work/b/m/kv" 2 >/dev/null
	if [ $? -eq 0 ] && [ $(($(stat b remote_bytes) - h0)) -ge $total ]; then
		ok "the master restarted: node A published again, node B read it all from the pool"
	else
		fail "after the master's restart node B got $(($(stat b remote_bytes) - h0)) bytes from the pool of $total"
	fi
else
	fail "after the master's restart node A published $(($(stat a remote_published_bytes) - p0)) of $total"
fi
# 7. B's own helper killed in the middle of B's load.
evict b "$work/b/m/kv"
(sleep 0.15 && kill -KILL "$helper_b") &
killer=$!
fault_load "node B's own helper killed mid-load" 15000
wait $killer

# 8. remote.zero_copy: B's helper registers B's region and gets straight into the slots.
config bzc "$work/b/m" "$work/b/m/kv" mooncake false
sed -i "s/name = ${tag}bzc/name = ${tag}b/; s/^python = /zero_copy = true\npython = /" "$work/bzc.ini"
if helper bzc; then
	evict b "$work/b/m/kv"
	h0=$(stat b remote_bytes)
	b0=$(count "$work/count_b")
	load b "$work/b/m/kv" 2 >/dev/null
	st=$?
	got=$(($(stat b remote_bytes) - h0))
	read_b=$(($(count "$work/count_b") - b0))
	if [ $st -eq 0 ] && [ $got -ge $total ] && [ $read_b -eq 0 ] &&
		grep -q "the region is registered with the pool" "$work/hbzc.log"; then
		ok "remote.zero_copy: node B got all $got bytes straight into its slots, 0 from storage, every byte right"
	else
		fail "remote.zero_copy: status $st, $got of $total bytes from the pool, $read_b from storage: $(head -c 300 "$work/err") $(tail -c 300 "$work/hbzc.log")"
	fi
else
	fail "remote.zero_copy: the helper did not start"
fi

# ---------------------------------------------------------------- the kernel's count
img=$work/kv.img
if command -v mkfs.ext4 >/dev/null && truncate -s 96M "$img" && mkfs.ext4 -q -F "$img" &&
	mkdir -p "$work/img" && mount -o loop "$img" "$work/img" 2>/dev/null; then
	python3 "$ranks_py" write "$work/img" $nfiles $size --gen 7 >/dev/null
	umount "$work/img"
	la=$(losetup -r -f --show "$img" 2>/dev/null)
	lb=$(losetup -r -f --show "$img" 2>/dev/null)
	loops="$la $lb"
	mkdir -p "$work/la/kv" "$work/lb/kv"
	if [ -n "$la" ] && [ -n "$lb" ] && mount -o ro "$la" "$work/la/kv" &&
		mount -o ro "$lb" "$work/lb/kv"; then
		mounts+=("$work/la/kv" "$work/lb/kv")
		helper b || true
		config la "$work/la" "$work/la/kv"
		config lb "$work/lb" "$work/lb/kv" mooncake false
		sed -i "s/name = ${tag}la/name = ${tag}a/" "$work/la.ini"
		sed -i "s/name = ${tag}lb/name = ${tag}b/" "$work/lb.ini"
		p0=$(stat a remote_published_bytes)
		sa=$(load la "$work/la/kv" 7)
		wait_published a $((p0 + total)) || true
		sb=$(load lb "$work/lb/kv" 7)
		st=$?
		if [ $st -eq 0 ] && [ "$sa" -ge $total ] && [ "$sb" -eq 0 ]; then
			ok "one ext4 image on two loop devices: node A's ranks read $sa bytes from storage, node B's 0 (the kernel's count), every byte right"
		else
			fail "loop devices: node A read $sa, node B $sb (status $st): $(head -c 300 "$work/err")"
		fi
	else
		echo "skip - loop devices: cannot attach or mount the image twice here"
	fi
else
	echo "skip - loop devices: no mkfs.ext4 or no loop mount here"
fi

# The helper's own weight, for the figures.
if [ -r /proc/$helper_a/status ]; then
	echo "# helper A: $(grep -E '^Threads' /proc/$helper_a/status | tr -s '\t ' ' '), $(grep -E '^VmRSS' /proc/$helper_a/status | tr -s '\t ' ' ')"
fi
exit $failed
