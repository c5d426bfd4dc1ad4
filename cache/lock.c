/*
 * lock: the region's process-shared robust mutexes, bounded waits for them, and their repair.
 *
 * DESIGN
 *
 * Repair.  A process that dies holding a mutex leaves it EOWNERDEAD for the next locker, who
 * must make the guarded state consistent before pthread_mutex_consistent().  For a stripe that
 * state is the chains of its buckets and the refs of its slots, both derivable: chains from
 * slot metadata (state hashed, bucket in the stripe), refs from the pin tables (an entry
 * changes only under the stripe of the slot it names).  For pack_lock it is the open frame,
 * which is sealed (pack.c).  For proc_lock nothing needs
 * rebuilding: each write under it is a single word, and a fold of counters interrupted between
 * the add and the zeroing counts them twice (the only damage, and only to statistics).
 *
 * Bounded waits.  The kernel repairs only what it can see: a holder that dies with the mutex
 * on its robust list.  A lock word that names a thread that does not exist (corruption, a
 * peer gone wrong) or a holder that is stopped (SIGSTOP, a debugger) would block every locker
 * for ever.  So no lock here waits without bound: after a trylock fails, the locker sleeps in
 * pthread_mutex_clocklock(CLOCK_MONOTONIC) slices of SLICE_NS and looks at the lock word
 * between slices.  glibc's robust mutex keeps the holder's TID in the futex word
 * (mu->__data.__lock, low 30 bits FUTEX_TID_MASK, plus FUTEX_WAITERS and FUTEX_OWNER_DIED),
 * written only by glibc and the kernel; we only peek at it.  The locker gives up with
 * -EUCLEAN when
 *   - the word (waiters bit aside) has not changed for two slices and its TID names no thread
 *     (kill(tid, 0) fails with ESRCH), is 0, or is the caller's own (we never hold two of these
 *     locks, so our own TID there is corruption); or
 *   - the whole wait passes c->lock_timeout_ns (loader.wait_timeout_ms for an attached
 *     process, KVS_LOCK_TIMEOUT_WATCH_NS for a watcher), whoever the holder is.
 * A lock found stuck is remembered in the handle (c->stuck[], process-local, relaxed: a stale
 * value costs one storage read, never a wrong byte) with the word that held it; until this
 * process takes that lock again, a locker that finds the same word gives up at once, so a
 * stuck stripe costs every later read nothing but its storage read.  Callers treat -EUCLEAN as
 * "read storage yourself".
 *
 * Holders in other PID namespaces.  Pods that share /dev/shm have PID namespaces of their own
 * (Kubernetes' default), and the TID in glibc's word is a number in the holder's namespace:
 * kill() from another one asks about some other thread, or none.  So each lock has a holder
 * word beside it (stripe.holder, hdr.proc_holder, hdr.pack_holder) that names the thread inside
 * by the region's names: (process-table slot + 1) << 16 | a per-thread number of that process
 * (never 0).  The locker writes it right after it has the mutex and clears it right before it
 * unlocks, relaxed (a peek, like the TID's: only its value over whole slices matters).  A
 * waiter that finds the lock word steady for two slices asks the holder word first:
 *   - it names another process's slot: the holder is gone if that slot's liveness lock (an
 *     OFD lock on the region file, proc.c) is free; the kernel's file locks answer alike in
 *     every namespace.  A slot past the table is corruption.  A holder word of this process's
 *     own slot is judged by the TID, as below (its threads' numbers wrap; TIDs are this
 *     namespace's).
 *   - it is 0: a holder between its lock and its store, or its clear and its unlock (a few
 *     instructions), a watcher (no slot), or corruption: the TID is asked as before.  Only a
 *     holder stopped inside those instructions, in another namespace, is taken for dead early,
 *     and that costs a storage read, never a wrong byte.
 * The whole wait is bounded by the lock timeout in every case, so a live holder in another
 * namespace is waited for exactly as one in this namespace.
 */
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "sys.h"

#define SLICE_NS 20000000ull /* look at the lock word this often while waiting */

int kvs_mutex_init_shared(pthread_mutex_t *mu)
{
	pthread_mutexattr_t a;
	int r;

	r = pthread_mutexattr_init(&a);
	if (r)
		return -r;
	r = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	if (!r)
		r = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	if (!r)
		r = pthread_mutex_init(mu, &a);
	pthread_mutexattr_destroy(&a);
	return -r;
}

/* The futex word of a glibc mutex, without its waiters bit (set and cleared by waiters). */
static uint32_t lock_word(pthread_mutex_t *mu)
{
	/* A peek at a word glibc and the kernel write atomically; relaxed is enough, since only
	 * its change over whole slices matters. */
	return (uint32_t)__atomic_load_n(&mu->__data.__lock, __ATOMIC_RELAXED) & ~FUTEX_WAITERS;
}

/* This thread's number for holder words: 1 to 0xffff, taken at its first lock. */
static __thread uint32_t thread_no;
static _Atomic uint32_t threads_numbered;

/* The holder word this thread writes in c's locks; 0 for a watcher (no process slot). */
static uint32_t my_holder(struct kvs_cache *c)
{
	if (c->self < 0)
		return 0;
	if (!thread_no)
		thread_no = atomic_fetch_add_explicit(&threads_numbered, 1, memory_order_relaxed) %
				0xffffu +
			    1;
	return ((uint32_t)(c->self + 1) << 16) | thread_no;
}

/* Whether no thread can ever unlock a mutex whose lock word names tid and whose holder word
 * is h (see the essay). */
static bool holder_gone(struct kvs_cache *c, uint32_t tid, uint32_t h)
{
	int saved = errno;
	bool gone;

	uint32_t p = h ? (h >> 16) - 1 : 0;

	if (h && (int)p != c->self) {
		/* Another process, maybe in another PID namespace: its slot's liveness lock. */
		gone = p >= c->nprocs || !kvs_proc_alive(c, p);
	} else {
		/* No holder word, or this process (its threads' numbers wrap; a TID does not, and
		 * it is this namespace's): the TID. */
		gone = tid == 0 || (pid_t)tid == gettid() ||
		       (kill((pid_t)tid, 0) < 0 && errno == ESRCH);
	}
	errno = saved;
	return gone;
}

/* Lock mu, giving up as the essay says.  Returns 0, EOWNERDEAD (locked, repair it),
 * ENOTRECOVERABLE, or ETIMEDOUT (not locked: stuck).  *stuck is mu's remembered word,
 * *holder its holder word, written here once mu is locked. */
static int lock_bounded(struct kvs_cache *c, pthread_mutex_t *mu, _Atomic uint32_t *stuck,
			_Atomic uint32_t *holder)
{
	uint64_t limit = c->lock_timeout_ns ? c->lock_timeout_ns : KVS_LOCK_TIMEOUT_WATCH_NS;
	uint32_t known = load_relaxed(stuck), seen;
	uint64_t start, now;
	int r, still = 0;

	r = pthread_mutex_trylock(mu);
	if (r != EBUSY)
		goto out;
	seen = lock_word(mu);
	if (known && seen == known)
		return ETIMEDOUT; /* still held by the word that held it when we gave up */
	start = now = kvs_mono_ns();
	for (;;) {
		uint64_t end = now + SLICE_NS < start + limit ? now + SLICE_NS : start + limit;
		struct timespec ts = {.tv_sec = (time_t)(end / 1000000000ull),
				      .tv_nsec = (long)(end % 1000000000ull)};

		r = pthread_mutex_clocklock(mu, CLOCK_MONOTONIC, &ts);
		if (r != ETIMEDOUT)
			break;
		uint32_t w = lock_word(mu);
		still = w == seen ? still + 1 : 0;
		seen = w;
		now = kvs_mono_ns();
		if ((still >= 2 && holder_gone(c, w & FUTEX_TID_MASK, load_relaxed(holder))) ||
		    now - start >= limit) {
			store_relaxed(stuck, w);
			return ETIMEDOUT;
		}
	}
out:
	if (r == 0 || r == EOWNERDEAD) {
		store_relaxed(holder, my_holder(c));
		if (known)
			store_relaxed(stuck, 0); /* it moved: forget it */
	}
	return r;
}

/* Unlock mu, clearing its holder word first. */
static void unlock_held(pthread_mutex_t *mu, _Atomic uint32_t *holder)
{
	store_relaxed(holder, 0);
	pthread_mutex_unlock(mu);
}

static bool slot_in_stripe(struct kvs_cache *c, uint32_t bucket, uint32_t stripe)
{
	uint32_t b = bucket & ~KVS_ORPHAN;

	return bucket != KVS_NIL && b < c->nbuckets && bucket_stripe(c, b) == stripe;
}

/* Rebuild stripe s after its holder died: chains from slot metadata, refs from pin tables. */
static void repair_stripe(struct kvs_cache *c, uint32_t s)
{
	for (uint32_t b = s; b < c->nbuckets; b += c->nstripes)
		store_relaxed(&c->buckets[b], KVS_NIL);
	for (uint32_t i = 0; i < c->nslots; i++) {
		struct kvs_slot *sl = &c->slots[i];
		uint32_t bucket = load_relaxed(&sl->bucket);
		uint32_t st = st_of(load_relaxed(&sl->state));

		if (!slot_in_stripe(c, bucket, s))
			continue;
		store_relaxed(&sl->refs, 0);
		if (bucket & KVS_ORPHAN)
			continue;
		if (st == KVS_SLOT_LOADING || st == KVS_SLOT_READY || st == KVS_SLOT_FAILED) {
			store_relaxed(&sl->next, load_relaxed(&c->buckets[bucket]));
			store_relaxed(&c->buckets[bucket], i);
		} else {
			/* Died between claim and insert: the claim is reclaimed with the process.
			 */
			store_relaxed(&sl->bucket, KVS_NIL);
		}
	}
	for (uint32_t p = 0; p < c->nprocs; p++) {
		struct kvs_proc *pr = proc_at(c, p);

		for (uint32_t e = 0; e < KVS_PINS_PER_PROC; e++) {
			uint32_t v = load_relaxed(&pr->pin[e]);

			if (v == 0 || v > c->nslots)
				continue;
			if (slot_in_stripe(c, load_relaxed(&c->slots[v - 1].bucket), s))
				add_relaxed(&c->slots[v - 1].refs, 1);
		}
	}
}

int kvs_stripe_lock(struct kvs_cache *c, uint32_t stripe)
{
	struct kvs_stripe *st = &c->stripes[stripe];
	int r = lock_bounded(c, &st->mu, &c->stuck[stripe], &st->holder);

	if (r == EOWNERDEAD) {
		repair_stripe(c, stripe);
		if (pthread_mutex_consistent(&st->mu)) {
			unlock_held(&st->mu, &st->holder);
			return euclean(c);
		}
		return 0;
	}
	return r == ENOTRECOVERABLE || r == ETIMEDOUT ? euclean(c) : -r;
}

void kvs_stripe_unlock(struct kvs_cache *c, uint32_t stripe)
{
	unlock_held(&c->stripes[stripe].mu, &c->stripes[stripe].holder);
}

int kvs_proc_lock(struct kvs_cache *c)
{
	struct kvs_hdr *h = c->hdr;
	int r = lock_bounded(c, &h->proc_lock, &c->stuck_proc, &h->proc_holder);

	if (r == EOWNERDEAD) {
		if (pthread_mutex_consistent(&h->proc_lock)) {
			unlock_held(&h->proc_lock, &h->proc_holder);
			return euclean(c);
		}
		return 0;
	}
	return r == ENOTRECOVERABLE || r == ETIMEDOUT ? euclean(c) : -r;
}

void kvs_proc_unlock(struct kvs_cache *c)
{
	unlock_held(&c->hdr->proc_lock, &c->hdr->proc_holder);
}

int kvs_pack_lock(struct kvs_cache *c)
{
	struct kvs_hdr *h = c->hdr;
	int r = lock_bounded(c, &h->pack_lock, &c->stuck_pack, &h->pack_holder);

	if (r == EOWNERDEAD) {
		kvs_pack_repair(c);
		if (pthread_mutex_consistent(&h->pack_lock)) {
			unlock_held(&h->pack_lock, &h->pack_holder);
			return euclean(c);
		}
		return 0;
	}
	if (r == ENOTRECOVERABLE)
		kvs_pack_repair(c); /* without the lock: nobody can take it again */
	return r == ENOTRECOVERABLE || r == ETIMEDOUT ? euclean(c) : -r;
}

void kvs_pack_unlock(struct kvs_cache *c)
{
	unlock_held(&c->hdr->pack_lock, &c->hdr->pack_holder);
}
