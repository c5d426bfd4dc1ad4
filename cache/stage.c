/*
 * stage: slots a writer fills with the bytes it writes (write-through), published under the
 * file's final identity once the writer is done with it; and moving a published shard to the
 * identity a rename gives its file.
 *
 * DESIGN (the protocol of region.c, one state more in use)
 *
 * A staged slot is CLAIMED by its writer: taken like any allocation (kvs_evict_claim, from
 * the main share only, so the reserve stays for loads, and only by CLOCK's sweeps with second
 * chances: KVS_ALLOC_STAGE), then left CLAIMED while the writer copies into
 * it, for as long as the writer's file stays open.  The node's writers together stage at most a
 * quarter of the region: each process says how many it holds in its process-table entry
 * (proc.staged, written by itself), and a claim sums them first; a dead writer's count goes
 * with its entry when it is reclaimed (its claims are freed then too).  A CLAIMED slot is in no
 * chain, so no lookup finds it, no allocator takes it (the sweep skips CLAIMED), and no stripe
 * repair touches it; if the writer dies, its reclaim frees every slot CLAIMED by it
 * (proc.c), so a writer that never publishes leaves nothing behind.  Only the writer writes
 * a staged slot's data; nothing else reads it.
 *
 * Publication takes the key's stripe and looks the key up (expired slots dropped, as every
 * lookup does).  Present (a reader loaded the shard, or a writer published it, before): that
 * slot is taken out of use first (kvs_slot_drop_locked: freed, or left an orphan to the pins
 * that hold it, which go on reading it), for it may hold an older file's bytes under the same
 * identity (a file deleted and made again on its inode, with its size, in the same timestamp
 * tick of a file system of whole-second stamps), where the writer's are the file's own (its
 * checks said no one else wrote it).  Then the slot is hashed as a load would be
 * (kvs_slot_insert_locked: LOADING, unowned, unpinned) and, still under the stripe, length
 * and expires are stored and READY with a release store; nobody can see it in between, since
 * every lookup takes the stripe.  A crash under the stripe is repaired as for any insert: the
 * chain is rebuilt from slot metadata, and a slot caught LOADING with no owner is loaded by
 * its next pinner.
 *
 *   dies ...                       leaves                          repaired by
 *   while staging                  slots CLAIMED by it             reclaim frees them
 *   publishing, inside the stripe  EOWNERDEAD                      stripe rebuild; a LOADING
 *                                                                  unowned slot is reloaded
 *   moving (rekey), between the    the slot CLAIMED by it          reclaim frees it
 *   two stripes
 *
 * Moving (kvs_cache_rekey): under the old key's stripe, a READY slot nobody pins is unhashed
 * and CLAIMED by the mover (as eviction takes a victim); then it is published under the new
 * key as above.  No code holds two stripes at once.
 */
#include <errno.h>
#include <string.h>

#include "internal.h"

void kvs_cache_stage_count(struct kvs_cache *c, uint32_t n)
{
	if (c->me)
		store_relaxed(&c->me->staged, n);
}

/* The slots staged on the node: each attached process's own count (a dead one's until it is
 * reclaimed), read without a lock: two stagers at once may each pass the bound by one. */
static uint64_t staged_on_node(struct kvs_cache *c)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < c->nprocs; i++) {
		struct kvs_proc *p = proc_at(c, i);

		if (load_relaxed(&p->state) == KVS_PROC_ACTIVE)
			n += load_relaxed(&p->staged);
	}
	return n;
}

int kvs_cache_stage_claim(struct kvs_cache *c, uint32_t *slot)
{
	if (c->self < 0 || c->keys_only)
		return -EPERM; /* a watcher; a region without data */
	/* The node's bound: a quarter of the region staged, by all its writers together. */
	if (staged_on_node(c) >= (c->nframes / 4 ? c->nframes / 4 : 1))
		return -ENOSPC;
	uint32_t spare = atomic_exchange_explicit(&c->stage_spare, KVS_NIL, memory_order_relaxed);

	/* The frame the last repack gave back, if nobody took it meanwhile: each pass of the
	 * hand would otherwise clear, then evict, frames of shards just published. */
	if (spare != KVS_NIL && kvs_evict_take_free(c, spare) == 0) {
		*slot = kvs_evict_keep_first(c, spare, c->frame_pages);
		return 0;
	}
	/* The main share only (the reserve is left to loads, which engines wait for), and never a
	 * frame readers use. */
	return kvs_evict_claim(c, KVS_ALLOC_STAGE, 0, slot);
}

void *kvs_cache_stage_data(struct kvs_cache *c, uint32_t slot)
{
	return slot_bytes(c, slot);
}

void kvs_cache_stage_drop(struct kvs_cache *c, uint32_t slot)
{
	struct kvs_slot *s = &c->slots[slot];
	uint32_t mine = KVS_ST_CLAIMED_BY(c->self);

	if (slot < c->nslots) /* only our own claim goes back */
		cas_acq_rel(&s->state, &mine, KVS_SLOT_FREE);
}

/* The slot to publish length bytes of staged frame slot from: a packed slot of their size,
 * with the bytes copied and the frame given back, so that a small file written through the
 * shim costs the cache what it holds, as one loaded would (pack.c); or slot itself, when it
 * is not a whole frame (a rekey's), holds a whole shard, or no packed slot can be had now. */
static uint32_t repack(struct kvs_cache *c, uint32_t slot, uint32_t length)
{
	uint32_t pages = (length + KVS_PAGE - 1) / KVS_PAGE, v;

	if (slot_room(c, slot) != c->shard_size || pages >= c->frame_pages || c->per_frame == 1 ||
	    kvs_pack_claim(c, KVS_ALLOC_NORMAL, pages ? pages : 1, &v))
		return slot;
	memcpy(slot_bytes(c, v), slot_bytes(c, slot), length);
	kvs_cache_stage_drop(c, slot);
	store_relaxed(&c->stage_spare, frame_of(c, slot)); /* for this process's next stage */
	return v;
}

int kvs_cache_stage_publish(struct kvs_cache *c, uint32_t slot, const struct kvs_key *key,
			    uint32_t length, uint64_t expires_ns)
{
	uint32_t b, stripe;
	struct kvs_slot *s;

	if (slot >= c->nslots ||
	    load_relaxed(&c->slots[slot].state) != KVS_ST_CLAIMED_BY(c->self) ||
	    length > slot_room(c, slot))
		return -EINVAL;
	slot = repack(c, slot, length);
	s = &c->slots[slot];
	int64_t i = kvs_slot_lock_find(c, key, &b, &stripe);
	if (i >= 0 && i != KVS_NIL && kvs_slot_drop_locked(c, (uint32_t)i, b)) {
		kvs_stripe_unlock(c, stripe);
		i = euclean(c); /* a corrupt chain: the old bytes cannot be taken out */
	}
	if (i < 0) {
		kvs_cache_stage_drop(c, slot);
		return (int)i;
	}
	kvs_slot_insert_locked(c, slot, b, key);
	store_relaxed(&s->length, length);
	store_relaxed(&s->expires, expires_ns);
	/* No pin, so no waiter to wake; pairs with the acquire loads of pinners and waiters. */
	store_release(&s->state, KVS_SLOT_READY);
	kvs_stripe_unlock(c, stripe);
	return 1;
}

int kvs_cache_rekey(struct kvs_cache *c, const struct kvs_key *from, const struct kvs_key *to)
{
	return kvs_cache_rekey_until(c, from, to, 0);
}

int kvs_cache_rekey_until(struct kvs_cache *c, const struct kvs_key *from, const struct kvs_key *to,
			  uint64_t cap_ns)
{
	uint32_t b, stripe;

	if (c->self < 0)
		return -EPERM;
	int64_t i = kvs_slot_lock_find(c, from, &b, &stripe);
	if (i < 0)
		return (int)i;
	if (i == KVS_NIL) {
		kvs_stripe_unlock(c, stripe);
		return 0;
	}
	struct kvs_slot *s = &c->slots[i];
	if (st_of(load_relaxed(&s->state)) != KVS_SLOT_READY || load_relaxed(&s->refs) != 0 ||
	    kvs_slot_unlink_locked(c, (uint32_t)i, b)) {
		kvs_stripe_unlock(c, stripe); /* in use under the old identity: leave it */
		return 0;
	}
	/* Claimed before unhashed, as a victim: a crash in between leaves a claim reclaim frees. */
	uint32_t length = load_relaxed(&s->length);
	uint64_t expires = load_relaxed(&s->expires);
	if (cap_ns && (!expires || expires > cap_ns))
		expires = cap_ns;
	store_release(&s->state, KVS_ST_CLAIMED_BY(c->self));
	store_relaxed(&s->bucket, KVS_NIL);
	kvs_stripe_unlock(c, stripe);
	return kvs_cache_stage_publish(c, (uint32_t)i, to, length, expires);
}
