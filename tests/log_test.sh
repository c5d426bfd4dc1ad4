#!/usr/bin/env bash
# The shim's log lines under LD_PRELOAD: "kvshim: <ISO-8601 UTC time with ms> pid <pid>
# <level>: <message>", on stderr by default, appended to shim.log_file (created 0600, a relative
# name taken from the working directory, no descriptor kept open in the host) when it is set,
# and back on stderr, said once, when that file cannot be opened.
#   log_test.sh LIBKVSHIM KVSHIM
set -uo pipefail
PREFIX=log
source "$(dirname "$0")/preload_lib.sh" # lib (sanitizer runtime first), work, name, ok, fail

mkdir -p "$work/kv" "$work/cwd"
head -c 200000 /dev/zero >"$work/kv/blk"
export KVSHIM_CONFIG=
export KVSHIM_FILES_ROOTS=$work/kv
export KVSHIM_CACHE_NAME=$name
export KVSHIM_CACHE_CAPACITY=4M
export KVSHIM_CACHE_SHARD_SIZE=64K
export KVSHIM_SHIM_LOG=info
export KVSHIM_LOADER_IO=threads
TS='[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z'

# dd_shim ERR [ENV=VALUE...]: one O_DIRECT dd under the shim, its pid in $work/pid.
dd_shim() {
	local err=$1
	shift
	env "$@" LD_PRELOAD="$lib" sh -c 'echo $$ >"$0"; exec dd if="$1" of=/dev/null bs=64K \
		iflag=direct status=none' "$work/pid" "$work/kv/blk" 2>"$err"
}

# 1. stderr: the format, the pid of the process, and a time within the run.
before=$(date -u +%s)
dd_shim "$work/err" || fail "dd under the shim: $(cat "$work/err")"
after=$(date -u +%s)
pid=$(cat "$work/pid")
line=$(grep -E "^kvshim: $TS pid $pid info: attached as process [0-9]+, backend threads, " \
	"$work/err")
if [ -n "$line" ] && ! grep -vqE "^kvshim: $TS pid $pid (error|warn|info|debug): " "$work/err"; then
	t=$(date -u -d "$(echo "$line" | cut -d' ' -f2)" +%s)
	if [ "$t" -ge "$before" ] && [ "$t" -le "$after" ]; then
		ok "stderr: kvshim: <UTC time> pid <pid> <level>: <message>, time within the run"
	else
		fail "the line's time $t is outside the run [$before, $after]: $line"
	fi
else
	fail "stderr lines not in the format (pid $pid): $(cat "$work/err")"
fi

# 2. shim.log_file: nothing on stderr, lines appended by each process, mode 0600.
log=$work/shim.log
dd_shim "$work/err" KVSHIM_SHIM_LOG_FILE="$log" || fail "dd with a log file: $(cat "$work/err")"
pid1=$(cat "$work/pid")
dd_shim "$work/err2" KVSHIM_SHIM_LOG_FILE="$log" || fail "dd with a log file: $(cat "$work/err2")"
pid2=$(cat "$work/pid")
if [ -s "$work/err" ] || [ -s "$work/err2" ]; then
	fail "with shim.log_file, stderr still has: $(cat "$work/err" "$work/err2")"
elif ! grep -qE "^kvshim: $TS pid $pid1 info: attached as process" "$log" ||
	! grep -qE "^kvshim: $TS pid $pid2 info: attached as process" "$log"; then
	fail "the log file lacks an attach line of $pid1 or $pid2: $(cat "$log")"
elif [ "$(stat -c %a "$log")" != 600 ]; then
	fail "the log file's mode is $(stat -c %a "$log"), not 600"
else
	ok "shim.log_file: both processes' lines appended, stderr quiet, mode 0600"
fi

# 3. A relative name is taken from the working directory; the file is not held open (a host
#    that closes or reuses its descriptors cannot make the shim write into its files).
held=$(cd "$work/cwd" && KVSHIM_SHIM_LOG_FILE=rel.log LD_PRELOAD="$lib" python3 -c '
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
os.preadv(fd, [mmap.mmap(-1, 65536)], 0)
def target(f):
    try:
        return os.readlink("/proc/self/fd/" + f)
    except OSError:  # the descriptor listdir itself used
        return ""
log = os.path.abspath("rel.log")
print(sum(target(f) == log for f in os.listdir("/proc/self/fd")))
' "$work/kv/blk" 2>"$work/err")
if grep -qE "^kvshim: $TS pid [0-9]+ info: attached" "$work/cwd/rel.log" 2>/dev/null &&
	[ "$held" = 0 ] && [ ! -s "$work/err" ]; then
	ok "a relative shim.log_file lands in the working directory, and no fd stays open on it"
else
	fail "relative log file: held=$held, stderr: $(cat "$work/err"), file: $(cat "$work/cwd/rel.log" 2>&1)"
fi

# 4. A file that cannot be opened: stderr, and the reason said once.
dd_shim "$work/err" KVSHIM_SHIM_LOG_FILE=/nonexistent/kvshim.log KVSHIM_SHIM_LOG=debug ||
	fail "dd with a bad log file: $(cat "$work/err")"
n=$(grep -cE "^kvshim: $TS pid [0-9]+ warn: shim.log_file /nonexistent/kvshim.log: No such file or directory; logging to stderr$" "$work/err")
if [ "$n" -eq 1 ] && grep -qE "^kvshim: $TS pid [0-9]+ info: attached" "$work/err" &&
	[ "$(grep -c '^kvshim: ' "$work/err")" -ge 2 ]; then
	ok "an unopenable shim.log_file: lines on stderr, the reason said once"
else
	fail "unopenable log file ($n reasons): $(cat "$work/err")"
fi

# 5. shim.log = debug says why a read passed through, once per descriptor, file and cause: a
#    file outside the roots, a buffered KV read, a misaligned O_DIRECT one, a small one; a
#    served read says nothing; a number reopened on another file speaks again.
mkdir -p "$work/other"
head -c 200000 /dev/zero >"$work/other/a"
head -c 200000 /dev/zero >"$work/other/b"
KVSHIM_SHIM_LOG=debug LD_PRELOAD="$lib" python3 -c '
import mmap, os, sys
kv, a, b = sys.argv[1:4]
buf = mmap.mmap(-1, 1 << 17)
def read_twice(fd, bufs, off=0):
    for _ in range(2):
        try:
            os.preadv(fd, bufs, off)
        except OSError:
            pass  # the real call refuses a misaligned O_DIRECT read; the shim must not
d = os.open(kv, os.O_RDONLY | os.O_DIRECT)
read_twice(d, [buf])                                # served: silent
read_twice(d, [memoryview(buf)[1:65537]])           # misaligned buffer
read_twice(d, [memoryview(buf)[:4096]])             # shorter than files.min_read
o = os.open(a, os.O_RDONLY)
read_twice(o, [buf])                                # not under the roots
os.close(o)
o2 = os.open(b, os.O_RDONLY)
assert o2 == o, (o, o2)                             # the same number, another file
read_twice(o2, [buf])
p = os.open(kv, os.O_RDONLY)
read_twice(p, [buf])                                # buffered, files.buffered = false
print(d, o, p)
' "$work/kv/blk" "$work/other/a" "$work/other/b" >"$work/fds" 2>"$work/err" ||
	fail "the debug reader: $(cat "$work/err")"
read -r fd_d fd_o fd_p <"$work/fds"
why() { grep -cE "^kvshim: $TS pid [0-9]+ debug: fd $1 \($2\): passed through: $3" "$work/err"; }
got="$(why "$fd_d" "$work/kv/blk" "O_DIRECT, but offset, length or buffer not aligned")"
got+=" $(why "$fd_d" "$work/kv/blk" "shorter than files.min_read")"
got+=" $(why "$fd_o" "$work/other/a" "not under files.roots")"
got+=" $(why "$fd_o" "$work/other/b" "not under files.roots")"
got+=" $(why "$fd_p" "$work/kv/blk" "a buffered read \(no O_DIRECT\) and files.buffered = false")"
all=$(grep "passed through" "$work/err" | grep -c "($work/")
if [ "$got" = "1 1 1 1 1" ] && [ "$all" = 5 ]; then
	ok "debug: why a read passed through, once per descriptor, file and cause (5 lines)"
else
	fail "debug lines (want 1 1 1 1 1 of 5, got $got of $all): $(cat "$work/err")"
fi

[ "$fails" -eq 0 ] && echo "PASS: log" || echo "FAIL: log ($fails)"
[ "$fails" -eq 0 ]
