/*
 * evict: choosing room for a new key (CLOCK second chance, or FIFO for comparison).
 *
 * Room is taken a frame at a time: the data of shard_size bytes that per_frame slot records
 * share (layout.h).  A whole shard gets a frame's first slot; a smaller load gets a packed slot
 * of the open frame (pack.c), which takes frames from here when it needs a new one.
 *
 * The hand is a free-running 64-bit counter on its own cache line; each allocator fetch-adds
 * it to take the next frame, so no lock guards it.  A frame is taken when each of its slots
 * can be: FREE by CAS to CLAIMED-by-us, hashed and unpinned by unhashing it under its stripe
 * (CLAIMED-by-us too).  A frame with a claimed slot (an allocation, a staged write, the open
 * frame of the pack) or a pinned one is passed over.  With CLOCK, a set access byte (one per
 * frame, set on hit and on alloc of any of its slots) buys an in-use frame one more turn and
 * is cleared.  Two sweeps with second chances, then one bare sweep that ignores access bytes,
 * so the walk always ends: with a frame, or -ENOSPC when none can be taken.
 *
 * A frame is peeked first, without locks, and taken only if the peek found it idle; a slot
 * that is pinned or claimed between the peek and its turn stops the taking, and the slots
 * taken so far go back to FREE: their bytes are lost (counted as evictions), the frame stays
 * in use with the rest.  That costs hits, never a byte: nothing can find a FREE slot.
 *
 * The frames [nmain, nframes) are the reserve: normal allocations never walk them; loads and
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

/* Peek at frame f without locks: false if a slot is claimed, pinned, or an orphan (its last
 * release frees it) or in use with no bucket at all (corrupt: KVS_NIL has the orphan bit);
 * *all_free when every slot is FREE. */
static bool frame_idle(struct kvs_cache *c, uint32_t f, bool *all_free)
{
	uint32_t first = frame_first(c, f);

	*all_free = true;
	for (uint32_t j = 0; j < c->per_frame; j++) {
		struct kvs_slot *s = &c->slots[first + j];
		uint32_t st = st_of(load_relaxed(&s->state));

		if (st == KVS_SLOT_FREE)
			continue;
		*all_free = false;
		if (st == KVS_SLOT_CLAIMED || load_relaxed(&s->refs) != 0 ||
		    (load_relaxed(&s->bucket) & KVS_ORPHAN))
			return false;
	}
	return true;
}

void kvs_evict_free_frame(struct kvs_cache *c, uint32_t f)
{
	uint32_t first = frame_first(c, f), mine = KVS_ST_CLAIMED_BY(c->self);

	for (uint32_t j = 0; j < c->per_frame; j++) {
		uint32_t w = mine;

		cas_acq_rel(&c->slots[first + j].state, &w, KVS_SLOT_FREE);
	}
}

/* Take every slot of frame f for us.  0, or -EAGAIN / -EUCLEAN with what was taken given
 * back (FREE). */
static int take_frame(struct kvs_cache *c, uint32_t f)
{
	uint32_t first = frame_first(c, f);

	for (uint32_t j = 0; j < c->per_frame; j++) {
		struct kvs_slot *s = &c->slots[first + j];
		uint32_t w = load_relaxed(&s->state);
		int r;

		if (st_of(w) == KVS_SLOT_FREE)
			r = cas_acq_rel(&s->state, &w, KVS_ST_CLAIMED_BY(c->self)) ? 0 : -EAGAIN;
		else if (st_of(w) == KVS_SLOT_CLAIMED || load_relaxed(&s->refs) != 0)
			r = -EAGAIN;
		else
			r = take_victim(c, first + j);
		if (r) {
			/* Only what this call took: the slots after j are not ours. */
			for (uint32_t k = 0; k < j; k++)
				store_release(&c->slots[first + k].state, KVS_SLOT_FREE);
			return r;
		}
	}
	return 0;
}

/* Walk frames [base, base + len) with hand h.  Returns 0 with frame *frame taken, or
 * -ENOSPC.  Staging (KVS_ALLOC_STAGE) makes only the two sweeps with second chances, never the
 * third that ignores access bytes: bytes that may never be published push out no frame a
 * reader touched since the hand last passed it twice, yet a save still displaces what was
 * read once and left (a store just loaded, an older save), as a load would. */
static int sweep(struct kvs_cache *c, _Atomic uint64_t *h, uint32_t base, uint32_t len,
		 enum kvs_alloc_class cls, uint32_t *frame)
{
	bool clock = c->eviction == KVS_EVICT_CLOCK, stage = cls == KVS_ALLOC_STAGE;

	for (int pass = 0; pass < (stage ? 2 : 3); pass++) {
		bool second_chance = clock && pass < 2;

		for (uint32_t n = 0; n < len; n++) {
			uint32_t f = base + (uint32_t)(add_relaxed(h, 1) % len);
			bool all_free;

			if (!frame_idle(c, f, &all_free))
				continue;
			if (all_free) {
				uint32_t pages = load_relaxed(&c->fpages[f]);

				/* A frame without pages is taken only while /dev/shm has room
				 * above the headroom; else evict (populate.c). */
				if (pages == KVS_PAGES_NOROOM ||
				    (pages != KVS_PAGES_OK && !kvs_populate_may_grow(c)))
					continue;
			} else if (second_chance && load_relaxed(&c->access[f])) {
				store_relaxed(&c->access[f], 0);
				continue;
			}
			int r = take_frame(c, f);
			if (r == 0 && all_free) {
				/* A frame's pages exist before its first use (populate.c). */
				if (kvs_populate_claimed(c, f)) {
					kvs_evict_free_frame(c, f);
					continue;
				}
				kvs_populate_note_claim(c, f);
			}
			if (r == 0) {
				*frame = f;
				return 0;
			}
			/* A victim behind a stuck stripe (-EUCLEAN) is skipped like a busy one: the
			 * other frames may still serve. */
			if (r != -EAGAIN && r != -EUCLEAN)
				return r;
		}
	}
	return -ENOSPC;
}

static int evict_frame(struct kvs_cache *c, enum kvs_alloc_class cls, uint32_t *frame)
{
	int r = sweep(c, &c->hdr->hand, 0, c->nmain, cls, frame);

	if (r == -ENOSPC && cls != KVS_ALLOC_NORMAL && cls != KVS_ALLOC_STAGE &&
	    c->nmain < c->nframes)
		r = sweep(c, &c->hdr->rhand, c->nmain, c->nframes - c->nmain, cls, frame);
	return r;
}

int kvs_evict_take_free(struct kvs_cache *c, uint32_t f)
{
	bool all_free;

	if (f >= c->nmain || !frame_idle(c, f, &all_free) || !all_free ||
	    load_acquire(&c->fpages[f]) != KVS_PAGES_OK) /* pairs with populate.c's CAS */
		return -EAGAIN;
	return take_frame(c, f);
}

int kvs_evict_frame(struct kvs_cache *c, enum kvs_alloc_class cls, uint32_t *frame)
{
	int r = evict_frame(c, cls, frame);

	/* The open frame of the pack is never taken while open: in a small region it may be
	 * the one frame left, so close it and look once more. */
	if (r == -ENOSPC && kvs_pack_seal(c))
		r = evict_frame(c, cls, frame);
	return r;
}

uint32_t kvs_evict_keep_first(struct kvs_cache *c, uint32_t f, uint32_t pages)
{
	uint32_t first = frame_first(c, f);

	store_relaxed(&c->slots[first].at, 0);
	store_relaxed(&c->slots[first].room, pages);
	/* The others go back to FREE: a slot of an in-use frame that nothing finds, taken again
	 * with its frame. */
	for (uint32_t j = 1; j < c->per_frame; j++)
		store_release(&c->slots[first + j].state, KVS_SLOT_FREE);
	return first;
}

int kvs_evict_claim(struct kvs_cache *c, enum kvs_alloc_class cls, uint32_t pages, uint32_t *slot)
{
	uint32_t f;
	int r;

	if (pages && pages < c->frame_pages && c->per_frame > 1)
		return kvs_pack_claim(c, cls, pages, slot);
	r = kvs_evict_frame(c, cls, &f);
	if (r == 0)
		*slot = kvs_evict_keep_first(c, f, c->frame_pages);
	return r;
}
