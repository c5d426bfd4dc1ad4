/*
 * wthru_state: write-through's shared state and its primitives, the bottom of the write-through
 * files (see wthru.c, DESIGN): the configuration, wt_mu, the pools, the staged files and their
 * shard entries, the count of staged slots and its cap, the identities, the recent
 * publications.  It calls no other write-through file; wthru_copy.c and wthru_map.c sit on it,
 * and the operations (wthru.c, wthru_publish.c) on them.
 *
 * STATE
 *
 * The configuration (wt_on, wt_revalidate_ns, wt_copy_fn) is written once, by
 * kvs_wthru_configure from the shim's init, before init's release store that every hook's
 * acquire pairs with (attach.c): read without a lock by anyone after.
 *
 * wt_mu guards everything else here: the list of staged files (wt_files) and every field of
 * each file and of its shard entries (the chunks), the pools and their free lists, the count
 * of staged slots (wt_staged_slots) and the recent publications (wt_recents).  A file's dev,
 * ino, settle_ns and write_once are set when it is made and never change.  A file taken off the
 * list by kvs_wthru_closing belongs to the caller that took it until its publication frees it
 * (under wt_mu).  wt_nfiles, the length of wt_files, is written under wt_mu and read without it
 * (kvs_wthru_busy, one relaxed load for the fast paths of close, sync and truncation): a call
 * the program orders after a write sees the count that write's staging left (coherence), and
 * one that races a write may take either answer, as it may run before or after it.  wt_mu is
 * never held across the real write or a copy; the region's locks (kvs_cache_stage_*,
 * invalidation, rekey) are taken under it, never the other way round, and the copier's copy_mu
 * (wthru_copy.c) is never held with it.
 *
 * Fork: kvs_wthru_atfork_child (wthru.c) calls wt_state_atfork_child, which forgets all of it
 * without freeing (the parent's slots are the parent's).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "atomics.h"
#include "config.h"
#include "copy.h"
#include "raw.h"
#include "wthru_int.h"

bool wt_on;
uint64_t wt_revalidate_ns;
kvs_copy_fn wt_copy_fn;

pthread_mutex_t wt_mu = PTHREAD_MUTEX_INITIALIZER;
struct wt_file *wt_files;
_Atomic uint32_t wt_nfiles;
uint64_t wt_staged_slots;
struct wt_recent wt_recents[KVS_WT_RECENT];

/* Pools (under wt_mu): mapped at first use, free lists through next. */
static struct wt_file *file_pool, *free_files;
static struct wt_chunk *chunk_pool;
struct wt_chunk *wt_free_chunks;
static bool pools_failed;

void kvs_wthru_configure(const struct kvs_config *cfg)
{
	wt_on = cfg->files_write_through;
	wt_revalidate_ns = cfg->files_revalidate * 1000000ull;
	wt_copy_fn = kvs_copy_pick(cfg->loader_copy);
}

bool kvs_wthru_on(void)
{
	return wt_on;
}

bool kvs_wthru_busy(void)
{
	return load_relaxed(&wt_nfiles) != 0;
}

/* ------------------------------------------------------------------ pools */

static bool pools_locked(void)
{
	if (file_pool || pools_failed)
		return !pools_failed;
	size_t fl = KVS_WT_FILES * sizeof(struct wt_file);
	size_t cl = KVS_WT_CHUNKS * sizeof(struct wt_chunk);
	char *p =
	    kvs_sys_mmap(NULL, fl + cl, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		pools_failed = true;
		return false;
	}
	file_pool = (struct wt_file *)p;
	chunk_pool = (struct wt_chunk *)(p + fl);
	for (int i = KVS_WT_FILES - 1; i >= 0; i--) {
		file_pool[i].next = free_files;
		free_files = &file_pool[i];
	}
	for (int i = KVS_WT_CHUNKS - 1; i >= 0; i--) {
		chunk_pool[i].next = wt_free_chunks;
		wt_free_chunks = &chunk_pool[i];
	}
	return true;
}

/* ------------------------------------------------------------------ identities */

void wt_ident_of(const struct stat *st, struct wt_ident *id)
{
	*id = (struct wt_ident){(uint64_t)st->st_dev,	       (uint64_t)st->st_ino,
				(uint64_t)st->st_size,	       (uint64_t)st->st_mtim.tv_sec,
				(uint64_t)st->st_mtim.tv_nsec, (uint64_t)st->st_ctim.tv_sec,
				(uint64_t)st->st_ctim.tv_nsec};
}

bool wt_ident_eq(const struct wt_ident *a, const struct wt_ident *b)
{
	return !memcmp(a, b, sizeof(*a));
}

/* f's identity after this process's last write.  Caller holds wt_mu. */
void wt_set_after_locked(struct wt_file *f, const struct stat *st)
{
	wt_ident_of(st, &f->after);
	f->after_gen++;
}

/* ------------------------------------------------------------------ staged files */

struct wt_file *wt_find_locked(uint64_t dev, uint64_t ino)
{
	for (struct wt_file *f = wt_files; f; f = f->next)
		if (f->dev == dev && f->ino == ino)
			return f;
	return NULL;
}

/* The entry of shard sh, created (with its chunk) if absent and create; NULL if none. */
struct wt_shard *wt_shard_locked(struct wt_file *f, uint64_t sh, bool create)
{
	uint64_t first = sh - sh % KVS_WT_CHUNK;
	struct wt_chunk *k;

	for (k = f->chunks; k; k = k->next)
		if (k->first == first)
			return &k->e[sh - first];
	if (!create || !wt_free_chunks)
		return NULL;
	k = wt_free_chunks;
	wt_free_chunks = k->next;
	k->next = f->chunks;
	k->first = first;
	for (int i = 0; i < KVS_WT_CHUNK; i++)
		k->e[i] = (struct wt_shard){.slot = KVS_WT_NIL};
	f->chunks = k;
	return &k->e[sh - first];
}

/* Free every staged slot of f that is still staged, and its chunks (publish took the others). */
static void drop_shards_locked(struct kvs_cache *c, struct wt_file *f)
{
	while (f->chunks) {
		struct wt_chunk *k = f->chunks;

		f->chunks = k->next;
		for (int i = 0; i < KVS_WT_CHUNK; i++) {
			if (k->e[i].slot != KVS_WT_NIL) {
				kvs_cache_stage_drop(c, k->e[i].slot);
				wt_staged_slots--;
			}
		}
		k->next = wt_free_chunks;
		wt_free_chunks = k;
	}
	kvs_cache_stage_count(c, (uint32_t)wt_staged_slots); /* for the node's bound */
}

void wt_unlink_locked(struct wt_file *f)
{
	for (struct wt_file **pp = &wt_files; *pp; pp = &(*pp)->next) {
		if (*pp == f) {
			*pp = f->next;
			store_relaxed(&wt_nfiles, load_relaxed(&wt_nfiles) - 1);
			return;
		}
	}
}

void wt_free_file_locked(struct kvs_cache *c, struct wt_file *f)
{
	drop_shards_locked(c, f);
	f->next = free_files;
	free_files = f;
}

/* The index of fd among f's descriptors, or -1. */
int wt_fd_index(const struct wt_file *f, int fd)
{
	for (int i = 0; i < f->nfds; i++)
		if (f->fds[i] == fd)
			return i;
	return -1;
}

bool wt_has_fd(const struct wt_file *f, int fd)
{
	return wt_fd_index(f, fd) >= 0;
}

/* The staged file of (dev, ino) with fd among its descriptors, made if need be; NULL if the
 * pools are spent. */
struct wt_file *wt_file_for_locked(const struct kvs_fdinfo *fi, int fd)
{
	struct wt_file *f = wt_find_locked(fi->dev, fi->ino);

	if (!f) {
		if (!pools_locked() || !free_files)
			return NULL;
		f = free_files;
		free_files = f->next;
		*f = (struct wt_file){.dev = fi->dev,
				      .ino = fi->ino,
				      .settle_ns = fi->settle_ns,
				      .write_once = fi->write_once};
		f->next = wt_files;
		wt_files = f;
		store_relaxed(&wt_nfiles, load_relaxed(&wt_nfiles) + 1);
	}
	if (!wt_has_fd(f, fd)) {
		if (f->nfds == KVS_WT_FDS) {
			f->poisoned = true; /* cannot tell when it is done: keep nothing */
		} else {
			f->spos[f->nfds] = KVS_WT_NO_STREAM;
			f->fds[f->nfds++] = fd;
		}
	}
	return f;
}

/* ------------------------------------------------------------------ slots */

/* The most slots one process keeps staged: a quarter of the region (the node's writers
 * together stage no more: kvs_cache_stage_claim). */
uint64_t wt_slot_cap(struct kvs_cache *c)
{
	uint64_t n = kvs_cache_slots(c) / 4;

	return n ? n : 1;
}

/* ------------------------------------------------------------------ fork */

void wt_state_atfork_child(void)
{
	/* The parent's threads do not exist here; its slots are its own.  Forget, free nothing
	 * of the region's. */
	pthread_mutex_init(&wt_mu, NULL);
	if (file_pool)
		kvs_sys_munmap(file_pool, KVS_WT_FILES * sizeof(struct wt_file) +
					      KVS_WT_CHUNKS * sizeof(struct wt_chunk));
	file_pool = free_files = NULL;
	chunk_pool = wt_free_chunks = NULL;
	pools_failed = false;
	wt_files = NULL;
	store_relaxed(&wt_nfiles, 0);
	wt_staged_slots = 0;
	memset(wt_recents, 0, sizeof(wt_recents));
}
