/*
 * wseq: did another process under the shim write a file before, while, or after this one did?
 * (write-through: a writer publishes its bytes only if no one else's can be on storage in
 * what it publishes.)
 *
 * DESIGN
 *
 * One 64-bit word per entry, nseen entries, direct-mapped by a hash of (st_dev, st_ino):
 *
 *   bits 63-40  key: 24 bits of the hash, never 0 (0 is an empty entry)
 *   bits 39-28  owner: the process-table slot + 1 of the process whose writes these are, or
 *               W_MANY once two processes have had writes of the file in flight at once
 *   bits 27-20  in flight: writes begun and not yet ended on the file
 *   bits 19-0   gen: moved by every write's begin
 *
 * Every change is a CAS of the whole word, by any process, without a lock.  A write begins by
 * adding one to "in flight" and moving gen, and ends by taking one off.  Its begin makes its
 * process the owner when it is already, or when nothing is in flight (another process's
 * writes, all over: *foreign*, the caller's earlier bytes of the file may be covered by
 * them); with another process's writes in flight the owner becomes W_MANY.  An entry of
 * another key with nothing in flight, or an empty one, is taken over (foreign too: the history
 * of the file is lost); one with writes in flight cannot be, and the write is unclean.  A
 * write is clean when its process is still the owner when it ends; the end notes gen.  The
 * writer publishes (kvs_cache_write_last) only if its process is the owner, nothing is in
 * flight and gen is what its last end noted: no write of anyone began since.
 *
 * Several writes of one process at once are the process's own business (the caller tracks
 * their ranges); two processes' are not, whatever their ranges.
 *
 * What can go wrong, and why it is safe.  Every failure makes a write look unclean or
 * foreign, never another process's write absent, but one: a take-over that draws the gen an
 * old writer noted (2^-20 per take-over, for a file written again by another process while
 * its entry was taken), which the identity check at publication and the expiry of what is
 * published cover as they cover writers not under the shim.
 *   - a writer dies in flight (SIGKILL inside a write, an exit with an aio write never
 *     reaped): its count stays, and later writes of that file, and of files that share the
 *     entry, are unclean, until its reclaim (proc.c, at the next attach or an attached
 *     process's periodic reap) ends the writes in flight of every entry it owns, and of every
 *     entry shared by two processes' writes (W_MANY: whose they are is not known; a live
 *     writer's write among them then ends unclean, which keeps nothing: safe); the next write
 *     of the file starts over, foreign (the dead writer's bytes may be under it);
 *   - two files share the key bits and the entry: each other's writes look foreign;
 *   - 255 writes in flight at once, or another file's writes in flight on the entry: the
 *     next is unclean, and moves the entry's gen all the same (moved_anyway), so that a mark
 *     (kvs_cache_write_mark) never reads the entry as quiet across it.
 * Writers not under the shim are not seen here; the identity check (their write moves mtime or
 * ctime) and the expiry of what is published (files.settle) cover them.
 */
#include <errno.h>

#include "internal.h"
#include "sys.h"

#define W_KEY_SHIFT 40
#define W_OWN_SHIFT 28
#define W_FLY_SHIFT 20
#define W_FLY_ONE   (1ull << W_FLY_SHIFT)
#define W_GEN_MASK  0xfffffull
#define W_MANY	    0xfffu
/* Owners are process-table slots + 1, below W_MANY: cache.max_processes is at most 1024. */

static uint32_t w_key(uint64_t w)
{
	return (uint32_t)(w >> W_KEY_SHIFT);
}

static uint32_t w_own(uint64_t w)
{
	return (uint32_t)(w >> W_OWN_SHIFT) & 0xfff;
}

static uint32_t w_fly(uint64_t w)
{
	return (uint32_t)(w >> W_FLY_SHIFT) & 0xff;
}

static uint32_t w_gen(uint64_t w)
{
	return (uint32_t)(w & W_GEN_MASK);
}

static uint64_t w_make(uint32_t key, uint32_t own, uint32_t fly, uint32_t gen)
{
	return (uint64_t)key << W_KEY_SHIFT | (uint64_t)own << W_OWN_SHIFT |
	       (uint64_t)fly << W_FLY_SHIFT | (gen & W_GEN_MASK);
}

/* A begin that cannot take the entry (another file's writes in flight on it, or 255 of this
 * file's) still moves its gen, once, so that no mark taken before it (kvs_cache_write_mark)
 * and no writer's last end reads the entry as quiet: the file's write is unseen otherwise. */
static void moved_anyway(_Atomic uint64_t *e, uint64_t w)
{
	uint64_t nw = w_make(w_key(w), w_own(w), w_fly(w), w_gen(w) + 1);

	cas_acq_rel(e, &w, nw); /* one try: a failed CAS means someone else moved it */
}

void kvs_cache_write_begin(struct kvs_cache *c, uint64_t dev, uint64_t ino, struct kvs_wtok *t)
{
	uint64_t h = kvs_hash_file(dev, ino);

	*t = (struct kvs_wtok){.entry = (uint32_t)(h & (c->nseen - 1)),
			       .key = (uint32_t)(h >> W_KEY_SHIFT) | 1u,
			       .foreign = true};
	if (c->self < 0 || !c->nseen)
		return; /* not held, not clean */
	uint32_t me = (uint32_t)c->self + 1;
	_Atomic uint64_t *e = &c->wseq[t->entry];
	for (int tries = 0; tries < 1000; tries++) {
		uint64_t w = load_acquire(e), nw; /* pairs with the CAS of other writers */
		uint32_t own, fly = w_fly(w);
		bool foreign;

		if (w_key(w) == t->key) {
			if (fly == 0xff) {
				moved_anyway(e, w);
				return;
			}
			if (w_own(w) == me) {
				own = me;
				foreign = false;
			} else if (fly == 0) {
				own = me; /* another's writes are over: ours from now on */
				foreign = true;
			} else {
				own = W_MANY; /* another process's write is in flight */
				foreign = true;
			}
			nw = w_make(t->key, own, fly + 1, w_gen(w) + 1);
		} else if (fly == 0) {
			/* Empty, or another file's with nothing in flight: ours now, history lost.
			 */
			own = me;
			foreign = true;
			nw = w_make(t->key, me, 1,
				    (uint32_t)(kvs_mono_ns() * 0x9e3779b97f4a7c15ULL >> 40));
		} else {
			moved_anyway(e,
				     w); /* another file's write is in flight here: cannot tell */
			return;
		}
		if (cas_acq_rel(e, &w, nw)) {
			t->held = true;
			t->clean = own == me;
			t->foreign = foreign;
			return;
		}
	}
}

bool kvs_cache_write_end(struct kvs_cache *c, struct kvs_wtok *t)
{
	if (!t->held)
		return false;
	uint32_t me = (uint32_t)c->self + 1;
	_Atomic uint64_t *e = &c->wseq[t->entry];
	uint64_t w = load_acquire(e);

	t->held = false;
	for (;;) {
		if (w_key(w) != t->key || w_fly(w) == 0) {
			t->clean = false; /* corrupt: the entry cannot be ours any more */
			return false;
		}
		bool clean = t->clean && w_own(w) == me;
		if (cas_acq_rel(e, &w, w - W_FLY_ONE)) {
			t->clean = clean;
			t->gen = w_gen(w);
			return clean;
		}
	}
}

bool kvs_cache_write_last(struct kvs_cache *c, const struct kvs_wtok *t)
{
	if (!t->clean || t->held || c->self < 0)
		return false;
	uint64_t w = load_acquire(&c->wseq[t->entry]); /* pairs with the writers' CAS */

	return w_key(w) == t->key && w_own(w) == (uint32_t)c->self + 1 && w_fly(w) == 0 &&
	       w_gen(w) == t->gen;
}

/* A mark is the entry's whole word, taken only while nothing is in flight on the entry (a
 * begin that could not take the entry for its file leaves the file's write unrecorded but the
 * entry's other write in flight): every begin moves gen or takes the entry over, and every
 * end moves "in flight", so an unchanged word means no write of the file began or ended
 * between the two looks (another file's write on a shared entry changes it too: a false
 * alarm, never a write missed).  What the repair of a dead process ends early (an entry two
 * processes wrote at once, W_MANY) a mark may then miss: a live writer's write of such a file
 * that races a load is not seen by that load's publication. */
bool kvs_cache_write_mark(struct kvs_cache *c, uint64_t dev, uint64_t ino, uint64_t *mark)
{
	uint64_t h = kvs_hash_file(dev, ino);

	if (!c->nseen)
		return false;
	uint64_t w = load_acquire(&c->wseq[h & (c->nseen - 1)]); /* pairs with the writers' CAS */

	if (w_fly(w) != 0)
		return false; /* a write of the file, or of one sharing its entry, is in flight */
	*mark = w;
	return true;
}

bool kvs_cache_write_quiet(struct kvs_cache *c, uint64_t dev, uint64_t ino, uint64_t mark)
{
	uint64_t h = kvs_hash_file(dev, ino);

	if (!c->nseen)
		return false;
	return load_acquire(&c->wseq[h & (c->nseen - 1)]) == mark; /* pairs with the writers' CAS */
}

void kvs_wseq_repair(struct kvs_cache *c, uint32_t p)
{
	for (uint32_t i = 0; i < c->nseen; i++) {
		_Atomic uint64_t *e = &c->wseq[i];
		uint64_t w = load_acquire(e); /* pairs with the writers' CAS */

		while (w_fly(w) && (w_own(w) == p + 1 || w_own(w) == W_MANY)) {
			/* The owner stays the dead one: nobody's publication matches it; gen moves.
			 */
			uint64_t nw = w_make(w_key(w), w_own(w), 0, w_gen(w) + 1);

			if (cas_acq_rel(e, &w, nw))
				break;
		}
	}
}
