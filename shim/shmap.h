/*
 * shmap: writable shared mappings of KV files, as the node's write sequences see them.
 *
 * Stores through a mapping made MAP_SHARED and PROT_WRITE change the file with no call a hook
 * sees, and a write-once file's block id (its birth) does not move with them: a load kept for
 * good while the mapping lives could keep bytes the next store makes old, for every rank of the
 * node.  So while such a mapping lives, a write of its file is in flight in the region's write
 * sequence (cache/wseq.c: kvs_cache_write_begin at mmap, before the range is dropped, and
 * kvs_cache_write_end at the munmap that takes its last page), and no process of the node keeps
 * a load of the file meanwhile (loader/publish.c, kvs_keep_for: a load marked before the
 * mapping and published after it began, or after it ended, is handed out only).  The file is
 * read from storage by each read while the mapping lives, as without the shim.
 *
 * Process-local: a table of KVS_SHMAP_MAX mappings (address range, token) under a mutex, with
 * an atomic count that makes a munmap with no mapping recorded one load.  Conservative where
 * it cannot follow, never the other way: a munmap of a hole inside a mapping, an mremap, a
 * MAP_FIXED mapping over it, SYS_munmap through syscall(), an exec, or a full table leave the
 * write in flight until the process is gone, when the reclaim of its process-table slot ends
 * it (cache/proc.c, kvs_wseq_repair).  A forked child forgets the table: the parent's tokens
 * are the parent's, and a child that stores through an inherited mapping after its parent
 * unmapped it is not followed.
 */
#ifndef KVS_SHIM_SHMAP_H
#define KVS_SHIM_SHMAP_H

#include <stddef.h>
#include <stdint.h>

#include "cache.h"

#define KVS_SHMAP_MAX 256

/* The program mapped [addr, addr + len) of (dev, ino), a KV file, MAP_SHARED and writable:
 * its write begins in c's write sequences.  Caller holds the guard. */
void kvs_shmap_begin(struct kvs_cache *c, uint64_t dev, uint64_t ino, const void *addr, size_t len);

/* munmap(addr, len) succeeded: every recorded mapping it took whole ends its write; one it cut
 * at an end shrinks.  One load when nothing is recorded.  Never changes errno. */
void kvs_shmap_unmapped(const void *addr, size_t len);

/* The fork child: the parent's mappings are the parent's writes. */
void kvs_shmap_atfork_child(void);

#endif
