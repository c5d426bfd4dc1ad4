#!/usr/bin/env bash
# install_test.sh - `cmake --install` into a temporary prefix, and the installed tree at work.
#
#   bash install_test.sh BUILD_DIR KEYS_DEF
#
# Checks that the install puts libkvshim.so in lib, kvshim in bin, the sample kvshim.ini in
# share/kvshim and the docs in share/doc/kvshim; that the sample lists every key of keys.def,
# commented out with its default, loads as it is, and with every line uncommented gives the
# defaults; that the installed `kvshim run` (with no KVSHIM_LIBRARY) preloads the installed
# ../lib/libkvshim.so, checks first, and that the installed shim attaches and names its version;
# and that `cpack -G DEB` packs exactly the installed files under /usr, as package kvshim of the
# project's version depending on libc6 (skipped, with a message, without dpkg-deb or cpack).
# Exits 0 on success, 1 on failure.

# The single-quoted sh -c scripts below expand in the child, which is the point.
# shellcheck disable=SC2016

set -u
set -o pipefail

BUILD=${1:?usage: install_test.sh BUILD_DIR KEYS_DEF}
KEYS_DEF=${2:?usage: install_test.sh BUILD_DIR KEYS_DEF}
T="timeout 60"

fail() {
	echo "FAIL: $*" >&2
	exit 1
}

pass() {
	echo "ok: $*"
}

for v in $(compgen -e | grep '^KVSHIM_'); do
	unset "$v"
done
NAME=install.$$.$RANDOM
WORK=$(mktemp -d "${TMPDIR:-/tmp}/install_test.XXXXXX") || fail "mktemp"
cleanup() {
	rm -f /dev/shm/kvshim.*."$NAME"
	rm -rf "$WORK"
}
trap cleanup EXIT
P=$WORK/prefix

$T cmake --install "$BUILD" --prefix "$P" >"$WORK/install.log" 2>&1 ||
	fail "cmake --install: $(cat "$WORK/install.log")"
for f in lib/libkvshim.so bin/kvshim share/kvshim/kvshim.ini share/doc/kvshim/README.md \
	share/doc/kvshim/operations.md share/doc/kvshim/config.md; do
	[ -s "$P/$f" ] || fail "the install has no $f"
done
[ -x "$P/bin/kvshim" ] || fail "bin/kvshim is not executable"
# DESTDIR works too (packagers stage with it).
DESTDIR=$WORK/stage $T cmake --install "$BUILD" --prefix /opt/kvshim >/dev/null 2>&1 ||
	fail "cmake --install with DESTDIR"
[ -x "$WORK/stage/opt/kvshim/bin/kvshim" ] && [ -s "$WORK/stage/opt/kvshim/lib/libkvshim.so" ] ||
	fail "DESTDIR install: $(find "$WORK/stage" -type f)"
pass "install: lib/libkvshim.so, bin/kvshim, share/kvshim/kvshim.ini, share/doc/kvshim"

# The sample: every key, commented out with its default.
SAMPLE=$P/share/kvshim/kvshim.ini
sed -n 's/^KVS_KEY(\([a-z_]*\), *\([a-z_]*\), *[A-Z_]*, *[a-z_]*, *"\([^"]*\)".*/\1 \2 \3/p' "$KEYS_DEF" >"$WORK/keys"
[ "$(wc -l <"$WORK/keys")" -eq "$(grep -c '^KVS_KEY(' "$KEYS_DEF")" ] || fail "cannot read $KEYS_DEF"
while read -r sec key def; do
	awk -v s="[$sec]" -v k=";$key = $def" '$0 == s { in_s = 1; next } /^\[/ { in_s = 0 }
		in_s && $0 == k { found = 1 } END { exit !found }' "$SAMPLE" ||
		fail "the sample has no ';$key = $def' under [$sec]"
done <"$WORK/keys" || exit 1
export KVSHIM_CACHE_NAME=$NAME
KVSHIM_CONFIG= "$P/bin/kvshim" config >"$WORK/defaults" || fail "kvshim config"
KVSHIM_CONFIG=$SAMPLE "$P/bin/kvshim" config >"$WORK/as_is" 2>"$WORK/err" || fail "the sample does not load: $(cat "$WORK/err")"
sed 's/^;\([a-z_]* = \)/\1/' "$SAMPLE" >"$WORK/uncommented.ini"
KVSHIM_CONFIG=$WORK/uncommented.ini "$P/bin/kvshim" config >"$WORK/all" 2>"$WORK/err" ||
	fail "the uncommented sample does not load: $(cat "$WORK/err")"
cmp -s "$WORK/defaults" "$WORK/as_is" && cmp -s "$WORK/defaults" "$WORK/all" ||
	fail "the sample's values differ from the defaults: $(diff "$WORK/defaults" "$WORK/all")"
pass "the sample kvshim.ini: all $(wc -l <"$WORK/keys") keys, their defaults, loads either way"

# The installed launcher finds the installed library (../lib), with nothing set.
mkdir -p "$WORK/store"
head -c 200000 /dev/zero >"$WORK/store/blk"
export KVSHIM_CONFIG=
export KVSHIM_FILES_ROOTS=$WORK/store
export KVSHIM_CACHE_CAPACITY=4M
export KVSHIM_CACHE_SHARD_SIZE=64K
# A sanitizer build's runtime must come first (run keeps later entries after the shim).
if [ -n "${KVS_E2E_PRELOAD:-}" ]; then
	export LD_PRELOAD=$KVS_E2E_PRELOAD
	export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0
fi
(cd / && $T "$P/bin/kvshim" check) >"$WORK/out" 2>"$WORK/err" || fail "installed check: $(cat "$WORK/err")"
grep -qx "ok   library: $P/lib/libkvshim.so" "$WORK/out" || fail "installed check: $(cat "$WORK/out")"
(cd / && $T "$P/bin/kvshim" run -- sh -c 'echo "$LD_PRELOAD"') >"$WORK/out" 2>"$WORK/err" ||
	fail "installed run: $(cat "$WORK/err")"
[ "$(cat "$WORK/out")" = "$P/lib/libkvshim.so${KVS_E2E_PRELOAD:+:$KVS_E2E_PRELOAD}" ] ||
	fail "installed run preloads '$(cat "$WORK/out")', expected $P/lib/libkvshim.so"
VERSION=$("$P/bin/kvshim" --version | sed 's/^kvshim //')
KVSHIM_SHIM_LOG=info KVSHIM_LOADER_IO=threads $T "$P/bin/kvshim" run -- \
	dd if="$WORK/store/blk" of=/dev/null bs=64K iflag=direct status=none 2>"$WORK/err" ||
	fail "installed run of dd: $(cat "$WORK/err")"
grep -qx "kvshim: [0-9T:.Z-]* pid [0-9]* info: attached as process [0-9]*, backend threads, kvshim $VERSION" "$WORK/err" ||
	fail "the installed shim did not attach: $(cat "$WORK/err")"
"$P/bin/kvshim" stat --json | python3 -c '
import json, sys
t = json.load(sys.stdin)["totals"]
assert t["requests"] >= 1 and t["backend_bytes"] >= 200000, t' || fail "the installed shim served nothing"
pass "the installed kvshim run finds ../lib/libkvshim.so, which attaches and serves"

# The Debian package: the same files as the install, under /usr.
if ! command -v dpkg-deb >/dev/null || ! command -v cpack >/dev/null; then
	echo "skip: the Debian package (no dpkg-deb or cpack on this machine)"
else
	[ -f "$BUILD/CPackConfig.cmake" ] || fail "no $BUILD/CPackConfig.cmake (include(CPack))"
	# Not under the sanitizer runtime preloaded above for the shim: cpack and dpkg-deb are
	# not ours, and under it cpack ran past the timeout.
	(cd "$BUILD" && env -u LD_PRELOAD timeout 240 cpack -G DEB -B "$WORK/pkg") >"$WORK/cpack.log" 2>&1 ||
		fail "cpack -G DEB: $(cat "$WORK/cpack.log")"
	DEB=$(ls "$WORK"/pkg/kvshim_*.deb 2>/dev/null)
	[ -n "$DEB" ] && [ "$(echo "$DEB" | wc -l)" -eq 1 ] || fail "cpack made no kvshim_*.deb: $(ls "$WORK/pkg")"
	dpkg-deb -c "$DEB" | awk '{ print $NF }' >"$WORK/deb.list" || fail "dpkg-deb -c $DEB"
	for f in usr/lib/libkvshim.so usr/bin/kvshim usr/share/kvshim/kvshim.ini \
		usr/share/doc/kvshim/README.md usr/share/doc/kvshim/operations.md; do
		grep -qx "\./$f" "$WORK/deb.list" || fail "the package has no $f: $(cat "$WORK/deb.list")"
	done
	# Exactly what cmake --install installs, byte for byte.
	dpkg-deb -x "$DEB" "$WORK/deb" || fail "dpkg-deb -x $DEB"
	(cd "$P" && find . -type f | sort) >"$WORK/installed.files"
	(cd "$WORK/deb/usr" && find . -type f | sort) >"$WORK/packaged.files"
	cmp -s "$WORK/installed.files" "$WORK/packaged.files" ||
		fail "the package and the install differ: $(diff "$WORK/installed.files" "$WORK/packaged.files")"
	while read -r f; do
		cmp -s "$P/$f" "$WORK/deb/usr/$f" || fail "the packaged $f differs from the installed one"
	done <"$WORK/installed.files"
	dpkg-deb -I "$DEB" >"$WORK/deb.info" || fail "dpkg-deb -I $DEB"
	PVERSION=${VERSION%%+*}
	grep -qx " Package: kvshim" "$WORK/deb.info" && grep -qx " Version: $PVERSION" "$WORK/deb.info" &&
		grep -qE "^ Depends: (.*, )?libc6( |,|$)" "$WORK/deb.info" && grep -q "^ Maintainer: ." "$WORK/deb.info" ||
		fail "the package's control is not kvshim $PVERSION depending on libc6: $(cat "$WORK/deb.info")"
	pass "cpack -G DEB: kvshim $PVERSION, depends on libc6, the installed files under /usr"
fi

echo "PASS: install"
