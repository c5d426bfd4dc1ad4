/*
 * kvshim reset [--force]: remove the region the configuration names (design.md §5).
 *
 * Processes attached to it hold a liveness lock on its file; reset refuses while any does,
 * unless --force.  Forced or not, unlinking leaves existing mappings intact: processes still
 * attached keep using the old region until they detach, and the next process to attach builds
 * a fresh one.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "cmd_common.h"
#include "config.h"

static const char usage[] =
    "usage: kvshim reset [--force]\n"
    "  -f, --force  remove the region even while processes are attached to it\n"
    "  -h, --help   print this help\n";

/* Remove the half-built regions that creators which died left behind: "<path>.tmp.<pid>.<n>"
 * whose pid no longer exists.  A live creator's file is left alone. */
static void remove_stale_builds(const char *path)
{
	const char *base = strrchr(path, '/') + 1;
	char dir[PATH_MAX], prefix[NAME_MAX + 8], victim[PATH_MAX + NAME_MAX + 2];
	struct dirent *e;
	DIR *d;

	snprintf(dir, sizeof(dir), "%.*s", (int)(base - path), path);
	snprintf(prefix, sizeof(prefix), "%s.tmp.", base);
	d = opendir(dir);
	if (!d)
		return;
	while ((e = readdir(d))) {
		if (strncmp(e->d_name, prefix, strlen(prefix)))
			continue;
		long pid = strtol(e->d_name + strlen(prefix), NULL, 10);
		if (pid <= 0 || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;
		snprintf(victim, sizeof(victim), "%s%s", dir, e->d_name);
		if (unlink(victim) == 0)
			printf("removed %s (left by a creator that died)\n", victim);
	}
	closedir(d);
}

/* Remove the region at path unless live processes hold it (or force); returns an exit status. */
static int reset(const char *path, bool force)
{
	int n = kvs_cache_live_processes(path);

	remove_stale_builds(path);
	if (n == -ENOENT) {
		tool_err("no region at %s", path);
		return KVS_EXIT_OK;
	}
	if (n < 0) {
		tool_err("%s: %s", path, strerror(-n));
		return KVS_EXIT_FAIL;
	}
	if (n > 0 && !force) {
		tool_err("%d processes are attached to %s; use --force", n, path);
		return KVS_EXIT_FAIL;
	}
	if (unlink(path) < 0) {
		if (errno == ENOENT) {
			tool_err("no region at %s", path);
			return KVS_EXIT_OK;
		}
		tool_err("cannot remove %s: %s", path, strerror(errno));
		return KVS_EXIT_FAIL;
	}
	if (n > 0)
		tool_err("%d processes were attached to %s; they keep the old region until they "
			 "detach",
			 n, path);
	printf("removed %s\n", path);
	return KVS_EXIT_OK;
}

int cmd_reset(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"force", no_argument, NULL, 'f'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct kvs_config *cfg;
	char path[PATH_MAX];
	bool force = false;
	int opt, r;

	opterr = 0;
	while ((opt = getopt_long(argc, argv, "+:fh", opts, NULL)) != -1) {
		switch (opt) {
		case 'f':
			force = true;
			break;
		case 'h':
			fputs(usage, stdout);
			return KVS_EXIT_OK;
		default:
			return tool_bad_option("reset", opt, argv, usage);
		}
	}
	if (optind < argc) {
		tool_err("reset: unexpected argument %s", argv[optind]);
		fputs(usage, stderr);
		return KVS_EXIT_USAGE;
	}
	if (tool_load_config(&cfg))
		return KVS_EXIT_FAIL;
	r = kvs_cache_path(cfg, path, sizeof(path));
	free(cfg);
	if (r) {
		tool_err("the region path is too long");
		return KVS_EXIT_FAIL;
	}
	return reset(path, force);
}
