#!/usr/bin/env bash
# Figures for the loader and the shim (docs/benchmarks.md explains each).  Prints figures and
# the ratios measured in this run; checks no thresholds (shared machines are noisy).
#   scripts/bench.sh [--quick]
#   scripts/bench.sh --ranks [--ranks-mib MIB] [--plot FILE.png]
#       only the ranks sweep: 1, 2, 4, 8 ranks load MIB MiB (default 256) without kvshim,
#       with kvshim cold and warm, each as a fraction of the limit measured in the same run;
#       --plot draws load time against ranks (needs python3-matplotlib)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
quick= ranks=0 plot= ranks_mib=256
while (($#)); do
	case $1 in
	--quick) quick=--quick ;;
	--ranks) ranks=1 ;;
	--ranks-mib) ranks=1 ranks_mib=$2 && shift ;;
	--plot) ranks=1 plot=$(realpath -m "$2") && shift ;;
	*) sed -n '2,8p' "$0" >&2 && exit 2 ;;
	esac
	shift
done
bash "$root/scripts/deps.sh"
# Debian's python3-matplotlib is for Debian's python3, which a python3 earlier in PATH (pyenv,
# a venv) may hide: take the first of the two that has it.
# It is installed here, not by deps.sh: no test needs it, and CI need not fetch it.
plot_py=
if [ -n "$plot" ]; then
	if ! dpkg-query -W -f='${Status}' python3-matplotlib 2>/dev/null | grep -q "install ok installed"; then
		echo "bench: installing python3-matplotlib (for --plot)" >&2
		sudo=""
		[ "$(id -u)" -eq 0 ] || sudo="sudo"
		DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
			python3-matplotlib >/dev/null 2>&1 || true
	fi
	for py in python3 /usr/bin/python3; do
		"$py" -c 'import matplotlib' 2>/dev/null && plot_py=$py && break
	done
	if [ -z "$plot_py" ]; then
		echo "bench: --plot needs matplotlib, which neither python3 nor /usr/bin/python3" \
			"has: apt-get install python3-matplotlib" >&2
		exit 1
	fi
fi
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j"$(nproc)" >/dev/null
bin=$root/build/tools
lib=$root/build/shim/libkvshim.so
bench=$bin/kvshim-bench-read
work=$(mktemp -d /var/tmp/kvshim-bench.XXXXXX)
mnt=$work/mnt
regions=() # the ranks sweep's, one per configuration and round
cleanup() {
	mountpoint -q "$mnt" 2>/dev/null && fusermount3 -u "$mnt" 2>/dev/null
	for n in storage rot-true-1 rot-false-1 rot-true-32 rot-false-32 hits; do
		KVSHIM_CACHE_NAME=bench-$n-$$ "$bin/kvshim" reset --force >/dev/null 2>&1 || true
	done
	for n in "${regions[@]}"; do
		KVSHIM_CACHE_NAME=$n "$bin/kvshim" reset --force >/dev/null 2>&1 || true
	done
	rm -rf "$work"
}
trap cleanup EXIT
export KVSHIM_CONFIG=
# The benchmark writes its files moments before it reads them, and nothing writes them after:
# the shim may keep what it reads at once (files.settle would otherwise hand out, not keep, the
# shards of files younger than a few seconds).
export KVSHIM_FILES_SETTLE=0
mib=1024
[ "$quick" = --quick ] && mib=256

stat_of() { # NAME COUNTER
	KVSHIM_CACHE_NAME=bench-$1-$$ "$bin/kvshim" stat --json |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["totals"][sys.argv[1]])' "$2"
}
seconds() { awk '{for (i = 1; i < NF; i++) if ($i == "time") print $(i + 1)}'; }
gbs() { awk '{print $2}'; }
min() { printf '%s\n' "$@" | sort -g | head -1; }

# The ranks sweep.  For each destination shape (one buffer reused: ranks N --direct; a fresh
# destination per block: --distinct) and N ranks, the kvshim load's limit is the slower of two
# terms measured here, without the shim: the storage reading the unique bytes once between N
# processes (--split), and N processes copying the unique bytes each out of shared memory into
# that shape of destination (copy).  They overlap, so the cold limit is their maximum; a warm
# load reads no storage, so its limit is the copy alone.  Every figure is the best of $reps
# rounds (the storage term: of both shapes' rounds, 2 x $reps).  A cold kvshim round uses a new
# region whose memory `kvshim prepare` has given it first (untimed: the limit has no term for
# it, as the ranks' own destinations have none), the warm one the same region again; a third
# round, "cold, unprepared", uses a new region that allocates its pages as the loads claim them
# (cache.populate = ahead, the default).
ranks_sweep() {
	local reps=3 dir=$work/ranks tsv=$work/ranks.tsv
	mkdir -p "$dir"
	for i in $(seq 1 $((ranks_mib / 16))); do head -c 16M /dev/urandom >"$dir/f$i"; done
	sync
	local files=("$dir"/f*)
	echo "== ranks sweep: $ranks_mib MiB unique in 16 MiB files, O_DIRECT, best of $reps" \
		"(limit: max(storage, copy) cold, copy warm; fraction = limit / time)"
	printf 'shape\tranks\tstorage\tcopy\tplain\tcold\twarm\traw\n' >"$tsv"
	for shape in reused distinct; do
		local flag=
		[ $shape = distinct ] && flag=--distinct
		for n in 1 2 4 8; do
			local s=() c=() p=() k=() w=() u=() name
			for rep in $(seq 1 $reps); do
				s+=("$("$bench" ranks "$n" --direct --split "${files[@]}" | seconds)")
				c+=("$("$bench" copy "$n" $flag "$ranks_mib" | seconds)")
				p+=("$("$bench" ranks "$n" --direct $flag "${files[@]}" | seconds)")
				name=bench-ranks-$shape-$n-$rep-$$
				regions+=("$name")
				export KVSHIM_FILES_ROOTS=$dir KVSHIM_CACHE_NAME=$name \
					KVSHIM_CACHE_CAPACITY=$((ranks_mib + 64))M
				u+=("$(LD_PRELOAD=$lib "$bench" ranks "$n" --direct $flag "${files[@]}" |
					seconds)")
				"$bin/kvshim" reset --force >/dev/null
				"$bin/kvshim" prepare >/dev/null
				k+=("$(LD_PRELOAD=$lib "$bench" ranks "$n" --direct $flag "${files[@]}" |
					seconds)")
				w+=("$(LD_PRELOAD=$lib "$bench" ranks "$n" --direct $flag "${files[@]}" |
					seconds)")
				"$bin/kvshim" reset --force >/dev/null
				unset KVSHIM_FILES_ROOTS KVSHIM_CACHE_NAME KVSHIM_CACHE_CAPACITY
			done

			printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' $shape "$n" "$(min "${s[@]}")" \
				"$(min "${c[@]}")" "$(min "${p[@]}")" "$(min "${k[@]}")" \
				"$(min "${w[@]}")" "$(min "${u[@]}")" >>"$tsv"
		done
	done
	python3 "$root/scripts/bench_ranks.py" table "$tsv"
	if [ -n "$plot" ]; then
		"$plot_py" "$root/scripts/bench_ranks.py" plot "$tsv" "$plot" "$ranks_mib"
		echo "plot: $plot"
	fi
}
if ((ranks)); then
	ranks_sweep
	exit 0
fi

echo "== kvshim cache protocol (tools/kvshim-bench-cache)"
"$bin/kvshim-bench-cache" 1

echo
echo "== 8 processes read the same $mib MiB with O_DIRECT (one pread per 16 MiB file)"
mkdir -p "$work/store"
for i in $(seq 1 $((mib / 16))); do head -c 16M /dev/urandom >"$work/store/f$i"; done
sync
files=("$work"/store/f*)
# Storage by the kernel's count: this shell's /proc/self/io read_bytes takes in every child it
# has reaped, so its difference around a run is what the kernel read for the run's processes.
io_read_bytes() { awk '/^read_bytes:/ { print $2 }' "/proc/$$/io"; }
k0=$(io_read_bytes)
t_plain=$("$bench" ranks 8 --direct "${files[@]}" | seconds)
k1=$(io_read_bytes)
t_shim=$(KVSHIM_FILES_ROOTS=$work/store KVSHIM_CACHE_NAME=bench-storage-$$ \
	KVSHIM_CACHE_CAPACITY=$((mib + 64))M LD_PRELOAD=$lib \
	"$bench" ranks 8 --direct "${files[@]}" | seconds)
k2=$(io_read_bytes)
bb=$(stat_of storage backend_bytes)
at=$(stat_of storage atime_updates)
python3 - "$mib" "$bb" "$t_plain" "$t_shim" $((k1 - k0)) $((k2 - k1)) "$at" "${#files[@]}" <<'PY'
import sys
mib, bb, t0, t1, kp, ks, at, nf = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), \
    float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8])
u = mib << 20
print("storage bytes by the kernel's count: without %.2fx unique, with kvshim %.4fx unique"
      % (kp / u, ks / u))
print("time: without %.2f s, with kvshim %.2f s (first load, region new)" % (t0, t1))
# The kernel's count must be what kvshim counted, plus its atime reads and metadata.
if not bb <= ks <= bb + 4096 * (at + nf) + 65536:
    print("DIFFERENCE: the kernel read %d bytes, kvshim's backend_bytes is %d (atime reads %d)"
          % (ks, bb, at))
    sys.exit(1)
print("kvshim's backend_bytes (%.4fx) agrees with the kernel's count" % (bb / u))
PY

echo
echo "== 4 ranks, 12-shard tasks, storage at 1 ms per read (slowfs), rotated vs natural order"
if [ -x "$root/build/tests/slowfs" ] && [ -w /dev/fuse ] && command -v fusermount3 >/dev/null; then
	mkdir -p "$work/slow" "$mnt"
	for set in a b c; do
		mkdir -p "$work/slow/$set"
		for i in $(seq 1 16); do head -c $((12 * 256 * 1024)) /dev/urandom >"$work/slow/$set/t$i"; done
	done
	head -c $((256 * 1024)) /dev/urandom >"$work/slow/warm"
	"$root/build/tests/slowfs" --latency-us 1000 "$work/slow" "$mnt" -f &
	for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.05; done
	cat "$mnt"/*/t* >/dev/null # warm the mount's lookups before anything is timed
	for depth in 1 32; do
		for rotate in true false; do
			# One region per configuration, its pages allocated before the clock starts
			# (a new region's first loads would also pay for that); then three rounds on
			# files it has not seen, best of three: the VM's noise exceeds the effect.
			n=bench-rot-$rotate-$depth-$$
			export KVSHIM_FILES_ROOTS=$mnt KVSHIM_CACHE_NAME=$n KVSHIM_CACHE_CAPACITY=160M \
				KVSHIM_CACHE_SHARD_SIZE=256K KVSHIM_LOADER_ROTATE=$rotate \
				KVSHIM_LOADER_IO_DEPTH=$depth KVSHIM_LOADER_LOCAL_RANK_SIZE=4 \
				KVSHIM_LOADER_PREFETCH=off
			LD_PRELOAD=$lib "$bench" read --direct --passes 1 "$mnt/warm" >/dev/null
			for _ in $(seq 200); do
				"$bin/kvshim" stat --json | python3 -c 'import json,sys
r = json.load(sys.stdin)["region"]; sys.exit(r["slots_populated"] < r["slots"])' && break
				sleep 0.05
			done
			best=999
			for set in a b c; do
				t=$(LD_PRELOAD=$lib "$bench" ranks 4 --direct "$mnt/$set"/t* | seconds)
				best=$(python3 -c "print(min($t, $best))")
			done
			"$bin/kvshim" reset --force >/dev/null
			unset KVSHIM_FILES_ROOTS KVSHIM_CACHE_NAME KVSHIM_CACHE_CAPACITY \
				KVSHIM_CACHE_SHARD_SIZE KVSHIM_LOADER_ROTATE KVSHIM_LOADER_IO_DEPTH \
				KVSHIM_LOADER_LOCAL_RANK_SIZE KVSHIM_LOADER_PREFETCH
			eval "t_${rotate}_${depth}=$best"
		done
		python3 -c 'import sys; r, n = float(sys.argv[2]), float(sys.argv[3]); print(
"io_depth %s: rotated %.3f s, natural %.3f s (best of 3): rotated %.2fx faster" % (
sys.argv[1], r, n, n / r))' "$depth" "$(eval echo \$t_true_$depth)" "$(eval echo \$t_false_$depth)"
	done
	fusermount3 -u "$mnt"
else
	echo "skipped: slowfs was not built or FUSE is unavailable here"
fi

echo
echo "== reads served from the cache: 1 MiB O_DIRECT preads into a host buffer, data cached"
m=$("$bench" memcpy "$mib" | gbs)
h=$(KVSHIM_FILES_ROOTS=$work/store KVSHIM_CACHE_NAME=bench-hits-$$ \
	KVSHIM_CACHE_CAPACITY=$((mib + 64))M LD_PRELOAD=$lib \
	"$bench" read --direct --passes 4 "${files[@]}" | gbs)
p=$("$bench" read --passes 4 "${files[@]}" | gbs)
d=$("$bench" read --direct --passes 2 "${files[@]}" | gbs)
python3 - "$m" "$h" "$p" "$d" <<'PY'
import sys
m, h, p, d = map(float, sys.argv[1:])
print("single-thread memcpy      %6.2f GB/s" % m)
print("kvshim hits (O_DIRECT)    %6.2f GB/s = %.0f%% of memcpy" % (h, 100 * h / m))
print("page cache (buffered)     %6.2f GB/s = %.0f%% of memcpy" % (p, 100 * p / m))
print("storage (O_DIRECT)        %6.2f GB/s" % d)
PY
