# Shared by the tests that run programs under LD_PRELOAD (e2e_test.sh, hostile_test.sh):
# source it with LIBKVSHIM and KVSHIM as $1 and $2 and PREFIX naming the test.  It sets lib
# (with a sanitizer runtime first when KVS_E2E_PRELOAD names one), kvshim, work (a scratch
# folder under /var/tmp, where O_DIRECT works) and name (a region of this run's own), removes
# both at exit, and defines ok/fail, which count into fails.
lib=${KVS_E2E_PRELOAD:+$KVS_E2E_PRELOAD:}$1
kvshim=$2
fails=0
work=$(mktemp -d "/var/tmp/kvshim-$PREFIX.XXXXXX")
name="$PREFIX-$$"
cleanup() {
	KVSHIM_CONFIG= KVSHIM_CACHE_NAME=$name "$kvshim" reset --force >/dev/null 2>&1
	rm -rf "$work"
}
trap cleanup EXIT
ok() { echo "ok   - $*"; }
fail() {
	echo "FAIL - $*"
	fails=$((fails + 1))
}
