/*
 * seen: when this node first loaded a shard of a file identity (kvs_cache_first_seen).
 *
 * DESIGN
 *
 * Why.  files.settle trusts a file's identity once its last change is files.settle old.  On
 * a local file system the stamps (mtime, ctime) come from this kernel's clock, so "old" is
 * measured on one clock.  On a network or FUSE file system another machine's clock wrote
 * them: a writer whose clock is 10 s behind makes a file written a moment ago look 10 s old.
 * So for those file systems the loader also asks how long this node has seen the identity,
 * on its own CLOCK_MONOTONIC: an identity counts as settled only once both say so.  The
 * first load of a shard of an identity records the moment; later loads find it.
 *
 * The table.  nseen entries (a power of two, at least 64), in sets of KVS_SEEN_WAYS: a block
 * id hashes to one set and may sit in any of its ways.  An entry is (block_lo, block_hi, t),
 * guarded by a per-entry seqlock, because several processes write the table without a lock:
 *
 *   field        written by                                  read without a lock by
 *   seq          a writer: CAS even -> odd (acq_rel), then   readers (acquire, then again
 *                store even + 2 (release) when done          after an acquire fence)
 *   lo, hi, t    the writer that made seq odd                readers, between the two loads
 *
 * A reader that sees seq odd, or changed across its reads, takes the entry as absent.  A
 * writer finding seq odd leaves the entry alone (another writer has it).  The only shared
 * state is the region's; no lock is held, so nothing blocks and no crash can wedge a lock.
 *
 * What can go wrong, and why it is safe.  Every error here makes an identity look newer
 * than it is (absent, or recorded later than its first load), never older:
 *   - an entry is replaced (its set is full): the identity looks new again; its next load is
 *     kept with an expiry instead of for good, and loaded once more after it;
 *   - two processes record the same new identity at once, in two ways: both times are "now";
 *   - a writer dies between its two stores: seq stays odd, the entry is dead for good (every
 *     reader and writer skips it), and the set has one way less;
 *   - a corrupt region: the fields are bounds-free numbers; a t in the future is taken as now.
 * A block id is a hash of the whole identity, so a rewritten file (new size, mtime or ctime)
 * has another id, and never inherits an old entry's time.
 */
#include <errno.h>

#include "internal.h"

/* The first entry of the set block falls in. */
static uint32_t set_of(const struct kvs_cache *c, const struct kvs_key *block)
{
	uint64_t x = block->block_lo ^ (block->block_hi * 0x9e3779b97f4a7c15ULL);

	x ^= x >> 31;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 29;
	return ((uint32_t)x & (c->nseen - 1)) & ~(KVS_SEEN_WAYS - 1);
}

/* Read entry e: true with its fields, and the seq they were read under, when it holds a
 * complete record (an entry never written is one: all zero). */
static bool seen_read(const struct kvs_seen *e, uint32_t *seq, uint64_t *lo, uint64_t *hi,
		      uint64_t *t)
{
	uint32_t s = load_acquire(&e->seq); /* pairs with the release in seen_write */

	*seq = s;
	if (s & 1)
		return false;
	*lo = load_relaxed(&e->lo);
	*hi = load_relaxed(&e->hi);
	*t = load_relaxed(&e->t);
	atomic_thread_fence(memory_order_acquire); /* the loads above before the check below */
	return load_relaxed(&e->seq) == s;
}

/* Record (block, t) in entry e, whose seq was seen even as s.  False if another writer got
 * there first. */
static bool seen_write(struct kvs_seen *e, uint32_t s, const struct kvs_key *block, uint64_t t)
{
	if (!cas_acq_rel(&e->seq, &s, s + 1))
		return false;
	/* The odd seq before the fields: a reader that sees a new field then sees seq moved
	 * (pairs with the acquire fence in seen_read). */
	atomic_thread_fence(memory_order_release);
	store_relaxed(&e->lo, block->block_lo);
	store_relaxed(&e->hi, block->block_hi);
	store_relaxed(&e->t, t);
	store_release(&e->seq, s + 2); /* pairs with the acquire in seen_read */
	return true;
}

uint64_t kvs_cache_first_seen(struct kvs_cache *c, const struct kvs_key *block, uint64_t now_ns)
{
	uint32_t base = set_of(c, block), victim = KVS_NIL, vseq = 0;
	uint64_t vt = UINT64_MAX;

	if (c->self < 0 || !c->nseen)
		return now_ns;
	for (uint32_t w = 0; w < KVS_SEEN_WAYS; w++) {
		uint64_t lo, hi, t;
		uint32_t s;

		if (!seen_read(&c->seen[base + w], &s, &lo, &hi, &t))
			continue; /* being written, or dead: neither found nor a victim */
		if (lo == block->block_lo && hi == block->block_hi && (lo || hi))
			return t < now_ns ? t : now_ns;
		/* The victim: an empty entry, else the one recorded longest ago. */
		uint64_t age = (lo || hi) ? t : 0;
		if (age < vt) {
			vt = age;
			victim = base + w;
			vseq = s;
		}
	}
	if (victim != KVS_NIL)
		seen_write(&c->seen[victim], vseq, block, now_ns);
	return now_ns;
}
