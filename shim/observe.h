/*
 * observe: shim.mode = observe, and the figures of every read of a KV file the shim sees, by
 * pod and by root (cache.h, "Tallies").
 *
 * In observe mode the shim hooks, classifies and keys every read as it does to serve it, and
 * then passes it to the real call: nothing is served.  Its region is another one, of keys
 * only (<cache.name>.observe, the dimensions the configuration gives, no data section: a few
 * MiB), where each shard a read touches is pinned as a load would pin it: a hit counts
 * would-be hit bytes, an owner marks the shard READY at once (with its length and the expiry a
 * load would give it) and counts the bytes the cache would have read from storage, a waiter
 * counts a wait.  So eviction, packing and expiry behave as they would with the data, and
 * `kvshim stat` can say what the cache would have saved.  Switching a node to serve needs no
 * reset: serving uses its own region.
 *
 * Every function here is called with the shim's guard held, on a region that is mapped.
 */
#ifndef KVS_SHIM_OBSERVE_H
#define KVS_SHIM_OBSERVE_H

#include <stdbool.h>
#include <stdint.h>

#include "cache.h"
#include "config.h"
#include "fdinfo.h"

/* Read shim.mode from cfg (at init). */
void kvs_observe_configure(const struct kvs_config *cfg);

/* Is shim.mode observe?  One load. */
bool kvs_observe_on(void);

/* The parameters of this process's region: cfg's for serve; for observe, cfg's dimensions,
 * keys only, under the name <cache.name>.observe (NULL if that name would be too long).  The
 * name lives in static storage, as cfg does. */
const struct kvs_cache_params *kvs_observe_params(const struct kvs_config *cfg);

/* The region c was just mapped by this process: find the tallies of its roots. */
void kvs_observe_mapped(struct kvs_cache *c);

/* The tallies a read of fi counts in (kvs_cache_tally_ref): this process's pod, fi's root. */
uint32_t kvs_observe_ref(const struct kvs_cache *c, const struct kvs_fdinfo *fi);

/* A read of fi (its tallies: ref) served through the cache returned n bytes (n >= 0). */
void kvs_observe_served(struct kvs_cache *c, uint32_t ref, uint64_t n);

/* A read of fi (NULL: not described) passed through for the cause counted in id (an
 * unserved_* counter): counts it, its bytes (asked, up to the end of the file where fi says
 * it), and the tallies'.  c may be NULL (nothing is counted). */
void kvs_observe_unserved(struct kvs_cache *c, const struct kvs_fdinfo *fi, enum kvs_counter_id id,
			  uint64_t off, uint64_t len);

/* shim.mode = observe: a read of len bytes at off of fi (a KV file the shim would serve) goes to
 * the real call; pin its shards in the region of keys c as a load would, and count what the
 * cache would have done.  Never waits for another process. */
void kvs_observe_read(struct kvs_cache *c, const struct kvs_fdinfo *fi, uint64_t off, uint64_t len);

#endif
