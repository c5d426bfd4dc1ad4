/*
 * kvshim check [--config FILE]: validate the configuration and the node before a launch.
 *
 * The checks, in order, each printing its problems with a suggested fix:
 *   environment    KVSHIM_* names kvshim does not read (a misspelt section, key or prefix),
 *                  with the nearest known name: the loader ignores most of them silently;
 *   configuration  kvs_config_load and its one-line message, with a near-miss hint;
 *   roots          files.roots not empty; each root absolute, an existing, readable
 *                  directory (a raw block device is named as one: reads of it go past any
 *                  shim), on a file system that accepts O_DIRECT (an open of a file in
 *                  it, else of a temporary file it makes and removes);
 *   bypass         for each root, the ways KV reads of it can go past the cache that can be
 *                  told before a launch (a FUSE mount of 3FS, whose USRBIO rings no shim
 *                  sees; a file system without O_DIRECT under files.buffered = false), and
 *                  those counted only when seen (kvshim stat, "not served"): advice, never
 *                  a problem (check_bypass);
 *   store          advice, never a problem: a sample of each root's files; a root whose
 *                  files look written once gets a hint to declare it (files.write_once), a
 *                  declared one whose file system cannot key files by birth a warning
 *                  (check_store); the region's count of files rewritten in place on a
 *                  declared root, a warning when not 0 (check_violations: timestamps
 *                  cannot tell a touch from a rewrite); a root whose files hold more
 *                  than cache.capacity, a warning with a capacity that holds them
 *                  (check_capacity);
 *   pages          cache.dir: a tmpfs or hugetlbfs, the pages a region built there gets
 *                  (kvs_cache_memory), what else the node offers (THP, hugetlb pools and
 *                  mounts) and the one step that would give the region huge pages; a problem
 *                  only with cache.huge_pages = on, or on a file system that is not memory;
 *   region         an existing region against the configuration (kvs_cache_check_config: the
 *                  attacher's mismatch message), or room in cache.dir for a new one
 *                  (kvs_cache_fits: the rule the creator applies);
 *   library        libkvshim.so, found as `kvshim run` finds it.
 * Problems go to stderr ("kvshim: problem: ..." then "kvshim:   fix: ..."); what passed goes
 * to stdout, one "ok" line per check, then a summary.  The launcher runs the same checks
 * quietly (problems, and each warning once per node and configuration: said_before).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache.h"
#include "cmd_common.h"
#include "ring.h"
#include "cache_params.h"
#include "config.h"
#include "handover.h"
#include "hints.h"
#include "snapshot.h"

static const char usage[] =
    "usage: kvshim check [--config FILE]\n"
    "  -c, --config FILE  check the INI file FILE (as KVSHIM_CONFIG would name it)\n"
    "  -h, --help         print this help\n"
    "Checks the KVSHIM_* environment, the configuration, files.roots (absolute, readable,\n"
    "O_DIRECT), cache.dir and the pages it gives, the region (room for it, or its geometry)\n"
    "and the shim library.\n"
    "Prints each problem with a fix on stderr; exit status 1 when there is any.\n";

struct check {
	bool quiet;   /* the launcher: problems only */
	int problems; /* printed so far */
	char cfgmsg[KVS_CONFIG_MSG_MAX];
	char said[PATH_MAX]; /* the launcher: the node's record of warnings said, or "" */
};

/* Has this warning (its text, with the configuration's) been said on this node already?  The
 * launcher runs the checks once per engine process it starts (8 ranks: 8 times); a warning is
 * advice, so it is said once per node and configuration: a record of the warnings' hashes
 * beside the region (tool_said_path, 0600), appended under a lock.  Without a record (no
 * cache.dir), every launch says it. */
static bool said_before(struct check *ck, const char *text)
{
	uint64_t h = 0xcbf29ce484222325ull, seen;
	bool found = false;

	if (!ck->quiet || !ck->said[0])
		return false;
	for (const char *p = ck->cfgmsg; *p; p++)
		h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
	for (const char *p = text; *p; p++)
		h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
	int fd = open(ck->said, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return false;
	if (flock(fd, LOCK_EX) == 0) {
		while (!found && read(fd, &seen, sizeof(seen)) == (ssize_t)sizeof(seen))
			found = seen == h;
		if (!found && write(fd, &h, sizeof(h)) != (ssize_t)sizeof(h))
			found = false; /* not recorded: said again next time */
	}
	close(fd);
	return found;
}

/* A warning: advice, never a problem; on stderr, once per node for the launcher. */
__attribute__((format(printf, 2, 3))) static void warning(struct check *ck, const char *fmt, ...)
{
	char text[2 * PATH_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	if (!said_before(ck, text))
		fprintf(stderr, "kvshim: warning: %s\n", text);
}

/* One problem and its fix, on stderr. */
__attribute__((format(printf, 3, 4))) static void problem(struct check *ck, const char *fix,
							  const char *fmt, ...)
{
	va_list ap;

	ck->problems++;
	fputs("kvshim: problem: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nkvshim:   fix: %s\n", fix);
}

/* A check that passed, or a remark, on stdout (not for the launcher). */
__attribute__((format(printf, 2, 3))) static void ok(struct check *ck, const char *fmt, ...)
{
	va_list ap;

	if (ck->quiet)
		return;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
}

/* KVSHIM_* names (and near spellings) that kvshim does not read.  The one that the loader's
 * message already names is left to the configuration check. */
static void check_env(struct check *ck)
{
	char name[256], near[128], fix[256], said[300];
	int before = ck->problems;

	for (char **e = environ; *e; e++) {
		const char *eq = strchr(*e, '=');
		size_t len = eq ? (size_t)(eq - *e) : strlen(*e);

		if (!kvs_config_env_suspect(*e, len))
			continue;
		snprintf(name, sizeof(name), "%.*s", (int)len, *e);
		snprintf(said, sizeof(said), "environment: %s:", name);
		if (strstr(ck->cfgmsg, said))
			continue;
		if (kvs_config_near(name, near, sizeof(near)) >= 0)
			snprintf(fix, sizeof(fix),
				 "did you mean %s? (`kvshim config --explain` "
				 "lists the keys)",
				 near);
		else
			snprintf(fix, sizeof(fix),
				 "unset it; `kvshim config --explain` lists the "
				 "keys (KVSHIM_<SECTION>_<KEY>)");
		problem(ck, fix, "environment: %s is not a kvshim variable; it is ignored", name);
	}
	if (ck->problems == before)
		ok(ck, "ok   environment: every KVSHIM_* variable is known");
}

/* Whether the file system of directory dir accepts O_DIRECT: 1 yes, 0 no, -errno when it
 * cannot be told (no regular file to open and none can be made). */
static int takes_odirect(const char *dir)
{
	char path[PATH_MAX + 64];
	unsigned rnd = 0;
	struct dirent *de;
	int fd, r = -ENOENT;
	DIR *d;

	/* A file already there: the engine's own files are the best witness. */
	d = opendir(dir);
	if (!d)
		return -errno;
	while ((de = readdir(d))) {
		struct stat st;

		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
			continue;
		fd = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECT | O_CLOEXEC | O_NOFOLLOW);
		if (fd >= 0) {
			close(fd);
			r = 1;
			break;
		}
		if (errno == EINVAL) {
			r = 0;
			break;
		}
	}
	closedir(d);
	if (r >= 0)
		return r;

	/* None readable: make one, and take it away again. */
	if (getrandom(&rnd, sizeof(rnd), 0) < 0)
		rnd = (unsigned)getpid();
	snprintf(path, sizeof(path), "%s/.kvshim-check.%d.%08x", dir, (int)getpid(), rnd);
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd >= 0) {
		close(fd);
		unlink(path);
		return 1;
	}
	if (errno != EINVAL)
		return -errno;
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -errno;
	close(fd);
	unlink(path);
	return 0;
}

/* The mount of /proc/self/mountinfo that holds path (the longest mount point that is a prefix
 * of it): its file system type and source, into type and src.  0, or -errno. */
static int mount_of(const char *path, char *type, size_t tlen, char *src, size_t slen)
{
	char line[PATH_MAX * 2], best[PATH_MAX] = "";
	size_t bestlen = 0;
	FILE *f = fopen("/proc/self/mountinfo", "re");

	if (!f)
		return -errno;
	type[0] = src[0] = '\0';
	while (fgets(line, sizeof(line), f)) {
		char mnt[PATH_MAX], fst[128], source[PATH_MAX];
		const char *dash = strstr(line, " - ");

		/* id parent major:minor root mount-point options ... - type source super */
		if (!dash || sscanf(line, "%*s %*s %*s %*s %4095s", mnt) != 1 ||
		    sscanf(dash + 3, "%127s %4095s", fst, source) != 2)
			continue;
		size_t n = strlen(mnt);
		bool under = (n == 1 && mnt[0] == '/') ||
			     (!strncmp(path, mnt, n) && (path[n] == '/' || path[n] == '\0'));
		if (!under || n < bestlen)
			continue;
		bestlen = n;
		snprintf(best, sizeof(best), "%s", mnt);
		snprintf(type, tlen, "%s", fst);
		snprintf(src, slen, "%s", source);
	}
	fclose(f);
	return best[0] ? 0 : -ENOENT;
}

/* Whether s contains "3fs" in any case. */
static bool names_3fs(const char *s)
{
	for (; *s; s++)
		if (s[0] == '3' && (s[1] == 'f' || s[1] == 'F') && (s[2] == 's' || s[2] == 'S'))
			return true;
	return false;
}

/* What can take KV reads of root past the cache, as far as it can be told before a launch
 * (odirect: what takes_odirect said).  Advice on stdout: the operator learns before the
 * launch which figures will read 1.0x for a reason the shim cannot change. */
static void check_bypass(struct check *ck, const struct kvs_config *cfg, const char *root,
			 int odirect)
{
	char real[PATH_MAX], type[128], src[PATH_MAX];

	if (!realpath(root, real) || mount_of(real, type, sizeof(type), src, sizeof(src)))
		return;
	if (!strncmp(type, "fuse", 4) && (names_3fs(type) || names_3fs(src)))
		ok(ck,
		   "note bypass: %s is a FUSE mount of 3FS (%s, %s): clients that read it through "
		   "USRBIO rings (hf3fs_iovcreate, hf3fs_prep_io: 3FS's own KV clients) hand their "
		   "reads to the FUSE daemon's shared memory, which no shim sees; only its POSIX "
		   "reads can be served",
		   root, type, src);
	if (odirect == 0 && !cfg->files_buffered)
		ok(ck,
		   "note bypass: %s (%s) takes no O_DIRECT: every read of it is buffered and "
		   "passes through (counted in unserved_buffered)",
		   root, type);
	ok(ck,
	   "ok   bypass: %s (%s): seen only when they happen, and then counted with their "
	   "bytes in `kvshim stat` (\"not served\"): buffered reads%s, memory-mapped stores "
	   "(mmap), io_uring READ_FIXED into registered buffers and SQPOLL rings; never seen: "
	   "SPDK and raw block devices (not files)",
	   root, type, cfg->files_buffered ? " (none: files.buffered = true)" : "");
}

/* files.roots: not empty; each absolute, an existing readable directory, O_DIRECT. */
static void check_roots(struct check *ck, const struct kvs_config *cfg)
{
	const char *p = cfg->files_roots;
	char root[PATH_MAX];
	int nroots = 0;

	if (!*p) {
		problem(ck,
			"set files.roots (KVSHIM_FILES_ROOTS) to the directories that hold the KV "
			"files, colon-separated",
			"files.roots is empty: the shim serves nothing");
		return;
	}
	for (;;) {
		const char *end = strchr(p, ':');
		size_t n = end ? (size_t)(end - p) : strlen(p);
		int before = ck->problems, r;
		struct stat st;

		if (n >= sizeof(root)) {
			problem(ck, "shorten the path",
				"files.roots: a root of %zu bytes is too long", n);
			goto next;
		}
		memcpy(root, p, n);
		root[n] = '\0';
		if (!n)
			goto next;
		nroots++;
		if (root[0] != '/') {
			problem(ck,
				"give the absolute path (a relative one depends on each engine's "
				"working directory)",
				"files.roots: %s is not an absolute path", root);
			goto next;
		}
		if (stat(root, &st) < 0) {
			problem(ck, "create it, or correct files.roots", "files.roots: %s: %s",
				root, strerror(errno));
			goto next;
		}
		if (S_ISBLK(st.st_mode)) {
			problem(ck,
				"keep the KV files in a file system and name its directory: the "
				"cache serves files, and no shim sees the reads of a raw block "
				"device (nor SPDK's, which bypass the kernel)",
				"files.roots: %s is a raw block device: its reads go past any shim",
				root);
			goto next;
		}
		if (!S_ISDIR(st.st_mode)) {
			problem(ck, "name the directory that holds the KV files",
				"files.roots: %s is not a directory", root);
			goto next;
		}
		if (access(root, R_OK | X_OK) < 0) {
			problem(ck, "give the engine's user read and search permission on it",
				"files.roots: %s is not readable: %s", root, strerror(errno));
			goto next;
		}
		r = takes_odirect(root);
		if (r == 0 && !cfg->files_buffered)
			problem(
			    ck,
			    "keep the KV files on a file system with O_DIRECT (ext4, xfs; tmpfs "
			    "from Linux 6.6), or set files.buffered = true to serve buffered reads",
			    "files.roots: the file system of %s does not accept O_DIRECT: the shim "
			    "serves only O_DIRECT reads (files.buffered = false)",
			    root);
		else if (r < 0)
			ok(ck, "note files.roots: %s: cannot tell whether it accepts O_DIRECT (%s)",
			   root, strerror(-r));
		if (ck->problems == before)
			ok(ck, "ok   files.roots: %s", root);
		check_bypass(ck, cfg, root, r);
	next:
		if (!end)
			break;
		p = end + 1;
	}
	if (!nroots)
		problem(ck, "set files.roots to the directories that hold the KV files",
			"files.roots \"%s\" names no directory: the shim serves nothing",
			cfg->files_roots);
}

/*
 * What a sample of a store's files says about how they are written (files.write_once).  A
 * file written once (created, written, renamed into place, never rewritten) has its last data
 * change within a minute (or files.settle, if longer) of its birth; one rewritten in place,
 * later.  The walk looks at up to KVS_SAMPLE regular files, KVS_SAMPLE_DEPTH directories deep
 * and KVS_SAMPLE_ENTRIES directory entries in all, in directory order, following no symbolic
 * link.
 */
#define KVS_SAMPLE	   64
#define KVS_SAMPLE_DEPTH   4
#define KVS_SAMPLE_ENTRIES 4096

struct sample {
	int files, once, no_id; /* no_id: no birth id there (kvs_ident_by_birth) */
	int entries;		/* directory entries looked at so far */
};

static void sample_dir(int dirfd, const char *path, int depth, uint64_t once_ns, struct sample *sm)
{
	DIR *d = fdopendir(dirfd);
	struct dirent *de;

	if (!d) {
		close(dirfd);
		return;
	}
	while (sm->files < KVS_SAMPLE && sm->entries < KVS_SAMPLE_ENTRIES && (de = readdir(d))) {
		struct stat st;

		sm->entries++;
		if (de->d_name[0] == '.' ||
		    fstatat(dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
			continue;
		if (S_ISDIR(st.st_mode) && depth < KVS_SAMPLE_DEPTH) {
			char sub[PATH_MAX];
			int fd = openat(dirfd, de->d_name,
					O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);

			snprintf(sub, sizeof(sub), "%s/%s", path, de->d_name);
			if (fd >= 0)
				sample_dir(fd, sub, depth + 1, once_ns, sm);
			continue;
		}
		if (!S_ISREG(st.st_mode) || st.st_size == 0)
			continue;
		int fd = openat(dirfd, de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
		struct kvs_ident id;
		if (fd < 0)
			continue;
		int r = kvs_ident_of_fd(fd, true, &id);
		close(fd);
		if (r)
			continue;
		sm->files++;
		if (!id.write_once) {
			sm->no_id++;
			continue;
		}
		if (!id.has_btime)
			continue; /* a generation alone says nothing of when it was written */
		uint64_t b = kvs_time_ns(id.btime), m = kvs_time_ns(id.mtime);
		if (m <= b || m - b <= once_ns)
			sm->once++;
	}
	closedir(d);
}

/* Is path under one of the colon-separated directories of list (as written, and canonical)? */
bool tool_listed_under(const char *list, const char *path)
{
	char dir[PATH_MAX], real[PATH_MAX];
	const char *p = list;

	while (*p) {
		const char *end = strchr(p, ':');
		size_t n = end ? (size_t)(end - p) : strlen(p);

		if (n && n < sizeof(dir)) {
			memcpy(dir, p, n);
			dir[n] = '\0';
			if (realpath(dir, real)) {
				size_t k = strlen(real);

				if (k == 1 || (strncmp(path, real, k) == 0 &&
					       (path[k] == '/' || path[k] == '\0')))
					return true;
			}
		}
		if (!end)
			break;
		p = end + 1;
	}
	return false;
}

/* files.write_once against the store: each write-once directory within files.roots, its
 * files keyed by birth and not rewritten; and a hint for a root that looks written once but
 * is not declared.  Advice only: nothing here blocks a launch. */
static void check_store(struct check *ck, const struct kvs_config *cfg)
{
	const char *lists[2] = {cfg->files_roots, cfg->files_write_once};
	/* Written once: last changed within this of its birth.  A long save (a large model
	 * downloaded, then renamed) takes seconds; a rewrite in place comes much later. */
	uint64_t settle_ms = cfg->files_settle >= 0 ? (uint64_t)cfg->files_settle : 2000;
	uint64_t once_ns = (settle_ms > 60000 ? settle_ms : 60000) * 1000000ull;

	for (int l = 0; l < 2; l++) {
		const char *p = lists[l];

		while (*p) {
			const char *end = strchr(p, ':');
			size_t n = end ? (size_t)(end - p) : strlen(p);
			char dir[PATH_MAX], real[PATH_MAX];
			struct sample sm = {0};
			int fd;

			if (!n || n >= sizeof(dir))
				goto next;
			memcpy(dir, p, n);
			dir[n] = '\0';
			if (!realpath(dir, real))
				goto next;
			bool declared = tool_listed_under(cfg->files_write_once, real);
			if (l == 1 && !tool_listed_under(cfg->files_roots, real)) {
				warning(
				    ck,
				    "files.write_once: %s is not within files.roots: it changes "
				    "nothing",
				    dir);
				goto next;
			}
			if (l == 0 && declared)
				goto next; /* said below, as a write-once directory */
			fd = open(real, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			if (fd < 0)
				goto next;
			sample_dir(fd, real, 0, once_ns, &sm);
			if (l == 1 && sm.no_id)
				warning(
				    ck,
				    "files.write_once: %s is on a file system that gives no inode "
				    "generation: its files are kept as files.roots keeps them (by "
				    "change times, with files.settle)",
				    dir);
			else if (l == 1 && !sm.files)
				ok(ck, "ok   files.write_once: %s (no files yet)", dir);
			else if (l == 1)
				ok(ck,
				   "ok   files.write_once: %s (%d sampled files, keyed by birth)",
				   dir, sm.files);
			else if (sm.files >= 4 && sm.once == sm.files)
				ok(ck,
				   "hint files.roots: the %d sampled files of %s look written once "
				   "(each "
				   "last changed within a minute of its birth); if the store never "
				   "rewrites a file in place (UCM, vLLM, LMCache, SGLang, llm-d, "
				   "model "
				   "weights), declare it: files.write_once = %s "
				   "(docs/operations.md, "
				   "\"Write-once roots\")",
				   sm.files, dir, dir);
		next:
			if (!end)
				break;
			p = end + 1;
		}
	}
}

/* The bytes of the regular files under dir (fd, its descriptor, closed here), walked without
 * following a symbolic link, at most *left entries in all (each entry looked at takes one). */
static uint64_t tree_bytes(int fd, int depth, long *left)
{
	DIR *d = fdopendir(fd);
	struct dirent *de;
	uint64_t sum = 0;

	if (!d) {
		close(fd);
		return 0;
	}
	while (*left > 0 && (de = readdir(d))) {
		struct stat st;

		(*left)--;
		if ((de->d_name[0] == '.' &&
		     (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2]))) ||
		    fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
			continue;
		if (S_ISREG(st.st_mode)) {
			sum += (uint64_t)st.st_size;
		} else if (S_ISDIR(st.st_mode) && depth < 16) {
			int sub = openat(dirfd(d), de->d_name,
					 O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
			if (sub >= 0)
				sum += tree_bytes(sub, depth + 1, left);
		}
	}
	closedir(d);
	return sum;
}

/* Each root against cache.capacity: a root whose files do not fit in the region is read from
 * storage again at every load past what fits (its shards evict each other), with nothing else
 * said.  Advice with a figure: the capacity that holds the root (the files counted in a walk of
 * at most 100,000 entries: "at least" when the walk stopped). */
static void check_capacity(struct check *ck, const struct kvs_config *cfg)
{
	const char *p = cfg->files_roots;
	char a[32], b[32], c[32];

	while (*p) {
		const char *end = strchr(p, ':');
		size_t n = end ? (size_t)(end - p) : strlen(p);
		char dir[PATH_MAX];
		long left = 100000;
		int fd;

		if (n && n < sizeof(dir)) {
			memcpy(dir, p, n);
			dir[n] = '\0';
			if ((fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
				uint64_t bytes = tree_bytes(fd, 0, &left);

				if (bytes > cfg->cache_capacity)
					warning(
					    ck,
					    "cache.capacity: the files of %s hold %s%s, more than "
					    "the region's %s: a load of them all evicts its own "
					    "shards and reads storage again each time; set "
					    "cache.capacity = %s (or more) if the node has the "
					    "memory",
					    dir, left <= 0 ? "at least " : "",
					    tool_human_bytes(bytes, a, sizeof(a)),
					    tool_human_bytes(cfg->cache_capacity, b, sizeof(b)),
					    tool_human_bytes((bytes + (1ull << 30) - 1) &
								 ~((1ull << 30) - 1),
							     c, sizeof(c)));
			}
		}
		if (!end)
			break;
		p = end + 1;
	}
}

/* files.write_once against what the region counted: a rewrite in place of a file there by a
 * process under the shim is counted (write_once_violations) and named by that process's
 * warning.  Timestamps cannot tell a touch (UCM's utime on every lookup) from a rewrite; the
 * count can. */
static void check_violations(struct check *ck, const struct kvs_config *cfg)
{
	struct tool_snapshot *s;

	if (!cfg->files_write_once[0] || !(s = calloc(1, sizeof(*s))))
		return;
	if (tool_snapshot_take(cfg, s) == 0) {
		uint64_t v = s->totals.v[KVS_CTR_write_once_violations];

		if (v)
			warning(
			    ck,
			    "files.write_once: the region counted %llu file%s rewritten in "
			    "place on a write-once root (write_once_violations; the warning of "
			    "the process that did it names the file): readers may have been "
			    "served old bytes until then; take that root out of "
			    "files.write_once, or see \"Write-once roots\" in docs/operations.md",
			    (unsigned long long)v, v == 1 ? "" : "s");
		else
			ok(ck, "ok   files.write_once: no file rewritten in place (the region's "
			       "write_once_violations is 0)");
	}
	tool_snapshot_free(s);
	free(s);
}

/* What the region counted of reads the shim could not see (unseen.h): a loader that reads
 * with inline system calls (runai-model-streamer's io_uring_direct) is served nothing. */
static void check_unseen(struct check *ck, const struct kvs_config *cfg)
{
	struct tool_snapshot *s = calloc(1, sizeof(*s));

	if (!s)
		return;
	if (tool_snapshot_take(cfg, s) == 0 && s->totals.v[KVS_CTR_unserved_unseen])
		warning(ck,
			"reads made by inline system calls: not served: %llu O_DIRECT opens of KV "
			"files were closed with no read the shim saw (unserved_unseen): a loader "
			"with its own io_uring or libaio code that makes system calls itself "
			"(runai-model-streamer's io_uring_direct) reads storage as without the "
			"shim; give it a libc door (runai: libaio_direct or sync_buffered)",
			(unsigned long long)s->totals.v[KVS_CTR_unserved_unseen]);
	tool_snapshot_free(s);
	free(s);
}

/* remote.kind = mooncake: the keys the helper needs, and a helper beating at the ring. */
static void check_remote(struct check *ck, const struct kvs_config *cfg)
{
	struct kvs_cache_params params = kvs_cache_params_of(cfg);
	char ring_path[PATH_MAX];
	struct kvs_ring *r = NULL;

	if (cfg->remote_kind == KVS_REMOTE_NONE)
		return;
	if (!cfg->files_write_once[0])
		warning(ck, "remote.kind = mooncake with files.write_once empty: only files of "
			    "write-once roots are shared between nodes, so nothing will be");
	if (strlen(cfg->remote_namespace) > 64)
		warning(ck,
			"remote.namespace is longer than 64 bytes: the engines leave the remote "
			"tier off");
	if (!cfg->remote_master[0] || !cfg->remote_host[0])
		warning(ck, "remote.%s is not set: `kvshim remote` refuses to start without it",
			cfg->remote_master[0] ? "host" : "master");
	if (kvs_cache_path(&params, ring_path, sizeof(ring_path) - 8))
		return;
	strcat(ring_path, ".remote");
	if (kvs_ring_map(ring_path, 0, (uint32_t)cfg->cache_mode, &r) == 0 && kvs_ring_alive(r))
		ok(ck, "ok   remote: a helper (pid %d) serves %s", kvs_ring_helper_pid(r),
		   ring_path);
	else
		warning(ck,
			"remote: no helper serves %s: misses read storage until `kvshim remote` "
			"runs for this region",
			ring_path);
	kvs_ring_unmap(r);
}

/* A number from a sysfs file, 0 if it cannot be read. */
static unsigned long long sysfs_u64(const char *dir, const char *name)
{
	unsigned long long v = 0;
	char path[1024];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "r");
	if (f) {
		if (fscanf(f, "%llu", &v) != 1)
			v = 0;
		fclose(f);
	}
	return v;
}

/* What the node offers besides cache.dir, on one line into buf: the hugetlb pools (pages of
 * each size, and those neither used nor reserved) and the hugetlbfs mounts. */
static void node_offers(char *buf, size_t len)
{
	const char *pools = "/sys/kernel/mm/hugepages";
	char line[4096], dir[512], sz[32], *mnt, *opt, *sep;
	size_t n = 0, before;
	DIR *d;
	FILE *f;

	n += (size_t)snprintf(buf + n, len - n, "hugetlb pools:");
	before = n;
	d = opendir(pools);
	for (struct dirent *e; d && (e = readdir(d)) && n < len;) {
		unsigned long long kb, total, free_p, resv;

		if (sscanf(e->d_name, "hugepages-%llukB", &kb) != 1)
			continue;
		snprintf(dir, sizeof(dir), "%s/%s", pools, e->d_name);
		total = sysfs_u64(dir, "nr_hugepages");
		free_p = sysfs_u64(dir, "free_hugepages");
		resv = sysfs_u64(dir, "resv_hugepages");
		n += (size_t)snprintf(buf + n, len - n, "%s %s: %llu pages, %llu free",
				      n == before ? "" : ";",
				      tool_human_bytes(kb << 10, sz, sizeof(sz)), total,
				      free_p > resv ? free_p - resv : 0);
	}
	if (d)
		closedir(d);
	if (n == before && n < len)
		n += (size_t)snprintf(buf + n, len - n, " none");
	if (n < len)
		n += (size_t)snprintf(buf + n, len - n, "; hugetlbfs mounts:");
	before = n;
	f = fopen("/proc/self/mountinfo", "r");
	while (f && fgets(line, sizeof(line), f) && n < len) {
		/* ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS ... - FSTYPE SOURCE SUPEROPTS */
		sep = strstr(line, " - ");
		if (!sep || strncmp(sep + 3, "hugetlbfs ", 10))
			continue;
		mnt = line;
		for (int i = 0; i < 4 && mnt; i++)
			mnt = strchr(mnt + 1, ' ');
		if (!mnt)
			continue;
		mnt++;
		mnt[strcspn(mnt, " ")] = '\0';
		opt = strstr(sep, "pagesize=");
		n += (size_t)snprintf(buf + n, len - n, " %s (pagesize %.*s)", mnt,
				      opt ? (int)strcspn(opt + 9, ",\n") : 7,
				      opt ? opt + 9 : "default");
	}
	if (f)
		fclose(f);
	if (n == before && n < len)
		snprintf(buf + n, len - n, " none");
}

/* cache.dir and the pages a region built there gets; what the node offers besides, and the
 * step that would give the region huge pages. */
static void check_pages(struct check *ck, const struct kvs_config *cfg)
{
	char fix[320], sz[32], offers[1024];
	struct kvs_memory m;
	int r;

	r = kvs_cache_memory(KVS_CACHE_PARAMS(cfg), &m);
	if (r) {
		problem(ck, "set cache.dir to an existing tmpfs (/dev/shm) or hugetlbfs directory",
			"cache.dir %s: %s: no region can be built there", cfg->cache_dir,
			strerror(-r));
		return;
	}
	if (!m.tmpfs && !m.hugetlbfs)
		problem(ck, "set cache.dir to a tmpfs (/dev/shm) or a hugetlbfs mount",
			"cache.dir %s is not a tmpfs or hugetlbfs (file system %s): the region "
			"would live in storage's page cache, written back to the disk",
			cfg->cache_dir, m.fs);
	tool_human_bytes(m.page_size, sz, sizeof(sz));
	kvs_memory_fix(&m, cfg->cache_dir, fix, sizeof(fix));
	if (m.hugetlbfs)
		ok(ck, "ok   pages: %s is a hugetlbfs: a region there gets %s pages (%s)",
		   cfg->cache_dir, sz, fix);
	else if (m.kind != KVS_PAGE_BASE)
		ok(ck, "ok   pages: %s is a tmpfs (huge=%s%s%s): a region there gets %s pages%s",
		   cfg->cache_dir, m.huge, *m.shmem_enabled ? ", THP shmem_enabled " : "",
		   m.shmem_enabled, sz,
		   m.kind == KVS_PAGE_ADVISE ? " by MADV_HUGEPAGE (cache.huge_pages)" : "");
	else if (cfg->cache_huge_pages == KVS_HUGE_ON)
		problem(
		    ck, fix,
		    "cache.huge_pages = on, but %s (%s%s%s) gives no huge pages: a region there "
		    "gets 4 KiB pages",
		    cfg->cache_dir, m.fs, *m.huge ? ", huge=" : "", m.huge);
	else
		ok(ck, "note pages: %s (%s%s%s) gives a region 4 KiB pages%s; for huge pages: %s",
		   cfg->cache_dir, m.fs, *m.huge ? ", huge=" : "", m.huge,
		   cfg->cache_huge_pages == KVS_HUGE_OFF ? " (cache.huge_pages = off)" : "", fix);
	node_offers(offers, sizeof(offers));
	ok(ck, "note pages: this node: THP %s (shmem_enabled %s); %s",
	   m.thp_size ? tool_human_bytes(m.thp_size, sz, sizeof(sz)) : "absent",
	   *m.shmem_enabled ? m.shmem_enabled : "-", offers);
}

/* The region: an existing one against the configuration, else room for a new one. */
/* Is the region at path an older release's that this one hands over from (cache/handover.h)?
 * Then it is no problem: the first engine process of this release fills a region of its own
 * from it.  Said as a note. */
static bool older_release(struct check *ck, const char *path, const struct kvs_config *cfg)
{
	char msg[KVS_CONFIG_MSG_MAX];
	struct kvs_handover h;
	int fd = kvs_cache_open_file(path, O_RDONLY, cfg->cache_mode, msg, sizeof(msg));
	bool older;

	if (fd < 0)
		return false;
	older = kvs_handover_source(fd, &h) == 0;
	close(fd);
	if (older)
		ok(ck,
		   "note region: %s was built by an older release of kvshim (layout %u): the first "
		   "engine process of this one hands its cached shards over to a region of its own "
		   "(docs/operations.md, \"Upgrading kvshim\")",
		   path, h.version);
	return older;
}

static void check_region(struct check *ck, const struct kvs_config *cfg)
{
	char path[PATH_MAX], msg[KVS_CONFIG_MSG_MAX], name[KVS_CONFIG_STR_MAX + 16];
	struct kvs_cache_params params;
	struct kvs_cache *c = NULL;
	int r;

	/* shim.mode = observe: its region of keys, <cache.name>.observe. */
	if (kvs_cache_params_mode(cfg, &params, name, sizeof(name)) ||
	    kvs_cache_path(&params, path, sizeof(path))) {
		problem(ck, "use a shorter cache.name", "cache.name: the region path is too long");
		return;
	}
	if (cfg->shim_mode == KVS_MODE_OBSERVE)
		ok(ck,
		   "note shim.mode = observe: nothing is served; every read goes to storage and "
		   "`kvshim stat` says what the cache would have saved");
	r = kvs_cache_open(&params, KVS_OPEN_WATCH, &c, msg, sizeof(msg));
	if (r == 0) {
		r = kvs_cache_check_config(c, &params, msg, sizeof(msg));
		kvs_cache_close(c);
		if (r)
			problem(ck,
				"stop the engines and run `kvshim reset` (the region is rebuilt at "
				"the next launch), or set the values it was built with",
				"%s; an engine would run without the cache",
				msg[0] ? msg : strerror(-r));
		else
			ok(ck, "ok   region: %s matches the configuration", path);
		return;
	}
	if (r == -ENOENT) {
		r = kvs_cache_fits(&params, msg, sizeof(msg));
		if (r)
			problem(ck,
				"see Sizing in docs/operations.md (docker --shm-size, "
				"a Kubernetes emptyDir with medium: Memory)",
				"%s", msg[0] ? msg : strerror(-r));
		else
			ok(ck, "ok   region: %s is absent; %s has room to build it", path,
			   cfg->cache_dir);
		return;
	}
	if (r == -EPROTO && older_release(ck, path, cfg)) /* handed over at the first attach */
		return;
	problem(ck, "run `kvshim reset` to remove it (with no engine running)", "%s",
		msg[0] ? msg : strerror(-r));
}

int tool_check(bool quiet, bool check_library, bool *config_ok)
{
	struct check ck = {.quiet = quiet};
	struct kvs_config *cfg;
	char lib[PATH_MAX], why[KVS_CONFIG_MSG_MAX], hint[KVS_CONFIG_MSG_MAX];
	int r;

	*config_ok = false;
	cfg = calloc(1, sizeof(*cfg)); /* about 100 KiB of strings: not on the stack */
	if (!cfg) {
		problem(&ck, "free some memory", "out of memory");
		return ck.problems;
	}
	r = kvs_config_load(cfg, NULL, NULL, ck.cfgmsg, sizeof(ck.cfgmsg));
	check_env(&ck);
	if (r) {
		kvs_config_hint(ck.cfgmsg, hint, sizeof(hint));
		problem(&ck, hint, "%s", ck.cfgmsg);
		ok(&ck, "skip files.roots and the region: the configuration does not load");
	} else {
		*config_ok = true;
		ok(&ck, "ok   configuration: %s", cfg->path[0] ? cfg->path : "built-in defaults");
		if (!cfg->shim_enable)
			ok(&ck, "note the shim is off (%s)",
			   cfg->kvshim_enable_env_off ? "KVSHIM_ENABLE=0" : "shim.enable = false");
		char region[PATH_MAX];
		struct kvs_cache_params params;
		char name[KVS_CONFIG_STR_MAX + 16];
		if (quiet && (kvs_cache_params_mode(cfg, &params, name, sizeof(name)) ||
			      kvs_cache_path(&params, region, sizeof(region)) ||
			      tool_said_path(region, ck.said, sizeof(ck.said))))
			ck.said[0] = '\0';
		check_roots(&ck, cfg);
		check_store(&ck, cfg);
		check_violations(&ck, cfg);
		check_unseen(&ck, cfg);
		check_remote(&ck, cfg);
		check_capacity(&ck, cfg);
		check_pages(&ck, cfg);
		check_region(&ck, cfg);
	}
	if (check_library) {
		if (tool_find_library(lib, why, sizeof(why)))
			problem(&ck,
				"set KVSHIM_LIBRARY to the path of libkvshim.so, or install kvshim "
				"(its lib folder beside bin)",
				"%s", why);
		else
			ok(&ck, "ok   library: %s", lib);
	}
	free(cfg);
	return ck.problems;
}

int cmd_check(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"config", required_argument, NULL, 'c'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	const struct tool_cmdline cl = {
	    .cmd = "check", .usage = usage, .optstring = "+:c:h", .opts = opts, .use_config = true};
	bool config_ok;
	int n = tool_parse_cmdline(&cl, argc, argv);

	if (n != TOOL_GO_ON)
		return n;
	n = tool_check(false, true, &config_ok);
	if (n)
		printf("%d problem%s found\n", n, n == 1 ? "" : "s");
	else
		printf("no problems found\n");
	return n ? KVS_EXIT_FAIL : KVS_EXIT_OK;
}
