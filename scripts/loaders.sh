#!/usr/bin/env bash
# kvshim under vLLM's O_DIRECT model loaders, from PyPI, on CPU: fastsafetensors (without GDS:
# threads of O_DIRECT pread into bounce buffers) and runai-model-streamer with each of its file
# system strategies (RUNAI_STREAMER_FS_STRATEGY: io_uring_direct, its default; libaio_direct,
# its pick where containers refuse io_uring; sync_buffered, with files.buffered = true).  A
# bf16 safetensors checkpoint in two shards is made once; then, for each loader, REPLICAS
# replicas load it at once without the shim and under it (`kvshim run --strict`, files.roots
# the model's directory, a region that holds it), each checking every tensor against the
# checkpoint's own hashes, PAIRS times in turn (which side goes first alternates).
#
# The region is made and given its memory once, by `kvshim prepare`, before the first replica
# starts, as operations.md has it run before the engines (untimed), and it stays for every
# run; each load under the shim starts from an empty cache (`kvshim evict` of the model's
# files), so it reads storage as a first load does.  A last line measures what the prepare
# took off: fastsafetensors' first load into a region that was never prepared, against no
# region at all.
#
# Storage is the kernel's count: the replicas' /proc/PID/io read_bytes, which this shell gets
# for every child it waited for (the model's pages are dropped from the page cache before each
# run, so a buffered load counts too; a first run also reads torch's libraries, which later
# runs find cached).  One table row per loader, as in issue 35: storage per model without and
# with the shim (the most of its runs), the shim's own count, whether every tensor was right,
# the slowest replica's time (median over the runs), and the median of the pairs' ratios
# (under / without; min-max).  Status 1 when a replica under the shim went wrong, hung (a
# bound of 300 s) or read storage more than 1.05x where the shim serves.
#   scripts/loaders.sh [BUILD_DIR]    (default build; scratch ${KVS_LOADERS_DIR:-/var/tmp/kvshim-loaders})
# Environment: KVS_LOADERS_MODEL_MIB (default 1260: 1.23 GiB), KVS_LOADERS_REPLICAS (4),
# KVS_LOADERS_PAIRS (3), KVS_LOADERS_CASES (a space-separated list of fastsafetensors,
# io_uring_direct, libaio_direct, sync_buffered; all four by default).
# The venv (torch and the two wheels: about 5.5 GiB with torch's CUDA wheels) stays in the
# scratch directory, so a second run installs nothing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
dir=${KVS_LOADERS_DIR:-/var/tmp/kvshim-loaders}
mib=${KVS_LOADERS_MODEL_MIB:-1260}
replicas=${KVS_LOADERS_REPLICAS:-4}
pairs=${KVS_LOADERS_PAIRS:-3}
cases=${KVS_LOADERS_CASES:-fastsafetensors io_uring_direct libaio_direct sync_buffered}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
say() { echo "loaders: $*" >&2; }

if [ ! -x "$build/tools/kvshim" ] || [ ! -e "$build/shim/libkvshim.so" ]; then
	bash "$root/scripts/deps.sh"
	cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build "$build" -j"$(nproc)" >/dev/null
fi
kvshim=$build/tools/kvshim

# A Python of at least 3.10 for the wheels (torch 2.x), in a venv of the scratch directory.
py=$dir/venv/bin/python
if [ ! -x "$py" ] || ! "$py" -c 'import torch, fastsafetensors, runai_model_streamer' 2>/dev/null; then
	base=""
	for c in python3.12 python3.11 python3.10 python3; do
		if command -v "$c" >/dev/null &&
			"$c" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
			base=$c
			break
		fi
	done
	[ -n "$base" ] || { say "no Python 3.10 or newer"; exit 1; }
	say "installing torch, fastsafetensors and runai-model-streamer into $dir/venv (about 5.5 GiB)"
	"$base" -m venv "$dir/venv"
	"$dir/venv/bin/pip" install -q runai-model-streamer fastsafetensors torch safetensors numpy
fi

# The checkpoint: two shards of bf16 tensors of 1 to 64 MiB, with a manifest of their hashes.
model=$dir/model
if [ ! -e "$model/manifest.json" ] || [ "$(cat "$model/mib" 2>/dev/null)" != "$mib" ]; then
	rm -rf "$model"
	mkdir -p "$model"
	say "making a $mib MiB checkpoint in $model"
	"$py" - "$model" "$mib" <<'EOF'
import hashlib, json, os, sys, torch
from safetensors.torch import save_file
out, mib = sys.argv[1], int(sys.argv[2])
g = torch.Generator().manual_seed(7)
shards, manifest, left, n = [{}, {}], {}, mib << 20, 0
while left > 0:
    size = min(left, (1 + n % 64) << 20)
    t = torch.randn(size // 2, generator=g).to(torch.bfloat16)
    name = f"layer{n}.weight"
    shards[n % 2][name] = t
    manifest[name] = hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()
    left -= size
    n += 1
for i, s in enumerate(shards):
    save_file(s, os.path.join(out, f"model-0000{i + 1}-of-00002.safetensors"))
json.dump(manifest, open(os.path.join(out, "manifest.json"), "w"))
open(os.path.join(out, "mib"), "w").write(str(mib))
EOF
	sync
fi
bytes=$(cat "$model"/*.safetensors | wc -c)

# One replica: load every tensor the loader's way, check each against the manifest.
cat >"$dir/replica.py" <<'EOF'
import glob, hashlib, json, os, sys, time, torch
kind, model = sys.argv[1], sys.argv[2]
files = sorted(glob.glob(os.path.join(model, "*.safetensors")))
want = json.load(open(os.path.join(model, "manifest.json")))
t0 = time.monotonic()
got = {}
def h(t):
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
if kind == "fastsafetensors":
    from fastsafetensors import SafeTensorsFileLoader
    loader = SafeTensorsFileLoader(None, "cpu", nogds=True)
    loader.add_filenames({0: files})
    fb = loader.copy_files_to_device()
    for k in want:
        got[k] = h(fb.get_tensor(k))
    fb.close()
    loader.close()
else:
    from runai_model_streamer import SafetensorsStreamer
    with SafetensorsStreamer() as s:
        for f in files:
            s.stream_file(f)
            for name, t in s.get_tensors():
                got[name] = h(t)
bad = sum(1 for k, v in want.items() if got.get(k) != v)
print(f"{time.monotonic() - t0:.2f} {len(want)} {bad}")
EOF

# PID's count (run's subshell, which waits for the replicas) includes every child it waited for.
io_read_bytes() { awk '/^read_bytes:/ { print $2 }' "/proc/$1/io"; }
# The model's pages out of the page cache (a buffered load then reads storage), and only
# theirs: torch's libraries, which every replica maps, stay cached and out of the count.
drop() {
	sync
	"$py" -c 'import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' \
		"$model"/*.safetensors
}

# run SHIM(0|1) KIND [ENV...]: REPLICAS replicas at once; prints "storage_ratio slowest_s bad hung"
run() {
	local shim=$1 kind=$2 pids=() k0 r slow=0 bad=0 hung=0 t me=$BASHPID
	shift 2
	drop
	k0=$(io_read_bytes "$me")
	for r in $(seq 1 "$replicas"); do
		if [ "$shim" = 1 ]; then
			env "$@" timeout 300 "$kvshim" run --strict -- "$py" "$dir/replica.py" "$kind" "$model" \
				>"$dir/out.$r" 2>"$dir/err.$r" &
		else
			env "$@" timeout 300 "$py" "$dir/replica.py" "$kind" "$model" >"$dir/out.$r" 2>"$dir/err.$r" &
		fi
		pids+=($!)
	done
	for r in $(seq 1 "$replicas"); do
		if ! wait "${pids[$((r - 1))]}"; then
			hung=$((hung + 1))
			continue
		fi
		read -r t _ b <"$dir/out.$r" || b=1
		bad=$((bad + b))
		slow=$(python3 -c "print(max($slow, $t))")
	done
	python3 -c "print(f'{($(io_read_bytes "$me") - $k0) / $bytes:.2f}', '$slow', $bad, $hung)"
}

# The region's totals the table reads: "backend_bytes unserved_unseen", or "0 0" without one.
totals() {
	"$kvshim" stat --json 2>/dev/null | python3 -c 'import json, sys
t = json.load(sys.stdin)["totals"]
print(t["backend_bytes"], t["unserved_unseen"])' 2>/dev/null || echo "0 0"
}

export KVSHIM_CONFIG=
export KVSHIM_FILES_ROOTS=$model
export KVSHIM_CACHE_NAME=loaders
export KVSHIM_CACHE_CAPACITY=$(((mib / 1024 + 1) * 2))G
export KVSHIM_FILES_SETTLE=0
export KVSHIM_SHIM_LOG=warn
"$kvshim" reset --force >/dev/null 2>&1 || true
say "$("$kvshim" prepare 2>&1 | tail -1)"
status=0
printf '%-32s | %-24s | %-56s | %s\n' "loader ($replicas replicas, $((bytes >> 20)) MiB)" \
	"without kvshim" "under kvshim" "slowest, under / without ($pairs pairs)"
for case in $cases; do
	kind=runai
	env=(RUNAI_STREAMER_LOG_LEVEL=ERROR)
	if [ "$case" = fastsafetensors ]; then
		kind=fastsafetensors
	else
		env+=(RUNAI_STREAMER_FS_STRATEGY=$case)
	fi
	shim_env=("${env[@]}")
	[ "$case" = sync_buffered ] && shim_env+=(KVSHIM_FILES_BUFFERED=true)
	s0=() t0=() s1=() t1=() bad=0 hung=0 back=0 unseen=0
	for p in $(seq 1 "$pairs"); do
		for side in $(if [ $((p % 2)) = 1 ]; then echo 0 1; else echo 1 0; fi); do
			if [ "$side" = 0 ]; then
				read -r s t _ _ <<<"$(run 0 "$kind" "${env[@]}")"
				s0+=("$s") t0+=("$t")
				continue
			fi
			"$kvshim" evict "$model"/*.safetensors >/dev/null 2>&1 || true
			read -r b0 u0 <<<"$(totals)"
			read -r s t b h <<<"$(run 1 "$kind" "${shim_env[@]}")"
			read -r b1 u1 <<<"$(totals)"
			s1+=("$s") t1+=("$t")
			bad=$((bad + b)) hung=$((hung + h))
			back=$(python3 -c "print(max($back, ($b1 - $b0) / $bytes))")
			unseen=$((unseen + u1 - u0))
		done
	done
	read -r w1 m0 m1 pr <<<"$(python3 - "${s0[*]}" "${t0[*]}" "${s1[*]}" "${t1[*]}" <<'EOF'
import statistics as st, sys
s0, t0, s1, t1 = ([float(x) for x in a.split()] for a in sys.argv[1:])
r = [b / a for a, b in zip(t0, t1) if a > 0] or [0.0]  # a run with no replica done times 0
print(f"{max(s1):.2f}x", f"{st.median(t0):.2f}", f"{st.median(t1):.2f}",
      f"{st.median(r):.2f}_({min(r):.2f}-{max(r):.2f})")
EOF
)"
	verdict="every tensor right"
	[ "$bad" != 0 ] && verdict="$bad tensors WRONG"
	[ "$hung" != 0 ] && verdict="$hung replicas HUNG or failed"
	printf '%-32s | %-24s | %-56s | %s\n' "$case" "${s0[-1]}x, slowest ${m0}s" \
		"$w1 (backend $(printf '%.2f' "$back")x, unseen $unseen), $verdict, slowest ${m1}s" "${pr//_/ }"
	if [ "$bad" != 0 ] || [ "$hung" != 0 ]; then
		status=1
	elif [ "$case" != io_uring_direct ] && [ "$case" != sync_buffered ] &&
		python3 -c "import sys; sys.exit(0 if ${w1%x} > 1.05 else 1)"; then
		status=1
	fi
done

# What `kvshim prepare` took off: the first load into a region nobody prepared (the load
# allocates and clears its pages), against the same load on a node without a region.
case " $cases " in
*" fastsafetensors "*)
	"$kvshim" reset --force >/dev/null 2>&1 || true
	read -r _ a _ _ <<<"$(run 0 fastsafetensors)"
	read -r s b x h <<<"$(run 1 fastsafetensors)"
	echo "fastsafetensors, first load into a region never prepared: slowest ${b}s against ${a}s" \
		"without a region ($(python3 -c "print(f'{$b / $a:.2f}' if $a else '-')")), storage ${s}x"
	if [ "$x" != 0 ] || [ "$h" != 0 ]; then
		status=1
	fi
	;;
esac
"$kvshim" reset --force >/dev/null 2>&1 || true
exit $status
