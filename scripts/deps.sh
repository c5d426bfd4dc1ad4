#!/usr/bin/env bash
# Install what kvshim builds and tests with, from Debian's packages, when it is missing.
# Idempotent and quiet when everything is there already.
set -euo pipefail

pkgs=(build-essential cmake pkg-config libinih-dev check libsubunit-dev libxxhash-dev
      liburing-dev libaio-dev libfuse3-dev fuse3 fio python3 coreutils curl)
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

# A venv's Python 3.X (venv VERSION DIR PACKAGE TEST): python3.X found on the PATH, else among
# pyenv's versions; PACKAGE installed into a new venv at DIR; says why where it cannot, as
# the TEST that needs it skips then.  A failed install must not stop the build.
venv() {
	local ver=$1 dir=$2 pkg=$3 test=$4 py="" p
	for p in "$(command -v python"$ver" || true)" \
		"$(command -v pyenv >/dev/null && pyenv root 2>/dev/null)"/versions/"$ver"*/bin/python"$ver" \
		/usr/bin/python"$ver" /usr/local/bin/python"$ver"; do
		if [ -n "$p" ] && [ -x "$p" ] && "$p" -c "import sys, venv; sys.exit(sys.version_info[:2] != tuple(map(int, '$ver'.split('.'))))" 2>/dev/null; then
			py=$p
			break
		fi
	done
	if [ -z "$py" ]; then
		echo "deps: no Python $ver (python$ver or pyenv's $ver); the $test test skips" >&2
		return 0
	fi
	echo "deps: installing $pkg into $dir ($py)" >&2
	{ "$py" -m venv "$dir" >/dev/null 2>&1 &&
		"$dir/bin/python" -m pip install --quiet "$pkg" >/dev/null 2>&1; } ||
		echo "deps: $pkg did not install; the $test test skips" >&2
}

# Mooncake Store's CPU wheel (mooncake-transfer-engine-non-cuda 0.3.13.post1, a cp311 manylinux
# wheel of 46 MB, with mooncake_master) for the `remote` test and the remote helper (`kvshim
# remote`, remote.python): a Python 3.11 venv of its own, KVS_MOONCAKE_VENV (default
# ~/.cache/kvshim/mooncake-venv).
mc_venv=${KVS_MOONCAKE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvshim/mooncake-venv}
"$mc_venv/bin/python" -c 'import mooncake.store' >/dev/null 2>&1 ||
	venv 3.11 "$mc_venv" mooncake-transfer-engine-non-cuda==0.3.13.post1 remote

# UCM's own storage layer (PyPI's uc-manager-cuda-cu130 0.8.1, a cp312 wheel that needs only
# wrapt) for the `ucm` test and scripts/bench_ucm.sh: a Python 3.12 virtual environment of its
# own, KVS_UCM_VENV (default ~/.cache/kvshim/ucm-venv).
ucm_venv=${KVS_UCM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvshim/ucm-venv}
ucm_import='import ucm, importlib, os, ctypes
ctypes.CDLL(os.path.join(os.path.dirname(ucm.__file__), "shared/metrics/libmetrics.so"), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
importlib.import_module("ucm.store.pipeline.ucmpipelinestore")'
"$ucm_venv/bin/python" -c "$ucm_import" >/dev/null 2>&1 ||
	venv 3.12 "$ucm_venv" uc-manager-cuda-cu130==0.8.1 ucm
