#!/usr/bin/env bash
# The tests: on a fresh machine, install what is needed, configure and build from scratch with
# warnings as errors, then run every test with CTest (Check suites, multi-process tests, the
# end-to-end runs under LD_PRELOAD, the FUSE file system; a test whose requirement is missing
# reports itself skipped).  Then the same again built with AddressSanitizer and UBSan
# (KVS_TEST_SANITIZERS=0 skips that pass).
#   scripts/test.sh [BUILD_DIR]        (default build-test; the sanitizer pass adds -asan)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-test}

bash "$root/scripts/deps.sh"
# The docs name what is there (needs no build): every reference to a design.md section in the
# code names a heading that exists, and the module table names every file of the product.
bash "$root/scripts/check_refs.sh"

# Regions that test processes left in /dev/shm when a case failed or was killed (named
# <suite>.<pid>.<time>.<n>): remove those whose process is gone.
for f in /dev/shm/kvshim."$(id -u)".{check,check_region,loader}.*; do
	[ -e "$f" ] || continue
	pid=${f#*.*.*.}
	pid=${pid%%.*}
	kill -0 "$pid" 2>/dev/null || rm -f "$f"
done

run() { # BUILD_DIR CMAKE_ARGS...
	local dir=$1
	shift
	rm -rf "$dir"
	cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVS_WERROR=ON "$@"
	cmake --build "$dir" -j"$(nproc)"
	bash "$root/scripts/check_layers.sh" "$dir" # the libraries never call up into the shim
	# Two tests at a time (KVS_TEST_JOBS): most of them wait on processes they fork, sleeps and
	# storage, and CI must stay under 20 minutes on a 2-core machine.
	local rc=0 since=$dir/.tests-started
	touch "$since"
	(cd "$dir" && ctest --output-on-failure --timeout 900 -j"${KVS_TEST_JOBS:-2}") || rc=$?
	sweep "$since"
	return $rc
}

# What the tests made and a failed or killed case left (a test's own traps do not run when
# CTest kills it at its time limit): regions and work folders made since the run began
# (newer than SINCE), the loop mounts under those folders first.  The regions are the tests'
# by their names (<suite>.<pid>..., <test>-<pid>, and their .said records).
sweep() { # SINCE
	local since=$1 d m
	for d in /var/tmp/kvshim-*.*; do
		[ -d "$d" ] && [ "$d" -nt "$since" ] || continue
		for m in $(awk -v p="$d/" 'index($2, p) == 1 { print $2 }' /proc/mounts); do
			umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
		done
		rm -rf "$d"
	done
	for d in /dev/shm/kvshim."$(id -u)".{check,check_region,loader}.* \
		/dev/shm/kvshim."$(id -u)".*-[0-9]* /dev/shm/.kvshim."$(id -u)".*-[0-9]*.said; do
		[ -e "$d" ] && [ "$d" -nt "$since" ] && rm -f "$d"
	done
	return 0
}

run "$build"
if [ "${KVS_TEST_SANITIZERS:-1}" != 0 ]; then
	echo "== the same tests, built with AddressSanitizer and UBSan"
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		run "$build-asan" -DKVS_ASAN=ON
fi
