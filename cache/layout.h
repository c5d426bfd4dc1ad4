/*
 * layout: the shared region's format, private to cache/.  The protocol over these fields is
 * the essay at the top of region.c.  Changing anything here changes KVS_LAYOUT_VERSION.
 *
 *   [ header | process table | tallies | stripe mutexes | bucket heads | slot metadata |
 *     frame pages | access bytes | identities seen | write sequences | page-aligned data frames ]
 *
 * The data is hdr.nslots frames of shard_size bytes.  A frame holds the bytes of one
 * slot (a whole shard) or of several (small files and files' tails, packed: pack.c); each
 * frame owns per_frame consecutive slot records, frame f the records [f * per_frame,
 * (f + 1) * per_frame), and a slot's bytes lie in its own frame.
 *
 * A region of keys only (hdr.keys_only: shim.mode = observe) has every section but the data:
 * off_data is the end of the control plane and total_bytes the control plane's pages, every
 * frame's pages are KVS_PAGES_OK from its build (no page is ever allocated for it), and no
 * slot's bytes are ever read or written.  Its keys, states, lengths and expiries live as in
 * any region, so eviction, packing and expiry behave as they would with the data.
 */
#ifndef KVS_LAYOUT_H
#define KVS_LAYOUT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "cache.h"

/* KVS_LAYOUT_BUMP (cmake -DKVS_LAYOUT_BUMP=ON): a build whose layout version is one more, and
 * nothing else changed: what tests/upgrade_test.sh builds to stand for the next release. */
#ifdef KVS_LAYOUT_BUMP
#define KVS_LAYOUT_BUMPED 1u
#else
#define KVS_LAYOUT_BUMPED 0u
#endif

#define KVS_MAGIC	   0x3130594b4d485356ULL /* "VSHMKY01" little-endian */
#define KVS_LAYOUT_VERSION (7u + KVS_LAYOUT_BUMPED)
#define KVS_CACHELINE	   64u
#define KVS_PAGE	   4096u
#define KVS_NIL		   UINT32_MAX
#define KVS_PINS_PER_PROC  1024u /* power of two */
#define KVS_MAX_STRIPES	   1024u
#define KVS_POPULATE_BYTE  8192u /* OFD lock byte of the populating process (past the table) */
#define KVS_MAPLOCK_BASE   (1ull << 40) /* OFD lock bytes of files mapped writable (maplock.c) */
#define KVS_MAPLOCK_BYTES  4096u
#define KVS_BUILT_BY_MAX   32u	/* bytes of hdr.built_by, NUL-padded (not always terminated) */
#define KVS_CTR_ROOM	   64u	/* counters a process record and the totals have room for */
#define KVS_SEEN_WAYS	   4u	/* entries of the seen table one block id may use */
#define KVS_MAX_PER_FRAME  256u /* slot records of one frame (a power of two) */
#define KVS_TALLY_ROOM	   8u	/* figures a tally has room for (KVS_TALLY_* in cache.h) */
/* The claimer a packed frame's unused slots are CLAIMED by while it is the open frame (no
 * process: the table has at most 4096 entries). */
#define KVS_PACK_OWNER 0x7fffffu

/* Frame pages (one word per frame): a frame's data pages are allocated before any slot of it
 * is first used, so that no process ever touches a page /dev/shm cannot back (which would be
 * a SIGBUS in an engine). */
#define KVS_PAGES_UNKNOWN 0u
#define KVS_PAGES_OK	  1u
#define KVS_PAGES_NOROOM  2u	      /* allocation failed (not ENOSPC): the slot is never used */
#define KVS_ORPHAN	  0x80000000u /* in slot.bucket: unhashed by invalidation, still pinned */

/* The state word: bits 0-7 the state, bits 8-30 the claiming process for CLAIMED, bit 31 set
 * while some process sleeps on the word. */
#define KVS_ST_MASK	     0xffu
#define KVS_ST_WAITERS	     0x80000000u
#define KVS_ST_OWNER_SHIFT   8
#define KVS_ST_CLAIMED_BY(p) ((uint32_t)KVS_SLOT_CLAIMED | ((uint32_t)(p) << KVS_ST_OWNER_SHIFT))

/* hdr.populate_why: why the background walk stopped (with hdr.populate_err). */
#define KVS_POPULATE_WHY_ERROR	  0u /* an allocation failed with populate_err */
#define KVS_POPULATE_WHY_HEADROOM 1u /* free space reached cache.shm_headroom */

enum kvs_proc_state { KVS_PROC_FREE = 0, KVS_PROC_ACTIVE = 1 };

struct kvs_hdr {
	/* Line 0-1: identity, written by the creator before publication, then read-only. */
	uint64_t magic;
	uint32_t version;
	uint32_t hdr_bytes;
	uint64_t total_bytes;
	uint64_t capacity;
	uint64_t shard_size;
	uint32_t nslots;    /* data frames (the "slots" of `kvshim stat`): capacity / shard_size */
	uint32_t nreserved; /* frames [nslots - nreserved, nslots) are the reserve */
	uint32_t nbuckets;
	uint32_t nstripes;
	uint32_t nprocs;
	uint32_t npins;
	uint32_t eviction;
	/* enum kvs_populate: written by the creator, then set by a process that starts the
	 * background walk to its mode (eager wins over ahead; never back to lazy); read for
	 * `kvshim stat`, by allocators (whether to wake an ahead walk) and by the walk itself.
	 * It was padding before, so a region of an older build reads as lazy. */
	_Atomic uint32_t populate_mode;
	uint64_t off_procs, off_stripes, off_buckets, off_slots, off_access, off_data;
	uint64_t created_ns;
	/* Line 2: the CLOCK hand over the main share; fetch-added by allocators, never locked. */
	_Alignas(KVS_CACHELINE) _Atomic uint64_t hand;
	uint8_t pad2[KVS_CACHELINE - 8];
	/* Line 3: the hand over the reserved share. */
	_Atomic uint64_t rhand;
	uint8_t pad3[KVS_CACHELINE - 8];
	/* Line 4: the background population's progress (slots it has walked), the errno that
	 * stopped it and why (KVS_POPULATE_WHY_*); written by the populating process only
	 * (populate.c).  populate_wake: bumped by allocators that want the walk to go on
	 * (cache.populate = ahead), the futex word its thread sleeps on.  populate_why and
	 * populate_wake were padding before: zero means "an error" and "never asked". */
	_Atomic uint32_t populated;
	_Atomic int32_t populate_err;
	_Atomic uint32_t populate_why;
	_Atomic uint32_t populate_wake;
	uint8_t pad5[KVS_CACHELINE - 16];
	/* Line 5: the process-table mutex (robust) and its holder word (lock.c); lines 6-13: the
	 * folded totals it guards. */
	pthread_mutex_t proc_lock;
	_Atomic uint32_t proc_holder;
	uint8_t pad4[KVS_CACHELINE - sizeof(pthread_mutex_t) - 4];
	_Atomic uint64_t totals[KVS_CTR_ROOM];
	/* Line 14: the region's history.  refused_attaches: fetch-added (relaxed) by a process of
	 * this euid whose configuration the region's geometry did not match (region.c), never
	 * locked; read for `kvshim stat` and `kvshim ls` only.  built_by: KVS_VERSION of the
	 * creator, truncated and NUL-padded, written before publication, then read-only.
	 * off_seen, nseen: the seen table (seen.c); off_wseq: the write sequences (stage.c),
	 * nseen words; dimensions like those of lines 0-1. */
	_Alignas(KVS_CACHELINE) _Atomic uint64_t refused_attaches;
	char built_by[KVS_BUILT_BY_MAX];
	uint64_t off_seen;
	uint32_t nseen;
	uint32_t pad12;
	uint64_t off_wseq;
	/* Line 15: the open frame of packed slots (pack.c), guarded by pack_lock (robust, with
	 * its holder word as the others, lock.c): pack_frame (KVS_NIL: none), its next unused
	 * slot record (index within the frame) and its first unused page.  Written under the
	 * lock only; read under it only. */
	_Alignas(KVS_CACHELINE) pthread_mutex_t pack_lock;
	_Atomic uint32_t pack_holder;
	uint32_t pack_frame, pack_next, pack_fill;
	uint8_t pad13[KVS_CACHELINE - sizeof(pthread_mutex_t) - 16];
	/* Line 16: dimensions like those of lines 0-1: the frame pages' offset and the slot
	 * records per frame; the region's memory (pages.c): the kind of its pages (enum
	 * kvs_page_kind), their size (off_data and total_bytes are multiples of it) and the
	 * placement its creator gave them (enum kvs_numa); keys_only: 1 for a region of keys
	 * without data (shim.mode = observe); the tallies' offset (tally.c: KVS_TALLY_PODS pod
	 * entries, then KVS_TALLY_ROOTS root entries). */
	uint64_t off_frames;
	uint32_t per_frame;
	uint32_t page_kind;
	uint64_t page_size;
	uint32_t numa;
	uint32_t keys_only;
	uint64_t off_tally;
	uint8_t pad16[KVS_CACHELINE - 40];
};

struct kvs_proc {
	/* Written under hdr->proc_lock by the attaching, detaching or reclaiming process. */
	_Atomic uint32_t state;
	int32_t pid;	      /* in the process's own PID namespace */
	_Atomic int32_t rank; /* written by the process itself */
	/* Slots the process holds staged for write-through, as it last said (relaxed, by itself,
	 * kvs_cache_stage_count); summed by stagers for the node's bound (stage.c).  It was
	 * padding before: an older build's process counts 0. */
	_Atomic uint32_t staged;
	uint64_t attach_ns;
	uint64_t pidns; /* inode of its /proc/self/ns/pid, 0 if unknown */
	uint32_t pod;	/* its pod's tally (tally.c), KVS_NIL for none: under proc_lock */
	uint8_t pad1[KVS_CACHELINE - 36];
	/* Lines 1-8: added to by the process's own threads (relaxed); folded and zeroed under
	 * proc_lock. */
	_Atomic uint64_t ctr[KVS_CTR_ROOM];
	/* Pin table: slot index + 1, or 0.  An entry changes only under the stripe lock of the
	 * slot it names, so a stripe's pins can be counted while holding that stripe. */
	_Atomic uint32_t pin[KVS_PINS_PER_PROC];
};

struct kvs_stripe {
	pthread_mutex_t mu;	 /* process-shared, robust */
	_Atomic uint32_t holder; /* who is inside mu, by the region's names (lock.c) */
	uint8_t pad[KVS_CACHELINE - sizeof(pthread_mutex_t) - 4];
};

struct kvs_slot {
	/* Line 0: the futex word alone, so waiters spinning on it share the line with nobody. */
	_Atomic uint32_t state;
	uint8_t pad0[KVS_CACHELINE - 4];
	/* Line 1: written under the stripe lock of the slot's bucket, except err and length
	 * (owner, before its release store of the state). */
	_Atomic uint32_t refs;
	_Atomic uint32_t bucket; /* bucket while hashed, else KVS_NIL */
	_Atomic uint32_t next;	 /* chain link */
	_Atomic uint32_t owner;	 /* process slot of the loader while LOADING */
	_Atomic int32_t err;	 /* positive errno of a FAILED load */
	_Atomic uint32_t length; /* valid bytes once READY */
	uint64_t key[3];	 /* block_lo, block_hi, shard */
	/* Where the slot's bytes are: from page `at` of its frame, `room` pages.  Written by
	 * the allocator while the slot is CLAIMED by it (evict.c, pack.c), before the insert
	 * that hashes it; read by holders of a pin, and by the stage's writer. */
	_Atomic uint32_t at;
	_Atomic uint32_t room;
	/* The node's clock (kvs_node_ns) after which a READY slot is not served but loaded again,
	 * or 0 for never (files.settle, files.revalidate): written by the owner before its release
	 * store of READY, with length; read under the stripe lock by pinners, and by waiters after
	 * an acquire load of the state. */
	_Atomic uint64_t expires;
};

/* One entry of the seen table: when this node first loaded a shard of block (lo, hi), in
 * ns of the node's clock (kvs_node_ns).  A seqlock: seq is odd while a writer fills the entry
 * (seen.c). */
struct kvs_seen {
	_Atomic uint32_t seq;
	uint32_t pad;
	_Atomic uint64_t lo, hi, t;
};

/*
 * One tally (tally.c): the figures of one pod (a PID namespace) or one root (a directory of
 * files.roots), added to by every process whose reads they are.  kind, key and name are
 * written under proc_lock while no process uses the entry (its join, its recycling), and read
 * without a lock by `kvshim stat` (a name being rewritten may read torn: figures only); v[]
 * takes relaxed adds from any process, and is folded into the "other" entry under proc_lock
 * when a pod's entry is recycled.
 */
struct kvs_tally {
	_Atomic uint32_t kind; /* KVS_TALLY_FREE, _POD, _ROOT, _OTHER */
	uint32_t pad;
	uint64_t key;	  /* pod: the PID namespace's inode; root: a hash of its path */
	uint64_t last_ns; /* pod: CLOCK_REALTIME of its last join (recycling's order) */
	char name[KVS_TALLY_NAME_MAX];	    /* pod: its host name; root: its path; NUL-padded */
	_Atomic uint64_t v[KVS_TALLY_ROOM]; /* enum kvs_tally_id */
};

_Static_assert(offsetof(struct kvs_hdr, hand) == 128, "hand on line 2");
_Static_assert(offsetof(struct kvs_hdr, rhand) == 192, "rhand on line 3");
_Static_assert(offsetof(struct kvs_hdr, populated) == 256, "populated on line 4");
_Static_assert(offsetof(struct kvs_hdr, proc_lock) == 320, "proc_lock on line 5");
_Static_assert(offsetof(struct kvs_hdr, totals) == 384, "totals on line 6");
_Static_assert(offsetof(struct kvs_hdr, refused_attaches) == 896, "history on line 14");
_Static_assert(offsetof(struct kvs_hdr, built_by) == 904, "built_by after refused_attaches");
_Static_assert(offsetof(struct kvs_hdr, off_seen) == 936, "off_seen after built_by");
_Static_assert(offsetof(struct kvs_hdr, off_wseq) == 952, "off_wseq last on line 14");
_Static_assert(offsetof(struct kvs_hdr, pack_lock) == 960, "pack_lock on line 15");
_Static_assert(offsetof(struct kvs_hdr, off_frames) == 1024, "frames' offset on line 16");
_Static_assert(offsetof(struct kvs_hdr, page_kind) == 1036, "page kind on line 16");
_Static_assert(offsetof(struct kvs_hdr, page_size) == 1040, "page size on line 16");
_Static_assert(offsetof(struct kvs_hdr, numa) == 1048, "placement on line 16");
_Static_assert(offsetof(struct kvs_hdr, keys_only) == 1052, "keys only on line 16");
_Static_assert(offsetof(struct kvs_hdr, off_tally) == 1056, "tallies' offset on line 16");
_Static_assert(sizeof(struct kvs_hdr) == 1088, "header of seventeen lines");
_Static_assert(sizeof(pthread_mutex_t) + 16 <= KVS_CACHELINE, "pack lock and state fit a line");
_Static_assert(sizeof(pthread_mutex_t) + 4 <= KVS_CACHELINE, "mutex and holder fit a line");
_Static_assert(offsetof(struct kvs_proc, ctr) == 64, "counters on line 1");
_Static_assert(offsetof(struct kvs_proc, pod) == 32, "pod in line 0");
_Static_assert(offsetof(struct kvs_proc, pin) == 576, "pins after counters");
_Static_assert(sizeof(struct kvs_proc) == 576 + 4 * KVS_PINS_PER_PROC, "proc size");
_Static_assert(offsetof(struct kvs_tally, name) == 24, "tally name after its key");
_Static_assert(offsetof(struct kvs_tally, v) == 192, "tally figures on their own line");
_Static_assert(sizeof(struct kvs_tally) == 256, "tally size: four lines");
_Static_assert(sizeof(struct kvs_stripe) == KVS_CACHELINE, "stripe size");
_Static_assert(offsetof(struct kvs_slot, refs) == KVS_CACHELINE, "state word alone");
_Static_assert(offsetof(struct kvs_slot, key) == KVS_CACHELINE + 24, "key offset");
_Static_assert(offsetof(struct kvs_slot, expires) == KVS_CACHELINE + 56, "expires on line 1");
_Static_assert(sizeof(struct kvs_slot) == 2 * KVS_CACHELINE, "slot size");
_Static_assert(sizeof(struct kvs_seen) == 32, "seen entry size");
_Static_assert(KVS_NCOUNTERS <= KVS_CTR_ROOM, "counters fit eight lines");
_Static_assert(KVS_NTALLY <= KVS_TALLY_ROOM, "tally figures fit their room");

#endif
