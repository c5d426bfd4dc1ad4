#!/usr/bin/env bash
# The libraries under the shim never call up into it: no object of base/, config/, cache/,
# loader/ or gpu/, nor of the shim's internals (every shim/ file but the doors, shim/hooks/),
# names a function that the shim exports (the version script made from shim/exports.def: close,
# fcntl, mmap,
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
# defines, and no object of api/ one that hooks/ defines.
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
		echo "check_layers: shim/$f names $name, defined a floor above it"
		bad=1
	done
done < <(find "$objdir" -name '*.o' | sort)
# No circle among the shim's objects: an object that names a symbol another defines stands
# above it, and tsort(1) finds a loop of such pairs if there is one.
edges=$(find "$objdir" -name '*.o' | sort | while read -r o; do
	f=${o#"$objdir"/}
	nm -g --defined-only "$o" | awk -v f="$f" 'NF == 3 { print "D", f, $3 }'
	nm -u "$o" | awk -v f="$f" '{ sub(/@.*/, "", $NF); print "U", f, $NF }'
done | awk '$1 == "D" { def[$3] = $2; next } { use[$2 " " $3] = 1 }
	END { for (k in use) { split(k, p, " "); if ((p[2] in def) && def[p[2]] != p[1]) print p[1], def[p[2]] } }' | sort -u)
[ -n "$edges" ] || { echo "check_layers: no object of the shim names another's symbol: nm read nothing in $objdir" >&2; exit 2; }
if loop=$(tsort <<<"$edges" 2>&1 >/dev/null) && [ -z "$loop" ]; then :; else
	echo "check_layers: the shim's objects call each other in a circle:"
	sed 's/^tsort: /  /' <<<"$loop"
	bad=1
fi
[ $internals -gt 0 ] || { echo "check_layers: no object of the shim's internals in $build" >&2; exit 2; }
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
[ $bad = 0 ] && echo "check_layers: no library under the shim, and no object of it, calls a name it exports; no floor of the shim names one above it, and no circle among its objects; no tool-only code in it"
exit $bad
