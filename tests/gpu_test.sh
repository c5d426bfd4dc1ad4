#!/usr/bin/env bash
# GPU end-to-end on the fakes: 8 engine processes at once read the same KV files into (fake)
# device memory through cuFile, under LD_PRELOAD=libkvshim.so, for each cuFile api (read,
# batch, async) and each way of reaching libcufile (dlopen + dlsym, or linked).  Every engine
# must exit 0 with every byte right; then `kvshim stat` must show storage read once
# (totals.backend_bytes == the unique bytes, and what /proc/PID/io says the engines read from
# storage within 5% of them) and each process served from the cache (totals.h2d_bytes == 8 x
# them), the fake libcufile must have read nothing itself, and the fake driver must have
# refused no copy over registered and unregistered memory.  Then what the real driver and
# libcufile do that the fakes now model: frames that straddle 64 MiB (3 MiB shards), a save
# in libcufile's compatibility mode (its own pwrite, nested in the shim's cuFileWrite),
# cuFileReadAsync behind a busy stream, host functions never held up by storage (on slowfs),
# POSIX O_DIRECT reads into pinned host memory.
#   gpu_test.sh LIBKVSHIM KVSHIM ENGINE_DL ENGINE_LN FAKEDIR [SLOWFS]
# FAKEDIR holds the fakes libcufile.so.0 (tests/fake_cufile.c) and libcuda.so.1
# (tests/fake_cuda.c); without them the test skips.  SLOWFS (tests/slowfs.c): without it, or
# without FUSE, the slowfs case alone is skipped.
# KVS_GPU_TEST_EXPECT_SERVED=0 checks instead that the engines work through the fake alone
# (every byte read by the fake libcufile), for use while the shim has no cuFile hooks.
set -uo pipefail
engine_dl=$3
engine_ln=$4
fakedir=$5
slowfs=${6:-}
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
				FAKECUDA_STATS=$stats timeout 120 "$engine" --api $api \
				--block $((1024 * 1024)) --report "$stats/report.$r" "${files[@]}" \
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
			if [ "$(grep -v '^kvshim: [0-9T:.Z-]* pid [0-9]* info: attached' "$work/err.$r" | grep -c .)" != 0 ]; then
				echo "note - $label: rank $r stderr: $(head -c 200 "$work/err.$r")"
			fi
		done

		backend=$(totals backend_bytes)
		h2d=$(totals h2d_bytes)
		nstats=$(ls "$stats" | grep -c '^fakecufile\.[0-9]*$')
		fake_bytes=$(fake_sum "$stats" fakecufile read_bytes)
		mixed=$(fake_sum "$stats" fakecuda mixed_copies)
		storage=$(fake_sum "$stats" report storage_bytes)
		ratio=$(awk -v s="$storage" -v u="$unique" 'BEGIN { printf "%.2f", s / u }')
		if [ "$nstats" -ne 8 ]; then
			fail "$label: $nstats of 8 fake libcufile stats files"
		elif [ "$expect_served" = 1 ]; then
			if [ "$backend" -eq "$unique" ] && [ "$h2d" -eq $((8 * unique)) ] &&
				[ "$fake_bytes" -eq 0 ] && [ "$mixed" -eq 0 ] &&
				awk -v r="$ratio" 'BEGIN { exit !(r >= 0.95 && r <= 1.05) }'; then
				ok "$label: served: storage read $backend bytes ($ratio x unique by /proc/PID/io), $h2d to device, 0 by the fake, no mixed copy"
			else
				fail "$label: backend_bytes $backend (want $unique), /proc/PID/io storage $storage = $ratio x unique (want 1.00 +- 5%), h2d_bytes $h2d (want $((8 * unique))), fake libcufile read $fake_bytes (want 0), mixed_copies $mixed (want 0)"
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

# Observe mode (issue 29): every cuFile read goes to the fake libcufile, as without the shim,
# keyed and counted in the region of keys: the cache would have read the unique bytes once,
# and the fake's own preads (its compatibility mode, FAKECUFILE_POSIX=1) are not counted
# again (the engines' buffered check reads are, as unserved_buffered); a batch goes whole to
# the real Submit, in as many calls as without the shim.
for api in read batch async; do
	label="observe, api $api, 8 processes"
	"$kvshim" reset --force >/dev/null 2>&1
	for mode in off observe; do
		stats=$work/stats.obs.$api.$mode
		mkdir -p "$stats"
		menv=KVSHIM_ENABLE=0 # the shim off: the fake's own figures, for comparison
		[ $mode = observe ] && menv=KVSHIM_SHIM_MODE=observe
		pids=()
		for r in 0 1 2 3 4 5 6 7; do
			env "$menv" FAKECUFILE_POSIX=1 LD_PRELOAD="$lib" LD_LIBRARY_PATH="$fakedir" \
				FAKECUFILE_STATS="$stats" FAKECUDA_STATS="$stats" timeout 120 \
				"$engine_dl" --api $api --block $((1024 * 1024)) "${files[@]}" \
				>"$work/out.$r" 2>"$work/err.$r" &
			pids+=($!)
		done
		bad=""
		for r in 0 1 2 3 4 5 6 7; do
			wait "${pids[$r]}" || bad="$bad rank $r: $(head -c 200 "$work/err.$r");"
		done
		[ -z "$bad" ] || fail "$label ($mode):$bad"
	done
	off=$work/stats.obs.$api.off obs=$work/stats.obs.$api.observe
	would=$(KVSHIM_SHIM_MODE=observe "$kvshim" stat --json | python3 -c 'import json,sys
t = json.load(sys.stdin)["totals"]
print(t["would_read_bytes"], t["read_bytes"] - t["unserved_buffered_bytes"], t["h2d_bytes"])')
	got="$(fake_sum "$obs" fakecufile read_bytes) $(fake_sum "$obs" fakecufile batch_submits) $would"
	want="$((8 * unique)) $(fake_sum "$off" fakecufile batch_submits) $unique $((8 * unique)) 0"
	[ "$got" = "$want" ] &&
		ok "$label: the fake read every byte, the cache would have read $unique once, batches whole" ||
		fail "$label: fake read, batch submits, would_read, read, h2d: $got, want $want"
done
"$kvshim" reset --force >/dev/null 2>&1

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

# --- Frames that straddle 64 MiB: with 3 MiB shards the 22nd frame lies over [63, 66) MiB.
# The driver refuses a copy over registered and unregistered memory (INVALID_VALUE), and
# promises nothing for one over two registrations: registrations are whole frames (66 MiB),
# so no copy from a frame is ever either.  The region gets every page first (kvshim prepare),
# a warm-up read starts its registration, and the cold reads come after it.
mkdir -p "$work/kv3"
for i in $(seq 0 7); do
	head -c $((9 * 1024 * 1024)) /dev/urandom >"$work/kv3/blk$i"
done
head -c $((3 * 1024 * 1024)) /dev/urandom >"$work/kv3/warm"
files3=("$work"/kv3/blk*)
unique3=$(cat "${files3[@]}" | wc -c)
for api in read async; do
	label="3 MiB shards over 64 MiB registrations, api $api, 8 processes"
	reset_region
	KVSHIM_FILES_ROOTS=$work/kv3 KVSHIM_CACHE_SHARD_SIZE=3M KVSHIM_CACHE_CAPACITY=192M \
		"$kvshim" prepare >/dev/null 2>&1
	st3=$work/st3.$api
	mkdir -p "$st3"
	pids=()
	for r in 0 1 2 3 4 5 6 7; do
		LD_PRELOAD=$lib LD_LIBRARY_PATH=$fakedir FAKECUDA_STATS=$st3 FAKECUFILE_STATS=$st3 \
			KVSHIM_FILES_ROOTS=$work/kv3 KVSHIM_CACHE_SHARD_SIZE=3M \
			KVSHIM_CACHE_CAPACITY=192M timeout 120 "$engine_dl" --api $api \
			--block $((3 * 1024 * 1024)) --warm "$work/kv3/warm" --pause-ms 500 \
			"${files3[@]}" >"$work/out.$r" 2>"$work/err.$r" &
		pids+=($!)
	done
	bad=""
	for r in 0 1 2 3 4 5 6 7; do
		wait "${pids[$r]}" || bad="$bad rank $r: $(head -c 200 "$work/err.$r");"
	done
	mixed=$(fake_sum "$st3" fakecuda mixed_copies)
	pinned=$(fake_sum "$st3" fakecuda h2d_bytes_registered)
	h2d=$(totals h2d_bytes)
	fb=$(totals fallbacks)
	warm=$((8 * 3 * 1024 * 1024))
	if [ -n "$bad" ]; then
		fail "$label:$bad (mixed_copies $mixed)"
	elif [ "$mixed" -eq 0 ] && [ "$fb" -eq 0 ] && [ "$h2d" -eq $((8 * unique3 + warm)) ] &&
		[ "$pinned" -gt 0 ]; then
		ok "$label: every byte right, no copy refused, no fallback, h2d_bytes $h2d, $pinned bytes copied from registered frames"
	else
		fail "$label: mixed_copies $mixed (want 0), fallbacks $fb (want 0), h2d_bytes $h2d (want $((8 * unique3 + warm))), from registered memory $pinned (want > 0)"
	fi
done

# --- A save in libcufile's compatibility mode: the library moves the bytes with its own
# pwrite (FAKECUFILE_POSIX=1), through a handle it registers itself, nested inside the shim's
# cuFileWrite; the nested writes are the save's own, already staged.  The save must be kept
# whole, and 8 readers then read storage 0 times.
reset_region
if LD_PRELOAD=$lib LD_LIBRARY_PATH=$fakedir FAKECUFILE_POSIX=1 timeout 120 "$engine_dl" \
	--api write --block $((1024 * 1024)) "${files[@]}" >"$work/out.w" 2>"$work/err.w"; then
	kept=$(totals write_through_bytes)
	pids=()
	for r in 0 1 2 3 4 5 6 7; do
		LD_PRELOAD=$lib LD_LIBRARY_PATH=$fakedir FAKECUFILE_POSIX=1 \
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
		fail "compatibility-mode save then 8 readers:$bad"
	elif [ "$kept" -eq "$unique" ] && [ "$backend" -eq 0 ]; then
		ok "compatibility-mode save (libcufile's own pwrite and handle, nested): kept $kept bytes; 8 readers read storage 0 times"
	else
		fail "compatibility-mode save then 8 readers: write_through_bytes $kept (want $unique), backend_bytes $backend (want 0)"
	fi
else
	fail "compatibility-mode save: $(head -c 300 "$work/err.w")"
fi

# --- cuFileReadAsync behind a busy stream: a pageable source "may synchronize with the
# stream" (FAKECUDA_PAGEABLE_SYNC=1 makes the fake do so), so with registration off the shim
# copies hits with a batch that reads them during the call: the call must not wait 400 ms
# for the stream's earlier work.
label="cuFileReadAsync behind a stream busy for 400 ms, registration off"
reset_region
LD_PRELOAD=$lib LD_LIBRARY_PATH=$fakedir KVSHIM_CUDA_REGISTER_HOST=false timeout 120 \
	"$engine_dl" --api async --block $((1024 * 1024)) "${files[@]}" >/dev/null 2>&1
LD_PRELOAD=$lib LD_LIBRARY_PATH=$fakedir KVSHIM_CUDA_REGISTER_HOST=false FAKECUDA_PAGEABLE_SYNC=1 \
	timeout 120 "$engine_dl" --api async --block $((1024 * 1024)) --busy-ms 400 \
	--report "$work/busy.rep" "${files[@]}" >"$work/out.busy" 2>"$work/err.busy"
rc=$?
us=$(awk '$1 == "async_call_us" { print $2 }' "$work/busy.rep" 2>/dev/null)
if [ $rc -ne 0 ] || [ -z "$us" ]; then
	fail "$label: exit $rc: $(head -c 300 "$work/err.busy")"
elif [ "$us" -lt 400000 ]; then
	ok "$label: the calls of 4 files took $((us / 1000)) ms in all (each file's stream busy 400 ms), every byte right"
else
	fail "$label: the cuFileReadAsync calls took $((us / 1000)) ms: they waited for the stream"
fi

# --- Host functions are never held up by storage: the driver may run every stream's host
# functions on one thread (the fake does), so a read whose shards are still loading must not
# wait for them in one.  Cold reads from slowfs (300 ms a request) with the region registered
# (the old pinned path waited there): the longest host function stays well under 300 ms.
# The engine waits 2 s after its first read for the registration (under ASan and CI's load,
# 500 ms once left it unregistered: registered_bytes 0, and no host function at all).
if [ -n "$slowfs" ] && [ -x "$slowfs" ] && [ -w /dev/fuse ] && command -v fusermount3 >/dev/null; then
	mkdir -p "$work/src" "$work/mnt"
	head -c $((2 * 1024 * 1024)) /dev/urandom >"$work/src/slow0"
	"$slowfs" --latency-us 300000 "$work/src" "$work/mnt" -f >/dev/null 2>&1 &
	sfpid=$!
	for _ in $(seq 50); do
		mountpoint -q "$work/mnt" && break
		sleep 0.1
	done
	if mountpoint -q "$work/mnt"; then
		label="host functions with slow storage (slowfs, 300 ms a read)"
		reset_region
		KVSHIM_FILES_ROOTS=$work/mnt:$work/kv3 "$kvshim" prepare >/dev/null 2>&1
		mkdir -p "$work/st.slow"
		LD_PRELOAD=$lib LD_LIBRARY_PATH=$fakedir FAKECUDA_STATS=$work/st.slow \
			KVSHIM_FILES_ROOTS=$work/mnt:$work/kv3 timeout 120 "$engine_dl" --api async \
			--block $((1024 * 1024)) --warm "$work/kv3/warm" --pause-ms 2000 \
			"$work/mnt/slow0" >"$work/out.slow" 2>"$work/err.slow"
		rc=$?
		maxus=$(fake_sum "$work/st.slow" fakecuda hostfn_max_us)
		reg=$(totals registered_bytes)
		if [ $rc -ne 0 ]; then
			fail "$label: exit $rc: $(head -c 300 "$work/err.slow")"
		elif [ "$maxus" -lt 150000 ] && [ "$reg" -gt 0 ]; then
			ok "$label: every byte right; the longest host function took $((maxus / 1000)) ms (registered_bytes $reg)"
		else
			fail "$label: the longest host function took $((maxus / 1000)) ms (want < 150: none waits for storage), registered_bytes $reg (want > 0)"
		fi
		fusermount3 -u "$work/mnt" 2>/dev/null
	else
		echo "SKIP (case) - host functions with slow storage: slowfs did not mount"
	fi
	kill "$sfpid" 2>/dev/null
	wait "$sfpid" 2>/dev/null
else
	echo "SKIP (case) - host functions with slow storage: slowfs or FUSE is unavailable here"
fi

# --- POSIX O_DIRECT reads under the shim into memory the driver pinned (cuMemHostAlloc, and
# malloc'd pages cuMemHostRegister'd), copied to the device and compared: 8 processes, served
# (copy_bytes 8 x unique), storage read once.
for kind in alloc register; do
	label="POSIX O_DIRECT preads into $kind pinned memory, 8 processes"
	reset_region
	stp=$work/stp.$kind
	mkdir -p "$stp"
	pids=()
	for r in 0 1 2 3 4 5 6 7; do
		LD_PRELOAD=$lib LD_LIBRARY_PATH=$fakedir timeout 120 "$engine_dl" --api pread \
			--host $kind --block $((1024 * 1024)) --report "$stp/report.$r" "${files[@]}" \
			>"$work/out.$r" 2>"$work/err.$r" &
		pids+=($!)
	done
	bad=""
	for r in 0 1 2 3 4 5 6 7; do
		wait "${pids[$r]}" || bad="$bad rank $r: $(head -c 200 "$work/err.$r");"
	done
	copy=$(totals copy_bytes)
	backend=$(totals backend_bytes)
	storage=$(fake_sum "$stp" report storage_bytes)
	if [ -n "$bad" ]; then
		fail "$label:$bad"
	elif [ "$copy" -eq $((8 * unique)) ] && [ "$backend" -eq "$unique" ] &&
		[ "$storage" -le $((unique + unique / 20)) ]; then
		ok "$label: every byte right on the device; copy_bytes $copy, storage read $backend bytes (/proc/PID/io: $storage)"
	else
		fail "$label: copy_bytes $copy (want $((8 * unique))), backend_bytes $backend (want $unique), /proc/PID/io $storage"
	fi
done

echo "gpu: $fails failed"
[ $fails -eq 0 ]
