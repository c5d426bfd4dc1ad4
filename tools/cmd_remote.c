/*
 * kvshim remote [--config FILE]: the node's remote helper, in the foreground until SIGTERM or
 * SIGINT (docs/operations.md, "Beyond one node"; docs/design.md, "Beyond one node: the remote
 * tier").
 *
 * This command checks the configuration and then replaces itself (execvp, no fork) with
 * remote.python running kvshim_remote.py, which loads libkvshim_remote.so: both are found
 * beside each other, in <this program's directory>/../remote (a build tree) or ../lib/kvshim
 * (an installation), or in KVSHIM_REMOTE_DIR.  The Mooncake client lives in that Python
 * process and nowhere else: engine processes never load it.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd_common.h"
#include "config.h"

static const char usage[] =
    "usage: kvshim remote [--config FILE]\n"
    "\n"
    "Run this node's remote helper in the foreground, until SIGTERM or SIGINT: the one process\n"
    "of the node that holds a Mooncake Store client (remote.kind = mooncake).  The node's\n"
    "processes under the shim ask it for their misses of files.write_once files before they\n"
    "read storage, and offer it the shards they load.  Needs remote.master and remote.host,\n"
    "and remote.python with the mooncake-transfer-engine wheel.\n"
    "\n"
    "  -c, --config FILE   read this configuration file (else KVSHIM_CONFIG, /etc/kvshim)\n"
    "  -h, --help          print this help\n";

/* The directory of kvshim_remote.py and libkvshim_remote.so.  0, or -ENOENT after saying. */
static int find_dir(char *dir)
{
	static const char *const rel[] = {"/../remote", "/../lib/kvshim"};
	const char *env = getenv("KVSHIM_REMOTE_DIR");
	char self[PATH_MAX], cand[PATH_MAX + 64], real[PATH_MAX];
	ssize_t n;

	if (env && *env) {
		snprintf(cand, sizeof(cand), "%s/kvshim_remote.py", env);
		if (tool_usable_file(cand, real) == 0 && realpath(env, dir))
			return 0;
		tool_err("remote: KVSHIM_REMOTE_DIR=%s holds no kvshim_remote.py", env);
		return -ENOENT;
	}
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n < 0) {
		tool_err("remote: /proc/self/exe: %s; set KVSHIM_REMOTE_DIR", strerror(errno));
		return -ENOENT;
	}
	self[n] = 0;
	*strrchr(self, '/') = 0;
	for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
		snprintf(cand, sizeof(cand), "%s%s/kvshim_remote.py", self, rel[i]);
		if (tool_usable_file(cand, real) == 0) {
			*strrchr(real, '/') = 0;
			snprintf(dir, PATH_MAX, "%s", real);
			return 0;
		}
	}
	tool_err("remote: no kvshim_remote.py in %s/../remote or %s/../lib/kvshim; set "
		 "KVSHIM_REMOTE_DIR",
		 self, self);
	return -ENOENT;
}

int cmd_remote(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"config", required_argument, NULL, 'c'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	const struct tool_cmdline cl = {.cmd = "remote",
					.usage = usage,
					.optstring = "+:c:h",
					.opts = opts,
					.use_config = true};
	char dir[PATH_MAX], script[PATH_MAX + 32], lib[PATH_MAX + 32];
	struct kvs_config *cfg = NULL;
	int status = tool_parse_cmdline(&cl, argc, argv);

	if (status != TOOL_GO_ON)
		return status;
	if (tool_load_config(&cfg))
		return KVS_EXIT_FAIL;
	status = KVS_EXIT_FAIL;
	if (cfg->remote_kind == KVS_REMOTE_NONE) {
		tool_err("remote: remote.kind is none: set it to mooncake (and remote.master, "
			 "remote.host) to run a helper");
		goto out;
	}
	if (!cfg->remote_master[0] || !cfg->remote_host[0]) {
		tool_err("remote: remote.%s is not set", cfg->remote_master[0] ? "host" : "master");
		goto out;
	}
	if (!cfg->files_write_once[0])
		tool_err("remote: files.write_once is empty: only files of write-once roots are "
			 "shared between nodes, so this helper will have nothing to do");
	if (find_dir(dir))
		goto out;
	snprintf(script, sizeof(script), "%s/kvshim_remote.py", dir);
	snprintf(lib, sizeof(lib), "%s/libkvshim_remote.so", dir);
	fflush(NULL);
	char *args[] = {cfg->remote_python, script, lib, NULL};
	execvp(cfg->remote_python, args);
	tool_err("remote: cannot run remote.python (%s): %s", cfg->remote_python, strerror(errno));
out:
	free(cfg);
	return status;
}
