/*
 * wonce: see wonce.h.
 *
 * A table of KVS_WONCE_FILES records, one per file keyed by birth that this process is
 * writing: (dev, ino), the size the file had at the first write seen, the descriptor of that
 * write, and whether it was already counted.  Writers (the shim's guard held) look records up
 * and make them under wonce_mu.  The close hook, which may run in a signal handler, takes no
 * lock: it clears the records of the closed number with one atomic store each (used, release),
 * which a writer under the mutex sees as a free record.  A full table replaces the oldest
 * record: a file that loses its record starts over with its size then (a rewrite of its
 * first bytes is then not seen: a miss, as for a writer outside the shim).
 *
 * A write below the size in the record is a rewrite only where the file holds data
 * (SEEK_DATA, on a description of the shim's own): a new file written out of order through
 * several descriptors (UCM's dump) fills holes, which is no rewrite.
 *
 * Warned once per file: a second table of file tags (dev, ino hashed), never cleared.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#include <stdatomic.h>
#include <string.h>

#include "cache.h"
#include "config.h"
#include "log.h"
#include "real.h"
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
};

static pthread_mutex_t wonce_mu = PTHREAD_MUTEX_INITIALIZER;
static struct record files[KVS_WONCE_FILES]; /* under wonce_mu, but for used (see above) */
static _Atomic uint32_t nused;		     /* a hint for the close hook: 0, nothing to do */
static uint64_t clock_age;		     /* under wonce_mu */
static uint64_t said[KVS_WONCE_SAID];	     /* under wonce_mu */

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

/* Say once per file, for the first KVS_WONCE_SAY files, that the declaration was wrong for
 * it (then once that the rest are only counted).  Caller holds wonce_mu. */
static void say_locked(int fd, const struct kvs_fdinfo *fi)
{
	static int nsaid;
	uint64_t t = tag(fi->dev, fi->ino);
	uint32_t i = (uint32_t)(t % KVS_WONCE_SAID);
	char link[64], path[512];

	if (said[i] == t || nsaid > KVS_WONCE_SAY)
		return;
	said[i] = t;
	if (nsaid++ == KVS_WONCE_SAY) {
		kvs_log_line(KVS_LOG_WARN, "files.write_once: more files rewritten in place; from "
					   "now on they are only counted (write_once_violations)");
		return;
	}
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, path, sizeof(path) - 1);
	path[n > 0 ? n : 0] = '\0';
	kvs_log_line(KVS_LOG_WARN,
		     "files.write_once: %s (dev %llu, inode %llu) is on a write-once root but was "
		     "rewritten in place by this process: its cached shards were dropped, and it "
		     "does not follow the write-once rule (counted in `kvshim stat` "
		     "write_once_violations; see docs/operations.md)",
		     n > 0 ? path : "a file", (unsigned long long)fi->dev,
		     (unsigned long long)fi->ino);
}

/* The record of fi's file, made (with the size it has now) if there is none.  Caller holds
 * wonce_mu. */
static struct record *record_locked(int fd, const struct kvs_fdinfo *fi)
{
	struct record *r = NULL, *oldest = &files[0];

	for (int i = 0; i < KVS_WONCE_FILES; i++) {
		struct record *x = &files[i];

		if (!atomic_load_explicit(&x->used, memory_order_acquire)) { /* pairs below */
			if (!r)
				r = x;
			continue;
		}
		if (x->dev == fi->dev && x->ino == fi->ino)
			return x;
		if (x->age < oldest->age)
			oldest = x;
	}
	if (!r) {
		r = oldest;
		atomic_fetch_sub_explicit(&nused, 1, memory_order_relaxed);
	}
	r->dev = fi->dev;
	r->ino = fi->ino;
	r->open_size = fi->size;
	r->age = ++clock_age;
	r->counted = false;
	atomic_store_explicit(&r->fd, fd, memory_order_relaxed);
	atomic_store_explicit(&r->used, 1, memory_order_release); /* pairs with the loads above */
	atomic_fetch_add_explicit(&nused, 1, memory_order_relaxed);
	return r;
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
	int d = open(link, O_RDONLY | O_CLOEXEC);
	if (d < 0) {
		errno = saved;
		return true;
	}
	off_t next = lseek(d, (off_t)off, SEEK_DATA);
	bool data = next < 0 ? errno != ENXIO : (uint64_t)next < off + len;
	kvs_real_init();
	kvs_real.close(d);
	errno = saved;
	return data;
}

bool kvs_wonce_rewrites(struct kvs_cache *c, int fd, const struct kvs_fdinfo *fi, uint64_t off,
			uint64_t len, bool after)
{
	bool rewrite, count = false;

	if (!fi->write_once || len == 0)
		return false;
	pthread_mutex_lock(&wonce_mu);
	struct record *r = record_locked(fd, fi);
	/* O_APPEND writes go to the end, whatever offset the caller thinks: never in place.
	 * Below the size the file had: a rewrite unless those bytes are a hole (a file written
	 * out of order through several descriptors, UCM's dump: each shard opened, written and
	 * closed by a thread of its own).  After the write they are data: the verdict is then
	 * the file's (a violation seen drops everything, as before the write). */
	rewrite =
	    !fi->append && off < r->open_size && (after ? r->counted : has_data(fd, off, len));
	if (rewrite && !r->counted) {
		r->counted = count = true;
		say_locked(fd, fi);
	}
	pthread_mutex_unlock(&wonce_mu);
	if (count && c)
		kvs_cache_count(c, KVS_CTR_write_once_violations, 1);
	return rewrite;
}

void kvs_wonce_closed(int fd)
{
	if (!atomic_load_explicit(&nused, memory_order_relaxed))
		return;
	for (int i = 0; i < KVS_WONCE_FILES; i++) {
		struct record *x = &files[i];

		if (atomic_load_explicit(&x->used, memory_order_relaxed) &&
		    atomic_load_explicit(&x->fd, memory_order_relaxed) == fd) {
			uint32_t one = 1;

			if (atomic_compare_exchange_strong(&x->used, &one, 0))
				atomic_fetch_sub_explicit(&nused, 1, memory_order_relaxed);
		}
	}
}

void kvs_wonce_atfork_child(void)
{
	pthread_mutex_init(&wonce_mu, NULL);
	memset(files, 0, sizeof(files));
	atomic_store(&nused, 0);
}
