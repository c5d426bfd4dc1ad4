/*
 * pack: slots smaller than a frame, several to a frame, so that a small file or a file's
 * tail costs the cache about its own size (its bytes rounded up to whole pages), not a frame.
 *
 * DESIGN (the protocol of region.c, for packed slots)
 *
 * One frame at a time is the region's open frame (hdr.pack_frame): packed slots are cut from
 * it front to back, slot record by slot record (hdr.pack_next) and page by page
 * (hdr.pack_fill), under pack_lock, a robust process-shared mutex like the others (lock.c),
 * held for a few stores and never with a stripe.  While a frame is open, every slot record of
 * it not yet cut is CLAIMED by KVS_PACK_OWNER, a claimer that is no process: the sweep passes
 * over a frame with a claimed slot (evict.c), so the open frame is never evicted, and no
 * reclaim frees those records.  Cutting a slot: under the lock, CAS its state from
 * CLAIMED-by-pack to CLAIMED-by-us, then store its at and room (nobody reads them before the
 * caller's insert hashes the slot), then advance next and fill.  From then on the slot is an
 * ordinary claim of ours, hashed by the caller as any allocation (lookup_or_insert in slot.c,
 * or a stage).
 *
 * When the open frame has no record or no pages left for a request, the allocator takes a new
 * frame from the sweep (kvs_evict_frame, every slot CLAIMED by it; without the lock, since the
 * sweep takes stripes), cuts its own slot at the frame's start, and keeps open whichever frame
 * has more pages left: the new one (the old one is sealed: its uncut records go back to FREE,
 * then the new frame is named open, then its uncut records go from CLAIMED-by-us to
 * CLAIMED-by-pack), or the old one (the new frame's other records go back to FREE).  A frame
 * of the reserve (taken by a load when the main share was all pinned) is never opened, so
 * that normal allocations cannot cut from it.  If another allocator opened a frame with room
 * meanwhile, the new frame goes back whole.  A
 * sealed frame is an ordinary frame in use: its FREE records are dead space until the frame is
 * evicted, which takes all its slots at once (evict.c).
 *
 *   dies ...                           leaves                        repaired by
 *   inside pack_lock                   EOWNERDEAD                    the next locker seals the
 *                                                                    open frame: its records
 *                                                                    still CLAIMED-by-pack go
 *                                                                    FREE (kvs_pack_repair)
 *   after a cut, or holding a frame    slots CLAIMED by it           reclaim frees them
 *   not yet open
 *   so that the repair fails           ENOTRECOVERABLE               each locker seals the
 *   (pthread_mutex_consistent)                                       open frame without the
 *                                                                    lock (no cutter can run)
 *
 * So a record is CLAIMED-by-pack only in the frame the header names open, except in the
 * instants of a switch under the lock, whose repair seals what the header names; records a
 * dying switcher still held as its own are its claims.  No record is lost for good: every
 * FREE or CLAIMED-by-the-dead record is taken again with its frame.
 */
#include <errno.h>

#include "internal.h"

#define PACKED KVS_ST_CLAIMED_BY(KVS_PACK_OWNER)

/* Seal the open frame: its uncut records (from record `from` on) go back to FREE.  Caller
 * holds pack_lock. */
static void seal_locked(struct kvs_cache *c, uint32_t from)
{
	struct kvs_hdr *h = c->hdr;
	uint32_t f = h->pack_frame;

	if (f < c->nframes)
		for (uint32_t j = from; j < c->per_frame; j++) {
			uint32_t w = PACKED;

			cas_acq_rel(&c->slots[frame_first(c, f) + j].state, &w, KVS_SLOT_FREE);
		}
	h->pack_frame = KVS_NIL;
	h->pack_next = 0;
	h->pack_fill = 0;
}

void kvs_pack_repair(struct kvs_cache *c)
{
	/* Whatever next says: only the open frame has records CLAIMED-by-pack, and the CAS
	 * leaves every cut one (CLAIMED by its cutter, or hashed) as it is.  Without the lock
	 * (ENOTRECOVERABLE) it is as safe: nobody can hold it again, so nobody cuts, and the
	 * frame goes back to the sweep instead of staying open for good. */
	seal_locked(c, 0);
}

bool kvs_pack_seal(struct kvs_cache *c)
{
	bool open;

	if (kvs_pack_lock(c))
		return false;
	open = c->hdr->pack_frame < c->nframes;
	seal_locked(c, c->hdr->pack_next);
	kvs_pack_unlock(c);
	return open;
}

/* Cut a slot of pages pages from the open frame.  Caller holds pack_lock.  0 with *slot, or
 * -ENOSPC (no open frame, or no room in it). */
static int cut_locked(struct kvs_cache *c, uint32_t pages, uint32_t *slot)
{
	struct kvs_hdr *h = c->hdr;
	uint32_t f = h->pack_frame, j = h->pack_next, fill = h->pack_fill;

	if (f >= c->nframes || j >= c->per_frame || fill > c->frame_pages ||
	    pages > c->frame_pages - fill)
		return -ENOSPC;
	uint32_t i = frame_first(c, f) + j, w = PACKED;
	struct kvs_slot *s = &c->slots[i];

	if (!cas_acq_rel(&s->state, &w, KVS_ST_CLAIMED_BY(c->self))) {
		seal_locked(c, 0); /* not the pack's: corrupt; open a fresh frame instead */
		return -ENOSPC;
	}
	/* Ours now, and nobody reads them before the insert: never another slot's range. */
	store_relaxed(&s->at, fill);
	store_relaxed(&s->room, pages);
	h->pack_next = j + 1;
	h->pack_fill = fill + pages;
	if (h->pack_next == c->per_frame || h->pack_fill == c->frame_pages)
		seal_locked(c, h->pack_next); /* full: an ordinary frame from now on, evictable */
	*slot = i;
	return 0;
}

/* Pages the open frame still has, 0 without one.  Caller holds pack_lock. */
static uint32_t open_left(const struct kvs_cache *c)
{
	const struct kvs_hdr *h = c->hdr;

	if (h->pack_frame >= c->nframes || h->pack_next >= c->per_frame ||
	    h->pack_fill >= c->frame_pages)
		return 0;
	return c->frame_pages - h->pack_fill;
}

int kvs_pack_claim(struct kvs_cache *c, enum kvs_alloc_class cls, uint32_t pages, uint32_t *slot)
{
	struct kvs_hdr *h = c->hdr;
	uint32_t f, first;
	int r = kvs_pack_lock(c);

	if (r == 0) {
		r = cut_locked(c, pages, slot);
		kvs_pack_unlock(c);
		if (r == 0)
			return 0;
	}
	r = kvs_evict_frame(c, cls, &f);
	if (r)
		return r;
	if (kvs_pack_lock(c)) {
		/* The pack cannot be had: this slot alone in its frame, as a whole one would be. */
		*slot = kvs_evict_keep_first(c, f, pages);
		return 0;
	}
	if (cut_locked(c, pages, slot) == 0) {
		kvs_pack_unlock(c); /* another allocator opened one meanwhile */
		kvs_evict_free_frame(c, f);
		return 0;
	}
	/* A frame of the reserve is not opened: normal allocations would cut from it. */
	if (f < c->nmain && c->frame_pages - pages > open_left(c)) {
		first = frame_first(c, f);
		store_relaxed(&c->slots[first].at, 0);
		store_relaxed(&c->slots[first].room, pages);
		seal_locked(c, h->pack_next);
		h->pack_frame = f;
		h->pack_next = 1;
		h->pack_fill = pages;
		for (uint32_t j = 1; j < c->per_frame; j++)
			store_release(&c->slots[first + j].state, PACKED);
		*slot = first;
	} else {
		*slot = kvs_evict_keep_first(c, f, pages);
	}
	kvs_pack_unlock(c);
	return 0;
}
