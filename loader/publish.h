/*
 * publish: what a storage read of a shard may be used for, judged after it, and its
 * publication.  Shared by demand loads (loader.c) and read-ahead (prefetch.c).
 */
#ifndef KVS_PUBLISH_H
#define KVS_PUBLISH_H

#include <stdbool.h>
#include <stdint.h>

#include "cache.h"
#include "loader.h"

enum kvs_verdict {
	KVS_V_KEEP,	  /* the file is still (dev, ino) with the identity block */
	KVS_V_HAND_OUT,	  /* the same file, changed meanwhile: hand out, do not keep */
	KVS_V_WRONG_FILE, /* fd names another file now: the bytes are not block's */
};

/* Judge a storage read through fd, after it: the file must still be (dev, ino), else the bytes
 * are another file's; kept only if its identity (by birth with write_once, else by change) is
 * still block. */
enum kvs_verdict kvs_check_file(int fd, uint64_t dev, uint64_t ino, bool write_once,
				const struct kvs_key *block);

/*
 * Until when may a shard of block, whose file fr describes, be kept if its storage read
 * starts now?  until 0 for good: the file's last change is files.settle old by this node's
 * clock (and, with fr->node_clock, this node has seen the identity that long:
 * kvs_cache_first_seen, which this call records); else the node's clock (kvs_node_ns) now +
 * files.settle.  files.revalidate caps either.  With it, the file's (dev, ino) write mark
 * (kvs_cache_write_mark): a write of the file under the shim in flight on the node now (between
 * its two drops) keeps nothing of this load, nor does one that begins or ends before its
 * publication (kvs_publish_loaded), nor a writable shared mapping of the file held anywhere on
 * the node at its start or at the publication (kvs_cache_map_busy): that is what keeps a write-once
 * file, whose block id no write moves, by change while it is being changed.  Two clock reads, a
 * word of the write sequences, and a look at the seen table with node_clock: for misses only.
 * (struct kvs_keep: loader.h.)
 */
struct kvs_keep kvs_keep_for(struct kvs_cache *c, const struct kvs_key *block,
			     const struct kvs_fresh *fr, uint64_t dev, uint64_t ino);

/* Publish a loaded shard of size bytes as verdict v (wakes its waiters): READY, kept until
 * the expiry its pin was elected with (KVS_V_KEEP, while keep's write mark still stands and no
 * process maps the file writable: one F_OFD_GETLK); READY for this load's readers only
 * (KVS_V_HAND_OUT, or a write of the file since keep, or such a mapping);
 * FAILED with ESTALE (KVS_V_WRONG_FILE).  Returns the verdict applied: v, or KVS_V_HAND_OUT
 * where a write or a mapping took the keep away. */
enum kvs_verdict kvs_publish_loaded(struct kvs_cache *c, const struct kvs_pin *pin,
				    enum kvs_verdict v, uint32_t size, const struct kvs_keep *keep);

#endif
