/*
 * handover: an upgrade of kvshim keeps the warm cache.  A process whose layout version is newer
 * than the region it finds builds its own region, fills it from the old one's READY shards
 * without reading storage, and only then gives it the name (region.c, "Upgrades"); processes of
 * the old release keep the old file, now nameless, until the last of them is gone.
 *
 * What is read of the old region is the hand-over contract, written down below (handover.c) and
 * changed only with its own number: where the header's few dimensions are, where the slot
 * records are and which of their fields say READY, the key and where the bytes lie, and what a
 * key means (cache/key.c).  A region of a layout version whose contract this build does not
 * know (a newer release's, or one from before the contract) is never mapped past its header.
 * The old region is mapped read-only and never written: its processes cannot be harmed.
 */
#ifndef KVS_CACHE_HANDOVER_H
#define KVS_CACHE_HANDOVER_H

#include <stddef.h>
#include <stdint.h>

struct kvs_cache;

/* What the hand-over found in the old region and did. */
struct kvs_handover {
	uint32_t version;	/* the old region's layout version */
	uint64_t shards, bytes; /* READY shards copied, and their bytes */
	uint64_t skipped;	/* READY shards not copied: changed during the copy, or expired */
	uint64_t took_ns;
	const char *stopped; /* NULL, or why it stopped before the end ("the region is full") */
};

/* Is the region file fd one this build may hand over from: of an older layout version whose
 * contract it knows, its header sane for that contract?  0 with h->version set, or -EPROTO. */
int kvs_handover_source(int fd, struct kvs_handover *h);

/* Fill c (a region just built, not yet published, this process attached to it) from the old
 * region fd: every READY shard that is not expired, until c would evict or its memory runs
 * out.  Returns 0 (with h filled) or -errno when the old region cannot be mapped. */
int kvs_handover_fill(struct kvs_cache *c, int fd, struct kvs_handover *h);

#endif
