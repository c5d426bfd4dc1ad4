/*
 * paio_table: the POSIX aio engine's state (paio_int.h): the table of served requests in flight,
 * the table of noted writes and its pool, paio_mu and paio_cond, the one-time set-up and the
 * fork rule.  Who writes what, and what is read without the lock, is the DESIGN comment of
 * api/paio.c ("Locks").
 */
#include <aio.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>

#include "deadline.h"
#include "paio_int.h"
#include "raw.h"
#include "shim.h"

/* ------------------------------------------------------------------ served requests */

pthread_mutex_t paio_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t paio_cond; /* CLOCK_MONOTONIC; initialised with the fork handlers */
struct req *paio_table[NBUCKETS];
_Atomic unsigned paio_inflight; /* served requests in the table; written under paio_mu */
static _Atomic int setup_state; /* 0, 1 being set up, 2 done */

/* The noted writes (api/paio_write.c): their pool, mapped once (wfree, under paio_mu). */
#define WPOOL 4096 /* writes noted at once; past that a write is followed as a change */
struct wreq *paio_wtable[NBUCKETS];
_Atomic unsigned paio_wpending;
static struct wreq *wpool, *wfree;
static bool wpool_failed;

/* paio_mu is taken with the shim's guard held, by every thread: a signal handler that interrupts a
 * thread holding it finds the guard set and makes the real call (guard.h). */
void paio_lock(void)
{
	(void)kvs_shim_in(); /* errno is the caller's business here: kept as it goes */
	pthread_mutex_lock(&paio_mu);
}

void paio_unlock(void)
{
	pthread_mutex_unlock(&paio_mu);
	kvs_shim_out(errno);
}

/* Every entry of the pool free.  Caller holds paio_mu, or is the only thread (fork child). */
static void wpool_reset(void)
{
	wfree = NULL;
	for (int i = WPOOL - 1; wpool && i >= 0; i--) {
		wpool[i].next = wfree;
		wfree = &wpool[i];
	}
}

/* A free entry, or NULL (the pool cannot be mapped, or is spent).  Caller holds paio_mu. */
struct wreq *paio_wreq_get(void)
{
	if (!wpool && !wpool_failed) {
		void *p = kvs_sys_mmap(NULL, WPOOL * sizeof(struct wreq), PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		wpool_failed = p == MAP_FAILED;
		wpool = wpool_failed ? NULL : p;
		wpool_reset();
	}
	struct wreq *w = wfree;
	if (w)
		wfree = w->next;
	return w;
}

void paio_wreq_put(struct wreq *w) /* caller holds paio_mu */
{
	w->next = wfree;
	wfree = w;
}

unsigned paio_bucket(const struct aiocb *cb)
{
	uintptr_t h = (uintptr_t)cb;

	h ^= h >> 17;
	h *= 0x9E3779B97F4A7C15ull;
	return (unsigned)(h >> 56) % NBUCKETS;
}

/* The running served request of cb, or NULL.  Caller holds paio_mu. */
struct req *paio_find(const struct aiocb *cb)
{
	struct req *r = paio_table[paio_bucket(cb)];

	while (r && r->cb != cb)
		r = r->next;
	return r;
}

/* Caller holds paio_mu. */
void paio_unlink_req(struct req *r)
{
	struct req **p = &paio_table[paio_bucket(r->cb)];

	while (*p && *p != r)
		p = &(*p)->next;
	if (*p)
		*p = r->next;
	/* pairs with paio_busy() */
	atomic_fetch_sub_explicit(&paio_inflight, 1, memory_order_release);
}

/* Is any served request running?  Without the lock; see the top of api/paio.c. */
bool paio_busy(void)
{
	/* pairs with writes */
	return atomic_load_explicit(&paio_inflight, memory_order_acquire) != 0;
}

/* A fork while another thread holds paio_mu would leave it locked in the child.  The child's
 * served requests never complete (the loader is forgotten), as glibc's do not either. */
void kvs_posix_aio_atfork_prepare(void)
{
	paio_lock(); /* released by the parent's or the child's handler */
}
void kvs_posix_aio_atfork_parent(void)
{
	paio_unlock();
}
void kvs_posix_aio_atfork_child(void)
{
	/* The noted writes are the parent's (their staged files are forgotten in the child):
	 * drop them without a look, as glibc's requests are not the child's either. */
	for (int i = 0; i < NBUCKETS; i++)
		paio_wtable[i] = NULL;
	atomic_store(&paio_wpending, 0);
	wpool_reset();
	paio_unlock();
	/* A parent thread may have been waiting on paio_cond: its state is the parent's. */
	kvs_cond_init_mono(&paio_cond);
}

/* Once, before the first served request: paio_cond on the monotonic clock (the fork handlers are
 * hooks/fanout.c's). */
void paio_setup(void)
{
	int s = atomic_load_explicit(&setup_state, memory_order_acquire); /* pairs below */

	if (s == 2)
		return;
	if (s == 0 && atomic_compare_exchange_strong(&setup_state, &s, 1)) {
		kvs_cond_init_mono(&paio_cond);
		atomic_store_explicit(&setup_state, 2, memory_order_release); /* pairs above */
		return;
	}
	while (atomic_load_explicit(&setup_state, memory_order_acquire) != 2)
		sched_yield();
}
