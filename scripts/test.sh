#!/usr/bin/env bash
# The tests: on a fresh machine, install what is needed, configure and build from scratch with
# warnings as errors, then run every test with CTest (Check suites, multi-process tests, the
# end-to-end runs under LD_PRELOAD, the FUSE file system; a test whose requirement is missing
# reports itself skipped).
#   scripts/test.sh [BUILD_DIR]        (default build-test)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-test}

bash "$root/scripts/deps.sh"
rm -rf "$build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVS_WERROR=ON
cmake --build "$build" -j"$(nproc)"
cd "$build"
ctest --output-on-failure --timeout 900
