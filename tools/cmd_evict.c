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
	char msg[KVS_CONFIG_MSG_MAX], path[PATH_MAX], name[KVS_CONFIG_STR_MAX + 16];
	struct kvs_cache_params params;
	int opt, r, status = KVS_EXIT_OK;
	struct kvs_cache *c = NULL;
	struct kvs_config *cfg;

	opterr = 0;
	while ((opt = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
		switch (opt) {
		case 'h':
			fputs(usage, stdout);
			return KVS_EXIT_OK;
		default:
			return tool_bad_option("evict", opt, argv, usage);
		}
	}
	if (optind >= argc) {
		tool_err("evict: no file named");
		fputs(usage, stderr);
		return KVS_EXIT_USAGE;
	}
	if (tool_load_config(&cfg))
		return KVS_EXIT_FAIL;
	if (kvs_cache_params_mode(cfg, &params, name, sizeof(name)) ||
	    kvs_cache_path(&params, path, sizeof(path))) {
		tool_err("the region path is too long");
		status = KVS_EXIT_FAIL;
		goto out;
	}
	r = kvs_cache_open(&params, 0, &c, msg, sizeof(msg));
	if (r == -ENOENT) {
		tool_err("no region at %s; nothing is cached", path);
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
