/*
 * kvshim prefetch [--config FILE] [--max BYTES] PATH...: load files, and the files of
 * directories (recursively), under files.roots into the region before anyone asks for them.
 *
 * How.  The reads are made by a worker process of this program, started with the shim
 * preloaded (as `kvshim run` starts an engine), which opens each file with O_DIRECT and reads
 * it whole in 8 MiB preads.  The shim serves them as any rank's: each shard is keyed as an
 * engine's read would key it (files.roots, files.write_once, files.settle: the same code, not a
 * copy of it), a shard already READY is copied and not read, a missing one is loaded by the
 * rotated-order loader and kept as a load of that file is kept.  The worker runs at nice 19 and
 * in the idle I/O class (background priority), and owns its shards as a rank would: a rank that
 * asks for a shard the worker is loading waits for it, and one whose shard the worker has not
 * reached yet loads it itself.
 *
 * What it costs.  The worker's storage reads are the kernel's count (/proc/self/io
 * read_bytes, its loader's threads included) taken around each read: what a read found READY
 * costs nothing, so a prefetch of what is already there reads nothing and the budget counts
 * only what is loaded.  The budget (--max; by default the region's room not holding data now:
 * its capacity less its reserve and its READY, loading and staged slots) is checked before each
 * read: the prefetch stops where the next read could take more, so that by default it evicts
 * no shard, recently hit or not.  A file it cannot serve is skipped and said: smaller than
 * files.min_read (the shim passes such reads through), or on a file system that refuses
 * O_DIRECT.
 *
 * Paths.  Each PATH, and each file under a directory (symbolic links followed to a regular
 * file), is taken by its real path; one outside files.roots is refused by name (exit status 1,
 * the others still loaded).  A file reached twice is loaded once.
 *
 * Output.  Progress on stderr every 2 s once the work has taken that long; one summary line on
 * stdout at the end: files, bytes loaded (the kernel's count), bytes already there, skipped
 * and why.  Exit status 0, or 1 when a path was refused, a file could not be read, or the
 * worker failed.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmd_common.h"
#include "config.h"
#include "snapshot.h"
#include "sys.h"
#include "value.h"

#define CHUNK	      (8u << 20) /* one pread of the worker */
#define PROGRESS_NS   2000000000ull
#define IOPRIO_IDLE   (3 << 13) /* IOPRIO_PRIO_VALUE(IOPRIO_CLASS_IDLE, 0) */
#define IOPRIO_OF_PID 1		/* IOPRIO_WHO_PROCESS */

static const char usage[] =
    "usage: kvshim prefetch [--config FILE] [--max BYTES] PATH...\n"
    "  -c, --config FILE  use the INI file FILE (as KVSHIM_CONFIG would name it)\n"
    "  -m, --max BYTES    load at most BYTES from storage (K, M, G, T suffixes); default:\n"
    "                     the region's room not holding data now (nothing is evicted)\n"
    "  -h, --help         print this help\n"
    "\n"
    "Loads the files (directories: every file under them) into the region, as the engines'\n"
    "reads would load them, at background priority.  Each PATH must be under files.roots.\n"
    "What is there already is not read again.  Progress on stderr, a summary on stdout.\n";

/* What the worker says of one file, one line each, in the order it was given them. */
enum outcome { DONE, BUDGET, SMALL, NO_DIRECT, FAILED, NOUTCOMES };
static const char *const outcome_word[NOUTCOMES] = {"done", "budget", "small", "no_direct",
						    "failed"};
static const char *const outcome_why[NOUTCOMES] = {
    "", "past the budget", "smaller than files.min_read", "on a file system without O_DIRECT",
    "unreadable"};

struct prefetch_opts {
	uint64_t max;
	bool has_max, worker;
};

static int on_opt(void *arg, int opt, const char *optarg)
{
	struct prefetch_opts *o = arg;

	if (opt == 'W') {
		o->worker = true;
		return 0;
	}
	if (kvs_parse_size(optarg, &o->max)) {
		tool_err("prefetch: --max takes a byte count (4G, 512M, ...), not %s", optarg);
		return KVS_EXIT_USAGE;
	}
	o->has_max = true;
	return 0;
}

/* ------------------------------------------------------------------ the worker */

/* The kernel's count of what this process read from storage (threads included). */
static uint64_t storage_read(void)
{
	char line[128];
	uint64_t v = 0;
	FILE *f = fopen("/proc/self/io", "re");

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "read_bytes: %" SCNu64, &v) == 1)
			break;
	if (f)
		fclose(f);
	return v;
}

/* Read path whole through the shim while *loaded stays within budget; its outcome, with the
 * bytes it loaded and the bytes it found there added to *loaded and *present. */
static enum outcome load_file(const char *path, char *buf, const struct kvs_config *cfg,
			      uint64_t budget, uint64_t *loaded, uint64_t *present)
{
	int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	enum outcome out = DONE;
	struct stat st;

	if (fd < 0)
		return errno == EINVAL ? NO_DIRECT : FAILED;
	if (fstat(fd, &st) < 0) {
		close(fd);
		return FAILED;
	}
	if ((uint64_t)st.st_size < cfg->files_min_read) {
		close(fd);
		return SMALL;
	}
	for (uint64_t off = 0; off < (uint64_t)st.st_size;) {
		/* Whole shards, as many as the budget may still take: a shard is loaded whole. */
		uint64_t S = cfg->cache_shard_size;
		uint64_t room = budget > *loaded ? (budget - *loaded) / S * S : 0;
		uint64_t want = (uint64_t)st.st_size - off;

		if (want > CHUNK)
			want = CHUNK;
		if (want > room && room < CHUNK) {
			if (!room) {
				out = BUDGET;
				break;
			}
			want = room;
		}
		uint64_t before = storage_read();
		/* O_DIRECT wants whole blocks: the last read asks to a page and gets the rest. */
		ssize_t n = pread(fd, buf, (want + 4095) & ~4095ull, (off_t)off);
		if (n <= 0) {
			out = n == 0 ? DONE : FAILED;
			break;
		}
		uint64_t got = (uint64_t)n, read = storage_read() - before;
		*loaded += read;
		*present += got > read ? got - read : 0;
		off += got;
	}
	close(fd);
	return out;
}

/* The worker: paths on stdin, NUL-separated; for each, "OUTCOME LOADED PRESENT\n" on stdout. */
static int worker(uint64_t budget)
{
	struct kvs_config *cfg;
	char *path = NULL, *buf;
	size_t cap = 0;
	uint64_t loaded = 0;

	if (tool_load_config(&cfg))
		return KVS_EXIT_FAIL;
	buf = aligned_alloc(4096, CHUNK);
	if (!buf) {
		tool_err("prefetch: out of memory");
		free(cfg);
		return KVS_EXIT_FAIL;
	}
	while (getdelim(&path, &cap, '\0', stdin) > 0) {
		uint64_t l = 0, p = 0;
		enum outcome o =
		    load_file(path, buf, cfg, budget > loaded ? budget - loaded : 0, &l, &p);

		loaded += l;
		printf("%s %" PRIu64 " %" PRIu64 "\n", outcome_word[o], l, p);
		fflush(stdout);
	}
	free(path);
	free(buf);
	free(cfg);
	return KVS_EXIT_OK;
}

/* ------------------------------------------------------------------ the paths */

struct file_list {
	char **path;
	dev_t *dev;
	ino_t *ino;
	size_t n, cap;
	uint64_t bytes;
};

/* Add real (a regular file's real path) unless the list has its file already. */
static int add_file(struct file_list *l, const char *real, const struct stat *st)
{
	for (size_t i = 0; i < l->n; i++)
		if (l->dev[i] == st->st_dev && l->ino[i] == st->st_ino)
			return 0;
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		char **p = realloc(l->path, cap * sizeof(*p));
		dev_t *d = p ? realloc(l->dev, cap * sizeof(*d)) : NULL;
		ino_t *i = d ? realloc(l->ino, cap * sizeof(*i)) : NULL;

		if (p)
			l->path = p;
		if (d)
			l->dev = d;
		if (!i)
			return -ENOMEM;
		l->ino = i;
		l->cap = cap;
	}
	l->path[l->n] = strdup(real);
	if (!l->path[l->n])
		return -ENOMEM;
	l->dev[l->n] = st->st_dev;
	l->ino[l->n] = st->st_ino;
	l->n++;
	l->bytes += (uint64_t)st->st_size;
	return 0;
}

struct walk {
	const struct kvs_config *cfg;
	struct file_list *files;
	unsigned refused, unreadable;
};

/* path, named by the operator or found under a directory they named: a regular file is
 * added, a directory walked, anything else passed over.  -ENOMEM ends the walk. */
static int take_path(struct walk *w, const char *path, int depth)
{
	char real[PATH_MAX];
	struct stat st;

	if (!realpath(path, real) || stat(real, &st) < 0) {
		tool_err("prefetch: %s: %s", path, strerror(errno));
		w->unreadable++;
		return 0;
	}
	if (!tool_listed_under(w->cfg->files_roots, real)) {
		tool_err("prefetch: %s: not under files.roots (%s): refused", path,
			 w->cfg->files_roots);
		w->refused++;
		return 0;
	}
	if (S_ISREG(st.st_mode))
		return add_file(w->files, real, &st);
	if (!S_ISDIR(st.st_mode) || depth > 64)
		return 0;
	DIR *d = opendir(real);
	struct dirent *e;
	int r = 0;

	if (!d) {
		tool_err("prefetch: %s: %s", path, strerror(errno));
		w->unreadable++;
		return 0;
	}
	while (!r && (e = readdir(d))) {
		char sub[PATH_MAX];

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (snprintf(sub, sizeof(sub), "%s/%s", real, e->d_name) >= (int)sizeof(sub))
			continue;
		r = take_path(w, sub, depth + 1);
	}
	closedir(d);
	return r;
}

/* ------------------------------------------------------------------ the command */

/* The region's room not holding data now: its capacity less its reserve (slots normal loads
 * never take) and its READY, loading and staged slots; the configuration's capacity where
 * there is no region yet (nothing to evict). */
static uint64_t room_of(const struct kvs_config *cfg)
{
	struct tool_snapshot s = {0};
	struct tool_region region;
	uint64_t room = 0;

	if (tool_snapshot_take(cfg, &s) == 0) {
		const struct kvs_region_info *i = &s.info;
		uint64_t busy =
		    (uint64_t)(i->reserved_slots + i->slots_loading + i->slots_claimed) *
			i->shard_size +
		    i->bytes_ready;

		room = i->capacity_bytes > busy ? i->capacity_bytes - busy : 0;
	} else if (s.err == -ENOENT && tool_region_of(cfg, &region) == 0) {
		room = region.params.capacity; /* 0: auto, sized by the first process */
	}
	tool_snapshot_free(&s);
	return room;
}

/* LD_PRELOAD for the worker: what is there (a sanitizer's runtime must stay first), then lib.
 * It is this program: nothing it loads itself needs to come after the shim. */
static int preload_after(const char *lib)
{
	const char *old = getenv("LD_PRELOAD");
	size_t cap = strlen(lib) + (old ? strlen(old) : 0) + 2, len = strlen(lib);
	char *val = malloc(cap), *p = val;

	if (!val)
		return -1;
	while (old && *old) {
		size_t w = strcspn(old, ": \t");

		if (w && !(w == len && !memcmp(old, lib, len))) {
			memcpy(p, old, w);
			p += w;
			*p++ = ':';
		}
		old += w;
		old += strspn(old, ": \t");
	}
	strcpy(p, lib);
	return setenv("LD_PRELOAD", val, 1);
}

/* Start the worker with the shim preloaded: its stdin *to, its stdout *from.  Its pid, or -1
 * having said why. */
static pid_t start_worker(const char *lib, uint64_t budget, int *to, int *from)
{
	int in[2], out[2];
	char arg[32];
	pid_t pid;

	if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0) {
		tool_err("prefetch: pipe: %s", strerror(errno));
		return -1;
	}
	snprintf(arg, sizeof(arg), "%" PRIu64, budget);
	pid = fork();
	if (pid < 0) {
		tool_err("prefetch: fork: %s", strerror(errno));
		return -1;
	}
	if (pid == 0) {
		dup2(in[0], 0);
		dup2(out[1], 1);
		/* Background priority, inherited by the loader's threads. */
		(void)setpriority(PRIO_PROCESS, 0, 19);
		(void)syscall(SYS_ioprio_set, IOPRIO_OF_PID, 0, IOPRIO_IDLE);
		if (preload_after(lib) < 0)
			_exit(KVS_EXIT_FAIL);
		/* It reads every shard of each file in order: a slot taken ahead of the next read
		 * (loader.prefetch) is one more than the budget counts. */
		setenv("KVSHIM_LOADER_PREFETCH", "off", 1);
		execl("/proc/self/exe", "kvshim", "prefetch", "--worker", arg, (char *)NULL);
		_exit(KVS_EXIT_EXEC);
	}
	close(in[0]);
	close(out[1]);
	*to = in[1];
	*from = out[0];
	return pid;
}

/* Give the worker every path, NUL-separated; it reads them all before it answers. */
static int send_paths(int fd, const struct file_list *l)
{
	for (size_t i = 0; i < l->n; i++) {
		const char *p = l->path[i];
		size_t left = strlen(p) + 1;

		while (left) {
			ssize_t n = write(fd, p, left);

			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0)
				return -errno;
			p += n;
			left -= (size_t)n;
		}
	}
	return 0;
}

struct tally {
	uint64_t loaded, present;
	unsigned files[NOUTCOMES];
};

/* Read the worker's answers into t, saying progress now and then; 0 when every file was
 * answered. */
static int collect(FILE *from, const struct file_list *l, struct tally *t)
{
	uint64_t t0 = kvs_mono_ns(), said = t0;
	char word[16], human[2][32];
	size_t answered = 0;
	uint64_t lo, pr;

	while (answered < l->n && fscanf(from, "%15s %" SCNu64 " %" SCNu64, word, &lo, &pr) == 3) {
		int o = 0;

		while (o < NOUTCOMES && strcmp(word, outcome_word[o]))
			o++;
		if (o == NOUTCOMES)
			break;
		t->files[o]++;
		t->loaded += lo;
		t->present += pr;
		if (o == FAILED)
			tool_err("prefetch: %s: could not be read", l->path[answered]);
		answered++;
		uint64_t now = kvs_mono_ns();
		if (now - said >= PROGRESS_NS) {
			said = now;
			tool_err("prefetch: %zu of %zu files, %s loaded, %s there already",
				 answered, l->n,
				 tool_human_bytes(t->loaded, human[0], sizeof(human[0])),
				 tool_human_bytes(t->present, human[1], sizeof(human[1])));
		}
	}
	return answered == l->n ? 0 : -EPIPE;
}

static void summary(const struct file_list *l, const struct tally *t, uint64_t budget)
{
	char human[3][32];
	bool first = true;

	printf("prefetch: %zu files (%s), %s loaded from storage, %s there already", l->n,
	       tool_human_bytes(l->bytes, human[0], sizeof(human[0])),
	       tool_human_bytes(t->loaded, human[1], sizeof(human[1])),
	       tool_human_bytes(t->present, human[2], sizeof(human[2])));
	for (int o = BUDGET; o < NOUTCOMES; o++) {
		if (!t->files[o])
			continue;
		printf("%s %u %s", first ? "; skipped:" : ",", t->files[o], outcome_why[o]);
		if (o == BUDGET)
			printf(" (%s)", tool_human_bytes(budget, human[0], sizeof(human[0])));
		first = false;
	}
	printf("\n");
}

static void free_list(struct file_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->path[i]);
	free(l->path);
	free(l->dev);
	free(l->ino);
}

/* Run the worker over the list; 0 when it answered for every file and exited 0. */
static int run_worker(const char *lib, const struct file_list *l, uint64_t budget, struct tally *t)
{
	int to, from, st, r;
	pid_t pid = start_worker(lib, budget, &to, &from);
	FILE *f;

	if (pid < 0)
		return -1;
	r = send_paths(to, l);
	close(to);
	f = fdopen(from, "r");
	if (!f) {
		close(from);
		r = -ENOMEM;
	} else {
		if (!r)
			r = collect(f, l, t);
		fclose(f);
	}
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (!r && !(WIFEXITED(st) && WEXITSTATUS(st) == 0))
		r = -ECHILD;
	if (r)
		tool_err("prefetch: the worker (pid %d) stopped before the end: %s", (int)pid,
			 WIFSIGNALED(st) ? strsignal(WTERMSIG(st)) : strerror(-r));
	return r;
}

int cmd_prefetch(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"config", required_argument, NULL, 'c'},
	    {"max", required_argument, NULL, 'm'},
	    {"worker", no_argument, NULL, 'W'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct prefetch_opts o = {0};
	const struct tool_cmdline cl = {.cmd = "prefetch",
					.usage = usage,
					.optstring = "+:c:m:h",
					.opts = opts,
					.use_config = true,
					.on_opt = on_opt,
					.arg = &o,
					.need = "no path named"};
	struct file_list files = {0};
	struct tally t = {0};
	struct kvs_config *cfg = NULL;
	char lib[PATH_MAX], why[KVS_CONFIG_MSG_MAX];
	int status = tool_parse_cmdline(&cl, argc, argv);
	bool config_ok;

	if (status != TOOL_GO_ON)
		return status;
	if (o.worker) /* the hidden half: started by the other, under the shim */
		return worker(strtoull(argv[optind], NULL, 10));
	if (tool_check(true, false, &config_ok)) {
		tool_err("prefetch: not started: with these problems the shim would not serve its "
			 "reads (`kvshim check` says more)");
		return KVS_EXIT_FAIL;
	}
	if (tool_load_config(&cfg))
		return KVS_EXIT_FAIL;
	status = KVS_EXIT_FAIL;
	if (cfg->shim_mode != KVS_MODE_SERVE) {
		tool_err("prefetch: shim.mode is observe: a region of keys holds no data to load");
		goto out;
	}
	if (tool_find_library(lib, why, sizeof(why))) {
		tool_err("%s", why);
		goto out;
	}
	struct walk w = {.cfg = cfg, .files = &files};
	for (int i = optind; i < argc; i++)
		if (take_path(&w, argv[i], 0)) {
			tool_err("prefetch: out of memory");
			goto out;
		}
	uint64_t budget = o.has_max ? o.max : room_of(cfg);
	if (!o.has_max && !budget) /* cache.capacity = auto, no region yet: the worker sizes it */
		budget = UINT64_MAX;
	signal(SIGPIPE, SIG_IGN);
	if (files.n && run_worker(lib, &files, budget, &t))
		goto out;
	summary(&files, &t, budget);
	status = (w.refused || w.unreadable || t.files[FAILED]) ? KVS_EXIT_FAIL : KVS_EXIT_OK;
out:
	free_list(&files);
	free(cfg);
	return status;
}
