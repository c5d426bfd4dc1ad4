/*
 * key: the block id of a KV file (design.md §3).
 *
 * Every process on the node hashes the same fstat fields of the same file to the same id, and
 * a rewritten file (new size, mtime or ctime) gets a new id, so stale shards are never found.
 */
#include <string.h>
#include <sys/stat.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cache.h"

void kvs_block_id(const struct stat *st, struct kvs_key *out)
{
	uint64_t f[7] = {
	    (uint64_t)st->st_dev,	   (uint64_t)st->st_ino,
	    (uint64_t)st->st_size,	   (uint64_t)st->st_mtim.tv_sec,
	    (uint64_t)st->st_mtim.tv_nsec, (uint64_t)st->st_ctim.tv_sec,
	    (uint64_t)st->st_ctim.tv_nsec,
	};
	XXH128_hash_t h = XXH3_128bits(f, sizeof(f));

	out->block_lo = h.low64;
	out->block_hi = h.high64;
	out->shard = 0;
}
