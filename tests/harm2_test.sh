#!/usr/bin/env bash
# "Never harm the host, part 2": the asynchronous and fork paths give the kernel's answers
# under the shim (tests/harm2.c); each case runs with and without LD_PRELOAD and compares.
#   harm2_test.sh LIBKVSHIM KVSHIM HARM2 CTORLIB [SLOWFS]
# The cases that need a read still in flight use slowfs (FUSE, 300 ms a read); without FUSE
# they skip, the others run.
set -uo pipefail
h=$3
ctorlib=$4
slowfs=${5:-}
PREFIX=harm2
source "$(dirname "$0")/preload_lib.sh" # lib (sanitizer runtime first), work, name, ok, fail

mkdir -p "$work/kv" "$work/src" "$work/mnt"
if ! dd if=/dev/zero of="$work/kv/probe" bs=4096 count=1 oflag=direct status=none 2>/dev/null; then
	echo "SKIP: O_DIRECT does not work in $work"
	exit 77
fi
while read -r v; do unset "$v"; done < <(compgen -e | grep '^KVSHIM_')
export KVSHIM_CONFIG=
export KVSHIM_FILES_ROOTS=$work/kv:$work/mnt
export KVSHIM_CACHE_NAME=$name
export KVSHIM_CACHE_CAPACITY=64M
export KVSHIM_FILES_SETTLE=0

head -c $((4 * 1024 * 1024)) /dev/urandom >"$work/kv/f"
head -c $((2 * 1024 * 1024)) /dev/urandom >"$work/kv/g"
head -c 5000 /dev/urandom >"$work/kv/short"
head -c $((1024 * 1024)) /dev/urandom >"$work/other"

same() { # LABEL CMD...: the output with the shim equals the output without it
	local label=$1 want got
	shift
	reset_region
	want=$("$@" 2>&1)
	reset_region
	got=$(LD_PRELOAD=$lib "$@" 2>&1)
	if [ "$want" = "$got" ]; then
		ok "$label: as without the shim ($(echo "$want" | tr '\n' ';' | head -c 300))"
	else
		fail "$label: without the shim: $(echo "$want" | tr '\n' ';'); with it: $(echo "$got" | tr '\n' ';')"
	fi
}

# 3. EOF tails: a 1 MiB O_DIRECT read of a 5000-byte file by pread, io_submit and aio_read,
#    cold and warm.
same "EOF tail of a short O_DIRECT read" "$h" eoftail "$work/kv/short"
# 2. IOCB_FLAG_RESFD naming a regular file: EINVAL, nothing written; a real eventfd still works.
same "IOCB_FLAG_RESFD" "$h" resfd "$work/kv/f" "$work/resfd.$RANDOM"
rm -f "$work"/resfd.*
# 5. SIGEV_THREAD with detached attributes, 3000 reads.
same "SIGEV_THREAD with detached attributes" "$h" sigev "$work/kv/f" 3000
# 8. A fork child after the program closed and reused the shim's descriptor numbers.
same "fork after the program reused the shim's descriptors" "$h" forkfds "$work/kv/f"
# 8b. The program closes the shim's own descriptors (the region's, the walk's, the anchors)
#     and opens its files on those numbers: the shim never allocates, unlocks, opens or closes
#     them.  A 1 GiB region, so that the ahead walk is waiting in the middle, holding its
#     descriptor; a lazy one, so that claims make pages through the region's descriptor.
#     4096 descriptors: a close loop up to 1023 leaves numbers above it (the shim's move there).
mkdir -p "$work/own"
for how in loop close range closefrom; do
	same "the program's close ($how) over the shim's descriptors" \
		bash -c 'ulimit -n 4096 2>/dev/null; exec env KVSHIM_CACHE_CAPACITY=1G "$@"' - \
		"$h" ownfds "$work/kv/f" "$work/own" $how
done
same "close_range(3, ~0U) with a lazy region" \
	env KVSHIM_CACHE_POPULATE=lazy "$h" ownfds "$work/kv/f" "$work/own" range
same "a close loop while an eager walk runs" \
	bash -c 'ulimit -n 4096 2>/dev/null; exec env KVSHIM_CACHE_CAPACITY=512M "$@"' - \
	env KVSHIM_CACHE_POPULATE=eager "$h" ownfds "$work/kv/f" "$work/own" busy
# 8c. vfork children (CPython's subprocess) close everything in their own descriptor table but
#     run in the parent's memory: the parent's anchors and region stay its own.
same "close_range in vfork children" "$h" vforkclose "$work/kv/f"

# 13. The first hooked call initialises the shim while another thread, inside a dlopen (the
#     loader's lock held), reads from a constructor: neither waits for the other.
reset_region
out=$(LD_PRELOAD=$lib timeout 20 "$h" initlock "$ctorlib" "$work/kv/f" 2>&1)
st=$?
[ $st = 0 ] && [ "$out" = "initlock: main read 1048576, constructor read 1048576" ] &&
	ok "first call during a dlopen's constructor: $out" ||
	fail "first call during a dlopen's constructor: status $st (124: deadlocked), $out"

# The cases with a read in flight: slowfs.
mnt_down() {
	fusermount3 -u "$work/mnt" 2>/dev/null || umount "$work/mnt" 2>/dev/null || umount -l "$work/mnt" 2>/dev/null
}
trap 'mnt_down; cleanup' EXIT
if [ -n "$slowfs" ] && [ -x "$slowfs" ] && [ -e /dev/fuse ] &&
	head -c $((8 * 1024 * 1024)) /dev/urandom >"$work/src/slow" &&
	"$slowfs" --latency-us 300000 "$work/src" "$work/mnt" -o max_read=1048576 2>"$work/slowfs.log"; then
	for _ in $(seq 1 100); do grep -qs " $work/mnt fuse" /proc/mounts && break; sleep 0.05; done
	# 4. Timeouts too long to add to the clock mean "wait".
	same "timeouts of {LONG_MAX, 0} and {18446744074, 0}" "$h" timeout "$work/mnt/slow"
	# 1. A kernel AIO read whose descriptor is closed and reused while it is in flight.
	reset_region
	out=$(LD_PRELOAD=$lib "$h" retired "$work/mnt/slow" "$work/kv/g" "$work/other" 2>&1)
	case "$out" in
	*"res 1048576, buffer is the slow file's"*) ok "a kernel AIO read on a retired anchor: $out" ;;
	*) fail "a kernel AIO read on a retired anchor: $out" ;;
	esac
	mnt_down
else
	echo "skip - reads in flight (timeouts, retired anchors): no FUSE (slowfs) here"
fi

echo "harm2: $fails failed"
[ $fails -eq 0 ]
