#!/usr/bin/env bash
# Third-party clients under LD_PRELOAD=libkvshim.so.  cuFile clients on the fakes: kvikio (its C++
# core dlopen()s libcufile.so.0 and libcuda.so.1 and dlsym()s every name; run with
# KVIKIO_COMPAT_MODE=OFF so that it calls cuFileRead and never falls back to POSIX) and
# cufile-python (ctypes.CDLL("libcufile.so") and attribute lookup, i.e. dlsym on the handle).
# clients_reader.py reads each KV file into fake device memory with the client, copies it
# back and compares every byte.  For each client:
#   - without the shim, one reader must get every byte from the fake libcufile (the client
#     really reaches cuFileRead), and a block the fake corrupts must make it exit 1;
#   - under the shim, 4 readers at once must exit 0 with every byte right, `kvshim stat` must
#     show storage read once (totals.backend_bytes == the unique bytes) and each process
#     served from the cache (totals.h2d_bytes == 4 x them), and the fake libcufile must have
#     read nothing itself.
#   clients_test.sh LIBKVSHIM KVSHIM READER FAKEDIR
# Installs nothing: a client whose package is missing is skipped with the command that
# installs it (scripts/deps.sh runs them); with neither, the test skips (77).
set -uo pipefail
reader=$3
fakedir=$4
nproc=4

for f in "$fakedir/libcufile.so.0" "$fakedir/libcuda.so.1"; do
	if [ ! -e "$f" ]; then
		echo "SKIP: the fakes were not built: $f is missing (targets fakecufile and fakecuda)"
		exit 77
	fi
done
if ! command -v python3 >/dev/null; then
	echo "SKIP: python3 is missing"
	exit 77
fi

# A client counts as installed when it imports (cufile-python dlopens libcufile.so on import:
# the fake's folder must be on the path).
clients=()
for c in kvikio:kvikio-cu13 cufile:cufile-python; do
	if why=$(LD_LIBRARY_PATH=$fakedir python3 -c "import ${c%%:*}" 2>&1); then
		clients+=("${c%%:*}")
	else
		echo "skip - ${c#*:} does not import ($(echo "$why" | tail -n 1))," \
			"install it with: python3 -m pip install ${c#*:} (scripts/deps.sh)"
	fi
done
# NIXL (nixl-cu13, with --no-deps): its POSIX plugin reads files into host memory, no GPU.
nixl=""
if why=$(python3 -c "import nixl_cu13" 2>&1); then
	nixl=yes
else
	echo "skip - nixl-cu13 does not import ($(echo "$why" | tail -n 1))," \
		"install it with: python3 -m pip install --no-deps nixl-cu13 (scripts/deps.sh)"
fi
if ((${#clients[@]} == 0)) && [ -z "$nixl" ]; then
	echo "SKIP: none of kvikio, cufile-python and nixl-cu13 is installed"
	exit 77
fi

PREFIX=clients
source "$(dirname "$0")/preload_lib.sh" # lib (sanitizer runtime first), work, name, ok, fail

# Four files: three of 8 MiB and one that ends mid-page, so that the last block is short.
mkdir -p "$work/kv" "$work/ref"
for i in 0 1 2; do
	head -c $((8 * 1024 * 1024)) /dev/urandom >"$work/kv/blk$i"
done
head -c $((5 * 1024 * 1024 + 12345)) /dev/urandom >"$work/kv/blk3"
cp "$work"/kv/blk* "$work/ref/" # the readers compare with these, outside the shim's roots
files=("$work"/kv/blk*)
unique=$(cat "${files[@]}" | wc -c)
if ! dd if="${files[0]}" of=/dev/null bs=4096 count=1 iflag=direct status=none 2>/dev/null; then
	echo "SKIP: O_DIRECT does not work in $work (kvikio opens its files O_DIRECT)"
	exit 77
fi

# Only this configuration: no stray KVSHIM_* overrides from the caller's environment.
while read -r v; do unset "$v"; done < <(compgen -e | grep '^KVSHIM_')
cat >"$work/kvshim.ini" <<EOF
[files]
roots = $work/kv
# The files were written a moment ago and nothing writes them again: keep what is read at once.
settle = 0
# blk3's last block is a 12345-byte cuFileRead; under the default (64K) it would pass through
# to the fake libcufile by design, and storage would be read once per process for it.
min_read = 0
[cache]
name = $name
shard_size = 1M
capacity = 64M
EOF
export KVSHIM_CONFIG=$work/kvshim.ini
# kvikio: cuFile only (no POSIX fallback), 4 threads, each a 1 MiB cuFileRead into its part
# of the device buffer.
export KVIKIO_COMPAT_MODE=OFF KVIKIO_NTHREADS=4

run_reader() { # client [env...]: one reader on all the files, no shim
	local client=$1
	shift
	env LD_LIBRARY_PATH="$fakedir" "$@" timeout 120 python3 "$reader" --client "$client" \
		--fake "$fakedir" --ref "$work/ref" --block $((1024 * 1024)) "${files[@]}"
}

for client in "${clients[@]}"; do
	want="clients: $client: ${#files[@]} files, $unique bytes, ok"

	# The client reaches cuFileRead: without the shim the fake reads every byte.
	stats=$work/stats.$client.alone
	mkdir -p "$stats"
	run_reader "$client" FAKECUFILE_STATS="$stats" >"$work/out" 2>"$work/err"
	rc=$?
	fake_bytes=$(fake_sum "$stats" fakecufile read_bytes)
	if [ $rc -eq 0 ] && [ "$(cat "$work/out")" = "$want" ] && [ "$fake_bytes" -eq "$unique" ]; then
		ok "$client, no shim: all bytes right, all $fake_bytes read by the fake libcufile"
	else
		fail "$client, no shim: exit $rc, stdout $(head -c 200 "$work/out")," \
			"fake read $fake_bytes (want $unique), stderr: $(tail -c 400 "$work/err")"
	fi

	# The reader's check can fail: a corrupted block (no shim) must make it exit 1.
	# One kvikio thread, so that the third cuFileRead is the third block of the first file.
	run_reader "$client" FAKECUFILE_FAIL=corrupt@3 KVIKIO_NTHREADS=1 >/dev/null 2>"$work/err"
	rc=$?
	if [ $rc -eq 1 ] &&
		grep -q "^clients_reader: mismatch: ${files[0]} offset 2097152$" "$work/err"; then
		ok "$client: a corrupted block is caught by the reader (exit 1, $(cat "$work/err"))"
	else
		fail "$client: a corrupted block: exit $rc, stderr: $(tail -c 400 "$work/err")"
	fi

	label="$client, shim, $nproc processes"
	"$kvshim" reset --force >/dev/null 2>&1
	stats=$work/stats.$client.shim
	mkdir -p "$stats"
	pids=()
	for ((r = 0; r < nproc; r++)); do
		LD_PRELOAD=$lib LD_LIBRARY_PATH=$fakedir FAKECUFILE_STATS=$stats \
			timeout 120 python3 "$reader" --client "$client" --fake "$fakedir" \
			--ref "$work/ref" --block $((1024 * 1024)) "${files[@]}" \
			>"$work/out.$r" 2>"$work/err.$r" &
		pids+=($!)
	done
	bad=""
	for ((r = 0; r < nproc; r++)); do
		wait "${pids[$r]}"
		rc=$?
		[ $rc -eq 0 ] || bad="$bad rank $r exit $rc: $(tail -c 300 "$work/err.$r");"
		[ "$(cat "$work/out.$r")" = "$want" ] ||
			bad="$bad rank $r stdout: $(head -c 200 "$work/out.$r");"
	done
	if [ -n "$bad" ]; then
		fail "$label:$bad"
		continue
	fi
	ok "$label: every reader exit 0, all bytes right"
	for ((r = 0; r < nproc; r++)); do
		if [ "$(grep -v '^kvshim: [0-9T:.Z-]* pid [0-9]* info: attached' "$work/err.$r" | grep -c .)" != 0 ]; then
			echo "note - $label: rank $r stderr: $(head -c 200 "$work/err.$r")"
		fi
	done

	# SHIM ISSUE (open, intermittent, kvikio only): in about 1 run in 3, 2 of the 120 1-MiB
	# cuFileReads are not served and reach the fake libcufile (fake read 2097152, h2d_bytes
	# 2 MiB short, cufile_requests 118); bytes stay right.  kvikio issues them from 4 threads
	# per process on one handle; cufile-python (one thread) has never shown it.
	backend=$(totals backend_bytes)
	h2d=$(totals h2d_bytes)
	requests=$(totals cufile_requests)
	nstats=$(ls "$stats" | grep -c '^fakecufile\.[0-9]*$')
	fake_bytes=$(fake_sum "$stats" fakecufile read_bytes)
	if [ "$nstats" -ne "$nproc" ]; then
		fail "$label: $nstats of $nproc fake libcufile stats files"
	elif [ "$backend" -eq "$unique" ] && [ "$h2d" -eq $((nproc * unique)) ] &&
		[ "$fake_bytes" -eq 0 ]; then
		ok "$label: served: storage read $backend bytes, $h2d to device," \
			"$requests cuFile requests, 0 by the fake"
	else
		fail "$label: backend_bytes $backend (want $unique)," \
			"h2d_bytes $h2d (want $((nproc * unique))), cufile_requests $requests," \
			"fake libcufile read $fake_bytes (want 0)"
	fi
done

# NIXL's POSIX plugin (tests/nixl_reader.py: O_DIRECT, 1 MiB blocks, 64 transfers in flight
# per reader), through each of its I/O methods: libaio (NIXL's default), POSIX aio and
# io_uring (its bundled liburing, called through the PLT: served at submission).  Without
# the shim one reader gets every byte; under it 8 at once do, storage by the kernel's count is
# at most 1.05x the unique bytes and is what the cache read plus what it left to the kernel
# (the bytes it did not copy), and a warm round reads nothing from storage through the cache.
nixl_reader="$(dirname "$0")/nixl_reader.py"
for api in ${nixl:+aio posixaio uring}; do
	want="nixl: ${#files[@]} files, $unique bytes, api $api, ok"
	out=$(timeout 120 python3 "$nixl_reader" --api $api --direct --block $((1024 * 1024)) \
		--depth 64 "${files[@]}" 2>"$work/err")
	rc=$?
	if [ $rc -eq 77 ]; then
		echo "skip - nixl $api: $out"
		continue
	fi
	if [ $rc -ne 0 ] || [ "$out" != "$want" ]; then
		fail "nixl $api, no shim: exit $rc, $out $(tail -c 300 "$work/err")"
		continue
	fi
	"$kvshim" reset --force >/dev/null 2>&1
	for round in cold warm; do
	label="nixl $api, shim, 8 processes, $round"
	b0=$(totals backend_bytes)
	c0=$(totals copy_bytes)
	a0=$(totals atime_updates)
	pids=()
	for r in 0 1 2 3 4 5 6 7; do
		LD_PRELOAD=$lib timeout 120 python3 "$nixl_reader" --api $api --direct \
			--block $((1024 * 1024)) --depth 64 "${files[@]}" >"$work/out.$r" 2>"$work/err.$r" &
		pids+=($!)
	done
	bad=""
	for r in 0 1 2 3 4 5 6 7; do
		wait "${pids[$r]}"
		rc=$?
		[ $rc -eq 0 ] && [ "$(cat "$work/out.$r")" = "$want" ] ||
			bad="$bad rank $r exit $rc: $(head -c 100 "$work/out.$r") $(tail -c 200 "$work/err.$r");"
	done
	if [ -n "$bad" ]; then
		fail "$label:$bad"
		continue
	fi
	# The ranks' transfers only (nixl_reader.py's /proc/self/io around them: its imports
	# and its buffered checks read storage too).
	storage=$(cat "$work"/err.[0-7] | sed -n 's/^nixl_reader: storage \([0-9]*\)$/\1/p' |
		awk '{ s += $1 } END { print s + 0 }')
	backend=$(($(totals backend_bytes) - b0))
	copied=$(($(totals copy_bytes) - c0))
	passed=$((8 * unique - copied))
	ratio=$(python3 -c "print(f'{$storage / $unique:.3f}')")
	# The kernel's count: what the cache read, and what it left to the kernel (not copied).
	if ! storage_agrees "$storage" "$backend" $(($(totals atime_updates) - a0)) \
		${#files[@]} $((passed > 0 ? passed : 0)); then
		fail "$label: with $passed bytes not served, $storage_why"
	elif [ $round = cold ] && [ $((storage * 100)) -le $((unique * 105)) ]; then
		ok "$label: every byte right, storage ${ratio}x the unique bytes by the kernel's count ($backend read by the cache, $copied bytes served)"
	elif [ $round = warm ] && [ "$backend" = 0 ] && [ $((passed * 100)) -le $unique ]; then
		ok "$label: every byte right, storage read by the cache 0, $copied bytes served"
	else
		fail "$label: storage ${ratio}x the unique bytes ($backend read by the cache, $copied of $((8 * unique)) served)"
	fi
	done
done

echo "clients: $fails failed"
[ $fails -eq 0 ]
