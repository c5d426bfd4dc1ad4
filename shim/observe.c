/*
 * observe: shim.mode = observe, and the figures of reads by pod and root (observe.h).
 *
 * DESIGN.  State, and who writes it:
 *   mode           written once by init (before state is ON), read-only afterwards.
 *   params, name   written once by the first kvs_observe_params (under the shim's attach_mu,
 *                  at the first map), read-only afterwards.
 *   root_entry[]   the tally entry of each of files.roots in the region mapped now: written by
 *                  kvs_observe_mapped under attach_mu before the region is published to the
 *                  hooks (the mapped word's release store in attach.c), read by hooks after its
 *                  acquire load.  A fork child maps again and writes them again.
 * The region's side (pins, tallies) is cache/'s protocol: region.c and tally.c.
 *
 * An observed read pins each shard as the loader would (kvs_cache_pin_ready, then
 * kvs_cache_pin_load with the expiry kvs_keep_for gives), and never waits: an owner marks
 * READY at once, so a waiter's wait would be a few instructions long.  A process killed
 * between a pin and its release leaves what a killed loader leaves (a pin, a load it owned),
 * which the next reap returns (kvs_cache_reap_maybe, at most every 250 ms per process).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cache_params.h"
#include "loader.h"
#include "observe.h"
#include "publish.h"

#define MAX_ROOTS 16 /* fdinfo.c's */

static int mode = KVS_MODE_SERVE;
static struct kvs_cache_params params;
static char name[KVS_CONFIG_STR_MAX + sizeof(KVS_OBSERVE_SUFFIX)];
static int root_entry[MAX_ROOTS];

void kvs_observe_configure(const struct kvs_config *cfg)
{
	mode = cfg->shim_mode;
}

bool kvs_observe_on(void)
{
	return mode == KVS_MODE_OBSERVE;
}

const struct kvs_cache_params *kvs_observe_params(const struct kvs_config *cfg)
{
	return kvs_cache_params_mode(cfg, &params, name, sizeof(name)) ? NULL : &params;
}

void kvs_observe_mapped(struct kvs_cache *c)
{
	for (int i = 0; i < MAX_ROOTS; i++) {
		const char *root = kvs_fdinfo_root(i);

		root_entry[i] = root ? kvs_cache_tally_root(c, root) : -1;
	}
}

uint32_t kvs_observe_ref(const struct kvs_cache *c, const struct kvs_fdinfo *fi)
{
	int root = fi && fi->root >= 0 && fi->root < MAX_ROOTS ? root_entry[fi->root] : -1;

	return kvs_cache_tally_ref(c, root);
}

void kvs_observe_served(struct kvs_cache *c, uint32_t ref, uint64_t n)
{
	kvs_cache_count(c, KVS_CTR_read_bytes, n);
	kvs_cache_tally_add(c, ref, KVS_TALLY_reads, 1);
	kvs_cache_tally_add(c, ref, KVS_TALLY_read_bytes, n);
}

/* The byte counter beside an unserved_* counter; KVS_NCOUNTERS for none. */
static enum kvs_counter_id bytes_of(enum kvs_counter_id id)
{
	switch (id) {
	case KVS_CTR_unserved_buffered:
		return KVS_CTR_unserved_buffered_bytes;
	case KVS_CTR_unserved_small:
		return KVS_CTR_unserved_small_bytes;
	case KVS_CTR_unserved_misaligned:
		return KVS_CTR_unserved_misaligned_bytes;
	case KVS_CTR_unserved_mmap:
		return KVS_CTR_unserved_mmap_bytes;
	case KVS_CTR_unserved_io_uring:
		return KVS_CTR_unserved_io_uring_bytes;
	case KVS_CTR_unserved_stdio:
		return KVS_CTR_unserved_stdio_bytes;
	case KVS_CTR_unserved_buffers:
		return KVS_CTR_unserved_buffers_bytes;
	case KVS_CTR_unserved_no_cache:
		return KVS_CTR_unserved_no_cache_bytes;
	case KVS_CTR_unserved_anchor:
		return KVS_CTR_unserved_anchor_bytes;
	case KVS_CTR_unserved_fallback:
		return KVS_CTR_unserved_fallback_bytes;
	case KVS_CTR_unserved_device:
		return KVS_CTR_unserved_device_bytes;
	case KVS_CTR_unserved_stream:
		return KVS_CTR_unserved_stream_bytes;
	default:
		return KVS_NCOUNTERS;
	}
}

void kvs_observe_unserved(struct kvs_cache *c, const struct kvs_fdinfo *fi, enum kvs_counter_id id,
			  uint64_t off, uint64_t len)
{
	enum kvs_counter_id b = bytes_of(id);

	if (!c)
		return;
	kvs_cache_count(c, id, 1);
	if (fi && fi->kv && id != KVS_CTR_unserved_mmap)
		len = off >= fi->size ? 0 : len < fi->size - off ? len : fi->size - off;
	if (b != KVS_NCOUNTERS)
		kvs_cache_count(c, b, len);
	if (id == KVS_CTR_unserved_mmap)
		return; /* a mapping reads nothing yet: what its faults read, the shim never sees */
	uint32_t ref = kvs_observe_ref(c, fi);
	kvs_cache_count(c, KVS_CTR_read_bytes, len);
	kvs_cache_tally_add(c, ref, KVS_TALLY_reads, 1);
	kvs_cache_tally_add(c, ref, KVS_TALLY_read_bytes, len);
	kvs_cache_tally_add(c, ref, KVS_TALLY_storage_bytes, len);
	kvs_cache_tally_add(c, ref, KVS_TALLY_unserved_bytes, len);
}

void kvs_observe_read(struct kvs_cache *c, const struct kvs_fdinfo *fi, uint64_t off, uint64_t len)
{
	uint64_t S = kvs_cache_shard_size(c), n, would_read = 0, would_hit = 0, expires = 0;
	const struct kvs_fresh fr = {
	    .changed_ns = fi->changed_ns, .settle_ns = fi->settle_ns, .node_clock = fi->node_clock};
	uint32_t ref = kvs_observe_ref(c, fi);
	bool have_expiry = false;

	kvs_cache_reap_maybe(c); /* a killed observer's pins and loads, as the loader does */
	n = off >= fi->size ? 0 : len < fi->size - off ? len : fi->size - off;
	kvs_cache_count(c, KVS_CTR_requests, 1);
	kvs_cache_count(c, KVS_CTR_read_bytes, n);
	kvs_cache_tally_add(c, ref, KVS_TALLY_reads, 1);
	kvs_cache_tally_add(c, ref, KVS_TALLY_read_bytes, n);
	kvs_cache_tally_add(c, ref, KVS_TALLY_storage_bytes, n);
	for (uint64_t s = n ? off / S : 1, last = n ? (off + n - 1) / S : 0; s <= last; s++) {
		struct kvs_key key = kvs_shard_key(&fi->block, s);
		uint64_t start = s * S, from = off > start ? off : start;
		uint64_t to = off + n < start + S ? off + n : start + S;
		uint32_t bytes = (uint32_t)kvs_shard_bytes(fi->size, start, S);
		struct kvs_pin pin;
		int r = kvs_cache_pin_ready(c, &key, &pin);

		if (r == -EAGAIN) {
			if (!have_expiry) /* as the loader: for misses only, once per read */
				expires = kvs_keep_for(c, &fi->block, &fr, fi->dev, fi->ino).until;
			have_expiry = true;
			r = kvs_cache_pin_load(c, &key, KVS_ALLOC_LOAD, bytes, expires, &pin);
		}
		switch (r) {
		case KVS_PIN_HIT:
			kvs_cache_count(c, KVS_CTR_shards_hit, 1);
			would_hit += to - from;
			break;
		case KVS_PIN_OWNER: /* loaded at once: no byte, its length and expiry */
			kvs_cache_mark_ready(c, &pin, bytes);
			kvs_cache_count(c, KVS_CTR_shards_loaded, 1);
			would_read += bytes;
			break;
		case KVS_PIN_WAIT: /* another observer is between its pin and its mark */
			kvs_cache_count(c, KVS_CTR_shards_waited, 1);
			would_hit += to - from;
			break;
		default: /* every slot pinned, a stuck region: the loader would read it itself */
			kvs_cache_count(c, KVS_CTR_fallbacks, 1);
			would_read += to - from;
			continue;
		}
		kvs_cache_release(c, &pin);
	}
	kvs_cache_count(c, KVS_CTR_would_read_bytes, would_read);
	kvs_cache_count(c, KVS_CTR_would_hit_bytes, would_hit);
	kvs_cache_tally_add(c, ref, KVS_TALLY_unique_bytes, would_read);
}
