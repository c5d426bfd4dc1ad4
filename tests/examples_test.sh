#!/usr/bin/env bash
# examples_test.sh - the examples of docs/operations.md ("Examples: a systemd drop-in, a
# container image, a Kubernetes pod") against what the build installs.  No systemd manager,
# Docker or Kubernetes runs here, so each example is checked as far as this machine can:
#
#   systemd   the drop-in, placed where its comment says, beside a stand-in engine unit in a
#             staged root (`cmake --install` with DESTDIR, prefix /usr, as the package does):
#             `systemd-analyze verify --root` accepts it with no complaint; every Exec* program
#             exists in the root; its ExecStartPre, run, passes; and a reader run with its
#             Environment= lines is served by the shim.
#   image     the .deb the Dockerfile copies is the name cpack gives this version; the paths its
#             ENV line names are installed ones, and its KVSHIM_CONFIG is the file it copies.
#   pod       every container mounts a memory emptyDir with a size limit at /dev/shm and the
#             configMap at the folder of KVSHIM_CONFIG; LD_PRELOAD names the installed library
#             (an init container's command, the installed kvshim);
#             every KVSHIM_* value it sets is one `kvshim check` accepts; one UID for all.
#
#   bash examples_test.sh BUILD_DIR OPERATIONS_MD
# Parts whose tool is missing (systemd-analyze, python3-yaml) say so and are skipped.
set -uo pipefail
BUILD=${1:?usage: examples_test.sh BUILD_DIR OPERATIONS_MD}
DOC=${2:?usage: examples_test.sh BUILD_DIR OPERATIONS_MD}
for v in $(compgen -e | grep '^KVSHIM_'); do
	unset "$v"
done
fails=0
ok() { echo "ok   - $*"; }
fail() {
	echo "FAIL - $*"
	fails=$((fails + 1))
}
WORK=$(mktemp -d /var/tmp/kvshim-examples.XXXXXX)
NAME=examples-$$
cleanup() {
	rm -f /dev/shm/kvshim.*."$NAME"
	rm -rf "$WORK"
}
trap cleanup EXIT
R=$WORK/root

# The examples' code blocks, by language: systemd.ini, image.dockerfile, pod.yaml.
python3 - "$DOC" "$WORK" <<'PY' || { echo "FAIL - cannot read the examples of $DOC"; exit 1; }
import re, sys
text = open(sys.argv[1]).read()
sec = text.split("## Examples: a systemd drop-in, a container image, a Kubernetes pod", 1)[1]
sec = sec.split("\n## ", 1)[0]
blocks = re.findall(r"```(\w+)\n(.*?)```", sec, re.S)
names = {"ini": "systemd.ini", "dockerfile": "image.dockerfile", "yaml": "pod.yaml"}
assert sorted(lang for lang, _ in blocks) == sorted(names), [lang for lang, _ in blocks]
for lang, body in blocks:
    open("%s/%s" % (sys.argv[2], names[lang]), "w").write(body)
PY

DESTDIR=$R timeout 60 cmake --install "$BUILD" --prefix /usr >"$WORK/install.log" 2>&1 ||
	{ echo "FAIL - cmake --install: $(cat "$WORK/install.log")"; exit 1; }
VERSION=$(sed -n 's/^project(kvshim VERSION \([0-9.]*\).*/\1/p' "$(dirname "$DOC")/../CMakeLists.txt")
mkdir -p "$WORK/store" "$R/etc/kvshim"
head -c 1048576 /dev/urandom >"$WORK/store/blk"
# The configuration the examples assume, in the staged root, with a region of this test's own.
printf '[files]\nroots = %s\n[cache]\nname = %s\ncapacity = 16M\nshard_size = 64K\n' \
	"$WORK/store" "$NAME" >"$R/etc/kvshim/kvshim.ini"

# in_root PATH: where an absolute path of the examples lies in the staged root.
in_root() { echo "$R$1"; }
served() { # CONFIG: requests served in the region, or 0
	KVSHIM_CONFIG=$1 "$R/usr/bin/kvshim" stat --json 2>/dev/null | python3 -c '
import json, sys
try: print(json.load(sys.stdin)["totals"]["requests"])
except Exception: print(0)'
}

# ---------------------------------------------------------------- systemd
unitdir=$(sed -n 's|^# \(/etc/systemd/system/\([^/]*\)\.service\.d\)/[^/]*\.conf$|\1|p' "$WORK/systemd.ini")
unit=$(basename "${unitdir%.d}")
if [ -z "$unitdir" ]; then
	fail "systemd: the drop-in's first line does not name /etc/systemd/system/UNIT.service.d/NAME.conf"
else
	mkdir -p "$R$unitdir"
	cp "$WORK/systemd.ini" "$R$unitdir/kvshim.conf"
	printf '[Unit]\nDescription=a stand-in engine\nDefaultDependencies=no\n[Service]\nExecStart=/usr/bin/kvshim --version\n' \
		>"$R/etc/systemd/system/$unit"
	missing=""
	for p in $(sed -n 's/^Exec[A-Za-z]*=[-@:+!]*\([^ ]*\).*/\1/p' "$WORK/systemd.ini"); do
		[ -x "$R$p" ] || missing+=" $p"
	done
	[ -z "$missing" ] || fail "systemd: the drop-in runs programs the install lacks:$missing"
	if command -v systemd-analyze >/dev/null; then
		if systemd-analyze verify --root="$R" "$unit" >"$WORK/verify" 2>&1 && [ ! -s "$WORK/verify" ]; then
			ok "systemd: systemd-analyze verify accepts the drop-in for $unit"
		else
			fail "systemd: systemd-analyze verify: $(cat "$WORK/verify")"
		fi
	else
		echo "skip - systemd: no systemd-analyze (apt-get install systemd)"
	fi
	# Its ExecStartPre and its environment, with the root's paths.
	env=()
	while IFS= read -r kv; do
		k=${kv%%=*} v=${kv#*=}
		case $v in /*) v=$(in_root "$v") ;; esac
		# A sanitizer build's runtime must come first (KVS_E2E_PRELOAD, from CTest).
		[ "$k" = LD_PRELOAD ] && [ -n "${KVS_E2E_PRELOAD:-}" ] && v=$KVS_E2E_PRELOAD:$v
		env+=("$k=$v")
	done < <(sed -n 's/^Environment=//p' "$WORK/systemd.ini")
	pre=$(sed -n 's/^ExecStartPre=[-@:+!]*//p' "$WORK/systemd.ini")
	read -r -a argv <<<"$pre"
	for i in "${!argv[@]}"; do
		case ${argv[$i]} in /*) argv[$i]=$(in_root "${argv[$i]}") ;; esac
	done
	if [ ${#argv[@]} -gt 0 ] && timeout 60 "${argv[@]}" >"$WORK/pre" 2>&1; then
		ok "systemd: its ExecStartPre passes ($pre)"
	else
		fail "systemd: ExecStartPre ($pre): $(cat "$WORK/pre")"
	fi
	if env "${env[@]}" timeout 60 dd if="$WORK/store/blk" of=/dev/null bs=1M iflag=direct \
		status=none 2>"$WORK/err" && [ "$(served "$R/etc/kvshim/kvshim.ini")" -ge 1 ]; then
		ok "systemd: a reader with its Environment= lines is served by the installed shim"
	else
		fail "systemd: not served with ${env[*]}: $(cat "$WORK/err")"
	fi
fi

# ---------------------------------------------------------------- image
deb=$(sed -n 's/^COPY \(kvshim_[^ ]*\.deb\) .*/\1/p' "$WORK/image.dockerfile")
arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
if [ "$deb" = "kvshim_${VERSION}_${arch}.deb" ]; then
	ok "image: it copies $deb, the name cpack gives version $VERSION"
else
	fail "image: it copies '$deb', cpack makes kvshim_${VERSION}_${arch}.deb"
fi
conf_dst=$(sed -n 's/^COPY kvshim\.ini \(.*\)$/\1/p' "$WORK/image.dockerfile")
img_env=$(sed -n 's/^ENV //p' "$WORK/image.dockerfile")
bad=""
for kv in $img_env; do
	case $kv in
	LD_PRELOAD=*) [ -s "$(in_root "${kv#*=}")" ] || bad+=" $kv (not installed)" ;;
	KVSHIM_CONFIG=*) [ "${kv#*=}" = "$conf_dst" ] || bad+=" $kv (the image copies kvshim.ini to $conf_dst)" ;;
	esac
done
if [ -z "$bad" ] && grep -q '^ENV .*LD_PRELOAD=' "$WORK/image.dockerfile" && [ -n "$conf_dst" ]; then
	ok "image: ENV names the installed library and the copied configuration"
else
	fail "image:${bad:- no ENV LD_PRELOAD, or no COPY kvshim.ini}"
fi

# ---------------------------------------------------------------- pod
if ! python3 -c 'import yaml' 2>/dev/null; then
	echo "skip - pod: no python3-yaml (apt-get install python3-yaml)"
else
	python3 - "$WORK/pod.yaml" "$R" >"$WORK/pod.out" 2>&1 <<'PY'
import os, sys, yaml
pod = yaml.safe_load(open(sys.argv[1]))
root = sys.argv[2]
spec = pod["spec"]
vols = {v["name"]: v for v in spec["volumes"]}
problems = []
ctx = spec.get("securityContext", {})
if "runAsUser" not in ctx:
    problems.append("no pod-wide runAsUser: ranks of several UIDs get several regions")
inits = spec.get("initContainers", [])
for c in spec["containers"] + inits:
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    mounts = {m["mountPath"]: vols.get(m["name"], {}) for m in c.get("volumeMounts", [])}
    shm = mounts.get("/dev/shm", {}).get("emptyDir")
    if not shm or shm.get("medium") != "Memory" or "sizeLimit" not in shm:
        problems.append("%s: /dev/shm is not a memory emptyDir with a sizeLimit" % c["name"])
    if c in inits:  # kvshim itself (prefetch, prepare): the installed program
        prog = (c.get("command") or [""])[0]
        if not os.path.isfile(root + prog):
            problems.append("%s: its command %r is not installed" % (c["name"], prog))
    else:
        lib = env.get("LD_PRELOAD", "")
        if not os.path.isfile(root + lib):
            problems.append("%s: LD_PRELOAD %r is not installed" % (c["name"], lib))
    cfg = env.get("KVSHIM_CONFIG", "")
    if "configMap" not in mounts.get(os.path.dirname(cfg), {}):
        problems.append("%s: KVSHIM_CONFIG %r is not in a mounted configMap" % (c["name"], cfg))
    for k, v in env.items():
        if k.startswith("KVSHIM_") and k != "KVSHIM_CONFIG":
            print("SET %s=%s" % (k, v))
print("\n".join(problems) or "fine")
PY
	if [ "$(grep -v '^SET ' "$WORK/pod.out")" = fine ]; then
		ok "pod: /dev/shm a memory emptyDir with a limit, the configMap at KVSHIM_CONFIG, one UID, the installed library"
	else
		fail "pod: $(cat "$WORK/pod.out")"
	fi
	sets=$(sed -n 's/^SET //p' "$WORK/pod.out")
	if [ -n "$sets" ] && env $sets KVSHIM_CONFIG="$R/etc/kvshim/kvshim.ini" \
		"$R/usr/bin/kvshim" check >"$WORK/check" 2>&1; then
		ok "pod: kvshim check accepts its settings ($sets)"
	else
		fail "pod: kvshim check with $sets: $(cat "$WORK/check")"
	fi
fi

[ "$fails" -eq 0 ] && echo "PASS: examples" || echo "FAIL: examples ($fails)"
[ "$fails" -eq 0 ]
