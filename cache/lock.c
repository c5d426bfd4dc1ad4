/*
 * lock: the region's process-shared robust mutexes and their repair.
 *
 * A process that dies holding a mutex leaves it EOWNERDEAD for the next locker, who must make
 * the guarded state consistent before pthread_mutex_consistent().  For a stripe that state is
 * the chains of its buckets and the refs of its slots, both derivable: chains from slot
 * metadata (state hashed, bucket in the stripe), refs from the pin tables (an entry changes
 * only under the stripe of the slot it names).  For proc_lock nothing needs rebuilding: each
 * write under it is a single word, and a fold of counters interrupted between the add and the
 * zeroing counts them twice (the only damage, and only to statistics).
 */
#include <errno.h>
#include <pthread.h>

#include "internal.h"

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
	pthread_mutex_t *mu = &c->stripes[stripe].mu;
	int r = pthread_mutex_lock(mu);

	if (r == EOWNERDEAD) {
		repair_stripe(c, stripe);
		if (pthread_mutex_consistent(mu)) {
			pthread_mutex_unlock(mu);
			return -EUCLEAN;
		}
		return 0;
	}
	return r == ENOTRECOVERABLE ? -EUCLEAN : -r;
}

void kvs_stripe_unlock(struct kvs_cache *c, uint32_t stripe)
{
	pthread_mutex_unlock(&c->stripes[stripe].mu);
}

int kvs_proc_lock(struct kvs_cache *c)
{
	int r = pthread_mutex_lock(&c->hdr->proc_lock);

	if (r == EOWNERDEAD) {
		if (pthread_mutex_consistent(&c->hdr->proc_lock)) {
			pthread_mutex_unlock(&c->hdr->proc_lock);
			return -EUCLEAN;
		}
		return 0;
	}
	return r == ENOTRECOVERABLE ? -EUCLEAN : -r;
}

void kvs_proc_unlock(struct kvs_cache *c)
{
	pthread_mutex_unlock(&c->hdr->proc_lock);
}
