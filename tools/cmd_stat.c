/*
 * kvshim stat [--json | --prom] [--watch SEC]: the region's figures (docs/design.md, "Counters").
 *
 * Each snapshot maps the region named by the configuration as a watcher (snapshot.c:
 * KVS_OPEN_WATCH, the control plane only, no process-table slot, no liveness lock), reads the
 * figures with kvs_cache_stat and unmaps it again, so that a watch keeps following the region
 * across a `kvshim reset` and a rebuild.  Totals are the counters folded in by processes that
 * have exited plus those of the processes in the table now.
 *
 * Formats: text for people (a headline of bytes served against bytes read from storage and
 * their ratio, the sharing factor; then a table, counters down, total and one column per
 * process across, bytes and times in human units); one JSON object on one line with the raw
 * integers (and the version of kvshim at top level); Prometheus text exposition (prom.c, the
 * same text `kvshim exporter` serves).  With --watch a snapshot is printed every SEC seconds
 * until SIGINT or SIGTERM, which end the command with status 0; the text form then starts each
 * snapshot with the time and the rates since the one before.  While watching, a region that
 * is absent is reported on stderr and looked for again at the next tick.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "cmd_common.h"
#include "cache_params.h"
#include "config.h"
#include "snapshot.h"
#include "textout.h"
#include "value.h"

enum format { FMT_TEXT, FMT_JSON, FMT_PROM };

static const char usage[] = "usage: kvshim stat [--json | --prom] [--watch SEC]\n"
			    "  -j, --json       print one JSON object\n"
			    "  -p, --prom       print Prometheus text exposition\n"
			    "  -w, --watch SEC  print again every SEC seconds until interrupted\n"
			    "  -h, --help       print this help\n";

/* Print the counters of c as "name":value pairs, comma-separated. */
static void json_counters(FILE *f, const struct kvs_counters *c)
{
	for (int k = 0; k < KVS_NCOUNTERS; k++)
		fprintf(f, "%s\"%s\":%" PRIu64, k ? "," : "", tool_ctr_name[k], c->v[k]);
}

/* Print a ratio, or null when there is none (-1). */
static void json_ratio(FILE *f, const char *key, double v)
{
	if (v < 0)
		fprintf(f, "\"%s\":null", key);
	else
		fprintf(f, "\"%s\":%.6f", key, v);
}

/* Print figures as "read_bytes":..,"hit_ratio":.. pairs. */
static void json_figures(FILE *f, const struct tool_figures *g)
{
	fprintf(f,
		"\"read_bytes\":%" PRIu64 ",\"storage_bytes\":%" PRIu64 ",\"unique_bytes\":%" PRIu64
		",\"unserved_bytes\":%" PRIu64 ",\"cached_storage_bytes\":%" PRIu64 ",",
		g->read, g->storage, g->unique, g->unserved, g->cached);
	json_ratio(f, "hit_ratio", g->hit_ratio);
	fputc(',', f);
	json_ratio(f, "storage_per_unique", g->per_unique);
}

/* Print s's pods (root false) or roots as a JSON array. */
static void json_tallies(FILE *f, const struct tool_snapshot *s, bool root)
{
	int n = s->ntallies < (int)(KVS_TALLY_PODS + KVS_TALLY_ROOTS)
		    ? s->ntallies
		    : (int)(KVS_TALLY_PODS + KVS_TALLY_ROOTS);
	bool first = true;

	fputc('[', f);
	for (int i = 0; i < n; i++) {
		const struct kvs_tally_info *t = &s->tallies[i];
		struct tool_figures g;

		if (t->root != root)
			continue;
		fputs(first ? "{" : ",{", f);
		first = false;
		fputs(root ? "\"root\":" : "\"pod\":", f);
		tool_json_string(f, t->name);
		if (!root)
			fprintf(f, ",\"pidns\":%" PRIu64 ",\"processes\":%" PRIu32,
				t->kind == KVS_TALLY_POD ? t->key : 0, t->processes);
		for (int k = 0; k < KVS_NTALLY; k++)
			fprintf(f, ",\"%s\":%" PRIu64, tool_tally_name[k], t->v[k]);
		tool_tally_figures(t, s->info.keys_only, &g);
		fputc(',', f);
		json_ratio(f, "hit_ratio", g.hit_ratio);
		fputc(',', f);
		json_ratio(f, "storage_per_unique", g.per_unique);
		fputc('}', f);
	}
	fputc(']', f);
}

/* Print s as one JSON object on one line. */
static void print_json(FILE *f, const struct tool_snapshot *s)
{
	const struct kvs_region_info *i = &s->info;
	struct tool_figures g;

	fputs("{\"version\":", f);
	tool_json_string(f, KVS_VERSION);
	fputs(",\"region\":{\"name\":", f);
	tool_json_string(f, s->name);
	fputs(",\"path\":", f);
	tool_json_string(f, s->path);
	fprintf(f,
		",\"capacity_bytes\":%" PRIu64 ",\"shard_size\":%" PRIu64
		",\"total_bytes\":%" PRIu64 ",\"slots\":%" PRIu32 ",\"reserved_slots\":%" PRIu32
		",\"slots_ready\":%" PRIu32 ",\"bytes_ready\":%" PRIu64
		",\"slots_loading\":%" PRIu32 ",\"slots_failed\":%" PRIu32
		",\"slots_pinned\":%" PRIu32 ",\"slots_claimed\":%" PRIu32
		",\"processes_attached\":%" PRIu32 ",\"max_processes\":%" PRIu32
		",\"slots_populated\":%" PRIu32 ",\"populate_errno\":%" PRId32
		",\"populate\":\"%s\",\"populate_reason\":\"%s\",\"shm_free_bytes\":%" PRIu64
		",\"procs_unlocked\":%s,\"refused_attaches\":%" PRIu64 ",\"page_size\":%" PRIu64
		",\"huge_pages\":\"%s\",\"numa\":\"%s\",\"mode\":\"%s\",\"built_by\":",
		i->capacity_bytes, i->shard_size, i->total_bytes, i->slots, i->reserved_slots,
		i->slots_ready, i->bytes_ready, i->slots_loading, i->slots_failed, i->slots_pinned,
		i->slots_claimed, i->processes_attached, i->max_processes, i->slots_populated,
		i->populate_err, kvs_config_populate_word(i->populate_mode), i->populate_reason,
		i->shm_free_bytes, i->procs_unlocked ? "true" : "false", i->refused_attaches,
		i->page_size, kvs_page_kind_word(i->page_kind), kvs_config_numa_word(i->numa),
		i->keys_only ? "observe" : "serve");
	tool_json_string(f, i->built_by);
	fputs("},\"totals\":{", f);
	json_counters(f, &s->totals);
	fputs("},\"figures\":{", f);
	tool_figures_of(s, &g);
	json_figures(f, &g);
	fputs("},\"pods\":", f);
	json_tallies(f, s, false);
	fputs(",\"roots\":", f);
	json_tallies(f, s, true);
	fputs(",\"unserved\":{", f);
	for (int u = 0, first = 1; u < tool_nunserved; u++) {
		uint64_t calls = s->totals.v[tool_unserved[u].calls];

		if (!calls)
			continue;
		fprintf(f, "%s\"%s\":{\"calls\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"what\":",
			first ? "" : ",", tool_ctr_name[tool_unserved[u].calls], calls,
			s->totals.v[tool_unserved[u].bytes]);
		tool_json_string(f, tool_unserved[u].what);
		fputc('}', f);
		first = 0;
	}
	fputs("},\"processes\":[", f);
	for (int p = 0; p < s->nprocs; p++) {
		const struct kvs_proc_info *pi = &s->procs[p];

		fprintf(f,
			"%s{\"pid\":%" PRId32 ",\"pidns\":%" PRIu64 ",\"rank\":%" PRId32
			",\"alive\":%s,",
			p ? "," : "", pi->pid, pi->pidns, pi->rank, pi->alive ? "true" : "false");
		json_counters(f, &pi->ctr);
		fputc('}', f);
	}
	fputs("]}\n", f);
}

/* Format a time of ns nanoseconds in ms below a second, else in s, into buf. */
static const char *human_ns(uint64_t ns, char *buf, size_t len)
{
	if (!ns)
		snprintf(buf, len, "0 ms");
	else if (ns < 1000000000u)
		snprintf(buf, len, "%.2f ms", (double)ns / 1e6);
	else
		snprintf(buf, len, "%.2f s", (double)ns / 1e9);
	return buf;
}

/* Format counter k's value v for the table: bytes (a name ending in _bytes) and times (_ns)
 * in human units, counts as they are. */
static const char *cell(int k, uint64_t v, char *buf, size_t len)
{
	const char *name = tool_ctr_name[k];
	size_t n = strlen(name);

	if (n > 6 && !strcmp(name + n - 6, "_bytes"))
		return tool_human_bytes(v, buf, len);
	if (n > 3 && !strcmp(name + n - 3, "_ns"))
		return human_ns(v, buf, len);
	snprintf(buf, len, "%" PRIu64, v);
	return buf;
}

/* The previous sample of a watch, for the rates of the next one. */
struct rates {
	bool have;		  /* prev and at hold a sample */
	struct kvs_counters prev; /* its totals */
	struct timespec at;	  /* CLOCK_MONOTONIC when it was taken */
};

/* Bytes the readers got from the cache: copies into their buffers and into device memory. */
static uint64_t served(const struct kvs_counters *c)
{
	return c->v[KVS_CTR_copy_bytes] + c->v[KVS_CTR_h2d_bytes];
}

/* Print the watch's lines: the wall-clock time of s and the rates since the last sample in
 * *rt (none at the first sample, or when the totals went back: the region was rebuilt);
 * then make s the last sample. */
static void print_rates(FILE *f, const struct tool_snapshot *s, struct rates *rt)
{
	struct timespec now, wall;
	char when[64];
	struct tm tm;
	bool back = false;

	clock_gettime(CLOCK_MONOTONIC, &now);
	clock_gettime(CLOCK_REALTIME, &wall);
	if (!localtime_r(&wall.tv_sec, &tm) ||
	    !strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm))
		snprintf(when, sizeof(when), "%lld", (long long)wall.tv_sec);
	fprintf(f, "time       %s.%03ld", when, wall.tv_nsec / 1000000);
	if (strftime(when, sizeof(when), " %z", &tm))
		fputs(when, f);
	fputc('\n', f);

	for (int k = 0; rt->have && k < KVS_NCOUNTERS; k++)
		back |= s->totals.v[k] < rt->prev.v[k];
	if (!rt->have || back) {
		fprintf(f, "rates      %s\n",
			back ? "- (the totals went back: the region was rebuilt)"
			     : "- (from the next sample)");
	} else {
		double dt = (double)(now.tv_sec - rt->at.tv_sec) +
			    (double)(now.tv_nsec - rt->at.tv_nsec) / 1e9;

		if (dt <= 0)
			dt = 1e-9;
		fprintf(f,
			"rates      %.2f GB/s served, %.2f GB/s from storage, %.0f requests/s "
			"(over %.1f s)\n",
			(double)(served(&s->totals) - served(&rt->prev)) / 1e9 / dt,
			(double)(s->totals.v[KVS_CTR_backend_bytes] -
				 rt->prev.v[KVS_CTR_backend_bytes]) /
			    1e9 / dt,
			(double)(s->totals.v[KVS_CTR_requests] - rt->prev.v[KVS_CTR_requests]) / dt,
			dt);
	}
	rt->have = true;
	rt->prev = s->totals;
	rt->at = now;
}

/* The observe sentence: what the cache would have read from storage against what was read. */
static void print_observed(FILE *f, const struct tool_figures *g)
{
	char a[32], b[32];

	if (!g->read) {
		fputs("observe    nothing observed yet (shim.mode = observe: every read goes to "
		      "storage)\n",
		      f);
		return;
	}
	fprintf(f, "observe    would have read %s from storage instead of %s: ",
		tool_human_bytes(g->cached, a, sizeof(a)),
		tool_human_bytes(g->storage, b, sizeof(b)));
	if (g->cached)
		fprintf(f, "%.1fx less\n", (double)g->storage / (double)g->cached);
	else
		fputs("nothing from storage\n", f);
}

/* What storage gave against what the engines read (serve). */
static void print_storage(FILE *f, const struct tool_figures *g)
{
	char a[32], b[32];

	if (!g->read)
		return;
	fprintf(f, "storage    %s from storage for %s the engines read of KV files: ",
		tool_human_bytes(g->storage, a, sizeof(a)),
		tool_human_bytes(g->read, b, sizeof(b)));
	if (g->storage)
		fprintf(f, "%.1fx less\n", (double)g->read / (double)g->storage);
	else
		fputs("nothing from storage\n", f);
}

/* Bytes over the nanoseconds loads waited for them (GB/s). */
static double per_load_gbs(uint64_t bytes, uint64_t ns)
{
	return ns ? (double)bytes / (double)ns : 0.0;
}

/* The remote tier (remote.kind), once it was asked or offered anything: what the pool gave,
 * and its speed here against storage's as loads see them, the figures the helper routes by. */
static void print_remote(FILE *f, const struct tool_snapshot *s)
{
	const uint64_t *v = s->totals.v;
	uint64_t asks =
	    v[KVS_CTR_remote_hits] + v[KVS_CTR_remote_misses] + v[KVS_CTR_remote_errors];
	char a[32], b[32];

	if (!asks && !v[KVS_CTR_remote_published_bytes] && !v[KVS_CTR_remote_dropped])
		return;
	fprintf(f,
		"remote     %s from the pool: %" PRIu64 " of %" PRIu64 " shards asked (%" PRIu64
		" not there, %" PRIu64 " errors); %s published, %" PRIu64 " dropped\n",
		tool_human_bytes(v[KVS_CTR_remote_bytes], a, sizeof(a)), v[KVS_CTR_remote_hits],
		asks, v[KVS_CTR_remote_misses], v[KVS_CTR_remote_errors],
		tool_human_bytes(v[KVS_CTR_remote_published_bytes], b, sizeof(b)),
		v[KVS_CTR_remote_dropped]);
	if (v[KVS_CTR_remote_bytes] && v[KVS_CTR_storage_wall_bytes])
		fprintf(f, "           as loads see them: the pool %.2f GB/s, storage %.2f GB/s\n",
			per_load_gbs(v[KVS_CTR_remote_bytes], v[KVS_CTR_remote_ns]),
			per_load_gbs(v[KVS_CTR_storage_wall_bytes], v[KVS_CTR_storage_wall_ns]));
}

/* One line for each way KV reads went past the cache, with its bytes: a figure of 1.0x is
 * never left to look like a success. */
static void print_unserved(FILE *f, const struct tool_snapshot *s)
{
	char a[32];

	for (int u = 0; u < tool_nunserved; u++) {
		uint64_t calls = s->totals.v[tool_unserved[u].calls];

		if (!calls)
			continue;
		/* A mapping reads nothing by itself: its bytes are mapped, not read (a loader may
		 * map a checkpoint many times over), so it is not said as reads not served. */
		if (tool_unserved[u].calls == KVS_CTR_unserved_mmap) {
			fprintf(f,
				"mapped     %" PRIu64
				" mapping%s of KV files, %s mapped (not reads: "
				"page faults read past the cache, as much as the program touches; "
				"%s)\n",
				calls, calls == 1 ? "" : "s",
				tool_human_bytes(s->totals.v[tool_unserved[u].bytes], a, sizeof(a)),
				tool_ctr_name[tool_unserved[u].calls]);
			continue;
		}
		fprintf(f, "not served %" PRIu64 " %s: %s (%s)\n", calls, tool_unserved[u].what,
			tool_human_bytes(s->totals.v[tool_unserved[u].bytes], a, sizeof(a)),
			tool_ctr_name[tool_unserved[u].calls]);
	}
}

/* Opens the shim saw whose reads it did not (unseen.h). */
static void print_unseen(FILE *f, const struct tool_snapshot *s)
{
	uint64_t n = s->totals.v[KVS_CTR_unserved_unseen];

	if (n)
		fprintf(f,
			"unseen     %" PRIu64
			" O_DIRECT open%s of KV files closed with no read the "
			"shim saw: reads made by inline system calls (a bundled liburing, a static "
			"binary), not served (unserved_unseen)\n",
			n, n == 1 ? "" : "s");
}

/* A ratio for the tables: "0.875", or "-" for none. */
static const char *ratio_cell(double v, char *buf, size_t len)
{
	if (v < 0)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%.3f", v);
	return buf;
}

/* The pods' and the roots' figures, one line each. */
static void print_tallies(FILE *f, const struct tool_snapshot *s)
{
	char rd[32], st[32], un[32], hit[32], per[32], ns[32], procs[16];
	int namew = 4;

	for (int i = 0; i < s->ntallies; i++) {
		int n = (int)strnlen(s->tallies[i].name, sizeof(s->tallies[i].name));

		namew = n > namew ? n : namew;
	}
	for (int pass = 0; pass < 2; pass++) {
		bool head = false;

		for (int i = 0; i < s->ntallies; i++) {
			const struct kvs_tally_info *t = &s->tallies[i];
			struct tool_figures g;

			if (t->root != (pass == 1))
				continue;
			if (!head)
				fprintf(f, "%-10s %-*s %12s %5s %8s %11s %11s %11s %9s %7s\n",
					pass ? "by root" : "by pod", namew, pass ? "root" : "host",
					pass ? "" : "pid ns", pass ? "" : "procs", "reads", "read",
					"storage", s->info.keys_only ? "would load" : "loaded",
					s->info.keys_only ? "would hit" : "hit ratio", "st/uniq");
			head = true;
			tool_tally_figures(t, s->info.keys_only, &g);
			ns[0] = procs[0] = '\0';
			if (pass == 0) {
				snprintf(procs, sizeof(procs), "%" PRIu32, t->processes);
				if (t->kind == KVS_TALLY_POD)
					snprintf(ns, sizeof(ns), "%" PRIu64, t->key);
				else
					snprintf(ns, sizeof(ns), "-");
			}
			fprintf(f, "%-10s %-*s %12s %5s %8" PRIu64 " %11s %11s %11s %9s %7s\n", "",
				namew, t->name, ns, procs, t->v[KVS_TALLY_reads],
				tool_human_bytes(g.read, rd, sizeof(rd)),
				tool_human_bytes(g.storage, st, sizeof(st)),
				tool_human_bytes(g.unique, un, sizeof(un)),
				ratio_cell(g.hit_ratio, hit, sizeof(hit)),
				ratio_cell(g.per_unique, per, sizeof(per)));
		}
	}
	if (s->ntallies)
		fputc('\n', f);
}

/* Print s as a readable summary and a table: counters down; total, then each process across.
 * Bytes and times are in human units (--json has the raw integers).  With rt (a watch), the
 * time and the rates since the last sample come first. */
static void print_text(FILE *f, const struct tool_snapshot *s, struct rates *rt)
{
	const struct kvs_region_info *i = &s->info;
	uint64_t from = s->totals.v[KVS_CTR_backend_bytes];
	char a[32], b[32], head[32];
	struct tool_figures g;
	int w = 8, namew = 9;

	if (rt)
		print_rates(f, s, rt);
	fprintf(f, "region     %s (%s), read by kvshim %s\n", s->name, s->path, KVS_VERSION);
	fprintf(f, "built by   kvshim %s; %" PRIu64 " attaches refused for its dimensions\n",
		i->built_by, i->refused_attaches);
	tool_figures_of(s, &g);
	if (i->keys_only) {
		print_observed(f, &g);
	} else {
		fprintf(f, "served     %s to readers from %s read from storage: ",
			tool_human_bytes(served(&s->totals), a, sizeof(a)),
			tool_human_bytes(from, b, sizeof(b)));
		if (from)
			fprintf(f, "sharing factor %.2f\n",
				(double)served(&s->totals) / (double)from);
		else
			fputs("sharing factor - (nothing read from storage yet)\n", f);
		print_storage(f, &g);
		print_remote(f, s);
	}
	print_unserved(f, s);
	print_unseen(f, s);
	fprintf(f, "capacity   %s in %" PRIu32 " slots of %s (%" PRIu32 " reserved)\n",
		tool_human_bytes(i->capacity_bytes, a, sizeof(a)), i->slots,
		tool_human_bytes(i->shard_size, b, sizeof(b)), i->reserved_slots);
	fprintf(f,
		"slots      %" PRIu32 " ready (%s), %" PRIu32 " loading, %" PRIu32
		" failed, %" PRIu32 " pinned, %" PRIu32 " claimed\n",
		i->slots_ready, tool_human_bytes(i->bytes_ready, a, sizeof(a)), i->slots_loading,
		i->slots_failed, i->slots_pinned, i->slots_claimed);
	fprintf(f, "populated  %" PRIu32 " of %" PRIu32 " slots, %s", i->slots_populated, i->slots,
		kvs_config_populate_word(i->populate_mode));
	if (i->populate_err)
		fprintf(f, "; walk stopped: %s (%s)", i->populate_reason,
			strerror(i->populate_err));
	if (i->page_kind == KVS_PAGE_HUGETLBFS)
		fprintf(f, "; its huge page pool has %s free\n",
			tool_human_bytes(i->shm_free_bytes, a, sizeof(a)));
	else
		fprintf(f, "; %.*s has %s free\n", (int)(strrchr(s->path, '/') - s->path), s->path,
			tool_human_bytes(i->shm_free_bytes, a, sizeof(a)));
	fprintf(f, "pages      %s", tool_human_bytes(i->page_size, a, sizeof(a)));
	if (i->page_kind != KVS_PAGE_BASE)
		fprintf(f, " huge pages (%s)", kvs_page_kind_word(i->page_kind));
	fprintf(f, ", placed %s\n",
		i->numa == KVS_NUMA_OFF	    ? "by the kernel (cache.numa off)"
		: i->numa == KVS_NUMA_LOCAL ? "local (cache.numa)"
					    : "interleaved (cache.numa)");
	fprintf(f, "processes  %" PRIu32 " attached (table of %" PRIu32 ")%s\n\n",
		i->processes_attached, i->max_processes,
		i->procs_unlocked ? "; read without proc_lock, which is stuck: a process being "
				    "folded in may count twice"
				  : "");
	print_tallies(f, s);

	for (int k = 0; k < KVS_NCOUNTERS; k++) {
		int n = (int)strlen(tool_ctr_name[k]);

		namew = n > namew ? n : namew;
		n = (int)strlen(cell(k, s->totals.v[k], a, sizeof(a)));
		w = n > w ? n : w;
		for (int p = 0; p < s->nprocs; p++) {
			n = (int)strlen(cell(k, s->procs[p].ctr.v[k], a, sizeof(a)));
			w = n > w ? n : w;
		}
	}
	for (int p = 0; p < s->nprocs; p++) {
		int n = snprintf(head, sizeof(head), "pid %" PRId32, s->procs[p].pid);

		w = n > w ? n : w;
		n = snprintf(head, sizeof(head), "%" PRIu64, s->procs[p].pidns);
		w = n > w ? n : w;
	}

	fprintf(f, "%-*s  %*s", namew, "counter", w, "total");
	for (int p = 0; p < s->nprocs; p++) {
		snprintf(head, sizeof(head), "pid %" PRId32, s->procs[p].pid);
		fprintf(f, "  %*s", w, head);
	}
	fputc('\n', f);
	if (s->nprocs) {
		fprintf(f, "%-*s  %*s", namew, "rank", w, "");
		for (int p = 0; p < s->nprocs; p++) {
			if (s->procs[p].rank < 0)
				fprintf(f, "  %*s", w, "-");
			else
				fprintf(f, "  %*" PRId32, w, s->procs[p].rank);
		}
		fprintf(f, "\n%-*s  %*s", namew, "alive", w, "");
		for (int p = 0; p < s->nprocs; p++)
			fprintf(f, "  %*s", w, s->procs[p].alive ? "yes" : "no");
		/* Pods that share /dev/shm have PID namespaces of their own: a pid means
		 * something only beside its namespace. */
		fprintf(f, "\n%-*s  %*s", namew, "pid namespace", w, "");
		for (int p = 0; p < s->nprocs; p++) {
			if (s->procs[p].pidns)
				fprintf(f, "  %*" PRIu64, w, s->procs[p].pidns);
			else
				fprintf(f, "  %*s", w, "-");
		}
		fputc('\n', f);
	}
	for (int k = 0; k < KVS_NCOUNTERS; k++) {
		fprintf(f, "%-*s  %*s", namew, tool_ctr_name[k], w,
			cell(k, s->totals.v[k], a, sizeof(a)));
		for (int p = 0; p < s->nprocs; p++)
			fprintf(f, "  %*s", w, cell(k, s->procs[p].ctr.v[k], a, sizeof(a)));
		fputc('\n', f);
	}
}

/* Take one snapshot of the region cfg names and print it (rt: the watch's last sample, or
 * NULL); 0, -ENOENT when there is no region, or -errno once the reason is on stderr. */
static int snap(const struct kvs_config *cfg, enum format fmt, struct rates *rt)
{
	struct tool_snapshot *s;
	int r;

	/* A PATH_MAX path inside: too big for a comfortable stack frame. */
	s = calloc(1, sizeof(*s));
	if (!s) {
		tool_err("out of memory");
		return -ENOMEM;
	}
	r = tool_snapshot_take(cfg, s);
	if (r) {
		if (r != -ENOENT)
			tool_err("%s", s->msg);
		goto out;
	}
	switch (fmt) {
	case FMT_JSON:
		print_json(stdout, s);
		break;
	case FMT_PROM:
		tool_prom_write(stdout, s, 1);
		break;
	default:
		print_text(stdout, s, rt);
		break;
	}
	if (fflush(stdout)) {
		r = -EIO;
		tool_err("cannot write the output: %s", strerror(errno));
	}
out:
	tool_snapshot_free(s);
	free(s);
	return r;
}

/* Parse a positive, finite number of seconds; 0 or -EINVAL. */
static int parse_seconds(const char *arg, struct timespec *ts)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(arg, &end);
	if (errno || end == arg || *end || !isfinite(v) || v <= 0 || v > 86400.0 * 365)
		return -EINVAL;
	ts->tv_sec = (time_t)v;
	ts->tv_nsec = (long)((v - (double)ts->tv_sec) * 1e9);
	if (!ts->tv_sec && !ts->tv_nsec)
		ts->tv_nsec = 1;
	return 0;
}

/* Print snapshots of the region every period until a signal; returns an exit status. */
static int watch(const struct kvs_config *cfg, const char *path, enum format fmt,
		 const struct timespec *period)
{
	bool clear = fmt == FMT_TEXT && isatty(STDOUT_FILENO), absent = false;
	struct rates rt = {0};
	sigset_t waitmask;
	int r;

	r = tool_catch_stop(&waitmask);
	if (r) {
		tool_err("cannot catch signals: %s", strerror(-r));
		return KVS_EXIT_FAIL;
	}
	for (unsigned tick = 0; !tool_stop; tick++) {
		if (clear)
			fputs("\033[H\033[2J", stdout);
		else if (tick && fmt != FMT_JSON)
			fputc('\n', stdout);
		r = snap(cfg, fmt, fmt == FMT_TEXT ? &rt : NULL);
		if (r == -ENOENT) {
			if (!absent)
				tool_err("no region at %s", path);
			absent = true;
			rt.have = false;
		} else if (r) {
			return KVS_EXIT_FAIL;
		} else {
			absent = false;
		}
		fflush(stdout);
		/* SIGINT and SIGTERM are unblocked only inside ppoll: none is lost between the
		 * check of tool_stop and the wait. */
		if (ppoll(NULL, 0, period, &waitmask) < 0 && errno != EINTR) {
			tool_err("cannot wait: %s", strerror(errno));
			return KVS_EXIT_FAIL;
		}
	}
	return KVS_EXIT_OK;
}

struct stat_opts {
	enum format fmt;
	bool watching;
	struct timespec period;
};

/* --json, --prom, --watch SEC. */
static int on_opt(void *arg, int opt, const char *optarg)
{
	struct stat_opts *o = arg;

	if (opt == 'w') {
		if (parse_seconds(optarg, &o->period)) {
			tool_err("stat: --watch %s: expected a positive number of seconds", optarg);
			return KVS_EXIT_USAGE;
		}
		o->watching = true;
		return 0;
	}
	if (o->fmt != FMT_TEXT && o->fmt != (opt == 'j' ? FMT_JSON : FMT_PROM)) {
		tool_err("stat: --json and --prom exclude each other");
		fputs(usage, stderr);
		return KVS_EXIT_USAGE;
	}
	o->fmt = opt == 'j' ? FMT_JSON : FMT_PROM;
	return 0;
}

int cmd_stat(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"json", no_argument, NULL, 'j'},
	    {"prom", no_argument, NULL, 'p'},
	    {"watch", required_argument, NULL, 'w'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct stat_opts o = {.fmt = FMT_TEXT};
	const struct tool_cmdline cl = {.cmd = "stat",
					.usage = usage,
					.optstring = "+:jpw:h",
					.opts = opts,
					.on_opt = on_opt,
					.arg = &o};
	struct tool_region region;
	struct kvs_config *cfg;
	int r, status = tool_parse_cmdline(&cl, argc, argv);

	if (status != TOOL_GO_ON)
		return status;
	if (tool_load_config(&cfg))
		return KVS_EXIT_FAIL;
	if (tool_region_of(cfg, &region)) {
		status = KVS_EXIT_FAIL;
		goto out;
	}
	if (o.watching) {
		status = watch(cfg, region.path, o.fmt, &o.period);
		goto out;
	}
	r = snap(cfg, o.fmt, NULL);
	if (r == -ENOENT)
		tool_err("no region at %s", region.path);
	status = r ? KVS_EXIT_FAIL : KVS_EXIT_OK;
out:
	free(cfg);
	return status;
}
