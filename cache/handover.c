/*
 * handover: see handover.h.
 *
 * THE CONTRACT, version 1: what a release reads of a region an older release built.  Every
 * field little-endian, at these byte offsets of the region file:
 *
 *   header   magic u64 @0 (KVS_MAGIC), version u32 @8, total_bytes u64 @16 (the file's size),
 *            shard_size u64 @32, nslots u32 @40 (data frames), off_slots u64 @96,
 *            off_data u64 @112, per_frame u32 @1032 (slot records per frame), keys_only u32
 *            @1052 (nonzero: no data, nothing to hand over)
 *   records  nslots * per_frame slot records of 128 bytes from off_slots (64-byte aligned);
 *            record r belongs to frame r / per_frame.  In a record: the state word u32 @0 (low
 *            byte 3: READY; bits 8-30 zero when READY; bit 31 a waiters flag), bucket u32 @68
 *            (0xffffffff or bit 31 set: unhashed, or invalidated while pinned: not kept, so
 *            never copied), length u32 @84 (valid bytes),
 *            key u64[3] @88 (block_lo, block_hi, shard, as cache/key.c makes them), at u32
 *            @112 and room u32 @116 (the bytes lie from 4 KiB page `at` of the frame, `room`
 *            pages), expires u64 @120 (the node's clock, kvs_node_ns, after which the bytes are
 *            not served; 0: for good)
 *   data     frame f's bytes at off_data (4 KiB aligned) + f * shard_size; a key's shard is
 *            shard_size bytes of its file, so nothing is copied between regions whose shard
 *            sizes differ
 *   writers  a READY record's length, key, at, room and bytes are written before its state
 *            becomes READY (release); they change only after it leaves READY
 *
 * The layout versions that follow it are contracts[] below: from 7 (the first release with
 * the hand-over) to this build's.  The _Static_asserts tie the offsets to this build's layout,
 * so a change of layout.h that moves one of them fails to compile until whoever makes it ends
 * the row at the last version that had it and writes the next contract.  A change of what a key
 * means (cache/key.c) is a new contract too.
 *
 * THE COPY.  The old region is mapped read-only and never written; its processes go on loading,
 * evicting and reusing its frames meanwhile, so nothing read of it is trusted until checked
 * again.  For each READY record: its fields read after an acquire load of the state, its bytes
 * copied into a slot of the new region this process owns (kvs_cache_pin_load), then the state
 * word, key, length and place read again and the copy compared with the old bytes: only when all
 * still agree is the new slot published READY (with the old expiry), else it is failed (the next
 * pinner loads it from storage).  A frame the old region reused for another key meanwhile fails
 * the key check; one reused and loaded again with the same key holds the same bytes.  No lock
 * of the old region is taken: an old process's death or a stuck lock there cannot stop the copy.
 *
 * It stops where the new region would evict (its capacity: a counter of this process's
 * evictions moved), where its memory gives out (the pin fails: cache.shm_headroom, the file
 * system), or at the end.  The new region is not published yet: no other process waits on its
 * slots, and only the order of the old records decides what is kept when it is smaller.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "handover.h"
#include "internal.h"
#include "raw.h"

#define HDR_MAGIC      0u
#define HDR_VERSION    8u
#define HDR_TOTAL      16u
#define HDR_SHARD_SIZE 32u
#define HDR_NSLOTS     40u
#define HDR_OFF_SLOTS  96u
#define HDR_OFF_DATA   112u
#define HDR_PER_FRAME  1032u
#define HDR_KEYS_ONLY  1052u
#define HDR_READ       1088u /* the header bytes the contract needs */

#define REC_BYTES  128u
#define REC_STATE  0u
#define REC_BUCKET 68u
#define REC_LENGTH 84u
#define REC_KEY	   88u
#define REC_AT	   112u
#define REC_ROOM   116u
#define REC_EXPIRE 120u
#define REC_READY  3u

_Static_assert(offsetof(struct kvs_hdr, magic) == HDR_MAGIC, "contract 1: magic");
_Static_assert(offsetof(struct kvs_hdr, version) == HDR_VERSION, "contract 1: version");
_Static_assert(offsetof(struct kvs_hdr, total_bytes) == HDR_TOTAL, "contract 1: total_bytes");
_Static_assert(offsetof(struct kvs_hdr, shard_size) == HDR_SHARD_SIZE, "contract 1: shard_size");
_Static_assert(offsetof(struct kvs_hdr, nslots) == HDR_NSLOTS, "contract 1: nslots");
_Static_assert(offsetof(struct kvs_hdr, off_slots) == HDR_OFF_SLOTS, "contract 1: off_slots");
_Static_assert(offsetof(struct kvs_hdr, off_data) == HDR_OFF_DATA, "contract 1: off_data");
_Static_assert(offsetof(struct kvs_hdr, per_frame) == HDR_PER_FRAME, "contract 1: per_frame");
_Static_assert(offsetof(struct kvs_hdr, keys_only) == HDR_KEYS_ONLY, "contract 1: keys_only");
_Static_assert(sizeof(struct kvs_hdr) >= HDR_READ, "contract 1: the header it reads");
_Static_assert(sizeof(struct kvs_slot) == REC_BYTES, "contract 1: record size");
_Static_assert(offsetof(struct kvs_slot, state) == REC_STATE, "contract 1: state");
_Static_assert(offsetof(struct kvs_slot, bucket) == REC_BUCKET, "contract 1: bucket");
_Static_assert(KVS_NIL == 0xffffffffu && KVS_ORPHAN == 0x80000000u, "contract 1: unhashed");
_Static_assert(offsetof(struct kvs_slot, length) == REC_LENGTH, "contract 1: length");
_Static_assert(offsetof(struct kvs_slot, key) == REC_KEY, "contract 1: key");
_Static_assert(offsetof(struct kvs_slot, at) == REC_AT, "contract 1: at");
_Static_assert(offsetof(struct kvs_slot, room) == REC_ROOM, "contract 1: room");
_Static_assert(offsetof(struct kvs_slot, expires) == REC_EXPIRE, "contract 1: expires");
_Static_assert(KVS_SLOT_READY == REC_READY, "contract 1: READY");
_Static_assert(KVS_ST_MASK == 0xffu && KVS_ST_WAITERS == 0x80000000u, "contract 1: the word");
_Static_assert(KVS_PAGE == 4096u, "contract 1: pages of 4 KiB");

/* The layout versions [from, to] that follow contract 1.  When a field above moves, the row
 * ends at the last version that had it (a number, not KVS_LAYOUT_VERSION). */
static const struct {
	uint32_t from, to;
} contracts[] = {
    {7, KVS_LAYOUT_VERSION},
};

/* The contract's dimensions of an old region, read from its header. */
struct old {
	uint64_t total, shard_size, off_slots, off_data;
	uint32_t nslots, per_frame, keys_only, version;
};

static uint64_t u64_at(const unsigned char *p, size_t off)
{
	uint64_t v;

	memcpy(&v, p + off, sizeof(v));
	return v;
}

static uint32_t u32_at(const unsigned char *p, size_t off)
{
	uint32_t v;

	memcpy(&v, p + off, sizeof(v));
	return v;
}

static bool known(uint32_t version)
{
	for (size_t i = 0; i < sizeof(contracts) / sizeof(contracts[0]); i++)
		if (version >= contracts[i].from && version <= contracts[i].to)
			return true;
	return false;
}

/* Read and check the old header: 0, or -EPROTO (not a region this build may read). */
static int read_old(int fd, struct old *o)
{
	unsigned char h[HDR_READ];
	struct stat st;

	if (fstat(fd, &st) < 0 || kvs_sys_pread(fd, h, sizeof(h), 0) != (ssize_t)sizeof(h) ||
	    u64_at(h, HDR_MAGIC) != KVS_MAGIC)
		return -EPROTO;
	o->version = u32_at(h, HDR_VERSION);
	if (o->version >= KVS_LAYOUT_VERSION || !known(o->version))
		return -EPROTO; /* a newer release's, or one whose contract is not known */
	o->total = u64_at(h, HDR_TOTAL);
	o->shard_size = u64_at(h, HDR_SHARD_SIZE);
	o->nslots = u32_at(h, HDR_NSLOTS);
	o->off_slots = u64_at(h, HDR_OFF_SLOTS);
	o->off_data = u64_at(h, HDR_OFF_DATA);
	o->per_frame = u32_at(h, HDR_PER_FRAME);
	o->keys_only = u32_at(h, HDR_KEYS_ONLY);
	uint64_t nrec = (uint64_t)o->nslots * o->per_frame;
	/* Every offset bounded by the file before anything is mapped past the header. */
	if (o->total != (uint64_t)st.st_size || !o->nslots || !o->per_frame ||
	    o->per_frame > KVS_MAX_PER_FRAME || (o->per_frame & (o->per_frame - 1)) ||
	    !o->shard_size || o->shard_size % KVS_PAGE || o->shard_size > (1ull << 30) ||
	    o->off_slots < HDR_READ || o->off_slots > o->total || o->off_slots % 64 ||
	    o->off_data % KVS_PAGE || nrec > (o->total - o->off_slots) / REC_BYTES ||
	    (!o->keys_only &&
	     (o->off_data > o->total || o->nslots > (o->total - o->off_data) / o->shard_size)))
		return -EPROTO;
	return 0;
}

int kvs_handover_source(int fd, struct kvs_handover *h)
{
	struct old o;
	int r = read_old(fd, &o);

	memset(h, 0, sizeof(*h));
	if (r)
		return r;
	h->version = o.version;
	return o.keys_only ? -EPROTO : 0;
}

/* One READY record's fields, as read. */
struct rec {
	uint32_t word, bucket, length, at, room;
	struct kvs_key key;
	uint64_t expires;
};

static void read_rec(const unsigned char *r, struct rec *x)
{
	/* The state first (acquire), then the fields its writer wrote before it. */
	x->word =
	    atomic_load_explicit((const _Atomic uint32_t *)(r + REC_STATE), memory_order_acquire) &
	    ~KVS_ST_WAITERS;
	x->bucket =
	    atomic_load_explicit((const _Atomic uint32_t *)(r + REC_BUCKET), memory_order_relaxed);
	x->length =
	    atomic_load_explicit((const _Atomic uint32_t *)(r + REC_LENGTH), memory_order_relaxed);
	x->key.block_lo =
	    atomic_load_explicit((const _Atomic uint64_t *)(r + REC_KEY), memory_order_relaxed);
	x->key.block_hi =
	    atomic_load_explicit((const _Atomic uint64_t *)(r + REC_KEY + 8), memory_order_relaxed);
	x->key.shard = atomic_load_explicit((const _Atomic uint64_t *)(r + REC_KEY + 16),
					    memory_order_relaxed);
	x->at = atomic_load_explicit((const _Atomic uint32_t *)(r + REC_AT), memory_order_relaxed);
	x->room =
	    atomic_load_explicit((const _Atomic uint32_t *)(r + REC_ROOM), memory_order_relaxed);
	x->expires =
	    atomic_load_explicit((const _Atomic uint64_t *)(r + REC_EXPIRE), memory_order_relaxed);
}

static bool same(const struct rec *a, const struct rec *b)
{
	return a->word == b->word && a->bucket == b->bucket && a->length == b->length &&
	       a->at == b->at && a->room == b->room && a->key.block_lo == b->key.block_lo &&
	       a->key.block_hi == b->key.block_hi && a->key.shard == b->key.shard;
}

/* Copy one READY record's bytes src into the new region: 1 copied, 0 skipped; *why set when
 * the copy must stop here (full, or no memory). */
static int copy_one(struct kvs_cache *c, const unsigned char *rec, const struct rec *x,
		    const unsigned char *src, uint64_t shard_size, const char **why)
{
	uint64_t evicted = kvs_cache_counted(c, KVS_CTR_evictions);
	uint32_t bytes = x->length < shard_size ? x->length : 0;
	struct kvs_pin pin;
	struct rec again;
	int r = kvs_cache_pin_load(c, &x->key, KVS_ALLOC_NORMAL, bytes, x->expires, &pin);

	if (r < 0) {
		*why =
		    r == -ENOSPC || r == -ENOBUFS ? "the region's memory ran out" : "a pin failed";
		return 0;
	}
	if (r != KVS_PIN_OWNER) { /* the key twice in the old region (an orphan): once is enough */
		kvs_cache_release(c, &pin);
		return 0;
	}
	char *dst = kvs_cache_data(c, &pin);
	bool ok = x->length <= kvs_cache_room(c, &pin);
	if (ok) {
		memcpy(dst, src, x->length);
		atomic_thread_fence(memory_order_acquire);
		read_rec(rec, &again);
		ok = same(x, &again) && !memcmp(dst, src, x->length);
		atomic_thread_fence(memory_order_acquire);
		read_rec(rec, &again);
		ok = ok && same(x, &again);
	}
	if (ok)
		kvs_cache_mark_ready(c, &pin, x->length);
	else
		kvs_cache_mark_failed(c, &pin, EAGAIN); /* the next pinner loads it */
	kvs_cache_release(c, &pin);
	if (kvs_cache_counted(c, KVS_CTR_evictions) != evicted)
		*why = "the region is full";
	return ok;
}

int kvs_handover_fill(struct kvs_cache *c, int fd, struct kvs_handover *h)
{
	uint64_t t0 = kvs_mono_ns(), now = kvs_node_ns();
	struct old o;
	int r = read_old(fd, &o);

	if (r)
		return r;
	h->version = o.version;
	if (o.keys_only || c->keys_only) {
		h->stopped = "a region of keys only holds no bytes";
		return 0;
	}
	if (o.shard_size != c->shard_size) {
		h->stopped =
		    "the shard sizes differ (a key's shard is that many bytes of its file)";
		return 0;
	}
	const unsigned char *base = kvs_sys_mmap(NULL, o.total, PROT_READ, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED)
		return -errno;
	uint64_t nrec = (uint64_t)o.nslots * o.per_frame, pages = o.shard_size / KVS_PAGE;
	for (uint64_t i = 0; i < nrec; i++) {
		const unsigned char *rec = base + o.off_slots + i * REC_BYTES;
		struct rec x;

		read_rec(rec, &x);
		if (x.word != REC_READY || x.bucket == KVS_NIL || (x.bucket & KVS_ORPHAN))
			continue; /* not READY, or READY for its pins only: not kept */
		if ((x.expires && x.expires <= now) || !x.length || x.at >= pages ||
		    x.room > pages - x.at || x.length > (uint64_t)x.room * KVS_PAGE) {
			h->skipped++;
			continue;
		}
		const unsigned char *src = base + o.off_data + (i / o.per_frame) * o.shard_size +
					   (uint64_t)x.at * KVS_PAGE;
		if (copy_one(c, rec, &x, src, o.shard_size, &h->stopped)) {
			h->shards++;
			h->bytes += x.length;
		} else if (!h->stopped) {
			h->skipped++;
		}
		if (h->stopped)
			break;
	}
	kvs_cache_count(c, KVS_CTR_handover_bytes, h->bytes);
	kvs_sys_munmap((void *)base, o.total);
	h->took_ns = kvs_mono_ns() - t0;
	return 0;
}
