/*
 * slot: pin, release, publish, look up and preallocate (protocol: region.c); invalidation is
 * invalidate.c's.
 *
 * Deferred releases.  A release must lock the slot's stripe to drop refs and the pin-table
 * entry together.  When that lock is stuck (lock.c gives up with -EUCLEAN) the release is not
 * dropped: the entry stays set, so the pin still counts (the slot stays pinned, and a reclaim
 * of this process would return it), and its index goes into c->deferred, a process-local
 * bitmap over the pin table (no allocation: releases run on engine threads and must not call
 * malloc).  Every later release and kvs_cache_reap_maybe retry the set bits.  A thread takes a
 * bit with an atomic and before it retries, and sets it again on failure, so one thread at a
 * time retries an entry; the entry itself is written only under the stripe, as always.
 *
 * Expiry.  A load may be kept for a while only (slot.expires, the node's clock: kvs_node_ns; 0 =
 * for good): the pin that elects the owner (kvs_cache_pin_load) stores the expiry, under the
 * stripe, before any other pinner can find the slot owned; the last release of a FAILED slot
 * and a return to LOADING clear it.  Every lookup that finds a key (pin, pin-if-READY, the
 * existence query, preallocation) looks at it under the key's stripe: a READY or pinned
 * LOADING slot whose expiry has passed is unhashed there, freed if nobody holds it or left an
 * orphan for its last release otherwise, and the key is treated as absent, so the next pin
 * allocates a slot for it and becomes its owner, once for the node.  Pins already held keep
 * reading the old slot, and its owner publishes into the orphan for them.  So no pin taken at
 * or after the expiry is served by that load, whether it was still loading or READY.  A slot
 * kept for good costs the hit path one load of a word on the line the key compare has already
 * read; only a slot with an expiry reads the clock.
 */
#include <errno.h>

#include "internal.h"
#include "sys.h"

/* Atomic or/and on the deferred bitmap (process-local, so relaxed). */
#define or_relaxed(p, v)  atomic_fetch_or_explicit((p), (v), memory_order_relaxed)
#define and_relaxed(p, v) atomic_fetch_and_explicit((p), (v), memory_order_relaxed)

int64_t kvs_slot_find_locked(struct kvs_cache *c, uint32_t b, const struct kvs_key *key)
{
	uint32_t i = load_relaxed(&c->buckets[b]);

	for (uint32_t steps = 0; i != KVS_NIL; steps++) {
		if (i >= c->nslots || steps > c->nslots)
			return euclean(c);
		if (key_eq(&c->slots[i], key))
			return i;
		i = load_relaxed(&c->slots[i].next);
	}
	return KVS_NIL;
}

int kvs_slot_unlink_locked(struct kvs_cache *c, uint32_t slot, uint32_t b)
{
	_Atomic uint32_t *link = &c->buckets[b];

	for (uint32_t steps = 0; steps <= c->nslots; steps++) {
		uint32_t i = load_relaxed(link);

		if (i == slot) {
			store_relaxed(link, load_relaxed(&c->slots[slot].next));
			store_relaxed(&c->slots[slot].next, KVS_NIL);
			return 0;
		}
		if (i >= c->nslots)
			return i == KVS_NIL ? 0 : -EUCLEAN; /* absent: nothing to unlink */
		link = &c->slots[i].next;
	}
	return -EUCLEAN;
}

/* Record a pin of slot in this process's pin table; caller holds the slot's stripe. */
static int record_pin_locked(struct kvs_cache *c, uint32_t slot, uint32_t *entry)
{
	uint32_t h = add_relaxed(&c->pin_hint, 1);

	for (uint32_t n = 0; n < KVS_PINS_PER_PROC; n++) {
		uint32_t e = (h + n) & (KVS_PINS_PER_PROC - 1), zero = 0;

		/* Other threads of this process claim entries under other stripes: CAS. */
		if (cas_acq_rel(&c->me->pin[e], &zero, slot + 1)) {
			*entry = e;
			return 0;
		}
	}
	return -ENOBUFS;
}

/* Take hashed slot i, just found in bucket b, out of use: unlink it, then free it if unpinned,
 * else leave it an orphan that its last release frees.  Caller holds the stripe.  Returns 0 or
 * -EUCLEAN (the chain is corrupt: the slot stays). */
static int drop_locked(struct kvs_cache *c, uint32_t i, uint32_t b);

/* find_locked, with an expired slot dropped and reported absent (KVS_NIL). */
int64_t kvs_slot_find_fresh_locked(struct kvs_cache *c, uint32_t b, const struct kvs_key *key)
{
	int64_t i = kvs_slot_find_locked(c, b, key);

	if (i < 0 || i == KVS_NIL)
		return i;
	struct kvs_slot *s = &c->slots[i];
	/* Written under this stripe at election; cleared under it before LOADING again. */
	uint64_t exp = load_relaxed(&s->expires);
	if (exp == 0 || kvs_node_ns() < exp)
		return i;
	uint32_t st = st_of(load_relaxed(&s->state));
	if (st == KVS_SLOT_FAILED || (st == KVS_SLOT_LOADING && load_relaxed(&s->refs) == 0))
		return i; /* not a load to be served from; the next election sets a new expiry */
	if (c->watch)
		return KVS_NIL; /* a watcher changes nothing: gone for it, dropped by the next pin
				 */
	if (drop_locked(c, (uint32_t)i, b))
		return euclean(c);
	if (st == KVS_SLOT_READY)
		kvs_cache_count(c, KVS_CTR_shards_expired, 1);
	return KVS_NIL;
}

int64_t kvs_slot_lock_find(struct kvs_cache *c, const struct kvs_key *key, uint32_t *b,
			   uint32_t *stripe)
{
	int64_t i;

	*b = key_bucket(c, key);
	*stripe = bucket_stripe(c, *b);
	i = kvs_stripe_lock(c, *stripe);
	if (i)
		return i;
	i = kvs_slot_find_fresh_locked(c, *b, key);
	if (i < 0)
		kvs_stripe_unlock(c, *stripe);
	return i;
}

/* Pin hashed slot i; caller holds its stripe.  Elects the owner (refs 0 -> 1, not READY),
 * whose load is kept until expires (0: for good). */
static int pin_found_locked(struct kvs_cache *c, uint32_t i, uint64_t expires, struct kvs_pin *pin)
{
	struct kvs_slot *s = &c->slots[i];
	int r = record_pin_locked(c, i, &pin->entry);

	if (r)
		return r;
	pin->slot = i;
	uint32_t refs = load_relaxed(&s->refs);
	store_relaxed(&s->refs, refs + 1);
	uint32_t st = st_of(load_acquire(&s->state)); /* pairs with publish() */
	if (st == KVS_SLOT_READY) {
		store_relaxed(&c->access[frame_of(c, i)], 1);
		return KVS_PIN_HIT;
	}
	if (refs == 0) {
		/* No pins, so no waiters: a plain store clears FAILED for the retry. */
		store_relaxed(&s->owner, (uint32_t)c->self);
		store_relaxed(&s->err, 0);
		store_relaxed(&s->expires, expires);
		store_release(&s->state, KVS_SLOT_LOADING);
		return KVS_PIN_OWNER;
	}
	return KVS_PIN_WAIT;
}

/* Hash claimed slot v under key in bucket b, unowned and unpinned; caller holds the stripe. */
void kvs_slot_insert_locked(struct kvs_cache *c, uint32_t v, uint32_t b, const struct kvs_key *key)
{
	struct kvs_slot *s = &c->slots[v];

	s->key[0] = key->block_lo;
	s->key[1] = key->block_hi;
	s->key[2] = key->shard;
	store_relaxed(&s->owner, KVS_NIL);
	store_relaxed(&s->err, 0);
	store_relaxed(&s->length, 0);
	store_relaxed(&s->expires, 0);
	store_relaxed(&s->refs, 0);
	store_relaxed(&s->bucket, b);
	store_release(&s->state, KVS_SLOT_LOADING);
	store_relaxed(&s->next, load_relaxed(&c->buckets[b]));
	store_relaxed(&c->buckets[b], v);
	store_relaxed(&c->access[frame_of(c, v)], 1);
}

/* Give back a claim that was not used. */
static void unclaim(struct kvs_cache *c, uint32_t v)
{
	store_release(&c->slots[v].state, KVS_SLOT_FREE);
}

/* The pages a slot for bytes bytes takes: 0 (a whole frame) for 0 or a shard and more. */
static uint32_t pages_for(const struct kvs_cache *c, uint32_t bytes)
{
	uint64_t pages = ((uint64_t)bytes + KVS_PAGE - 1) / KVS_PAGE;

	return pages < c->frame_pages ? (uint32_t)pages : 0;
}

/*
 * Find key or allocate a slot for it, of room for bytes bytes (0: a whole shard).  With pin,
 * pin it (owner on a miss); without, insert it unowned (prealloc).  Returns a kvs_pin_result,
 * -EEXIST (prealloc of a present key), or -errno.
 */
static int lookup_or_insert(struct kvs_cache *c, const struct kvs_key *key,
			    enum kvs_alloc_class cls, uint32_t bytes, uint64_t expires,
			    struct kvs_pin *pin)
{
	uint32_t b = key_bucket(c, key), stripe = bucket_stripe(c, b), v = KVS_NIL;
	int64_t i;
	int r;

	if (c->self < 0)
		return -EPERM;
	for (;;) {
		r = kvs_stripe_lock(c, stripe);
		if (r)
			goto out_unclaim;
		i = kvs_slot_find_fresh_locked(c, b, key);
		if (i < 0) {
			r = (int)i;
			goto out_unlock;
		}
		if (i != KVS_NIL) {
			r = pin ? pin_found_locked(c, (uint32_t)i, expires, pin) : -EEXIST;
			goto out_unlock;
		}
		if (v != KVS_NIL)
			break;
		/* Miss: claim a slot without holding the stripe (eviction takes others). */
		kvs_stripe_unlock(c, stripe);
		r = kvs_evict_claim(c, cls, pages_for(c, bytes), &v);
		/* Everything pinned: perhaps by the dead, whose pins reaping returns. */
		if (r == -ENOSPC && kvs_cache_reap_maybe(c) > 0)
			r = kvs_evict_claim(c, cls, pages_for(c, bytes), &v);
		if (r)
			return r;
	}
	kvs_slot_insert_locked(c, v, b, key);
	if (pin) {
		r = pin_found_locked(c, v, expires, pin);
		if (r < 0) {
			kvs_slot_unlink_locked(c, v, b);
			store_release(&c->slots[v].state, KVS_ST_CLAIMED_BY(c->self));
			store_relaxed(&c->slots[v].bucket, KVS_NIL);
			goto out_unlock;
		}
	} else {
		kvs_cache_count(c, KVS_CTR_prefetches, 1);
		r = 0;
	}
	v = KVS_NIL; /* used */
out_unlock:
	kvs_stripe_unlock(c, stripe);
out_unclaim:
	if (v != KVS_NIL)
		unclaim(c, v);
	return r;
}

int kvs_cache_pin(struct kvs_cache *c, const struct kvs_key *key, enum kvs_alloc_class cls,
		  struct kvs_pin *pin)
{
	return lookup_or_insert(c, key, cls, 0, 0, pin);
}

int kvs_cache_pin_load(struct kvs_cache *c, const struct kvs_key *key, enum kvs_alloc_class cls,
		       uint32_t bytes, uint64_t expires_ns, struct kvs_pin *pin)
{
	return lookup_or_insert(c, key, cls, bytes, expires_ns, pin);
}

int kvs_cache_pin_ready(struct kvs_cache *c, const struct kvs_key *key, struct kvs_pin *pin)
{
	uint32_t b, stripe;
	int64_t i;
	int r;

	if (c->self < 0)
		return -EPERM;
	i = kvs_slot_lock_find(c, key, &b, &stripe);
	if (i < 0)
		return (int)i;
	if (i == KVS_NIL || st_of(load_relaxed(&c->slots[i].state)) != KVS_SLOT_READY)
		r = -EAGAIN;
	else
		r = pin_found_locked(c, (uint32_t)i, 0, pin); /* READY: a hit, no election */
	kvs_stripe_unlock(c, stripe);
	return r;
}

int kvs_cache_pin_loading(struct kvs_cache *c, const struct kvs_key *key, uint32_t owner,
			  uint32_t slot, struct kvs_pin *pin)
{
	uint32_t b, stripe;
	int64_t i;
	int r = -EAGAIN;

	if (c->self < 0)
		return -EPERM;
	i = kvs_slot_lock_find(c, key, &b, &stripe);
	if (i < 0)
		return (int)i;
	if (i != KVS_NIL && (uint32_t)i == slot) {
		struct kvs_slot *s = &c->slots[i];

		/* Owned and pinned (its owner's pin): pin_found_locked only counts us in. */
		if (st_of(load_relaxed(&s->state)) == KVS_SLOT_LOADING &&
		    load_relaxed(&s->owner) == owner && load_relaxed(&s->refs) > 0)
			r = pin_found_locked(c, (uint32_t)i, 0, pin);
	}
	kvs_stripe_unlock(c, stripe);
	return r;
}

int kvs_cache_prealloc(struct kvs_cache *c, const struct kvs_key *key, uint32_t bytes)
{
	return lookup_or_insert(c, key, KVS_ALLOC_PREFETCH, bytes, 0, NULL);
}

/* The stripe that guards slot i (hashed or orphan), locked; re-read until stable.  Returns 0,
 * -EBADSLT when the slot names no stripe (unhashed, or corrupt: no lock guards it), or
 * -EUCLEAN (the lock is stuck, or the bucket never settles). */
static int lock_slot_stripe(struct kvs_cache *c, uint32_t i, uint32_t *stripe)
{
	for (int tries = 0; tries < 1000; tries++) {
		uint32_t b = load_relaxed(&c->slots[i].bucket);
		int r;

		if (b == KVS_NIL || (b & ~KVS_ORPHAN) >= c->nbuckets)
			return -EBADSLT;
		*stripe = bucket_stripe(c, b & ~KVS_ORPHAN);
		r = kvs_stripe_lock(c, *stripe);
		if (r)
			return r;
		if (load_relaxed(&c->slots[i].bucket) == b)
			return 0;
		kvs_stripe_unlock(c, *stripe);
	}
	return -EUCLEAN;
}

/* Free an unpinned slot that is no longer in any chain; caller holds its stripe.  Claimed,
 * then unhashed, then freed: a crash between any two steps leaves a claim reclaim can free,
 * never a hashed-looking slot that no chain holds. */
static void free_locked(struct kvs_cache *c, struct kvs_slot *s)
{
	store_release(&s->state, KVS_ST_CLAIMED_BY(c->self));
	store_relaxed(&s->bucket, KVS_NIL);
	store_release(&s->state, KVS_SLOT_FREE);
}

/* Drop the pin recorded in entry e of process pr on slot i; caller holds the stripe. */
static void unpin_locked(struct kvs_cache *c, struct kvs_proc *pr, uint32_t e, uint32_t i)
{
	struct kvs_slot *s = &c->slots[i];
	uint32_t refs = load_relaxed(&s->refs);

	store_relaxed(&pr->pin[e], 0);
	if (refs == 0)
		return; /* corrupt; never underflow */
	store_relaxed(&s->refs, refs - 1);
	if (refs != 1)
		return;
	/* Last pin: no waiters can exist, so plain stores are enough. */
	uint32_t b = load_relaxed(&s->bucket);
	if (b & KVS_ORPHAN) {
		free_locked(c, s);
	} else if (st_of(load_relaxed(&s->state)) == KVS_SLOT_FAILED) {
		store_relaxed(&s->expires, 0); /* the retry's election sets its own */
		store_release(&s->state, KVS_SLOT_LOADING);
	}
}

/* Drop this process's pin in entry e if it still records slot v - 1.  Returns 0, or -EUCLEAN
 * when the stripe could not be locked (the entry is left as it was). */
static int unpin_own(struct kvs_cache *c, uint32_t e, uint32_t v)
{
	uint32_t stripe;
	int r = lock_slot_stripe(c, v - 1, &stripe);

	if (r == -EBADSLT) {
		/* No stripe guards the slot, so no count includes this entry: just forget it. */
		uint32_t want = v;
		cas_acq_rel(&c->me->pin[e], &want, 0);
		return 0;
	}
	if (r)
		return r;
	if (load_relaxed(&c->me->pin[e]) == v)
		unpin_locked(c, c->me, e, v - 1);
	kvs_stripe_unlock(c, stripe);
	return 0;
}

void kvs_slot_retry_deferred(struct kvs_cache *c)
{
	if (!c->me)
		return;
	for (uint32_t w = 0; w < KVS_PINS_PER_PROC / 64; w++) {
		uint64_t bits = load_relaxed(&c->deferred[w]);

		while (bits) {
			uint64_t m = bits & -bits;
			uint32_t e = w * 64 + (uint32_t)__builtin_ctzll(bits), v;

			bits &= bits - 1;
			if (!(and_relaxed(&c->deferred[w], ~m) & m))
				continue; /* another thread took it */
			v = load_relaxed(&c->me->pin[e]);
			if (v && v <= c->nslots && unpin_own(c, e, v))
				or_relaxed(&c->deferred[w], m); /* still stuck: later */
		}
	}
}

void kvs_cache_release(struct kvs_cache *c, const struct kvs_pin *pin)
{
	uint32_t e = pin->entry;

	if (!c->me || pin->slot >= c->nslots || e >= KVS_PINS_PER_PROC)
		return;
	kvs_slot_retry_deferred(c);
	if (load_relaxed(&c->me->pin[e]) != pin->slot + 1)
		return;
	if (unpin_own(c, e, pin->slot + 1))
		or_relaxed(&c->deferred[e / 64], 1ull << (e % 64));
}

void (*kvs_slot_test_published)(const struct kvs_slot *s, uint32_t state);

/* Publish a final state with a release exchange; wake sleepers only if they said so. */
static void publish(struct kvs_slot *s, uint32_t state)
{
	/* Pairs with the acquire loads in kvs_cache_wait() and pin_found_locked(). */
	uint32_t old = xchg_acq_rel(&s->state, state);

	if (kvs_slot_test_published)
		kvs_slot_test_published(s, state); /* sees what a waiter woken now would see */
	if (old & KVS_ST_WAITERS)
		kvs_wake_all(&s->state);
}

void kvs_cache_mark_ready(struct kvs_cache *c, const struct kvs_pin *pin, uint32_t length)
{
	struct kvs_slot *s = &c->slots[pin->slot];

	store_relaxed(&s->length, length);
	publish(s, KVS_SLOT_READY);
}

void kvs_cache_mark_ready_unkept(struct kvs_cache *c, const struct kvs_pin *pin, uint32_t length)
{
	struct kvs_slot *s = &c->slots[pin->slot];
	uint32_t stripe, b;

	/* Unhash first, under the stripe, so no pin from now on finds the key: the pins held
	 * (this load's readers) see READY, and the last release frees the orphan. */
	if (lock_slot_stripe(c, pin->slot, &stripe)) {
		kvs_cache_mark_failed(c, pin, ESTALE); /* cannot unhash: never publish it */
		return;
	}
	b = load_relaxed(&s->bucket);
	if (!(b & KVS_ORPHAN) && kvs_slot_unlink_locked(c, pin->slot, b)) {
		kvs_stripe_unlock(c, stripe);
		kvs_cache_mark_failed(c, pin, ESTALE);
		return;
	}
	store_relaxed(&s->bucket, b | KVS_ORPHAN);
	kvs_stripe_unlock(c, stripe);
	kvs_cache_mark_ready(c, pin, length);
}

void kvs_cache_mark_failed(struct kvs_cache *c, const struct kvs_pin *pin, int err)
{
	struct kvs_slot *s = &c->slots[pin->slot];

	store_relaxed(&s->err, err > 0 ? err : EIO);
	publish(s, KVS_SLOT_FAILED);
}

void kvs_slot_fail_locked(struct kvs_cache *c, uint32_t slot, int err)
{
	struct kvs_slot *s = &c->slots[slot];

	store_relaxed(&s->err, err);
	publish(s, KVS_SLOT_FAILED);
}

int kvs_cache_mark_not_ready(struct kvs_cache *c, const struct kvs_pin *pin)
{
	struct kvs_slot *s = &c->slots[pin->slot];
	uint32_t stripe;
	int r = lock_slot_stripe(c, pin->slot, &stripe);

	if (r)
		return -EUCLEAN;
	if (load_relaxed(&s->refs) == 1 && st_of(load_relaxed(&s->state)) == KVS_SLOT_READY) {
		store_relaxed(&s->owner, (uint32_t)c->self);
		store_relaxed(&s->expires, 0);
		store_release(&s->state, KVS_SLOT_LOADING);
	} else {
		r = -EBUSY;
	}
	kvs_stripe_unlock(c, stripe);
	return r;
}

void *kvs_cache_data(struct kvs_cache *c, const struct kvs_pin *pin)
{
	return slot_bytes(c, pin->slot);
}

uint32_t kvs_cache_room(struct kvs_cache *c, const struct kvs_pin *pin)
{
	return (uint32_t)slot_room(c, pin->slot);
}

void kvs_cache_data_region(const struct kvs_cache *c, void **base, size_t *len)
{
	*base = c->data;
	*len = c->keys_only ? 0 : (size_t)c->nframes * c->shard_size;
}

bool kvs_cache_data_ready(const struct kvs_cache *c, size_t off, size_t len)
{
	uint64_t S = c->shard_size;

	if (len == 0 || c->keys_only || off + len > (size_t)c->nframes * S)
		return false;
	for (uint64_t f = off / S; f <= (off + len - 1) / S; f++)
		if (atomic_load_explicit(&c->fpages[f], memory_order_acquire) != KVS_PAGES_OK)
			return false; /* pairs with the store once the pages exist (populate.c) */
	return true;
}

uint32_t kvs_cache_length(struct kvs_cache *c, const struct kvs_pin *pin)
{
	uint32_t len = load_relaxed(&c->slots[pin->slot].length);

	return len <= slot_room(c, pin->slot) ? len : 0;
}

int kvs_cache_lookup(struct kvs_cache *c, const struct kvs_key *key)
{
	uint32_t b, stripe;
	int64_t i = kvs_slot_lock_find(c, key, &b, &stripe);
	int r;

	if (i < 0)
		return (int)i;
	if (i == KVS_NIL)
		r = -ENOENT;
	else
		r = (int)st_of(load_acquire(&c->slots[i].state));
	if (r == KVS_SLOT_LOADING && load_relaxed(&c->slots[i].refs) == 0)
		r = KVS_SLOT_ALLOCATED;
	kvs_stripe_unlock(c, stripe);
	return r;
}

void kvs_slot_drop_unlinked_locked(struct kvs_cache *c, uint32_t i, uint32_t b)
{
	struct kvs_slot *s = &c->slots[i];

	if (load_relaxed(&s->refs) == 0)
		free_locked(c, s);
	else
		store_relaxed(&s->bucket, b | KVS_ORPHAN);
}

int kvs_slot_drop_locked(struct kvs_cache *c, uint32_t i, uint32_t b)
{
	return drop_locked(c, i, b);
}

static int drop_locked(struct kvs_cache *c, uint32_t i, uint32_t b)
{
	int r = kvs_slot_unlink_locked(c, i, b);

	if (r == 0)
		kvs_slot_drop_unlinked_locked(c, i, b);
	return r;
}

/* Return every pin that dead process p recorded, failing the loads it owned.  Caller holds
 * p's liveness byte (so no other reclaimer runs). */
uint32_t kvs_slot_unpin_all(struct kvs_cache *c, uint32_t p)
{
	struct kvs_proc *pr = proc_at(c, p);
	uint32_t left = 0;

	for (uint32_t e = 0; e < KVS_PINS_PER_PROC; e++) {
		uint32_t v = load_relaxed(&pr->pin[e]), stripe;

		if (v == 0)
			continue;
		int r = v > c->nslots ? -EBADSLT : lock_slot_stripe(c, v - 1, &stripe);
		if (r == -EBADSLT) {
			store_relaxed(&pr->pin[e], 0); /* no stripe counts it */
			continue;
		}
		if (r) {
			left++; /* stuck: the entry stays for the next reclaim */
			continue;
		}
		struct kvs_slot *s = &c->slots[v - 1];
		if (load_relaxed(&pr->pin[e]) == v) {
			if (load_relaxed(&s->owner) == p &&
			    st_of(load_relaxed(&s->state)) == KVS_SLOT_LOADING) {
				kvs_slot_fail_locked(c, v - 1, EOWNERDEAD);
				kvs_cache_count(c, KVS_CTR_failures, 1);
			}
			unpin_locked(c, pr, e, v - 1);
		}
		kvs_stripe_unlock(c, stripe);
	}
	return left;
}

int kvs_slot_free_claim(struct kvs_cache *c, uint32_t i, uint32_t p)
{
	struct kvs_slot *s = &c->slots[i];
	uint32_t w = KVS_ST_CLAIMED_BY(p), b = load_relaxed(&s->bucket), stripe = KVS_NIL;

	if (load_relaxed(&s->state) != w)
		return 0;
	/* p died inside a stripe with the bucket still set: clear it under that stripe (whose
	 * lock may repair it first), so a FREE slot never carries a bucket. */
	if (b != KVS_NIL && (b & ~KVS_ORPHAN) < c->nbuckets) {
		stripe = bucket_stripe(c, b & ~KVS_ORPHAN);
		if (kvs_stripe_lock(c, stripe))
			return -EUCLEAN;
	}
	if (load_relaxed(&s->state) == w) {
		store_relaxed(&s->bucket, KVS_NIL);
		/* Pairs with the claim CAS in evict.c: only p's own claim matches. */
		cas_acq_rel(&s->state, &w, KVS_SLOT_FREE);
	}
	if (stripe != KVS_NIL)
		kvs_stripe_unlock(c, stripe);
	return 0;
}

int kvs_slot_take_over(struct kvs_cache *c, uint32_t slot, uint32_t owner)
{
	struct kvs_slot *s = &c->slots[slot];
	uint32_t stripe;
	int r = lock_slot_stripe(c, slot, &stripe);

	if (r)
		return -EUCLEAN;
	/* We hold a pin, so a load that failed stays FAILED and no new election can happen: a
	 * slot still LOADING for the same owner is the load judged ownerless. */
	if (st_of(load_relaxed(&s->state)) == KVS_SLOT_LOADING && load_relaxed(&s->refs) != 0 &&
	    load_relaxed(&s->owner) == owner) {
		kvs_slot_fail_locked(c, slot, EOWNERDEAD);
		kvs_cache_count(c, KVS_CTR_failures, 1);
		r = 1;
	}
	kvs_stripe_unlock(c, stripe);
	return r;
}

int kvs_cache_test_lock_key(struct kvs_cache *c, const struct kvs_key *key)
{
	return kvs_stripe_lock(c, bucket_stripe(c, key_bucket(c, key)));
}
