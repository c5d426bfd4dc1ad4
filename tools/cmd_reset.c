/*
 * kvshim reset [--force]: remove the region the configuration names (docs/design.md, "Where
 * and how it is published").
 *
 * Processes attached to it hold a liveness lock on its file; reset refuses while any does,
 * unless --force.  Forced or not, unlinking leaves existing mappings intact: processes still
 * attached keep using the old region until they detach, and the next process to attach builds
 * a fresh one.
 *
 * Whatever is at the path, reset never blocks on it and says what it is.  It looks with lstat
 * first.  Our own region is opened with kvs_cache_open_file (no link followed, no blocking)
 * to count the processes attached.  Anything the shim would refuse (another user's file, a
 * FIFO, a link, a file with a second name or a mode wider than cache.mode) has nobody of ours
 * attached, since no process of ours maps it: reset says what it is and whose, and removes it
 * if the caller may (in sticky /dev/shm: its owner, or root); else it says why not and what to
 * do, and exits 1.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache.h"
#include "cmd_common.h"
#include "cache_params.h"
#include "config.h"

static const char usage[] =
    "usage: kvshim reset [--force]\n"
    "  -f, --force  remove the region even while processes are attached to it\n"
    "  -h, --help   print this help\n";

/* Remove the half-built regions that creators which died left behind: "<path>.tmp.<pid>.<n>"
 * (older builds) and "<path>.build.<pid>.<random>" (where /dev/shm has no O_TMPFILE) whose pid
 * no longer exists.  A live creator's file is left alone. */
static void remove_stale_builds(const char *path)
{
	static const char *const infix[] = {".tmp.", ".build."};
	const char *base = strrchr(path, '/') + 1;
	char dir[PATH_MAX], prefix[NAME_MAX + 8], victim[PATH_MAX + NAME_MAX + 2];
	struct dirent *e;
	DIR *d;

	snprintf(dir, sizeof(dir), "%.*s", (int)(base - path), path);
	d = opendir(dir);
	if (!d)
		return;
	while ((e = readdir(d))) {
		for (size_t k = 0; k < sizeof(infix) / sizeof(infix[0]); k++) {
			snprintf(prefix, sizeof(prefix), "%s%s", base, infix[k]);
			if (strncmp(e->d_name, prefix, strlen(prefix)))
				continue;
			long pid = strtol(e->d_name + strlen(prefix), NULL, 10);
			if (pid <= 0 || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
				continue;
			snprintf(victim, sizeof(victim), "%s%s", dir, e->d_name);
			if (unlink(victim) == 0)
				printf("removed %s (left by a creator that died)\n", victim);
		}
	}
	closedir(d);
}

/* Remove an object at path that the shim would not use (why says what it is); returns an
 * exit status. */
static int remove_untrusted(const char *path, const struct stat *st, const char *why)
{
	if (unlink(path) == 0) {
		printf("removed %s (it %s; the shim would not use it)\n", path, why);
		return KVS_EXIT_OK;
	}
	if (errno == ENOENT) {
		tool_err("no region at %s", path);
		return KVS_EXIT_OK;
	}
	if ((errno == EPERM || errno == EACCES) && st->st_uid != geteuid())
		tool_err("cannot remove %s: it %s, and in sticky /dev/shm only uid %u or root may "
			 "remove it; ask them (or run `sudo kvshim reset`), or set another "
			 "cache.name",
			 path, why, (unsigned)st->st_uid);
	else
		tool_err("cannot remove %s (it %s): %s", path, why, strerror(errno));
	return KVS_EXIT_FAIL;
}

/* Remove the region at path unless live processes hold it (or force); returns an exit status. */
static int reset(const char *path, uint32_t mode, bool force)
{
	char why[96], msg[PATH_MAX + 128], self[32];
	struct stat st;
	int fd, n;

	remove_stale_builds(path);
	if (tool_said_path(path, msg, sizeof(msg)) == 0)
		unlink(msg); /* the warnings the launcher said: said again for a new region */
	if (lstat(path, &st) < 0) {
		if (errno == ENOENT) {
			tool_err("no region at %s", path);
			return KVS_EXIT_OK;
		}
		tool_err("%s: %s", path, strerror(errno));
		return KVS_EXIT_FAIL;
	}
	if (kvs_cache_distrust(&st, mode, why, sizeof(why)))
		return remove_untrusted(path, &st, why);
	fd = kvs_cache_open_file(path, O_RDONLY, mode, msg, sizeof(msg));
	if (fd == -ENOENT) {
		tool_err("no region at %s", path);
		return KVS_EXIT_OK;
	}
	if (fd < 0) {
		/* Replaced since lstat: look again, once, at what is there now. */
		if (fd == -EPERM && lstat(path, &st) == 0 &&
		    kvs_cache_distrust(&st, mode, why, sizeof(why)))
			return remove_untrusted(path, &st, why);
		tool_err("%s", msg);
		return KVS_EXIT_FAIL;
	}
	/* Count through the descriptor just checked, not the name, which may change. */
	snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
	n = kvs_cache_live_processes(self);
	close(fd);
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

/* --force, the only option but --help. */
static int on_opt(void *arg, int opt, const char *optarg)
{
	*(bool *)arg = true;
	return 0;
}

int cmd_reset(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"force", no_argument, NULL, 'f'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	bool force = false;
	const struct tool_cmdline cl = {.cmd = "reset",
					.usage = usage,
					.optstring = "+:fh",
					.opts = opts,
					.on_opt = on_opt,
					.arg = &force};
	struct tool_region mine, other;
	struct kvs_config *cfg;
	uint32_t mode;
	int r = tool_parse_cmdline(&cl, argc, argv);

	if (r != TOOL_GO_ON)
		return r;
	if (tool_load_config(&cfg))
		return KVS_EXIT_FAIL;
	/* The region of shim.mode, then the other mode's if there is one: a node switched from
	 * observe to serve (or back) is reset whole. */
	r = tool_region_of(cfg, &mine);
	cfg->shim_mode = cfg->shim_mode == KVS_MODE_OBSERVE ? KVS_MODE_SERVE : KVS_MODE_OBSERVE;
	if (!r)
		r = tool_region_of(cfg, &other);
	mode = (uint32_t)cfg->cache_mode;
	free(cfg);
	if (r)
		return KVS_EXIT_FAIL;
	int status = reset(mine.path, mode, force);
	struct stat st;
	if (lstat(other.path, &st) == 0) {
		int st2 = reset(other.path, mode, force);

		status = status ? status : st2;
	}
	return status;
}
