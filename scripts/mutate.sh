#!/usr/bin/env bash
# Mutation testing: plant one-line bugs with PyPI's universalmutator (`mutate`), one at a time,
# in a scratch copy of the tree; build each and run the plain CTest suite under a time budget;
# print the kill ratio per file and every survivor (file:line and the mutated line).  Not in
# CI: run it before resolving an issue that changes a protocol, and add a test for each
# survivor that is a real bug (docs/testing.md says how to judge one that is not).
#
#   scripts/mutate.sh [--max N] [--seed S] [--budget SECS] [--tests REGEX] [--jobs J]
#                     [--out FILE] [--keep] [--asan] [FILE...]
#
#   FILE        sources to mutate, relative to the repository root (default: the cache
#               protocol and the shim's fd classification: cache/slot.c cache/evict.c
#               cache/wait.c cache/proc.c shim/fdinfo.c; cache/loader.c, shim/serve.c,
#               config/config.c and any other source when named)
#   --max N     test at most N mutants per file, drawn at random (default: all of them)
#   --seed S    seed of that draw (default 1): the same seed draws the same mutants
#   --budget S  seconds one mutant's whole CTest run may take (default 300); a run killed
#               by it counts as killed (a hang), and says so
#   --tests R   only the CTest tests matching R (ctest -R); default: the whole suite
#   --jobs J    build parallelism (default 2)
#   --out FILE  also write one line per mutant (tab-separated) to FILE
#   --keep      keep the scratch directory (/tmp/kvs-mutate.*)
#   --asan      build with AddressSanitizer and UBSan (CI's second pass): kills mutants whose
#               only effect is undefined behaviour (a stray write, an index out of bounds),
#               at about twice the time per run
#
# A mutant that does not compile with CI's flags (-Werror) is not counted (invalid): CI
# would reject it, as it rejects 'unsigned < 0' or a path that falls off a function's end.  A mutant whose object code equals
# the original's (stripped of debug information) is equivalent by construction (a comment, a
# redundant cast) and is not run; neither counts towards --max.  CTest stops at the first
# failing test, so killed mutants cost little; survivors cost a whole run (about a minute).
# Where unshare(1) may, each run gets a private /dev/shm, so a mutant's leftover regions
# vanish with it and never meet another engineer's tests.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
max=0 seed=1 budget=300 tests= jobs=2 out= keep=0 asan=()
files=()
while [ $# -gt 0 ]; do
	case $1 in
	--max) max=$2; shift 2 ;;
	--seed) seed=$2; shift 2 ;;
	--budget) budget=$2; shift 2 ;;
	--tests) tests=$2; shift 2 ;;
	--jobs) jobs=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--keep) keep=1; shift ;;
	--asan)
		asan=(-DKVS_ASAN=ON) # and the options scripts/test.sh gives that pass
		export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
		shift
		;;
	-h | --help) sed -n '2,33p' "$0"; exit 0 ;;
	-*) echo "mutate.sh: unknown option $1" >&2; exit 2 ;;
	*) files+=("$1"); shift ;;
	esac
done
[ ${#files[@]} -gt 0 ] || files=(cache/slot.c cache/evict.c cache/wait.c cache/proc.c shim/fdinfo.c)
for f in "${files[@]}"; do
	[ -f "$root/$f" ] || { echo "mutate.sh: no such source: $f" >&2; exit 2; }
done

if ! command -v mutate >/dev/null; then
	echo "== installing universalmutator (PyPI)"
	python3 -m pip install --quiet universalmutator || {
		echo "mutate.sh: cannot install universalmutator" >&2
		exit 1
	}
	export PATH=$HOME/.local/bin:$PATH
fi

scratch=$(mktemp -d /tmp/kvs-mutate.XXXXXX)
chmod 755 "$scratch" # check_region runs the built kvshim as a second local user
cleanup() { [ $keep = 1 ] && echo "scratch kept: $scratch" || rm -rf "$scratch"; }
trap cleanup EXIT
src=$scratch/src build=$scratch/build
mkdir -p "$src" "$scratch/mutants" "$scratch/orig"

# The tree as it is now (tracked and untracked files that git does not ignore).
(cd "$root" && git ls-files -z -co --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$src"

isolate=()
if [ "$(id -u)" = 0 ] && unshare -m --propagation private true 2>/dev/null; then
	isolate=(unshare -m --propagation private sh -c
		'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec "$@"' sh)
fi

# run_suite LOG: the suite (stopping at the first failure) under the budget, in its own
# process group so that a hung mutant's test processes go with it.  Prints pass, fail or
# timeout.
run_suite() {
	local log=$1 pid i rc
	(
		cd "$build"
		exec setsid "${isolate[@]}" ctest --stop-on-failure --timeout "$budget" \
			${tests:+-R "$tests"} >"$log" 2>&1
	) &
	pid=$!
	for ((i = 0; i < budget * 10; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
		echo timeout
		return
	fi
	rc=0
	wait "$pid" || rc=$?
	[ $rc = 0 ] && echo pass || echo fail
}

# The objects a source compiles into, stripped of debug information, concatenated.
objects_of() { # FILE DEST
	local f=$1 o
	: >"$2"
	while IFS= read -r o; do
		objcopy --strip-debug "$o" "$2.one" 2>/dev/null || cp "$o" "$2.one"
		cat "$2.one" >>"$2"
	done < <(find "$build" -path "*/$(dirname "$f")/CMakeFiles/*" -name "$(basename "$f").o" | sort)
	rm -f "$2.one"
}

echo "== baseline build and suite ($(date -u +%FT%TZ), scratch $scratch)"
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVS_WERROR=ON "${asan[@]}" \
	>"$scratch/cmake.log" 2>&1 ||
	{ cat "$scratch/cmake.log"; exit 1; }
cmake --build "$build" -j"$jobs" >"$scratch/build.log" 2>&1 || { tail -30 "$scratch/build.log"; exit 1; }
t0=$(date +%s)
r=$(run_suite "$scratch/baseline.log")
if [ "$r" != pass ]; then
	echo "mutate.sh: the suite does not pass without mutants ($r):" >&2
	tail -20 "$scratch/baseline.log" >&2
	exit 1
fi
echo "   suite passes in $(($(date +%s) - t0)) s"
[ -n "$out" ] && printf 'file\tline\tverdict\tmutated line\n' >"$out"

summary=()
survivors=()
for f in "${files[@]}"; do
	base=$(basename "$f" .c)
	mdir=$scratch/mutants/${f//\//_}
	mkdir -p "$mdir"
	cp "$src/$f" "$scratch/orig/$base.c"
	objects_of "$f" "$scratch/orig/$base.obj"
	(cd "$mdir" && mutate "$src/$f" --noCheck --mutantDir "$mdir" >"$mdir/mutate.log" 2>&1) || true
	mapfile -t all < <(find "$mdir" -name "$base.mutant.*.c" | sort -V |
		shuf --random-source=<(yes "kvshim-mutate-$seed"))
	echo "== $f: ${#all[@]} mutants generated; testing ${max/#0/all}"
	tested=0 killed=0 timeouts=0 invalid=0 equiv=0
	for m in "${all[@]}"; do
		[ "$max" -gt 0 ] && [ $tested -ge "$max" ] && break
		# One hunk: "NcN" (a line changed) or "NaM" (a line inserted after line N).
		d=$(diff "$scratch/orig/$base.c" "$m" || true)
		line=$(sed -n '1s/^\([0-9]*\).*/\1/p' <<<"$d")
		was=$(sed -n 's/^< [[:space:]]*//p' <<<"$d" | head -1)
		now=$(sed -n 's/^> [[:space:]]*//p' <<<"$d" | head -1)
		case $(head -1 <<<"$d") in
		*a*) text="(inserted after it) $now" ;;
		*) text="$was ==> $now" ;;
		esac
		text="$text [$(basename "$m")]"
		cp "$m" "$src/$f"
		if ! cmake --build "$build" -j"$jobs" >"$scratch/mbuild.log" 2>&1; then
			verdict=invalid
			invalid=$((invalid + 1))
		else
			objects_of "$f" "$scratch/mutant.obj"
			if cmp -s "$scratch/orig/$base.obj" "$scratch/mutant.obj"; then
				verdict=equivalent
				equiv=$((equiv + 1))
			else
				tested=$((tested + 1))
				case $(run_suite "$scratch/mrun.log") in
				pass)
					verdict=SURVIVED
					survivors+=("$f:$line: $text")
					;;
				timeout)
					verdict=killed-by-budget
					killed=$((killed + 1))
					timeouts=$((timeouts + 1))
					;;
				*)
					verdict="killed by $(awk '/Test +#[0-9]+:/ && !/Passed|Not Run|Skipped/ \
						{ print $4; exit }' "$scratch/mrun.log")"
					killed=$((killed + 1))
					;;
				esac
			fi
		fi
		printf '   %s:%s %s: %s\n' "$f" "$line" "$verdict" "$text"
		[ -n "$out" ] && printf '%s\t%s\t%s\t%s\n' "$f" "$line" "$verdict" "$text" >>"$out"
	done
	cp "$scratch/orig/$base.c" "$src/$f"
	pct=0
	[ $tested -gt 0 ] && pct=$((100 * killed / tested))
	summary+=("$(printf '%-16s killed %3d of %3d (%3d%%)  budget kills %d, equivalent %d, invalid %d, generated %d' \
		"$f" $killed $tested $pct $timeouts $equiv $invalid ${#all[@]})")
done
cmake --build "$build" -j"$jobs" >/dev/null 2>&1 || true

echo "== summary (seed $seed, max ${max/#0/all} per file, budget $budget s${tests:+, tests $tests})"
printf '%s\n' "${summary[@]}"
echo "== survivors"
[ ${#survivors[@]} -gt 0 ] && printf '%s\n' "${survivors[@]}" || echo "(none)"
