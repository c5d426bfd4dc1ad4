/*
 * cache_params: the cache's parameters (params.h) taken from a configuration.  The one
 * place a whole configuration becomes the cache's parameters; used by the shim, the tools and the
 * tests.  In cache/, not config/: the configuration knows nothing of the cache.
 */
#ifndef KVS_CACHE_CACHE_PARAMS_H
#define KVS_CACHE_CACHE_PARAMS_H

#include <errno.h>
#include <stdio.h>

#include "config.h"
#include "params.h"

/* The suffix of the region of keys that shim.mode = observe uses: <cache.name>.observe. */
#define KVS_OBSERVE_SUFFIX ".observe"

/* The cache's parameters of cfg; name points into cfg, which must outlive their use. */
static inline struct kvs_cache_params kvs_cache_params_of(const struct kvs_config *cfg)
{
	return (struct kvs_cache_params){
	    .name = cfg->cache_name,
	    .dir = cfg->cache_dir,
	    .huge_pages = cfg->cache_huge_pages,
	    .numa = cfg->cache_numa,
	    .prefault = cfg->cache_prefault,
	    .capacity = cfg->cache_capacity,
	    .shard_size = cfg->cache_shard_size,
	    .reserved = cfg->cache_reserved,
	    .max_processes = cfg->cache_max_processes,
	    .mode = cfg->cache_mode,
	    .shm_headroom = cfg->cache_shm_headroom,
	    .eviction = cfg->cache_eviction,
	    .populate = cfg->cache_populate,
	    .on_mismatch = cfg->cache_on_mismatch,
	    .wait_mode = cfg->loader_wait,
	    .wait_timeout_ms = cfg->loader_wait_timeout_ms,
	};
}

/* The parameters of the region cfg's shim.mode uses: cfg's own (serve), or (observe) its
 * dimensions with keys only, named <cache.name>.observe in name[len].  0, or -ENAMETOOLONG when
 * that name does not fit. */
static inline int kvs_cache_params_mode(const struct kvs_config *cfg, struct kvs_cache_params *p,
					char *name, size_t len)
{
	*p = kvs_cache_params_of(cfg);
	if (cfg->shim_mode != KVS_MODE_OBSERVE)
		return 0;
	if ((size_t)snprintf(name, len, "%s" KVS_OBSERVE_SUFFIX, cfg->cache_name) >= len)
		return -ENAMETOOLONG;
	p->name = name;
	p->keys_only = true;
	p->prefault = false;
	return 0;
}

/* A pointer to cfg's cache parameters, for one call: kvs_cache_open(KVS_CACHE_PARAMS(&cfg),
 * ...).  The array compound literal lives until the end of the enclosing block. */
#define KVS_CACHE_PARAMS(cfg) ((const struct kvs_cache_params[]){kvs_cache_params_of(cfg)})

#endif
