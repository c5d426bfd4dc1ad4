/*
 * slowfs - a FUSE pass-through file system that makes local storage behave
 * like a slow network file system, for tests and benchmarks.
 *
 *   slowfs [--latency-us N] [--count-file PATH] [--attr-timeout S] [--skew-ms N]
 *          [--fail-threads] SOURCE_DIR MOUNTPOINT [fuse options]
 *
 * Every file and directory under SOURCE_DIR is mirrored read-write at
 * MOUNTPOINT.  Each read request sleeps N microseconds and is then served
 * with pread() on the underlying file, so the cost of a read is one
 * "round trip" regardless of its size, as on NFS or a parallel file system.
 *
 * Files are opened with direct_io: the kernel keeps no page cache for them,
 * every read(2) reaches us, and callers may open with O_DIRECT (we strip
 * O_DIRECT before opening the underlying file, whose file system may not
 * support it).  A 1 MiB aligned read arrives as one request when the kernel
 * allows 256 pages per request (fs.fuse.max_pages_limit, default 256).
 *
 * Attributes and entries are cached by the kernel for ATTR_TIMEOUT seconds
 * (--attr-timeout S: S, as a network file system's client that caches
 * attributes); st_ino, st_size and the timestamps are those of the source
 * files (use_ino), so a program keying on (st_dev, st_ino, st_size, st_mtim)
 * sees stable keys.  Changes made to SOURCE_DIR behind our back may be
 * seen up to that late, as another client's writes are.  --skew-ms N
 * reports every timestamp N milliseconds earlier than the source's (a
 * negative N: later), as a network file system does whose files were
 * stamped by a writer whose clock is behind (or ahead of) this node's.
 *
 * With --fail-threads, a read asked by a thread that is not its process's
 * main thread (FUSE names the asking thread; its /proc status names the
 * process) answers EIO: storage that fails for a reader's helper threads,
 * as kvshim's loader, while the program's own reads succeed.
 *
 * With --count-file PATH, the number of read requests and of bytes served
 * are written to PATH as "reads N\nbytes N\n" before each read is answered,
 * so a test that has finished reading sees final numbers.  PATH must not be
 * inside MOUNTPOINT.
 *
 * DESIGN: libfuse runs the operations on a pool of worker threads (unless
 * -s is given), so reads from several processes sleep concurrently.  The
 * only state shared between workers is struct slowfs:
 *   - src_fd, latency, max_read, attr_timeout, skew_ns, count_path: written
 *     once in main() before fuse_main() starts any thread; read-only
 *     afterwards.
 *   - reads, bytes: C11 atomics, incremented by each read worker.
 *   - count_lock: serialises "snapshot counters, write PATH.tmp, rename"
 *     so that the last rename always carries the largest snapshot (the
 *     counters only grow).  It is held across file I/O on purpose: this is
 *     a test tool and the write is a few microseconds next to the latency.
 * Per-file state is the underlying fd in fi->fh, owned by the open file
 * and closed in release().
 */
#define FUSE_USE_VERSION 31
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define ATTR_TIMEOUT 1.0
#define MAX_THREADS  "64"

/* Marks callback parameters the FUSE signature imposes but we do not need. */
#define UNUSED __attribute__((unused))

struct slowfs {
	int src_fd;
	unsigned int latency;
	unsigned int max_read;
	double attr_timeout;
	long long skew_ns;
	int fail_threads;
	const char *count_path;
	atomic_uint_fast64_t reads;
	atomic_uint_fast64_t bytes;
	pthread_mutex_t count_lock;
};

static struct slowfs fs = {
    .src_fd = -1,
    .attr_timeout = ATTR_TIMEOUT,
    .count_lock = PTHREAD_MUTEX_INITIALIZER,
};

struct cmdline {
	unsigned int latency;
	unsigned int max_read;
	double attr_timeout;
	long long skew_ms;
	int fail_threads;
	char *count_path;
	char *source;
	int nonopts;
	int show_help;
};

enum { KEY_LATENCY, KEY_COUNT_FILE, KEY_MAX_READ, KEY_ATTR_TIMEOUT, KEY_SKEW, KEY_FAIL, KEY_HELP };

/*
 * fuse_opt runs every template that matches, so each option has a single
 * "-x " template (which matches "-x V", "-xV" and so "-x=V") and opt_proc()
 * strips the optional '='.
 */
static const struct fuse_opt slowfs_opts[] = {
    FUSE_OPT_KEY("--latency-us ", KEY_LATENCY),	       /* consumed: fs.latency */
    FUSE_OPT_KEY("--count-file ", KEY_COUNT_FILE),     /* consumed: fs.count_path */
    FUSE_OPT_KEY("--attr-timeout ", KEY_ATTR_TIMEOUT), /* consumed: fs.attr_timeout */
    FUSE_OPT_KEY("--skew-ms ", KEY_SKEW),	       /* consumed: fs.skew_ns */
    FUSE_OPT_KEY("--fail-threads", KEY_FAIL),	       /* consumed: fs.fail_threads */
    FUSE_OPT_KEY("max_read=", KEY_MAX_READ),	       /* kept for the kernel, echoed in init */
    FUSE_OPT_KEY("-h", KEY_HELP),		       /* kept: fuse_main() adds its help */
    FUSE_OPT_KEY("--help", KEY_HELP),
    FUSE_OPT_END,
};

/* Map a FUSE path ("/a/b") to a path relative to src_fd ("a/b", "." for "/"). */
static const char *rel(const char *path)
{
	while (*path == '/')
		path++;
	return *path ? path : ".";
}

/* Return 0 if @r >= 0, else -errno; for libc calls that return -1 on error. */
static int ret_errno(int r)
{
	return r < 0 ? -errno : 0;
}

/* Sleep for the configured latency, resuming after signals. */
static void latency_sleep(void)
{
	struct timespec ts = {
	    .tv_sec = fs.latency / 1000000,
	    .tv_nsec = (long)(fs.latency % 1000000) * 1000,
	};

	if (!fs.latency)
		return;
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* Write the current counters to count_path atomically (tmp + rename); no-op without one. */
static void count_flush(void)
{
	char tmp[PATH_MAX], buf[64];
	int fd, len;

	if (!fs.count_path)
		return;
	if (snprintf(tmp, sizeof(tmp), "%s.tmp", fs.count_path) >= (int)sizeof(tmp))
		return;
	pthread_mutex_lock(&fs.count_lock); /* pairs with unlock below */
	len = snprintf(buf, sizeof(buf), "reads %llu\nbytes %llu\n",
		       (unsigned long long)atomic_load(&fs.reads),
		       (unsigned long long)atomic_load(&fs.bytes));
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		goto out;
	if (write(fd, buf, len) != len) {
		close(fd);
		unlink(tmp);
		goto out;
	}
	close(fd);
	if (rename(tmp, fs.count_path) < 0)
		unlink(tmp);
out:
	pthread_mutex_unlock(&fs.count_lock);
}

/* Configure the connection: large requests, cached attributes, real inode numbers. */
static void *sfs_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
	cfg->use_ino = 1;
	cfg->readdir_ino = 1;
	cfg->entry_timeout = fs.attr_timeout;
	cfg->attr_timeout = fs.attr_timeout;
	cfg->negative_timeout = 0;
	cfg->direct_io = 1;
	/*
	 * max_write also sets the max_pages we ask of the kernel (256 pages,
	 * i.e. 1 MiB, the most libfuse's buffers hold), and max_pages caps
	 * direct reads too.  Without -o max_read the kernel puts no other
	 * limit on reads, so a 1 MiB aligned read is one request.  libfuse
	 * refuses an init() max_read that differs from -o max_read, so echo it.
	 */
	if (conn->max_write < (1u << 20))
		conn->max_write = 1u << 20;
	conn->max_read = fs.max_read;
	count_flush();
	return NULL;
}

/* Write final counters at unmount. */
static void sfs_destroy(UNUSED void *private_data)
{
	count_flush();
}

/* Move a timestamp by -fs.skew_ns. */
static void skew(struct timespec *t)
{
	long long ns = (long long)t->tv_sec * 1000000000ll + t->tv_nsec - fs.skew_ns;

	t->tv_sec = (time_t)(ns / 1000000000ll);
	t->tv_nsec = (long)(ns % 1000000000ll);
}

/* Stat the source object (or the open fd when the kernel passes one). */
static int sfs_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	int r = fi ? ret_errno(fstat((int)fi->fh, st))
		   : ret_errno(fstatat(fs.src_fd, rel(path), st, AT_SYMLINK_NOFOLLOW));

	if (r == 0 && fs.skew_ns) {
		skew(&st->st_atim);
		skew(&st->st_mtim);
		skew(&st->st_ctim);
	}
	return r;
}

/* List a source directory, with real inode numbers and types. */
static int sfs_readdir(const char *path, void *buf, fuse_fill_dir_t filler, UNUSED off_t off,
		       UNUSED struct fuse_file_info *fi, UNUSED enum fuse_readdir_flags flags)
{
	struct dirent *de;
	struct stat st;
	DIR *dir;
	int fd;

	fd = openat(fs.src_fd, rel(path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	dir = fdopendir(fd);
	if (!dir) {
		close(fd);
		return -ENOMEM;
	}
	while ((de = readdir(dir))) {
		memset(&st, 0, sizeof(st));
		st.st_ino = de->d_ino;
		st.st_mode = (mode_t)de->d_type << 12;
		if (filler(buf, de->d_name, &st, 0, 0))
			break;
	}
	closedir(dir);
	return 0;
}

/* Common tail of open and create: stash the fd and make the file direct_io. */
static int finish_open(int fd, struct fuse_file_info *fi)
{
	if (fd < 0)
		return -errno;
	fi->fh = (uint64_t)fd;
	fi->direct_io = 1;
	fi->keep_cache = 0;
	return 0;
}

/* Open the source file without O_DIRECT, which its file system may not support. */
static int sfs_open(const char *path, struct fuse_file_info *fi)
{
	int flags = (fi->flags & ~O_DIRECT) | O_CLOEXEC;

	return finish_open(openat(fs.src_fd, rel(path), flags), fi);
}

/* Create and open a source file, as sfs_open(). */
static int sfs_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	int flags = (fi->flags & ~O_DIRECT) | O_CREAT | O_CLOEXEC;

	return finish_open(openat(fs.src_fd, rel(path), flags, mode), fi);
}

/* Is thread tid its process's main thread ("Tgid:" of /proc/tid/status is tid)?  Yes when it
 * cannot be told. */
static int main_thread(pid_t tid)
{
	char path[64], line[128];
	int tgid = tid;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)tid);
	f = fopen(path, "r");
	if (!f)
		return 1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Tgid: %d", &tgid) == 1)
			break;
	fclose(f);
	return tgid == tid;
}

/* Sleep the latency, then fill @buf from the source file; returns bytes read or -errno. */
static int sfs_read(UNUSED const char *path, char *buf, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	size_t done = 0;
	ssize_t n;

	latency_sleep();
	if (fs.fail_threads && !main_thread(fuse_get_context()->pid))
		return -EIO;
	while (done < size) {
		n = pread((int)fi->fh, buf + done, size - done, off + (off_t)done);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			break;
		done += (size_t)n;
	}
	atomic_fetch_add(&fs.reads, 1);
	atomic_fetch_add(&fs.bytes, done);
	count_flush();
	return (int)done;
}

/* Write all of @buf to the source file; returns bytes written or -errno. */
static int sfs_write(UNUSED const char *path, const char *buf, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	size_t done = 0;
	ssize_t n;

	while (done < size) {
		n = pwrite((int)fi->fh, buf + done, size - done, off + (off_t)done);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		done += (size_t)n;
	}
	return (int)done;
}

/* Close the underlying fd opened by sfs_open() or sfs_create(). */
static int sfs_release(UNUSED const char *path, struct fuse_file_info *fi)
{
	close((int)fi->fh);
	return 0;
}

/* Truncate through the open fd if given, else by opening the source file. */
static int sfs_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	int fd, r;

	if (fi)
		return ret_errno(ftruncate((int)fi->fh, size));
	fd = openat(fs.src_fd, rel(path), O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	r = ret_errno(ftruncate(fd, size));
	close(fd);
	return r;
}

/* Remove a source file. */
static int sfs_unlink(const char *path)
{
	return ret_errno(unlinkat(fs.src_fd, rel(path), 0));
}

/* Create a source directory. */
static int sfs_mkdir(const char *path, mode_t mode)
{
	return ret_errno(mkdirat(fs.src_fd, rel(path), mode));
}

/* Remove an empty source directory. */
static int sfs_rmdir(const char *path)
{
	return ret_errno(unlinkat(fs.src_fd, rel(path), AT_REMOVEDIR));
}

/* Rename within the source tree, honouring RENAME_NOREPLACE / RENAME_EXCHANGE. */
static int sfs_rename(const char *from, const char *to, unsigned int flags)
{
	return ret_errno(renameat2(fs.src_fd, rel(from), fs.src_fd, rel(to), flags));
}

/* Flush the source file to stable storage. */
static int sfs_fsync(UNUSED const char *path, int datasync, struct fuse_file_info *fi)
{
	return ret_errno(datasync ? fdatasync((int)fi->fh) : fsync((int)fi->fh));
}

/* Report the source file system's statistics. */
static int sfs_statfs(UNUSED const char *path, struct statvfs *st)
{
	return ret_errno(fstatvfs(fs.src_fd, st));
}

/* Set access/modification times of a source object. */
static int sfs_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
	if (fi)
		return ret_errno(futimens((int)fi->fh, tv));
	return ret_errno(utimensat(fs.src_fd, rel(path), tv, AT_SYMLINK_NOFOLLOW));
}

static const struct fuse_operations sfs_ops = {
    .init = sfs_init,
    .destroy = sfs_destroy,
    .getattr = sfs_getattr,
    .readdir = sfs_readdir,
    .open = sfs_open,
    .create = sfs_create,
    .read = sfs_read,
    .write = sfs_write,
    .release = sfs_release,
    .truncate = sfs_truncate,
    .unlink = sfs_unlink,
    .mkdir = sfs_mkdir,
    .rmdir = sfs_rmdir,
    .rename = sfs_rename,
    .fsync = sfs_fsync,
    .statfs = sfs_statfs,
    .utimens = sfs_utimens,
};

/* Return the value of "--name V" / "--nameV" / "--name=V" as fuse_opt hands it to opt_proc(). */
static const char *opt_value(const char *arg, const char *name)
{
	arg += strlen(name);
	return *arg == '=' ? arg + 1 : arg;
}

/*
 * fuse_opt callback: consume our options and SOURCE_DIR (return 0), keep
 * everything else for fuse_main() (return 1), fail on a bad value (-1).
 */
static int opt_proc(void *data, const char *arg, int key, UNUSED struct fuse_args *outargs)
{
	struct cmdline *cl = data;
	unsigned long v;
	char *end;

	switch (key) {
	case KEY_LATENCY:
		errno = 0;
		v = strtoul(opt_value(arg, "--latency-us"), &end, 10);
		if (errno || *end || end == opt_value(arg, "--latency-us") || v > UINT_MAX) {
			fprintf(stderr, "slowfs: bad --latency-us value\n");
			return -1;
		}
		cl->latency = (unsigned int)v;
		return 0;
	case KEY_ATTR_TIMEOUT:
		errno = 0;
		cl->attr_timeout = strtod(opt_value(arg, "--attr-timeout"), &end);
		if (errno || *end || !(cl->attr_timeout >= 0)) {
			fprintf(stderr, "slowfs: bad --attr-timeout value\n");
			return -1;
		}
		return 0;
	case KEY_SKEW:
		errno = 0;
		cl->skew_ms = strtoll(opt_value(arg, "--skew-ms"), &end, 10);
		if (errno || *end || cl->skew_ms > 86400000ll || cl->skew_ms < -86400000ll) {
			fprintf(stderr, "slowfs: bad --skew-ms value\n");
			return -1;
		}
		return 0;
	case KEY_FAIL:
		cl->fail_threads = 1;
		return 0;
	case KEY_COUNT_FILE:
		free(cl->count_path);
		cl->count_path = strdup(opt_value(arg, "--count-file"));
		return cl->count_path && cl->count_path[0] ? 0 : -1;
	case KEY_MAX_READ:
		/* Keep the option for the kernel; sfs_init() must repeat it. */
		if (sscanf(arg, "max_read=%u", &cl->max_read) != 1)
			return -1;
		return 1;
	case KEY_HELP:
		cl->show_help = 1;
		return 1;
	case FUSE_OPT_KEY_NONOPT:
		if (cl->nonopts++ == 0) {
			cl->source = strdup(arg);
			return cl->source ? 0 : -1;
		}
		return 1;
	default:
		return 1;
	}
}

/* Print usage to stderr. */
static void usage(const char *prog)
{
	fprintf(stderr,
		"usage: %s [--latency-us N] [--count-file PATH] [--attr-timeout S] [--skew-ms N] "
		"[--fail-threads] "
		"SOURCE_DIR MOUNTPOINT [fuse options]\n"
		"  --latency-us N    sleep N microseconds before serving each read (default 0)\n"
		"  --count-file PATH write \"reads N\\nbytes N\\n\" to PATH after each read\n"
		"  --attr-timeout S  the kernel caches attributes S seconds (default 1)\n"
		"  --skew-ms N       report timestamps N ms earlier than the source's\n"
		"  --fail-threads    reads asked by a thread other than its process's main one "
		"answer EIO\n",
		prog);
}

/* Parse our options, open SOURCE_DIR, and hand the rest of the command line to fuse_main(). */
int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct cmdline cl = {.attr_timeout = ATTR_TIMEOUT};
	int ret = 1;

	if (fuse_opt_parse(&args, &cl, slowfs_opts, opt_proc) < 0)
		goto out;
	if (cl.show_help) {
		usage(argv[0]);
		fuse_main(args.argc, args.argv, &sfs_ops, NULL);
		ret = 0;
		goto out;
	}
	if (cl.nonopts != 2) {
		usage(argv[0]);
		goto out;
	}
	fs.src_fd = open(cl.source, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fs.src_fd < 0) {
		fprintf(stderr, "slowfs: %s: %s\n", cl.source, strerror(errno));
		goto out;
	}
	fs.latency = cl.latency;
	fs.max_read = cl.max_read;
	fs.attr_timeout = cl.attr_timeout;
	fs.skew_ns = cl.skew_ms * 1000000ll;
	fs.fail_threads = cl.fail_threads;
	if (cl.count_path && cl.count_path[0] != '/') {
		/* fuse_main() daemonizes and chdir("/") unless -f: pin a relative path now. */
		char *abs = realpath(".", NULL);
		char *full = NULL;

		if (abs && asprintf(&full, "%s/%s", abs, cl.count_path) > 0) {
			free(cl.count_path);
			cl.count_path = full;
		}
		free(abs);
	}
	fs.count_path = cl.count_path;
	/*
	 * Defaults the caller's -o can override (later values win): more
	 * workers than libfuse's 10 so many readers overlap, and an explicit
	 * max_idle_threads, without which libfuse 3.14.0 prints a bogus
	 * "Ignoring invalid max threads value" warning.
	 */
	if (fuse_opt_insert_arg(&args, 1, "-omax_idle_threads=10,max_threads=" MAX_THREADS) < 0)
		goto out_close;
	ret = fuse_main(args.argc, args.argv, &sfs_ops, NULL);
out_close:
	close(fs.src_fd);
out:
	free(cl.source);
	free(cl.count_path);
	fuse_opt_free_args(&args);
	return ret;
}
