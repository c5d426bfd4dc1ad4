#!/usr/bin/env bash
# The libraries under the shim never call up into it: no object of base/, config/, cache/,
# loader/ or gpu/, nor of the shim's internals (every shim/ file but the doors: hooks_*.c,
# cufile*.c, dlsym*), names a function that the shim exports (the version script made from
# shim/hooks.def: close, fcntl, mmap,
# read, syscall, ...), and no object of the shim, doors included, calls one.  Inside
# libkvshim.so such a call binds to the shim's own hook; they make their system calls through
# base/raw.h instead, and reach libc through kvs_real.  Nor does the shim carry the tools' half of
# config/ (kvs_config_tools).  Run by scripts/test.sh after the build.
#   check_layers.sh BUILD_DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: check_layers.sh BUILD_DIR}

# The names of the generated map's global section.
[ -f "$build/shim/exports.map" ] || { echo "check_layers: $build/shim/exports.map is missing" >&2; exit 2; }
exports=$(sed -n '/global:/,/local:/p' "$build/shim/exports.map" | grep -v 'global:\|local:' |
	tr ';' '\n' | tr -d ' \t' | grep -v '^$' | sort -u)
# Allowed, each with its reason:
#   gpu.c dlsym: the default resolver of a program without the shim (tools, tests); the shim
#                passes its real dlsym in kvs_gpu_params, so this one is never called there.
allowed="gpu.c.o dlsym"

bad=0
for lib in base/libkvs_base.a config/libkvs_config.a cache/libkvs_cache.a \
	loader/libkvs_loader.a gpu/libkvs_gpu.a; do
	[ -f "$build/$lib" ] || { echo "check_layers: $build/$lib is missing" >&2; exit 2; }
	while read -r obj name; do
		[ -n "$name" ] || continue
		grep -qxF "$name" <<<"$exports" || continue
		grep -qxF "$obj $name" <<<"$allowed" && continue
		echo "check_layers: ${lib%%/*}/$obj calls $name, which the shim exports (use base/raw.h)"
		bad=1
	done < <(nm -u -A "$build/$lib" 2>/dev/null | awk '{ split($1, p, ":"); sub(/@.*/, "", $NF); print p[2], $NF }')
done
# The shim, object by object.  Its internals (every file but the doors, shim/hooks/) name no
# exported function at all; no
# object, doors included, calls one: a call is a PLT32 (x86_64) or CALL26/JUMP26 (aarch64)
# relocation against the name, which binds to the shim's own hook even inside the object that
# defines it.  (A door may take a hook's address: the dlsym answer for the cuFile names.)
internals=0
objdir=$build/shim/CMakeFiles/kvshim.dir
while read -r o; do
	f=${o#"$objdir"/}
	for name in $(objdump -r "$o" | awk '$2 ~ /PLT32|CALL26|JUMP26/ { sub(/[-+@].*/, "", $3); print $3 }' | sort -u); do
		grep -qxF "$name" <<<"$exports" || continue
		echo "check_layers: shim/$f calls $name, which the shim exports (use base/raw.h or kvs_real)"
		bad=1
	done
	case $f in hooks/*) continue ;; esac
	internals=$((internals + 1))
	for name in $(nm -u "$o" | awk '{ sub(/@.*/, "", $NF); print $NF }'); do
		grep -qxF "$name" <<<"$exports" || continue
		echo "check_layers: shim/$f calls $name, which the shim exports (use base/raw.h)"
		bad=1
	done
done < <(find "$objdir" -name '*.o' | sort)
# Floors by folder: no object of the ground (shim/) names a symbol an object of api/ or hooks/
# defines, and no object of api/ one that hooks/ defines.  The waivers, each a registration
# or a door's own answer, are listed with their reason.
#   attach.c kvs_fanout_register: init registers the fork fan-out (the one call up)
floor_waivers="attach.c.o kvs_fanout_register"
defined_in() { # FOLDER: the global symbols the objects under it define
	find "$objdir/$1" -name '*.o' -exec nm -g --defined-only {} + 2>/dev/null |
		awk 'NF == 3 { print $3 }' | sort -u
}
api_defs=$(defined_in api)
hooks_defs=$(defined_in hooks)
[ -n "$api_defs" ] && [ -n "$hooks_defs" ] ||
	{ echo "check_layers: no object under $objdir/api or $objdir/hooks" >&2; exit 2; }
while read -r o; do
	f=${o#"$objdir"/}
	case $f in hooks/*) continue ;; api/*) above=$hooks_defs ;; *) above=$(printf '%s\n%s' "$api_defs" "$hooks_defs") ;; esac
	for name in $(nm -u "$o" | awk '{ sub(/@.*/, "", $NF); print $NF }'); do
		grep -qxF "$name" <<<"$above" || continue
		grep -qxF "$(basename "$o") $name" <<<"$floor_waivers" && continue
		echo "check_layers: shim/$f names $name, defined a floor above it"
		bad=1
	done
done < <(find "$objdir" -name '*.o' | sort)
[ $internals -gt 0 ] || { echo "check_layers: no object of the shim's internals in $build" >&2; exit 2; }
# Write-through's files are a stack (shim/wthru_int.h): no wthru object names a symbol that a
# wthru object of its own floor or one above defines, and none calls into a shim object that
# names a symbol a wthru object defines (a circle through it).  Floors, bottom first:
wthru_floors=("wthru_state.c.o" "wthru_copy.c.o wthru_map.c.o" "wthru.c.o wthru_publish.c.o")
wthru_all=$(printf '%s\n' "${wthru_floors[@]}" | tr ' ' '\n' | sort)
[ "$wthru_all" = "$(find "$objdir" -maxdepth 1 -name 'wthru*.o' -printf '%P\n' | sort)" ] ||
	{ echo "check_layers: shim/wthru*.c and this script's wthru_floors differ (give a new file its floor)"; bad=1; }
wobj=$(cd "$objdir" && pwd)
defs_of() { # OBJECT...: the global symbols they define (named under $wobj)
	(cd "$wobj" && nm -g --defined-only "$@" 2>/dev/null) | awk 'NF == 3 { print $3 }' | sort -u
}
mapfile -t wthru_objs <<<"$wthru_all"
wthru_defs=$(defs_of "${wthru_objs[@]}")
# OBJECT SYMBOL: what each other shim object that names a wthru symbol defines.
back_defs=$(cd "$wobj" && find . -name '*.o' -not -name 'wthru*' -printf '%P\n' | sort |
	while read -r other; do
		names=$(nm -u "$other" | awk '{ sub(/@.*/, "", $NF); print $NF }')
		grep -qxF "$wthru_defs" <<<"$names" || continue
		defs_of "$other" | sed "s|^|$other |"
	done)
for ((i = 0; i < ${#wthru_floors[@]}; i++)); do
	for o in ${wthru_floors[$i]}; do
		up=""
		for ((j = i; j < ${#wthru_floors[@]}; j++)); do
			for p in ${wthru_floors[$j]}; do
				[ "$p" = "$o" ] || up+="$(defs_of "$p")"$'\n'
			done
		done
		for name in $(nm -u "$objdir/$o" | awk '{ sub(/@.*/, "", $NF); print $NF }'); do
			if grep -qxF "$name" <<<"$up"; then
				echo "check_layers: shim/${o%.o} names $name, defined by write-through's floor or one above it"
				bad=1
			fi
			other=$(awk -v n="$name" '$2 == n { print $1 }' <<<"$back_defs")
			[ -z "$other" ] && continue
			echo "check_layers: shim/${o%.o} calls $name (shim/${other%.o}), which calls write-through back"
			bad=1
		done
	done
done
# The tools' half of config/ (printing, --explain, the sample file, name hints) stays out of
# the shim: no function that config/libkvs_config_tools.a defines is in libkvshim.so.
tools_lib=$build/config/libkvs_config_tools.a
shim_so=$build/shim/libkvshim.so
for f in "$tools_lib" "$shim_so"; do
	[ -f "$f" ] || { echo "check_layers: $f is missing" >&2; exit 2; }
done
tool_names=$(nm -g --defined-only "$tools_lib" | awk 'NF == 3 && $2 == "T" { print $3 }' | sort -u)
[ -n "$tool_names" ] || { echo "check_layers: no function in $tools_lib" >&2; exit 2; }
for name in $(nm "$shim_so" | awk 'NF == 3 { print $3 }' | sort -u | comm -12 - <(echo "$tool_names")); do
	echo "check_layers: libkvshim.so holds $name, tool-only code (config/kvs_config_tools)"
	bad=1
done
[ $bad = 0 ] && echo "check_layers: no library under the shim, and no object of it, calls a name it exports; no floor of the shim names one above it; write-through's files a stack; no tool-only code in it"
exit $bad
