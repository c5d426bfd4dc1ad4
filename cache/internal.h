/*
 * internal: the process-local handle of a mapped region and the helpers that cache/'s files
 * share.  Not installed, not used outside cache/ (tests excepted).
 */
#ifndef KVS_CACHE_INTERNAL_H
#define KVS_CACHE_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>

#include "atomics.h"
#include "layout.h"
#include "sys.h"

struct kvs_cache {
	/* The region's descriptor (own.dev, own.ino: its file, set once it is known).  The program
	 * may close its number (kvs_cache_fds_closing): after the open, a call on it that would
	 * act on another file is made only between kvs_ownfd_get and kvs_ownfd_put (base/sys.h). */
	struct kvs_ownfd own;
	int mismatch_fd; /* region.c, inside kvs_cache_open: the last region refused, or -1 */
	bool watch;
	int wait_mode;	   /* enum kvs_wait_mode */
	int eviction;	   /* enum kvs_eviction */
	int populate;	   /* enum kvs_populate: this process's cache.populate */
	uint32_t mode;	   /* cache.mode: no permission bit beyond it is trusted */
	uint64_t headroom; /* cache.shm_headroom: free bytes of /dev/shm never allocated */
	_Atomic uint64_t room_retry_ns; /* no lazy page allocation before (kvs_mono_ns) */
	void *base;
	size_t map_len;
	struct kvs_hdr *hdr;
	char *procs;		 /* nprocs records of proc_stride bytes */
	struct kvs_tally *tally; /* KVS_TALLY_PODS + KVS_TALLY_ROOTS entries (tally.c) */
	uint32_t pod;		 /* this process's pod entry, KVS_NIL for none (a watcher) */
	bool keys_only;		 /* hdr.keys_only: no data section, no page is ever allocated */
	struct kvs_stripe *stripes;
	_Atomic uint32_t *buckets;
	struct kvs_slot *slots;
	_Atomic uint32_t *fpages; /* nframes words: KVS_PAGES_* of each frame */
	_Atomic uint8_t *access;  /* nframes CLOCK bytes */
	struct kvs_seen *seen;	  /* nseen entries (seen.c) */
	_Atomic uint64_t *wseq;	  /* nseen write-sequence words (stage.c) */
	uint32_t nseen;
	char *data;
	/* nslots: slot records, the bound of every slot index (pins, chains); nframes: data
	 * frames (hdr.nslots), nmain of them outside the reserve; per_frame = 1 << frame_shift
	 * records per frame; frame_pages: pages per frame (shard_size / KVS_PAGE). */
	uint32_t nslots, nframes, nmain, nbuckets, nstripes, nprocs;
	uint32_t per_frame, frame_shift, frame_pages;
	uint32_t ahead_window; /* cache.populate = ahead: slots the walk keeps past the hand */
	uint64_t shard_size;
	int self; /* process-table slot, -1 for a watcher */
	struct kvs_proc *me;
	pthread_mutex_t reclaim_mu; /* one reclaim at a time in this process (OFD locks are ours) */
	/* maplock.c: this process's holds of each file byte, changed under maplock_mu, read
	 * without it by kvs_cache_map_busy. */
	pthread_mutex_t maplock_mu;
	_Atomic uint16_t maplock_n[KVS_MAPLOCK_BYTES];
	_Atomic uint32_t pin_hint;
	/* stage.c: the frame this process's last repack gave back (KVS_NIL: none), which its
	 * next stage takes first if still FREE, so that a writer of small files reuses one
	 * frame instead of sweeping the hand over the cache's contents. */
	_Atomic uint32_t stage_spare;
	_Atomic uint64_t last_reap_ns; /* kvs_cache_reap_maybe's rate limit */
	_Atomic uint32_t euclean_seen; /* set by euclean(), taken by kvs_cache_take_euclean */
	/* lock.c: the longest wait for a stripe or proc_lock (0: KVS_LOCK_TIMEOUT_WATCH_NS), and
	 * the lock word each stripe, and proc_lock, was last found stuck with (0: none). */
	uint64_t lock_timeout_ns;
	_Atomic uint32_t stuck[KVS_MAX_STRIPES];
	_Atomic uint32_t stuck_proc;
	_Atomic uint32_t stuck_pack;
	/* slot.c: entries of this process's pin table whose release could not take its stripe;
	 * retried at the next release and by kvs_cache_reap_maybe.  Set and cleared by atomic
	 * or/and, so one thread at a time owns a bit's retry. */
	_Atomic uint64_t deferred[KVS_PINS_PER_PROC / 64];
	/* The region's memory, from its header (pages.c): enum kvs_page_kind, the page size
	 * (4096 for a region built before it was recorded), enum kvs_numa. */
	uint32_t page_kind;
	uint64_t page_size;
	uint32_t numa;
	char path[512]; /* KVS_CACHE_DIR_MAX of directory and a file name of NAME_MAX */
	/* region.c: what kvs_cache_open says once on success (a fallback the configuration
	 * did not ask for), or "". */
	char note[512];
	/* pages.c: the thread that maps the region's existing pages at attach (cache.prefault),
	 * joined by kvs_cache_close before the mapping goes; prefault_stop (set by close, read
	 * by the thread) ends it early. */
	pthread_t prefault_th;
	bool prefault_started;
	_Atomic bool prefault_stop;
};

/* Return -EUCLEAN, remembering that this process met a stuck lock or corrupt shared state, so
 * that the shim can say so once (kvs_cache_take_euclean). */
static inline int euclean(struct kvs_cache *c)
{
	store_relaxed(&c->euclean_seen, 1);
	return -EUCLEAN;
}

static inline struct kvs_proc *proc_at(struct kvs_cache *c, uint32_t i)
{
	return (struct kvs_proc *)(c->procs + (size_t)i * sizeof(struct kvs_proc));
}

/* The frame of slot i, and the first slot of frame f. */
static inline uint32_t frame_of(const struct kvs_cache *c, uint32_t i)
{
	return i >> c->frame_shift;
}

static inline uint32_t frame_first(const struct kvs_cache *c, uint32_t f)
{
	return f << c->frame_shift;
}

/* Slot i's bytes (its frame's, from page at); at is checked against the frame on read. */
static inline char *slot_bytes(const struct kvs_cache *c, uint32_t i)
{
	uint32_t at = atomic_load_explicit(&c->slots[i].at, memory_order_relaxed);

	if (at >= c->frame_pages)
		at = 0; /* corrupt: stay inside the frame */
	return c->data + (size_t)frame_of(c, i) * c->shard_size + (size_t)at * KVS_PAGE;
}

/* The bytes slot i may hold: its room, never past its frame's end. */
static inline uint64_t slot_room(const struct kvs_cache *c, uint32_t i)
{
	uint32_t at = atomic_load_explicit(&c->slots[i].at, memory_order_relaxed);
	uint32_t room = atomic_load_explicit(&c->slots[i].room, memory_order_relaxed);

	if (at >= c->frame_pages)
		return 0;
	if (room > c->frame_pages - at)
		room = c->frame_pages - at;
	return (uint64_t)room * KVS_PAGE;
}

static inline uint32_t st_of(uint32_t word)
{
	return word & KVS_ST_MASK;
}

static inline bool key_eq(const struct kvs_slot *s, const struct kvs_key *k)
{
	return s->key[0] == k->block_lo && s->key[1] == k->block_hi && s->key[2] == k->shard;
}

/* bucket of a key: a splitmix64 finaliser over the block id and the shard. */
static inline uint32_t key_bucket(const struct kvs_cache *c, const struct kvs_key *k)
{
	uint64_t x = k->block_lo ^ (k->block_hi * 0x9e3779b97f4a7c15ULL) ^
		     (k->shard * 0xbf58476d1ce4e5b9ULL);
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return (uint32_t)x & (c->nbuckets - 1);
}

static inline uint32_t bucket_stripe(const struct kvs_cache *c, uint32_t bucket)
{
	return bucket & (c->nstripes - 1);
}

/* lock.c: 0 or -EUCLEAN (stuck, see lock.c, or not recoverable); a stripe is repaired on
 * EOWNERDEAD before it is returned locked. */
#define KVS_LOCK_TIMEOUT_WATCH_NS 2000000000ull /* a watcher's wait for a lock */
int kvs_stripe_lock(struct kvs_cache *c, uint32_t stripe);
void kvs_stripe_unlock(struct kvs_cache *c, uint32_t stripe);
int kvs_proc_lock(struct kvs_cache *c);
void kvs_proc_unlock(struct kvs_cache *c);
/* The pack lock: repaired on EOWNERDEAD with kvs_pack_repair (the open frame is sealed). */
int kvs_pack_lock(struct kvs_cache *c);
void kvs_pack_unlock(struct kvs_cache *c);
int kvs_mutex_init_shared(pthread_mutex_t *mu);

/* populate.c: allocate the pages of a region being built, before writing it (0 or -errno);
 * whether a FREE slot without pages may get them now (false for a while after free space was
 * found at the headroom: the allocator evicts instead, and no system call is made);
 * make sure a claimed slot's pages exist (0, or a positive errno: do not use the slot now;
 * ENOSPC, at the headroom or from the file system, leaves it free for a later claim);
 * start a background walk that allocates slots ahead of the allocators (cache.populate =
 * eager or ahead; one walk per region at a time), stopping at the headroom;
 * after claiming FREE slot i, wake an ahead walk that is less than half its window past i;
 * that window, in slots, for a geometry;
 * allocate [off, off + len) of the file, by fallocate or (by_fault) by faults in the mapping
 * base (0 or a positive errno, never SIGBUS; fd -1: by faults, or ENOSPC where they cannot);
 * whether the file system of fd has len bytes free above headroom (true if it cannot tell);
 * the word `kvshim stat` prints for why a walk stopped ("" if it did not). */
int kvs_populate_control(int fd, char *base, uint64_t control_len);
/* The walk's descriptor, if it is among lo to hi: moved above hi (kvs_cache_fds_closing). */
void kvs_populate_fds_closing(unsigned int lo, unsigned int hi);
bool kvs_populate_fds_in(unsigned int lo, unsigned int hi);
bool kvs_populate_may_grow(struct kvs_cache *c);
int kvs_populate_claimed(struct kvs_cache *c, uint32_t slot);
void kvs_populate_start(struct kvs_cache *c);
void kvs_populate_note_claim(struct kvs_cache *c, uint32_t slot);
uint32_t kvs_populate_window(uint64_t shard_size, uint32_t nmain);
int kvs_populate_range(int fd, char *base, uint64_t off, uint64_t len, bool by_fault);
bool kvs_populate_has_room(int fd, uint64_t len, uint64_t headroom);
const char *kvs_populate_reason(uint32_t why, int32_t err);
/* Tests only: fallocate answers EOPNOTSUPP, as on a file system without it (populate with
 * MADV_POPULATE_WRITE). */
extern bool kvs_populate_test_no_fallocate;
/* Tests only: a prepare thread that faults a chunk in outside the walk's lock first sleeps this
 * long, so that the others decide while its pages are not counted by the file system yet. */
extern unsigned kvs_prepare_test_fault_ms;

/* pages.c: what the file system of dirfd gives a region built under huge_pages (enum
 * kvs_huge_pages), 0 or -errno; free bytes of the file system of fd for the pages of a region
 * of kind (the pool's, not reserved, for hugetlbfs); bind [addr, addr + len) to the policy
 * numa (enum kvs_numa; *nodes: the memory nodes this process may use, or -errno), 0 or -errno;
 * the hints a mapping [base, base + len) of c's region needs before its pages are touched
 * (MADV_HUGEPAGE for advise, the region's policy for hugetlbfs), best effort. */
int kvs_memory_probe(int dirfd, int huge_pages, struct kvs_memory *m);
uint64_t kvs_memory_free(int fd, uint32_t kind);
int kvs_memory_place(void *addr, size_t len, uint32_t numa, int *nodes);
void kvs_memory_map_hints(struct kvs_cache *c, char *base, size_t len);
/* pages.c: start mapping the frames that have their pages into this process's page tables
 * (cache.prefault), on a thread of its own; stop and join it (before the mapping goes). */
void kvs_memory_prefault_start(struct kvs_cache *c);
void kvs_memory_prefault_stop(struct kvs_cache *c);

/* Whether the region's pages are allocated by faults in a mapping (advise, hugetlbfs) rather
 * than by fallocate (pages.c). */
static inline bool kvs_pages_by_fault(const struct kvs_cache *c)
{
	return c->page_kind == KVS_PAGE_ADVISE || c->page_kind == KVS_PAGE_HUGETLBFS;
}

/* shmfile.c, tests only: behave as a file system without O_TMPFILE (publish under a random
 * name instead). */
extern bool kvs_region_test_no_tmpfile;
/* region.c, tests only: a creator sleeps this long (ms) before it publishes what it built. */
extern unsigned kvs_region_test_publish_ms;

/* evict.c: a slot for bytes of `pages` pages (0 or frame_pages and more: a whole frame), in
 * state CLAIMED by this process with at and room set; packed (pack.c) when smaller than a
 * frame; or -ENOSPC / -EUCLEAN.
 * A whole frame for this process: every slot of frame *frame CLAIMED by it, at and room
 * unset; then kvs_evict_keep_first keeps its first slot (room: pages, from the frame's start)
 * and frees the others.
 * kvs_evict_free_frame gives every slot of a frame so taken back.  kvs_evict_take_free takes
 * frame f of the main share that way if it is all FREE and has its pages (0), else -EAGAIN. */
int kvs_evict_claim(struct kvs_cache *c, enum kvs_alloc_class cls, uint32_t pages, uint32_t *slot);
int kvs_evict_frame(struct kvs_cache *c, enum kvs_alloc_class cls, uint32_t *frame);
uint32_t kvs_evict_keep_first(struct kvs_cache *c, uint32_t frame, uint32_t pages);
void kvs_evict_free_frame(struct kvs_cache *c, uint32_t frame);
int kvs_evict_take_free(struct kvs_cache *c, uint32_t frame);

/* pack.c: a slot of `pages` pages (fewer than a frame) from the open frame, or from a frame
 * evicted for it, CLAIMED by this process with at and room set; or -ENOSPC / -EUCLEAN.
 * kvs_pack_repair: the open frame after its lock's holder died (caller holds it), or once
 * the lock is ENOTRECOVERABLE (nobody holds it): sealed, every record of it still
 * CLAIMED-by-pack FREE. */
int kvs_pack_claim(struct kvs_cache *c, enum kvs_alloc_class cls, uint32_t pages, uint32_t *slot);
void kvs_pack_repair(struct kvs_cache *c);
/* pack.c: close the open frame (its uncut records FREE), so the sweep may take it: when no
 * frame could be had.  Whether there was one. */
bool kvs_pack_seal(struct kvs_cache *c);

/* wait.c */
void kvs_wake_all(_Atomic uint32_t *word);

/* tally.c: a region's tallies as built (the two "other" entries named); this process's pod
 * entry, joined (or recycled, or "other") for the PID namespace pidns; caller holds
 * proc_lock, and stores the answer in its process entry. */
void kvs_tally_build(struct kvs_cache *c);
uint32_t kvs_tally_join_pod_locked(struct kvs_cache *c, uint64_t pidns);

/* proc.c */
int kvs_proc_attach(struct kvs_cache *c);
void kvs_proc_detach(struct kvs_cache *c);
bool kvs_proc_alive(struct kvs_cache *c, uint32_t p);
int kvs_proc_reclaim(struct kvs_cache *c, uint32_t p);

#define KVS_REAP_PERIOD_NS 250000000ull /* kvs_cache_reap_maybe's period */

/* slot.c: fail a LOADING slot owned by dead process p; caller holds the slot's stripe. */
void kvs_slot_fail_locked(struct kvs_cache *c, uint32_t slot, int err);
/* slot.c: return dead process p's pins, failing its loads; caller holds p's liveness byte.
 * Returns how many pins are left because their stripe could not be locked (retry later). */
uint32_t kvs_slot_unpin_all(struct kvs_cache *c, uint32_t p);
/* slot.c: free a slot left CLAIMED by dead process p.  0, or -EUCLEAN when its stripe could
 * not be locked (the claim stays; retry later). */
int kvs_slot_free_claim(struct kvs_cache *c, uint32_t slot, uint32_t p);
/* slot.c: the pinned slot is LOADING for owner, which is no live attached process: unless it
 * changed meanwhile, publish FAILED with EOWNERDEAD under its stripe (waking its waiters).
 * Returns 1 if it did, 0 if the slot had moved on, or -EUCLEAN. */
int kvs_slot_take_over(struct kvs_cache *c, uint32_t slot, uint32_t owner);
/* wseq.c: dead process p's writes in flight are over: every write-sequence entry it owns, or
 * shares with another process's writes, is left with none in flight (the reclaim of p). */
void kvs_wseq_repair(struct kvs_cache *c, uint32_t p);
/* slot.c: retry this process's deferred releases (kvs_cache_release could not lock). */
void kvs_slot_retry_deferred(struct kvs_cache *c);
/* slot.c: find key in bucket b; caller holds its stripe.  Returns the slot, KVS_NIL, or
 * -EUCLEAN as a negative int when the chain leaves bounds or loops. */
int64_t kvs_slot_find_locked(struct kvs_cache *c, uint32_t b, const struct kvs_key *key);
/* slot.c: take slot i, just unlinked from bucket b, out of use: free it if unpinned, else leave
 * it an orphan that its last release frees.  Caller holds the stripe. */
void kvs_slot_drop_unlinked_locked(struct kvs_cache *c, uint32_t i, uint32_t b);
/* slot.c: unlink slot from its chain; caller holds the stripe. */
int kvs_slot_unlink_locked(struct kvs_cache *c, uint32_t slot, uint32_t bucket);
/* slot.c: take hashed slot i of bucket b out of use (unlinked, then freed if unpinned, else an
 * orphan its last release frees); caller holds the stripe.  0 or -EUCLEAN. */
int kvs_slot_drop_locked(struct kvs_cache *c, uint32_t i, uint32_t b);
/* slot.c: find key in bucket b, an expired slot dropped (KVS_NIL then), or -EUCLEAN; hash
 * claimed slot v under key in bucket b, LOADING, unowned and unpinned.  Caller holds the
 * stripe of b. */
int64_t kvs_slot_find_fresh_locked(struct kvs_cache *c, uint32_t b, const struct kvs_key *key);
/* slot.c: lock the stripe of key's bucket (*b, *stripe) and find key there as
 * kvs_slot_find_fresh_locked does: the slot or KVS_NIL with the stripe held, or -errno with
 * nothing held. */
int64_t kvs_slot_lock_find(struct kvs_cache *c, const struct kvs_key *key, uint32_t *b,
			   uint32_t *stripe);
void kvs_slot_insert_locked(struct kvs_cache *c, uint32_t v, uint32_t b, const struct kvs_key *key);

/* slot.c, tests only: called by the publisher right after the exchange that makes state
 * (READY or FAILED) visible, before any wake: what the slot holds then is what a waiter that
 * wakes at that instant reads (length, err), so a field stored after the publish shows. */
extern void (*kvs_slot_test_published)(const struct kvs_slot *s, uint32_t state);

/* Test hook: take and keep the stripe lock of key (for crash tests). */
int kvs_cache_test_lock_key(struct kvs_cache *c, const struct kvs_key *key);

#endif
