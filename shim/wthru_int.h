/*
 * wthru_int: what the files of write-through share, and nothing else includes.  The protocol
 * is the DESIGN comment of wthru.c.  The files form a stack: each calls only what the files of
 * the floors below it declare here, never a file of its own floor or one above (a call back
 * up would make a circle, which scripts/check_layers.sh fails for every object of the shim):
 *   wthru.c, wthru_publish.c    the writes and truncations; publication at close, fsync, rename
 *   wthru_copy.c, wthru_map.c   the copies; the files mapped shared and writable
 *   wthru_state.c               the configuration, wt_mu, the staged files and their primitives
 * wthru.h's entry points are defined where their work is: kvs_wthru_configure, _on and _busy
 * in wthru_state.c, kvs_wthru_mapped in wthru_map.c, the others on the top floor.  Who writes
 * each field, under which lock, is said at the top of the file that defines it.
 */
#ifndef KVS_SHIM_WTHRU_INT_H
#define KVS_SHIM_WTHRU_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "copy.h"
#include "wthru.h"

#define KVS_WT_ASYNC_MIN    (256u << 10) /* writes copied by the copier thread */
#define KVS_WT_FDS	    8		 /* descriptors one staged file tracks */
#define KVS_WT_CHUNK	    64		 /* shard entries per chunk */
#define KVS_WT_FILES	    256		 /* staged files at once, per process */
#define KVS_WT_CHUNKS	    2048	 /* chunks at once, per process */
#define KVS_WT_RECENT	    32		 /* publications a rename may follow */
#define KVS_WT_FLY	    16		 /* writes of one file in flight at once, tracked */
#define KVS_WT_MAPS	    64		 /* files mapped shared and writable, recorded */
#define KVS_WT_NIL	    UINT32_MAX
#define KVS_WT_NO_STREAM    (-1)
#define KVS_WT_LOST	    INT64_MAX
#define KVS_WT_POPULATE_MIN (64u << 10) /* copies that map their pages first */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

struct wt_ident {
	uint64_t dev, ino, size, mtime_s, mtime_ns, ctime_s, ctime_ns;
};

struct wt_shard {
	uint32_t slot; /* staged slot, or KVS_WT_NIL */
	uint32_t lo, hi;
	bool holey; /* not kept: a gap, an overwrite storage did not get, no slot */
};

struct wt_chunk {
	struct wt_chunk *next;
	uint64_t first; /* shard index of e[0], a multiple of KVS_WT_CHUNK */
	struct wt_shard e[KVS_WT_CHUNK];
};

struct wt_file {
	struct wt_file *next;
	uint64_t dev, ino;
	int fds[KVS_WT_FDS];
	/* Where the stream on fds[i] stood after the last fwrite the shim saw through it (the
	 * bytes an fwrite buffers reach the file at that position when the stream flushes):
	 * KVS_WT_NO_STREAM when none, KVS_WT_LOST when it is not known. */
	int64_t spos[KVS_WT_FDS];
	int nfds;
	int refs;		    /* writes in flight */
	bool closing;		    /* its last descriptor closed while a write was in flight */
	bool poisoned;		    /* another writer, a moved position: nothing is kept */
	bool wrote;		    /* some write has ended since the last publication */
	struct wt_ident after;	    /* fstat right after this process's last write */
	uint32_t after_gen;	    /* moves with after */
	struct stat close_st;	    /* fstat just before the close that publishes it */
	struct kvs_key close_block; /* its block id then (by birth on a write-once root) */
	bool write_once;	    /* keyed by birth (fdinfo.h): no rename moves its id */
	struct kvs_wtok tok;	    /* of the last write */
	uint64_t t_first;	    /* kvs_node_ns start of the first write since publication */
	uint64_t settle_ns;
	struct wt_chunk *chunks;
	/* The writes of this process in flight on the file, and their ranges: two of them that
	 * overlap leave bytes no one can order, so the file keeps nothing. */
	struct {
		const struct kvs_wthru_op *op;
		uint64_t off, end;
	} fly[KVS_WT_FLY];
	int nfly;
};

/* What a rename may move: the shards [first, last] published under block. */
struct wt_recent {
	bool used;
	bool write_once; /* keyed by birth: a rename leaves the id as it is */
	struct wt_ident id;
	struct kvs_key block;
	struct kvs_wtok tok;
	uint64_t first, last;
};

/* wthru_state.c: the configuration (written once by kvs_wthru_configure, read without a
 * lock), and under wt_mu the staged files, their shard entries, the pools, the count of staged
 * slots and the recent publications; wt_nfiles is also read without it (kvs_wthru_busy).  The
 * functions named _locked, and wt_fd_index and wt_has_fd (they read a file's fields), are
 * called with wt_mu held; none of them takes a lock. */
extern bool wt_on;
extern uint64_t wt_revalidate_ns;
extern kvs_copy_fn wt_copy_fn; /* for copies of bytes the kernel has read already */
extern pthread_mutex_t wt_mu;
extern struct wt_file *wt_files;
extern _Atomic uint32_t wt_nfiles;
extern uint64_t wt_staged_slots;
extern struct wt_recent wt_recents[KVS_WT_RECENT]; /* publications a rename may follow */
extern struct wt_chunk *wt_free_chunks;

struct wt_file *wt_find_locked(uint64_t dev, uint64_t ino);
struct wt_file *wt_file_for_locked(const struct kvs_fdinfo *fi, int fd);
struct wt_shard *wt_shard_locked(struct wt_file *f, uint64_t sh, bool create);
int wt_fd_index(const struct wt_file *f, int fd);
bool wt_has_fd(const struct wt_file *f, int fd);
void wt_unlink_locked(struct wt_file *f);
void wt_free_file_locked(struct kvs_cache *c, struct wt_file *f);
void wt_ident_of(const struct stat *st, struct wt_ident *id);
bool wt_ident_eq(const struct wt_ident *a, const struct wt_ident *b);
void wt_set_after_locked(struct wt_file *f, const struct stat *st);
uint64_t wt_slot_cap(struct kvs_cache *c);
void wt_state_atfork_child(void); /* the fork child's part of kvs_wthru_atfork_child */

/* wthru_copy.c: the copies of a write's bytes into staged slots, inline or on the copier
 * thread; called without wt_mu (a copy takes it to stage each shard).  wt_pvr_off:
 * process_vm_readv is refused here (the copies are made after the write then, of the bytes the
 * kernel has read). */
extern _Atomic bool wt_pvr_off;
void wt_copy_op(struct kvs_cache *c, struct kvs_wthru_op *op, uint64_t to);
bool wt_copy_async(struct kvs_cache *c, struct kvs_wthru_op *op);
void wt_wait_copied(struct kvs_wthru_op *op);
void wt_copy_atfork_child(void);

/* wthru_map.c: the files this process maps shared and writable (kvs_wthru_mapped).
 * wt_mapped_locked: recorded (caller holds wt_mu); wt_mapped_now: may it be mapped now (a
 * look at /proc/self/maps; not under wt_mu). */
bool wt_mapped_locked(uint64_t dev, uint64_t ino);
bool wt_mapped_now(uint64_t dev, uint64_t ino);

#endif
