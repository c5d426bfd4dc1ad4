/*
 * One reading of a region's figures, shared by `kvshim stat` and `kvshim exporter`, and the
 * Prometheus text that both print from it.
 *
 * A snapshot maps the region as a watcher (KVS_OPEN_WATCH: the control plane only, no
 * process-table slot, no liveness lock, locks taken with the watcher's short timeout), reads
 * it with kvs_cache_stat and unmaps it again, so nothing is held between two snapshots.
 */
#ifndef KVS_TOOLS_SNAPSHOT_H
#define KVS_TOOLS_SNAPSHOT_H

#include <limits.h>
#include <stdio.h>

#include "cache.h"
#include "config.h"

/* The counters' names and help texts, from cache/counters.def, indexed by kvs_counter_id. */
extern const char *const tool_ctr_name[KVS_NCOUNTERS];
extern const char *const tool_ctr_help[KVS_NCOUNTERS];

/* One snapshot of a region.  name and path are copies; procs is owned (tool_snapshot_free). */
struct tool_snapshot {
	char name[KVS_CONFIG_STR_MAX]; /* cache.name of the region */
	char path[PATH_MAX];
	int err;		  /* 0 when read; else -errno (-ENOENT: no region at path) */
	char msg[PATH_MAX + 256]; /* with err (not -ENOENT): one line saying why */
	struct kvs_region_info info;
	struct kvs_counters totals;
	struct kvs_proc_info *procs;
	int nprocs;
};

/*
 * Read the region that cfg names (cfg->cache_name) into s, which is overwritten.  Returns 0,
 * or the -errno also left in s->err: -ENOENT when there is no region, -ENOMEM, or what
 * kvs_cache_open and kvs_cache_stat return, with one line in s->msg.  Free s with
 * tool_snapshot_free whatever it returns.
 */
int tool_snapshot_take(const struct kvs_config *cfg, struct tool_snapshot *s);

/* Free what tool_snapshot_take allocated in s (not s itself).  Safe on a zeroed s. */
void tool_snapshot_free(struct tool_snapshot *s);

/*
 * The names of the regions of this effective uid in dir, the configuration's cache.dir
 * (dir/kvshim.<euid>.<name>), sorted, without the leftovers of creators that died
 * (NAME.tmp.<pid>.<n>, NAME.build.<pid>.<hex>).  *names is a heap array of heap strings
 * (tool_names_free); returns their number, or -errno.
 */
int tool_list_regions(const char *dir, char ***names);
void tool_names_free(char **names, int n);

/* True when s is a name the configuration accepts for cache.name (A-Z a-z 0-9 . _ -). */
int tool_region_name_ok(const char *s);

/*
 * Print snapshots s[0..n) as Prometheus text exposition (format 0.0.4) that promtool accepts:
 * base units, HELP and TYPE once per family however many regions, every series but
 * kvshim_build_info labelled with its region, no pid labels.  kvshim_up{region} is 1 for a
 * snapshot that was read and 0 for one that was not (err != 0); the other families show the
 * regions that were read.  Returns 0, or -EIO when f has an error.
 */
int tool_prom_write(FILE *f, const struct tool_snapshot *s, int n);

#endif
