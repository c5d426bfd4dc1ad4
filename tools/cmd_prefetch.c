/*
 * kvshim prefetch [--config FILE] [--max BYTES] PATH...: load files, and the files of
 * directories (recursively), under files.roots into the region before anyone asks for them.
 *
 * How.  The reads are made by a worker process of this program, started with the shim
 * preloaded (as `kvshim run` starts an engine), which opens each file with O_DIRECT and reads
 * it whole in 8 MiB preads.  The shim serves them as any rank's: each shard is keyed as an
 * engine's read would key it (files.roots, files.write_once, files.settle: the same code, not a
 * copy of it), a shard already READY is copied and not read, a missing one is loaded by the
 * rotated-order loader and kept as a load of that file is kept.  The worker runs at nice 19
 * (background priority; not the idle I/O class, behind which ranks waiting for its shards would
 * starve), and owns its shards as a rank would: a rank that asks for a shard the worker is loading
 * waits for it, and one whose shard the worker has not reached yet loads it itself.
 *
 * What it costs.  The worker's storage reads are the kernel's count (/proc/self/io
 * read_bytes, its loader's threads included) taken around each read: what a read found READY
 * costs nothing, so a prefetch of what is already there reads nothing and the budget counts
 * only what is loaded (on a file system the kernel does not count there, FUSE, NFS, Ceph and
 * the like, every byte read counts as loaded).  The budget (--max; by default the region's
 * room not holding data now: its capacity less its reserve and its READY, loading and staged
 * slots) is checked before each read: the prefetch stops where the next read could take more, so
 * that by default it evicts no shard, recently hit or not.  A file it cannot serve is skipped and
 * said: smaller than files.min_read (the shim passes such reads through), or on a file system that
 * refuses O_DIRECT.
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
#include <sys/vfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmd_common.h"
#include "config.h"
#include "snapshot.h"
#include "sys.h"
#include "value.h"

#define CHUNK	    (8u << 20) /* one pread of the worker */
#define PROGRESS_NS 2000000000ull

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

/* File systems whose reads the kernel does not count in read_bytes (no block layer under them):
 * there every byte read counts as loaded, so that the budget still bounds what is evicted. */
static bool uncounted(int fd)
{
	static const long kinds[] = {
	    0x65735546,	      /* FUSE (GlusterFS, 3FS, s3fs, ...) */
	    0x6969,	      /* NFS */
	    (long)0xff534d42, /* CIFS */
	    (long)0xfe534d42, /* SMB2 */
	    0x00c36400,	      /* Ceph */
	    0x01021997,	      /* 9P */
	    0x0bd00bd0,	      /* Lustre */
	    0x47504653,	      /* GPFS */
	};
	struct statfs sf;

	if (fstatfs(fd, &sf) < 0)
		return true;
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
		if ((long)sf.f_type == kinds[i])
			return true;
	return false;
}

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
	bool all = uncounted(fd);
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
		uint64_t got = (uint64_t)n, read = all ? got : storage_read() - before;
		*loaded += read;
		*present += got > read ? got - read : 0;
		off += got;
	}
	close(fd);
	return out;
}

/* The worker: paths on stdin, NUL-separated, all read before the first answer (the parent
 * writes them all before it reads: answering sooner could fill both pipes); for each, in
 * order, "OUTCOME LOADED PRESENT\n" on stdout. */
static int worker(uint64_t budget)
{
	struct kvs_config *cfg;
	char *list = NULL, *buf;
	size_t len = 0;
	uint64_t loaded = 0;
	FILE *in = open_memstream(&list, &len);
	char chunk[4096];
	size_t n;

	if (!in)
		return KVS_EXIT_FAIL;
	while ((n = fread(chunk, 1, sizeof(chunk), stdin)) > 0)
		fwrite(chunk, 1, n, in);
	if (fclose(in)) {
		free(list);
		return KVS_EXIT_FAIL;
	}
	if (tool_load_config(&cfg)) {
		free(list);
		return KVS_EXIT_FAIL;
	}
	buf = aligned_alloc(4096, CHUNK);
	if (!buf) {
		tool_err("prefetch: out of memory");
		free(cfg);
		free(list);
		return KVS_EXIT_FAIL;
	}
	for (size_t at = 0; at < len; at += strlen(list + at) + 1) {
		uint64_t l = 0, p = 0;
		enum outcome o =
		    load_file(list + at, buf, cfg, budget > loaded ? budget - loaded : 0, &l, &p);

		loaded += l;
		printf("%s %" PRIu64 " %" PRIu64 "\n", outcome_word[o], l, p);
		fflush(stdout);
	}
	free(list);
	free(buf);
	free(cfg);
	return KVS_EXIT_OK;
}

/* ------------------------------------------------------------------ the paths */

struct file_list {
	char **path;
	dev_t *dev;
	ino_t *ino;
	uint64_t *size;
	size_t n, cap;
	uint64_t bytes;
};

/* Add real (a regular file's real path); a file reached twice is dropped by dedupe(). */
static int add_file(struct file_list *l, const char *real, const struct stat *st)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		char **p = realloc(l->path, cap * sizeof(*p));
		dev_t *d = p ? realloc(l->dev, cap * sizeof(*d)) : NULL;
		ino_t *i = d ? realloc(l->ino, cap * sizeof(*i)) : NULL;
		uint64_t *z = i ? realloc(l->size, cap * sizeof(*z)) : NULL;

		if (p)
			l->path = p;
		if (d)
			l->dev = d;
		if (i)
			l->ino = i;
		if (!z)
			return -ENOMEM;
		l->size = z;
		l->cap = cap;
	}
	l->path[l->n] = strdup(real);
	if (!l->path[l->n])
		return -ENOMEM;
	l->dev[l->n] = st->st_dev;
	l->ino[l->n] = st->st_ino;
	l->size[l->n] = (uint64_t)st->st_size;
	l->n++;
	return 0;
}

static const struct file_list *sorting;

static int by_file(const void *a, const void *b)
{
	size_t i = *(const size_t *)a, j = *(const size_t *)b;
	const struct file_list *l = sorting;

	if (l->dev[i] != l->dev[j])
		return l->dev[i] < l->dev[j] ? -1 : 1;
	if (l->ino[i] != l->ino[j])
		return l->ino[i] < l->ino[j] ? -1 : 1;
	return i < j ? -1 : i > j;
}

/* Keep each file once, where it was first reached (a link, a directory named twice). */
static int dedupe(struct file_list *l)
{
	size_t *order = malloc((l->n ? l->n : 1) * sizeof(*order)), k = 0;

	if (!order)
		return -ENOMEM;
	for (size_t i = 0; i < l->n; i++)
		order[i] = i;
	sorting = l;
	qsort(order, l->n, sizeof(*order), by_file);
	for (size_t i = 1; i < l->n; i++)
		if (l->dev[order[i]] == l->dev[order[i - 1]] &&
		    l->ino[order[i]] == l->ino[order[i - 1]]) {
			free(l->path[order[i]]);
			l->path[order[i]] = NULL;
		}
	free(order);
	l->bytes = 0;
	for (size_t i = 0; i < l->n; i++) {
		if (!l->path[i])
			continue;
		l->path[k] = l->path[i];
		l->dev[k] = l->dev[i];
		l->ino[k] = l->ino[i];
		l->size[k] = l->size[i];
		l->bytes += l->size[k];
		k++;
	}
	l->n = k;
	return 0;
}

struct walk {
	const struct kvs_config *cfg;
	struct file_list *files;
	unsigned refused, unreadable;
	struct file_list dirs; /* the directories walked: a link back to one is not walked again */
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
	for (size_t i = 0; i < w->dirs.n; i++)
		if (w->dirs.dev[i] == st.st_dev && w->dirs.ino[i] == st.st_ino)
			return 0; /* walked already: a link to an ancestor, or named twice */
	if (add_file(&w->dirs, real, &st))
		return -ENOMEM;
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
 * there is no region yet (nothing to evict; UINT64_MAX with cache.capacity = auto, which the
 * first process sizes); 0, said, where the region cannot be read. */
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
		room = region.params.capacity ? region.params.capacity : UINT64_MAX;
	} else {
		tool_err("prefetch: %s: nothing is loaded without --max",
			 s.msg[0] ? s.msg : "the region cannot be read");
	}
	tool_snapshot_free(&s);
	return room;
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
		/* Background priority, inherited by the loader's threads: nice 19, which BFQ maps
		 * to the lowest best-effort I/O priority.  Not the idle class: a rank that waits
		 * for a shard this process loads must not wait behind starved I/O. */
		(void)setpriority(PRIO_PROCESS, 0, 19);
		/* After what is there: a sanitizer's runtime must stay first, and the worker is
		 * this program, which loads nothing that must come after the shim. */
		if (tool_set_preload(lib, false))
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
	free(l->size);
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
	struct walk w = {0};
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
	w.cfg = cfg;
	w.files = &files;
	for (int i = optind; i < argc; i++)
		if (take_path(&w, argv[i], 0)) {
			tool_err("prefetch: out of memory");
			goto out;
		}
	if (dedupe(&files)) {
		tool_err("prefetch: out of memory");
		goto out;
	}
	uint64_t budget = o.has_max ? o.max : room_of(cfg);
	signal(SIGPIPE, SIG_IGN);
	if (files.n && run_worker(lib, &files, budget, &t))
		goto out;
	summary(&files, &t, budget);
	status = (w.refused || w.unreadable || t.files[FAILED]) ? KVS_EXIT_FAIL : KVS_EXIT_OK;
out:
	free_list(&files);
	free_list(&w.dirs);
	free(cfg);
	return status;
}
