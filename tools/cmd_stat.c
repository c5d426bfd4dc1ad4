/*
 * kvshim stat [--json | --prom] [--watch SEC]: the region's figures (design.md §7).
 *
 * Each snapshot maps the region named by the configuration as a watcher (KVS_OPEN_WATCH: the
 * control plane only, no process-table slot, no liveness lock), reads the figures with
 * kvs_cache_stat and unmaps it again, so that a watch keeps following the region across a
 * `kvshim reset` and a rebuild.  Totals are the counters folded in by processes that have
 * exited plus those of the processes in the table now.
 *
 * Formats: a text table (counters down, total and one column per process across); one JSON
 * object on one line (with the version of kvshim at top level); Prometheus text exposition
 * (kvshim_build_info, kvshim_up, kvshim_region_* gauges and kvshim_<counter>_total in base
 * units, labelled with the region name, and kvshim_process_<counter>_total series of live
 * processes labelled with their rank, never a pid).  With --watch a snapshot is printed every SEC
 * seconds until SIGINT or SIGTERM, which end the command with status 0; while watching, a region
 * that is absent is reported on stderr and looked for again at the next tick.
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
#include "config.h"

enum format { FMT_TEXT, FMT_JSON, FMT_PROM };

static const char usage[] = "usage: kvshim stat [--json | --prom] [--watch SEC]\n"
			    "  -j, --json       print one JSON object\n"
			    "  -p, --prom       print Prometheus text exposition\n"
			    "  -w, --watch SEC  print again every SEC seconds until interrupted\n"
			    "  -h, --help       print this help\n";

static const char *const ctr_name[KVS_NCOUNTERS] = {
#define KVS_COUNTER(name, help) #name,
#include "counters.def"
#undef KVS_COUNTER
};

static const char *const ctr_help[KVS_NCOUNTERS] = {
#define KVS_COUNTER(name, help) help,
#include "counters.def"
#undef KVS_COUNTER
};

/* One snapshot of a region. */
struct snapshot {
	const char *name; /* cache.name */
	const char *path;
	struct kvs_region_info info;
	struct kvs_counters totals;
	struct kvs_proc_info *procs;
	int nprocs;
};

static volatile sig_atomic_t stop;

/* Note the interrupt; the watch loop ends at its next wait. */
static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

/* Print s as a JSON string literal, quotes included. */
static void json_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch < 0x20 || ch == 0x7f)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
	fputc('"', f);
}

/* Print the counters of c as "name":value pairs, comma-separated. */
static void json_counters(FILE *f, const struct kvs_counters *c)
{
	for (int k = 0; k < KVS_NCOUNTERS; k++)
		fprintf(f, "%s\"%s\":%" PRIu64, k ? "," : "", ctr_name[k], c->v[k]);
}

/* The cache.populate word of mode. */
static const char *populate_word(uint32_t mode)
{
	return mode == KVS_POPULATE_EAGER ? "eager" : "lazy";
}

/* Print s as one JSON object on one line. */
static void print_json(FILE *f, const struct snapshot *s)
{
	const struct kvs_region_info *i = &s->info;

	fputs("{\"version\":", f);
	json_string(f, KVS_VERSION);
	fputs(",\"region\":{\"name\":", f);
	json_string(f, s->name);
	fputs(",\"path\":", f);
	json_string(f, s->path);
	fprintf(f,
		",\"capacity_bytes\":%" PRIu64 ",\"shard_size\":%" PRIu64
		",\"total_bytes\":%" PRIu64 ",\"slots\":%" PRIu32 ",\"reserved_slots\":%" PRIu32
		",\"slots_ready\":%" PRIu32 ",\"slots_loading\":%" PRIu32
		",\"slots_failed\":%" PRIu32 ",\"slots_pinned\":%" PRIu32
		",\"processes_attached\":%" PRIu32 ",\"max_processes\":%" PRIu32
		",\"slots_populated\":%" PRIu32 ",\"populate_errno\":%" PRId32
		",\"populate\":\"%s\",\"populate_reason\":\"%s\",\"shm_free_bytes\":%" PRIu64
		",\"procs_unlocked\":%s}",
		i->capacity_bytes, i->shard_size, i->total_bytes, i->slots, i->reserved_slots,
		i->slots_ready, i->slots_loading, i->slots_failed, i->slots_pinned,
		i->processes_attached, i->max_processes, i->slots_populated, i->populate_err,
		populate_word(i->populate_mode), i->populate_reason, i->shm_free_bytes,
		i->procs_unlocked ? "true" : "false");
	fputs(",\"totals\":{", f);
	json_counters(f, &s->totals);
	fputs("},\"processes\":[", f);
	for (int p = 0; p < s->nprocs; p++) {
		const struct kvs_proc_info *pi = &s->procs[p];

		fprintf(f, "%s{\"pid\":%" PRId32 ",\"rank\":%" PRId32 ",\"alive\":%s,",
			p ? "," : "", pi->pid, pi->rank, pi->alive ? "true" : "false");
		json_counters(f, &pi->ctr);
		fputc('}', f);
	}
	fputs("]}\n", f);
}

/* Print s as a Prometheus label value, quotes included. */
static void prom_label(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fprintf(f, "\\%c", *s);
		else if (*s == '\n')
			fputs("\\n", f);
		else
			fputc(*s, f);
	}
	fputc('"', f);
}

/* Print one gauge family with a single sample labelled with the region. */
static void prom_gauge(FILE *f, const struct snapshot *s, const char *name, const char *help,
		       uint64_t v)
{
	fprintf(f, "# HELP kvshim_region_%s %s\n# TYPE kvshim_region_%s gauge\n", name, help, name);
	fprintf(f, "kvshim_region_%s{region=", name);
	prom_label(f, s->name);
	fprintf(f, "} %" PRIu64 "\n", v);
}

/* A counter's family in Prometheus: kvshim_<name>_total in base units, so a counter in
 * nanoseconds (name ending in _ns) becomes kvshim_<name less _ns>_seconds_total. */
static void prom_family(char *buf, size_t len, int k, const char *prefix)
{
	size_t n = strlen(ctr_name[k]);

	if (n > 3 && !strcmp(ctr_name[k] + n - 3, "_ns"))
		snprintf(buf, len, "kvshim_%s%.*s_seconds_total", prefix, (int)(n - 3),
			 ctr_name[k]);
	else
		snprintf(buf, len, "kvshim_%s%s_total", prefix, ctr_name[k]);
}

/* Print counter k's value v in the family's unit. */
static void prom_value(FILE *f, int k, uint64_t v)
{
	size_t n = strlen(ctr_name[k]);

	if (n > 3 && !strcmp(ctr_name[k] + n - 3, "_ns"))
		fprintf(f, " %" PRIu64 ".%09" PRIu64 "\n", v / 1000000000u, v % 1000000000u);
	else
		fprintf(f, " %" PRIu64 "\n", v);
}

/* Print counter k's help text in the family's unit ("nanoseconds ..." -> "seconds ..."). */
static void prom_help(FILE *f, const char *family, int k, const char *what)
{
	const char *h = ctr_help[k];

	if (!strncmp(h, "nanoseconds", 11))
		fprintf(f, "# HELP %s seconds%s %s\n", family, h + 11, what);
	else
		fprintf(f, "# HELP %s %s %s\n", family, h, what);
}

/*
 * Print s in the Prometheus text exposition format (version 0.0.4), as promtool accepts it:
 * base units, HELP and TYPE once per family, every series labelled with the region.  Series of
 * one process are labelled with its rank, never its pid (a pid makes new series at every
 * restart): only live processes with a rank are shown, and live processes that share a rank
 * are summed; every process, gone ones included, is in the region's totals.
 */
static void print_prom(FILE *f, const struct snapshot *s)
{
	const struct kvs_region_info *i = &s->info;
	char family[96];
	int nranked = 0;

	fputs("# HELP kvshim_build_info the version of kvshim that read these figures\n"
	      "# TYPE kvshim_build_info gauge\nkvshim_build_info{version=",
	      f);
	prom_label(f, KVS_VERSION);
	fputs("} 1\n# HELP kvshim_up 1 when the region was read\n# TYPE kvshim_up gauge\n"
	      "kvshim_up{region=",
	      f);
	prom_label(f, s->name);
	fputs("} 1\n", f);
	prom_gauge(f, s, "capacity_bytes", "bytes of data slots", i->capacity_bytes);
	prom_gauge(f, s, "shard_size_bytes", "bytes per slot", i->shard_size);
	prom_gauge(f, s, "slots", "data slots", i->slots);
	prom_gauge(f, s, "reserved_slots", "slots kept for loads and prefetch", i->reserved_slots);
	prom_gauge(f, s, "slots_ready", "slots holding a loaded shard", i->slots_ready);
	prom_gauge(f, s, "slots_loading", "slots being loaded", i->slots_loading);
	prom_gauge(f, s, "slots_failed", "slots whose load failed", i->slots_failed);
	prom_gauge(f, s, "slots_pinned", "slots pinned by at least one process", i->slots_pinned);
	prom_gauge(f, s, "processes_attached", "live processes attached to the region",
		   i->processes_attached);
	prom_gauge(f, s, "max_processes", "slots in the process table", i->max_processes);
	prom_gauge(f, s, "slots_populated", "slots whose pages are allocated", i->slots_populated);
	prom_gauge(f, s, "populate_errno", "errno that stopped the eager walk, or 0",
		   (uint64_t)(uint32_t)i->populate_err);
	prom_gauge(f, s, "shm_free_bytes", "free bytes of the file system holding the region",
		   i->shm_free_bytes);
	prom_gauge(f, s, "procs_unlocked",
		   "1 when proc_lock was stuck and the process figures were read without it",
		   i->procs_unlocked);
	fputs("# HELP kvshim_region_populate_info cache.populate of the region and why its walk "
	      "stopped (reason empty while it has not)\n"
	      "# TYPE kvshim_region_populate_info gauge\nkvshim_region_populate_info{region=",
	      f);
	prom_label(f, s->name);
	fprintf(f, ",mode=\"%s\",reason=\"%s\"} 1\n", populate_word(i->populate_mode),
		i->populate_reason);

	for (int k = 0; k < KVS_NCOUNTERS; k++) {
		prom_family(family, sizeof(family), k, "");
		prom_help(f, family, k, "(all processes, exited ones included)");
		fprintf(f, "# TYPE %s counter\n%s{region=", family, family);
		prom_label(f, s->name);
		fputc('}', f);
		prom_value(f, k, s->totals.v[k]);
	}

	for (int p = 0; p < s->nprocs; p++)
		nranked += s->procs[p].alive && s->procs[p].rank >= 0;
	if (!nranked)
		return;
	for (int k = 0; k < KVS_NCOUNTERS; k++) {
		prom_family(family, sizeof(family), k, "process_");
		prom_help(f, family, k, "(live processes of one rank)");
		fprintf(f, "# TYPE %s counter\n", family);
		for (int p = 0; p < s->nprocs; p++) {
			const struct kvs_proc_info *pp = &s->procs[p];
			uint64_t v = 0;
			bool first = true;

			if (!pp->alive || pp->rank < 0)
				continue;
			/* One series per rank: the first live process of that rank sums them. */
			for (int q = 0; q < s->nprocs && first; q++)
				first =
				    !(q < p && s->procs[q].alive && s->procs[q].rank == pp->rank);
			if (!first)
				continue;
			for (int q = p; q < s->nprocs; q++)
				if (s->procs[q].alive && s->procs[q].rank == pp->rank)
					v += s->procs[q].ctr.v[k];
			fprintf(f, "%s{region=", family);
			prom_label(f, s->name);
			fprintf(f, ",rank=\"%" PRId32 "\"}", pp->rank);
			prom_value(f, k, v);
		}
	}
}

/* Format v bytes as a short human figure ("1.5 GiB") into buf. */
static const char *human(uint64_t v, char *buf, size_t len)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	double x = (double)v;
	int u = 0;

	while (x >= 1024.0 && u < 5) {
		x /= 1024.0;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%" PRIu64 " B", v);
	else
		snprintf(buf, len, "%.1f %s", x, unit[u]);
	return buf;
}

/* Decimal width of v. */
static int digits(uint64_t v)
{
	int n = 1;

	while (v >= 10) {
		v /= 10;
		n++;
	}
	return n;
}

/* Print s as a readable summary and a table: counters down; total, then each process across. */
static void print_text(FILE *f, const struct snapshot *s)
{
	const struct kvs_region_info *i = &s->info;
	char a[32], b[32], head[32];
	int w = 8, namew = 9;

	fprintf(f, "region     %s (%s), read by kvshim %s\n", s->name, s->path, KVS_VERSION);
	fprintf(f, "capacity   %s in %" PRIu32 " slots of %s (%" PRIu32 " reserved)\n",
		human(i->capacity_bytes, a, sizeof(a)), i->slots,
		human(i->shard_size, b, sizeof(b)), i->reserved_slots);
	fprintf(f,
		"slots      %" PRIu32 " ready, %" PRIu32 " loading, %" PRIu32 " failed, %" PRIu32
		" pinned\n",
		i->slots_ready, i->slots_loading, i->slots_failed, i->slots_pinned);
	fprintf(f, "populated  %" PRIu32 " of %" PRIu32 " slots, %s", i->slots_populated, i->slots,
		populate_word(i->populate_mode));
	if (i->populate_err)
		fprintf(f, "; walk stopped: %s (%s)", i->populate_reason,
			strerror(i->populate_err));
	fprintf(f, "; /dev/shm has %s free\n", human(i->shm_free_bytes, a, sizeof(a)));
	fprintf(f, "processes  %" PRIu32 " attached (table of %" PRIu32 ")%s\n\n",
		i->processes_attached, i->max_processes,
		i->procs_unlocked ? "; read without proc_lock, which is stuck: a process being "
				    "folded in may count twice"
				  : "");

	for (int k = 0; k < KVS_NCOUNTERS; k++) {
		int n = (int)strlen(ctr_name[k]);

		namew = n > namew ? n : namew;
		w = digits(s->totals.v[k]) > w ? digits(s->totals.v[k]) : w;
	}
	for (int p = 0; p < s->nprocs; p++) {
		int n = snprintf(head, sizeof(head), "pid %" PRId32, s->procs[p].pid);

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
		fputc('\n', f);
	}
	for (int k = 0; k < KVS_NCOUNTERS; k++) {
		fprintf(f, "%-*s  %*" PRIu64, namew, ctr_name[k], w, s->totals.v[k]);
		for (int p = 0; p < s->nprocs; p++)
			fprintf(f, "  %*" PRIu64, w, s->procs[p].ctr.v[k]);
		fputc('\n', f);
	}
}

/* Take one snapshot of the region cfg names and print it; 0, -ENOENT when there is no region,
 * or -errno with the reason in msg. */
static int snap(const struct kvs_config *cfg, const char *path, enum format fmt, char *msg,
		size_t msglen)
{
	struct snapshot s = {.name = cfg->cache_name, .path = path};
	struct kvs_cache *c = NULL;
	int max = (int)cfg->cache_max_processes, n, r;

	s.procs = calloc((size_t)max, sizeof(*s.procs));
	if (!s.procs) {
		snprintf(msg, msglen, "out of memory");
		return -ENOMEM;
	}
	r = kvs_cache_open(cfg, KVS_OPEN_WATCH, &c, msg, msglen);
	if (r)
		goto out;
	n = kvs_cache_stat(c, &s.info, &s.totals, s.procs, max);
	kvs_cache_close(c);
	if (n < 0) {
		r = n;
		snprintf(msg, msglen, "cannot read %s: %s", path, strerror(-r));
		goto out;
	}
	s.nprocs = n < max ? n : max;
	switch (fmt) {
	case FMT_JSON:
		print_json(stdout, &s);
		break;
	case FMT_PROM:
		print_prom(stdout, &s);
		break;
	default:
		print_text(stdout, &s);
		break;
	}
	r = fflush(stdout) ? -EIO : 0;
	if (r)
		snprintf(msg, msglen, "cannot write the output: %s", strerror(errno));
out:
	if (r && r != -ENOENT && !*msg)
		snprintf(msg, msglen, "%s: %s", path, strerror(-r));
	free(s.procs);
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

/* Block SIGINT and SIGTERM (they are taken only while waiting) and catch them; fills old with
 * the mask to wait under.  0 or -errno. */
static int catch_signals(sigset_t *old)
{
	struct sigaction sa = {.sa_handler = on_signal};
	sigset_t set;

	sigemptyset(&sa.sa_mask);
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	if (sigprocmask(SIG_BLOCK, &set, old) < 0)
		return -errno;
	sigdelset(old, SIGINT);
	sigdelset(old, SIGTERM);
	/* Installed even where the shell ignores SIGINT (a background job): --watch must stop. */
	if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0)
		return -errno;
	return 0;
}

/* Print snapshots of the region every period until a signal; returns an exit status. */
static int watch(const struct kvs_config *cfg, const char *path, enum format fmt,
		 const struct timespec *period)
{
	bool clear = fmt == FMT_TEXT && isatty(STDOUT_FILENO), absent = false;
	char msg[KVS_CONFIG_MSG_MAX];
	sigset_t waitmask;
	int r;

	r = catch_signals(&waitmask);
	if (r) {
		tool_err("cannot catch signals: %s", strerror(-r));
		return KVS_EXIT_FAIL;
	}
	for (unsigned tick = 0; !stop; tick++) {
		if (clear)
			fputs("\033[H\033[2J", stdout);
		else if (tick && fmt != FMT_JSON)
			fputc('\n', stdout);
		msg[0] = '\0';
		r = snap(cfg, path, fmt, msg, sizeof(msg));
		if (r == -ENOENT) {
			if (!absent)
				tool_err("no region at %s", path);
			absent = true;
		} else if (r) {
			tool_err("%s", msg);
			return KVS_EXIT_FAIL;
		} else {
			absent = false;
		}
		fflush(stdout);
		/* SIGINT and SIGTERM are unblocked only inside ppoll: none is lost between the
		 * check of stop and the wait. */
		if (ppoll(NULL, 0, period, &waitmask) < 0 && errno != EINTR) {
			tool_err("cannot wait: %s", strerror(errno));
			return KVS_EXIT_FAIL;
		}
	}
	return KVS_EXIT_OK;
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
	char path[PATH_MAX], msg[KVS_CONFIG_MSG_MAX];
	struct timespec period = {0};
	enum format fmt = FMT_TEXT;
	struct kvs_config *cfg;
	bool watching = false;
	int opt, r, status;

	opterr = 0;
	while ((opt = getopt_long(argc, argv, "+:jpw:h", opts, NULL)) != -1) {
		switch (opt) {
		case 'j':
		case 'p':
			if (fmt != FMT_TEXT && fmt != (opt == 'j' ? FMT_JSON : FMT_PROM)) {
				tool_err("stat: --json and --prom exclude each other");
				fputs(usage, stderr);
				return KVS_EXIT_USAGE;
			}
			fmt = opt == 'j' ? FMT_JSON : FMT_PROM;
			break;
		case 'w':
			if (parse_seconds(optarg, &period)) {
				tool_err("stat: --watch %s: expected a positive number of seconds",
					 optarg);
				return KVS_EXIT_USAGE;
			}
			watching = true;
			break;
		case 'h':
			fputs(usage, stdout);
			return KVS_EXIT_OK;
		default:
			return tool_bad_option("stat", opt, argv, usage);
		}
	}
	if (optind < argc) {
		tool_err("stat: unexpected argument %s", argv[optind]);
		fputs(usage, stderr);
		return KVS_EXIT_USAGE;
	}
	if (tool_load_config(&cfg))
		return KVS_EXIT_FAIL;
	if (kvs_cache_path(cfg, path, sizeof(path))) {
		tool_err("the region path is too long");
		status = KVS_EXIT_FAIL;
		goto out;
	}
	if (watching) {
		status = watch(cfg, path, fmt, &period);
		goto out;
	}
	msg[0] = '\0';
	r = snap(cfg, path, fmt, msg, sizeof(msg));
	if (r == -ENOENT)
		tool_err("no region at %s", path);
	else if (r)
		tool_err("%s", msg);
	status = r ? KVS_EXIT_FAIL : KVS_EXIT_OK;
out:
	free(cfg);
	return status;
}
