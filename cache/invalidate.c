/*
 * invalidate: drop a file's shards in a range of shard indexes (kvs_cache_invalidate, cache.h):
 * shard by shard for a short range, by walking every chain for a range longer than the region
 * has slots.  A slot still pinned is left an orphan that its last release frees (slot.c), so
 * a reader that holds it keeps its bytes and no later lookup finds them.
 */
#include <errno.h>

#include "internal.h"

/* Invalidate shard by shard: a short range.  Returns the number removed or -EUCLEAN. */
static int invalidate_keys(struct kvs_cache *c, const struct kvs_key *block, uint64_t first,
			   uint64_t last)
{
	int removed = 0, err = 0;

	for (uint64_t sh = first;; sh++) {
		struct kvs_key k = {block->block_lo, block->block_hi, sh};
		uint32_t b = key_bucket(c, &k), stripe = bucket_stripe(c, b);
		int64_t i;

		if (kvs_stripe_lock(c, stripe)) {
			err = -EUCLEAN; /* the others can still go */
		} else {
			i = kvs_slot_find_locked(c, b, &k);
			if (i < 0)
				err = -EUCLEAN;
			else if (i != KVS_NIL && kvs_slot_unlink_locked(c, (uint32_t)i, b) == 0) {
				kvs_slot_drop_unlinked_locked(c, (uint32_t)i, b);
				removed++;
			}
			kvs_stripe_unlock(c, stripe);
		}
		if (sh == last)
			break;
	}
	return err ? err : removed;
}

/* Invalidate by walking every chain, one stripe at a time: a range longer than the cache has
 * slots.  Returns the number removed or -EUCLEAN. */
static int invalidate_scan(struct kvs_cache *c, const struct kvs_key *block, uint64_t first,
			   uint64_t last)
{
	int removed = 0, err = 0;

	for (uint32_t stripe = 0; stripe < c->nstripes; stripe++) {
		if (kvs_stripe_lock(c, stripe)) {
			err = -EUCLEAN;
			continue;
		}
		for (uint32_t b = stripe; b < c->nbuckets; b += c->nstripes) {
			_Atomic uint32_t *link = &c->buckets[b];

			for (uint32_t steps = 0;; steps++) {
				uint32_t i = load_relaxed(link);

				if (i == KVS_NIL)
					break;
				if (i >= c->nslots || steps > c->nslots) {
					err = -EUCLEAN;
					break;
				}
				struct kvs_slot *s = &c->slots[i];
				if (s->key[0] != block->block_lo || s->key[1] != block->block_hi ||
				    s->key[2] < first || s->key[2] > last) {
					link = &s->next;
					continue;
				}
				/* Unlink in place; link then names the next slot. */
				store_relaxed(link, load_relaxed(&s->next));
				store_relaxed(&s->next, KVS_NIL);
				kvs_slot_drop_unlinked_locked(c, i, b);
				removed++;
			}
		}
		kvs_stripe_unlock(c, stripe);
	}
	return err ? err : removed;
}

int kvs_cache_invalidate(struct kvs_cache *c, const struct kvs_key *block, uint64_t first,
			 uint64_t last)
{
	if (last < first)
		return 0;
	/* More shards than slots: fewer locks to visit every chain than every shard. */
	if (last - first >= c->nslots)
		return invalidate_scan(c, block, first, last);
	return invalidate_keys(c, block, first, last);
}
