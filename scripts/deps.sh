#!/usr/bin/env bash
# Install what kvshim builds and tests with, from Debian's packages, when it is missing.
# Idempotent and quiet when everything is there already.
set -euo pipefail

pkgs=(build-essential cmake pkg-config libinih-dev check libsubunit-dev libxxhash-dev
      liburing-dev libfuse3-dev fuse3 fio python3 coreutils)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "deps: installing ${missing[*]}" >&2
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
		"${missing[@]}" >/dev/null
fi

# promtool (Debian's prometheus package), for the tools test's `promtool check metrics` of
# `kvshim stat --prom`.  It is large; where it cannot be installed the test says it skipped
# that check, so its absence must not stop the build.
if ! command -v promtool >/dev/null; then
	echo "deps: installing prometheus (for promtool)" >&2
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
		prometheus >/dev/null 2>&1 ||
		echo "deps: prometheus did not install; the tools test skips promtool" >&2
fi
