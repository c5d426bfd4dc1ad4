/*
 * evict: choosing a slot for a new key (CLOCK second chance, or FIFO for comparison).
 *
 * The hand is a free-running 64-bit counter on its own cache line; each allocator fetch-adds
 * it to take the next position, so no lock guards it.  A FREE slot is taken by CAS to
 * CLAIMED-by-us.  An unpinned hashed slot is a candidate: with CLOCK, a set access byte (set on
 * hit and on alloc) buys it one more turn and is cleared; otherwise it is unhashed under its
 * stripe and becomes CLAIMED-by-us.  Two sweeps with second chances, then one bare sweep that
 * ignores access bytes, so the walk always ends: with a slot, or -ENOSPC when all are pinned.
 *
 * The slots [nmain, nslots) are the reserve: normal allocations never walk them; loads and
 * prefetches walk them (with their own hand) only when the main share is all pinned.
 */
#include <errno.h>

#include "config.h"
#include "internal.h"

/* Unhash unpinned slot i and claim it.  Returns 0, or -EAGAIN if it changed under us. */
static int take_victim(struct kvs_cache *c, uint32_t i)
{
	struct kvs_slot *s = &c->slots[i];
	uint32_t b = load_relaxed(&s->bucket), stripe;
	int r;

	if (b == KVS_NIL || (b & KVS_ORPHAN) || b >= c->nbuckets)
		return -EAGAIN;
	stripe = bucket_stripe(c, b);
	r = kvs_stripe_lock(c, stripe);
	if (r)
		return r;
	uint32_t st = st_of(load_relaxed(&s->state));
	if (load_relaxed(&s->bucket) != b || load_relaxed(&s->refs) != 0 ||
	    (st != KVS_SLOT_LOADING && st != KVS_SLOT_READY && st != KVS_SLOT_FAILED)) {
		r = -EAGAIN;
		goto out;
	}
	r = kvs_slot_unlink_locked(c, i, b);
	if (r)
		goto out;
	/* Claimed before unhashed: a crash in between leaves a claim that reclaim frees. */
	store_release(&s->state, KVS_ST_CLAIMED_BY(c->self));
	store_relaxed(&s->bucket, KVS_NIL);
	if (st == KVS_SLOT_READY)
		kvs_cache_count(c, KVS_CTR_evictions, 1);
out:
	kvs_stripe_unlock(c, stripe);
	return r;
}

/* Walk [base, base + len) with hand h.  Returns 0 with *slot claimed, or -ENOSPC. */
static int sweep(struct kvs_cache *c, _Atomic uint64_t *h, uint32_t base, uint32_t len,
		 uint32_t *slot)
{
	bool clock = c->eviction == KVS_EVICT_CLOCK;

	for (int pass = 0; pass < 3; pass++) {
		bool second_chance = clock && pass < 2;

		for (uint32_t n = 0; n < len; n++) {
			uint32_t i = base + (uint32_t)(add_relaxed(h, 1) % len);
			struct kvs_slot *s = &c->slots[i];
			uint32_t w = load_relaxed(&s->state);

			if (st_of(w) == KVS_SLOT_FREE) {
				uint32_t pages = load_relaxed(&s->pages);

				/* A FREE slot without pages is taken only while /dev/shm has room
				 * above the headroom; else evict (populate.c). */
				if (pages == KVS_PAGES_NOROOM ||
				    (pages != KVS_PAGES_OK && !kvs_populate_may_grow(c)) ||
				    !cas_acq_rel(&s->state, &w, KVS_ST_CLAIMED_BY(c->self)))
					continue;
				/* A slot's pages exist before its first use (populate.c). */
				if (kvs_populate_claimed(c, i)) {
					store_release(&s->state, KVS_SLOT_FREE);
					continue;
				}
				kvs_populate_note_claim(c, i);
				*slot = i;
				return 0;
			}
			if (st_of(w) == KVS_SLOT_CLAIMED || load_relaxed(&s->refs) != 0)
				continue;
			if (second_chance && load_relaxed(&c->access[i])) {
				store_relaxed(&c->access[i], 0);
				continue;
			}
			int r = take_victim(c, i);
			if (r == 0) {
				*slot = i;
				return 0;
			}
			/* A victim behind a stuck stripe (-EUCLEAN) is skipped like a busy one: the
			 * other slots may still serve. */
			if (r != -EAGAIN && r != -EUCLEAN)
				return r;
		}
	}
	return -ENOSPC;
}

int kvs_evict_claim(struct kvs_cache *c, enum kvs_alloc_class cls, uint32_t *slot)
{
	int r = sweep(c, &c->hdr->hand, 0, c->nmain, slot);

	if (r == -ENOSPC && cls != KVS_ALLOC_NORMAL && c->nmain < c->nslots)
		r = sweep(c, &c->hdr->rhand, c->nmain, c->nslots - c->nmain, slot);
	return r;
}
