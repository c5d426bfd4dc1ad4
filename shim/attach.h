/*
 * attach: the process's shim state, for the shim's own files (attach.c owns it; see the
 * essay there for who writes what).
 *
 *   kvs_shim_cfg, kvs_shim_min_read  written once by init, read-only afterwards (read them only
 *                                    after kvs_shim_wants or kvs_shim_enter said the shim is
 *                                    on: that acquire pairs with init's release);
 *   kvs_shim_cache, kvs_shim_loader  the region and the loader: valid after kvs_shim_attach()
 *                                    returned true (kvs_shim_cache alone after
 *                                    kvs_shim_region or kvs_shim_is_mapped said so);
 *   kvs_shim_guard                   per thread: nonzero while the shim's own code runs
 *                                    (guard.h, with the one pair that raises and lowers it).
 *
 * None of it is for the hooks (shim.h is their contract).
 */
#ifndef KVS_SHIM_ATTACH_H
#define KVS_SHIM_ATTACH_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache.h"
#include "config.h"
#include "guard.h"
#include "loader.h"

/* Linux's MAX_RW_COUNT: INT_MAX rounded down to a page; the most one read or write moves. */
#define KVS_MAX_RW_COUNT 0x7ffff000ull

extern struct kvs_config kvs_shim_cfg;
extern uint64_t kvs_shim_min_read;
extern struct kvs_cache *kvs_shim_cache;
extern struct kvs_loader *kvs_shim_loader;
/* Map the region and start the loader, once; a failure is final for this process.  True when
 * both are there.  Caller holds the guard. */
bool kvs_shim_attach(void);

/* Has this process mapped the region (without mapping it)?  Then kvs_shim_cache is valid. */
bool kvs_shim_is_mapped(void);

/* Is the shim on (the configuration loaded first if need be)?  Not from the shim's own code. */
bool kvs_shim_on(void);

/* Is this the process the shim's state belongs to (not a vfork child, nor a clone(CLONE_VM)
 * one, running in its parent's memory with a descriptor table of its own)? */
bool kvs_shim_in_owner(void);

/* attach.c's own fork rule (hooks/fanout.c runs every module's): a fork waits for an attach in
 * progress (prepare takes the attach lock, parent and child release it); the child drops the
 * parent's mapping, descriptor and loader without touching shared state, and attaches anew,
 * as itself, at its first cacheable read. */
void kvs_shim_attach_atfork_prepare(void);
void kvs_shim_attach_atfork_parent(void);
void kvs_shim_attach_atfork_child(void);

/* The fork handlers could not be registered (hooks/fanout.c, at load): the shim stays off,
 * since a fork could leave a lock of its held in the child. */
void kvs_shim_refuse(void);

#endif
