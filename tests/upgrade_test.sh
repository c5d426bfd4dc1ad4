#!/usr/bin/env bash
# An upgrade of kvshim keeps the warm cache (issue 38): this checkout built twice, the second
# time with its region layout version raised by one (cmake -DKVS_LAYOUT_BUMP=ON) to stand for
# the next release.
#   upgrade_test.sh LIBKVSHIM KVSHIM SOURCE_DIR
# Storage is the kernel's count (the ranks' /proc/self/io read_bytes); every byte the ranks
# read is checked (tests/kv_ranks.py).
#  1. The old release's 8 ranks warm a region of 128 MiB and one old process stays attached;
#     the new release's `kvshim check` finds no problem (it notes the hand-over to come: `kvshim
#     run` would otherwise start the engine with the shim off); its 8 ranks, started together, load the same files reading at most 5% of
#     the unique bytes from storage; one of them says the upgrade, once; the new region counts
#     what it was given (handover_bytes); the old process's next reads, of its old region,
#     are right and read nothing from storage.
#  2. The old process is reading in a loop when the new release's first process starts, and
#     is SIGKILLed while that one fills: the new ranks still read at most 5%, every byte right.
#  3. The first process of the new release is SIGKILLed while it fills its region: nothing is
#     published (the old region keeps the name), and the next new ranks hand over as in 1.
#  4. A region of a layout newer than the build's (a downgrade) is not handed over: the old
#     build runs uncached and says why, and the newer region is left as it was.
#  5. The new release with another shard size: nothing handed over, every byte right.
#  6. shim.mode = observe on both sides: a region of keys only is not handed over.
#  7. Churn: upgrades while old processes evict and reuse the old region's frames; every byte
#     the new ranks read is right.
set -uo pipefail
PREFIX=upgrade
source "$(dirname "$0")/preload_lib.sh" # lib (sanitizer runtime first), work, name, ok, fail
ranks_py="$(dirname "$0")/kv_ranks.py"
src=${3:?usage: upgrade_test.sh LIBKVSHIM KVSHIM SOURCE_DIR}
MiB=1048576

python3 -c 'import numpy' 2>/dev/null || {
	echo "SKIP: numpy is missing (python3 -m pip install numpy)"
	exit 77
}
mkdir -p "$work/kv"
if ! dd if=/dev/zero of="$work/kv/probe" bs=4096 count=1 oflag=direct status=none 2>/dev/null; then
	echo "SKIP: O_DIRECT does not work in $work"
	exit 77
fi
rm -f "$work/kv/probe"

# The next release: this source, its layout version one more (plain build, seconds).
if ! { cmake -S "$src" -B "$work/next" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVS_LAYOUT_BUMP=ON &&
	cmake --build "$work/next" -j"$(nproc)" --target kvshim kvshim-cli; } >"$work/build.log" 2>&1; then
	fail "building the next release: $(tail -5 "$work/build.log")"
	exit 1
fi
next=${KVS_E2E_PRELOAD:+$KVS_E2E_PRELOAD:}$work/next/shim/libkvshim.so
kvshim_next=$work/next/tools/kvshim

while read -r v; do unset "$v"; done < <(compgen -e | grep '^KVSHIM_')
export KVSHIM_CONFIG=
export KVSHIM_FILES_ROOTS=$work/kv
export KVSHIM_CACHE_NAME=$name
export KVSHIM_CACHE_CAPACITY=512M
export KVSHIM_CACHE_SHARD_SIZE=1M

n=32 size=$((4 * MiB))
unique=$((n * size))
storage_of() { sed -n 's/.*storage \([0-9]*\).*/\1/p' <<<"$1"; }
at_most() { python3 -c "import sys; sys.exit(0 if $1 <= $2 else 1)"; }
old_ranks() { LD_PRELOAD=$lib python3 "$ranks_py" load "$work/kv" $n $size --gen 1 --ranks 8; }
new_ranks() { LD_PRELOAD=$next python3 "$ranks_py" load "$work/kv" $n $size --gen 1 --ranks 8; }
new_total() { # COUNTER: of the new release's region
	"$kvshim_next" stat --json 2>/dev/null | python3 -c 'import json,sys
try: print(json.load(sys.stdin)["totals"][sys.argv[1]])
except Exception: print(0)' "$1"
}
# A process of the old release that reads file 0 (attaching), then, for each line on its stdin,
# reads every file again and checks it: "reread ok storage S" (or "reread BAD ...").
cat >"$work/holder.py" <<'PY'
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("kv_ranks", sys.argv[1])
kv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kv)
class A: pass
a = A()
a.dir, a.nfiles, a.size = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
a.gen, a.prefix, a.chunk, a.skew, a.buffered = 1, "blk", 0, 0, False
a.stagger, a.threads, a.repeat, a.ranks = 0.0, 0, 1, 1
fd = os.open(os.path.join(a.dir, "blk0"), os.O_RDONLY | os.O_DIRECT)
buf = kv.aligned(a.size)
kv.read_range(fd, buf, 0, a.size, True)
os.close(fd)
print("attached", flush=True)
for line in sys.stdin:
    if line.strip() == "loop":
        while True:
            kv.load_rank(a, 0, [1])
    b0 = kv.storage_bytes()
    try:
        kv.load_rank(a, 0, [1])
        print(f"reread ok storage {kv.storage_bytes() - b0}", flush=True)
    except SystemExit as e:
        print(f"reread BAD {e}", flush=True)
PY
holder() { LD_PRELOAD=$lib exec python3 -u "$work/holder.py" "$ranks_py" "$work/kv" $n $size; }

# kill_when_filling VICTIM CMD...: open the old region, start CMD (its output to $work/out and
# $work/err), and SIGKILL VICTIM (a pid, or "cmd" for CMD itself) as soon as a process of the
# new release is filling its region: it holds flock on the old region for the whole fill
# (cache/region.c, upgrade), seen by a loop of non-blocking flocks on the old file, which is
# open before CMD starts.  Then wait for CMD.  Status 0 when the fill was seen and CMD
# succeeded (or was the victim), 1 when no fill was seen in 20 s, 2 when CMD failed.
region_path=/dev/shm/kvshim.$(id -u).$name
kill_when_filling() {
	python3 - "$region_path" "$work" "$@" <<'PY'
import fcntl, os, signal, subprocess, sys, time
path, work, victim, cmd = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
fd = os.open(path, os.O_RDONLY)
with open(os.path.join(work, "out"), "w") as out, open(os.path.join(work, "err"), "w") as err:
    child = subprocess.Popen(cmd, stdout=out, stderr=err)
pid, seen, end = child.pid if victim == "cmd" else int(victim), False, time.monotonic() + 20
while not seen and time.monotonic() < end and child.poll() is None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except BlockingIOError:
        os.kill(pid, signal.SIGKILL)
        seen = True
rc = child.wait()
sys.exit(1 if not seen else 0 if victim == "cmd" or rc == 0 else 2)
PY
}

python3 "$ranks_py" write "$work/kv" $n $size --gen 1
sleep 2.5 # settled: kept for good once loaded

# 1. An old process attached through the upgrade.
reset_region
if ! out=$(old_ranks 2>"$work/err"); then
	fail "the old release's ranks: $(head -c 300 "$work/err")"
fi
coproc HOLD { holder 2>"$work/hold.err"; }
hold=$HOLD_PID # bash forgets HOLD_PID once it reaps the process
read -r -t 30 line <&"${HOLD[0]}"
if [ "${line:-}" != attached ]; then
	fail "the old process did not attach: ${line:-nothing} $(head -c 300 "$work/hold.err")"
elif ! "$kvshim_next" check >"$work/check" 2>&1 ||
	! grep -q 'hands its cached shards over' "$work/check"; then
	# `kvshim run` starts an engine with the shim off on a problem: an older region is none.
	fail "the new release's check over the old region: $(grep -v '^ok' "$work/check" | head -c 400)"
elif ! out=$(new_ranks 2>"$work/err"); then
	fail "the new release's ranks: $(head -c 300 "$work/err")"
else
	st=$(storage_of "$out")
	said=$(grep -c 'kvshim upgraded' "$work/err")
	given=$(new_total handover_bytes)
	echo reread >&"${HOLD[1]}"
	read -r -t 60 back <&"${HOLD[0]}"
	# The old region: nameless now, held by the old process alone, freed when it goes.
	held=$(grep -c "$region_path (deleted)" "/proc/$hold/maps" 2>/dev/null)
	if ! at_most "$st" "$unique * 0.05"; then
		fail "upgrade: the new ranks read $st bytes from storage for $unique unique ($(head -c 300 "$work/err"))"
	elif [ "$said" != 1 ] || [ "$given" -lt $((unique / 2)) ]; then
		fail "upgrade: said $said times, handover_bytes $given: $(head -c 400 "$work/err")"
	elif [ "${held:-0}" = 0 ]; then
		fail "upgrade: the old process does not map the old region, nameless ($(grep kvshim "/proc/$hold/maps" | head -3))"
	elif [[ "${back:-}" != "reread ok storage 0" ]]; then
		fail "upgrade: the old process's reads after it: ${back:-nothing} $(head -c 300 "$work/hold.err")"
	else
		ok "upgrade with an old process attached: the new 8 ranks read $st bytes from storage for $unique, every byte right; handed over $given bytes; the old process, mapping the old region nameless, reread its files right, 0 from storage ($(grep -o 'filled with.*in [0-9.]* s' "$work/err"))"
	fi
fi
kill "$hold" 2>/dev/null
wait "$hold" 2>/dev/null

# 2. The old process SIGKILLed while the new release's first process hands over.
reset_region
"$kvshim_next" reset --force >/dev/null 2>&1
old_ranks >/dev/null 2>"$work/err" || fail "case 2: the old ranks: $(head -c 300 "$work/err")"
coproc HOLD { holder 2>"$work/hold.err"; }
hold=$HOLD_PID
read -r -t 30 line <&"${HOLD[0]}"
echo loop >&"${HOLD[1]}"
sleep 0.2
kill_when_filling "$hold" env LD_PRELOAD="$next" python3 "$ranks_py" load "$work/kv" $n $size \
	--gen 1 --ranks 8
st=$?
kill -KILL "$hold" 2>/dev/null
wait "$hold" 2>/dev/null
mid="while the new release filled its region"
if [ $st = 2 ]; then
	fail "old process killed mid-hand-over: the new ranks: $(head -c 300 "$work/err")"
elif [ $st = 1 ]; then
	fail "old process killed mid-hand-over: no fill was seen to kill it in"
else
	st=$(storage_of "$(cat "$work/out")")
	if at_most "$st" "$unique * 0.05"; then
		ok "the old process, reading, SIGKILLed $mid: the new ranks read $st bytes from storage for $unique, every byte right"
	else
		fail "the old process SIGKILLed mid-hand-over: the new ranks read $st bytes from storage for $unique"
	fi
fi

# 3. The upgrader SIGKILLed while it fills.
"$kvshim_next" reset --force >/dev/null 2>&1
reset_region
old_ranks >/dev/null 2>"$work/err" || fail "case 3: the old ranks: $(head -c 300 "$work/err")"
# One process (the one that fills: not a parent of it) reads the files through the new release.
seen=0
kill_when_filling cmd env LD_PRELOAD="$next" "$(dirname "$kvshim")/kvshim-bench-read" read \
	--direct --passes 1 "$work/kv"/blk* && seen=1
still=$("$kvshim" stat --json 2>/dev/null | python3 -c 'import json,sys
try: print(json.load(sys.stdin)["region"]["slots_ready"])
except Exception: print("none")')
if [ "$seen" = 0 ]; then
	fail "upgrader killed: no fill was seen to kill it in"
elif [ "$still" = none ] || [ "$still" -lt $((n * size / MiB)) ]; then
	fail "upgrader killed mid-fill: the old region is not at the path with its shards ($still ready)"
elif ! out=$(new_ranks 2>"$work/err"); then
	fail "upgrader killed: the next ranks: $(head -c 300 "$work/err")"
else
	st=$(storage_of "$out")
	if at_most "$st" "$unique * 0.05"; then
		ok "the first upgrader SIGKILLed while it filled: nothing published (the old region at the path, $still shards ready), then the next 8 ranks read $st bytes from storage for $unique, every byte right"
	else
		fail "the first upgrader SIGKILLed: the next 8 ranks read $st bytes from storage for $unique: $(head -c 300 "$work/err")"
	fi
fi

# 4. A newer release's region is not handed over to an older one.
if ! out=$(old_ranks 2>"$work/err"); then
	fail "downgrade: the old ranks failed: $(head -c 300 "$work/err")"
elif grep -q 'kvshim upgraded' "$work/err" || ! grep -q 'layout version' "$work/err"; then
	fail "downgrade: $(head -c 400 "$work/err")"
elif [ "$(new_total handover_bytes)" = 0 ]; then
	fail "downgrade: the newer region was changed (handover_bytes 0)"
else
	ok "a newer release's region left to it: the older build runs without the cache and says why ($(grep -o 'layout version[^(]*' "$work/err" | head -1))"
fi

# 5. The new release with another shard size: a key's shard is that many bytes of its file,
#    so nothing is handed over, and every byte is still right.
"$kvshim_next" reset --force >/dev/null 2>&1
reset_region
old_ranks >/dev/null 2>"$work/err" || fail "case 5: the old ranks: $(head -c 300 "$work/err")"
if ! out=$(KVSHIM_CACHE_SHARD_SIZE=2M new_ranks 2>"$work/err"); then
	fail "another shard size: the new ranks: $(head -c 300 "$work/err")"
elif ! grep -q 'the shard sizes differ' "$work/err"; then
	fail "another shard size: not said: $(head -c 300 "$work/err")"
elif [ "$(KVSHIM_CACHE_SHARD_SIZE=2M new_total handover_bytes)" != 0 ]; then
	fail "another shard size: handover_bytes $(KVSHIM_CACHE_SHARD_SIZE=2M new_total handover_bytes)"
else
	ok "the new release with 2 MiB shards over a region of 1 MiB ones: nothing handed over, said, every byte right (storage $(storage_of "$out"))"
fi

# 6. shim.mode = observe on both sides: an old region of keys only holds no bytes to hand
#    over; the new release's ranks read right.
"$kvshim_next" reset --force >/dev/null 2>&1
KVSHIM_SHIM_MODE=observe reset_region
KVSHIM_SHIM_MODE=observe old_ranks >/dev/null 2>"$work/err" ||
	fail "case 6: the old ranks: $(head -c 300 "$work/err")"
if ! out=$(KVSHIM_SHIM_MODE=observe new_ranks 2>"$work/err"); then
	fail "observe mode: the new ranks: $(head -c 300 "$work/err")"
elif grep -q 'kvshim upgraded' "$work/err"; then
	fail "observe mode: a region of keys only was handed over: $(head -c 300 "$work/err")"
else
	ok "observe mode on both sides: the old region of keys only is not handed over, every byte right"
fi
KVSHIM_SHIM_MODE=observe reset_region

# 7. Churn: two old processes read a set twice the size of the old region in a loop, so its
#    frames are evicted and reused all through the fill; the new ranks then check every byte
#    (a copy that raced a reuse must not be published).  Three rounds, each a new old region.
export KVSHIM_CACHE_CAPACITY=8M
given=0 bad=""
for round in 1 2 3; do
	"$kvshim_next" reset --force >/dev/null 2>&1
	reset_region
	coproc HOLD { holder 2>"$work/hold.err"; }
	read -r -t 30 line <&"${HOLD[0]}"
	echo loop >&"${HOLD[1]}"
	hold1=$HOLD_PID
	exec {keep}>&2 2>/dev/null # bash warns of a second coproc beside the first: that is meant
	coproc HOLD2 { holder 2>"$work/hold2.err"; }
	exec 2>&"$keep" {keep}>&-
	hold2=$HOLD2_PID
	read -r -t 30 line2 <&"${HOLD2[0]}"
	echo loop >&"${HOLD2[1]}"
	sleep 0.5
	out=$(LD_PRELOAD=$next python3 "$ranks_py" load "$work/kv" $n $size --gen 1 --ranks 2 \
		2>"$work/err") || bad="round $round: $(head -c 300 "$work/err")"
	given=$((given + $(new_total handover_bytes)))
	kill -KILL "$hold1" "$hold2" 2>/dev/null
	wait "$hold1" "$hold2" 2>/dev/null
	[ -n "$bad" ] && break
done
if [ -n "$bad" ]; then
	fail "churn: $bad"
elif [ "$given" = 0 ]; then
	fail "churn: nothing was handed over in 3 rounds"
else
	ok "churn: 3 upgrades while two old processes evicted and reused the old region's frames: $given bytes handed over, every byte the new ranks read right"
fi

"$kvshim_next" reset --force >/dev/null 2>&1
[ "$fails" -eq 0 ] || exit 1
