/*
 * wait: waiting for another process's load on the slot's state word.
 *
 * The state word is a shared (not private) futex word.  A waiter spins briefly on acquire
 * loads, which pair with the owner's exchange to READY or FAILED in slot.c, then sets the
 * waiters bit by CAS and sleeps in FUTEX_WAIT for at most one slice.  The owner wakes only
 * when the exchange returned the bit set, so an uncontended publish costs no syscall.  The
 * kernel compares the word before sleeping, so a publish between our CAS and our sleep makes
 * FUTEX_WAIT return EAGAIN at once: no lost wake-up.  loader.wait=spin replaces the sleep
 * with sched_yield (for comparison).
 *
 * Owners.  Before its first sleep, and after every slice, the waiter checks the slot's owner
 * (read without a lock: it was set under the stripe before our pin, and does not change while
 * the slot is LOADING and pinned).  An owner that is this process, or an ACTIVE table entry
 * whose liveness lock is held, is live: keep waiting.  A dead ACTIVE owner is reclaimed, which
 * fails the loads it recorded and wakes everyone.  Whatever is left (the owner index out of
 * range or KVS_NIL, a FREE or unknown table entry, a dead owner whose pin table does not name
 * this slot) is taken over: under the slot's stripe, still LOADING with pins and the same
 * owner, it is published FAILED with EOWNERDEAD, which wakes every waiter; the last release
 * sends it back to LOADING and the next pin owns the retry.  So a load nobody is doing costs
 * a waiter one check, not the whole timeout.
 */
#include <errno.h>
#include <limits.h>
#include <sched.h>

#include "config.h"
#include "internal.h"
#include "sys.h"

#define SPIN_LOOPS 200
#define SLICE_NS   50000000ull /* liveness re-check period while asleep */

void kvs_wake_all(_Atomic uint32_t *word)
{
	kvs_futex_wake(word, INT_MAX, true);
}

/* Keep waiting for a live owner; reclaim a dead one; take over a load nobody owns. */
static void check_owner(struct kvs_cache *c, const struct kvs_pin *pin)
{
	uint32_t owner = load_relaxed(&c->slots[pin->slot].owner);

	if ((int)owner == c->self)
		return;
	if (owner < c->nprocs &&
	    /* Pairs with the release store of ACTIVE in kvs_proc_attach(). */
	    load_acquire(&proc_at(c, owner)->state) == KVS_PROC_ACTIVE) {
		if (kvs_proc_alive(c, owner))
			return;
		kvs_proc_reclaim(c, owner);
	}
	kvs_slot_take_over(c, pin->slot, owner);
}

int kvs_cache_wait(struct kvs_cache *c, const struct kvs_pin *pin, uint64_t timeout_ns)
{
	struct kvs_slot *s = &c->slots[pin->slot];
	uint64_t start = 0, next_check = 0;

	for (unsigned spins = 0;; spins++) {
		/* Pairs with the release exchange in publish() (slot.c). */
		uint32_t w = load_acquire(&s->state);
		uint32_t st = st_of(w);

		if (st == KVS_SLOT_READY)
			return 0;
		if (st == KVS_SLOT_FAILED) {
			int err = load_relaxed(&s->err); /* stored before FAILED */

			/* A FAILED slot returns to LOADING only when its last pin drops: make sure
			 * no dead process's pin keeps it failed for everyone. */
			kvs_cache_reap_maybe(c);
			return err > 0 ? -err : -EIO;
		}
		if (st != KVS_SLOT_LOADING)
			return euclean(c); /* a pinned slot is always hashed */
		if (spins < SPIN_LOOPS) {
			cpu_relax();
			continue;
		}
		uint64_t now = kvs_mono_ns();
		if (!start) {
			start = now;
			next_check = now; /* check the owner before the first sleep */
		}
		if (now - start >= timeout_ns)
			return -ETIMEDOUT;
		if (now >= next_check) {
			check_owner(c, pin);
			next_check = now + SLICE_NS;
		}
		if (c->wait_mode == KVS_WAIT_SPIN) {
			sched_yield();
			continue;
		}
		if (!(w & KVS_ST_WAITERS)) {
			uint32_t want = w | KVS_ST_WAITERS;

			if (!cas_acq_rel(&s->state, &w, want))
				continue;
			w = want;
		}
		uint64_t left = timeout_ns - (now - start);
		kvs_futex_wait(&s->state, w, left < SLICE_NS ? left : SLICE_NS, true);
	}
}
