/*
 * kvshim ls [--all] [--json]: the regions in cache.dir (/dev/shm by default), one line each.
 *
 * Lists this user's objects kvshim.<euid>.* (with --all, or as root, every kvshim.*): name,
 * size, age, live processes attached and state.  Each is looked at with kvs_cache_peek, which
 * opens only what an attacher would trust (kvs_cache_open_file: no link followed, never
 * blocking on a FIFO or device) and reads the header and the liveness locks without waiting:
 * ls never blocks and never writes.  States: ok; mismatched layout (a region of another
 * layout version); not a region; foreign owner (another uid: not opened); untrusted (ours,
 * but with a second link or a mode wider than cache.mode).  Leftovers of creators that died
 * ("<region>.build.<pid>.<hex>") are listed like anything else (`kvshim reset` removes them).
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "cmd_common.h"
#include "config.h"
#include "textout.h"

static const char usage[] = "usage: kvshim ls [--all] [--json]\n"
			    "  -a, --all   every kvshim region, not only this user's\n"
			    "  -j, --json  print one JSON object\n"
			    "  -h, --help  print this help\n";

static const char *const state_word[] = {
    [KVS_PEEK_OK] = "ok",
    [KVS_PEEK_LAYOUT] = "mismatched layout",
    [KVS_PEEK_NOT_REGION] = "not a region",
    [KVS_PEEK_FOREIGN] = "foreign owner",
    [KVS_PEEK_UNTRUSTED] = "untrusted",
};

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Format seconds as a short age ("45s", "12m", "3h", "2d"). */
static const char *age_text(uint64_t s, char *buf, size_t len)
{
	if (s < 120)
		snprintf(buf, len, "%" PRIu64 "s", s);
	else if (s < 7200)
		snprintf(buf, len, "%" PRIu64 "m", s / 60);
	else if (s < 172800)
		snprintf(buf, len, "%" PRIu64 "h", s / 3600);
	else
		snprintf(buf, len, "%" PRIu64 "d", s / 86400);
	return buf;
}

/* Print one object: name is its file name in cache.dir, path its path. */
static void print_one(const char *name, const char *path, const struct kvs_peek *p, uint64_t now_ns,
		      bool json, bool first)
{
	uint64_t age = now_ns > p->created_ns ? (now_ns - p->created_ns) / 1000000000ull : 0;
	char a[32], b[32], live[16];

	if (!json) {
		snprintf(live, sizeof(live), p->live < 0 ? "-" : "%d", p->live);
		printf("%-32s %10s %6s %5s  %s", name, tool_human_bytes(p->size, a, sizeof(a)),
		       age_text(age, b, sizeof(b)), live, state_word[p->state]);
		if (p->state == KVS_PEEK_OK)
			printf(" (kvshim %s, %" PRIu64 " refused attaches)", p->built_by,
			       p->refused_attaches);
		else
			printf(" (%s)", p->why);
		putchar('\n');
		return;
	}
	printf("%s{\"name\":", first ? "" : ",");
	tool_json_string(stdout, name);
	printf(",\"path\":");
	tool_json_string(stdout, path);
	printf(",\"uid\":%" PRIu32 ",\"size_bytes\":%" PRIu64 ",\"age_seconds\":%" PRIu64
	       ",\"processes_attached\":%d,\"state\":",
	       p->uid, p->size, age, p->live);
	tool_json_string(stdout, state_word[p->state]);
	printf(",\"why\":");
	tool_json_string(stdout, p->state == KVS_PEEK_OK ? "" : p->why);
	printf(",\"built_by\":");
	tool_json_string(stdout, p->built_by);
	printf(",\"refused_attaches\":%" PRIu64 ",\"capacity_bytes\":%" PRIu64
	       ",\"shard_size\":%" PRIu64 ",\"slots\":%" PRIu32 "}",
	       p->refused_attaches, p->capacity_bytes, p->shard_size, p->slots);
}

/* List the objects of dir whose names start with prefix; returns an exit status. */
static int list(const char *dir, const char *prefix, uint32_t mode, bool json)
{
	size_t n = 0, cap = 0, plen = strlen(prefix);
	char **names = NULL, path[PATH_MAX];
	int status = KVS_EXIT_OK, shown = 0;
	struct timespec now;
	struct dirent *e;
	DIR *d;

	d = opendir(dir);
	if (!d) {
		tool_err("cannot read %s: %s", dir, strerror(errno));
		return KVS_EXIT_FAIL;
	}
	while ((e = readdir(d))) {
		if (strncmp(e->d_name, prefix, plen))
			continue;
		if (n == cap) {
			char **more = realloc(names, (cap = cap ? 2 * cap : 16) * sizeof(*names));

			if (!more)
				break;
			names = more;
		}
		if (!(names[n] = strdup(e->d_name)))
			break;
		n++;
	}
	closedir(d);
	if (n)
		qsort(names, n, sizeof(*names), by_name);
	clock_gettime(CLOCK_REALTIME, &now);
	if (json)
		fputs("{\"regions\":[", stdout);
	else
		printf("%-32s %10s %6s %5s  %s\n", "NAME", "SIZE", "AGE", "LIVE", "STATE");
	for (size_t i = 0; i < n; i++) {
		struct kvs_peek p;
		int r;

		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		r = kvs_cache_peek(path, mode, &p);
		if (r == -ENOENT)
			continue; /* removed since readdir */
		if (r) {
			tool_err("%s: %s", path, strerror(-r));
			status = KVS_EXIT_FAIL;
			continue;
		}
		print_one(names[i], path, &p,
			  (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec, json,
			  !shown++);
	}
	if (json)
		fputs("]}\n", stdout);
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	return status;
}

struct ls_opts {
	bool all, json;
};

static int on_opt(void *arg, int opt, const char *optarg)
{
	struct ls_opts *o = arg;

	if (opt == 'a')
		o->all = true;
	else
		o->json = true;
	return 0;
}

int cmd_ls(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"all", no_argument, NULL, 'a'},
	    {"json", no_argument, NULL, 'j'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct ls_opts o = {0};
	const struct tool_cmdline cl = {.cmd = "ls",
					.usage = usage,
					.optstring = "+:ajh",
					.opts = opts,
					.on_opt = on_opt,
					.arg = &o};
	struct kvs_config *cfg;
	char prefix[64], dir[KVS_CACHE_DIR_MAX + 1];
	uint32_t mode;
	int r = tool_parse_cmdline(&cl, argc, argv);

	if (r != TOOL_GO_ON)
		return r;
	/* cache.mode decides what is trusted, as for an attacher of this configuration. */
	if (tool_load_config(&cfg))
		return KVS_EXIT_FAIL;
	mode = (uint32_t)cfg->cache_mode;
	snprintf(dir, sizeof(dir), "%.*s", KVS_CACHE_DIR_MAX, cfg->cache_dir);
	for (size_t n = strlen(dir); n > 1 && dir[n - 1] == '/'; n--)
		dir[n - 1] = '\0';
	free(cfg);
	if (o.all || geteuid() == 0)
		snprintf(prefix, sizeof(prefix), "kvshim.");
	else
		snprintf(prefix, sizeof(prefix), "kvshim.%u.", (unsigned)geteuid());
	return list(dir, prefix, mode, o.json);
}
