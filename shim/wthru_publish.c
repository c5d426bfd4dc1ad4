/*
 * wthru_publish: publication of staged files at close, fsync and rename (see wthru.c, DESIGN),
 * one of the operations on top of the write-through files: it calls wthru_state.c (the staged
 * files, the recent publications) and wthru_map.c (wt_mapped_now), and never wthru.c.
 *
 * STATE
 *
 * recent_next, the next of wt_recents to reuse, is written and read under wt_mu, as the
 * recents themselves (wthru_state.c).  A file kvs_wthru_closing takes off the list is its
 * caller's until kvs_wthru_closed or kvs_wthru_stream_closed publishes and frees it, under
 * wt_mu.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "raw.h"
#include "wthru_int.h"

static uint32_t recent_next; /* under wt_mu */

/* ------------------------------------------------------------------ publication */

/* f's block id now, through fd (a descriptor of its file) whose fstat gave st: by birth on a
 * write-once root (one more statx and the generation), else by change from st. */
static void block_of(struct wt_file *f, int fd, const struct stat *st, struct kvs_key *block)
{
	struct kvs_ident id;

	if (f->write_once && kvs_ident_of_fd(fd, true, &id) == 0 && id.write_once &&
	    id.dev == (uint64_t)st->st_dev && id.ino == (uint64_t)st->st_ino &&
	    id.size == (uint64_t)st->st_size)
		kvs_ident_key(&id, block);
	else
		kvs_block_id(st, block);
}

/* Publish f's shards written whole under the identity st (taken now), whose block id is
 * block, drop the others, and remember what was published for a rename.  Caller holds wt_mu;
 * no write of f is in flight. */
static void publish_locked(struct kvs_cache *c, struct wt_file *f, const struct stat *st,
			   const struct kvs_key *block_now)
{
	struct wt_ident now;
	struct kvs_key block = *block_now;
	uint64_t S = kvs_cache_shard_size(c), size = (uint64_t)st->st_size;
	uint64_t first = UINT64_MAX, last = 0, bytes = 0;

	wt_ident_of(st, &now);
	bool ok = !f->poisoned && f->wrote && wt_ident_eq(&now, &f->after) &&
		  kvs_cache_write_last(c, &f->tok);
	/* Kept until files.settle after the first of these writes began (capped by
	 * files.revalidate): a writer the checks cannot see (not under the shim, in the same
	 * timestamp tick) wrote after that, so the contract holds for it as for a load of an
	 * unsettled file that began then. */
	uint64_t until = f->settle_ns ? f->t_first + f->settle_ns : 0;
	if (wt_revalidate_ns && (!until || f->t_first + wt_revalidate_ns < until))
		until = f->t_first + wt_revalidate_ns;
	while (f->chunks) {
		struct wt_chunk *k = f->chunks;

		f->chunks = k->next;
		for (int i = 0; i < KVS_WT_CHUNK; i++) {
			struct wt_shard *e = &k->e[i];
			uint64_t sh = k->first + (uint64_t)i, s0 = sh * S;
			uint64_t len = s0 < size ? (size - s0 < S ? size - s0 : S) : 0;

			/* A shard this process wrote and does not publish: whatever the cache holds
			 * under this identity may be older than what storage holds now (an identity
			 * can come back: a same-size rewrite in one tick of whole-second stamps, a
			 * deleted file's inode), so it goes. */
			if (e->slot == KVS_WT_NIL) {
				if (e->holey)
					kvs_cache_invalidate(c, &block, sh, sh);
				continue;
			}
			wt_staged_slots--;
			if (!ok || e->holey || !len || e->lo != 0 || e->hi != len) {
				kvs_cache_stage_drop(c, e->slot);
				kvs_cache_invalidate(c, &block, sh, sh);
				continue;
			}
			struct kvs_key key = {block.block_lo, block.block_hi, sh};
			if (kvs_cache_stage_publish(c, e->slot, &key, (uint32_t)len, until) == 1) {
				bytes += len;
				first = sh < first ? sh : first;
				last = sh > last ? sh : last;
			}
		}
		k->next = wt_free_chunks;
		wt_free_chunks = k;
	}
	kvs_cache_stage_count(c, (uint32_t)wt_staged_slots); /* for the node's bound */
	f->wrote = false;
	f->poisoned = false;
	if (!bytes)
		return;
	/* A write that began while the shards went in may be under some of them: then none of
	 * them stays (its writer's own publication may have met ours and been dropped). */
	if (!kvs_cache_write_last(c, &f->tok)) {
		kvs_cache_invalidate(c, &block, first, last);
		return;
	}
	kvs_cache_count(c, KVS_CTR_write_through_bytes, bytes);
	struct wt_recent *r = &wt_recents[recent_next++ % KVS_WT_RECENT];
	*r = (struct wt_recent){.used = true,
				.write_once = f->write_once,
				.id = now,
				.block = block,
				.tok = f->tok,
				.first = first,
				.last = last};
}

struct wt_file *kvs_wthru_closing(struct kvs_cache *c, int fd, int64_t stream_pos)
{
	struct wt_file *take = NULL;
	struct stat st;

	if (!kvs_wthru_busy())
		return NULL;
	bool st_ok = fstat(fd, &st) == 0;
	pthread_mutex_lock(&wt_mu);
	for (struct wt_file *f = wt_files, *next; f; f = next) {
		next = f->next;
		int i = wt_fd_index(f, fd);
		if (i < 0)
			continue;
		/* The stream about to be flushed and closed: not where the last fwrite the shim saw
		 * left it (see follow). */
		if (stream_pos != KVS_WT_CLOSE && f->spos[i] != KVS_WT_NO_STREAM &&
		    f->spos[i] != stream_pos)
			f->poisoned = true;
		f->nfds--;
		f->fds[i] = f->fds[f->nfds];
		f->spos[i] = f->spos[f->nfds];
		bool ours = st_ok && (uint64_t)st.st_dev == f->dev && (uint64_t)st.st_ino == f->ino;
		if (!ours)
			f->poisoned = true; /* the number was closed unseen and reused: unknown */
		if (f->nfds)
			continue;
		wt_unlink_locked(f);
		if (f->refs) {
			f->closing = true; /* the write in flight frees it */
		} else if (!ours || take) {
			wt_free_file_locked(c, f);
		} else {
			f->close_st = st;
			block_of(f, fd, &st, &f->close_block);
			take = f;
		}
	}
	pthread_mutex_unlock(&wt_mu);
	return take;
}

void kvs_wthru_closed(struct kvs_cache *c, struct wt_file *f, int ret)
{
	if (!f)
		return;
	bool mapped = wt_mapped_now(f->dev, f->ino);
	pthread_mutex_lock(&wt_mu);
	if (mapped)
		f->poisoned = true;
	if (ret == 0) /* a failed close (NFS reports a write error there) keeps nothing */
		publish_locked(c, f, &f->close_st, &f->close_block);
	wt_free_file_locked(c, f);
	pthread_mutex_unlock(&wt_mu);
}

void kvs_wthru_stream_closed(struct kvs_cache *c, struct wt_file *f, int dupfd, int ret)
{
	struct stat st;
	struct wt_ident before;
	bool ok = ret == 0 && dupfd >= 0 && fstat(dupfd, &st) == 0;

	if (!f) {
		if (dupfd >= 0)
			kvs_syscall(SYS_close, dupfd); /* ours: the program's is closed already */
		return;
	}
	bool mapped = wt_mapped_now(f->dev, f->ino);
	pthread_mutex_lock(&wt_mu);
	if (mapped)
		f->poisoned = true;
	wt_ident_of(&f->close_st, &before);
	/* Only the flush may have moved the identity since the last fwrite. */
	if (ok && wt_ident_eq(&before, &f->after) && (uint64_t)st.st_ino == f->ino) {
		struct kvs_key block;

		block_of(f, dupfd, &st, &block);
		wt_set_after_locked(f, &st);
		publish_locked(c, f, &st, &block);
	}
	wt_free_file_locked(c, f);
	pthread_mutex_unlock(&wt_mu);
	if (dupfd >= 0)
		kvs_syscall(SYS_close, dupfd); /* ours: the program's is closed already */
}

void kvs_wthru_synced(struct kvs_cache *c, int fd)
{
	struct stat st;

	if (!kvs_wthru_busy() || fstat(fd, &st) != 0)
		return;
	bool mapped = wt_mapped_now((uint64_t)st.st_dev, (uint64_t)st.st_ino);
	pthread_mutex_lock(&wt_mu);
	struct wt_file *f = wt_find_locked((uint64_t)st.st_dev, (uint64_t)st.st_ino);
	if (f && wt_has_fd(f, fd) && f->refs == 0) {
		struct kvs_key block;

		if (mapped)
			f->poisoned = true;
		block_of(f, fd, &st, &block);
		publish_locked(c, f, &st, &block);
	}
	pthread_mutex_unlock(&wt_mu);
}

void kvs_wthru_renamed(struct kvs_cache *c, int dirfd, const char *path)
{
	struct stat st;
	struct wt_ident now;

	if (!wt_on || !path || fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
	    !S_ISREG(st.st_mode))
		return;
	wt_ident_of(&st, &now);
	pthread_mutex_lock(&wt_mu);
	for (int i = 0; i < KVS_WT_RECENT; i++) {
		struct wt_recent *r = &wt_recents[i];

		if (!r->used || r->id.dev != now.dev || r->id.ino != now.ino)
			continue;
		if (r->write_once)
			break; /* keyed by birth: the rename left its id as it was */
		r->used = false;
		/* Only ctime may have moved (the rename's own), and nobody written since. */
		if (r->id.size != now.size || r->id.mtime_s != now.mtime_s ||
		    r->id.mtime_ns != now.mtime_ns || !kvs_cache_write_last(c, &r->tok))
			break;
		struct kvs_key block;
		kvs_block_id(&st, &block);
		for (uint64_t sh = r->first; sh <= r->last; sh++) {
			struct kvs_key from = {r->block.block_lo, r->block.block_hi, sh};
			struct kvs_key to = {block.block_lo, block.block_hi, sh};

			kvs_cache_rekey(c, &from, &to);
		}
		r->used = true; /* a second rename moves them again */
		r->id = now;
		r->block = block;
		break;
	}
	pthread_mutex_unlock(&wt_mu);
}
