#!/usr/bin/env bash
# GPU fault cases on the fakes: the engine (tests/gpu_engine.c) runs under
# LD_PRELOAD=libkvshim.so while something fails or is unusual, and must still exit 0 with every
# byte right, because on any failure inside the shim the real cuFile function is called.  Each
# case also checks what the counters say happened (kvshim stat --json totals, and the fakes'
# stats files).  Then the shim's dlsym/dlvsym answers are compared with glibc's own.
#   gpu_faults_test.sh LIBKVSHIM KVSHIM ENGINE_DL PREREG DLSYM_SEM FAKEDIR CFPLUG CFPLUG_LIB CFBATCH
# FAKEDIR holds the fakes libcufile.so.0 and libcuda.so.1; without them the test skips.
# Cases: driver missing; cuMemcpyHtoDAsync failing; cuMemHostRegister failing (and working);
# a destination the driver does not know; a handle registered behind the shim's back; a process
# SIGKILLed while its device copy is in flight; dlsym semantics; libcufile reached through a
# plugin loaded RTLD_LOCAL, and unloaded then loaded again at another address; a driver
# that needs a deep stack; two batch submits racing for one entry; a read on a capturing
# stream.  Case 2's batch fallback runs on the shim's completion thread, where libcufile
# needs the buffer's context made current (the fake refuses a GPU buffer without one).
set -uo pipefail
engine=$3
prereg=$4
dlsym_sem=$5
fakedir=$6
cfplug=$7
cfplug_lib=$8
cfbatch=$9

for f in "$fakedir/libcufile.so.0" "$fakedir/libcuda.so.1"; do
	if [ ! -e "$f" ]; then
		echo "SKIP: the fakes were not built: $f is missing (targets fakecufile and fakecuda)"
		exit 77
	fi
done

PREFIX=gpufaults
source "$(dirname "$0")/preload_lib.sh" # lib (sanitizer runtime first), work, name, ok, fail

block=$((1024 * 1024))
mkdir -p "$work/kv"
for i in 0 1 2 3; do
	head -c $((4 * block)) /dev/urandom >"$work/kv/blk$i"
done
files=("$work"/kv/blk*)
unique=$(cat "${files[@]}" | wc -c)
if ! dd if="${files[0]}" of=/dev/null bs=4096 count=1 iflag=direct status=none 2>/dev/null; then
	echo "SKIP: O_DIRECT does not work in $work"
	exit 77
fi

while read -r v; do unset "$v"; done < <(compgen -e | grep -E '^(KVSHIM|FAKECUDA|FAKECUFILE)_')
cat >"$work/kvshim.ini" <<EOF
[files]
roots = $work/kv
settle = 0
[cache]
name = $name
shard_size = 1M
capacity = 64M
EOF
export KVSHIM_CONFIG=$work/kvshim.ini

want_line() { echo "engine: 4 files, $unique bytes, api $1, ok"; }

# run_engine TAG API [ENV=VALUE...]: a fresh region (prepared first with prep=1), one engine
# under the shim with fresh stats
# folders $work/st.TAG; rc in $rc.  Its stdout is in $work/out.TAG, stderr in $work/err.TAG.
run_engine() {
	local tag=$1 api=$2
	shift 2
	"$kvshim" reset --force >/dev/null 2>&1
	[ -n "${prep:-}" ] && env "$@" "$kvshim" prepare >/dev/null 2>&1 # every slot's pages now
	mkdir -p "$work/st.$tag"
	env "$@" LD_PRELOAD="$lib" LD_LIBRARY_PATH="$fakedir" FAKECUFILE_STATS="$work/st.$tag" \
		FAKECUDA_STATS="$work/st.$tag" timeout 120 "$engine" --api "$api" --block $block \
		"${files[@]}" >"$work/out.$tag" 2>"$work/err.$tag"
	rc=$?
}
# engine_ok LABEL TAG API: did the engine exit 0 with every byte right?  (fail otherwise)
engine_ok() {
	if [ $rc -eq 0 ] && [ "$(cat "$work/out.$2")" = "$(want_line "$3")" ]; then
		return 0
	fi
	fail "$1: exit $rc, stdout: $(head -c 200 "$work/out.$2"), stderr: $(head -c 300 "$work/err.$2")"
	return 1
}

# --- 1. the driver is missing: the shim's own dlopen of cuda.library fails (the engine still
# loads the fake libcuda); every read goes to the real libcufile; one warning, on stderr.
for api in read batch; do
	label="driver missing, api $api"
	run_engine nodrv.$api $api KVSHIM_CUDA_LIBRARY=/nonexistent/libcuda.so.1
	engine_ok "$label" nodrv.$api $api || continue
	fake=$(fake_sum "$work/st.nodrv.$api" fakecufile read_bytes)
	nwarn=$(grep -c '^kvshim:' "$work/err.nodrv.$api")
	nother=$(grep -vc '^kvshim:' "$work/err.nodrv.$api")
	h2d=$(totals h2d_bytes)
	reqs=$(totals cufile_requests)
	udev=$(totals unserved_device)
	freads=$(($(fake_sum "$work/st.nodrv.$api" fakecufile reads) + $(fake_sum "$work/st.nodrv.$api" fakecufile batch_entries)))
	if [ "$fake" -eq "$unique" ] && [ "$nwarn" -eq 1 ] && [ "$nother" -eq 0 ] &&
		[ "$h2d" -eq 0 ] && [ "$reqs" -eq 0 ] && [ "$udev" -eq "$freads" ]; then
		ok "$label: bytes right, the fake libcufile read all $fake, unserved_device $udev (its reads), one warning: $(cat "$work/err.nodrv.$api")"
	else
		fail "$label: fake read_bytes $fake (want $unique), $nwarn kvshim: lines and $nother others on stderr (want 1, 0): $(head -c 300 "$work/err.nodrv.$api"); h2d_bytes $h2d, cufile_requests $reqs (want 0, 0), unserved_device $udev (want $freads)"
	fi
done

# --- 2. every cuMemcpyHtoDAsync fails: the shim falls back to the real cuFileRead.
for api in read batch; do
	label="cuMemcpyHtoDAsync failing, api $api"
	run_engine htod.$api $api FAKECUDA_FAIL=cuMemcpyHtoDAsync_v2
	engine_ok "$label" htod.$api $api || continue
	fb=$(totals fallbacks)
	ufb=$(totals unserved_fallback)
	h2d=$(totals h2d_bytes)
	fake=$(fake_sum "$work/st.htod.$api" fakecufile read_bytes)
	freads=$(($(fake_sum "$work/st.htod.$api" fakecufile reads) + $(fake_sum "$work/st.htod.$api" fakecufile batch_entries)))
	# Each read the shim took and handed back is counted by its cause: every one the fake made.
	if [ "$fb" -gt 0 ] && [ "$h2d" -eq 0 ] && [ "$fake" -eq "$unique" ] && [ "$ufb" -eq "$freads" ]; then
		ok "$label: bytes right, fallbacks $fb, unserved_fallback $ufb (the fake's reads), h2d_bytes 0, the fake libcufile read all $fake"
	else
		fail "$label: fallbacks $fb (want > 0), unserved_fallback $ufb (want the fake's $freads reads), h2d_bytes $h2d (want 0), fake read_bytes $fake (want $unique)"
	fi
done

# --- 3. registration: failing, the reads are still served (from pageable memory); working,
# the background thread registers the region in the engine's context (current on its thread).
label="cuMemHostRegister failing"
prep=1 run_engine noreg read FAKECUDA_FAIL=cuMemHostRegister_v2
if engine_ok "$label" noreg read; then
	h2d=$(totals h2d_bytes)
	reg=$(totals registered_bytes)
	fake=$(fake_sum "$work/st.noreg" fakecufile read_bytes)
	calls=$(fake_sum "$work/st.noreg" fakecuda host_register_calls)
	if [ "$h2d" -eq "$unique" ] && [ "$reg" -eq 0 ] && [ "$fake" -eq 0 ]; then
		ok "$label: served (h2d_bytes $h2d), registered_bytes 0, fake libcufile read 0 (fake host_register_calls $calls)"
	else
		fail "$label: h2d_bytes $h2d (want $unique), registered_bytes $reg (want 0), fake read_bytes $fake (want 0)"
	fi
fi
label="cuMemHostRegister working, on a prepared region"
prep=1 run_engine reg read
if engine_ok "$label" reg read; then
	h2d=$(totals h2d_bytes)
	reg=$(totals registered_bytes)
	from_reg=$(fake_sum "$work/st.reg" fakecuda h2d_bytes_registered)
	if [ "$h2d" -eq "$unique" ] && [ "$reg" -gt 0 ]; then
		ok "$label: served (h2d_bytes $h2d), registered_bytes $reg ($from_reg bytes copied from registered memory)"
	else
		fail "$label: h2d_bytes $h2d (want $unique), registered_bytes $reg (want > 0)"
	fi
fi
# Registration pins only pages the region has: with cache.populate = lazy, a 16 MiB load
# gives 16 of the 64 slots their pages, and the one 64 MiB chunk is not pinned (pinning it
# would allocate the other 48 MiB of /dev/shm, past what populate and the headroom allow).
label="cuMemHostRegister on a lazy region"
run_engine lazy read KVSHIM_CACHE_POPULATE=lazy
if engine_ok "$label" lazy read; then
	reg=$(totals registered_bytes)
	populated=$(region slots_populated)
	if [ "$reg" -le $((populated * block)) ] && [ "$populated" -lt 64 ]; then
		ok "$label: registered_bytes $reg, no more than the $populated slots with pages hold"
	else
		fail "$label: registered_bytes $reg, more than the $populated slots with pages hold"
	fi
fi

# --- 4. a destination neither device nor host memory the driver knows (a PROT_NONE mapping):
# the shim passes the read through, and the real call's answer is the same as without it.
label="destination unknown to the driver"
"$kvshim" reset --force >/dev/null 2>&1
LD_LIBRARY_PATH=$fakedir timeout 60 "$engine" --dest unknown "${files[@]}" >"$work/out.unk0" \
	2>"$work/err.unk0"
rc0=$?
"$kvshim" reset --force >/dev/null 2>&1
LD_PRELOAD=$lib LD_LIBRARY_PATH=$fakedir timeout 60 "$engine" --dest unknown "${files[@]}" \
	>"$work/out.unk1" 2>"$work/err.unk1"
rc1=$?
reqs=$(totals cufile_requests)
if [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && [ -s "$work/out.unk0" ] &&
	cmp -s "$work/out.unk0" "$work/out.unk1" && [ "$reqs" -eq 0 ]; then
	ok "$label: same answer with and without the shim ($(head -1 "$work/out.unk1" | sed 's/.*: //')), cufile_requests 0"
else
	fail "$label: without the shim exit $rc0: $(head -c 300 "$work/out.unk0"); with it exit $rc1: $(head -c 300 "$work/out.unk1") $(head -c 200 "$work/err.unk1"); cufile_requests $reqs (want 0)"
fi

# --- 5. a handle registered with the real cuFileHandleRegister, behind the shim's back: its
# reads pass through; a handle registered the ordinary way is served.
label="handle registered behind the shim"
"$kvshim" reset --force >/dev/null 2>&1
mkdir -p "$work/st.prereg"
LD_PRELOAD=$lib LD_LIBRARY_PATH=$fakedir FAKECUFILE_STATS=$work/st.prereg timeout 60 \
	"$prereg" $block "${files[0]}" "${files[1]}" >"$work/out.prereg" 2>"$work/err.prereg"
rc=$?
a=$(wc -c <"${files[0]}")
b=$(wc -c <"${files[1]}")
if [ $rc -ne 0 ] || [ "$(cat "$work/out.prereg")" != "prereg: $a unknown-handle bytes, $b ordinary bytes, ok" ]; then
	fail "$label: exit $rc, stdout: $(head -c 200 "$work/out.prereg"), stderr: $(head -c 300 "$work/err.prereg")"
else
	fake=$(fake_sum "$work/st.prereg" fakecufile read_bytes)
	reqs=$(totals cufile_requests)
	if [ "$fake" -eq "$a" ] && [ "$reqs" -eq $((b / block)) ]; then
		ok "$label: bytes right; the fake libcufile read the $fake bytes of the unknown handle, the shim served $reqs requests of the ordinary one"
	else
		fail "$label: fake read_bytes $fake (want $a), cufile_requests $reqs (want $((b / block)))"
	fi
fi

# --- 6. one of 4 engines is SIGKILLed while its (slow) device copy is in flight: the others
# finish with every byte right, and no slot stays pinned once the dead one is reaped.
label="SIGKILL mid-copy, 4 engines"
"$kvshim" reset --force >/dev/null 2>&1
pids=()
for r in 0 1 2 3; do
	LD_PRELOAD=$lib LD_LIBRARY_PATH=$fakedir FAKECUDA_ASYNC_DELAY_US=200000 timeout 120 \
		"$engine" --api read --block $block "${files[@]}" >"$work/out.kill$r" \
		2>"$work/err.kill$r" &
	pids+=($!)
done
# Kill rank 0 once some slot is pinned (a copy is in flight) and rank 0 has attached.
for _ in $(seq 100); do
	if stat_json | python3 -c 'import json,sys
d=json.load(sys.stdin); p=int(sys.argv[1])
sys.exit(0 if d["region"]["slots_pinned"] > 0 and any(x["pid"] == p and x["alive"] for x in d["processes"]) else 1)' \
		"$(pgrep -P "${pids[0]}" || echo 0)" 2>/dev/null; then
		break
	fi
	sleep 0.1
done
sleep 0.3
victim=$(pgrep -P "${pids[0]}") # the engine, child of timeout
[ -n "$victim" ] && kill -9 "$victim" # first: looking at the region takes a while under load
pinned_before=$(region slots_pinned)
wait "${pids[0]}" 2>/dev/null # no "Killed" job notice
vrc=$?
bad=""
for r in 1 2 3; do
	wait "${pids[$r]}"
	rc=$?
	[ $rc -eq 0 ] && [ "$(cat "$work/out.kill$r")" = "$(want_line read)" ] ||
		bad="$bad rank $r exit $rc: $(head -c 200 "$work/err.kill$r");"
done
# The victim's pins come back at the next reap: a survivor's (at most one per 250 ms for the
# region, while it loads) or the next process's attach.  The survivors may have finished
# their loads before one was due, so one more engine attaches first.
pinned_left=$(region slots_pinned)
LD_PRELOAD=$lib LD_LIBRARY_PATH=$fakedir timeout 60 "$engine" --api read --block $block \
	"${files[@]}" >"$work/out.kill4" 2>"$work/err.kill4" ||
	bad="$bad the engine after them: $(head -c 200 "$work/err.kill4");"
pinned=$(region slots_pinned)
if [ -z "$victim" ] || [ $vrc -ne 137 ] || [ -s "$work/out.kill0" ]; then
	fail "$label: the victim (pid ${victim:-none}) was not killed mid-load (exit $vrc): $(head -c 200 "$work/out.kill0")"
elif [ -n "$bad" ]; then
	fail "$label:$bad"
elif [ "$pinned" != 0 ]; then
	fail "$label: survivors right, but slots_pinned $pinned after the next process attached (want 0; $pinned_before when the victim was killed, $pinned_left when the survivors exited)"
else
	ok "$label: the 3 survivors exit 0 with all bytes right; slots_pinned $pinned_before at the kill, $pinned_left when they exited, 0 once the next process attached"
fi

# --- 7. dlsym/dlvsym: the program's answers under the shim equal glibc's own.  dlsym_sem
# prints them (see tests/dlsym_sem.c); LIBCUFILE is dlopen()ed by absolute path, so the
# "before" lines are asked with no libcufile loaded.
dlsym_case() { # LABEL LD_LIBRARY_PATH [ENV=VALUE...]
	local label=$1 lp=$2
	shift 2
	(cd "$work" && env LD_LIBRARY_PATH="$lp" "$dlsym_sem" "$fakedir/libcufile.so.0") \
		>"$work/dl.plain" 2>&1
	(cd "$work" && env "$@" LD_PRELOAD="$lib" LD_LIBRARY_PATH="$lp" "$dlsym_sem" \
		"$fakedir/libcufile.so.0") >"$work/dl.shim" 2>"$work/dl.shim.err"
	local r=$?
	if ! grep -q '^next_read_from_lib libc\.so' "$work/dl.plain" ||
		! grep -q '^default_cufile_before NULL' "$work/dl.plain"; then
		fail "$label: the program's own expectations fail without the shim: $(tr '\n' ';' <"$work/dl.plain")"
	elif [ $r -eq 0 ] && cmp -s "$work/dl.plain" "$work/dl.shim"; then
		ok "$label: the same answers with and without the shim ($(tr '\n' ';' <"$work/dl.shim"))$([ -s "$work/dl.shim.err" ] && echo "; shim stderr: $(head -c 200 "$work/dl.shim.err")")"
	else
		fail "$label: exit $r; differs from glibc's own: $(diff "$work/dl.plain" "$work/dl.shim" | grep '^[<>]' | tr '\n' ';') stderr: $(head -c 200 "$work/dl.shim.err")"
	fi
}
dlsym_case "dlsym semantics, no libcufile on the search path" ""
dlsym_case "dlsym semantics, libcufile on the search path but not loaded" "$fakedir"
dlsym_case "dlsym semantics, shim disabled (KVSHIM_ENABLE=0)" "" KVSHIM_ENABLE=0

# --- 8. libcufile where the global scope does not have it: a plugin linked to it, loaded
# RTLD_LOCAL (NIXL's GDS plugin), makes the process's first hooked call through cuFile; with
# the default configuration, cuda.cufile_library empty, and a wrong path: registration and the
# read work as without the shim (they recursed until the stack overflowed, or failed).
plug_case() { # LABEL [ENV=VALUE...]
	local label=$1 out r
	shift
	"$kvshim" reset --force >/dev/null 2>&1
	out=$(env "$@" LD_PRELOAD="$lib" LD_LIBRARY_PATH="$fakedir" timeout 60 "$cfplug" local \
		"$cfplug_lib" "${files[0]}" 2>"$work/plug.err")
	r=$?
	if [ $r -eq 0 ] && [ "$out" = "$(printf 'plugin: cuFileHandleRegister 0, cuFileRead %s\nlocal: ok' $block)" ]; then
		ok "$label: $(echo "$out" | tr '\n' ';')$([ -s "$work/plug.err" ] && echo " shim stderr: $(head -c 200 "$work/plug.err")")"
	else
		fail "$label: exit $r (139: SIGSEGV), $(echo "$out" | tr '\n' ';') $(head -c 300 "$work/plug.err")"
	fi
}
plug_case "cuFile first, from a plugin loaded RTLD_LOCAL, default configuration"
plug_case "the same with cuda.cufile_library empty" KVSHIM_CUDA_CUFILE_LIBRARY=
plug_case "the same with cuda.cufile_library wrong" KVSHIM_CUDA_CUFILE_LIBRARY=/nonexistent/libcufile.so.0

# --- 9. libcufile dlclose()d (it unloads), then the same library loaded from another path, at
# another address: the shim forgets the first one's functions (it called them: SIGSEGV).
mkdir -p "$work/cf2"
cp "$fakedir/libcufile.so.0" "$work/cf2/libcufile.so.0"
"$kvshim" reset --force >/dev/null 2>&1
want_reload=$(LD_LIBRARY_PATH="$fakedir" timeout 60 "$cfplug" reload "$fakedir/libcufile.so.0" \
	"$work/cf2/libcufile.so.0" "${files[0]}" 2>&1)
got_reload=$(LD_PRELOAD="$lib" LD_LIBRARY_PATH="$fakedir" timeout 60 "$cfplug" reload \
	"$fakedir/libcufile.so.0" "$work/cf2/libcufile.so.0" "${files[0]}" 2>&1)
r=$?
if [ $r -eq 0 ] && [ "$want_reload" = "$got_reload" ] && [ "$(echo "$got_reload" | grep -c ', ok$')" = 2 ] &&
	[ "$(echo "$got_reload" | grep -c 'unloaded$')" = 2 ]; then
	ok "libcufile unloaded and loaded again elsewhere: as without the shim ($(echo "$got_reload" | tr '\n' ';'))"
else
	fail "libcufile unloaded and loaded again elsewhere: exit $r (139: SIGSEGV); without the shim: $(echo "$want_reload" | tr '\n' ';'); with it: $(echo "$got_reload" | tr '\n' ';')"
fi

# --- 10. A driver whose entry points use 512 KiB of their caller's stack (a real driver's call
# chains are deep): every thread of the shim that calls into the driver or libcufile has the
# stack of a thread the program would create (64 KiB ones faulted).
for api in read batch async write; do
	label="a driver that uses 512 KiB of stack, api $api"
	run_engine stack.$api $api FAKECUDA_STACK_KB=512
	if [ $api = write ]; then
		[ $rc -eq 0 ] && ok "$label: exit 0 ($(cat "$work/out.stack.$api"))" ||
			fail "$label: exit $rc (139: SIGSEGV), $(head -c 300 "$work/err.stack.$api")"
	elif engine_ok "$label" stack.$api $api; then
		ok "$label: every byte right, h2d_bytes $(totals h2d_bytes)"
	fi
done

# --- 11. A batch of one entry: a submit the shim's loader refuses (host memory) goes to the real
# library alone, slowly, and fails; meanwhile another thread submits a read the shim serves.
# The refused entry keeps its slot until the real answer is in: every entry whose submit
# succeeded is reported once, with its own cookie (the second one took the slot and was
# written over before).
"$kvshim" reset --force >/dev/null 2>&1
out=$(LD_PRELOAD="$lib" LD_LIBRARY_PATH="$fakedir" FAKECUFILE_FAIL=batch_submit \
	FAKECUFILE_SUBMIT_DELAY_US=300000 timeout 60 "$cfbatch" "${files[0]}" 2>&1)
r=$?
if [ $r -eq 0 ] && [ "$(echo "$out" | tail -1)" = consistent ]; then
	ok "two batch submits racing for one entry: $(echo "$out" | tr '\n' ';')"
else
	fail "two batch submits racing for one entry: exit $r, $(echo "$out" | tr '\n' ';')"
fi

# --- 12. cuFileReadAsync on a stream capturing into a graph: what is enqueued runs only when
# the graph is launched (never, here), maybe many times; the shim must pass it through before
# it pins anything (a first launch would free what a second one uses).  The engine reads the
# first block of each file that way, then every block as usual.
label="cuFileReadAsync on a capturing stream"
"$kvshim" reset --force >/dev/null 2>&1
mkdir -p "$work/st.capture"
LD_PRELOAD="$lib" LD_LIBRARY_PATH="$fakedir" timeout 120 "$engine" --api async --block $block \
	--capture 1 --report "$work/capture.rep" "${files[@]}" >"$work/out.capture" \
	2>"$work/err.capture"
rc=$?
cres=$(awk '$1 == "captured_result" { print $2 }' "$work/capture.rep" 2>/dev/null)
reqs=$(totals requests)
creqs=$(totals cufile_requests)
nblocks=$((unique / block))
if ! engine_ok "$label" capture async; then
	:
elif [ "$cres" = -12345 ] && [ "$reqs" -eq "$nblocks" ] && [ "$creqs" -eq "$nblocks" ]; then
	ok "$label: passed through, nothing pinned for it (requests $reqs, the $nblocks ordinary reads); the captured read did not run"
else
	fail "$label: captured read's count $cres (want -12345: never run), requests $reqs and cufile_requests $creqs (want $nblocks each)"
fi

echo "gpu_faults: $fails failed"
[ $fails -eq 0 ]
