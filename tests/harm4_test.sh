#!/usr/bin/env bash
# Never harm the host, part 4: a file of a files.write_once root is kept for good, so every way
# a process under the shim changes it must be seen: its shards dropped, the change counted
# (write_once_violations) when it overwrote bytes the file held, never when it did not (an
# append, a failed write).  Each case runs tests/harm4.c without the shim and with it, on the
# same file written afresh, and compares what the program read after the change (the whole
# file by O_DIRECT, served, and buffered, passed through); then the counter.  Also: the shim's
# anchor never takes a number a launcher's dup2 closes (the program's record lock stays), and
# a number closed inside glibc keeps no class into its next life.
#   harm4_test.sh LIBKVSHIM KVSHIM HARM4
set -uo pipefail
h=$3
PREFIX=harm4
source "$(dirname "$0")/preload_lib.sh" # lib, work, name, ok, fail, reset_region, totals

mkdir -p "$work/kv"
export KVSHIM_CONFIG=
export KVSHIM_FILES_ROOTS=$work/kv
export KVSHIM_FILES_WRITE_ONCE=$work/kv
export KVSHIM_CACHE_NAME=$name
export KVSHIM_CACHE_CAPACITY=64M
export KVSHIM_CACHE_SHARD_SIZE=1M
f=$work/kv/f
size=$((4 * 1024 * 1024 + 12 * 1024)) # a short last shard

"$h" mk "$f" $size 1 && head -c 4096 "$f" >/dev/null && "$h" load "$f" 2>/dev/null ||
	{ echo "SKIP: O_DIRECT does not work in $work"; exit 77; }

# case MODE COUNTED: MODE without the shim and with it, on a file written afresh; the shim's
# run must read what the plain run read, and count COUNTED violations (0 or 1).
case_() {
	local mode=$1 counted=$2 plain shim v
	"$h" mk "$f" $size 1
	plain=$("$h" "$mode" "$f" 2>&1)
	"$h" mk "$f" $size 1
	reset_region
	LD_PRELOAD=$lib "$h" load "$f" 2>/dev/null # the shards, kept for good by another process
	shim=$(LD_PRELOAD=$lib "$h" "$mode" "$f" 2>"$work/err")
	v=$(totals write_once_violations)
	if [ "$shim" != "$plain" ]; then
		fail "$mode: with the shim [$shim], without [$plain]"
	elif [ "$v" != "$counted" ]; then
		fail "$mode: write_once_violations $v, want $counted ($(grep kvshim "$work/err" | head -2))"
	elif [ "$counted" = 1 ] && ! grep -q "files.write_once: .* rewritten in place" "$work/err"; then
		fail "$mode: counted, but not said: $(head -c 300 "$work/err")"
	elif [ "$counted" = 0 ] && grep -q "rewritten in place" "$work/err"; then
		fail "$mode: said as a rewrite: $(grep kvshim "$work/err" | head -2)"
	else
		ok "$mode: the bytes the kernel has ($shim), write_once_violations $v"
	fi
}

case_ ftrunc 1
case_ ftrunc_half 1
case_ grow 0
case_ mmapw 1
case_ mmaplive 1
case_ mmapmoved 1
case_ mmapsys 1
case_ mmapro 0
# After the munmap the file is kept again: the last read above loaded it, and a load now is
# served whole from the cache (5 shards hit, no storage).
b0=$(totals backend_bytes) h0=$(totals shards_hit)
LD_PRELOAD=$lib "$h" load "$f" 2>/dev/null
b1=$(totals backend_bytes) h1=$(totals shards_hit)
if [ "$b1" = "$b0" ] && [ $((h1 - h0)) -eq 5 ]; then
	ok "after the mapping's munmap the file is kept again (5 shards hit, 0 bytes loaded)"
else
	fail "after the mapping's munmap: $((b1 - b0)) bytes loaded, $((h1 - h0)) shards hit (want 0, 5)"
fi
# A process that holds the mapping and is killed: while it lives, no load of the file is kept
# (each read reads storage); once its slot is reclaimed, loads are kept again.
# loaded NAME: one O_DIRECT read of $f by a process under the shim; NAME gets the storage bytes
# it took by the shim's count (backend_bytes) and by the kernel's (io_read_bytes), "shim/kernel".
loaded() {
	local b0 k0
	b0=$(totals backend_bytes)
	k0=$(io_read_bytes)
	LD_PRELOAD=$lib "$h" load "$f" 2>/dev/null
	printf -v "$1" '%s/%s' $(($(totals backend_bytes) - b0)) $(($(io_read_bytes) - k0))
}
"$h" mk "$f" $size 1
"$h" mk "$work/kv/other" $size 2
reset_region
coproc HOLD { LD_PRELOAD=$lib exec "$h" mmaphold "$f" 2>/dev/null; }
hold=$HOLD_PID # bash unsets HOLD_PID once the coprocess is gone
read -r -t 10 line <&"${HOLD[0]}"
# Another process writes the file meanwhile, and another attaches and exits (its slot is
# reclaimed by the next attach): neither ends the holder's hold.
LD_PRELOAD=$lib "$h" poke "$f" 2>/dev/null
LD_PRELOAD=$lib "$h" load "$work/kv/other" 2>/dev/null
loaded l1
loaded l2
kill -9 "$hold" 2>/dev/null
wait "$hold" 2>/dev/null
loaded l3
loaded l4
# While it lived each load read the file, by both counts; after, the last read nothing (the
# kernel's count may carry the program pages of the processes that ask: program_pages).
if [ "$line" = mapped ] && [ "${l1%/*}" -ge $size ] && [ "${l1#*/}" -ge $size ] &&
	[ "${l2%/*}" -ge $size ] && [ "${l2#*/}" -ge $size ] && [ "${l3%/*}" -ge $size ] &&
	[ "${l4%/*}" = 0 ] && [ "${l4#*/}" -le $program_pages ]; then
	ok "a mapping held by a process: loads read $l1 then $l2 bytes (shim/kernel) while it lived; killed, $l3 then $l4"
else
	fail "a mapping held by a process [$line]: loads read $l1, $l2 (shim/kernel) while it lived, $l3, $l4 after its kill (want $size or more, then 0 last)"
fi
case_ sys_truncate 1
case_ sys_ftruncate 1
case_ sys_openat 1
case_ sys_openat2 1
case_ sys_creat 1
case_ rewrite 1
case_ append 0
case_ freopen 1

# An O_TRUNC open as the process's first hooked call (dd, cp, a shell's >), with and without
# write-through: the next reader gets the new bytes.
for wt in true false; do
	"$h" mk "$f" $size 1
	reset_region
	LD_PRELOAD=$lib "$h" load "$f" 2>/dev/null
	want=$("$h" mk "$work/new" $size 9 && "$h" show "$work/new")
	KVSHIM_FILES_WRITE_THROUGH=$wt LD_PRELOAD=$lib dd if="$work/new" of="$f" bs=1M \
		status=none 2>"$work/err"
	got=$(KVSHIM_FILES_WRITE_THROUGH=$wt LD_PRELOAD=$lib "$h" show "$f" 2>&1)
	v=$(totals write_once_violations)
	if [ "$got" = "$want" ] && [ "$v" = 1 ]; then
		ok "dd over a write-once file (write_through $wt): the new bytes served, counted"
	else
		fail "dd over a write-once file (write_through $wt): read [$got], want [$want]," \
			"write_once_violations $v"
	fi
done

# A file a touch found under no root, then moved under the write-once root by the same
# process: the touch's note is forgotten at the rename, so the O_TRUNC open of it that follows
# is judged (dropped, counted), and the next reader gets the new bytes.
mkdir -p "$work/outside"
g=$work/outside/g
"$h" mk "$g" $size 1
"$h" mk "$work/new" $size 9
want=$("$h" show "$work/new")
reset_region
py_moved='import os,sys,subprocess
g,dst,new,h=sys.argv[1:5]
os.utime(g)                           # found under no root (the note)
os.rename(g,dst)                      # under the write-once root now
subprocess.run([h,"load",dst],check=True)  # another process keeps its shards for good
os.utime(dst)
fd=os.open(dst,os.O_WRONLY|os.O_TRUNC)
os.write(fd,open(new,"rb").read()); os.close(fd)'
LD_PRELOAD=$lib python3 -c "$py_moved" "$g" "$f" "$work/new" "$h" 2>"$work/err"
got=$(LD_PRELOAD=$lib "$h" show "$f" 2>&1)
v=$(totals write_once_violations)
if [ "$got" = "$want" ] && [ "$v" = 1 ]; then
	ok "touched outside the roots, renamed under the write-once root, rewritten: new bytes served, counted"
else
	fail "touched outside, renamed in, rewritten: read [$got], want [$want], write_once_violations $v"
fi

# The program's record lock on a KV file stays through a launcher's dup2s onto small numbers.
"$h" mk "$f" $size 1
reset_region
plain=$("$h" dup2lock "$f" 2>&1)
shim=$(LD_PRELOAD=$lib "$h" dup2lock "$f" 2>&1)
[ "$shim" = "$plain" ] && [ "$plain" = "lock held: before the dup2s yes, after yes" ] &&
	ok "dup2 onto 3..40 after a served read: $shim" ||
	fail "dup2 onto small numbers: with the shim [$shim], without [$plain]"

# A number read as a pipe and closed inside glibc (pclose) is a KV file in its next life.
reset_region
out=$(LD_PRELOAD=$lib "$h" reborn "$f" 2>&1)
req=$(totals requests)
case "$out" in
*"the same number, $size bytes read")
	[ "$req" -ge 5 ] && ok "a number pclose closed, reopened on a KV file: served ($req requests)" ||
		fail "a number pclose closed, reopened on a KV file: requests $req, want 5 ($out)" ;;
*) fail "reborn: $out" ;;
esac

# Reads the shim cannot see (inline system calls): an O_DIRECT open closed with no read it saw
# is counted (unserved_unseen) and named by stat and check; a read through libc is not.
"$h" mk "$f" $size 1
reset_region
out=$(LD_PRELOAD=$lib "$h" inline "$f" 2>&1)
n=$(totals unserved_unseen)
LD_PRELOAD=$lib "$h" load "$f" 2>/dev/null
n2=$(totals unserved_unseen)
"$kvshim" check >/dev/null 2>"$work/err"
if [ "$out" != "inline pread: 1048576" ] || [ "$n" != 1 ] || [ "$n2" != 1 ]; then
	fail "inline reads: [$out], unserved_unseen $n after it, $n2 after a read through libc"
elif ! grep -q "^unseen     1 O_DIRECT open of KV files closed with no read" <<<"$("$kvshim" stat)"; then
	fail "inline reads: stat does not name them: $("$kvshim" stat | head -8)"
elif ! grep -q "kvshim: warning: reads made by inline system calls: not served" "$work/err"; then
	fail "inline reads: check does not name them: $(head -c 300 "$work/err")"
else
	ok "an O_DIRECT open read by an inline system call: counted (unserved_unseen 1) and named by stat and check; a read through libc is not"
fi

# The atime worker keeps its promise: at most one update per file per day under relatime (this
# file system's rule), none after a cold pass whose loads moved the atime themselves, and no
# storage read a plain read would not make.  100 files of 64 KiB, 4 passes (a process each).
if findmnt -no OPTIONS -T "$work" | grep -q relatime; then
	for root in once plain; do
		d=$work/kv/at-$root
		mkdir -p "$d"
		for i in $(seq 1 100); do "$h" mk "$d/f$i" 65536 $i; done
		reset_region
		wo=$d
		[ $root = plain ] && wo=
		k0=$(io_read_bytes)
		KVSHIM_FILES_WRITE_ONCE=$wo LD_PRELOAD=$lib "$h" loadall "$d" 2>/dev/null
		sleep 2.5 # the worker's delay, and its work
		kernel=$(($(io_read_bytes) - k0))
		for pass in 2 3 4; do
			KVSHIM_FILES_WRITE_ONCE=$wo LD_PRELOAD=$lib "$h" loadall "$d" 2>/dev/null
			sleep 2.5
		done
		u=$(totals atime_updates)
		if [ "$u" -gt 10 ]; then
			fail "atime, $root root: $u updates for 100 files read 4 times (want at most one a file a day; here none)"
		elif [ $root = plain ] && [ "$kernel" -gt $((100 * 65536 + program_pages)) ]; then
			fail "atime, plain root: the cold pass read $kernel bytes from storage for $((100 * 65536)) (the worker read past the loads)"
		else
			ok "atime, $root root: $u updates for 100 files read 4 times; the cold pass read $kernel bytes for $((100 * 65536))"
		fi
	done
else
	echo "ok   - # SKIP atime: $work is not on a relatime mount"
fi

# kvshim check judges a write-once root by what the region counted, not by timestamps: files
# touched long after they were made (UCM's utime on every lookup) are no warning; a counted
# rewrite is (the cases above left write_once_violations at 1).
reset_region
"$h" mk "$f" $size 1
touch -d '+2 hours' "$f"
if "$kvshim" check >"$work/out" 2>"$work/err" || true; grep -q "kvshim: warning" "$work/err"; then
	fail "check on touched write-once files warns: $(grep warning "$work/err" | head -2)"
else
	LD_PRELOAD=$lib "$h" ftrunc "$f" >/dev/null 2>&1
	"$kvshim" check >"$work/out" 2>"$work/err"
	grep -q "kvshim: warning: files.write_once: the region counted 1 file rewritten in place" \
		"$work/err" && ok "check: touched files no warning; a counted rewrite warned" ||
		fail "check after a counted rewrite: $(head -c 300 "$work/err")"
fi
# The launcher's checks say a warning once per node and configuration, however many ranks it
# starts: 8 launches at once of a configuration with a write-once root outside files.roots.
reset_region
mkdir -p "$work/elsewhere"
for r in $(seq 1 8); do
	KVSHIM_FILES_WRITE_ONCE=$work/elsewhere KVSHIM_LIBRARY=$1 \
		"$kvshim" run -- true >/dev/null 2>"$work/run.$r" &
done
wait
n=$(cat "$work"/run.* | grep -c "kvshim: warning")
[ "$n" = 1 ] && ok "8 launches at once: the warning said once" ||
	fail "8 launches at once: $n warning lines, want 1: $(cat "$work"/run.* | head -3)"

# Monitoring broken by one byte: a root whose path is not UTF-8 (a byte 0xff, and a long path cut
# by the region inside a two-byte character) and a host name that is not UTF-8 (a UTS
# namespace of its own, where this machine allows one).  stat --json must stay JSON, --prom a
# text Prometheus takes (valid UTF-8 throughout).
bad="$work/kv-"$'\xff\xfe'"-root"
long="$work/$(printf 'é%.0s' $(seq 1 100))"
mkdir -p "$bad" "$long"
"$h" mk "$bad/f" $((2 * 1024 * 1024)) 3
"$h" mk "$long/f" $((2 * 1024 * 1024)) 4
reset_region
KVSHIM_FILES_ROOTS="$bad:$long" KVSHIM_FILES_WRITE_ONCE= LD_PRELOAD=$lib "$h" load "$bad/f" 2>/dev/null
KVSHIM_FILES_ROOTS="$bad:$long" KVSHIM_FILES_WRITE_ONCE= LD_PRELOAD=$lib "$h" load "$long/f" 2>/dev/null
hostnote="no UTS namespace here: the host name part not run"
if unshare -u true 2>/dev/null; then
	KVSHIM_FILES_ROOTS="$bad:$long" KVSHIM_FILES_WRITE_ONCE= unshare -u sh -c \
		'python3 -c "import socket; socket.sethostname(b\"node-\\xff\\xc3\")" &&
		 LD_PRELOAD=$0 "$1" load "$2"' "$lib" "$h" "$bad/f" 2>/dev/null &&
		hostnote="a host name of bytes 0xff 0xc3 too"
fi
utf8_json='import json,sys
o=json.loads(sys.stdin.buffer.read().decode("utf-8"))
print(sum(1 for t in o.get("tallies",{}).get("by_root",[]) if "\ufffd" in t.get("root","")))'
if ! roots=$(stat_json | python3 -c "$utf8_json" 2>"$work/err"); then
	fail "stat --json with non-UTF-8 roots is not JSON: $(head -c 300 "$work/err")"
elif ! "$kvshim" stat --prom | python3 -c 'import sys; sys.stdin.buffer.read().decode("utf-8")' 2>"$work/err"; then
	fail "stat --prom with non-UTF-8 roots is not UTF-8: $(head -c 300 "$work/err")"
elif command -v promtool >/dev/null && ! "$kvshim" stat --prom | promtool check metrics >"$work/err" 2>&1; then
	fail "stat --prom with non-UTF-8 roots: promtool: $(head -c 300 "$work/err")"
else
	ok "stat --json is JSON and --prom UTF-8 with roots that are not UTF-8 ($hostnote)"
fi

echo "harm4: $fails failed"
[ $fails -eq 0 ]
