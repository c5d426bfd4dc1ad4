/*
 * kvshim prepare [--config FILE] [--threads N]: create the region if it does not exist and
 * give every slot its memory now, before the engines start.
 *
 * A region's pages otherwise come as loads need them (cache.populate), and the first touch of
 * each fresh page (the kernel zeroing it and, in a virtual machine, the host backing it) then
 * lands inside a cold load's storage reads.  An engine allocates its own buffers at start-up;
 * prepare lets an operator do the same for the cache, as a unit's ExecStartPre or a pod's init
 * step.  The work is kvs_cache_prepare's, on one thread per CPU (--threads N: N): it stops
 * where cache.dir would go below cache.shm_headroom, is idempotent, and leaves data already
 * cached as it is.
 *
 * Attaches for the duration (a process-table slot, KVS_OPEN_CREATE) with cache.populate taken
 * as lazy, so that no background walk of its own starts beside the foreground one.  Exit
 * status 0 when every slot was prepared or the headroom stopped it (said on stderr: the rest
 * comes as loads need it, as without prepare); 1 when the region cannot be opened or made.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "cache_params.h"
#include "cmd_common.h"
#include "config.h"
#include "sys.h"

static const char usage[] =
    "usage: kvshim prepare [--config FILE] [--threads N]\n"
    "  -c, --config FILE  use the INI file FILE (as KVSHIM_CONFIG would name it)\n"
    "  -t, --threads N    clear with N threads (default: one per CPU it may run on)\n"
    "  -h, --help         print this help\n"
    "\n"
    "Creates the region if needed and allocates and clears the memory of all its slots now,\n"
    "so that the first loads do not pay for it.  Stops at cache.shm_headroom.\n";

/* --threads N (--config is tool_parse_cmdline's). */
static int on_opt(void *arg, int opt, const char *optarg)
{
	unsigned *threads = arg;
	char *end;

	*threads = (unsigned)strtoul(optarg, &end, 10);
	if (*end || !*optarg || *threads < 1 || *threads > KVS_PREPARE_THREADS_MAX) {
		tool_err("prepare: --threads takes 1 to %d, not %s", KVS_PREPARE_THREADS_MAX,
			 optarg);
		return KVS_EXIT_USAGE;
	}
	return 0;
}

int cmd_prepare(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"config", required_argument, NULL, 'c'},
	    {"threads", required_argument, NULL, 't'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	unsigned threads = 0;
	const struct tool_cmdline cl = {.cmd = "prepare",
					.usage = usage,
					.optstring = "+:c:t:h",
					.opts = opts,
					.use_config = true,
					.on_opt = on_opt,
					.arg = &threads};
	char msg[KVS_CONFIG_MSG_MAX], human[32];
	struct tool_region region;
	struct kvs_cache_params *params = &region.params;
	const char *path = region.path;
	struct kvs_region_info info;
	struct kvs_counters totals;
	struct kvs_cache *c = NULL;
	struct kvs_config *cfg;
	int r, status = tool_parse_cmdline(&cl, argc, argv);
	uint32_t done;
	uint64_t t0;

	if (status != TOOL_GO_ON)
		return status;
	status = KVS_EXIT_FAIL;
	if (tool_load_config(&cfg))
		return KVS_EXIT_FAIL;
	if (tool_region_of(cfg, &region))
		goto out;
	params->populate = KVS_POPULATE_LAZY; /* the walk is ours, in the foreground */
	r = kvs_cache_open(params, KVS_OPEN_CREATE, &c, msg, sizeof(msg));
	if (r) {
		tool_err("%s", *msg ? msg : strerror(-r));
		c = NULL;
		goto out;
	}
	if (*msg)
		tool_err("%s",
			 msg); /* a region of other dimensions was replaced, as an engine would */
	if (params->keys_only) {
		printf("%s: a region of keys only (shim.mode = observe): no memory to prepare\n",
		       path);
		status = KVS_EXIT_OK;
		goto out;
	}
	t0 = kvs_mono_ns();
	r = kvs_cache_prepare(c, threads, &done);
	if (kvs_cache_stat(c, &info, &totals, NULL, 0) < 0) {
		tool_err("cannot read the region's figures");
		goto out;
	}
	double took = (double)(kvs_mono_ns() - t0) / 1e9;
	printf("%s: %u of %u slots prepared (%s) in %.2f s", path, done, info.slots,
	       tool_human_bytes((uint64_t)done * info.shard_size, human, sizeof(human)), took);
	printf(", %.2f s per GiB, %s pages%s%s\n",
	       done ? took * (double)(1ull << 30) / ((double)done * (double)info.shard_size) : 0.0,
	       tool_human_bytes(info.page_size, human, sizeof(human)),
	       info.page_kind != KVS_PAGE_BASE ? " " : "",
	       info.page_kind != KVS_PAGE_BASE ? kvs_page_kind_word(info.page_kind) : "");
	if (r == -ENOSPC) {
		tool_err("prepare: stopped with %u of %u slots prepared: %s has no more room "
			 "above cache.shm_headroom; the other slots get their memory as loads need "
			 "it",
			 done, info.slots,
			 info.page_kind == KVS_PAGE_HUGETLBFS ? "the huge page pool"
							      : cfg->cache_dir);
	} else if (r) {
		tool_err("prepare: stopped with %u of %u slots prepared: %s", done, info.slots,
			 strerror(-r));
		goto out;
	}
	status = KVS_EXIT_OK;
out:
	kvs_cache_close(c);
	free(cfg);
	return status;
}
