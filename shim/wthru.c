/*
 * wthru: write-through (see wthru.h): the writes, from kvs_wthru_before or kvs_wthru_change to
 * kvs_wthru_after, the truncations, and the fork rule.  The files of write-through form a
 * stack, each calling only the ones below it: wthru_state.c (the configuration, wt_mu, the
 * pools, the staged files and their primitives) at the bottom; on it wthru_copy.c (the copies
 * and the copier thread) and wthru_map.c (the files mapped shared and writable); on those the
 * operations: this file and wthru_publish.c (publication at close, fsync and rename), which do
 * not call each other.  What they share is wthru_int.h; who writes which field under which
 * lock, at the top of each file that holds it.
 *
 * DESIGN
 *
 * What is kept.  For each KV file a process writes, a staged file (struct wt_file, keyed by
 * st_dev and st_ino) holds one entry per shard the writes touched: a slot staged in the region
 * (kvs_cache_stage_claim: CLAIMED by this process, found by no lookup, freed by the reclaim if
 * the process dies) and the bytes of the shard written so far, as one range [lo, hi).  Each
 * write copies its bytes into the slots while the kernel writes them (the copier thread, for
 * writes of KVS_WT_ASYNC_MIN and more; inline below that), and once the write has returned
 * with ret bytes, extends the ranges by what storage got.  A shard is published when its range
 * covers it whole: shard_size bytes, or up to the end of the file for its last shard.  A range
 * that would get a hole (writes out of order within a shard), a failed or short write whose
 * copy overwrote bytes already counted, or a slot that could not be staged make the shard not
 * kept; the other shards stay.
 *
 * When.  At close of the last descriptor the process wrote the file through, or at fsync or
 * fdatasync of one (then staging goes on for later writes), the file's identity is taken
 * (fstat) and the staged shards are published under it (kvs_cache_stage_publish), kept until
 * the last write's start plus files.settle (capped by files.revalidate), then loaded again
 * from storage once, as a load of an unsettled file would be: a write by a process not under
 * the shim that left the identity as it was (the same timestamp tick) is not visible to the
 * checks below, and that bound keeps the contract of operations.md for it.  A later rename of
 * the file by the same process moves the published shards to the new identity (rename moves
 * ctime; kvs_cache_rekey), if the file is otherwise as it was published.
 *
 * Only this process's bytes.  Nothing is published for a file when:
 *   - its identity at publication, or at the start of a write of this process with none of
 *     its own in flight, differs from the one fstat gave right after this process's last
 *     write to it (someone wrote or truncated it since: over bytes this process wrote, it may
 *     be);
 *   - the region's write sequence says another process under the shim (or another thread of
 *     this one) wrote it while or after this process did (kvs_cache_write_end, _last);
 *   - a write through the file position found the position moved by more than it wrote
 *     (another writer shares the open file description).
 *
 * Never waits for room, never harms the write.  Staging takes a slot only if one can be had
 * at once (no pinned slot is ever waited for); past KVS_WT_MAX_SLOTS staged slots, or with
 * the pools below exhausted, a write is simply not staged.  The real call is made exactly as
 * without the shim; its result and errno are the caller's.
 *
 * Threads and memory.  wt_mu guards the staged files (the list, each file's fields and
 * shard entries), the pools and the recent publications (wthru_state.c), and the records of
 * shared mappings (wthru_map.c); it is never held across the real write or a copy, and only
 * while the shim's guard is set (so a signal handler on the same thread goes to the real call,
 * never to this lock).  Shard entries live in chunks that never move, so a copy in flight
 * keeps its destinations while other writes add shards.  A file with a write in flight (refs)
 * is never published or freed: a close that races a write marks the file and the last write
 * drops it.  Memory comes from pools mapped once (no malloc on the write path).  The copier
 * thread takes ops from a list under copy_mu and marks each done with a release store that the
 * writer's acquire (futex) wait pairs with (wthru_copy.c).
 *
 * Fork: the child forgets its parent's staged files, pools, recent publications and copier
 * (its parent's slots are its parent's) without freeing; the records of shared mappings stay,
 * as the mappings do.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sys.h"
#include "wthru_int.h"

/* ------------------------------------------------------------------ writes */

/* The end of op's range, [off, end): everything from 0 for a write whose place is known only
 * afterwards (late) or never (whole); len UINT64_MAX: to any end. */
static void op_range(const struct kvs_wthru_op *op, uint64_t *off, uint64_t *end)
{
	if (op->late || op->whole) {
		*off = 0;
		*end = UINT64_MAX;
		return;
	}
	*off = op->off;
	*end = op->len > UINT64_MAX - op->off ? UINT64_MAX : op->off + op->len;
}

/* Note op's range among f's writes in flight; one that overlaps another (an O_APPEND one
 * overlaps every other) poisons the file.  Caller holds wt_mu. */
static void fly_add_locked(struct wt_file *f, const struct kvs_wthru_op *op)
{
	uint64_t off, end;

	op_range(op, &off, &end);
	for (int i = 0; i < f->nfly; i++)
		if (off < f->fly[i].end && f->fly[i].off < end)
			f->poisoned = true;
	if (f->nfly == KVS_WT_FLY) {
		f->poisoned = true; /* cannot track it */
		return;
	}
	f->fly[f->nfly].op = op;
	f->fly[f->nfly].off = off;
	f->fly[f->nfly].end = end;
	f->nfly++;
}

static void fly_remove_locked(struct wt_file *f, const struct kvs_wthru_op *op)
{
	for (int i = 0; i < f->nfly; i++) {
		if (f->fly[i].op == op) {
			f->fly[i] = f->fly[--f->nfly];
			return;
		}
	}
}

/* The shards of f that [off, off + len) touches keep nothing (a change whose bytes are not
 * copied).  Only shards staged already: one staged later is written after the change.  Caller
 * holds wt_mu. */
static void mark_locked(struct kvs_cache *c, struct wt_file *f, uint64_t off, uint64_t len)
{
	uint64_t S = kvs_cache_shard_size(c), first = off / S;
	uint64_t last = len - 1 > UINT64_MAX - off ? UINT64_MAX : (off + len - 1) / S;

	if (len == 0)
		return;
	for (struct wt_chunk *k = f->chunks; k; k = k->next)
		for (int i = 0; i < KVS_WT_CHUNK; i++)
			if (k->first + (uint64_t)i >= first && k->first + (uint64_t)i <= last)
				k->e[i].holey = true;
}

/*
 * Follow op (its range set) as a write of fi's file through fd: its staged file (made if need
 * be when fd is the program's, named), its place among the writes in flight, the region's
 * write sequence, and what the identity says of the file since this process's last write.
 * False when it cannot be followed (the pools are spent; no staged file for a change by path).
 */
static bool follow(struct kvs_cache *c, struct kvs_wthru_op *op, int fd,
		   const struct kvs_fdinfo *fi, bool named)
{
	pthread_mutex_lock(&wt_mu);
	struct wt_file *f = named ? wt_file_for_locked(fi, fd) : wt_find_locked(fi->dev, fi->ino);
	if (!f) {
		pthread_mutex_unlock(&wt_mu);
		return false;
	}
	if (op->whole)
		f->poisoned = true; /* its bytes land where nothing says: nothing is kept */
	if (wt_mapped_locked(fi->dev, fi->ino))
		f->poisoned = true; /* mapped shared and writable: stores may land over it */
	int i = wt_fd_index(f, fd);
	/* A stream that is not where the last fwrite the shim saw left it: something else wrote
	 * or moved it (fputc, fprintf, fwrite_unlocked, a seek), bytes the shim does not see,
	 * which may land over the bytes it keeps. */
	if (op->stream && i >= 0 && f->spos[i] != KVS_WT_NO_STREAM &&
	    f->spos[i] != (int64_t)op->off)
		f->poisoned = true;
	fly_add_locked(f, op);
	f->refs++;
	op->f = f;
	/* Alone on the file after an earlier write: its identity now says whether anything
	 * wrote it since (below). */
	bool look = f->wrote && f->refs == 1;
	uint32_t gen = f->after_gen;
	pthread_mutex_unlock(&wt_mu);
	kvs_cache_write_begin(c, fi->dev, fi->ino, &op->tok);
	struct stat st;
	look = look && fstat(fd, &st) == 0;
	if (op->tok.foreign || look) {
		struct wt_ident now;

		if (look)
			wt_ident_of(&st, &now);
		pthread_mutex_lock(&wt_mu);
		/* Another process under the shim may have written the file since this one did
		 * (the write sequence), or one outside it (the identity moved since this
		 * process's last write ended, with no write of its own in flight since): what
		 * this one wrote before may be under its bytes. */
		if (op->tok.foreign && (f->wrote || f->refs > 1))
			f->poisoned = true;
		if (look && f->refs == 1 && f->after_gen == gen && !wt_ident_eq(&now, &f->after))
			f->poisoned = true;
		pthread_mutex_unlock(&wt_mu);
	}
	return true;
}

bool kvs_wthru_before(struct kvs_cache *c, struct kvs_wthru_op *op, int fd,
		      const struct kvs_fdinfo *fi, const struct iovec *iov, int iovcnt,
		      uint64_t len, int64_t off, unsigned how,
		      int (*src_copy)(void *ctx, uint64_t pos, void *dst, size_t n), void *src_ctx)
{
	bool at_pos = off < 0, deferred = how & KVS_WT_DEFERRED;

	memset(op, 0, sizeof(*op));
	op->stream = (how & KVS_WT_STREAM) && !at_pos;
	op->src_copy = src_copy;
	op->src_ctx = src_ctx;
	if (!wt_on || len == 0 || !fi->kv || (deferred && at_pos))
		return false; /* (asynchronous writes always have an offset) */
	if (at_pos) {
		off_t p = lseek(fd, 0, SEEK_CUR);

		if (p < 0)
			return false;
		off = p;
		op->late = fi->append; /* O_APPEND writes at the end, wherever the position is */
	} else if (fi->append) {
		/* Linux appends a write through an O_APPEND descriptor whatever offset it names
		 * (pwrite, pwritev, POSIX and kernel AIO, cuFileWrite), and leaves the position
		 * alone: where its bytes went is not known. */
		op->whole = true;
	}
	op->iov = iov;
	op->iovcnt = iovcnt;
	op->off = (uint64_t)off;
	op->len = len;
	op->t0 = kvs_node_ns(); /* expiries are shared: sys.h */
	op->at_pos = at_pos;
	op->deferred = deferred;
	if (!follow(c, op, fd, fi, true))
		return false;
	if (op->late || op->whole)
		return true; /* O_APPEND: copied after the write, where it went, or not at all */
	if (!src_copy && atomic_load_explicit(&wt_pvr_off, memory_order_relaxed)) {
		/* No safe copy here: a synchronous write's bytes are copied after it, those the
		 * kernel has just read; an asynchronous one's cannot be, and keep nothing. */
		if (deferred)
			op->copy_failed = true;
		else
			op->late_copy = true;
		return true;
	}
	/* The copy overlaps the real write (the copier), or, for a write seen complete only later
	 * (aio), is made now: the program may reuse its buffer as soon as it knows the write is
	 * over, before the shim hears of it. */
	op->async = !deferred && len >= KVS_WT_ASYNC_MIN && wt_copy_async(c, op);
	if (!op->async)
		wt_copy_op(c, op, len);
	if (deferred)
		op->iov = NULL; /* copied: the caller's array is not looked at again */
	return true;		/* a copy that failed poisons the file at the write's end */
}

bool kvs_wthru_change(struct kvs_cache *c, struct kvs_wthru_op *op, int fd,
		      const struct kvs_fdinfo *fi, int64_t off, uint64_t len, bool named)
{
	memset(op, 0, sizeof(*op));
	if (!wt_on || !fi->kv || len == 0)
		return false;
	op->change = true;
	if (off == KVS_WT_AT_POS) {
		off_t p = fi->append ? 0 : lseek(fd, 0, SEEK_CUR);

		op->whole = fi->append || p < 0; /* an O_APPEND write goes to the end */
		off = p < 0 ? 0 : p;
	} else if (off < 0) {
		op->whole = true; /* KVS_WT_ANYWHERE */
		off = 0;
	}
	op->off = (uint64_t)off;
	op->len = len;
	op->t0 = kvs_node_ns(); /* expiries are shared: sys.h */
	return follow(c, op, fd, fi, named);
}

/* Account for a write of the op's range that storage took ret bytes of (ret < 0: none):
 * extend each shard's range by what was written; a shard whose counted bytes the copy
 * overwrote beyond what was written is not kept.  Caller holds wt_mu. */
static void account_locked(struct kvs_cache *c, struct wt_file *f, uint64_t off, uint64_t len,
			   ssize_t ret)
{
	uint64_t S = kvs_cache_shard_size(c);
	uint64_t done = ret > 0 ? (uint64_t)ret : 0, end = off + done;

	for (uint64_t sh = off / S; sh <= (off + len - 1) / S; sh++) {
		struct wt_shard *e = wt_shard_locked(f, sh, false);
		uint64_t s0 = sh * S;

		if (!e || e->holey)
			continue;
		/* Within the shard: the bytes written [a, b), and those copied but not written. */
		uint64_t a = off > s0 ? off - s0 : 0;
		uint64_t b = end > s0 ? (end - s0 < S ? end - s0 : S) : 0;
		uint64_t cend = off + len - s0 < S ? off + len - s0 : S;
		uint64_t ua = b > a ? b : a; /* the unwritten copy is [ua, cend) */
		if (ua < cend && e->hi > e->lo && ua < e->hi && cend > e->lo) {
			e->holey = true; /* bytes counted before were overwritten in the slot */
			continue;
		}
		if (b <= a)
			continue;
		if (e->hi == e->lo) {
			e->lo = (uint32_t)a;
			e->hi = (uint32_t)b;
		} else if (a <= e->hi && b >= e->lo) {
			e->lo = a < e->lo ? (uint32_t)a : e->lo;
			e->hi = b > e->hi ? (uint32_t)b : e->hi;
		} else {
			e->holey = true; /* a gap within the shard */
		}
	}
}

/* The end of op's write through f (ret from storage): account for it, note the identity it
 * left and its token, and drop the file if its last descriptor closed meanwhile. */
static void end_write(struct kvs_cache *c, struct kvs_wthru_op *op, int fd, ssize_t ret, bool clean)
{
	struct wt_file *f = op->f;
	struct stat st;
	bool stat_ok = fstat(fd, &st) == 0;

	pthread_mutex_lock(&wt_mu);
	fly_remove_locked(f, op);
	if (op->change)
		mark_locked(c, f, op->off, op->len); /* its bytes are not in the slots */
	else if (op->len)
		account_locked(c, f, op->off, op->len, ret);
	if (!clean || !stat_ok || op->copy_failed)
		f->poisoned = true;
	if (stat_ok)
		wt_set_after_locked(f, &st);
	int i = op->stream ? wt_fd_index(f, fd) : -1;
	if (i >= 0) /* a short fwrite leaves the stream where it cannot be told */
		f->spos[i] = ret == (ssize_t)op->len ? (int64_t)(op->off + op->len) : KVS_WT_LOST;
	f->tok = op->tok;
	if (!f->wrote || op->t0 < f->t_first)
		f->t_first = op->t0;
	f->wrote = true;
	if (--f->refs == 0 && f->closing)
		wt_free_file_locked(c,
				    f); /* closed during a write: what is on storage is unknown */
	pthread_mutex_unlock(&wt_mu);
}

void kvs_wthru_after(struct kvs_cache *c, struct kvs_wthru_op *op, int fd, ssize_t ret)
{
	bool moved = false;

	if (!op->f)
		return;
	if (op->async)
		wt_wait_copied(op);
	if (op->whole && !op->change) {
		op->len = 0; /* landed where nothing says (the file was poisoned at its start) */
	} else if (op->change) {
		/* Its range keeps nothing (end_write), whatever it wrote. */
	} else if (op->late_copy && ret > 0) {
		/* No safe copy here: the bytes the kernel has just read, copied now. */
		op->trusted = true;
		wt_copy_op(c, op, (uint64_t)ret < op->len ? (uint64_t)ret : op->len);
	} else if (op->late) {
		/* O_APPEND: the bytes went where the position is now, less what was written. */
		off_t p = ret > 0 ? lseek(fd, 0, SEEK_CUR) : -1;

		op->len = 0;
		if (ret > 0 && p >= ret) {
			op->off = (uint64_t)(p - ret);
			op->len = (uint64_t)ret;
			op->trusted = true; /* the kernel has just read them */
			wt_copy_op(c, op, op->len);
		} else if (ret > 0) {
			moved = true;
		}
	} else if (op->at_pos && ret > 0) {
		/* Another writer on the same open file description moved the position. */
		off_t p = lseek(fd, 0, SEEK_CUR);

		moved = p < 0 || (uint64_t)p != op->off + (uint64_t)ret;
	}
	bool clean = kvs_cache_write_end(c, &op->tok) && !moved;
	end_write(c, op, fd, ret, clean);
}

struct wt_file *kvs_wthru_truncating(struct kvs_cache *c, int fd, struct kvs_wtok *tok)
{
	struct stat st;
	struct wt_file *f;

	if (!kvs_wthru_busy() || fstat(fd, &st) != 0)
		return NULL;
	pthread_mutex_lock(&wt_mu);
	f = wt_find_locked((uint64_t)st.st_dev, (uint64_t)st.st_ino);
	if (f && wt_has_fd(f, fd)) {
		if (f->nfly)
			f->poisoned = true; /* a write in flight: which lands first is unknown */
		f->refs++; /* as a write in flight: not published or freed meanwhile */
	} else
		f = NULL;
	pthread_mutex_unlock(&wt_mu);
	if (f)
		kvs_cache_write_begin(c, (uint64_t)st.st_dev, (uint64_t)st.st_ino, tok);
	return f;
}

void kvs_wthru_truncated(struct kvs_cache *c, struct wt_file *f, int fd, struct kvs_wtok *tok,
			 int ret)
{
	struct stat st;
	bool clean = kvs_cache_write_end(c, tok) && ret == 0;
	bool stat_ok = fstat(fd, &st) == 0;

	pthread_mutex_lock(&wt_mu);
	/* A shard the new end cuts keeps only what was written of it before the end; one past it
	 * counts nothing written (if the file grows again, those bytes are zeros, not what the
	 * slot holds, until a later write covers them again). */
	if (stat_ok) {
		uint64_t S = kvs_cache_shard_size(c), end = (uint64_t)st.st_size;

		for (struct wt_chunk *k = f->chunks; k; k = k->next) {
			for (int i = 0; i < KVS_WT_CHUNK; i++) {
				struct wt_shard *e = &k->e[i];
				uint64_t s0 = (k->first + (uint64_t)i) * S;

				if (s0 >= end) {
					e->lo = e->hi = 0;
					e->holey = e->slot == KVS_WT_NIL;
				} else if (end - s0 < e->hi)
					e->hi = (uint32_t)(end - s0) > e->lo ? (uint32_t)(end - s0)
									     : e->lo;
			}
		}
	}
	if (!clean || !stat_ok)
		f->poisoned = true;
	if (stat_ok)
		wt_set_after_locked(f, &st);
	f->tok = *tok;
	f->wrote = true;
	if (--f->refs == 0 && f->closing)
		wt_free_file_locked(c, f);
	pthread_mutex_unlock(&wt_mu);
}

void kvs_wthru_atfork_child(void)
{
	/* The parent's threads do not exist here: its staged files, pools and copier are
	 * forgotten, nothing of the region's freed. */
	wt_state_atfork_child();
	wt_copy_atfork_child();
}
