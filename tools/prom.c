/*
 * Prometheus text exposition (format 0.0.4) of region snapshots (snapshot.h), for
 * `kvshim stat --prom` (one region) and `kvshim exporter` (every region of the user).
 *
 * The text groups samples by family, as the format requires: each family's HELP and TYPE
 * come once, followed by that family's series for every region.  Units are base units
 * (bytes, seconds).  Series of one process are labelled with its rank, never its pid (a pid
 * makes new series at every restart).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "snapshot.h"
#include "textout.h"
#include "value.h"

/* One region gauge: kvshim_region_<name>, its help, and its value for one region. */
struct gauge {
	const char *name, *help;
	uint64_t v;
};

#define NGAUGES 18

/* Fill g with the gauges of i, always in the same order (name, help and value side by side,
 * so that they cannot drift apart). */
static void gauges_of(const struct kvs_region_info *i, struct gauge g[NGAUGES])
{
	const struct gauge all[NGAUGES] = {
	    {"capacity_bytes", "bytes of data frames", i->capacity_bytes},
	    {"shard_size_bytes", "bytes per frame (the most one slot holds)", i->shard_size},
	    {"slots", "data frames of shard_size bytes (one whole slot each, or several packed)",
	     i->slots},
	    {"reserved_slots", "slots kept for loads and prefetch", i->reserved_slots},
	    {"slots_ready", "slots holding a loaded shard", i->slots_ready},
	    {"bytes_ready", "valid bytes of the slots holding a loaded shard", i->bytes_ready},
	    {"slots_loading", "slots being loaded", i->slots_loading},
	    {"slots_failed", "slots whose load failed", i->slots_failed},
	    {"slots_pinned", "slots pinned by at least one process", i->slots_pinned},
	    {"slots_claimed",
	     "slots taken by a process and in no chain: being allocated, or staged by a writer",
	     i->slots_claimed},
	    {"processes_attached", "live processes attached to the region", i->processes_attached},
	    {"max_processes", "slots in the process table", i->max_processes},
	    {"slots_populated", "frames whose pages are allocated", i->slots_populated},
	    {"populate_errno", "errno that stopped the eager walk, or 0",
	     (uint64_t)(uint32_t)i->populate_err},
	    {"shm_free_bytes",
	     "free bytes of the file system holding the region (of its huge page pool on "
	     "hugetlbfs)",
	     i->shm_free_bytes},
	    {"page_size_bytes", "bytes of the region's pages: 4096, or a huge page's",
	     i->page_size},
	    {"procs_unlocked",
	     "1 when proc_lock was stuck and the process figures were read without it",
	     i->procs_unlocked},
	    {"keys_only",
	     "1 for a region of keys without data (shim.mode = observe: what the cache would "
	     "have done)",
	     i->keys_only},
	};

	memcpy(g, all, sizeof(all));
}

/* Print "{region=NAME" (the brace left open for more labels). */
static void open_region(FILE *f, const struct tool_snapshot *s)
{
	fputs("{region=", f);
	tool_prom_label(f, s->name);
}

/* True when counter k is in nanoseconds (its name ends in _ns). */
static bool in_ns(int k)
{
	size_t n = strlen(tool_ctr_name[k]);

	return n > 3 && !strcmp(tool_ctr_name[k] + n - 3, "_ns");
}

/* A counter's family: kvshim_<prefix><name>_total in base units, so a counter in nanoseconds
 * (name ending in _ns) becomes kvshim_<prefix><name less _ns>_seconds_total. */
static void family_of(char *buf, size_t len, int k, const char *prefix)
{
	const char *name = tool_ctr_name[k];

	if (in_ns(k))
		snprintf(buf, len, "kvshim_%s%.*s_seconds_total", prefix, (int)(strlen(name) - 3),
			 name);
	else
		snprintf(buf, len, "kvshim_%s%s_total", prefix, name);
}

/* Print counter k's value v in the family's unit, and the newline. */
static void value(FILE *f, int k, uint64_t v)
{
	if (in_ns(k))
		fprintf(f, " %" PRIu64 ".%09" PRIu64 "\n", v / 1000000000u, v % 1000000000u);
	else
		fprintf(f, " %" PRIu64 "\n", v);
}

/* Print the HELP and TYPE of counter k's family ("nanoseconds ..." becomes "seconds ..."). */
static void counter_head(FILE *f, const char *family, int k, const char *what)
{
	const char *h = tool_ctr_help[k];

	if (!strncmp(h, "nanoseconds", 11))
		fprintf(f, "# HELP %s seconds%s %s\n", family, h + 11, what);
	else
		fprintf(f, "# HELP %s %s %s\n", family, h, what);
	fprintf(f, "# TYPE %s counter\n", family);
}

/* The sum of counter k over the live processes of s with rank rank. */
static uint64_t rank_sum(const struct tool_snapshot *s, int32_t rank, int k)
{
	uint64_t v = 0;

	for (int q = 0; q < s->nprocs; q++)
		if (s->procs[q].alive && s->procs[q].rank == rank)
			v += s->procs[q].ctr.v[k];
	return v;
}

/* True when process p of s is the first live process of its rank (the one that prints the
 * rank's sum). */
static bool first_of_rank(const struct tool_snapshot *s, int p)
{
	const struct kvs_proc_info *pp = &s->procs[p];

	if (!pp->alive || pp->rank < 0)
		return false;
	for (int q = 0; q < p; q++)
		if (s->procs[q].alive && s->procs[q].rank == pp->rank)
			return false;
	return true;
}

/* Print a ratio gauge's value (the caller left it out when there is none). */
static void ratio_value(FILE *f, double v)
{
	fprintf(f, " %.6f\n", v);
}

/* The region's derived figures (snapshot.h, struct tool_figures): the hit ratio and storage
 * bytes per unique byte, for each region that has one. */
static void write_figures(FILE *f, const struct tool_snapshot *s, int n)
{
	static const char *const fam[2] = {"kvshim_hit_ratio",
					   "kvshim_storage_bytes_per_unique_byte"};
	static const char *const help[2] = {
	    "share of the bytes the engines read of KV files that the cache gave (observe: "
	    "would have given), 1 - storage / read",
	    "bytes read from storage for each byte the cache loaded (observe: would have "
	    "loaded): about 1 when the cache works, the number of readers of each byte without "
	    "it"};

	for (int g = 0; g < 2; g++) {
		bool head = false;

		for (int r = 0; r < n; r++) {
			struct tool_figures fg;

			if (s[r].err)
				continue;
			tool_figures_of(&s[r], &fg);
			double v = g ? fg.per_unique : fg.hit_ratio;
			if (v < 0)
				continue;
			if (!head)
				fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", fam[g], help[g],
					fam[g]);
			head = true;
			fputs(fam[g], f);
			open_region(f, &s[r]);
			fputc('}', f);
			ratio_value(f, v);
		}
	}
}

/* Print the labels of tally t after the region's: pod and pidns, or root. */
static void tally_labels(FILE *f, const struct kvs_tally_info *t)
{
	if (t->root) {
		fputs(",root=", f);
		tool_prom_label(f, t->name);
		return;
	}
	fputs(",pod=", f);
	tool_prom_label(f, t->name);
	if (t->kind == KVS_TALLY_POD)
		fprintf(f, ",pidns=\"%" PRIu64 "\"", t->key);
	else
		fputs(",pidns=\"other\"", f);
}

/* The figures by pod (root false) or by root: at most KVS_TALLY_PODS or KVS_TALLY_ROOTS
 * label values per region, whatever runs on the node (cache.h, "Tallies"). */
static void write_tallies(FILE *f, const struct tool_snapshot *s, int n, bool root)
{
	const char *kind = root ? "root" : "pod";
	char family[96];
	bool any = false;

	for (int r = 0; r < n && !any; r++)
		for (int i = 0; !s[r].err && i < s[r].ntallies; i++)
			any |= s[r].tallies[i].root == root;
	if (!any)
		return;
	for (int k = 0; k < KVS_NTALLY; k++) {
		snprintf(family, sizeof(family), "kvshim_%s_%s_total", kind, tool_tally_name[k]);
		fprintf(f, "# HELP %s %s (by %s)\n# TYPE %s counter\n", family, tool_tally_help[k],
			root ? "directory of files.roots" : "pod: a PID namespace", family);
		for (int r = 0; r < n; r++) {
			for (int i = 0; !s[r].err && i < s[r].ntallies; i++) {
				const struct kvs_tally_info *t = &s[r].tallies[i];

				if (t->root != root)
					continue;
				fputs(family, f);
				open_region(f, &s[r]);
				tally_labels(f, t);
				fprintf(f, "} %" PRIu64 "\n", t->v[k]);
			}
		}
	}
	for (int g = 0; g < 3; g++) {
		static const char *const what[3] = {"hit_ratio", "storage_bytes_per_unique_byte",
						    "processes"};
		bool head = false;

		if (g == 2 && root)
			break;
		snprintf(family, sizeof(family), "kvshim_%s_%s", kind, what[g]);
		for (int r = 0; r < n; r++) {
			for (int i = 0; !s[r].err && i < s[r].ntallies; i++) {
				const struct kvs_tally_info *t = &s[r].tallies[i];
				struct tool_figures fg;

				if (t->root != root)
					continue;
				tool_tally_figures(t, s[r].info.keys_only, &fg);
				double v = g == 0   ? fg.hit_ratio
					   : g == 1 ? fg.per_unique
						    : (double)t->processes;
				if (v < 0)
					continue;
				if (!head)
					fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", family,
						g == 0 ? "share of the bytes read the cache gave "
							 "(observe: would have given)"
						: g == 1
						    ? "bytes read from storage for each byte the "
						      "cache loaded (observe: would have loaded)"
						    : "live processes attached that joined the pod",
						family);
				head = true;
				fputs(family, f);
				open_region(f, &s[r]);
				tally_labels(f, t);
				fputc('}', f);
				if (g == 2)
					fprintf(f, " %" PRIu32 "\n", t->processes);
				else
					ratio_value(f, v);
			}
		}
	}
}

int tool_prom_write(FILE *f, const struct tool_snapshot *s, int n)
{
	char family[96];
	int nread = 0, nranked = 0;

	for (int r = 0; r < n; r++) {
		if (s[r].err)
			continue;
		nread++;
		for (int p = 0; p < s[r].nprocs; p++)
			nranked += first_of_rank(&s[r], p);
	}

	fputs("# HELP kvshim_build_info the version of kvshim that read these figures\n"
	      "# TYPE kvshim_build_info gauge\nkvshim_build_info{version=",
	      f);
	tool_prom_label(f, KVS_VERSION);
	fputs("} 1\n", f);
	if (n) {
		fputs("# HELP kvshim_up 1 when the region was read\n# TYPE kvshim_up gauge\n", f);
		for (int r = 0; r < n; r++) {
			fputs("kvshim_up", f);
			open_region(f, &s[r]);
			fprintf(f, "} %d\n", s[r].err ? 0 : 1);
		}
	}
	if (!nread)
		return ferror(f) ? -EIO : 0;

	for (int g = 0; g < NGAUGES; g++) {
		struct gauge v[NGAUGES];
		bool head = false;

		for (int r = 0; r < n; r++) {
			if (s[r].err)
				continue;
			gauges_of(&s[r].info, v);
			if (!head)
				fprintf(
				    f,
				    "# HELP kvshim_region_%s %s\n# TYPE kvshim_region_%s gauge\n",
				    v[g].name, v[g].help, v[g].name);
			head = true;
			fprintf(f, "kvshim_region_%s", v[g].name);
			open_region(f, &s[r]);
			fprintf(f, "} %" PRIu64 "\n", v[g].v);
		}
	}
	fputs("# HELP kvshim_region_populate_info cache.populate of the region and why its walk "
	      "stopped (reason empty while it has not)\n"
	      "# TYPE kvshim_region_populate_info gauge\n",
	      f);
	for (int r = 0; r < n; r++) {
		if (s[r].err)
			continue;
		fputs("kvshim_region_populate_info", f);
		open_region(f, &s[r]);
		fprintf(f,
			",mode=\"%s\",reason=", kvs_config_populate_word(s[r].info.populate_mode));
		tool_prom_label(f, s[r].info.populate_reason);
		fputs("} 1\n", f);
	}

	for (int k = 0; k < KVS_NCOUNTERS; k++) {
		family_of(family, sizeof(family), k, "");
		counter_head(f, family, k, "(all processes, exited ones included)");
		for (int r = 0; r < n; r++) {
			if (s[r].err)
				continue;
			fputs(family, f);
			open_region(f, &s[r]);
			fputc('}', f);
			value(f, k, s[r].totals.v[k]);
		}
	}

	write_figures(f, s, n);
	write_tallies(f, s, n, false);
	write_tallies(f, s, n, true);

	/* Series of one rank: only live processes with a rank, and live processes that share a
	 * rank summed; every process, gone ones included, is in the region's totals. */
	for (int k = 0; nranked && k < KVS_NCOUNTERS; k++) {
		family_of(family, sizeof(family), k, "process_");
		counter_head(f, family, k, "(live processes of one rank)");
		for (int r = 0; r < n; r++) {
			for (int p = 0; !s[r].err && p < s[r].nprocs; p++) {
				if (!first_of_rank(&s[r], p))
					continue;
				fputs(family, f);
				open_region(f, &s[r]);
				fprintf(f, ",rank=\"%" PRId32 "\"}", s[r].procs[p].rank);
				value(f, k, rank_sum(&s[r], s[r].procs[p].rank, k));
			}
		}
	}
	return ferror(f) ? -EIO : 0;
}
