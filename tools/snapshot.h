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
/* The tallies' figures' names and help texts, from cache/tallies.def (kvs_tally_id). */
extern const char *const tool_tally_name[KVS_NTALLY];
extern const char *const tool_tally_help[KVS_NTALLY];

/* One snapshot of a region.  name and path are copies; procs is owned (tool_snapshot_free). */
struct tool_snapshot {
	char name[KVS_CONFIG_STR_MAX + 16]; /* the region's name: cache.name[.observe] */
	char path[PATH_MAX];
	int err;		  /* 0 when read; else -errno (-ENOENT: no region at path) */
	char msg[PATH_MAX + 256]; /* with err (not -ENOENT): one line saying why */
	struct kvs_region_info info;
	struct kvs_counters totals;
	struct kvs_proc_info *procs;
	int nprocs;
	struct kvs_tally_info tallies[KVS_TALLY_PODS + KVS_TALLY_ROOTS]; /* pods, then roots */
	int ntallies;
};

/*
 * Read the region that cfg names (cfg->cache_name; with shim.mode = observe, its region of
 * keys <cache.name>.observe) into s, which is overwritten.  Returns 0,
 * or the -errno also left in s->err: -ENOENT when there is no region, -ENOMEM, or what
 * kvs_cache_open and kvs_cache_stat return, with one line in s->msg.  Free s with
 * tool_snapshot_free whatever it returns.
 */
int tool_snapshot_take(const struct kvs_config *cfg, struct tool_snapshot *s);

/*
 * What a region, a pod or a root did with the engines' reads of KV files, from the counters:
 *   read      bytes the reads asked for (read_bytes);
 *   storage   bytes storage gave for them: serve, the cache's storage reads (backend_bytes;
 *             a tally: its loads and own reads) and the bytes passed through; observe, every
 *             byte (read_bytes);
 *   unique    bytes the cache loaded for them, once for the node while a shard stays
 *             (observe: would have loaded, would_read_bytes);
 *   unserved  bytes passed through (the unserved_*_bytes but mmap's, which maps and reads
 *             nothing yet);
 *   cached    observe: bytes storage would have given with the cache (unique + unserved);
 *             serve: storage;
 *   hit_ratio the share of read the cache gave (1 - cached / read, at least 0), or -1 when
 *             nothing was read; per_unique: storage / unique, or -1 when nothing was loaded.
 */
struct tool_figures {
	bool observe;
	uint64_t read, storage, unique, unserved, cached;
	double hit_ratio, per_unique;
};
void tool_figures_of(const struct tool_snapshot *s, struct tool_figures *f);
void tool_tally_figures(const struct kvs_tally_info *t, bool observe, struct tool_figures *f);

/* The unserved_* counters with their byte counters and what each means, in the order `stat`
 * prints them; tool_unserved[i].bytes is KVS_NCOUNTERS where no bytes are known. */
struct tool_unserved {
	enum kvs_counter_id calls, bytes;
	const char *what; /* "buffered reads (no O_DIRECT, files.buffered = false)" */
};
extern const struct tool_unserved tool_unserved[];
extern const int tool_nunserved;

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
