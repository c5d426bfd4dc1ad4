/*
 * publish: what a storage read of a shard may be used for, judged after it, and its
 * publication.  Shared by demand loads (loader.c) and read-ahead (prefetch.c).
 */
#ifndef KVS_PUBLISH_H
#define KVS_PUBLISH_H

#include <stdbool.h>
#include <stdint.h>

#include "cache.h"

enum kvs_verdict {
	KVS_V_KEEP,	  /* the file is still (dev, ino) with the identity block */
	KVS_V_HAND_OUT,	  /* the same file, changed meanwhile: hand out, do not keep */
	KVS_V_WRONG_FILE, /* fd names another file now: the bytes are not block's */
};

/* Judge a storage read through fd, after it: the file must still be (dev, ino), else the bytes
 * are another file's; kept only if its identity is still block. */
enum kvs_verdict kvs_check_file(int fd, uint64_t dev, uint64_t ino, const struct kvs_key *block);

/* Publish a loaded shard of size bytes as verdict v and keep allow (wakes its waiters). */
void kvs_publish_loaded(struct kvs_cache *c, const struct kvs_pin *pin, enum kvs_verdict v,
			bool keep, uint32_t size);

#endif
