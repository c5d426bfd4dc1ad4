/*
 * wonce: see wonce.h.
 *
 * A table of KVS_WONCE_FILES records, one per file keyed by birth that this process has open
 * for writing: (dev, ino), the size the file had when this process opened it (or first wrote
 * to it, for a descriptor whose open the shim did not see), the descriptor, and whether a
 * rewrite of it was counted.  Opens and writes (the shim's guard held) look records up and
 * make them under wonce_mu; an open replaces the file's record (a new session: a file created
 * again on a reused inode starts afresh).  The close hooks, which may run in a signal handler,
 * take no lock: they clear the records of the closed numbers with one atomic CAS each (used),
 * which a writer under the mutex sees as a free record.  A full table replaces the oldest
 * record: a file that loses its record starts over with its size then (a rewrite of its first
 * bytes is then not seen: a miss, as for a writer outside the shim).
 *
 * A write below the size in the record is a rewrite only where the file holds data
 * (SEEK_DATA, on a description of the shim's own, asked with no lock held): a new file written
 * out of order through several descriptors (UCM's dump) fills holes, which is no rewrite.
 *
 * Said once per file: a second table of file tags (dev, ino hashed), never cleared; the line is
 * printed after wonce_mu is let go (stderr may be a full pipe).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "cache.h"
#include "config.h"
#include "log.h"
#include "raw.h"
#include "wonce.h"

#define KVS_WONCE_FILES 64
#define KVS_WONCE_SAID	256
#define KVS_WONCE_SAY	4 /* files said by name, per process */

struct record {
	_Atomic uint32_t used;
	_Atomic int fd;
	uint64_t dev, ino;
	uint64_t open_size;
	uint64_t age;
	bool counted;
	bool pending; /* the last write looked at before it was made rewrites: counted once made */
};

static pthread_mutex_t wonce_mu = PTHREAD_MUTEX_INITIALIZER;
static struct record files[KVS_WONCE_FILES]; /* under wonce_mu, but for used (see above) */
static _Atomic uint32_t nused;		     /* a hint for the close hooks: 0, nothing to do */
static uint64_t clock_age;		     /* under wonce_mu */
static uint64_t said[KVS_WONCE_SAID];	     /* under wonce_mu */
static int nsaid;			     /* under wonce_mu */

static uint64_t tag(uint64_t dev, uint64_t ino)
{
	uint64_t x = dev * 0x9e3779b97f4a7c15ULL ^ ino;

	x ^= x >> 33; /* splitmix64's finaliser: every bit of ino moves the tag */
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ULL;
	x ^= x >> 33;
	return x | 1; /* never 0, the empty tag */
}

enum { SAY_NOTHING, SAY_FILE, SAY_REST };

/* Whether to say a rewrite of (dev, ino): by name for the first KVS_WONCE_SAY files, then
 * once that the rest are only counted.  Caller holds wonce_mu. */
static int to_say_locked(uint64_t dev, uint64_t ino)
{
	uint64_t t = tag(dev, ino);
	uint32_t i = (uint32_t)(t % KVS_WONCE_SAID);

	if (said[i] == t || nsaid > KVS_WONCE_SAY)
		return SAY_NOTHING;
	said[i] = t;
	return nsaid++ == KVS_WONCE_SAY ? SAY_REST : SAY_FILE;
}

/* Say it (no lock held).  fd: a descriptor of the file, for its name, or -1. */
static void say(int what, int fd, uint64_t dev, uint64_t ino)
{
	char link[64], path[512];
	ssize_t n = -1;

	if (what == SAY_NOTHING)
		return;
	if (what == SAY_REST) {
		kvs_log_line(KVS_LOG_WARN, "files.write_once: more files rewritten in place; from "
					   "now on they are only counted (write_once_violations)");
		return;
	}
	if (fd >= 0) {
		snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
		n = readlink(link, path, sizeof(path) - 1);
	}
	path[n > 0 ? n : 0] = '\0';
	kvs_log_line(KVS_LOG_WARN,
		     "files.write_once: %s (dev %llu, inode %llu) is on a write-once root but was "
		     "rewritten in place by this process: its cached shards were dropped, and it "
		     "does not follow the write-once rule (counted in `kvshim stat` "
		     "write_once_violations; see docs/operations.md)",
		     n > 0 ? path : "a file", (unsigned long long)dev, (unsigned long long)ino);
}

/* The record of (dev, ino): the one there is, or, with fresh or none there, a new one of
 * open_size (an open replaces the old session's).  Caller holds wonce_mu. */
static struct record *record_locked(int fd, uint64_t dev, uint64_t ino, uint64_t open_size,
				    bool fresh)
{
	struct record *r = NULL, *oldest = NULL;

	for (int i = 0; i < KVS_WONCE_FILES; i++) {
		struct record *x = &files[i];

		if (!atomic_load_explicit(&x->used, memory_order_acquire)) { /* pairs below */
			if (!r)
				r = x;
			continue;
		}
		if (x->dev == dev && x->ino == ino) {
			if (!fresh)
				return x;
			r = x; /* a new open: this record starts over */
			break;
		}
		if (!oldest || x->age < oldest->age)
			oldest = x;
	}
	if (!r)
		r = oldest;
	uint32_t one = 1; /* a record in use is taken back first (a close may beat us to it) */
	if (atomic_compare_exchange_strong(&r->used, &one, 0))
		atomic_fetch_sub_explicit(&nused, 1, memory_order_relaxed);
	r->dev = dev;
	r->ino = ino;
	r->open_size = open_size;
	r->age = ++clock_age;
	r->counted = false;
	r->pending = false;
	atomic_store_explicit(&r->fd, fd, memory_order_relaxed);
	atomic_store_explicit(&r->used, 1, memory_order_release); /* pairs with the loads above */
	atomic_fetch_add_explicit(&nused, 1, memory_order_relaxed);
	return r;
}

bool kvs_wonce_opening(struct kvs_wonce_open *o, struct kvs_cache *(*region)(void), int dirfd,
		       const char *path, int flags)
{
	struct kvs_fdinfo fi;

	o->on = o->truncates = false;
	o->c = NULL;
	if ((flags & O_ACCMODE) == O_RDONLY && !(flags & O_TRUNC))
		return false; /* cannot write it */
	if ((flags & (O_CREAT | O_EXCL)) == (O_CREAT | O_EXCL))
		return false; /* a new file, or the open fails */
	/* One statx first: a file that holds nothing, or one on a device no root is on, has no
	 * bytes of a write-once root to lose (the open's own look after it still records a
	 * write-once file: kvs_shim_opened).  Not the table of files found under no root
	 * (fdinfo.h): an entry made wrong by a move it did not see would lose a drop here. */
	struct statx sx;
	if (kvs_syscall(SYS_statx, dirfd, path,
			AT_NO_AUTOMOUNT | ((flags & O_NOFOLLOW) ? AT_SYMLINK_NOFOLLOW : 0),
			STATX_TYPE | STATX_SIZE, &sx) != 0 ||
	    !S_ISREG(sx.stx_mode) || !sx.stx_size ||
	    kvs_fdinfo_dev_outside(makedev(sx.stx_dev_major, sx.stx_dev_minor)))
		return false; /* no such file yet (a create), or the kernel's error to give */
	int fd = kvs_sys_openat(dirfd, path, O_PATH | O_CLOEXEC | (flags & O_NOFOLLOW));
	if (fd < 0)
		return false;
	/* Its path under no root (one readlink): no statx, no fcntl. */
	int r = kvs_fdinfo_opened(fd) == -1 ? -1 : kvs_fdinfo_get(fd, &fi);
	kvs_fdinfo_forget(fd); /* the number is the shim's for a moment only */
	if (r == 0 && fi.kv && fi.write_once) {
		o->on = true;
		o->dev = fi.dev;
		o->ino = fi.ino;
		o->open_size = fi.size;
		if ((flags & O_TRUNC) && fi.size) {
			/* The bytes it held go at the open: drop them now, before a reader can
			 * see the file grow back to their size under their key. */
			o->truncates = true;
			o->c = region();
			if (o->c) {
				uint64_t S = kvs_cache_shard_size(o->c);

				kvs_cache_invalidate(o->c, &fi.block, 0, (fi.size - 1) / S);
			}
		}
	}
	kvs_sys_close(fd);
	return o->on;
}

void kvs_wonce_opened(const struct kvs_wonce_open *o, int fd)
{
	int say_what = SAY_NOTHING;

	if (!o->on || fd < 0)
		return;
	pthread_mutex_lock(&wonce_mu);
	struct record *r = record_locked(fd, o->dev, o->ino, o->open_size, true);
	if (o->truncates) {
		r->counted = true;
		say_what = to_say_locked(o->dev, o->ino);
	}
	pthread_mutex_unlock(&wonce_mu);
	if (o->truncates && o->c)
		kvs_cache_count(o->c, KVS_CTR_write_once_violations, 1);
	say(say_what, fd, o->dev, o->ino);
}

/* Does fd's file hold data anywhere in [off, off + len)?  Asked of a description of the
 * shim's own (lseek would move the program's offset): SEEK_DATA from off finds the first data
 * at or after it; ENXIO, none.  A file system without holes answers data: true, as on any
 * doubt. */
static bool has_data(int fd, uint64_t off, uint64_t len)
{
	char link[64];
	int saved = errno;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	int d = kvs_sys_open(link, O_RDONLY | O_CLOEXEC);
	if (d < 0) {
		errno = saved;
		return true;
	}
	off_t next = lseek(d, (off_t)off, SEEK_DATA);
	/* len may run to any end (UINT64_MAX: a truncation): no wrap past it. */
	bool data = next < 0 ? errno != ENXIO : (uint64_t)next - off < len;
	kvs_sys_close(d);
	errno = saved;
	return data;
}

bool kvs_wonce_rewrites(struct kvs_cache *c, int fd, const struct kvs_fdinfo *fi, uint64_t off,
			uint64_t len, bool after)
{
	bool rewrite;

	if (!fi->write_once || len == 0)
		return false;
	if (after) {
		kvs_wonce_made(c, fd, fi);
		pthread_mutex_lock(&wonce_mu);
		struct record *r = record_locked(fd, fi->dev, fi->ino, fi->size, false);
		rewrite = !fi->append && off < r->open_size && r->counted;
		pthread_mutex_unlock(&wonce_mu);
		return rewrite;
	}
	pthread_mutex_lock(&wonce_mu);
	struct record *r = record_locked(fd, fi->dev, fi->ino, fi->size, false);
	/* O_APPEND writes go to the end, whatever offset the caller thinks: never in place.
	 * Below the size the file had: a rewrite unless those bytes are a hole (a file written
	 * out of order through several descriptors, UCM's dump: each shard opened, written and
	 * closed by a thread of its own).  After the write they are data: the verdict is then
	 * the file's (a violation seen drops everything, as before the write). */
	bool below = !fi->append && off < r->open_size;
	pthread_mutex_unlock(&wonce_mu);
	rewrite = below && has_data(fd, off, len);
	pthread_mutex_lock(&wonce_mu);
	r = record_locked(fd, fi->dev, fi->ino, fi->size, false);
	r->pending = rewrite && !r->counted; /* counted once the write is made (kvs_wonce_made) */
	pthread_mutex_unlock(&wonce_mu);
	return rewrite;
}

void kvs_wonce_made(struct kvs_cache *c, int fd, const struct kvs_fdinfo *fi)
{
	int say_what = SAY_NOTHING;
	bool count = false;

	if (!fi->write_once)
		return;
	pthread_mutex_lock(&wonce_mu);
	struct record *r = record_locked(fd, fi->dev, fi->ino, fi->size, false);
	if (r->pending && !r->counted) {
		r->counted = count = true;
		say_what = to_say_locked(fi->dev, fi->ino);
	}
	r->pending = false;
	pthread_mutex_unlock(&wonce_mu);
	if (count && c)
		kvs_cache_count(c, KVS_CTR_write_once_violations, 1);
	say(say_what, fd, fi->dev, fi->ino);
}

void kvs_wonce_closed_range(unsigned int lo, unsigned int hi)
{
	if (!atomic_load_explicit(&nused, memory_order_relaxed))
		return;
	for (int i = 0; i < KVS_WONCE_FILES; i++) {
		struct record *x = &files[i];
		int fd = atomic_load_explicit(&x->fd, memory_order_relaxed);

		if (atomic_load_explicit(&x->used, memory_order_relaxed) && fd >= 0 &&
		    (unsigned int)fd >= lo && (unsigned int)fd <= hi) {
			uint32_t one = 1;

			if (atomic_compare_exchange_strong(&x->used, &one, 0))
				atomic_fetch_sub_explicit(&nused, 1, memory_order_relaxed);
		}
	}
}

void kvs_wonce_closed(int fd)
{
	if (fd >= 0)
		kvs_wonce_closed_range((unsigned int)fd, (unsigned int)fd);
}

void kvs_wonce_atfork_child(void)
{
	pthread_mutex_init(&wonce_mu, NULL);
	memset(files, 0, sizeof(files));
	atomic_store(&nused, 0);
}
