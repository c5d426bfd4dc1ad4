/*
 * The request ring: how engine processes ask the node's remote helper, and what happens when
 * either dies.
 *
 * The file.  <region path>.remote, in cache.dir beside the region, mode cache.mode, owned by
 * the euid: one header page, nent entries of 256 bytes, then nent staging buffers of
 * shard_size bytes each (entry i owns buffer i).  The helper builds it (a new file renamed into
 * place) and holds <region path>.remote.lock (flock) for its life: one helper per region.
 * Engines map it read-write when they first own a miss, and again when the helper that
 * answers there has stopped beating and the path names another file.
 *
 * The header.  Written once by the helper before the rename (magic, version, dimensions,
 * its pid, whether it gets into slots: zero_copy), except three words: beat (the node's
 * clock, kvs_node_ns, stored by the helper every KVS_RING_BEAT_NS; 0 when it left), route
 * (enum kvs_ring_route, the helper's) and the bells (one per op, incremented by an engine
 * after each post, futex-woken; the helper sleeps on them).  Engines ask only while the beat
 * is younger than KVS_RING_DEAD_NS.
 *
 * An entry's word: the tid of the engine thread that owns the request, shifted left 4, or'd
 * with its state.  Every change of state is one atomic on the word, and which side makes it is
 * fixed:
 *
 *	FREE      --engine, CAS------------> CLAIMED   (the engine fills op, len, keys)
 *	CLAIMED   --engine, store----------> POSTED    (release: the fields are visible)
 *	POSTED    --helper, CAS------------> BUSY      (the helper's until it answers)
 *	POSTED    --engine, CAS (deadline)-> FREE      (never taken)
 *	BUSY      --helper, CAS------------> DONE      (a get: result stored first)
 *	BUSY      --engine, CAS (deadline)-> ABANDONED
 *	BUSY      --helper, store----------> FREE      (a put: the engine does not wait)
 *	ABANDONED --helper, CAS------------> FREE      (when its late answer comes)
 *	DONE      --engine, store----------> FREE      (after copying staging out)
 *
 *	DONE      --engine, store----------> ABANDONED (an error answered: see below)
 *
 * Staging buffer i is written only by the helper, and only while entry i is BUSY; it is read
 * by the engine only while the entry is DONE under its own tid (a get), or by the helper while
 * BUSY (a put: the helper copied the shard there itself).  An abandoned get's transfer may
 * still land in staging after its engine went back to storage: nobody reads it, and the entry
 * is not free until the helper has answered.  A get that failed (an error, a short length: not
 * a miss) may have left a transfer running that the pool's client gave up on, which could still
 * write the buffer: the engine leaves such an entry ABANDONED instead of FREE, and the helper
 * frees it only hold_ns after its answer (kvs_ring_set_hold: longer than the client's own
 * transfer bound), in kvs_ring_done or a later beat.  By default the bytes in a region slot
 * are only ever written by the slot's owner (the engine), so a late transfer can never land
 * in a slot that was reused.  Under remote.zero_copy (the header's zero_copy) the helper gets
 * into the owner's slot instead, and keeps the rule by pinning it (remote/helper.c,
 * zc_target): while its owner loads it, until the transfer is over or its hold has passed.
 *
 * The tid makes each word unique to one thread's request: an engine that gave up and finds the
 * word changed (another thread's request, a helper's restart) walks away without touching it.
 *
 * Crashes.
 *  - An engine process dies with an entry POSTED or DONE: the helper's beat finds its owner
 *    gone (the entry's owner: the region's process-table slot and attach time of the process,
 *    whose liveness lock every PID namespace sees alike; kvs_cache_still) and CASes the word
 *    it saw to FREE.  POSTED of a dead owner may be taken first: its answer turns it DONE, the
 *    next beat frees it.  A CLAIMED entry is never judged: until its claimer has written the
 *    owner field it names the entry's previous owner, and a dead previous owner would free a
 *    live claim (another engine could then claim it, and one of the two would copy the
 *    other's bytes).  An engine killed between its claim and its post, a few stores, leaves
 *    that one entry CLAIMED until the ring is built anew (a helper of other dimensions, or
 *    the file removed).  Liveness is by process, not thread: the loader's thread that posts
 *    always waits for its answer or abandons it, and is never cancelled there.  The word's
 *    tid only tells one waiter's request from another's: two engines in two PID namespaces
 *    may share a tid, but an entry has one owner from claim to free, and nobody frees a live
 *    owner's entry.
 *  - An engine dies while copying staging out (DONE): its copy was into its own slot, which
 *    the region's dead-process reaping turns FAILED; the entry is freed by a beat.
 *  - The helper dies: the flock is released, the beat stops.  Engines waiting time out at
 *    their deadline (BUSY -> ABANDONED) and stop asking within KVS_RING_DEAD_NS.  The next
 *    helper that takes the file over (same dimensions) answers every BUSY get with -EIO
 *    (DONE), frees every BUSY put and every ABANDONED entry, before its first beat.  A dead
 *    helper's transfer cannot land after its death: its sockets and registrations die with it.
 *  - The helper is stopped (SIGSTOP): the same for engines; on SIGCONT it answers late, into
 *    abandoned entries, which it frees.
 *  - A helper starts with other dimensions: it builds a new file and renames it over; engines
 *    of the old mapping see no beat there and map the new file (kvs_ring_replaced).  The old
 *    mapping is kept (a thread may still wait on it) until the process exits: one per change of
 *    dimensions.
 *
 * Memory order: the engine's fields are published by the release store of POSTED and read
 * after the helper's acquire CAS; result by the helper's release CAS to DONE and the engine's
 * acquire load.
 */
#include "ring.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "atomics.h"
#include "raw.h"
#include "sys.h"

enum {
	ST_FREE = 0,
	ST_CLAIMED = 1,
	ST_POSTED = 2,
	ST_BUSY = 3,
	ST_DONE = 4,
	ST_ABANDONED = 5,
	ST_MASK = 15,
};

struct ring_head {
	uint64_t magic;
	uint32_t version;
	uint32_t nent;
	uint64_t shard_size; /* bytes of each staging buffer */
	uint64_t off_ent, off_stage, size;
	_Atomic uint64_t beat;
	_Atomic uint32_t route;
	int32_t helper_pid;
	_Atomic uint32_t bell[3]; /* by enum kvs_ring_op */
	uint32_t zero_copy;	  /* gets land in the owner's slot, not in staging */
};

struct ring_ent {
	_Atomic uint32_t word;
	uint32_t op, len;
	uint32_t slot; /* a get's: the region slot its owner loads (remote.zero_copy) */
	struct kvs_ring_owner owner; /* 16 bytes */
	_Atomic int64_t result;
	struct kvs_key key;
	char rkey[KVS_RING_KEY_MAX];
	char pad[256 - 4 * 4 - 16 - 8 - sizeof(struct kvs_key) - KVS_RING_KEY_MAX];
};
_Static_assert(sizeof(struct ring_ent) == 256, "an entry is 256 bytes");
_Static_assert(sizeof(struct ring_head) <= 4096, "the header fits its page");

struct kvs_ring {
	struct ring_head *h;
	_Atomic uint64_t *hold; /* the helper's threads': entry i not freed before hold[i] */
	uint64_t hold_ns;	/* how long after a failed get its buffer stays out of use */
	struct ring_ent *ent;
	char *stage;
	size_t size;
	uint64_t dev, ino;
	_Atomic uint32_t probe; /* misses seen while routed to storage */
};

static uint64_t hold_of(const struct kvs_ring *r, uint32_t i)
{
	return r->hold ? atomic_load_explicit(&r->hold[i], memory_order_relaxed) : 0;
}

static void set_hold(struct kvs_ring *r, uint32_t i, uint64_t v)
{
	if (r->hold)
		atomic_store_explicit(&r->hold[i], v, memory_order_relaxed);
}

static uint32_t word_of(uint32_t tid, uint32_t st)
{
	return tid << 4 | st;
}

static uint32_t my_tid(void)
{
	return (uint32_t)kvs_syscall(SYS_gettid);
}

static bool dims_ok(const struct ring_head *h, uint64_t size)
{
	return h->magic == KVS_RING_MAGIC && h->version == KVS_RING_VERSION && h->nent > 0 &&
	       h->nent <= 4096 && h->off_ent == 4096 &&
	       h->off_stage == h->off_ent + (uint64_t)h->nent * sizeof(struct ring_ent) &&
	       h->size == h->off_stage + (uint64_t)h->nent * h->shard_size && h->size <= size;
}

/* ------------------------------------------------------------------ engines */

/* Map the ring fd opens, if it is one of shard_size staging buffers (any, 0). */
static int map_fd(int fd, uint64_t shard_size, struct kvs_ring *r)
{
	struct stat st;
	struct ring_head peek;

	if (kvs_syscall(SYS_fstat, fd, &st) != 0)
		return -errno;
	if ((uint64_t)st.st_size < 4096 ||
	    kvs_sys_pread(fd, &peek, sizeof(peek), 0) != (ssize_t)sizeof(peek))
		return -EPROTO;
	if (!dims_ok(&peek, (uint64_t)st.st_size) || (shard_size && peek.shard_size != shard_size))
		return -EPROTO;
	void *p = kvs_sys_mmap(NULL, peek.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	r->h = p;
	r->ent = (struct ring_ent *)((char *)p + peek.off_ent);
	r->stage = (char *)p + peek.off_stage;
	r->size = peek.size;
	r->dev = st.st_dev;
	r->ino = st.st_ino;
	if (!dims_ok(r->h, r->size)) { /* rebuilt between the read and the map: not ours */
		kvs_sys_munmap(p, r->size);
		return -EPROTO;
	}
	return 0;
}

int kvs_ring_map(const char *path, uint64_t shard_size, uint32_t mode, struct kvs_ring **out)
{
	char msg[160];
	static struct kvs_ring pool[8]; /* no allocation on a read's path: a few maps per process */
	static _Atomic uint32_t used;
	struct kvs_ring m = {0};
	/* Above the program's numbers: this runs on a read's path, and a program that closes
	 * and reopens numbers meanwhile must not lose one to our close. */
	int fd = kvs_fd_move_high(kvs_cache_open_file(path, O_RDWR, mode, msg, sizeof(msg)));

	if (fd < 0)
		return fd;
	int r = map_fd(fd, shard_size, &m); /* a refused map takes no place in the pool */
	kvs_sys_close(fd);
	if (r)
		return r;
	uint32_t i = atomic_fetch_add(&used, 1);
	if (i >= sizeof(pool) / sizeof(pool[0])) {
		kvs_sys_munmap(m.h, m.size);
		return -ENOSPC;
	}
	pool[i].h = m.h;
	pool[i].ent = m.ent;
	pool[i].stage = m.stage;
	pool[i].size = m.size;
	pool[i].dev = m.dev;
	pool[i].ino = m.ino;
	*out = &pool[i];
	return 0;
}

void kvs_ring_unmap(struct kvs_ring *r)
{
	if (r && r->h)
		kvs_sys_munmap(r->h, r->size);
	if (r)
		r->h = NULL;
}

bool kvs_ring_alive(const struct kvs_ring *r)
{
	uint64_t beat = atomic_load_explicit(&r->h->beat, memory_order_acquire);

	return beat && kvs_node_ns() - beat < KVS_RING_DEAD_NS;
}

int kvs_ring_helper_pid(const struct kvs_ring *r)
{
	return r->h->helper_pid;
}

int kvs_ring_route(const struct kvs_ring *r)
{
	return (int)atomic_load_explicit(&r->h->route, memory_order_relaxed);
}

bool kvs_ring_replaced(const struct kvs_ring *r, const char *path)
{
	struct stat st;

	if (kvs_syscall(SYS_newfstatat, AT_FDCWD, path, &st, AT_SYMLINK_NOFOLLOW) != 0)
		return false;
	return st.st_dev != r->dev || st.st_ino != r->ino;
}

/* Claim a free entry for this thread, starting at a place of its own.  UINT32_MAX: none. */
static uint32_t claim(struct kvs_ring *r, uint32_t tid)
{
	uint32_t n = r->h->nent;

	for (uint32_t k = 0; k < n; k++) {
		uint32_t i = (tid + k) % n;
		uint32_t w = ST_FREE;

		if (atomic_load_explicit(&r->ent[i].word, memory_order_relaxed) == ST_FREE &&
		    atomic_compare_exchange_strong_explicit(
			&r->ent[i].word, &w, word_of(tid, ST_CLAIMED), memory_order_acquire,
			memory_order_relaxed))
			return i;
	}
	return UINT32_MAX;
}

static void post(struct kvs_ring *r, uint32_t i, uint32_t tid, uint32_t op)
{
	atomic_store_explicit(&r->ent[i].word, word_of(tid, ST_POSTED), memory_order_release);
	atomic_fetch_add_explicit(&r->h->bell[op], 1, memory_order_release);
	kvs_futex_wake(&r->h->bell[op], INT_MAX, true);
}

static void fill_key(struct ring_ent *e, const char *key)
{
	size_t n = strnlen(key, KVS_RING_KEY_MAX - 1);

	memcpy(e->rkey, key, n);
	e->rkey[n] = 0;
}

/* Claim an entry for this thread and fill what every request says; the caller adds its own
 * fields and posts.  The entry, or -EINVAL (len), or -EBUSY (none free). */
static int64_t claim_for(struct kvs_ring *r, uint32_t tid, uint32_t op,
			 const struct kvs_ring_owner *o, const char *rkey, uint32_t len)
{
	if (len == 0 || len > r->h->shard_size)
		return -EINVAL;
	uint32_t i = claim(r, tid);
	if (i == UINT32_MAX)
		return -EBUSY;
	struct ring_ent *e = &r->ent[i];
	e->op = op;
	e->len = len;
	e->owner = *o;
	atomic_store_explicit(&e->result, 0, memory_order_relaxed);
	fill_key(e, rkey);
	return i;
}

int kvs_ring_get(struct kvs_ring *r, const struct kvs_ring_owner *o, const char *key, uint32_t len,
		 struct kvs_ring_ticket *t)
{
	static const struct kvs_key none;

	return kvs_ring_get_for(r, o, key, &none, UINT32_MAX, len, t);
}

int kvs_ring_get_for(struct kvs_ring *r, const struct kvs_ring_owner *o, const char *key,
		     const struct kvs_key *shard, uint32_t slot, uint32_t len,
		     struct kvs_ring_ticket *t)
{
	uint32_t tid = my_tid();
	int64_t i = claim_for(r, tid, KVS_RING_GET, o, key, len);

	t->entry = UINT32_MAX;
	if (i < 0)
		return (int)i;
	r->ent[i].key = *shard;
	r->ent[i].slot = slot;
	post(r, (uint32_t)i, tid, KVS_RING_GET);
	*t = (struct kvs_ring_ticket){
	    .entry = (uint32_t)i, .word = word_of(tid, ST_POSTED), .len = len};
	return 0;
}

int kvs_ring_wait(struct kvs_ring *r, struct kvs_ring_ticket *t, uint64_t deadline_ns,
		  const void **staging)
{
	struct ring_ent *e = &r->ent[t->entry];
	uint32_t tid = t->word >> 4;

	for (;;) {
		uint32_t w = atomic_load_explicit(&e->word, memory_order_acquire);

		if (w == word_of(tid, ST_DONE)) {
			int64_t res = atomic_load_explicit(&e->result, memory_order_relaxed);

			if (res == (int64_t)t->len) {
				*staging = r->stage + (size_t)t->entry * r->h->shard_size;
				return KVS_RING_HIT;
			}
			if (res == -ENOENT || res == -ECANCELED) { /* no transfer can land late */
				atomic_store_explicit(&e->word, ST_FREE, memory_order_release);
				return res == -ENOENT ? KVS_RING_MISS : KVS_RING_ERROR;
			}
			/* A failed transfer may still write its buffer: the helper frees it. */
			atomic_store_explicit(&e->word, word_of(tid, ST_ABANDONED),
					      memory_order_release);
			return KVS_RING_ERROR;
		}
		if (w != word_of(tid, ST_POSTED) && w != word_of(tid, ST_BUSY))
			return KVS_RING_ERROR; /* not ours any more (a beat thought us dead) */
		uint64_t now = kvs_mono_ns();
		if (now >= deadline_ns) {
			uint32_t to =
			    (w & ST_MASK) == ST_POSTED ? ST_FREE : word_of(tid, ST_ABANDONED);

			if (atomic_compare_exchange_strong_explicit(
				&e->word, &w, to, memory_order_acq_rel, memory_order_relaxed))
				return KVS_RING_TIMEOUT;
			continue; /* taken or answered meanwhile: look again */
		}
		kvs_futex_wait(&e->word, w, deadline_ns - now, true);
	}
}

void kvs_ring_release(struct kvs_ring *r, const struct kvs_ring_ticket *t)
{
	atomic_store_explicit(&r->ent[t->entry].word, ST_FREE, memory_order_release);
}

int kvs_ring_put(struct kvs_ring *r, const struct kvs_ring_owner *o, const char *rkey,
		 const struct kvs_key *key, uint32_t len)
{
	uint32_t tid = my_tid();
	int64_t i = claim_for(r, tid, KVS_RING_PUT, o, rkey, len);

	if (i < 0)
		return (int)i;
	r->ent[i].key = *key;
	post(r, (uint32_t)i, tid, KVS_RING_PUT);
	return 0;
}

/* ------------------------------------------------------------------ the helper */

int kvs_ring_lock(const char *path, uint32_t mode)
{
	char lp[PATH_MAX];
	char msg[160];

	if (snprintf(lp, sizeof(lp), "%s.lock", path) >= (int)sizeof(lp))
		return -ENAMETOOLONG;
	int fd = kvs_sys_open(lp, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, mode & 0666);
	if (fd < 0)
		return -errno;
	kvs_sys_close(fd);
	fd = kvs_cache_open_file(lp, O_RDWR, mode, msg, sizeof(msg)); /* trusted as the region is */
	if (fd < 0)
		return fd;
	if (kvs_syscall(SYS_flock, fd, LOCK_EX | LOCK_NB) != 0) {
		int e = errno;
		kvs_sys_close(fd);
		return e == EWOULDBLOCK ? -EWOULDBLOCK : -e;
	}
	return fd;
}

/* Take over a ring a dead helper left: answer what it had taken, free what was abandoned. */
static void take_over(struct kvs_ring *r)
{
	for (uint32_t i = 0; i < r->h->nent; i++) {
		struct ring_ent *e = &r->ent[i];
		uint32_t w = atomic_load_explicit(&e->word, memory_order_acquire);

		for (;;) {
			uint32_t st = w & ST_MASK, to;

			if (st == ST_BUSY && e->op == KVS_RING_GET) {
				atomic_store_explicit(&e->result, -EIO, memory_order_relaxed);
				to = (w & ~(uint32_t)ST_MASK) | ST_DONE;
				set_hold(r, i,
					 1); /* an error: its engine leaves it ABANDONED, for
					      * a beat to free (its helper is dead: no hold) */
			} else if (st == ST_BUSY || st == ST_ABANDONED) {
				to = ST_FREE;
			} else {
				break;
			}
			if (atomic_compare_exchange_strong_explicit(
				&e->word, &w, to, memory_order_acq_rel, memory_order_acquire)) {
				kvs_futex_wake(&e->word, INT_MAX, true);
				break;
			}
		}
	}
}

int kvs_ring_create(const char *path, uint32_t nent, uint64_t shard_size, uint32_t mode,
		    struct kvs_ring **out, char *msg, size_t msglen)
{
	static struct kvs_ring ring;
	uint64_t off_stage = 4096 + (uint64_t)nent * sizeof(struct ring_ent);
	uint64_t size = off_stage + (uint64_t)nent * shard_size;
	char tmp[PATH_MAX];
	int fd = kvs_cache_open_file(path, O_RDWR, mode, msg, msglen);

	if (fd >= 0) { /* a ring of the same dimensions is taken over, with what waits in it */
		int r = map_fd(fd, shard_size, &ring);
		kvs_sys_close(fd);
		if (r == 0 && ring.h->nent == nent) {
			ring.hold = calloc(nent, sizeof(*ring.hold));
			if (!ring.hold) {
				kvs_ring_unmap(&ring);
				return -ENOMEM;
			}
			take_over(&ring);
			kvs_ring_set_route(&ring, KVS_ROUTE_ASK);
			ring.h->helper_pid = (int32_t)getpid();
			*out = &ring;
			return 0;
		}
		if (r == 0)
			kvs_ring_unmap(&ring);
	}
	if (snprintf(tmp, sizeof(tmp), "%s.%d", path, (int)getpid()) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	kvs_syscall(SYS_unlink, tmp);
	fd = kvs_sys_open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode & 0666);
	if (fd < 0) {
		snprintf(msg, msglen, "cannot create %s: %s", tmp, strerror(errno));
		return -errno;
	}
	kvs_syscall(SYS_fchmod, fd, mode & 0666); /* the umask narrowed it */
	if (kvs_sys_ftruncate(fd, (off_t)size) != 0) {
		int e = errno;
		snprintf(msg, msglen, "cannot size %s to %llu bytes: %s", tmp,
			 (unsigned long long)size, strerror(e));
		kvs_sys_close(fd);
		kvs_syscall(SYS_unlink, tmp);
		return -e;
	}
	void *p = kvs_sys_mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	struct stat st;
	int e = p == MAP_FAILED ? errno : 0;
	if (!e && kvs_syscall(SYS_fstat, fd, &st) != 0)
		e = errno;
	kvs_sys_close(fd);
	if (e) {
		snprintf(msg, msglen, "cannot map %s: %s", tmp, strerror(e));
		kvs_syscall(SYS_unlink, tmp);
		return -e;
	}
	struct ring_head *h = p;
	h->magic = KVS_RING_MAGIC;
	h->version = KVS_RING_VERSION;
	h->nent = nent;
	h->shard_size = shard_size;
	h->off_ent = 4096;
	h->off_stage = off_stage;
	h->size = size;
	h->helper_pid = (int32_t)getpid();
	if (kvs_syscall(SYS_rename, tmp, path) != 0) {
		e = errno;
		snprintf(msg, msglen, "cannot rename %s over %s: %s", tmp, path, strerror(e));
		kvs_sys_munmap(p, size);
		kvs_syscall(SYS_unlink, tmp);
		return -e;
	}
	_Atomic uint64_t *hold = calloc(nent, sizeof(*hold));
	if (!hold) {
		kvs_sys_munmap(p, size);
		return -ENOMEM;
	}
	ring = (struct kvs_ring){.h = h,
				 .hold = hold,
				 .ent = (struct ring_ent *)((char *)p + 4096),
				 .stage = (char *)p + off_stage,
				 .size = size,
				 .dev = st.st_dev,
				 .ino = st.st_ino};
	*out = &ring;
	return 0;
}

int kvs_ring_beat(struct kvs_ring *r, kvs_ring_still_fn still, void *arg)
{
	atomic_store_explicit(&r->h->beat, kvs_node_ns(), memory_order_release);
	return kvs_ring_reclaim(r, still, arg);
}

void kvs_ring_set_hold(struct kvs_ring *r, uint64_t ns)
{
	r->hold_ns = ns;
}

int kvs_ring_reclaim(struct kvs_ring *r, kvs_ring_still_fn still, void *arg)
{
	int freed = 0;
	uint64_t now = kvs_mono_ns();

	for (uint32_t i = 0; i < r->h->nent; i++) {
		struct ring_ent *e = &r->ent[i];
		uint32_t w = atomic_load_explicit(&e->word, memory_order_acquire);
		uint32_t st = w & ST_MASK;
		uint64_t hold = hold_of(r, i);

		/* A failed get's buffer, out of use until its hold passes.  ABANDONED: its engine
		 * left it to us.  DONE: its engine has not seen the error yet; freed below only if
		 * the engine is gone.  The hold is cleared before the CAS that frees: after it, the
		 * entry may be claimed, taken and held anew by others. */
		if (hold && (st == ST_ABANDONED || st == ST_DONE) && now < hold)
			continue;
		if (hold && st == ST_ABANDONED) {
			set_hold(r, i, 0);
			if (atomic_compare_exchange_strong_explicit(
				&e->word, &w, ST_FREE, memory_order_acq_rel, memory_order_relaxed))
				freed++;
			continue;
		}
		/* Not CLAIMED: its owner field may still name the entry's previous owner until
		 * the claimer has written it, and a dead previous owner would free a live claim. */
		if (st != ST_POSTED && st != ST_DONE)
			continue;
		struct kvs_ring_owner o = r->ent[i].owner; /* published by the store of POSTED */

		if (still(arg, &o))
			continue;
		/* A dead engine moves its entry no more: a DONE entry's hold is ours to clear; a
		 * POSTED one's is never touched (it was cleared when the entry was last freed). */
		if (st == ST_DONE)
			set_hold(r, i, 0);
		if (atomic_compare_exchange_strong_explicit(
			&e->word, &w, ST_FREE, memory_order_acq_rel, memory_order_relaxed))
			freed++;
	}
	return freed;
}

void kvs_ring_leave(struct kvs_ring *r)
{
	atomic_store_explicit(&r->h->beat, 0, memory_order_release);
}

bool kvs_ring_zero_copy(const struct kvs_ring *r)
{
	return r->h->zero_copy != 0;
}

void kvs_ring_set_zero_copy(struct kvs_ring *r, bool on)
{
	r->h->zero_copy = on;
}

void kvs_ring_set_route(struct kvs_ring *r, int route)
{
	atomic_store_explicit(&r->h->route, (uint32_t)route, memory_order_relaxed);
}

int kvs_ring_take(struct kvs_ring *r, unsigned op, struct kvs_ring_job *jobs, int n,
		  uint64_t timeout_ns)
{
	_Atomic uint32_t *bell = &r->h->bell[op];
	uint64_t end = kvs_mono_ns() + timeout_ns;

	for (;;) {
		uint32_t b = atomic_load_explicit(bell, memory_order_acquire);
		int got = 0;

		for (uint32_t i = 0; i < r->h->nent && got < n; i++) {
			struct ring_ent *e = &r->ent[i];
			uint32_t w = atomic_load_explicit(&e->word, memory_order_acquire);

			if ((w & ST_MASK) != ST_POSTED || e->op != op)
				continue;
			if (!atomic_compare_exchange_strong_explicit(
				&e->word, &w, (w & ~(uint32_t)ST_MASK) | ST_BUSY,
				memory_order_acq_rel, memory_order_relaxed))
				continue;
			struct kvs_ring_job *j = &jobs[got++];
			set_hold(r, i, 0); /* a new request: any hold of the entry had passed */
			j->entry = i;
			j->owner = e->owner;
			j->slot = e->slot;
			j->op = e->op;
			j->len = e->len;
			j->key = e->key;
			memcpy(j->rkey, e->rkey, KVS_RING_KEY_MAX);
			j->rkey[KVS_RING_KEY_MAX - 1] = 0;
			j->staging = r->stage + (size_t)i * r->h->shard_size;
		}
		uint64_t now = kvs_mono_ns();
		if (got || now >= end)
			return got;
		kvs_futex_wait(bell, b, end - now, true);
	}
}

void kvs_ring_done(struct kvs_ring *r, uint32_t entry, int64_t result)
{
	struct ring_ent *e = &r->ent[entry];
	uint32_t w = atomic_load_explicit(&e->word, memory_order_acquire);

	if (e->op == KVS_RING_PUT) {
		atomic_store_explicit(&e->word, ST_FREE, memory_order_release);
		return;
	}
	/* -ECANCELED: answered before any transfer started; nothing can land late. */
	bool failed = result != -ENOENT && result != -ECANCELED && result != (int64_t)e->len;
	if (failed && r->hold)
		set_hold(r, entry, kvs_mono_ns() + r->hold_ns); /* kvs_ring_reclaim frees it */
	atomic_store_explicit(&e->result, result, memory_order_relaxed);
	for (;;) {
		uint32_t st = w & ST_MASK;
		uint32_t to = st == ST_BUSY ? (w & ~(uint32_t)ST_MASK) | ST_DONE : ST_FREE;

		if (st == ST_ABANDONED && failed && r->hold)
			return; /* freed after the hold */
		if (st != ST_BUSY && st != ST_ABANDONED)
			return; /* not the helper's (cannot happen while it holds the lock) */
		if (atomic_compare_exchange_strong_explicit(&e->word, &w, to, memory_order_acq_rel,
							    memory_order_acquire))
			break;
	}
	kvs_futex_wake(&e->word, INT_MAX, true);
}

void kvs_ring_staging(const struct kvs_ring *r, void **base, size_t *len)
{
	*base = r->stage;
	*len = (size_t)r->h->nent * r->h->shard_size;
}

bool kvs_ring_len(const struct kvs_ring *r, uint32_t entry, uint32_t *len)
{
	if (entry >= r->h->nent)
		return false;
	*len = r->ent[entry].len;
	return true;
}

uint32_t kvs_ring_entries(const struct kvs_ring *r)
{
	return r->h->nent;
}
