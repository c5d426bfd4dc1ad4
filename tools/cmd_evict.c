/*
 * kvshim evict PATH...: drop the cached shards of files.
 *
 * A file's shards are cached under its block id (cache.h, struct kvs_ident): by change
 * (device, inode, size, mtime, ctime) or, on a files.write_once root, by birth (device, inode,
 * size, birth time, generation).  evict removes every shard of both ids that the file has
 * now, the whole shard range, with kvs_cache_invalidate.  A shard pinned at that moment is unhashed
 * now and freed by its last release.  A file changed since it was read has another id already,
 * and its old shards age out; evict cannot name them.
 *
 * Invalidation claims the slots it frees in this process's name, so evict attaches to the
 * region (a process-table slot for the duration, no KVS_OPEN_CREATE) rather than watching it.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
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

static const char usage[] = "usage: kvshim evict PATH...\n"
			    "  drop the cached shards of each file PATH\n"
			    "  -h, --help  print this help\n";

/* The block ids of the file at path, as the shim computes them: by change, and by birth when
 * its file system gives one (*nkeys 2, else 1); 0 or -errno. */
static int blocks_of(const char *path, struct kvs_key key[2], int *nkeys)
{
	struct kvs_ident id;
	int fd, r = 0;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return -errno;
	r = kvs_ident_of_fd(fd, true, &id);
	if (!r && !S_ISREG(id.mode))
		r = -EINVAL;
	if (!r) {
		*nkeys = 1;
		if (id.write_once)
			kvs_ident_key(&id, &key[(*nkeys)++]);
		id.write_once = false;
		kvs_ident_key(&id, &key[0]);
	}
	close(fd);
	return r;
}

int cmd_evict(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	const struct tool_cmdline cl = {.cmd = "evict",
					.usage = usage,
					.optstring = "+:h",
					.opts = opts,
					.need = "no file named"};
	char msg[KVS_CONFIG_MSG_MAX];
	struct tool_region region;
	int r, status = tool_parse_cmdline(&cl, argc, argv);
	struct kvs_cache *c = NULL;
	struct kvs_config *cfg;

	if (status != TOOL_GO_ON)
		return status;
	status = KVS_EXIT_OK;
	if (tool_load_config(&cfg))
		return KVS_EXIT_FAIL;
	if (tool_region_of(cfg, &region)) {
		status = KVS_EXIT_FAIL;
		goto out;
	}
	r = kvs_cache_open(&region.params, 0, &c, msg, sizeof(msg));
	if (r == -ENOENT) {
		tool_err("no region at %s; nothing is cached", region.path);
		c = NULL;
	} else if (r) {
		tool_err("%s", *msg ? msg : strerror(-r));
		status = KVS_EXIT_FAIL;
		goto out;
	}
	for (int i = optind; i < argc; i++) {
		struct kvs_key key[2];
		int nkeys = 0, dropped = 0;

		r = blocks_of(argv[i], key, &nkeys);
		if (r) {
			tool_err("%s: %s", argv[i],
				 r == -EINVAL ? "not a regular file" : strerror(-r));
			status = KVS_EXIT_FAIL;
			continue;
		}
		if (!c) {
			printf("%s: 0 slots dropped\n", argv[i]);
			continue;
		}
		for (int k = 0; k < nkeys && r >= 0; k++) {
			r = kvs_cache_invalidate(c, &key[k], 0, UINT64_MAX);
			dropped += r > 0 ? r : 0;
		}
		if (r < 0) {
			tool_err("%s: %s (some of its shards may remain)", argv[i], strerror(-r));
			status = KVS_EXIT_FAIL;
			continue;
		}
		printf("%s: %d slots dropped\n", argv[i], dropped);
	}
out:
	kvs_cache_close(c);
	free(cfg);
	return status;
}
