#!/usr/bin/env bash
# The region's memory (issue 28), with 8 ranks of tests/kv_ranks.py under LD_PRELOAD checking
# every byte they load, cold and warm:
#   dir       cache.dir: the region lives there, and every tool finds it there (prepare, stat,
#             ls, evict, exporter, reset);
#   numa      cache.numa: the policy a mapping of the region has (/proc/PID/numa_maps);
#   tmpfs     a private tmpfs mounted huge=always (a mount namespace of its own): the region
#             has 2 MiB pages, and a mapping of it is mapped by PMDs;
#   hugetlbfs a hugetlbfs mount with 300 pages reserved for the test (vm.nr_hugepages): the
#             region is reserved from the pool, its pages are huge;
#   fallback  cache.huge_pages = on where the file system gives none: one line per process,
#             4 KiB pages, loads served.
# A case whose requirement is missing (root for unshare and mount, pages the pool cannot
# give) says why and is skipped; the test exits 77 only when every case was.
#   huge_test.sh LIBKVSHIM KVSHIM   (and, from itself: ... --inner CASE)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PREFIX=huge
source "$here/preload_lib.sh" # lib, kvshim, work, name, ok, fail
python3 -c 'import numpy' 2>/dev/null || {
	echo "SKIP: python3 with numpy is needed (tests/kv_ranks.py)"
	exit 77
}
ranks_py="python3 $here/kv_ranks.py"
thp=$(cat /sys/kernel/mm/transparent_hugepage/hpage_pmd_size 2>/dev/null || echo 0)
skipped=0 cases=0

export KVSHIM_CONFIG= KVSHIM_FILES_ROOTS=$work/kv KVSHIM_FILES_SETTLE=0 KVSHIM_CACHE_NAME=$name
export KVSHIM_CACHE_SHARD_SIZE=1M KVSHIM_CACHE_CAPACITY=160M KVSHIM_SHIM_LOG=warn
NFILES=32 SIZE=$((4 << 20)) # 128 MiB unique
$ranks_py write "$work/kv" $NFILES $SIZE >/dev/null || {
	echo "FAIL - cannot write the store"
	exit 1
}

skip() {
	echo "skip - $*"
	skipped=$((skipped + 1))
}

# passed SINCE MESSAGE: ok MESSAGE if no check failed since fails was SINCE.
passed() {
	[ "$fails" -eq "$1" ] && ok "$2"
	return 0
}

# load LABEL: 8 ranks load the store under the shim, twice (cold, then warm); every byte is
# checked, the warm run must be all hits and storage read once; stderr goes to $work/err.
load() {
	local label=$1 out
	: >"$work/err"
	for run in cold warm; do
		out=$(LD_PRELOAD=$lib $ranks_py load "$work/kv" $NFILES $SIZE --ranks 8 2>>"$work/err")
		[[ "$out" == *", ok, storage "* ]] || {
			fail "$label: $run load: $out $(head -c 400 "$work/err")"
			return 1
		}
	done
	local b
	b=$(totals backend_bytes)
	[ "$b" -eq $((NFILES * SIZE)) ] ||
		fail "$label: storage read $b bytes for $((NFILES * SIZE)) unique"
}

# smaps_of PATH FIELD: map the region at PATH, read a byte of every 4 KiB of it, and print
# FIELD of /proc/self/smaps for that mapping (kB), and its KernelPageSize.
smaps_of() {
	python3 - "$1" "$2" <<'PY'
import mmap, os, sys
path, field = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR)
size = os.fstat(fd).st_size
m = mmap.mmap(fd, size, mmap.MAP_SHARED)
s = 0
for off in range(0, size, 4096):
    s += m[off]
import ctypes
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
got, kps, inside = 0, 0, False
for line in open("/proc/self/smaps"):
    head = line.split()[0]
    if "-" in head and not head.endswith(":"):
        lo, hi = (int(x, 16) for x in head.split("-"))
        inside = lo <= addr < hi
    elif inside and head == field + ":":
        got += int(line.split()[1])
    elif inside and head == "KernelPageSize:":
        kps = int(line.split()[1])
print(got, kps)
PY
}

case_dir() {
	local since=$fails
	local dir=/dev/shm/kvshim-huge-$$ out
	mkdir -p "$dir"
	export KVSHIM_CACHE_DIR=$dir
	local path=$dir/kvshim.$(id -u).$name
	"$kvshim" prepare >"$work/out" 2>"$work/err" || fail "dir: prepare: $(cat "$work/err")"
	[ -f "$path" ] && [ ! -e "/dev/shm/kvshim.$(id -u).$name" ] ||
		fail "dir: prepare did not build the region in $dir"
	[ "$(region path)" = "$path" ] || fail "dir: stat --json: path $(region path)"
	grep -q "^populated .*; $dir has .* free$" <<<"$("$kvshim" stat)" ||
		fail "dir: stat: $("$kvshim" stat | grep populated)"
	grep -q "^kvshim.$(id -u).$name " <<<"$("$kvshim" ls)" || fail "dir: ls: $("$kvshim" ls)"
	load dir || return
	local ready before
	before=$(region slots_ready)
	"$kvshim" evict "$work/kv/blk0" >"$work/out" 2>&1 || fail "dir: evict: $(cat "$work/out")"
	ready=$(region slots_ready)
	[ "$ready" -lt "$before" ] || fail "dir: evict left $ready of $before slots ready"
	"$kvshim" exporter --listen 127.0.0.1:0 2>"$work/exp.err" &
	local exp=$! port=
	for _ in $(seq 100); do
		port=$(sed -n 's|^kvshim: exporter listening on http://127\.0\.0\.1:\([0-9]*\)/metrics$|\1|p' \
			"$work/exp.err")
		[ -n "$port" ] && break
		sleep 0.05
	done
	out=$(python3 -c 'import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' \
		"http://127.0.0.1:$port/metrics" 2>&1)
	kill -TERM $exp
	wait $exp
	grep -q "^kvshim_up{region=\"$name\"} 1$" <<<"$out" ||
		fail "dir: the exporter did not find the region in $dir: $(grep kvshim_up <<<"$out")"
	"$kvshim" reset >"$work/out" 2>&1 || fail "dir: reset: $(cat "$work/out")"
	[ ! -e "$path" ] || fail "dir: reset left $path"
	rmdir "$dir"
	unset KVSHIM_CACHE_DIR
	passed "$since" "dir: prepare, stat, ls, 8 ranks, evict, exporter and reset find the region in cache.dir"
}

case_numa() {
	local since=$fails
	local pol want
	for pol in interleave local off; do
		case $pol in
		interleave) want=interleave ;;
		local) want=local ;;
		off) want=default ;;
		esac
		KVSHIM_CACHE_NUMA=$pol "$kvshim" prepare >/dev/null 2>"$work/err" ||
			fail "numa $pol: prepare: $(cat "$work/err")"
		[ "$(region numa)" = "$pol" ] || fail "numa $pol: stat says $(region numa)"
		local line
		line=$(python3 - "/dev/shm/kvshim.$(id -u).$name" <<'PY'
import ctypes, mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
m = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED)
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
for line in open("/proc/self/numa_maps"):
    if int(line.split()[0], 16) == addr:
        print(line.strip())
PY
)
		[[ " $line " == *" $want"[:\ ]* ]] ||
			fail "numa $pol: a mapping of the region has policy: $line"
		reset_region
	done
	passed "$since" "numa: interleave, local and off are the policy of every mapping of the region"
}

case_tmpfs() {
	local since=$fails
	[ "$thp" -gt 0 ] || {
		skip "tmpfs: the kernel has no transparent huge pages"
		return
	}
	local mnt=$work/thp
	mkdir -p "$mnt"
	mount -t tmpfs -o huge=always,size=512M none "$mnt" || {
		skip "tmpfs: cannot mount a tmpfs here"
		return
	}
	export KVSHIM_CACHE_DIR=$mnt
	load tmpfs || return
	[ "$(region page_size)" = "$thp" ] && [ "$(region huge_pages)" = tmpfs ] ||
		fail "tmpfs: stat: page_size $(region page_size), huge_pages $(region huge_pages)"
	local got
	got=$(smaps_of "$mnt/kvshim.$(id -u).$name" ShmemPmdMapped)
	[ "${got% *}" -ge $((128 << 10)) ] ||
		fail "tmpfs: a mapping of the region has $got kB ShmemPmdMapped, not the 128 MiB loaded"
	reset_region
	unset KVSHIM_CACHE_DIR
	umount "$mnt"
	passed "$since" "tmpfs: huge=always: 8 ranks served right, 2 MiB pages mapped by PMDs"
}

# The pool is the node's: raise it by what the test needs, under a lock so that two runs of
# the test do not undo each other, and give it back at exit.
POOL_ADD=300
pool_was=
pool_restore() {
	[ -n "$pool_was" ] || return
	local now
	now=$(cat /proc/sys/vm/nr_hugepages)
	echo $((now > POOL_ADD ? now - POOL_ADD : 0)) >/proc/sys/vm/nr_hugepages
	pool_was=
}

case_hugetlbfs() {
	local since=$fails
	local mnt=$work/hugetlbfs size=$((2 << 20)) have
	[ -w /proc/sys/vm/nr_hugepages ] && [ -d /sys/kernel/mm/hugepages/hugepages-2048kB ] || {
		skip "hugetlbfs: cannot reserve 2 MiB pages here (vm.nr_hugepages)"
		return
	}
	exec 9>/tmp/kvshim-huge-test.lock
	flock -w 300 9 || {
		skip "hugetlbfs: another run holds the pool"
		return
	}
	pool_was=$(cat /proc/sys/vm/nr_hugepages)
	echo $((pool_was + POOL_ADD)) >/proc/sys/vm/nr_hugepages
	have=$(cat /proc/sys/vm/nr_hugepages)
	if [ "$have" -lt $((pool_was + POOL_ADD)) ]; then
		pool_restore
		skip "hugetlbfs: the pool could give $((have - pool_was)) of $POOL_ADD pages"
		return
	fi
	mkdir -p "$mnt"
	mount -t hugetlbfs -o pagesize=2M none "$mnt" || {
		pool_restore
		skip "hugetlbfs: cannot mount a hugetlbfs here"
		return
	}
	export KVSHIM_CACHE_DIR=$mnt
	local resv0 total pool=/sys/kernel/mm/hugepages/hugepages-2048kB
	# The region takes the pool down to the headroom exactly: the allocations after it come
	# from its reservation, and a check of free space against the headroom would refuse
	# every one of them (the loads would then read storage).
	"$kvshim" prepare >/dev/null 2>"$work/err" || fail "hugetlbfs: prepare: $(cat "$work/err")"
	total=$(region total_bytes)
	reset_region
	export KVSHIM_CACHE_SHM_HEADROOM=$((($(cat $pool/free_hugepages) - $(cat $pool/resv_hugepages)) * size - total))
	# The allocators' path (lazy: no walk), then the walk's (prepare), on the same pool.
	"$kvshim" prepare >"$work/out" 2>"$work/err" && grep -q " 160 of 160 slots prepared" "$work/out" ||
		fail "hugetlbfs: prepare at the headroom: $(cat "$work/out" "$work/err")"
	reset_region
	resv0=$(cat $pool/resv_hugepages)
	KVSHIM_CACHE_POPULATE=lazy load hugetlbfs
	[ "$(region page_size)" = $size ] && [ "$(region huge_pages)" = hugetlbfs ] ||
		fail "hugetlbfs: stat: page_size $(region page_size), huge_pages $(region huge_pages)"
	local got used
	got=$(smaps_of "$mnt/kvshim.$(id -u).$name" Shared_Hugetlb)
	[ "${got#* }" = 2048 ] || fail "hugetlbfs: a mapping of the region has KernelPageSize ${got#* } kB"
	# Reserved when it was built: what was not allocated yet is still reserved for it.
	used=$(($(cat $pool/nr_hugepages) - $(cat $pool/free_hugepages) +
		$(cat $pool/resv_hugepages) - resv0))
	[ "$used" -ge $((160 / 2)) ] || fail "hugetlbfs: the region holds $used pages of the pool"
	[ "$(totals fallbacks)" = 0 ] || fail "hugetlbfs: $(totals fallbacks) fallbacks: $(sort -u "$work/err" | head -c 600)"
	reset_region
	unset KVSHIM_CACHE_DIR KVSHIM_CACHE_SHM_HEADROOM
	umount "$mnt"
	pool_restore
	passed "$since" "hugetlbfs: 8 ranks served right from 2 MiB pages reserved for the region"
}

case_fallback() {
	local since=$fails
	local mnt=$work/small
	mkdir -p "$mnt"
	mount -t tmpfs -o huge=never,size=512M none "$mnt" || {
		skip "fallback: cannot mount a tmpfs here"
		return
	}
	export KVSHIM_CACHE_DIR=$mnt KVSHIM_CACHE_HUGE_PAGES=on
	load fallback
	[ "$(region page_size)" = 4096 ] && [ "$(region huge_pages)" = none ] ||
		fail "fallback: stat: page_size $(region page_size), huge_pages $(region huge_pages)"
	local lines built most
	lines=$(grep -c 'cache.huge_pages = on, but' "$work/err")
	built=$(grep -c "gives no huge pages: .* has 4 KiB pages; \`mount -o remount,huge=advise $mnt\`" "$work/err")
	most=$(grep 'cache.huge_pages = on, but' "$work/err" | sed -n 's/.* pid \([0-9]*\) .*/\1/p' |
		sort | uniq -c | sort -rn | awk 'NR == 1 { print $1 }')
	[ "$built" -eq 1 ] && [ "${most:-0}" -eq 1 ] && [ "$lines" -ge 1 ] ||
		fail "fallback: $lines lines ($built from the creator, at most $most per process): $(head -c 600 "$work/err")"
	[ "$(grep -v 'cache.huge_pages = on, but' "$work/err" | grep -c .)" = 0 ] ||
		fail "fallback: other lines on stderr: $(head -c 400 "$work/err")"
	reset_region
	unset KVSHIM_CACHE_DIR KVSHIM_CACHE_HUGE_PAGES
	umount "$mnt"
	passed "$since" "fallback: cache.huge_pages = on without huge pages: one line per process, 4 KiB pages, served"
}

if [ "${3:-}" = --inner ]; then
	# In a mount namespace of our own: mounts vanish with it, whatever happens.
	mount --make-rprivate / 2>/dev/null
	trap 'reset_region; umount -l "$work"/* 2>/dev/null; pool_restore; cleanup' EXIT
	"case_$4"
	exit $((fails ? 1 : skipped ? 77 : 0))
fi

trap 'rm -rf "/dev/shm/kvshim-huge-$$"; cleanup' EXIT # case_dir's cache.dir, whatever happens
for c in dir numa; do
	cases=$((cases + 1))
	# A subshell: a case that stops early leaves no variable set for the next.
	(
		"case_$c"
		exit "$fails"
	)
	fails=$((fails + $?))
	reset_region
done
for c in tmpfs hugetlbfs fallback; do
	cases=$((cases + 1))
	if [ "$(id -u)" -ne 0 ] || ! unshare -m true 2>/dev/null; then
		skip "$c: needs a mount namespace of its own (root, unshare -m)"
		continue
	fi
	unshare -m bash "$0" "$1" "$2" --inner "$c"
	case $? in
	0) ;;
	77) skipped=$((skipped + 1)) ;;
	*) fails=$((fails + 1)) ;;
	esac
done
[ "$fails" -eq 0 ] || exit 1
[ "$skipped" -lt "$cases" ] || exit 77
exit 0
