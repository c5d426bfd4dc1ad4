/*
 * geometry: a region's dimensions (struct dims: every section's offset and count), from a
 * configuration or from a region's header; whether they fit the file system's free space; the
 * check of a mapped region against them.  Private to cache/ (region.c, geometry.c).
 */
#ifndef KVS_CACHE_GEOMETRY_H
#define KVS_CACHE_GEOMETRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal.h"

struct dims {
	uint64_t shard_size, capacity, total, page; /* page: off_data and total are multiples */
	uint32_t nframes, nreserved, nbuckets, nstripes, nprocs, nseen;
	uint32_t per_frame, nslots; /* slot records: per_frame for each frame */
	bool keys_only;		    /* no data: off_data == total */
	uint64_t off_procs, off_tally, off_stripes, off_buckets, off_slots, off_frames, off_access,
	    off_seen;
	uint64_t off_wseq, off_data;
};

/* The region of n slots, on pages of page bytes, that the configuration asks for. */
int kvs_dims_for(const struct kvs_cache_params *cfg, uint64_t n, uint64_t page, struct dims *d);

/* The region the configuration asks for on pages of page bytes; with capacity = auto, one of
 * the smallest size that auto accepts (the real size is set by kvs_region_fit or read from the
 * region). */
int kvs_dims_of(const struct kvs_cache_params *cfg, uint64_t page, struct dims *d);

/* The header of the region file fd, if it has this magic: 0, else -EPROTO. */
int kvs_region_read_header(int fd, struct kvs_hdr *h);

/* The region a file's header describes (a watcher takes the region as it is). */
int kvs_dims_of_file(int fd, struct dims *d);

/* Refuse a region whose identity or dimensions differ from d: 0, or -EPROTO (and others) with
 * one line in msg. */
int kvs_region_check(struct kvs_cache *c, const struct dims *d, size_t file_size, char *msg,
		     size_t msglen);

/* Check that a region of d's size fits in the free space that mem (the file system of dir) has,
 * less cache.shm_headroom, or (cache.capacity = auto) set d to the most slots that fit on pages
 * of d->page.  reclaim: bytes that the build frees (the region it replaces), counted as free.
 * Returns 0, or -ENOSPC with one line in msg. */
int kvs_region_fit(const struct kvs_memory *mem, const char *dir, struct dims *d,
		   const struct kvs_cache_params *cfg, uint64_t reclaim, const char *path,
		   char *msg, size_t msglen);

#endif
