/*
 * wait: waiting for another process's load on the slot's state word.
 *
 * The state word is a shared (not private) futex word.  A waiter spins briefly on acquire
 * loads, which pair with the owner's exchange to READY or FAILED in slot.c, then sets the
 * waiters bit by CAS and sleeps in FUTEX_WAIT for at most one slice.  The owner wakes only
 * when the exchange returned the bit set, so an uncontended publish costs no syscall.  The
 * kernel compares the word before sleeping, so a publish between our CAS and our sleep makes
 * FUTEX_WAIT return EAGAIN at once: no lost wake-up.  After each slice the waiter checks the
 * owner's liveness lock and reclaims a dead owner, which fails the load and wakes everyone.
 * loader.wait=spin replaces the sleep with sched_yield (for comparison).
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

/* The owner of a LOADING slot died without publishing: reclaim it (fails the load). */
static void check_owner(struct kvs_cache *c, struct kvs_slot *s)
{
	uint32_t owner = load_relaxed(&s->owner);

	if (owner < c->nprocs && (int)owner != c->self && !kvs_proc_alive(c, owner))
		kvs_proc_reclaim(c, owner);
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
			return -EUCLEAN; /* a pinned slot is always hashed */
		if (spins < SPIN_LOOPS) {
			cpu_relax();
			continue;
		}
		uint64_t now = kvs_mono_ns();
		if (!start) {
			start = now;
			next_check = now + SLICE_NS;
		}
		if (now - start >= timeout_ns)
			return -ETIMEDOUT;
		if (now >= next_check) {
			check_owner(c, s);
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
