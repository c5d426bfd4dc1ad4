#!/usr/bin/env bash
# tools_test.sh - end-to-end test of the kvshim command (tools/kvshim.c, tools/cmd_*.c).
#
#   bash tools_test.sh /path/to/kvshim /path/to/mkregion [/path/to/libkvshim.so]
#
# Runs the real program against a region of its own (a unique cache.name, removed at exit)
# made by tests/mkregion.c, with KVSHIM_CONFIG= (no file) and every other KVSHIM_* variable
# cleared, and checks: usage and exit statuses; `config` lists every key of config/keys.def and
# `--explain` names the sources (default, env, file); a bad value exits 1 with one stderr line;
# `stat` on an absent region; `stat --json` is one valid object with every key of
# docs/design.md, "Counters" and totals carried over from exited processes; `stat --prom` is well-formed exposition text;
# `stat --watch` repeats and ends with status 0 on SIGINT; the text form has the headline
# (served, from storage, sharing factor) and human units, and with --watch timestamps and
# rates; `exporter` on port 0 serves GET /metrics of several regions (one absent) to a real
# client (curl, else urllib) with the exposition content type, promtool-clean when promtool is
# installed, 404 and 405 elsewhere, a 431 for a request too large, serves others while a client
# stalls, lists every region of the user without --region, and stops with status 0 on SIGTERM;
# `reset` refuses while a process is attached and works with --force; an untrusted object at the region's path (a FIFO, a mode
# wider than cache.mode) is refused by stat in one line and removed by reset without hanging;
# stat shows the populate mode and populated slots in every format; a mismatched attach is
# refused and counted in the region; cache.on_mismatch = rebuild replaces a region only with no
# live process attached; the region records the version that built it; `ls` lists regions
# with their state without blocking; `evict` drops a served file's shards; `check` passes a good
# configuration and names each problem with its fix: empty, relative, missing, non-directory
# and non-O_DIRECT roots, misspelt KVSHIM_* names (any part) and keys in the wrong section with
# the nearest known name, a region too large for /dev/shm less the headroom, an existing
# region of other dimensions or not trusted, a missing library; `run` prints the problems once
# and starts the command with KVSHIM_ENABLE=0 (not preloaded when the configuration does not
# load), or with --strict refuses; the shim logs an empty files.roots once at info; `run`
# finds the library, prepends it to LD_PRELOAD, sets KVSHIM_CONFIG absolute and passes the
# exit status through.
# Exits 0 on success, 1 on failure, 77 (CTest skip) when python3 is missing.

# The single-quoted sh -c scripts below expand in the child, which is the point.
# shellcheck disable=SC2016

set -u
set -o pipefail

KVSHIM=${1:?usage: tools_test.sh /path/to/kvshim /path/to/mkregion}
MKREGION=${2:?usage: tools_test.sh /path/to/kvshim /path/to/mkregion}
SHIMLIB=${3:-} # libkvshim.so, for the shim's own log lines (skipped without it)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KEYS_DEF=$HERE/../config/keys.def
COUNTERS_DEF=$HERE/../cache/counters.def
T="timeout 30"

fail() {
	echo "FAIL: $*" >&2
	exit 1
}

pass() {
	echo "ok: $*"
}

[ -x "$KVSHIM" ] || fail "$KVSHIM is not an executable"
[ -x "$MKREGION" ] || fail "$MKREGION is not an executable"
KVSHIM=$(realpath "$KVSHIM") || fail "realpath $KVSHIM"
MKREGION=$(realpath "$MKREGION") || fail "realpath $MKREGION"
if ! command -v python3 >/dev/null; then
	echo "SKIP: python3 is missing"
	exit 77
fi

# A clean, private configuration: no file, no inherited overrides, a region of our own.
for v in $(compgen -e | grep '^KVSHIM_'); do
	unset "$v"
done
NAME=tools.$$.$RANDOM
export KVSHIM_CONFIG=
export KVSHIM_CACHE_NAME=$NAME
export KVSHIM_CACHE_CAPACITY=4M
export KVSHIM_CACHE_SHARD_SIZE=64K
REGION=/dev/shm/kvshim.$(id -u).$NAME

WORK=$(mktemp -d "${TMPDIR:-/tmp}/tools_test.XXXXXX") || fail "mktemp"
HOLDER=
EXPORTER=
cleanup() {
	if [ -n "$HOLDER" ]; then
		kill -KILL "$HOLDER" 2>/dev/null
		wait "$HOLDER" 2>/dev/null
	fi
	if [ -n "$EXPORTER" ]; then
		kill -KILL "$EXPORTER" 2>/dev/null
		wait "$EXPORTER" 2>/dev/null
	fi
	rm -f /dev/shm/kvshim.*."$NAME" /dev/shm/kvshim.*."$NAME".*
	rm -rf "$WORK"
}
trap cleanup EXIT

OUT=$WORK/out
ERR=$WORK/err

# Run the command with a timeout; sets RC, leaves stdout in $OUT and stderr in $ERR.
k() {
	$T "$KVSHIM" "$@" >"$OUT" 2>"$ERR"
	RC=$?
}

expect_rc() {
	[ "$RC" -eq "$1" ] || fail "$2: exit status $RC, expected $1 (stderr: $(cat "$ERR"))"
}

# stderr is exactly one line starting with $1.
expect_one_err() {
	[ "$(wc -l <"$ERR")" -eq 1 ] || fail "$2: expected one stderr line, got: $(cat "$ERR")"
	grep -q "^$1" "$ERR" || fail "$2: stderr does not start with '$1': $(cat "$ERR")"
}

# Start mkregion holding the region attached; sets HOLDER.
start_holder() {
	rm -f "$WORK/ready"
	"$MKREGION" "$WORK/ready" &
	HOLDER=$!
	for _ in $(seq 100); do
		[ -e "$WORK/ready" ] && return
		kill -0 "$HOLDER" 2>/dev/null || fail "mkregion holder exited early"
		sleep 0.05
	done
	fail "mkregion holder did not attach within 5 s"
}

stop_holder() {
	kill -KILL "$HOLDER"
	wait "$HOLDER" 2>/dev/null
	HOLDER=
}

# --- usage -------------------------------------------------------------------------------

k --help
expect_rc 0 "kvshim --help"
grep -q '^usage: kvshim' "$OUT" || fail "--help prints no usage on stdout"
for c in run stat config reset check ls evict exporter prepare; do
	grep -q "^  $c" "$OUT" || fail "--help does not list $c"
done
[ ! -s "$ERR" ] || fail "--help wrote to stderr"
k
expect_rc 2 "kvshim without arguments"
[ ! -s "$OUT" ] || fail "bad usage wrote to stdout"
k frobnicate
expect_rc 2 "unknown command"
grep -q '^kvshim: unknown command frobnicate' "$ERR" || fail "unknown command: $(cat "$ERR")"
k stat --bogus
expect_rc 2 "stat --bogus"
grep -q '^kvshim: stat: unknown option --bogus' "$ERR" || fail "stat --bogus: $(cat "$ERR")"
k stat --json --prom
expect_rc 2 "stat --json --prom"
k stat --watch 0
expect_rc 2 "stat --watch 0"
k stat --watch
expect_rc 2 "stat --watch without SEC"
k exporter
expect_rc 2 "exporter without --listen"
k exporter --listen 127.0.0.1:0 --region a/b
expect_rc 2 "exporter --region with a bad name"
k exporter --listen 127.0.0.1:99999
expect_rc 1 "exporter --listen with a bad port"
expect_one_err "kvshim: exporter: --listen 127.0.0.1:99999: bad port" "exporter --listen bad port"
for c in run stat config reset check ls evict exporter prepare; do
	k "$c" --help
	expect_rc 0 "$c --help"
	grep -q "^usage: kvshim $c" "$OUT" || fail "$c --help prints no usage"
done
pass "usage and exit statuses"

# --version: the project's version from CMakeLists.txt, and git describe when it was known.
PROJECT_VERSION=$(sed -n 's/^project(kvshim VERSION \([0-9.]*\).*/\1/p' "$HERE/../CMakeLists.txt")
[ -n "$PROJECT_VERSION" ] || fail "cannot read the project version"
for v in --version -V; do
	k $v
	expect_rc 0 "kvshim $v"
	grep -qE "^kvshim ${PROJECT_VERSION//./\\.}(\+[0-9A-Za-z.-]+)?$" "$OUT" ||
		fail "kvshim $v: '$(cat "$OUT")', expected kvshim $PROJECT_VERSION[+describe]"
done
VERSION=$(sed 's/^kvshim //' "$OUT")
grep -q '^  -V, --version' <("$KVSHIM" --help) || fail "--help does not list --version"
pass "--version: kvshim $VERSION"

# --- config ------------------------------------------------------------------------------

nkeys=$(grep -c '^KVS_KEY(' "$KEYS_DEF")
[ "$nkeys" -gt 10 ] || fail "cannot count the keys of $KEYS_DEF"
k config
expect_rc 0 "config"
[ "$(grep -cE '^[a-z_]+\.[a-z_]+ = ' "$OUT")" -eq "$nkeys" ] ||
	fail "config prints $(grep -cE '^[a-z_]+\.[a-z_]+ = ' "$OUT") keys, keys.def has $nkeys"
sed -n 's/^KVS_KEY(\([a-z_]*\), *\([a-z_]*\),.*/\1.\2/p' "$KEYS_DEF" | while read -r key; do
	grep -q "^$key = " "$OUT" || fail "config does not print $key"
done || exit 1
grep -qx "cache.name = $NAME" "$OUT" || fail "config does not show cache.name = $NAME"
pass "config prints all $nkeys keys"

k config --explain
expect_rc 0 "config --explain"
grep -q 'source env KVSHIM_CACHE_NAME' "$OUT" || fail "--explain does not name env KVSHIM_CACHE_NAME"
grep -q 'source default' "$OUT" || fail "--explain does not name a default source"
printf '[loader]\nio_depth = 7\n' >"$WORK/kv.ini"
KVSHIM_CONFIG=$WORK/kv.ini k config --explain
expect_rc 0 "config --explain with a file"
grep -qx 'loader.io_depth = 7' "$OUT" || fail "the file's loader.io_depth is not used"
grep -q "source file $WORK/kv.ini:2" "$OUT" || fail "--explain does not name the file and line"
pass "config --explain names default, env and file sources"

for c in config stat reset; do
	KVSHIM_CACHE_CAPACITY=lots k "$c"
	expect_rc 1 "$c with a bad value"
	expect_one_err "kvshim: config: environment: KVSHIM_CACHE_CAPACITY" "$c with a bad value"
	[ ! -s "$OUT" ] || fail "$c with a bad value wrote to stdout"
done
printf '[cache]\nbogus = 1\n' >"$WORK/bad.ini"
KVSHIM_CONFIG=$WORK/bad.ini k config
expect_rc 1 "config with a bad file"
expect_one_err "kvshim: config: $WORK/bad.ini:2: " "config with a bad file"
pass "bad configuration: status 1, one stderr line"

# --- stat on an absent region ------------------------------------------------------------

for fmt in "" --json --prom; do
	k stat $fmt
	expect_rc 1 "stat $fmt without a region"
	expect_one_err "kvshim: no region at $REGION\$" "stat $fmt without a region"
	[ ! -s "$OUT" ] || fail "stat $fmt without a region wrote to stdout"
done
k reset
expect_rc 0 "reset without a region"
pass "stat and reset without a region"

# --- stat on a region --------------------------------------------------------------------

# Two processes attach, count (requests 3, backend_bytes 4096 each) and exit.
$T "$MKREGION" || fail "mkregion"
$T "$MKREGION" || fail "mkregion (second)"
[ -e "$REGION" ] || fail "mkregion made no $REGION"

# Check the JSON in $OUT: $1 = expected requests total, $2 = processes attached,
# $3 = expected number of process entries, $4 = expected alive flag of entry 0 (or "").
cat >"$WORK/check_json.py" <<'EOF'
import json, re, sys
counters_def, name, version, requests, attached, nprocs, alive = sys.argv[1:8]
text = sys.stdin.read()
obj = json.loads(text)  # exactly one value: a second object would raise "Extra data"
assert isinstance(obj, dict), "not an object"
counters = re.findall(r'^KVS_COUNTER\((\w+),', open(counters_def).read(), re.M)
assert len(counters) >= 13, counters
region = obj["region"]
for key in ("name", "capacity_bytes", "shard_size", "slots", "slots_ready", "slots_loading",
            "slots_failed", "slots_pinned", "processes_attached"):
    assert key in region, "region lacks " + key
    if key != "name":
        assert type(region[key]) is int, key + " is not an integer"
assert region["name"] == name, region["name"]
assert obj["version"] == version, obj.get("version")
assert region["procs_unlocked"] is False, region.get("procs_unlocked")
assert region["capacity_bytes"] == 4 << 20, region["capacity_bytes"]
assert region["shard_size"] == 64 << 10, region["shard_size"]
assert region["slots"] == 64, region["slots"]
assert region["processes_attached"] == int(attached), region["processes_attached"]
totals = obj["totals"]
for c in counters:
    assert type(totals.get(c)) is int, "totals lacks " + c
assert totals["requests"] == int(requests), totals["requests"]
assert totals["backend_bytes"] == int(requests) // 3 * 4096, totals["backend_bytes"]
procs = obj["processes"]
assert isinstance(procs, list) and len(procs) == int(nprocs), procs
for p in procs:
    for key in ["pid", "pidns", "rank", "alive"] + counters:
        assert key in p, "process lacks " + key
    assert type(p["alive"]) is bool
    assert type(p["pid"]) is int and type(p["rank"]) is int and type(p["pidns"]) is int
if procs:
    assert procs[0]["alive"] == (alive == "true"), procs[0]
    assert procs[0]["rank"] == 5 and procs[0]["requests"] == 3, procs[0]
EOF
check_json() {
	python3 "$WORK/check_json.py" "$COUNTERS_DEF" "$NAME" "$VERSION" "$@" <"$OUT" ||
		fail "stat --json: $(cat "$OUT")"
}

k stat --json
expect_rc 0 "stat --json"
[ ! -s "$ERR" ] || fail "stat --json wrote to stderr: $(cat "$ERR")"
[ "$(wc -l <"$OUT")" -eq 1 ] || fail "stat --json is not one line"
check_json 6 0 0 ""
pass "stat --json: every key, totals of exited processes"

start_holder
k stat --json
expect_rc 0 "stat --json with a holder"
check_json 9 1 1 true
python3 -c 'import json,sys; assert json.load(sys.stdin)["processes"][0]["pid"] == int(sys.argv[1])' \
	"$HOLDER" <"$OUT" || fail "stat --json does not show the holder's pid $HOLDER"
pass "stat --json: a live process with its pid, rank and counters"

k stat
expect_rc 0 "stat"
grep -q "pid $HOLDER" "$OUT" || fail "stat text lacks the holder's column"
grep -q "^region .*, read by kvshim $VERSION$" "$OUT" || fail "stat text lacks the version: $(head -1 "$OUT")"
grep -qE '^requests +9 +3$' "$OUT" || fail "stat text: requests row: $(grep requests "$OUT")"
pass "stat: text table"
# Human units in the text form: the headline (bytes served against bytes from storage, and
# the sharing factor), bytes in KiB, times in ms; --json keeps the integers (checked above).
grep -qx 'served     0 B to readers from 12.0 KiB read from storage: sharing factor 0.00' "$OUT" ||
	fail "stat text: headline: $(grep -m1 '^served' "$OUT" || head -3 "$OUT")"
grep -qE '^backend_bytes +12\.0 KiB +4\.0 KiB$' "$OUT" || fail "stat text: $(grep backend_bytes "$OUT")"
grep -qE '^wait_ns +0 ms +0 ms$' "$OUT" || fail "stat text: $(grep wait_ns "$OUT")"
pass "stat: headline and human units"

k stat --prom
expect_rc 0 "stat --prom"
cat >"$WORK/check_prom.py" <<'EOF'
import re, sys
version, name = sys.argv[1:3]
typed, helped, samples = {}, set(), {}
text = sys.stdin.read()
# No pid label: it would make new series at every restart (pidns, the pod's PID namespace,
# lives as long as the pod, and a region holds at most 16 of them).
assert not re.search(r'[{,]pid="', text), "a pid label makes new series at every restart"
for line in text.splitlines():
    m = re.match(r'^# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*) (.+)$', line)
    if m:
        if m.group(1) == "TYPE":
            assert m.group(3) in ("counter", "gauge"), line
            assert m.group(2) not in typed, "TYPE twice: " + line
            typed[m.group(2)] = m.group(3)
        else:
            assert m.group(2) not in helped, "HELP twice: " + line
            helped.add(m.group(2))
        continue
    m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*)\} (-?[0-9]+(?:\.[0-9]+)?)$', line)
    assert m, "bad sample line: " + line
    assert m.group(1) in typed, "sample before its TYPE: " + line
    samples.setdefault(m.group(1), []).append((m.group(2), float(m.group(3))))
for fam, kind in typed.items():
    assert fam in helped, "no HELP for " + fam
    assert (kind == "counter") == fam.endswith("_total"), fam + " " + kind
    assert "_ns" not in fam, "a unit that is not a base unit: " + fam
    if fam != "kvshim_build_info":
        assert all(('region="%s"' % name) in l for l, v in samples[fam]), "no region label: " + fam
assert samples["kvshim_build_info"] == [('version="%s"' % version, 1)], samples["kvshim_build_info"]
assert samples["kvshim_up"][0][1] == 1
assert typed["kvshim_requests_total"] == "counter"
assert typed["kvshim_wait_seconds_total"] == "counter"
assert typed["kvshim_backend_bytes_total"] == "counter"
assert samples["kvshim_requests_total"][0][1] == 9, samples["kvshim_requests_total"]
assert samples["kvshim_region_slots"][0][1] == 64
assert samples["kvshim_region_processes_attached"][0][1] == 1
assert samples["kvshim_region_procs_unlocked"][0][1] == 0
per = samples["kvshim_process_requests_total"]
assert len(per) == 1 and per[0] == ('region="%s",rank="5"' % name, 3), per
EOF
python3 "$WORK/check_prom.py" "$VERSION" "$NAME" <"$OUT" || fail "stat --prom: $(cat "$OUT")"
# Debian's promtool, when CI installed it (scripts/deps.sh); its lint is the reference.
if command -v promtool >/dev/null; then
	promtool check metrics <"$OUT" >"$WORK/promtool" 2>&1 ||
		fail "promtool check metrics: $(cat "$WORK/promtool")"
	pass "stat --prom: promtool check metrics is clean"
else
	echo "SKIP: promtool is missing (apt-get install prometheus, or scripts/deps.sh): the" \
		"exposition text was checked by this script only"
fi
pass "stat --prom: base units, HELP and TYPE once, up, build_info, series by rank"

# --watch: repeats, and SIGINT ends it with status 0 (bash runs background jobs with SIGINT
# ignored; kvshim installs its handler regardless).
"$KVSHIM" stat --json --watch 0.1 >"$WORK/watch" 2>"$ERR" &
WPID=$!
sleep 0.6
kill -INT "$WPID"
wait "$WPID"
RC=$?
expect_rc 0 "stat --watch after SIGINT"
[ "$(wc -l <"$WORK/watch")" -ge 2 ] || fail "stat --watch printed $(wc -l <"$WORK/watch") snapshots"
python3 -c 'import json,sys; [json.loads(l) for l in sys.stdin]' <"$WORK/watch" ||
	fail "stat --watch: a line is not JSON"
pass "stat --watch: $(wc -l <"$WORK/watch") snapshots, status 0 on SIGINT"

# The text form of --watch: each sample has its time, and the rates since the one before.
"$KVSHIM" stat --watch 0.2 >"$WORK/watch" 2>"$ERR" &
WPID=$!
sleep 0.7
kill -TERM "$WPID"
$T tail --pid="$WPID" -f /dev/null
wait "$WPID"
RC=$?
expect_rc 0 "stat --watch (text) after SIGTERM"
[ "$(grep -cE '^time +[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}' "$WORK/watch")" -ge 2 ] ||
	fail "stat --watch: fewer than two timestamped samples: $(cat "$WORK/watch")"
[ "$(grep -m1 '^rates' "$WORK/watch")" = "rates      - (from the next sample)" ] ||
	fail "stat --watch: first rates line: $(grep -m1 '^rates' "$WORK/watch")"
grep -qE '^rates +[0-9]+\.[0-9]{2} GB/s served, [0-9]+\.[0-9]{2} GB/s from storage, [0-9]+ requests/s \(over [0-9.]+ s\)$' \
	"$WORK/watch" || fail "stat --watch: no rates line: $(grep '^rates' "$WORK/watch")"
pass "stat --watch (text): timestamps and rates since the last sample"

# --- exporter ----------------------------------------------------------------------------

# A second region, so that the exposition of several regions is checked.
KVSHIM_CACHE_NAME=$NAME.b $T "$MKREGION" || fail "mkregion $NAME.b"

# http METHOD PATH: a request to the exporter on $PORT with a real client (curl, else
# python3's urllib); sets HTTP_STATUS and HTTP_TYPE, leaves the body in $WORK/body.
cat >"$WORK/http_get.py" <<'PY'
import sys, urllib.error, urllib.request
method, url, body = sys.argv[1:4]
try:
    r = urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10)
except urllib.error.HTTPError as e:
    r = e
open(body, "wb").write(r.read())
print(r.getcode(), r.headers.get("Content-Type", ""))
PY
http() {
	local w
	if command -v curl >/dev/null; then
		w=$($T curl -s -o "$WORK/body" -w '%{http_code} %{content_type}' -X "$1" \
			"http://127.0.0.1:$PORT$2") || fail "curl $1 $2: status $?"
	else
		w=$($T python3 "$WORK/http_get.py" "$1" "http://127.0.0.1:$PORT$2" "$WORK/body") ||
			fail "urllib $1 $2"
	fi
	HTTP_STATUS=${w%% *}
	HTTP_TYPE=${w#* }
}

# start_exporter ARGS...: start it on port 0 and read the port it prints; sets EXPORTER, PORT.
start_exporter() {
	"$KVSHIM" exporter --listen 127.0.0.1:0 "$@" 2>"$WORK/exporter.err" &
	EXPORTER=$!
	PORT=
	for _ in $(seq 100); do
		PORT=$(sed -n 's|^kvshim: exporter listening on http://127\.0\.0\.1:\([0-9]*\)/metrics$|\1|p' \
			"$WORK/exporter.err")
		[ -n "$PORT" ] && break
		kill -0 "$EXPORTER" 2>/dev/null || fail "exporter exited: $(cat "$WORK/exporter.err")"
		sleep 0.05
	done
	[ -n "$PORT" ] && [ "$PORT" -gt 0 ] || fail "exporter printed no port: $(cat "$WORK/exporter.err")"
}

# stop_exporter: SIGTERM ends it with status 0, promptly.
stop_exporter() {
	kill -TERM "$EXPORTER"
	$T tail --pid="$EXPORTER" -f /dev/null || fail "exporter did not stop on SIGTERM"
	wait "$EXPORTER"
	RC=$?
	EXPORTER=
	expect_rc 0 "exporter after SIGTERM"
}

start_exporter --region "$NAME" --region "$NAME.b" --region "absent.$NAME" --region "$NAME"
http GET /metrics
[ "$HTTP_STATUS" = 200 ] || fail "exporter: GET /metrics: status $HTTP_STATUS"
[ "$HTTP_TYPE" = "text/plain; version=0.0.4; charset=utf-8" ] ||
	fail "exporter: Content-Type '$HTTP_TYPE'"
cat >"$WORK/check_multi.py" <<'PY'
import re, sys
name = sys.argv[1]
text = open(sys.argv[2]).read()
typed, helped, seen, current = set(), set(), {}, None
for line in text.splitlines():
    m = re.match(r'^# (HELP|TYPE) (\S+) ', line)
    if m:
        where = typed if m.group(1) == "TYPE" else helped
        assert m.group(2) not in where, m.group(1) + " twice: " + line
        where.add(m.group(2))
        current = m.group(2)
        continue
    fam, labels, value = re.match(r'^(\w+)\{(.*)\} (\S+)$', line).groups()
    assert fam == current, "a sample away from its family: " + line
    region = re.sub(r'^region="([^"]*)".*', r'\1', labels)
    seen.setdefault(fam, {})[region] = seen.get(fam, {}).get(region, 0) + float(value)
assert seen["kvshim_up"] == {name: 1, name + ".b": 1, "absent." + name: 0}, seen["kvshim_up"]
assert seen["kvshim_requests_total"] == {name: 9, name + ".b": 3}, seen["kvshim_requests_total"]
assert seen["kvshim_region_slots"] == {name: 64, name + ".b": 64}, seen["kvshim_region_slots"]
assert not re.search(r'[{,]pid="', text), "a pid label"
PY
python3 "$WORK/check_multi.py" "$NAME" "$WORK/body" || fail "exporter: $(cat "$WORK/body")"
# Less the other regions' series, the text is what check_prom.py wants of one region.
grep -v -e "region=\"absent\.$NAME\"" -e "region=\"$NAME\.b\"" "$WORK/body" |
	python3 "$WORK/check_prom.py" "$VERSION" "$NAME" || fail "exporter: check_prom.py"
if command -v promtool >/dev/null; then
	promtool check metrics <"$WORK/body" >"$WORK/promtool" 2>&1 ||
		fail "exporter: promtool check metrics: $(cat "$WORK/promtool")"
	pass "exporter: promtool check metrics is clean"
else
	echo "SKIP: promtool is missing: the exporter's text was checked by this script only"
fi
http GET /metrics # a second scrape: the same absence is not reported again
[ "$(grep -c "^kvshim: exporter: no region at /dev/shm/kvshim\.$(id -u)\.absent\.$NAME$" \
	"$WORK/exporter.err")" -eq 1 ] ||
	fail "exporter: the absent region is not reported once: $(cat "$WORK/exporter.err")"
pass "exporter: GET /metrics of three regions, HELP and TYPE once, up 0 for an absent one"

http GET /nope
[ "$HTTP_STATUS" = 404 ] || fail "exporter: GET /nope: status $HTTP_STATUS"
http POST /metrics
[ "$HTTP_STATUS" = 405 ] || fail "exporter: POST /metrics: status $HTTP_STATUS"
# A stalled client holds no one up; a request head over the limit is refused.
cat >"$WORK/stall.py" <<'PY'
import socket, sys, urllib.request
port = int(sys.argv[1])
idle = socket.create_connection(("127.0.0.1", port))
r = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5)
assert r.getcode() == 200
big = socket.create_connection(("127.0.0.1", port), timeout=5)
big.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000)
reply = big.recv(100)
assert reply.startswith(b"HTTP/1.1 431 "), reply
idle.close()
PY
$T python3 "$WORK/stall.py" "$PORT" || fail "exporter: a stalled client or an oversized request"
# Idle clients beyond the exporter's 16 slots, some reconnecting as soon as they are answered,
# starve no scrape: each is answered within 1 s.  Garbage and a NUL byte are answered 400 at
# once, not when the connection times out.
cat >"$WORK/starve.py" <<'PY'
import socket, sys, threading, time, urllib.request
port = int(sys.argv[1])
stop = False
def idler(again):
    while not stop:
        try:
            s = socket.create_connection(("127.0.0.1", port))
            s.settimeout(0.5)
            while not stop:
                try:
                    if not s.recv(100):
                        break  # answered (503) and closed: come back, if "again"
                except socket.timeout:
                    pass
            s.close()
        except OSError:
            time.sleep(0.01)
        if not again:
            while not stop:
                time.sleep(0.05)
threads = [threading.Thread(target=idler, args=(i % 2 == 0,), daemon=True) for i in range(40)]
for t in threads:
    t.start()
time.sleep(0.5)
worst = 0.0
for _ in range(7):
    t0 = time.monotonic()
    r = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=1)
    assert r.getcode() == 200
    r.read()
    worst = max(worst, time.monotonic() - t0)
for bad in (b"hello there\r\n", b"GET /metrics\x00 HTTP/1.1\r\n"):
    t0 = time.monotonic()
    c = socket.create_connection(("127.0.0.1", port), timeout=1)
    c.sendall(bad)
    reply = c.recv(100)
    assert reply.startswith(b"HTTP/1.1 400 "), (bad, reply)
    worst = max(worst, time.monotonic() - t0)
    c.close()
stop = True
print("%.3f" % worst)
PY
worst=$($T python3 "$WORK/starve.py" "$PORT") ||
	fail "exporter: a scrape among 40 idle clients, or garbage, was not answered within 1 s"
pass "exporter: 7 scrapes among 40 idle clients (half reconnecting), garbage and a NUL byte: answered within ${worst} s"
stop_exporter
pass "exporter: 404, 405, a stalled client, a request too large, status 0 on SIGTERM"

# Without --region: every region of this user in /dev/shm.
start_exporter
http GET /metrics
[ "$HTTP_STATUS" = 200 ] || fail "exporter (all regions): status $HTTP_STATUS"
grep -qx "kvshim_up{region=\"$NAME\"} 1" "$WORK/body" || fail "exporter (all regions): no $NAME"
grep -qx "kvshim_up{region=\"$NAME.b\"} 1" "$WORK/body" || fail "exporter (all regions): no $NAME.b"
stop_exporter
rm -f "/dev/shm/kvshim.$(id -u).$NAME.b"
pass "exporter: without --region, every region of this user"

# stat is a watcher: it reports the region as it was built, whatever the configuration's
# dimensions say now (an operator can always look), and says what it found.
KVSHIM_CACHE_SHARD_SIZE=128K k stat --json
expect_rc 0 "stat with a different shard_size"
python3 -c 'import json,sys; assert json.load(sys.stdin)["region"]["shard_size"] == 64 << 10' <"$OUT" ||
	fail "stat with a different shard_size did not report the region's own"
pass "stat reads a region of other dimensions as built"

# A process that died attached stays in the table, not alive, its counters in the totals.
stop_holder
k stat --json
expect_rc 0 "stat --json after the holder died"
check_json 9 0 1 false
pass "stat --json: a dead process is listed with alive false"

# --- reset -------------------------------------------------------------------------------

start_holder

k reset
expect_rc 1 "reset with a holder attached"
expect_one_err "kvshim: 1 processes are attached to $REGION; use --force\$" "reset with a holder"
[ -e "$REGION" ] || fail "reset removed the region while refusing"
k reset --force
expect_rc 0 "reset --force"
[ ! -e "$REGION" ] || fail "reset --force left $REGION"
grep -qx "removed $REGION" "$OUT" || fail "reset --force: stdout: $(cat "$OUT")"
stop_holder
$T "$MKREGION" || fail "mkregion after reset"
k reset
expect_rc 0 "reset with no process attached"
[ ! -e "$REGION" ] || fail "reset left $REGION"
pass "reset refuses while attached, --force and an idle region work"

# Something the shim would not use at the region's path: stat refuses it at once with one
# line, and reset neither hangs (a FIFO) nor leaves it, nor leftovers of dead creators.
mkfifo "$REGION" || fail "mkfifo $REGION"
k stat --json
expect_rc 1 "stat on a FIFO"
expect_one_err "kvshim: refusing $REGION: is a FIFO, not a regular file" "stat on a FIFO"
: >"$REGION.tmp.999999999.0"
: >"$REGION.build.999999999.00112233445566778899aabbccddeeff"
k reset
expect_rc 0 "reset of a FIFO"
[ ! -e "$REGION" ] || fail "reset left the FIFO at $REGION"
grep -q "removed $REGION (it is a FIFO, not a regular file" "$OUT" || fail "reset of a FIFO: $(cat "$OUT")"
[ ! -e "$REGION.tmp.999999999.0" ] || fail "reset left an old-style leftover"
[ ! -e "$REGION.build.999999999.00112233445566778899aabbccddeeff" ] || fail "reset left a leftover"
$T "$MKREGION" || fail "mkregion after the FIFO"
chmod 0644 "$REGION"
k stat
expect_rc 1 "stat on a region of a wider mode"
expect_one_err "kvshim: refusing $REGION: mode 0644 is wider than cache.mode 0600" "wider mode"
k reset
expect_rc 0 "reset of a region of a wider mode"
[ ! -e "$REGION" ] || fail "reset left $REGION of a wider mode"
pass "an untrusted object: stat refuses it in one line, reset removes it without hanging"

# Population in every format: the mode, the slots populated, why a walk stopped.
$T "$MKREGION" || fail "mkregion for population"
k stat --json
expect_rc 0 "stat --json for population"
python3 -c '
import json, sys
r = json.load(sys.stdin)["region"]
assert r["populate"] == "ahead" and r["populate_reason"] == "" and r["populate_errno"] == 0, r
assert type(r["slots_populated"]) is int and type(r["shm_free_bytes"]) is int, r' <"$OUT" ||
	fail "stat --json population keys: $(cat "$OUT")"
k stat --prom
grep -qE '^kvshim_region_slots_populated\{region="[^"]*"\} [0-9]+$' "$OUT" || fail "prom: slots_populated"
grep -qE '^kvshim_region_populate_info\{region="[^"]*",mode="ahead",reason=""\} 1$' "$OUT" ||
	fail "prom: populate_info: $(grep populate "$OUT")"
k stat
grep -qE '^populated +[0-9]+ of 64 slots, ahead; /dev/shm has ' "$OUT" || fail "text: $(grep populated "$OUT")"
k reset
expect_rc 0 "reset after population"
pass "stat shows population in text, --json and --prom"

# prepare makes the region and gives every slot its pages; again, it finds nothing to do
# wrong; an argument it does not take is bad usage.
k prepare
expect_rc 0 "prepare of a new region"
grep -qE "^$REGION: 64 of 64 slots prepared \(4\.0 MiB\) in [0-9.]+ s, [0-9.]+ s per GiB, 4\.0 KiB pages$" "$OUT" ||
	fail "prepare: $(cat "$OUT")"
[ ! -s "$ERR" ] || fail "prepare wrote to stderr: $(cat "$ERR")"
[ "$(($(stat -c %b "$REGION") * 512))" -ge $((4 << 20)) ] ||
	fail "prepare left the data unallocated: $(stat -c %b "$REGION") blocks"
k stat --json
python3 -c '
import json, sys
r = json.load(sys.stdin)["region"]
assert r["slots_populated"] == r["slots"] == 64, r' <"$OUT" || fail "stat after prepare: $(cat "$OUT")"
k prepare
expect_rc 0 "prepare again"
grep -qE "^$REGION: 64 of 64 slots prepared" "$OUT" || fail "prepare again: $(cat "$OUT")"
k prepare extra
expect_rc 2 "prepare with an argument"
# A region of other dimensions: refused, or replaced with cache.on_mismatch = rebuild, which
# prepare says once, as the shim would.
KVSHIM_CACHE_SHARD_SIZE=128K k prepare
expect_rc 1 "prepare of a region of other dimensions"
grep -q "has shard_size 65536, the configuration wants 131072" "$ERR" ||
	fail "prepare of a mismatched region: $(cat "$ERR")"
KVSHIM_CACHE_SHARD_SIZE=128K KVSHIM_CACHE_ON_MISMATCH=rebuild k prepare
expect_rc 0 "prepare with cache.on_mismatch = rebuild"
[ "$(grep -c "^kvshim: cache.on_mismatch = rebuild: replaced $REGION" "$ERR")" -eq 1 ] ||
	fail "prepare does not say once that it replaced the region: $(cat "$ERR")"
grep -qE "^$REGION: 32 of 32 slots prepared" "$OUT" || fail "prepare after rebuild: $(cat "$OUT")"
k reset
expect_rc 0 "reset after prepare"
pass "prepare gives a new region all its pages, twice without harm, and says when it rebuilds"

# --- region lifecycle: refused attaches, cache.on_mismatch, built_by, ls ------------------

# ls_json NAME PYEXPR: `ls --json` has an entry for NAME (a file name in /dev/shm) of which
# PYEXPR (on r, the entry) holds.
ls_json() {
	k ls --json
	expect_rc 0 "ls --json"
	python3 -c '
import json, sys
regions = json.load(sys.stdin)["regions"]
r = [x for x in regions if x["name"] == sys.argv[1]]
assert len(r) == 1, "ls does not list %s: %s" % (sys.argv[1], regions)
r = r[0]
assert eval(sys.argv[2]), "%s: %s" % (sys.argv[2], r)' "$1" "$2" "$VERSION" <"$OUT" ||
		fail "ls --json: $(cat "$OUT")"
}
BASE=${REGION##*/}

# A process of other dimensions is refused, and the refusal is counted in the region.
$T "$MKREGION" || fail "mkregion for the lifecycle"
KVSHIM_CACHE_SHARD_SIZE=128K $T "$MKREGION" 2>"$ERR" && fail "mkregion of other dimensions attached"
grep -q "has shard_size 65536, the configuration wants 131072" "$ERR" ||
	fail "a refused attach: $(cat "$ERR")"
ls_json "$BASE" 'r["state"] == "ok" and r["refused_attaches"] == 1 and r["shard_size"] == 65536 and r["processes_attached"] == 0 and r["path"] == "/dev/shm/" + r["name"]'
pass "a mismatched attach is refused and counted (refused_attaches 1)"

# The region records the version of kvshim that built it (cut to 32 bytes).
ls_json "$BASE" 'r["built_by"] == sys.argv[3][:32]'
k ls
expect_rc 0 "ls"
grep -q "^NAME  *SIZE  *AGE  *LIVE  *STATE$" "$OUT" || fail "ls: no heading: $(cat "$OUT")"
line=$(grep "^$BASE " "$OUT") || fail "ls does not list $BASE: $(cat "$OUT")"
[[ "$line" =~ \ [0-9]+s\ +0\ \ ok\ \(kvshim\ (.*),\ 1\ refused\ attaches\)$ ]] ||
	fail "ls line: '$line'"
[ "${BASH_REMATCH[1]}" = "${VERSION:0:32}" ] || fail "ls: built by '${BASH_REMATCH[1]}', not $VERSION"
pass "built_by is kvshim --version's $VERSION; ls shows it in one line"

# ls: live processes, and every state but mismatched layout (which needs another build).
start_holder
ls_json "$BASE" 'r["processes_attached"] == 1'
: >"$REGION.junk"
chmod 0600 "$REGION.junk"
printf 'x' >"$REGION.wide"
chmod 0644 "$REGION.wide"
ls_json "$BASE.junk" 'r["state"] == "not a region" and r["processes_attached"] == -1'
ls_json "$BASE.wide" 'r["state"] == "untrusted" and "mode 0644" in r["why"]'
if [ "$(id -u)" -eq 0 ] && chown 65534 "$REGION.wide" 2>/dev/null; then
	ls_json "$BASE.wide" 'r["state"] == "foreign owner" and r["uid"] == 65534'
	pass "ls: a foreign owner"
fi
mkfifo "$REGION.fifo"
ls_json "$BASE.fifo" 'r["state"] == "not a region" and "FIFO" in r["why"]'
k ls
grep -q "^$BASE.fifo .* not a region (is a FIFO, not a regular file)$" "$OUT" || fail "ls: $(cat "$OUT")"
rm -f "$REGION.junk" "$REGION.wide" "$REGION.fifo"
k ls --bogus
expect_rc 2 "ls --bogus"
pass "ls: live processes; not a region, untrusted, a FIFO without blocking"

# cache.on_mismatch = rebuild: refused while a live process is attached (and counted) ...
KVSHIM_CACHE_SHARD_SIZE=128K KVSHIM_CACHE_ON_MISMATCH=rebuild $T "$MKREGION" 2>"$ERR" &&
	fail "rebuild replaced a region with a live process attached"
grep -q "cache.on_mismatch = rebuild, but 1 processes are attached to it" "$ERR" ||
	fail "rebuild with a holder: $(cat "$ERR")"
ls_json "$BASE" 'r["shard_size"] == 65536 and r["refused_attaches"] == 2'
stop_holder
# ... and replaces it once none is, saying so once, leaving nothing behind.
KVSHIM_CACHE_SHARD_SIZE=128K KVSHIM_CACHE_ON_MISMATCH=rebuild $T "$MKREGION" 2>"$ERR" ||
	fail "rebuild without a holder: $(cat "$ERR")"
[ "$(grep -c "^mkregion: cache.on_mismatch = rebuild: replaced $REGION, which no process was attached to (region $REGION has shard_size 65536, the configuration wants 131072)$" "$ERR")" -eq 1 ] ||
	fail "rebuild did not say once what it did: $(cat "$ERR")"
ls_json "$BASE" 'r["shard_size"] == 131072 and r["refused_attaches"] == 0 and r["state"] == "ok"'
compgen -G "$REGION.*" >/dev/null && fail "rebuild left $(echo "$REGION".*)"
KVSHIM_CACHE_SHARD_SIZE=128K KVSHIM_CACHE_ON_MISMATCH=rebuild $T "$MKREGION" 2>"$ERR" ||
	fail "attach to the rebuilt region: $(cat "$ERR")"
[ ! -s "$ERR" ] || fail "a matching region was rebuilt again: $(cat "$ERR")"
KVSHIM_CACHE_ON_MISMATCH=bogus k config
expect_rc 1 "cache.on_mismatch = bogus"
k reset
expect_rc 0 "reset after the rebuild"
pass "cache.on_mismatch = rebuild: refused with a live process, replaces a region without one"

# --- check -------------------------------------------------------------------------------

# A library for check and run to find: the C library itself, if ldd names it (harmless to
# preload).
LIB=$(ldd "$KVSHIM" 2>/dev/null | awk '$1 ~ /^libc\.so/ { print $3 }')
[ -n "$LIB" ] && [ -r "$LIB" ] || LIB=$MKREGION
LIB=$(realpath "$LIB")
export KVSHIM_LIBRARY=$LIB
mkdir -p "$WORK/store"
: >"$WORK/store/blk0"

# expect_problem PATTERN FIX_PATTERN WHAT: check failed, naming the problem and its fix.
expect_problem() {
	expect_rc 1 "$3"
	grep -q "^kvshim: problem: .*$1" "$ERR" || fail "$3: no problem '$1' in: $(cat "$ERR")"
	grep -A1 "^kvshim: problem: .*$1" "$ERR" | grep -q "^kvshim:   fix: .*$2" ||
		fail "$3: no fix '$2' in: $(cat "$ERR")"
	grep -qE '^[0-9]+ problems? found$' "$OUT" || fail "$3: no summary: $(cat "$OUT")"
}

KVSHIM_FILES_ROOTS=$WORK/store k check
expect_rc 0 "check of a good configuration"
[ ! -s "$ERR" ] || fail "check of a good configuration wrote to stderr: $(cat "$ERR")"
grep -qx "ok   files.roots: $WORK/store" "$OUT" || fail "check: roots line: $(cat "$OUT")"
grep -qx "ok   region: $REGION is absent; /dev/shm has room to build it" "$OUT" ||
	fail "check: region line: $(cat "$OUT")"
grep -qx "ok   library: $LIB" "$OUT" || fail "check: library line: $(cat "$OUT")"
grep -qx "no problems found" "$OUT" || fail "check: summary: $(cat "$OUT")"
pass "check: a good configuration passes, every check named"

k check
expect_problem "files.roots is empty: the shim serves nothing" "set files.roots" "check without roots"
KVSHIM_FILES_ROOTS=store k check
expect_problem "files.roots: store is not an absolute path" "absolute path" "check: relative root"
KVSHIM_FILES_ROOTS=$WORK/store:$WORK/nope k check
expect_problem "files.roots: $WORK/nope: No such file or directory" "create it" "check: missing root"
[ "$(grep -c '^kvshim: problem' "$ERR")" -eq 1 ] || fail "check: the good root was blamed too"
KVSHIM_FILES_ROOTS=$WORK/store/blk0 k check
expect_problem "is not a directory" "directory" "check: a file as root"
if [ -d /proc/sys/vm ]; then
	KVSHIM_FILES_ROOTS=/proc/sys/vm k check
	expect_problem "the file system of /proc/sys/vm does not accept O_DIRECT" "files.buffered" \
		"check: a root without O_DIRECT"
	KVSHIM_FILES_ROOTS=/proc/sys/vm KVSHIM_FILES_BUFFERED=true k check
	expect_rc 0 "check: a root without O_DIRECT, files.buffered"
fi
pass "check: roots empty, relative, missing, not a directory, without O_DIRECT"

# Misspelt environment names, whatever part is wrong, with the nearest known name.
for pair in KVSHIM_FILE_ROOTS:KVSHIM_FILES_ROOTS KVSIHM_CACHE_NAME:KVSHIM_CACHE_NAME \
	kvshim_files_roots:KVSHIM_FILES_ROOTS KVSHIM_ENABLED:KVSHIM_ENABLE \
	KVSHIM_FILES_ROOT:KVSHIM_FILES_ROOTS; do
	bad=${pair%%:*}
	env "$bad=$WORK/store" KVSHIM_FILES_ROOTS="$WORK/store" $T "$KVSHIM" check >"$OUT" 2>"$ERR"
	RC=$?
	expect_problem "environment: $bad" "did you mean ${pair#*:}?" "check: $bad"
done
# A key in the wrong section, in the environment and in the file.
KVSHIM_LOADER_SHARD_SIZE=1M KVSHIM_FILES_ROOTS=$WORK/store k check
expect_problem "KVSHIM_LOADER_SHARD_SIZE: unknown key" "did you mean KVSHIM_CACHE_SHARD_SIZE?" \
	"check: a key in the wrong section (env)"
printf '[files]\nroots = %s\nshard_size = 1M\n' "$WORK/store" >"$WORK/wrong.ini"
k check --config "$WORK/wrong.ini"
expect_problem "$WORK/wrong.ini:3: files.shard_size: unknown key" \
	"did you mean cache.shard_size? (put shard_size under \\[cache\\])" "check: a key in the wrong section (file)"
printf '[file]\nroots = %s\n' "$WORK/store" >"$WORK/wrong.ini"
k check --config "$WORK/wrong.ini"
expect_problem "unknown section \\[file\\]" "did you mean files.roots?" "check: a misspelt section"
KVSHIM_CACHE_CAPACITY=lots KVSHIM_FILES_ROOTS=$WORK/store k check
expect_problem "config: environment: KVSHIM_CACHE_CAPACITY: bad value" "kvshim config --explain" \
	"check: a bad value"
KVSHIM_FILES_ROOTS=$WORK/store KVSHIM_UNRELATED_THING=1 HOME_DIR=x k check
expect_problem "environment: KVSHIM_UNRELATED_THING is not a kvshim variable" "unset it" \
	"check: an unknown KVSHIM_ name"
grep -q HOME_DIR "$ERR" && fail "check blamed a variable that is not ours"
pass "check: misspelt environment names and keys, with the nearest known name"

# Room in /dev/shm, by the rule the region's creator applies (free space less the headroom).
KVSHIM_FILES_ROOTS=$WORK/store KVSHIM_CACHE_CAPACITY=15T k check
expect_problem "cannot build $REGION: No space left on device: cache.capacity 15.0 TiB" \
	"docs/operations.md" "check: a region too large for /dev/shm"
KVSHIM_FILES_ROOTS=$WORK/store KVSHIM_CACHE_SHM_HEADROOM=15T k check
expect_problem "cannot build $REGION: .*cache.shm_headroom keeps 15.0 TiB" "docker --shm-size" \
	"check: the headroom counts"
[ ! -e "$REGION" ] || fail "check built a region"
# An existing region against the configuration: the attacher's mismatch message.
$T "$MKREGION" || fail "mkregion for check"
KVSHIM_FILES_ROOTS=$WORK/store k check
expect_rc 0 "check with a matching region"
grep -qx "ok   region: $REGION matches the configuration" "$OUT" || fail "check: $(cat "$OUT")"
KVSHIM_FILES_ROOTS=$WORK/store KVSHIM_CACHE_SHARD_SIZE=128K k check
expect_problem "region $REGION has shard_size 65536, the configuration wants 131072" \
	"kvshim reset" "check: a region of other dimensions"
KVSHIM_FILES_ROOTS=$WORK/store KVSHIM_CACHE_EVICTION=fifo k check
expect_problem "region $REGION has eviction" "kvshim reset" "check: a region of another eviction"
chmod 0644 "$REGION"
KVSHIM_FILES_ROOTS=$WORK/store k check
expect_problem "refusing $REGION: mode 0644 is wider than cache.mode 0600" "kvshim reset" \
	"check: an untrusted region"
k reset
pass "check: room in /dev/shm (headroom included), an existing region's geometry and trust"

KVSHIM_FILES_ROOTS=$WORK/store KVSHIM_LIBRARY=$WORK/missing.so k check
expect_problem "KVSHIM_LIBRARY=$WORK/missing.so: No such file or directory" "KVSHIM_LIBRARY" \
	"check: a missing library"
pass "check: the library"

# run runs the same checks once: problems, then the command with the shim off, or --strict.
k run -- sh -c 'echo "$LD_PRELOAD/$KVSHIM_ENABLE"'
expect_rc 0 "run with a problem"
[ "$(cat "$OUT")" = "$LIB/0" ] || fail "run with a problem: child saw '$(cat "$OUT")'"
grep -q "^kvshim: problem: files.roots is empty" "$ERR" || fail "run: problem: $(cat "$ERR")"
grep -q "^kvshim: run: 1 problem; starting sh with the shim off (KVSHIM_ENABLE=0)$" "$ERR" ||
	fail "run: $(cat "$ERR")"
[ "$(grep -c '^kvshim: problem' "$ERR")" -eq 1 ] || fail "run printed the problem more than once"
rm -f "$WORK/started"
k run --strict -- touch "$WORK/started"
expect_rc 1 "run --strict with a problem"
[ ! -e "$WORK/started" ] || fail "run --strict started the command"
grep -q "^kvshim: run: 1 problem; not starting touch (--strict)$" "$ERR" || fail "--strict: $(cat "$ERR")"
KVSHIM_FILES_ROOTS=$WORK/store k run --strict -- sh -c 'echo "$LD_PRELOAD/${KVSHIM_ENABLE-unset}"'
expect_rc 0 "run --strict without a problem"
[ "$(cat "$OUT")" = "$LIB/unset" ] || fail "run --strict without a problem: '$(cat "$OUT")'"
[ ! -s "$ERR" ] || fail "run without a problem wrote to stderr: $(cat "$ERR")"
# A configuration that does not load: printed once here; the shim is not even preloaded, so
# that the ranks do not each print it again.
KVSHIM_CACHE_CAPACITY=lots k run -- sh -c 'echo "[$LD_PRELOAD]"'
expect_rc 0 "run with a bad configuration"
[ "$(cat "$OUT")" = "[]" ] || fail "run with a bad configuration preloaded '$(cat "$OUT")'"
grep -q "starting sh with the shim off (not preloaded)" "$ERR" || fail "run: $(cat "$ERR")"
pass "run: problems once, then the shim off; --strict refuses; a bad configuration not preloaded"

# The shim itself says, once and at info, that a configuration with no roots serves nothing.
if [ -n "$SHIMLIB" ]; then
	head -c 200000 /dev/zero >"$WORK/store/blk1"
	KVSHIM_SHIM_LOG=info LD_PRELOAD="${KVS_E2E_PRELOAD:+$KVS_E2E_PRELOAD:}$SHIMLIB" \
		$T dd if="$WORK/store/blk1" of=/dev/null bs=64K status=none 2>"$ERR" ||
		fail "dd under the shim: $(cat "$ERR")"
	[ "$(grep -c '^kvshim: [0-9T:.Z-]* pid [0-9]* info: files.roots is empty: the shim serves nothing$' "$ERR")" -eq 1 ] ||
		fail "the shim does not say once that no roots serve nothing: $(cat "$ERR")"
	pass "the shim logs an empty files.roots once at info"

	# The first info line of an attached process names the version.
	KVSHIM_FILES_ROOTS=$WORK/store KVSHIM_SHIM_LOG=info KVSHIM_LOADER_IO=threads \
		LD_PRELOAD="${KVS_E2E_PRELOAD:+$KVS_E2E_PRELOAD:}$SHIMLIB" \
		$T dd if="$WORK/store/blk1" of=/dev/null bs=64K iflag=direct status=none 2>"$ERR" ||
		fail "dd under the shim: $(cat "$ERR")"
	grep -qx "kvshim: [0-9T:.Z-]* pid [0-9]* info: attached as process [0-9]*, backend threads, kvshim $VERSION" "$ERR" ||
		fail "the attach line does not name the version: $(cat "$ERR")"
	# evict drops every shard of a file the shim has served, and only once (files.settle 0:
	# blk1 was just written, and would otherwise be served but not kept).
	KVSHIM_FILES_ROOTS=$WORK/store KVSHIM_FILES_SETTLE=0 KVSHIM_LOADER_IO=threads \
		LD_PRELOAD="${KVS_E2E_PRELOAD:+$KVS_E2E_PRELOAD:}$SHIMLIB" \
		$T dd if="$WORK/store/blk1" of=/dev/null bs=64K iflag=direct status=none 2>"$ERR" ||
		fail "dd under the shim: $(cat "$ERR")"
	sr() { python3 -c 'import json,sys; print(json.load(sys.stdin)["region"]["slots_ready"])' <"$OUT"; }
	k stat --json
	before=$(sr) || fail "stat --json after a served read: $(cat "$OUT")"
	[ "$before" -ge 1 ] || fail "no slot is ready after a served read: $(cat "$OUT")"
	k evict "$WORK/store/blk1"
	expect_rc 0 "evict"
	[[ "$(cat "$OUT")" =~ ^$WORK/store/blk1:\ ([0-9]+)\ slots\ dropped$ ]] || fail "evict: $(cat "$OUT")"
	dropped=${BASH_REMATCH[1]}
	[ "$dropped" -ge "$before" ] || fail "evict dropped $dropped slots, $before were ready"
	k stat --json
	[ "$(sr)" -eq 0 ] || fail "slots still ready after evict: $(cat "$OUT")"
	k evict "$WORK/store/blk1" "$WORK/nope"
	expect_rc 1 "evict of a missing file"
	grep -qx "$WORK/store/blk1: 0 slots dropped" "$OUT" || fail "evict again: $(cat "$OUT")"
	expect_one_err "kvshim: $WORK/nope: No such file or directory" "evict of a missing file"
	pass "evict: $dropped slots of a served file dropped ($before ready before, 0 after)"

	$T "$KVSHIM" reset --force >/dev/null 2>&1
	pass "the shim's attach line names kvshim $VERSION"
fi

# --- run ---------------------------------------------------------------------------------

# A configuration without problems, so that run starts the command with the shim on.
unset KVSHIM_LIBRARY
export KVSHIM_FILES_ROOTS=$WORK/store

KVSHIM_LIBRARY=$LIB k run -- sh -c 'echo "$LD_PRELOAD"'
expect_rc 0 "run with KVSHIM_LIBRARY"
[ "$(cat "$OUT")" = "$LIB" ] || fail "run: LD_PRELOAD is '$(cat "$OUT")', expected '$LIB'"
# This LD_PRELOAD also applies to kvshim itself: an ASan build would refuse to start with a
# library ahead of its runtime, so its link-order check is turned off (a no-op otherwise).
KVSHIM_LIBRARY=$LIB LD_PRELOAD="/x/a.so /x/b.so:$LIB" \
	ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0 \
	k run -- sh -c 'echo "$LD_PRELOAD"'
[ "$(cat "$OUT")" = "$LIB:/x/a.so:/x/b.so" ] ||
	fail "run: LD_PRELOAD is '$(cat "$OUT")', expected '$LIB:/x/a.so:/x/b.so'"
pass "run: the library first in LD_PRELOAD, earlier entries kept"

KVSHIM_LIBRARY=$LIB k run -- sh -c 'exit 7'
expect_rc 7 "run: exit status of the command"
KVSHIM_LIBRARY=$LIB k run sh -c 'echo "$0 $1"' a b
expect_rc 0 "run without --"
[ "$(cat "$OUT")" = "a b" ] || fail "run: arguments: '$(cat "$OUT")'"
KVSHIM_LIBRARY=$LIB k run -- /nonexistent/kvshim-no-such-command
expect_rc 127 "run of a missing command"
expect_one_err "kvshim: /nonexistent/kvshim-no-such-command: No such file or directory" \
	"run of a missing command"
KVSHIM_LIBRARY=$WORK/missing.so k run -- true
expect_rc 1 "run with a missing KVSHIM_LIBRARY"
expect_one_err "kvshim: KVSHIM_LIBRARY=$WORK/missing.so: " "run with a missing KVSHIM_LIBRARY"
k run
expect_rc 2 "run without a command"
pass "run: exit statuses 7, 127, 1 and 2"

(cd "$WORK" && KVSHIM_LIBRARY=$LIB $T "$KVSHIM" run --config kv.ini -- \
	sh -c 'echo "$KVSHIM_CONFIG"') >"$OUT" 2>"$ERR" || fail "run --config: $(cat "$ERR")"
[ "$(cat "$OUT")" = "$(realpath "$WORK/kv.ini")" ] || fail "run --config: KVSHIM_CONFIG='$(cat "$OUT")'"
KVSHIM_LIBRARY=$LIB k run --config "$WORK/none.ini" -- true
expect_rc 1 "run --config of a missing file"
pass "run --config: KVSHIM_CONFIG absolute"

# The library next to the program, in ../lib and in ../shim, in that order.
mkdir -p "$WORK/tree/bin" "$WORK/tree/lib" "$WORK/tree/shim"
cp "$KVSHIM" "$WORK/tree/bin/kvshim"
cp "$LIB" "$WORK/tree/shim/libkvshim.so"
$T "$WORK/tree/bin/kvshim" run -- sh -c 'echo "$LD_PRELOAD"' >"$OUT" 2>"$ERR"
[ "$(cat "$OUT")" = "$WORK/tree/shim/libkvshim.so" ] || fail "run: ../shim: '$(cat "$OUT")'"
cp "$LIB" "$WORK/tree/lib/libkvshim.so"
$T "$WORK/tree/bin/kvshim" run -- sh -c 'echo "$LD_PRELOAD"' >"$OUT" 2>"$ERR"
[ "$(cat "$OUT")" = "$WORK/tree/lib/libkvshim.so" ] || fail "run: ../lib: '$(cat "$OUT")'"
cp "$LIB" "$WORK/tree/bin/libkvshim.so"
$T "$WORK/tree/bin/kvshim" run -- sh -c 'echo "$LD_PRELOAD"' >"$OUT" 2>"$ERR"
[ "$(cat "$OUT")" = "$WORK/tree/bin/libkvshim.so" ] || fail "run: bin/: '$(cat "$OUT")'"
rm -f "$WORK"/tree/*/libkvshim.so
$T "$WORK/tree/bin/kvshim" run -- true >"$OUT" 2>"$ERR"
RC=$?
expect_rc 1 "run without a library"
expect_one_err "kvshim: cannot find libkvshim.so" "run without a library"
pass "run: library lookup beside the program, ../lib, ../shim; none is an error"

echo "PASS: tools"
