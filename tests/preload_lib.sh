# Shared by the tests that run programs under LD_PRELOAD (e2e, hostile, aio, kaio, gpu, ...):
# source it with LIBKVSHIM and KVSHIM as $1 and $2 and PREFIX naming the test.  It sets lib
# (with a sanitizer runtime first when KVS_E2E_PRELOAD names one), kvshim, work (a scratch
# folder under /var/tmp, where O_DIRECT works) and name (a region of this run's own), removes
# both at exit, and defines ok/fail, which count into fails, and the helpers below.
lib=${KVS_E2E_PRELOAD:+$KVS_E2E_PRELOAD:}$1
kvshim=$2
fails=0
work=$(mktemp -d "/var/tmp/kvshim-$PREFIX.XXXXXX")
name="$PREFIX-$$"
cleanup() {
	KVSHIM_CONFIG= KVSHIM_CACHE_NAME=$name "$kvshim" reset --force >/dev/null 2>&1
	rm -rf "$work"
}
trap cleanup EXIT
ok() { echo "ok   - $*"; }
fail() {
	echo "FAIL - $*"
	fails=$((fails + 1))
}

reset_region() { "$kvshim" reset --force >/dev/null 2>&1; }
stat_json() { "$kvshim" stat --json 2>/dev/null; }
totals() { # COUNTER: one counter of stat --json's totals, 0 if there is no region
	stat_json | python3 -c 'import json,sys
try: print(json.load(sys.stdin)["totals"][sys.argv[1]])
except Exception: print(0)' "$1"
}
region() { # FIELD: one field of stat --json's region, "none" if there is no region
	stat_json | python3 -c 'import json,sys
try: print(json.load(sys.stdin)["region"][sys.argv[1]])
except Exception: print("none")' "$1"
}
fake_sum() { # DIR PREFIX COUNTER: the counter summed over a fake library's stats files DIR/PREFIX.*
	cat "$1/$2".* 2>/dev/null | awk -v k="$3" '$1 == k { s += $2 } END { print s + 0 }'
}
clean_err() { # FILE: nothing on it but the shim's info line saying it attached
	[ "$(grep -v '^kvshim: [0-9T:.Z-]* pid [0-9]* info: attached' "$1" | grep -c .)" = 0 ]
}

# Storage by the kernel's count.  A process's /proc/PID/io read_bytes includes every child it
# has reaped (the kernel adds a waited-for child's I/O to its parent's), so the difference of
# io_read_bytes around processes this script started and waited for is what the kernel read
# from storage for them, whatever they are (Python, C, UCM's threads, the shim's own threads).
io_read_bytes() { awk '/^read_bytes:/ { print $2 }' "/proc/$$/io"; }
# storage_agrees KERNEL BACKEND ATIME NFILES [PASSED]: 0 when the kernel's count of a run agrees
# with the bytes the shim counted for it (backend_bytes), else 1 with the difference in
# $storage_why.  The kernel may count more by the shim's atime reads (ATIME, the run's
# atime_updates: one block each, atime.c), by the last block of each of NFILES files (O_DIRECT
# reads whole blocks; backend_bytes counts the bytes a read returned), by at most PASSED bytes
# the test knows were passed through (reads the shim counts in unserved_*) and $program_pages
# of metadata and program pages; never less.
#
# program_pages: what the kernel may read for a run besides its data: the interpreters and
# libraries the run starts fault in pages that other tests' I/O pushed out of the page cache
# (110 KiB seen under CI's two tests at a time, 92 KiB for one Python process).  256 KiB is a
# quarter of the tests' 1 MiB shards: one shard read past the cache still fails.
program_pages=262144
storage_agrees() {
	local kernel=$1 backend=$2 atime=$3 nfiles=$4
	local slack=$((atime * 4096 + nfiles * 4096 + ${5:-0} + program_pages))
	storage_why=""
	if [ "$kernel" -lt "$backend" ]; then
		storage_why="the kernel read $kernel bytes, less than the shim's backend_bytes $backend"
	elif [ $((kernel - backend)) -gt $slack ]; then
		storage_why="the kernel read $kernel bytes, the shim's backend_bytes is $backend: $((kernel - backend)) bytes read past the cache (allowed $slack: $atime atime reads, $nfiles files' last blocks, metadata)"
	fi
	[ -z "$storage_why" ]
}
