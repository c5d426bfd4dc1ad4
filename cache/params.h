/*
 * params: what the cache needs to know to open or build a region, and nothing else.  cache/
 * takes these instead of the whole configuration (cache/cache_params.h fills them from a
 * struct kvs_config), so that of config/ it needs only the enums of config.h (eviction, wait
 * mode, populate, huge pages, NUMA, on-mismatch) and kvs_config_numa_word, the name of a
 * placement; cache/CMakeLists.txt links kvs_config for them.
 */
#ifndef KVS_CACHE_PARAMS_H
#define KVS_CACHE_PARAMS_H

#include <stdbool.h>
#include <stdint.h>

struct kvs_cache_params {
	const char *name;	  /* cache.name: the region is <dir>/kvshim.<euid>.<name> */
	const char *dir;	  /* cache.dir; NULL or "" = /dev/shm */
	int huge_pages;		  /* cache.huge_pages: enum kvs_huge_pages, for a region built */
	int numa;		  /* cache.numa: enum kvs_numa, for a region built */
	bool prefault;		  /* cache.prefault: map the existing pages at attach */
	uint64_t capacity;	  /* cache.capacity in bytes; 0 = auto (what dir allows) */
	uint64_t shard_size;	  /* cache.shard_size */
	uint64_t reserved;	  /* cache.reserved, percent of slots for loads and prefetch */
	uint64_t max_processes;	  /* cache.max_processes */
	uint64_t mode;		  /* cache.mode: permission bits of the region */
	uint64_t shm_headroom;	  /* cache.shm_headroom: free bytes of dir never used */
	int eviction;		  /* enum kvs_eviction */
	int populate;		  /* enum kvs_populate */
	int on_mismatch;	  /* enum kvs_on_mismatch */
	int wait_mode;		  /* loader.wait: enum kvs_wait_mode */
	uint64_t wait_timeout_ms; /* loader.wait_timeout_ms: also bounds lock waits */
	bool keys_only;		  /* a region of keys without data (shim.mode = observe): the
				   * control plane of the region these dimensions give, no data */
};

#endif
