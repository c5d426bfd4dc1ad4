/*
 * wthru_copy: the copies of a write's bytes into its staged slots (see wthru.c, DESIGN),
 * inline or on the copier thread.  It sits on wthru_state.c (wt_mu, the shard entries, the
 * count of staged slots and its cap, wt_copy_fn) and is called by the writes (wthru.c); it
 * calls nothing above it.
 *
 * STATE
 *
 * copy_mu guards the copier's list (copy_head, copy_tail), copier_started, copier_failed and
 * copy_cache; it is never held with wt_mu, nor across a copy.  copy_cache is set before the
 * copier starts and not changed while it runs, so the copier reads it without the lock.  An op
 * on the list is the copier's from wt_copy_async until its release store to op->copied, which
 * the writer's acquire in wt_wait_copied pairs with.  A shard's slot is staged, and its entry
 * read, under wt_mu (shard_slot); the bytes are copied into the slot without it (the slot is
 * CLAIMED by this process and its entry stays while the op holds a reference).  wt_pvr_off
 * only goes from false to true, by whichever thread is refused process_vm_readv; relaxed loads
 * (a thread that still sees false is refused again, the same way).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "atomics.h"
#include "raw.h"
#include "sys.h"
#include "wthru_int.h"

/* The copier (STATE above). */
static pthread_mutex_t copy_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t copy_cond = PTHREAD_COND_INITIALIZER;
static struct kvs_wthru_op *copy_head, *copy_tail;
static bool copier_started, copier_failed;
static pthread_t copier;
static struct kvs_cache *copy_cache; /* the region the copier copies into (set before it starts) */

/* ------------------------------------------------------------------ copies */

/* The staged slot of f's shard sh, staged now if it has none (a copy stages each shard as it
 * reaches it, so that a write that fails early, or names far more bytes than its buffer holds,
 * stages no more than it copies); KVS_WT_NIL when the shard is not kept.  Staging never waits
 * for room.  The entry and its slot stay while the copy's op holds a reference (refs). */
static uint32_t shard_slot(struct kvs_cache *c, struct wt_file *f, uint64_t sh)
{
	uint32_t slot = KVS_WT_NIL;

	pthread_mutex_lock(&wt_mu);
	struct wt_shard *e = wt_shard_locked(f, sh, true);
	if (!e) {
		f->poisoned = true; /* no entry to account for it: keep nothing */
	} else if (!e->holey && e->slot == KVS_WT_NIL) {
		if (wt_staged_slots >= wt_slot_cap(c) || kvs_cache_stage_claim(c, &e->slot)) {
			e->slot = KVS_WT_NIL;
			e->holey = true; /* this shard is not kept */
		} else {
			wt_staged_slots++;
			kvs_cache_stage_count(c,
					      (uint32_t)wt_staged_slots); /* for the node's bound */
		}
	}
	if (e && !e->holey)
		slot = e->slot;
	pthread_mutex_unlock(&wt_mu);
	return slot;
}

/* Copy the op's bytes [0, to) from its source (src_copy, for device memory) into their staged
 * slots: shard by shard. */
static void copy_src(struct kvs_cache *c, struct kvs_wthru_op *op, uint64_t to)
{
	uint64_t S = kvs_cache_shard_size(c);

	for (uint64_t pos = 0; pos < to && !op->copy_failed;) {
		uint64_t at = op->off + pos, sh = at / S, within = at - sh * S;
		uint64_t n = S - within < to - pos ? S - within : to - pos;
		uint32_t slot = shard_slot(c, op->f, sh);

		if (slot != KVS_WT_NIL &&
		    op->src_copy(op->src_ctx, pos, (char *)kvs_cache_stage_data(c, slot) + within,
				 n))
			op->copy_failed = true; /* the rest is not copied: the file keeps nothing */
		pos += n;
	}
}

/*
 * Copy n bytes of the program's buffer src into a slot, with the kernel's own checks: the
 * program's write gets EFAULT (or a short count) from a buffer it cannot read, where memcpy
 * would crash the process, on this thread or the copier.  process_vm_readv on ourselves does
 * the copy and answers EFAULT instead (about 85% of memcpy's speed here, benchmarks.md).
 * Where it is not allowed (a seccomp filter), the copies are made after the write instead,
 * of the bytes the kernel has just read (pvr_off).  Returns false when the copy is not whole.
 */
_Atomic bool wt_pvr_off;

static bool safe_copy(void *dst, const void *src, size_t n)
{
	struct iovec l = {dst, n}, r = {(void *)src, n};

	if (!atomic_load_explicit(&wt_pvr_off, memory_order_relaxed)) {
		ssize_t got = kvs_syscall(SYS_process_vm_readv, getpid(), &l, 1, &r, 1, 0);

		if (got == (ssize_t)n)
			return true;
		if (got >= 0 || errno == EFAULT)
			return false;
		atomic_store(&wt_pvr_off, true); /* EPERM, ENOSYS: not here */
	}
	return false;
}

/* Copy the op's bytes [0, to) of the request into their staged slots. */
void wt_copy_op(struct kvs_cache *c, struct kvs_wthru_op *op, uint64_t to)
{
	if (op->src_copy) {
		copy_src(c, op, to);
		return;
	}
	uint64_t S = kvs_cache_shard_size(c), pos = 0;
	int v = 0;
	uint64_t in_v = 0; /* bytes of iov[v] already used */

	while (pos < to && v < op->iovcnt) {
		uint64_t at = op->off + pos, sh = at / S, within = at - sh * S;
		uint64_t n = S - within;
		uint64_t left_v = op->iov[v].iov_len - in_v;

		if (left_v == 0) {
			v++;
			in_v = 0;
			continue;
		}
		if (n > left_v)
			n = left_v;
		if (n > to - pos)
			n = to - pos;
		uint32_t slot = shard_slot(c, op->f, sh);
		if (slot != KVS_WT_NIL) {
			char *dst = (char *)kvs_cache_stage_data(c, slot) + within;

			/* Map the slot's pages in one call, not one fault per page (the pages
			 * exist: a claimed slot is populated). */
			if (n >= KVS_WT_POPULATE_MIN) {
				uintptr_t a = (uintptr_t)dst & ~(uintptr_t)4095;
				uintptr_t z = ((uintptr_t)dst + n + 4095) & ~(uintptr_t)4095;

				madvise((void *)a, z - a, MADV_POPULATE_WRITE);
			}
			const char *src = (const char *)op->iov[v].iov_base + in_v;
			if (op->trusted) {
				wt_copy_fn(dst, src, n); /* the kernel has just read these bytes */
			} else if (!safe_copy(dst, src, n)) {
				/* The kernel writes no further than this either (a short count or
				 * EFAULT): nothing past it is copied, or staged. */
				op->copy_failed = true;
				return;
			}
		}
		pos += n;
		in_v += n;
	}
}

static void *copier_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&copy_mu);
	for (;;) {
		while (!copy_head)
			pthread_cond_wait(&copy_cond, &copy_mu);
		struct kvs_wthru_op *op = copy_head;
		copy_head = op->next;
		if (!copy_head)
			copy_tail = NULL;
		pthread_mutex_unlock(&copy_mu);
		wt_copy_op(copy_cache, op, op->len);
		_Atomic uint32_t *done = &op->copied;
		store_release(done, 1); /* pairs with wait_copied(); the op is the writer's again */
		kvs_futex_wake(done, 1, false);
		pthread_mutex_lock(&copy_mu);
	}
	return NULL;
}

/* Hand op to the copier; false if there is none (copy inline then). */
bool wt_copy_async(struct kvs_cache *c, struct kvs_wthru_op *op)
{
	bool ok;

	pthread_mutex_lock(&copy_mu);
	if (!copier_started && !copier_failed) {
		copy_cache = c;
		copier_started =
		    kvs_thread_start(&copier, copier_main, NULL, KVS_STACK_FOREIGN) == 0;
		copier_failed = !copier_started;
	}
	ok = copier_started && copy_cache == c;
	if (ok) {
		store_relaxed(&op->copied, 0);
		op->next = NULL;
		if (copy_tail)
			copy_tail->next = op;
		else
			copy_head = op;
		copy_tail = op;
		pthread_cond_signal(&copy_cond);
	}
	pthread_mutex_unlock(&copy_mu);
	return ok;
}

void wt_wait_copied(struct kvs_wthru_op *op)
{
	for (int spins = 0; !load_acquire(&op->copied); spins++) { /* pairs with copier_main */
		if (spins < 200) {
			cpu_relax();
			continue;
		}
		kvs_futex_wait(&op->copied, 0, 0, false);
	}
}

void wt_copy_atfork_child(void)
{
	pthread_mutex_init(&copy_mu, NULL);
	pthread_cond_init(&copy_cond, NULL);
	copy_head = copy_tail = NULL;
	copier_started = copier_failed = false;
	copy_cache = NULL;
}
