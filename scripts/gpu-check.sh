#!/usr/bin/env bash
# The device check: does kvshim work on this machine's GPU, in a few minutes, offline?  Two
# halves (docs/testing.md, "The device check"):
#
#   scripts/gpu-check.sh --prepare [--kit DIR] [--build DIR]
#       here, without a GPU: builds the Release shim, the command, the engines, the probe, the
#       bench and the fakes (in DIR of --build, default build-gpu-kit/), and puts what the run
#       needs in one folder (--kit, default gpu-kit/, git-ignored, under 32 MiB), with
#       libcufile.so.0 and its companion from the nvidia-cufile wheel.  Needs cmake, cuda.h
#       and the build's dependencies (scripts/deps.sh), not a GPU.
#   scripts/gpu-check.sh --run [--fake] [--kit DIR] [--deadline SECONDS]
#       there: uses only the kit and the machine's driver (libcuda.so.1), never the network,
#       and prints every PASS / FAIL / SKIP / INFO line as soon as it is decided, under one
#       deadline (default 240 s):
#         1. the environment (glibc, kernel, driver, GPU, GDS or compatibility mode, /dev/shm,
#            O_DIRECT in the work folder);
#         2. the driver probes (tests/gpu_probe.c): the behaviours kvshim relies on;
#         3. host-to-device GB/s from a registered /dev/shm region against cuMemHostAlloc
#            memory, at the shard size and at 64 MiB, and the registration's rate;
#         4. 8 engine processes (tests/gpu_engine.c) for each of: cuFileRead through a NEEDED
#            libcufile, cuFileRead through dlopen + dlsym, batch, cuFileReadAsync with
#            registration off and on, and cuFileWrite followed by 8 readers; each gated on the
#            shim's counters (h2d_bytes 8 x the unique bytes, every cuFile request served,
#            storage bytes / unique bytes by /proc/PID/io printed and within 5% of 1.00 (0.00
#            after a save), no failure, no fallback) and every byte on the device right;
#         5. POSIX O_DIRECT reads under the shim into cuMemHostAlloc'd and registered memory,
#            copied to the device and compared, 8 processes.
#       --fake runs the same against the kit's fake libcuda and libcufile (CI does, through
#       CTest: the script itself is tested on every submission); the figures then mean
#       nothing.  Exit 0 when nothing FAILed, 1 otherwise, 2 for a wrong usage.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode=""
fake=0
kit=$root/gpu-kit
build=$root/build-gpu-kit
deadline=240
usage() {
	echo "usage: $0 --prepare [--kit DIR] [--build DIR]" >&2
	echo "       $0 --run [--fake] [--kit DIR] [--deadline SECONDS]" >&2
	exit 2
}
while [ $# -gt 0 ]; do
	case "$1" in
	--prepare) mode=prepare ;;
	--run) mode=run ;;
	--fake) fake=1 ;;
	--kit) kit=${2:?}; shift ;;
	--build) build=${2:?}; shift ;;
	--deadline) deadline=${2:?}; shift ;;
	*) usage ;;
	esac
	shift
done
[ -n "$mode" ] || usage
kit=$(mkdir -p "$kit" && cd "$kit" && pwd)

# ------------------------------------------------------------------------- --prepare

prepare() {
	local log=$build/gpu-check-prepare.log targets f size wheel commit
	mkdir -p "$build"
	echo "gpu-check: building (Release) in $build"
	if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_SKIP_BUILD_RPATH=ON \
		>"$log" 2>&1; then
		tail -20 "$log"
		echo "gpu-check: FAIL configure (see $log; scripts/deps.sh installs what it needs)"
		return 1
	fi
	if ! grep -q '^kvshim-gpu-probe:' "$build/CMakeFiles/TargetDirectories.txt" 2>/dev/null &&
		! [ -d "$build/tests/CMakeFiles/kvshim-gpu-probe.dir" ]; then
		echo "gpu-check: FAIL the probe and the fakes need cuda.h (the CUDA toolkit's headers), not found"
		return 1
	fi
	targets="kvshim kvshim-cli kvshim-gpu-engine-dl kvshim-gpu-engine-ln kvshim-gpu-probe kvshim-bench-h2d fakecuda fakecufile"
	# shellcheck disable=SC2086
	if ! cmake --build "$build" -j"${KVS_JOBS:-2}" --target $targets >>"$log" 2>&1; then
		tail -20 "$log"
		echo "gpu-check: FAIL build (see $log)"
		return 1
	fi
	if [ -n "$(ls -A "$kit")" ] && [ ! -f "$kit/MANIFEST" ]; then
		echo "gpu-check: FAIL $kit is not empty and holds no kit (no MANIFEST): not replaced"
		return 1
	fi
	rm -rf "${kit:?}"/bin "${kit:?}"/lib "${kit:?}"/cufile "${kit:?}"/fake "${kit:?}"/MANIFEST
	mkdir -p "$kit/bin" "$kit/lib" "$kit/cufile" "$kit/fake/cuda" "$kit/fake/cufile"
	cp -L "$build/shim/libkvshim.so" "$kit/lib/"
	cp -L "$build/tools/kvshim" "$build/tools/kvshim-bench-h2d" "$kit/bin/"
	cp -L "$build/tests/kvshim-gpu-engine-dl" "$build/tests/kvshim-gpu-engine-ln" \
		"$build/tests/kvshim-gpu-probe" "$kit/bin/"
	cp -L "$build/tests/fake/libcuda.so.1" "$kit/fake/cuda/"
	cp -L "$build/tests/fake/libcufile.so.0" "$kit/fake/cufile/"
	strip --strip-unneeded "$kit"/bin/* "$kit"/lib/* "$kit"/fake/*/* 2>/dev/null
	# The real libcufile: from the nvidia-cufile wheel of this machine's Python (never
	# looked for there: the GPU machine need not have it).
	wheel=$(python3 -c 'import nvidia, os
for p in nvidia.__path__:
    for d in ("cu13/lib", "cufile/lib"):
        f = os.path.join(p, d, "libcufile.so.0")
        if os.path.exists(f):
            print(os.path.dirname(f)); raise SystemExit' 2>/dev/null)
	if [ -n "$wheel" ]; then
		cp -L "$wheel/libcufile.so.0" "$kit/cufile/"
		[ -e "$wheel/libcufile_rdma.so.1" ] && cp -L "$wheel/libcufile_rdma.so.1" "$kit/cufile/"
		echo "gpu-check: libcufile from $wheel"
	else
		echo "gpu-check: note: no nvidia-cufile wheel (python3 -m pip install nvidia-cufile): the kit has no real libcufile, and --run uses the fake one with the real driver"
	fi
	commit=$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)
	{
		echo "kit $commit $(date -u +%Y-%m-%dT%H:%M:%SZ)"
		echo "glibc_needed $(for f in "$kit"/bin/* "$kit"/lib/*; do objdump -T "$f"; done 2>/dev/null |
			grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)"
		(cd "$kit" && find . -type f ! -name MANIFEST | sort | while read -r f; do
			echo "file $f $(stat -c %s "$f") $(sha256sum "$f" | cut -c1-16)"
		done)
	} >"$kit/MANIFEST"
	size=$(du -sb "$kit" | cut -f1)
	if [ "$size" -gt $((32 * 1024 * 1024)) ]; then
		echo "gpu-check: FAIL the kit is $((size >> 20)) MiB, over 32 MiB"
		return 1
	fi
	if ! "$kit/bin/kvshim" --version >/dev/null 2>&1; then
		echo "gpu-check: FAIL $kit/bin/kvshim does not run"
		return 1
	fi
	echo "gpu-check: kit ready in $kit: $((size >> 10)) KiB ($(wc -l <"$kit/MANIFEST") lines of MANIFEST; $(sed -n 2p "$kit/MANIFEST"))"
	echo "gpu-check: on the GPU machine, from the repository root: bash scripts/gpu-check.sh --run"
}

if [ "$mode" = prepare ]; then
	prepare
	exit $?
fi

# ------------------------------------------------------------------------- --run

start=$SECONDS
fails=0
summary=()
out() { # STATUS TEXT: one line, now
	printf '%-4s %s\n' "$1" "$2"
	summary+=("$(printf '%-4s %s' "$1" "$2")")
	[ "$1" = FAIL ] && fails=$((fails + 1))
	return 0
}
left() { echo $((deadline - (SECONDS - start))); }
# budget WANT: seconds a step may take: WANT, or what is left of the deadline.
budget() {
	local l
	l=$(left)
	[ "$l" -lt "$1" ] && echo "$l" || echo "$1"
}
finish() {
	echo
	echo "gpu-check summary ($([ $fake -eq 1 ] && echo "fakes" || echo "${gpu_name:-GPU}"), $((SECONDS - start)) s of $deadline):"
	printf '  %s\n' "${summary[@]}"
	echo "gpu-check: $fails failed"
	[ "$fails" -eq 0 ]
	exit $?
}

bin=$kit/bin
lib=$kit/lib/libkvshim.so
kvshim=$bin/kvshim
engine_dl=$bin/kvshim-gpu-engine-dl
engine_ln=$bin/kvshim-gpu-engine-ln
probe=$bin/kvshim-gpu-probe
bench=$bin/kvshim-bench-h2d
echo "gpu-check: --run $([ $fake -eq 1 ] && echo "--fake ")with the kit in $kit, deadline $deadline s"
for f in "$lib" "$kvshim" "$engine_dl" "$engine_ln" "$probe" "$bench" "$kit/MANIFEST"; do
	if [ ! -x "$f" ] && [ ! -f "$f" ]; then
		out FAIL "kit: $f is missing: run scripts/gpu-check.sh --prepare on a machine with the build's dependencies, and carry $kit"
		finish
	fi
done
while read -r v; do unset "$v"; done < <(compgen -e | grep -E '^(KVSHIM|FAKECUDA|FAKECUFILE)_')

# --- 1. the environment
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
need=$(awk '$1 == "glibc_needed" { print $2 }' "$kit/MANIFEST")
out INFO "env: kit $(awk '$1 == "kit" { print $2 " of " $3 }' "$kit/MANIFEST"); kernel $(uname -r); glibc ${glibc:-?} (the kit needs ${need:-?})"
if [ -n "$glibc" ] && [ -n "$need" ] &&
	[ "$(printf '%s\n%s\n' "$need" "$glibc" | sort -V | head -1)" != "$need" ]; then
	out FAIL "env: glibc $glibc is older than the $need the kit was built against: build the kit on an older system"
	finish
fi
if [ $fake -eq 1 ]; then
	cudadir=$kit/fake/cuda
	export FAKECUDA_ASYNC_DELAY_US=0
else
	cudadir=""
	if command -v nvidia-smi >/dev/null 2>&1; then
		smi=$(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id \
			--format=csv,noheader 2>&1 | head -1)
		gpu_name=${smi%%,*}
		out INFO "env: nvidia-smi: $smi"
	fi
fi
libpath=${cudadir}
penv() { # the probe and the bench: the driver only
	env ${libpath:+LD_LIBRARY_PATH=$libpath} "$@"
}
envout=$(penv timeout "$(budget 30)" "$probe" env 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
	out FAIL "env: the driver cannot be used (exit $rc): $(echo "$envout" | tr '\n' ' ' | head -c 400)"
	finish
fi
while read -r st rest; do
	out "$st" "$rest"
	case "$rest" in *"device 0: "*) [ -n "${gpu_name:-}" ] || gpu_name=$(echo "$rest" | sed 's/.*device 0: \([^,]*\),.*/\1/') ;; esac
done <<<"$envout"
if [ -d /sys/module/nvidia_fs ]; then
	gds="GDS: nvidia-fs loaded (libcufile may use GPUDirect)"
	force=false
else
	gds="compatibility mode: nvidia-fs not loaded (libcufile reads with POSIX I/O)"
	force=true
fi
[ $fake -eq 1 ] && gds="fake libcufile"
shm_free=$(df -B1 --output=avail /dev/shm 2>/dev/null | tail -1 | tr -d ' ')
shm_size=$(df -B1 --output=size /dev/shm 2>/dev/null | tail -1 | tr -d ' ')
out INFO "env: $gds; /dev/shm $(( ${shm_size:-0} >> 20 )) MiB, $(( ${shm_free:-0} >> 20 )) MiB free"

# The work folder: files the engines read with O_DIRECT (tmpfs cannot).
work=""
for cand in ${KVS_GPU_CHECK_WORK:-} /var/tmp "$root/.." /tmp "$HOME"; do
	[ -n "$cand" ] && [ -d "$cand" ] && [ -w "$cand" ] || continue
	w=$(mktemp -d "$cand/kvshim-gpu-check.XXXXXX" 2>/dev/null) || continue
	head -c 65536 /dev/urandom >"$w/probe" 2>/dev/null
	if dd if="$w/probe" of=/dev/null bs=4096 count=1 iflag=direct status=none 2>/dev/null; then
		work=$w
		break
	fi
	rm -rf "$w"
done
name=gpu-check-$$
cleanup() {
	[ -n "$work" ] && KVSHIM_CONFIG=$work/kvshim.ini "$kvshim" reset --force >/dev/null 2>&1
	[ -n "$work" ] && rm -rf "$work"
}
trap cleanup EXIT
if [ -z "$work" ]; then
	out SKIP "env: no folder where O_DIRECT works (tried /var/tmp, the repository's parent, /tmp, \$HOME; set KVS_GPU_CHECK_WORK): the engine steps cannot run"
else
	out INFO "env: work folder $work (O_DIRECT works; $(df -T "$work" | awk 'NR == 2 { print $2 }'))"
fi

# --- 2. the driver probes
mib=1024
[ $fake -eq 1 ] && mib=128
[ -n "$shm_free" ] && [ $((shm_free >> 22)) -lt $mib ] && mib=$((shm_free >> 22)) # a quarter
t=$(budget 60)
gate_ok=1
if [ "$t" -lt 10 ]; then
	out SKIP "probes: the deadline is near"
else
	last=""
	rc=""
	while IFS= read -r l; do
		case "$l" in
		"... "*) last=${l#... } ;;
		"probe-exit "*) rc=${l#probe-exit } ;;
		FAIL\ gate:* | FAIL\ batch_in_order:*)
			gate_ok=0
			out FAIL "probe ${l#* }"
			;;
		PASS* | FAIL* | INFO* | SKIP*) out "${l%% *}" "probe ${l#* }" ;;
		*) out INFO "probe (stderr): $l" ;;
		esac
	done < <(penv timeout "$t" "$probe" probes "$mib" 2>&1; echo "probe-exit $?")
	if [ "$rc" != 0 ]; then
		out FAIL "probes: exit $rc$([ "$rc" = 124 ] && echo " (timed out)")$([ -n "$last" ] && echo ", in probe $last")"
	fi
fi

# --- 3. host-to-device bandwidth by kind of source
t=$(budget 60)
if [ "$t" -lt 10 ]; then
	out SKIP "h2d bandwidth: the deadline is near"
elif penv timeout "$t" "$bench" -r 256 -S 1024 -n $([ $fake -eq 1 ] && echo 1 || echo 3) \
	>"$work/bench" 2>"$work/bench.err"; then
	reg=$(awk '$1 == "register" { print $0 }' "$work/bench")
	line=$(awk '$1 == "registered" || $1 == "host_alloc" || $1 == "pageable" { v[$1 " " $2] = $3 }
		END { printf "1 MiB: registered %s, cuMemHostAlloc %s, pageable %s GB/s; 64 MiB: registered %s, cuMemHostAlloc %s, pageable %s GB/s",
		             v["registered 1024K"], v["host_alloc 1024K"], v["pageable 1024K"],
		             v["registered 65536K"], v["host_alloc 65536K"], v["pageable 65536K"];
		      r1 = v["host_alloc 1024K"] > 0 ? 100 * v["registered 1024K"] / v["host_alloc 1024K"] : 0;
		      r64 = v["host_alloc 65536K"] > 0 ? 100 * v["registered 65536K"] / v["host_alloc 65536K"] : 0;
		      printf "; registered/cuMemHostAlloc %.0f%% and %.0f%% (goal >= 90%%)", r1, r64 }' "$work/bench")
	out PASS "h2d: $line$([ $fake -eq 1 ] && echo " (fake driver: figures mean nothing)")"
	out INFO "h2d: ${reg:-registration: no figure}; $(grep '^verify' "$work/bench")"
else
	out FAIL "h2d: kvshim-bench-h2d failed: $(tr '\n' ' ' <"$work/bench" | head -c 300) $(tr '\n' ' ' <"$work/bench.err" | head -c 300)"
fi

# --- the libraries the engines use
[ -z "$work" ] && finish
if [ $fake -eq 1 ]; then
	cufiledir=$kit/fake/cufile
	cufile_note="fake libcufile"
else
	cufiledir=$kit/cufile
	cat >"$work/cufile.json" <<EOF
{
  "logging": { "dir": "$work", "level": "ERROR" },
  "properties": { "allow_compat_mode": true, "force_compat_mode": $force }
}
EOF
	export CUFILE_ENV_PATH_JSON=$work/cufile.json
	if [ -e "$cufiledir/libcufile.so.0" ] &&
		LD_LIBRARY_PATH=$cufiledir timeout "$(budget 30)" "$probe" cufile \
			"$cufiledir/libcufile.so.0" >"$work/cufile.out" 2>&1; then
		cufile_note="real libcufile ($(sed -n 's/.*version \([0-9]*\).*/\1/p' "$work/cufile.out" | head -1), force_compat_mode $force)"
		out INFO "cufile: $(head -1 "$work/cufile.out")"
	else
		out INFO "cufile: the kit's real libcufile cannot be used here ($(tr '\n' ' ' <"$work/cufile.out" 2>/dev/null | head -c 300)); the fake one serves the engines: every read must then be served by the shim (a read passed through to it fails)"
		cufiledir=$kit/fake/cufile
		cufile_note="fake libcufile with the real driver"
	fi
fi
libpath=${cudadir:+$cudadir:}$cufiledir

# --- KV files and the configuration
nfiles=4
mib_file=16
[ $fake -eq 1 ] && mib_file=8
block=$((1024 * 1024))
mkdir -p "$work/kv"
for i in $(seq 0 $((nfiles - 1))); do
	head -c $((mib_file << 20)) /dev/urandom >"$work/kv/blk$i"
done
head -c $block /dev/urandom >"$work/kv/warm"
files=("$work"/kv/blk*)
unique=$((nfiles * (mib_file << 20)))
nblocks=$((unique / block))
cat >"$work/kvshim.ini" <<EOF
[shim]
log = warn
[files]
roots = $work/kv
settle = 0
[cache]
name = $name
shard_size = 1M
capacity = 256M
[cuda]
library = libcuda.so.1
cufile_library = $cufiledir/libcufile.so.0
EOF
export KVSHIM_CONFIG=$work/kvshim.ini
total() { # COUNTER: one counter of stat --json's totals (0 if none)
	"$kvshim" stat --json 2>/dev/null | sed -n 's/.*"totals":{\([^}]*\)}.*/\1/p' | tr ',' '\n' |
		awk -F: -v k="\"$1\"" '$1 == k { v = $2 } END { print (v == "" ? 0 : v) }'
}
sum_report() { # DIR KEY: KEY summed over DIR/report.*
	cat "$1"/report.* 2>/dev/null | awk -v k="$2" '$1 == k { s += $2 } END { printf "%.0f\n", s }'
}
# shim_said DIR: the first lines the shim (or anything but the attach line) put on stderr
shim_said() {
	cat "$1"/err.* 2>/dev/null | grep -v 'info: attached' | sort | uniq -c | sort -rn | head -3 |
		sed 's/^ *//' | tr '\n' ';' | head -c 400
}

# run8 LABEL DIR ENGINE ARGS...: 8 engines at once under the shim, each with a report; the
# exit codes in $DIR/rc.*.  Sets bad to the ranks that did not exit 0 with the right line.
run8() {
	local label=$1 dir=$2 eng=$3 r pids=() t want
	shift 3
	mkdir -p "$dir"
	t=$(budget 90)
	for r in 0 1 2 3 4 5 6 7; do
		LD_PRELOAD=$lib LD_LIBRARY_PATH=$libpath timeout "$t" "$eng" "$@" \
			--report "$dir/report.$r" "${files[@]}" >"$dir/out.$r" 2>"$dir/err.$r" &
		pids+=($!)
	done
	bad=""
	want="engine: $nfiles files, $unique bytes, api $api, ok"
	for r in 0 1 2 3 4 5 6 7; do
		wait "${pids[$r]}"
		rc=$?
		if [ $rc -ne 0 ] || [ "$(cat "$dir/out.$r")" != "$want" ]; then
			bad="$bad rank $r exit $rc$([ $rc -eq 1 ] && echo " WRONG BYTES")$([ $rc -eq 124 ] && echo " timed out"): $(grep -v 'info: attached' "$dir/err.$r" | tail -2 | tr '\n' ' ' | head -c 200);"
		fi
	done
}

# gate LABEL DIR H2D_WANT REQ_WANT STORAGE_WANT(1|0) [EXTRA_BACKEND]: the verdict of a run.
gate() {
	local label=$1 dir=$2 h2d_want=$3 req_want=$4 swant=$5 extra=${6:-0}
	local h2d reqs fails_ fb backend storage ratio bratio why=""
	h2d=$(total h2d_bytes)
	reqs=$(total cufile_requests)
	fails_=$(total failures)
	fb=$(total fallbacks)
	backend=$(total backend_bytes)
	storage=$(sum_report "$dir" storage_bytes)
	ratio=$(awk -v s="$storage" -v u="$unique" 'BEGIN { printf "%.2f", s / u }')
	bratio=$(awk -v s="$backend" -v e="$extra" -v u="$unique" 'BEGIN { printf "%.2f", (s - e) / u }')
	[ -n "$bad" ] && why="$why$bad"
	[ "$h2d" -eq "$h2d_want" ] || why="$why h2d_bytes $h2d (want $h2d_want);"
	[ "$req_want" = - ] || [ "$reqs" -eq "$req_want" ] || why="$why cufile_requests $reqs (want $req_want);"
	[ "$fails_" -eq 0 ] || why="$why failures $fails_;"
	[ "$fb" -eq 0 ] || why="$why fallbacks $fb;"
	if [ "$swant" = 1 ]; then
		awk -v r="$ratio" 'BEGIN { exit !(r >= 0.95 && r <= 1.05) }' ||
			why="$why storage/unique $ratio by /proc/PID/io (want 1.00 +- 5%);"
	else
		awk -v r="$ratio" 'BEGIN { exit !(r <= 0.05) }' ||
			why="$why storage/unique $ratio by /proc/PID/io (want 0.00: a save is read back from the cache);"
	fi
	if [ -n "$why" ]; then
		out FAIL "$label:$why shim: $(shim_said "$dir")"
		return 1
	fi
	out PASS "$label: 8 processes, every byte on the device right; storage/unique $ratio by /proc/PID/io (backend_bytes/unique $bratio); h2d_bytes $h2d; cufile_requests $reqs; no failure, no fallback"
	local said
	said=$(shim_said "$dir")
	[ -n "$said" ] && out INFO "$label: stderr: $said"
	return 0
}

reset_region() { "$kvshim" reset --force >/dev/null 2>&1; }

# --- 4. the engines
out INFO "engines: $nfiles files of $mib_file MiB ($unique unique bytes), 1 MiB blocks, shard_size 1M, capacity 256M, $cufile_note"
engine_case() { # LABEL API ENGINE [extra args...]: one gated run
	local label=$1 eng=$3 dir
	api=$2
	shift 3
	if [ "$(left)" -lt 15 ]; then
		out SKIP "$label: the deadline is near"
		return
	fi
	dir=$work/run.$(echo "$label" | tr -c 'a-z0-9' _)
	reset_region
	run8 "$label" "$dir" "$eng" --api "$api" --block $block "$@"
	gate "$label" "$dir" $((8 * unique)) $((8 * nblocks)) 1
}
engine_case "cuFileRead, libcufile NEEDED" read "$engine_ln"
engine_case "cuFileRead, libcufile by dlopen + dlsym" read "$engine_dl"
engine_case "cuFileBatchIO" batch "$engine_dl"
if [ $gate_ok -eq 0 ]; then
	# A gated read waits at a gate the probe saw never opening: the engines would hang.
	out SKIP "cuFileReadAsync, registration off and on: the gate probe failed (gated reads would wait for ever)"
else
	KVSHIM_CUDA_REGISTER_HOST=false engine_case "cuFileReadAsync, registration off" async "$engine_dl"
fi
if [ $gate_ok -eq 0 ]; then
	:
elif [ "$(left)" -lt 15 ]; then
	out SKIP "cuFileReadAsync, registration on: the deadline is near"
else
	# Every page first, then a warm-up read that starts the registration and a pause, so that
	# the cold reads find the region registered (the gated, stream-ordered path).
	label="cuFileReadAsync, registration on"
	api=async
	dir=$work/run.async_reg
	reset_region
	"$kvshim" prepare >/dev/null 2>&1
	run8 "$label" "$dir" "$engine_dl" --api async --block $block --warm "$work/kv/warm" \
		--pause-ms 1500
	if gate "$label" "$dir" $((8 * unique + 8 * block)) $((8 * nblocks + 8)) 1 "$block"; then
		out INFO "$label: registered_bytes $(total registered_bytes) (summed over the 8 processes)"
		# The same shards again, by one engine whose stream is kept busy 200 ms before each
		# file's reads, registration off: hits from pageable slots are copied by a batch
		# that reads during the call; the calls must not wait for the stream (F2).
		label="cuFileReadAsync behind a stream busy 200 ms (hits, registration off)"
		LD_PRELOAD=$lib LD_LIBRARY_PATH=$libpath KVSHIM_CUDA_REGISTER_HOST=false \
			timeout "$(budget 30)" "$engine_dl" --api async --block $block --busy-ms 200 \
			--report "$dir/busy.rep" "${files[@]}" >"$dir/busy.out" 2>"$dir/busy.err"
		rc=$?
		us=$(awk '$1 == "async_call_us" { print $2 }' "$dir/busy.rep" 2>/dev/null)
		if [ $rc -ne 0 ] || [ -z "$us" ]; then
			out FAIL "$label: exit $rc: $(tail -2 "$dir/busy.err" | tr '\n' ' ' | head -c 300)"
		elif [ "$us" -lt $((nfiles * 100000)) ]; then
			out PASS "$label: the calls for $nfiles files took $((us / 1000)) ms in all, every byte right"
		else
			out FAIL "$label: the calls for $nfiles files took $((us / 1000)) ms: they waited for the stream"
		fi
	fi
fi
if [ "$(left)" -lt 20 ]; then
	out SKIP "cuFileWrite, then 8 readers: the deadline is near"
else
	label="cuFileWrite, then 8 readers"
	reset_region
	mkdir -p "$work/run.write"
	LD_PRELOAD=$lib LD_LIBRARY_PATH=$libpath timeout "$(budget 60)" "$engine_dl" --api write \
		--block $block "${files[@]}" >"$work/run.write/out.w" 2>"$work/run.write/err.w"
	rc=$?
	kept=$(total write_through_bytes)
	if [ $rc -ne 0 ]; then
		out FAIL "$label: the save exited $rc: $(tail -2 "$work/run.write/err.w" | tr '\n' ' ' | head -c 300)"
	elif [ "$kept" -ne "$unique" ]; then
		out FAIL "$label: write_through_bytes $kept after the save (want $unique: the save kept whole); shim: $(shim_said "$work/run.write")"
	else
		api=read
		run8 "$label" "$work/run.write" "$engine_dl" --api read --block $block
		gate "$label (the save kept $kept bytes)" "$work/run.write" $((8 * unique)) \
			$((8 * nblocks)) 0
	fi
fi

# --- 5. POSIX O_DIRECT reads into pinned host memory
for kind in alloc register; do
	label="POSIX O_DIRECT preads into $([ $kind = alloc ] && echo "cuMemHostAlloc'd" || echo "cuMemHostRegister'd") memory"
	if [ "$(left)" -lt 15 ]; then
		out SKIP "$label: the deadline is near"
		continue
	fi
	api=pread
	dir=$work/run.pread_$kind
	reset_region
	run8 "$label" "$dir" "$engine_dl" --api pread --host $kind --block $block
	copy=$(total copy_bytes)
	if gate "$label" "$dir" 0 - 1 && [ "$copy" -ne $((8 * unique)) ]; then
		out FAIL "$label: copy_bytes $copy (want $((8 * unique)): every pread served)"
	fi
done

finish
