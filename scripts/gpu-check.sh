#!/usr/bin/env bash
# The shim's cuFile path on a machine with an NVIDIA GPU, in under 5 minutes:
#  1. builds kvshim (Release, in build-gpu-check/);
#  2. 4 engine processes at once (tests/gpu_engine.c) read KV files into device memory with
#     cuFileRead under LD_PRELOAD=libkvshim.so, against the real driver and the real libcufile
#     (nvidia-cufile wheel: nvidia/cu13/lib/libcufile.so.0, in compatibility mode where there
#     is no GPUDirect hardware); each copies every byte back and compares;
#  3. the same with kvikio reading into CuPy arrays (cupy-cuda13x, kvikio-cu13), checked;
#  4. kvshim-bench-h2d: host-to-device GB/s from the registered region, cuMemHostAlloc memory
#     and pageable memory, and registered/cuMemHostAlloc against the 90% goal.
# Prints a summary; exits 1 if any byte is wrong or a step fails, 0 otherwise (the bandwidth
# goal is reported, not enforced: one run on a shared machine is not a verdict).
#   scripts/gpu-check.sh [--fake]
# --fake runs the same flow on a machine without a GPU against the fakes (tests/fake_cuda.c,
# tests/fake_cufile.c): kvikio is skipped (CuPy needs a real GPU) and the figures mean nothing.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
fake=0
case "${1:-}" in
--fake) fake=1 ;;
"") ;;
*)
	echo "usage: $0 [--fake]" >&2
	exit 2
	;;
esac
build=$root/build-gpu-check
nproc=${KVS_JOBS:-$(nproc)}
summary=()
bad=0
note() { echo "gpu-check: $*"; }
result() { # STATUS TEXT: one summary line; FAIL counts
	summary+=("$(printf '%-5s %s' "$1" "$2")")
	[ "$1" = FAIL ] && bad=1
	note "$1 $2"
}

# --- 1. build
note "building (Release) in $build"
mkdir -p "$build"
[ $fake -eq 1 ] || bash "$root/scripts/deps.sh"
if ! { cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >"$build/gpu-check.log" 2>&1 &&
	cmake --build "$build" -j"$nproc" >>"$build/gpu-check.log" 2>&1; }; then
	tail -20 "$build/gpu-check.log"
	result FAIL "build (see $build/gpu-check.log)"
	exit 1
fi
lib=$build/shim/libkvshim.so
kvshim=$build/tools/kvshim
engine=$build/tests/kvshim-gpu-engine-dl
bench=$build/tools/kvshim-bench-h2d

work=$(mktemp -d /var/tmp/kvshim-gpu-check.XXXXXX)
name=gpu-check-$$
cleanup() {
	KVSHIM_CONFIG=$work/kvshim.ini "$kvshim" reset --force >/dev/null 2>&1
	rm -rf "$work"
}
trap cleanup EXIT
while read -r v; do unset "$v"; done < <(compgen -e | grep '^KVSHIM_')

# --- the libraries: fakes, or the real driver and the wheel's libcufile
if [ $fake -eq 1 ]; then
	libdir=$build/tests/fake
	libcuda=$libdir/libcuda.so.1
	libcufile=$libdir/libcufile.so.0
	export FAKECUDA_ASYNC_DELAY_US=0
else
	libcufile=$(python3 -c 'import nvidia, os
for p in nvidia.__path__:
    f = os.path.join(p, "cu13", "lib", "libcufile.so.0")
    if os.path.exists(f): print(f); break' 2>/dev/null)
	libcuda=$(ldconfig -p | awk '$1 == "libcuda.so.1" { print $NF; exit }')
	if [ -z "$libcufile" ] || [ -z "$libcuda" ]; then
		result FAIL "libraries: libcufile.so.0 '${libcufile:-not found (python3 -m pip install nvidia-cufile)}', libcuda.so.1 '${libcuda:-not found (NVIDIA driver)}'"
		exit 1
	fi
	libdir=$(dirname "$libcufile")
	# Compatibility mode: forced where nvidia-fs (GPUDirect Storage) is not loaded.
	force=false
	[ -d /sys/module/nvidia_fs ] || force=true
	cat >"$work/cufile.json" <<EOF
{
  "logging": { "dir": "$work", "level": "ERROR" },
  "properties": { "allow_compat_mode": true, "force_compat_mode": $force }
}
EOF
	export CUFILE_ENV_PATH_JSON=$work/cufile.json
	note "cufile.json: allow_compat_mode true, force_compat_mode $force"
fi
note "libcuda: $libcuda"
note "libcufile: $libcufile"

# --- KV files and the shim's configuration
nfiles=4
mib=64
[ $fake -eq 1 ] && mib=8
mkdir -p "$work/kv"
for i in $(seq 0 $((nfiles - 1))); do
	head -c $((mib << 20)) /dev/urandom >"$work/kv/blk$i"
done
files=("$work"/kv/blk*)
unique=$((nfiles * (mib << 20)))
cat >"$work/kvshim.ini" <<EOF
[files]
roots = $work/kv
settle = 0
[cache]
name = $name
shard_size = 1M
capacity = $((2 * nfiles * mib))M
[cuda]
library = $libcuda
cufile_library = $libcufile
EOF
export KVSHIM_CONFIG=$work/kvshim.ini
totals() {
	"$kvshim" stat --json 2>/dev/null | python3 -c 'import json,sys
try: print(json.load(sys.stdin)["totals"][sys.argv[1]])
except Exception: print(0)' "$1"
}

# run4 LABEL CMD...: 4 processes of CMD at once under the shim; each must exit 0.
run4() {
	local label=$1 r rc failed=""
	shift
	local pids=()
	"$kvshim" reset --force >/dev/null 2>&1
	for r in 0 1 2 3; do
		LD_PRELOAD=$lib LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
			timeout 120 "$@" >"$work/out.$r" 2>"$work/err.$r" &
		pids+=($!)
	done
	for r in 0 1 2 3; do
		wait "${pids[$r]}"
		rc=$?
		if [ $rc -ne 0 ]; then
			failed="$failed rank $r exit $rc ($([ $rc -eq 1 ] && echo "WRONG BYTES: ")$(tail -c 200 "$work/err.$r" | tr '\n' ' '));"
		fi
	done
	local backend h2d
	backend=$(totals backend_bytes)
	h2d=$(totals h2d_bytes)
	if [ -n "$failed" ]; then
		result FAIL "$label:$failed"
	else
		result ok "$label: 4 processes, every byte right; storage read $backend bytes (unique $unique), $h2d to the GPU from the cache (all would be $((4 * unique)))"
	fi
}

# --- 2. the engine, cuFileRead and batch
for api in read batch; do
	run4 "engine, cuFile $api" "$engine" --api $api --block $((1 << 20)) "${files[@]}"
done

# --- 3. kvikio into CuPy arrays
kvikio_py=$(
	cat <<'EOF'
import sys, numpy, cupy, kvikio
for path in sys.argv[1:]:
    want = numpy.fromfile(path, dtype=numpy.uint8)
    a = cupy.empty(want.size, dtype=cupy.uint8)
    with kvikio.CuFile(path, "r") as f:
        n = f.read(a)
    if n != want.size:
        sys.exit(f"kvikio: {path}: read {n} of {want.size} bytes")
    got = cupy.asnumpy(a)
    if not numpy.array_equal(got, want):
        print(f"kvikio: mismatch: {path} offset {int(numpy.argmax(got != want))}", file=sys.stderr)
        sys.exit(1)
print("kvikio: ok")
EOF
)
if [ $fake -eq 1 ]; then
	result skip "kvikio + CuPy (--fake: CuPy needs a real GPU)"
else
	if ! python3 -c 'import cupy, kvikio' 2>/dev/null; then
		note "installing cupy-cuda13x kvikio-cu13 (python3 -m pip)"
		python3 -m pip install --quiet cupy-cuda13x kvikio-cu13 >/dev/null 2>&1 ||
			python3 -m pip install --quiet --break-system-packages cupy-cuda13x \
				kvikio-cu13 >/dev/null 2>&1
	fi
	if python3 -c 'import cupy, kvikio' 2>/dev/null; then
		# KVIKIO_COMPAT_MODE=OFF: kvikio calls cuFile rather than its own POSIX reads.
		KVIKIO_COMPAT_MODE=OFF run4 "kvikio + CuPy" python3 -c "$kvikio_py" "${files[@]}"
	else
		result FAIL "kvikio + CuPy: cannot import cupy and kvikio (pip cupy-cuda13x kvikio-cu13)"
	fi
fi

# --- 4. host-to-device bandwidth by kind of source
if timeout 120 "$bench" -l "$libcuda" -n $([ $fake -eq 1 ] && echo 3 || echo 20) \
	-s $([ $fake -eq 1 ] && echo 16 || echo 256) >"$work/bench" 2>"$work/bench.err"; then
	cat "$work/bench"
	line=$(awk '$1 == "registered" { r = $2 } $1 == "host_alloc" { h = $2 }
		$1 == "pageable" { p = $2 }
		END { if (r == "" || h == "" || h + 0 == 0) exit 1
		      printf "registered %s GB/s, cuMemHostAlloc %s GB/s, pageable %s GB/s; registered/cuMemHostAlloc %.0f%% (goal >= 90%%: %s)",
		             r, h, p, 100 * r / h, (r / h >= 0.9) ? "met" : "NOT met" }' "$work/bench")
	if [ -n "$line" ]; then
		result ok "h2d bandwidth: $line$([ $fake -eq 1 ] && echo ' (fake driver: figures mean nothing)')"
	else
		result FAIL "h2d bandwidth: unreadable output: $(head -c 200 "$work/bench" | tr "\n" " ")"
	fi
else
	result FAIL "h2d bandwidth: kvshim-bench-h2d failed: $(head -c 300 "$work/bench.err")"
fi

echo
echo "gpu-check summary ($([ $fake -eq 1 ] && echo "fakes" || echo "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"), ${SECONDS}s):"
printf '  %s\n' "${summary[@]}"
exit $bad
