#!/usr/bin/env bash
# GPU end-to-end on the fakes: 8 engine processes at once read the same KV files into (fake)
# device memory through cuFile, under LD_PRELOAD=libkvshim.so, for each cuFile api (read,
# batch, async) and each way of reaching libcufile (dlopen + dlsym, or linked).  Every engine
# must exit 0 with every byte right; then `kvshim stat` must show storage read once
# (totals.backend_bytes == the unique bytes) and each process served from the cache
# (totals.h2d_bytes == 8 x them), and the fake libcufile must have read nothing itself.
#   gpu_test.sh LIBKVSHIM KVSHIM ENGINE_DL ENGINE_LN FAKEDIR
# FAKEDIR holds the fakes libcufile.so.0 (tests/fake_cufile.c) and libcuda.so.1
# (tests/fake_cuda.c); without them the test skips.
# KVS_GPU_TEST_EXPECT_SERVED=0 checks instead that the engines work through the fake alone
# (every byte read by the fake libcufile), for use while the shim has no cuFile hooks.
set -uo pipefail
engine_dl=$3
engine_ln=$4
fakedir=$5
expect_served=${KVS_GPU_TEST_EXPECT_SERVED:-1}

for f in "$fakedir/libcufile.so.0" "$fakedir/libcuda.so.1"; do
	if [ ! -e "$f" ]; then
		echo "SKIP: the fakes were not built: $f is missing (targets fakecufile and fakecuda)"
		exit 77
	fi
done

PREFIX=gpu
source "$(dirname "$0")/preload_lib.sh" # lib (sanitizer runtime first), work, name, ok, fail

mkdir -p "$work/kv"
for i in 0 1 2 3; do
	head -c $((8 * 1024 * 1024)) /dev/urandom >"$work/kv/blk$i"
done
files=("$work"/kv/blk*)
unique=$(cat "${files[@]}" | wc -c)
if ! dd if="${files[0]}" of=/dev/null bs=4096 count=1 iflag=direct status=none 2>/dev/null; then
	echo "SKIP: O_DIRECT does not work in $work"
	exit 77
fi

# Only this configuration: no stray KVSHIM_* overrides from the caller's environment.
while read -r v; do unset "$v"; done < <(compgen -e | grep '^KVSHIM_')
cat >"$work/kvshim.ini" <<EOF
[files]
roots = $work/kv
# The files were written a moment ago and nothing writes them again: keep what is read at once
# (the default would hand out, not keep, shards of files younger than a few seconds).
settle = 0
[cache]
name = $name
shard_size = 1M
capacity = 64M
EOF
export KVSHIM_CONFIG=$work/kvshim.ini


# The engine's own check can fail: a corrupted byte (no shim) must make it exit 1.
LD_LIBRARY_PATH=$fakedir FAKECUFILE_FAIL=corrupt@3 "$engine_dl" --api read "${files[@]}" \
	>/dev/null 2>"$work/err"
rc=$?
if [ $rc -eq 1 ] && grep -q "^engine: mismatch: ${files[0]} offset 2097152$" "$work/err"; then
	ok "a corrupted block is caught by the engine (exit 1, $(cat "$work/err"))"
else
	fail "a corrupted block: exit $rc, stderr: $(head -c 300 "$work/err")"
fi

for api in read batch async; do
	for form in dl ln; do
		label="api $api, $form, 8 processes"
		engine=$engine_dl
		[ $form = ln ] && engine=$engine_ln
		"$kvshim" reset --force >/dev/null 2>&1
		stats=$work/stats.$api.$form
		mkdir -p "$stats"
		pids=()
		for r in 0 1 2 3 4 5 6 7; do
			LD_PRELOAD=$lib LD_LIBRARY_PATH=$fakedir FAKECUFILE_STATS=$stats \
				timeout 120 "$engine" --api $api --block $((1024 * 1024)) "${files[@]}" \
				>"$work/out.$r" 2>"$work/err.$r" &
			pids+=($!)
		done
		bad=""
		for r in 0 1 2 3 4 5 6 7; do
			wait "${pids[$r]}"
			rc=$?
			[ $rc -eq 0 ] || bad="$bad rank $r exit $rc: $(head -c 200 "$work/err.$r");"
		done
		want="engine: 4 files, $unique bytes, api $api, ok"
		for r in 0 1 2 3 4 5 6 7; do
			[ "$(cat "$work/out.$r")" = "$want" ] ||
				bad="$bad rank $r stdout: $(head -c 200 "$work/out.$r");"
		done
		if [ -n "$bad" ]; then
			fail "$label:$bad"
			continue
		fi
		ok "$label: every engine exit 0, all bytes right"
		for r in 0 1 2 3 4 5 6 7; do
			if grep -v '^kvshim: [0-9T:.Z-]* pid [0-9]* info: attached' "$work/err.$r" | grep -q .; then
				echo "note - $label: rank $r stderr: $(head -c 200 "$work/err.$r")"
			fi
		done

		backend=$(totals backend_bytes)
		h2d=$(totals h2d_bytes)
		nstats=$(ls "$stats" | grep -c '^fakecufile\.[0-9]*$')
		fake_bytes=$(fake_sum "$stats" fakecufile read_bytes)
		if [ "$nstats" -ne 8 ]; then
			fail "$label: $nstats of 8 fake libcufile stats files"
		elif [ "$expect_served" = 1 ]; then
			if [ "$backend" -eq "$unique" ] && [ "$h2d" -eq $((8 * unique)) ] &&
				[ "$fake_bytes" -eq 0 ]; then
				ok "$label: served: storage read $backend bytes, $h2d to device, 0 by the fake"
			else
				fail "$label: backend_bytes $backend (want $unique), h2d_bytes $h2d (want $((8 * unique))), fake libcufile read $fake_bytes (want 0)"
			fi
		else
			if [ "$fake_bytes" -eq $((8 * unique)) ]; then
				ok "$label: the fake read all $fake_bytes bytes (KVS_GPU_TEST_EXPECT_SERVED=0; shim: backend_bytes $backend, h2d_bytes $h2d)"
			else
				fail "$label: the fake read $fake_bytes bytes, want $((8 * unique)) (KVS_GPU_TEST_EXPECT_SERVED=0)"
			fi
		fi
	done
done

# cuFileReadAsync while the region is pageable (not registered yet, or never): the driver reads
# a pageable source when the copy is enqueued, not when the stream reaches it (the fake does
# as CUDA documents), so a copy enqueued behind a host function that waits for the load would
# take the slot's bytes from before the load.  32 files of about 4 MiB, 8 engines at once, a
# region too large to be registered in a moment; then the same with registration off.
mkdir -p "$work/kv32"
for i in $(seq 0 31); do
	# tails of 65 KiB and more: a read under files.min_read would go to the fake libcufile
	head -c $((4 * 1024 * 1024 + (i + 16) * 4096 + 1000)) /dev/urandom >"$work/kv32/blk$i"
done
files32=("$work"/kv32/blk*)
unique32=$(cat "${files32[@]}" | wc -c)
for reg in true false; do
	label="api async, 32 files, 8 processes, cuda.register_host = $reg"
	reset_region
	cstats=$work/cstats.$reg
	mkdir -p "$cstats"
	pids=()
	for r in 0 1 2 3 4 5 6 7; do
		LD_PRELOAD=$lib LD_LIBRARY_PATH=$fakedir KVSHIM_FILES_ROOTS=$work/kv32 \
			FAKECUDA_STATS=$cstats \
			KVSHIM_CACHE_CAPACITY=1G KVSHIM_CUDA_REGISTER_HOST=$reg \
			timeout 120 "$engine_dl" --api async --block $((1024 * 1024)) "${files32[@]}" \
			>"$work/out.$r" 2>"$work/err.$r" &
		pids+=($!)
	done
	bad=""
	for r in 0 1 2 3 4 5 6 7; do
		wait "${pids[$r]}"
		rc=$?
		[ $rc -eq 0 ] || bad="$bad rank $r exit $rc: $(head -c 200 "$work/err.$r");"
	done
	if [ -n "$bad" ]; then
		fail "$label:$bad"
		continue
	fi
	backend=$(totals backend_bytes)
	pinned=$(fake_sum "$cstats" fakecuda h2d_bytes_registered)
	pageable=$(fake_sum "$cstats" fakecuda h2d_bytes_pageable)
	if [ "$backend" -ne "$unique32" ]; then
		fail "$label: every byte right, but backend_bytes $backend (want $unique32)"
	elif [ $reg = false ] && [ "$pinned" -ne 0 ]; then
		fail "$label: $pinned bytes copied from pinned memory with registration off"
	else
		ok "$label: every byte right, storage read $backend bytes (the unique bytes); copied $pinned bytes from pinned slots, $pageable from pageable ones"
	fi
done

# cuFileWrite from device memory under the shim (an engine saving KV), then 8 engines read the
# files with cuFileRead: the save's bytes were kept (write-through), storage is read 0 times.
reset_region
if LD_PRELOAD=$lib LD_LIBRARY_PATH=$fakedir timeout 120 "$engine_dl" --api write \
	--block $((1024 * 1024)) "${files[@]}" >"$work/out.w" 2>"$work/err.w"; then
	kept=$(totals write_through_bytes)
	pids=()
	for r in 0 1 2 3 4 5 6 7; do
		LD_PRELOAD=$lib LD_LIBRARY_PATH=$fakedir \
			timeout 120 "$engine_dl" --api read --block $((1024 * 1024)) "${files[@]}" \
			>"$work/out.$r" 2>"$work/err.$r" &
		pids+=($!)
	done
	bad=""
	for r in 0 1 2 3 4 5 6 7; do
		wait "${pids[$r]}" || bad="$bad rank $r: $(head -c 200 "$work/err.$r");"
	done
	backend=$(totals backend_bytes)
	if [ -n "$bad" ]; then
		fail "cuFileWrite then 8 cuFileRead engines:$bad"
	elif [ "$kept" -eq "$unique" ] && [ "$backend" -eq 0 ]; then
		ok "cuFileWrite from device memory kept $kept bytes; 8 cuFileRead engines then read storage 0 times, every byte right"
	else
		fail "cuFileWrite then 8 cuFileRead engines: write_through_bytes $kept (want $unique), backend_bytes $backend (want 0)"
	fi
else
	fail "cuFileWrite save: $(head -c 300 "$work/err.w")"
fi

echo "gpu: $fails failed"
[ $fails -eq 0 ]
