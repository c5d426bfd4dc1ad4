#!/usr/bin/env bash
# Install what kvshim builds and tests with, from Debian's packages, when it is missing.
# Idempotent and quiet when everything is there already.
set -euo pipefail

pkgs=(build-essential cmake pkg-config libinih-dev check libsubunit-dev libxxhash-dev
      liburing-dev libfuse3-dev fuse3 fio python3 coreutils curl)
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

# systemd-analyze and PyYAML, for the examples test's checks of the systemd drop-in and the
# Kubernetes pod in docs/operations.md.  That test skips a part whose tool is missing.
for tool in systemd-analyze:systemd python3-yaml:python3-yaml; do
	if [ "${tool%%:*}" = python3-yaml ]; then
		python3 -c 'import yaml' 2>/dev/null && continue
	else
		command -v "${tool%%:*}" >/dev/null && continue
	fi
	echo "deps: installing ${tool#*:} (for the examples test)" >&2
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
		"${tool#*:}" >/dev/null 2>&1 ||
		echo "deps: ${tool#*:} did not install; the examples test skips that part" >&2
done

# NVIDIA's cufile.h and libcufile.so.0 (the nvidia-cufile wheel), for check_cufile_abi, which
# pins shim/cufile_types.h to them.  Without the wheel that test skips, so a failed install
# must not stop the build either.
cufile_h='import nvidia, os, sys
sys.exit(0 if any(os.path.exists(os.path.join(p, "cu13", "include", "cufile.h")) for p in nvidia.__path__) else 1)'
if ! python3 -c "$cufile_h" 2>/dev/null; then
	if ! python3 -m pip --version >/dev/null 2>&1; then
		echo "deps: pip is missing (apt-get install python3-pip); check_cufile_abi skips" >&2
	else
		echo "deps: installing nvidia-cufile (python3 -m pip)" >&2
		# An externally managed Python (PEP 668) refuses a plain install; CI and root may
		# override it, a developer's own account is left alone.
		python3 -m pip install --quiet nvidia-cufile >/dev/null 2>&1 ||
			{ { [ -n "${CI:-}" ] || [ "$(id -u)" -eq 0 ]; } &&
				python3 -m pip install --quiet --break-system-packages nvidia-cufile \
					>/dev/null 2>&1; } ||
			echo "deps: nvidia-cufile did not install; check_cufile_abi skips" >&2
	fi
fi

# Third-party cuFile clients for the `clients` test: kvikio (kvikio-cu13) and cufile-python.
# kvikio's declared dependencies pull in about 2 GB of CUDA wheels (cuBLAS, cuFFT, CuPy...)
# that the test never loads: what it needs is installed by name, without dependencies, about
# 120 MB.  The test skips a client that is missing, so a failed install must not stop the build.
pip_client() { # python-module pip-package...
	local mod=$1
	shift
	python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$mod') is None)" \
		2>/dev/null && return 0
	if ! python3 -m pip --version >/dev/null 2>&1; then
		echo "deps: pip is missing (apt-get install python3-pip); the clients test skips $1" >&2
		return 0
	fi
	echo "deps: installing $* (python3 -m pip --no-deps)" >&2
	python3 -m pip install --quiet --no-deps "$@" >/dev/null 2>&1 ||
		{ { [ -n "${CI:-}" ] || [ "$(id -u)" -eq 0 ]; } &&
			python3 -m pip install --quiet --no-deps --break-system-packages "$@" \
				>/dev/null 2>&1; } ||
		echo "deps: $1 did not install; the clients test skips it" >&2
}
pip_client kvikio kvikio-cu13 libkvikio-cu13 cuda-pathfinder rapids-logger numpy packaging
pip_client cufile cufile-python
pip_client nixl_cu13 nixl-cu13
