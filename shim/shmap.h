/*
 * shmap: writable shared mappings of KV files, as the node sees them.
 *
 * Stores through a mapping made MAP_SHARED through a descriptor that can write change the file
 * with no call a hook sees, and a write-once file's block id (its birth) does not move with
 * them: a load kept for good while the mapping lives could keep bytes the next store makes
 * old, for every rank of the node.  So while such a mapping lives this process holds the
 * file's map lock (cache/maplock.c: an OFD read lock on a byte of the region's file, dropped
 * by the kernel when the process dies), and no process of the node keeps a load of the file
 * meanwhile: a load published while any process holds the lock is handed to its own readers
 * only (loader/publish.c, kvs_publish_loaded).  The mapped range is dropped from the cache
 * after the lock is taken (a load published before it is gone; one still loading is orphaned)
 * and again at the munmap that takes the mapping's last page, before the lock goes (a load
 * whose storage read met the stores and that publishes after the munmap is orphaned).  Each
 * read of the file while the mapping lives reads storage, as without the shim.
 *
 * Process-local: a table of KVS_SHMAP_MAX mappings (address range, file, the lock) under a
 * mutex taken with signals blocked, and an atomic count that makes a munmap with nothing
 * recorded one load; each record has a generation, so that a munmap ends only what it
 * unmapped, not a mapping another thread made at the freed addresses meanwhile.  A lock that
 * cannot be taken (the region's descriptor unusable) falls back to a write in flight on the
 * file's write sequence that ends with the process, said once.  Where it cannot follow, it keeps
 * the lock: a munmap of a hole inside a mapping keeps the rest, an mremap of a recorded mapping
 * keeps the lock until the process ends (its new range dropped at once), as do an exec, a MAP_FIXED
 * mapping over a recorded one, and mappings past a full table.  The syscall() door's SYS_mmap,
 * SYS_munmap and SYS_mremap are followed as the libc names are.  A process whose region cannot be
 * mapped holds nothing.  A forked child's inherited mappings are covered by its parent's locks (the
 * child shares the region's file description) until the parent drops them: a child that stores
 * after its parent unmapped is not followed.
 */
#ifndef KVS_SHIM_SHMAP_H
#define KVS_SHIM_SHMAP_H

#include <stddef.h>
#include <stdint.h>

#include "cache.h"

#define KVS_SHMAP_MAX 256

/* The program mapped [addr, addr + len) at file offset off of (dev, ino), a KV file whose
 * block id is block, MAP_SHARED through a descriptor that can write: the file's map lock is
 * taken and the range dropped.  Caller holds the guard. */
void kvs_shmap_begin(struct kvs_cache *c, uint64_t dev, uint64_t ino, const struct kvs_key *block,
		     const void *addr, uint64_t off, size_t len);

/* The record count, taken by a door before the real munmap or mremap: what that call took is
 * among the records made by then, and not one another thread made at the same addresses once
 * the kernel had freed them. */
uint64_t kvs_shmap_now(void);

/* munmap(addr, len) succeeded (before: kvs_shmap_now() ahead of it): every recorded mapping it
 * took whole is dropped again and its lock released; one it cut at an end shrinks.  One load
 * when nothing is recorded.  Never changes errno. */
void kvs_shmap_unmapped(const void *addr, size_t len, uint64_t before);

/* mremap(old, old_len, new_len) succeeded (before, as above): a recorded mapping it touched
 * keeps its lock until the process ends, and the file's range the moved part may reach now
 * (from its offset, the larger of the two lengths) is dropped.  Never changes errno. */
void kvs_shmap_remapped(const void *old, size_t old_len, size_t new_len, uint64_t before);

/* The fork child: the parent's mappings are the parent's holds. */
void kvs_shmap_atfork_child(void);

#endif
