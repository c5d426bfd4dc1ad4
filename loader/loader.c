/*
 * loader: rotated-order loading of a read's shards into a destination (see loader.h).
 *
 * DESIGN
 *
 * A task is one read, served in pieces of at most KVS_TASK_OPS shards ("ops").  Its storage is
 * the caller's (kvs_loader_read: the calling thread's stack; kvs_loader_start: the caller's
 * request), so the loader allocates nothing on the served path.  Serving a piece has two
 * halves:
 *
 *   submit  (the calling thread)  pins every shard that is READY now (kvs_cache_pin_ready) and
 *           copies it at once; then takes the rank (loader.local_rank or the dense rank among
 *           attached processes) and pins the rest in rotated order: local rank r of R starts at
 *           slice r % R, steps by R, then takes the next slice.  A pin that elects it owner
 *           submits the storage read at once; the read's completion, on a backend thread,
 *           checks the file again and publishes READY or FAILED, which wakes the waiters.
 *   finish  (the calling thread, or the completion thread for kvs_loader_start)  in the same
 *           order waits for each shard on its state word, copies it to the destination and
 *           releases the pin, or keeps the pin until the destination's fence when the copy
 *           is asynchronous.  A shard that failed, timed out or could not be pinned is read
 *           by the loader, only its wanted bytes, into the host buffers or a bounce buffer
 *           (host destinations), or fails the task (others: the caller makes the real call).
 *           A read whose first piece the cache takes nothing of goes back to the caller at
 *           once (-ENOBUFS), holding nothing: its real call reads only what was asked.
 *
 * Owners never wait for other processes before publishing (publication happens on the backend
 * thread), so two ranks each waiting for a shard the other owns cannot deadlock; and a miss
 * crosses two threads (caller, backend), not four.
 *
 * Sharing.  op->io_done: set by the backend completion (release) after its last touch of the
 * op, loaded by finish (acquire) before the op's memory may be reused.  The asynchronous queue
 * (aq_head/aq_tail/aq_len, stop) is guarded by mu; a task on it belongs to the completion
 * thread until done() is called.  The bounce buffers are guarded by bounce_mu.  Everything
 * else in a task is touched by one thread at a time: the caller until it queues it, then the
 * completion thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "atomics.h"
#include "backend.h"
#include "config.h"
#include "copy.h"
#include "loader.h"
#include "prefetch.h"
#include "publish.h"
#include "remote.h"
#include "ring.h"
#include "sys.h"

#define KVS_PAGE_SZ 4096u
#define BOUNCE	    2 /* shards read by the loader itself at once, per process */

enum op_kind {
	OP_NONE,   /* not pinned yet */
	OP_HIT,	   /* pinned READY */
	OP_OWNER,  /* pinned, we load it */
	OP_WAIT,   /* pinned, another process loads it */
	OP_COPIED, /* pinned; copied asynchronously, released at the fence */
	OP_DONE,   /* served and released */
	OP_SELF,   /* not pinned: read it ourselves */
};

struct kvs_loader {
	struct kvs_cache *c;
	struct kvs_backend *be;
	uint64_t shard_size;
	int64_t cfg_rank, cfg_nranks;
	bool rotate, backend_only;
	uint64_t wait_timeout_ns;
	kvs_copy_fn copy; /* loader.copy: into host buffers */
	struct kvs_prefetcher pf;
	struct kvs_remote *rm; /* remote.kind: NULL for none */

	/* The asynchronous queue and its thread. */
	pthread_mutex_t mu;
	pthread_cond_t cond;
	struct kvs_task *aq_head, *aq_tail;
	uint32_t aq_len, aq_max;
	bool stop, completer_started;
	pthread_t completer;

	/* Shards read by the loader itself (host destinations only). */
	pthread_mutex_t bounce_mu;
	pthread_cond_t bounce_cond;
	void *bounce[BOUNCE];
	uint32_t bounce_free; /* bit i: bounce[i] is free */
};

static uint32_t round_page(uint32_t v)
{
	return (v + KVS_PAGE_SZ - 1) & ~(KVS_PAGE_SZ - 1);
}

/* ------------------------------------------------------------------ destinations */

/* A walk over the pieces of rd's host buffers that hold [pos, pos+left) of the request. */
struct iov_walk {
	const struct kvs_read *rd;
	int i;
	uint64_t pos, left;
};

/* The next piece: *base and *n; false when the walk is over. */
static bool iov_next(struct iov_walk *w, char **base, uint64_t *n)
{
	for (; w->left && w->i < w->rd->iovcnt; w->i++) {
		uint64_t l = w->rd->iov[w->i].iov_len;

		if (w->pos >= l) {
			w->pos -= l;
			continue;
		}
		*n = l - w->pos < w->left ? l - w->pos : w->left;
		*base = (char *)w->rd->iov[w->i].iov_base + w->pos;
		w->left -= *n;
		w->pos = 0;
		w->i++;
		return true;
	}
	return false;
}

/* Copy len bytes of src to the request's iovecs, starting pos bytes into them. */
static void copy_iov(kvs_copy_fn copy, const struct kvs_read *rd, uint64_t pos, const char *src,
		     uint64_t len)
{
	struct iov_walk w = {rd, 0, pos, len};
	char *dst;
	uint64_t n;

	while (iov_next(&w, &dst, &n)) {
		copy(dst, src, n);
		src += n;
	}
}

/* Copy to rd's destination.  Returns 0 or -errno. */
static int copy_to(const struct kvs_loader *ld, const struct kvs_read *rd, uint64_t pos,
		   const char *src, uint64_t len)
{
	if (!rd->dest) {
		copy_iov(ld->copy, rd, pos, src, len);
		return 0;
	}
	return rd->dest->copy(rd->dest->ctx, pos, src, len);
}

/* Are copies to rd's destination over when copy_to returns? */
static bool copies_sync(const struct kvs_read *rd)
{
	return !rd->dest || !rd->dest->fence;
}

/* ------------------------------------------------------------------ backend completions */

/* A storage read of an owned shard is over: publish it (this wakes the waiters), then tell the
 * finishing thread that the op is ours no longer.  Nothing here touches the op after that. */
static void owner_read_done(struct kvs_bio *bio)
{
	struct kvs_op *op = (struct kvs_op *)((char *)bio - offsetof(struct kvs_op, bio));
	struct kvs_loader *ld = bio->arg;
	struct kvs_cache *c = ld->c;

	kvs_cache_count(c, KVS_CTR_backend_reads, 1);
	kvs_cache_count(c, KVS_CTR_storage_ns, kvs_mono_ns() - op->t_submit);
	if (bio->result >= (int64_t)op->size) {
		const struct kvs_read *rd = op->rd;

		kvs_cache_count(c, KVS_CTR_backend_bytes, (uint64_t)op->size);
		kvs_cache_count(c, KVS_CTR_shards_loaded, 1);
		kvs_cache_tally_add(c, rd->tally, KVS_TALLY_storage_bytes, op->size);
		kvs_cache_tally_add(c, rd->tally, KVS_TALLY_unique_bytes, op->size);
		enum kvs_verdict v =
		    kvs_check_file(bio->fd, rd->dev, rd->ino, rd->write_once, &rd->block);
		struct kvs_key key = kvs_shard_key(&rd->block, op->shard);

		/* Offered only when the file is still what it was keyed as and the shard was kept
		 * (not handed out to this load's readers only: a write or a writable mapping since
		 * the load began); the helper takes it only while it is READY under its key. */
		if (kvs_publish_loaded(c, &op->pin, v, op->size, op->keep) == KVS_V_KEEP && op->rid)
			kvs_remote_offer(ld->rm, op->rid, &key, op->size);
	} else {
		kvs_cache_count(c, KVS_CTR_failures, 1);
		kvs_cache_mark_failed(c, &op->pin, bio->result < 0 ? (int)-bio->result : EIO);
	}
	_Atomic uint32_t *done = &op->io_done;
	store_release(done, 1); /* pairs with wait_io_done(); the op may be reused from here on */
	/* A wake on memory the task's owner has just reused is harmless: the word is a plain
	 * futex address, and a spurious wake is allowed. */
	kvs_futex_wake(done, 1, false);
}

/* Wait until the backend has finished with an owned op, however long storage takes: giving up
 * would free the op under the read (the real call would wait just the same). */
static void wait_io_done(struct kvs_op *op)
{
	for (int spins = 0; !load_acquire(&op->io_done); spins++) { /* pairs with owner_read_done */
		if (spins < 100) {
			cpu_relax();
			continue;
		}
		kvs_futex_wait(&op->io_done, 0, 0, false);
	}
}

static void submit_owned(struct kvs_loader *ld, const struct kvs_read *rd, struct kvs_op *op)
{
	struct kvs_bio *bio = &op->bio;

	bio->fd = rd->fd;
	bio->buf = kvs_cache_data(ld->c, &op->pin);
	bio->off = op->shard * ld->shard_size;
	bio->len = rd->direct ? round_page(op->size) : op->size;
	if (bio->len > kvs_cache_room(ld->c, &op->pin))
		bio->len = kvs_cache_room(ld->c, &op->pin); /* a slot of another size: short */
	bio->done = owner_read_done;
	bio->arg = ld;
	store_relaxed(&op->io_done, 0);
	op->t_submit = kvs_mono_ns();
	kvs_backend_submit(ld->be, bio);
}

/* ------------------------------------------------------------------ order */

void kvs_loader_order(uint32_t rank, uint32_t nranks, uint32_t nops, uint32_t *order)
{
	uint32_t k = 0;

	if (nranks == 0)
		nranks = 1;
	rank %= nranks;
	for (uint32_t j = 0; j < nranks; j++)
		for (uint32_t i = (rank + j) % nranks; i < nops; i += nranks)
			order[k++] = i;
}

/* The visiting order of a piece's ops: rotated by this process's rank, or natural. */
static void order_ops(struct kvs_loader *ld, struct kvs_task *t)
{
	uint32_t rank = 0, nranks = 1;

	if (ld->rotate) {
		kvs_cache_ranks(ld->c, &rank, &nranks);
		if (ld->cfg_nranks > 0)
			nranks = (uint32_t)ld->cfg_nranks;
		if (ld->cfg_rank >= 0)
			rank = (uint32_t)ld->cfg_rank;
		rank %= nranks;
		kvs_cache_set_rank(ld->c, (int)rank);
	}
	kvs_loader_order(rank, nranks, t->nops, t->order);
}

/* ------------------------------------------------------------------ submit */

/* Lay out the ops of the piece that starts at t->off: at most KVS_TASK_OPS shards. */
static void plan_piece(struct kvs_loader *ld, struct kvs_task *t)
{
	const struct kvs_read *rd = t->rd;
	uint64_t S = ld->shard_size, off = t->off;
	uint64_t end = (off / S + KVS_TASK_OPS) * S;

	if (end > t->end)
		end = t->end;
	t->piece_end = end;
	uint64_t first = off / S, last = (end - 1) / S;
	t->nops = (uint32_t)(last - first + 1);
	for (uint32_t i = 0; i < t->nops; i++) {
		struct kvs_op *op = &t->ops[i];
		uint64_t sh = first + i, start = sh * S;
		uint64_t from = off > start ? off - start : 0;
		uint64_t stop = end < start + S ? end - start : S;

		op->rd = rd;
		op->shard = sh;
		op->from = (uint32_t)from;
		op->len = (uint32_t)(stop - from);
		op->pos = start + from - rd->off;
		op->size = (uint32_t)kvs_shard_bytes(rd->file_size, start, S);
		op->kind = OP_NONE;
		t->order[i] = i; /* natural until order_ops() rotates it */
	}
}

/* Copy a pinned, READY op to the destination; the pin is released now, or at the fence when
 * the copy is asynchronous.  Returns false (pin released, nothing copied) when the slot holds
 * fewer bytes than wanted or the copy failed; *err receives a copy's error. */
static bool copy_pinned(struct kvs_loader *ld, const struct kvs_read *rd, struct kvs_op *op,
			int *err)
{
	struct kvs_cache *c = ld->c;

	if (kvs_cache_length(c, &op->pin) < op->from + op->len) {
		kvs_cache_release(c, &op->pin);
		return false;
	}
	uint64_t t0 = kvs_mono_ns();
	int r = copy_to(ld, rd, op->pos, (char *)kvs_cache_data(c, &op->pin) + op->from, op->len);
	kvs_cache_count(c, KVS_CTR_copy_ns, kvs_mono_ns() - t0);
	if (r == 0)
		kvs_cache_count(c, KVS_CTR_copy_bytes, op->len);
	else
		*err = r;
	if (copies_sync(rd)) {
		kvs_cache_release(c, &op->pin);
		op->kind = OP_DONE;
	} else {
		op->kind = OP_COPIED; /* the fence releases it: the copy may still read the slot */
	}
	return r == 0;
}

/* Pin op's shard to load it, and start its storage read when the pin makes us its owner (its
 * load kept as keep says), unless defer: own_loads() starts it.  Sets op->kind; returns
 * kvs_cache_pin_load's result. */
static int pin_for_load(struct kvs_loader *ld, const struct kvs_read *rd, struct kvs_op *op,
			const struct kvs_keep *keep, bool defer)
{
	struct kvs_key key = kvs_shard_key(&rd->block, op->shard);
	int st = kvs_cache_lookup(ld->c, &key);

	/* Claim a shard only when we can read it now: an owner whose read waits behind its own
	 * queue would hold up every rank waiting for it, while another rank with room could have
	 * loaded it.  Shards others already load are pinned without waiting. */
	if (st != KVS_SLOT_READY && st != KVS_SLOT_LOADING)
		kvs_backend_wait_room(ld->be);
	uint64_t t0 = kvs_mono_ns();
	op->keep = keep;
	op->rid = NULL;
	op->t_submit = 0; /* submit_owned sets it: this piece read storage (finish_piece) */
	int r = kvs_cache_pin_load(ld->c, &key, KVS_ALLOC_LOAD, op->size, keep->until, &op->pin);

	kvs_cache_count(ld->c, KVS_CTR_pin_ns, kvs_mono_ns() - t0);
	op->kind = r == KVS_PIN_HIT	? OP_HIT
		   : r == KVS_PIN_OWNER ? OP_OWNER
		   : r == KVS_PIN_WAIT	? OP_WAIT
					: OP_SELF;
	if (op->kind == OP_OWNER && !defer)
		submit_owned(ld, rd, op);
	return r;
}

/* ------------------------------------------------------------------ the remote pool */

/* May t's owned loads ask the pool?  Not while a write of the file under the shim is in flight
 * on this node (remote.h, "Which files"); then pin_for_load defers their storage reads. */
static bool pool_may_serve(const struct kvs_loader *ld, const struct kvs_task *t)
{
	return ld->rm && !ld->backend_only && t->keep.marked;
}

/* A shard the pool gave: into op's slot, then published as a storage load would be (the file
 * checked again: kvs_check_file), which wakes its waiters.  op is its own again at once. */
static void place_pooled(struct kvs_loader *ld, const struct kvs_read *rd, struct kvs_op *op,
			 const void *src)
{
	struct kvs_cache *c = ld->c;

	if (src) /* NULL: remote.zero_copy, the helper got them into the slot itself */
		ld->copy(kvs_cache_data(c, &op->pin), src, op->size);
	kvs_cache_count(c, KVS_CTR_remote_hits, 1);
	kvs_cache_count(c, KVS_CTR_remote_bytes, op->size);
	kvs_publish_loaded(c, &op->pin,
			   kvs_check_file(rd->fd, rd->dev, rd->ino, rd->write_once, &rd->block),
			   op->size, op->keep);
	store_release(&op->io_done, 1);
}

/*
 * Start the loads of t's owned shards whose storage reads pin_for_load deferred: first ask the
 * pool for each (in the piece's order), waiting at most remote.timeout_ms for all; a shard it
 * gives is published at once, the others are read from storage as usual.  A shard that may be
 * shared is offered to the pool after its storage load (op->rid).
 */
static void own_loads(struct kvs_loader *ld, struct kvs_task *t)
{
	const struct kvs_read *rd = t->rd;
	struct kvs_ring_ticket tk[KVS_TASK_OPS];
	struct kvs_ring *ring = NULL;
	bool owned = false, shared;
	char key[KVS_RING_KEY_MAX];

	for (uint32_t i = 0; i < t->nops; i++)
		owned |= t->ops[i].kind == OP_OWNER;
	if (!owned)
		return;
	struct kvs_ring_owner me;
	bool ask = false;
	/* The ring first: without a helper a miss costs no more than one look.  Offers go to a
	 * helper that beats whatever its route; asks only where it routes misses to the pool. */
	if (kvs_cache_whoami(ld->c, &me.slot, &me.at))
		ring = kvs_remote_ring(ld->rm, &ask);
	shared = ring && kvs_remote_ident(ld->rm, rd, &t->rid);
	if (!shared || !ask)
		ring = NULL;
	for (uint32_t i = 0; i < t->nops; i++) {
		struct kvs_op *op = &t->ops[i];

		tk[i].entry = UINT32_MAX;
		if (op->kind != OP_OWNER)
			continue;
		op->rid = shared ? &t->rid : NULL;
		if (!ring)
			continue;
		struct kvs_key shard = kvs_shard_key(&rd->block, op->shard);
		kvs_remote_key(ld->rm, &t->rid, op->shard, key, sizeof(key));
		if (kvs_ring_get_for(ring, &me, key, &shard, op->pin.slot, op->size, &tk[i]) != 0)
			tk[i].entry = UINT32_MAX; /* the ring is full: storage */
	}
	uint64_t t0 = kvs_mono_ns(), deadline = t0 + kvs_remote_timeout_ns(ld->rm);
	bool answered = false, asked_failed = false;
	for (uint32_t k = 0; k < t->nops; k++) {
		uint32_t i = t->order[k];
		struct kvs_op *op = &t->ops[i];
		const void *src;

		if (op->kind != OP_OWNER)
			continue;
		if (tk[i].entry != UINT32_MAX) {
			int a = kvs_ring_wait(ring, &tk[i], deadline, &src);

			if (a == KVS_RING_HIT && kvs_cache_room(ld->c, &op->pin) >= op->size) {
				place_pooled(ld, rd, op, kvs_ring_zero_copy(ring) ? NULL : src);
				kvs_ring_release(ring, &tk[i]);
				answered = true;
				op->rid = NULL; /* it came from the pool: nothing to offer */
				continue;
			}
			if (a == KVS_RING_HIT)
				kvs_ring_release(ring, &tk[i]);
			answered |= a == KVS_RING_HIT || a == KVS_RING_MISS;
			asked_failed |= a != KVS_RING_HIT && a != KVS_RING_MISS;
			kvs_cache_count(
			    ld->c,
			    a == KVS_RING_MISS ? KVS_CTR_remote_misses : KVS_CTR_remote_errors, 1);
		}
		submit_owned(ld, rd, op);
	}
	if (ring)
		kvs_cache_count(ld->c, KVS_CTR_remote_ns, kvs_mono_ns() - t0);
	/* Once per piece: its shards share one deadline, and a piece that timed out is one
	 * failure of the helper, not one per shard. */
	if (answered || asked_failed)
		kvs_remote_answered(ld->rm, answered);
}

/* The first half of a piece, step one: lay it out and serve every shard that is READY now
 * (pinned, copied, and released unless the copy is asynchronous).  Returns the shards left. */
static uint32_t serve_hits(struct kvs_loader *ld, struct kvs_task *t)
{
	const struct kvs_read *rd = t->rd;
	uint32_t left = 0;

	plan_piece(ld, t);
	for (uint32_t i = 0; i < t->nops && !ld->backend_only; i++) {
		struct kvs_op *op = &t->ops[i];
		struct kvs_key key = kvs_shard_key(&rd->block, op->shard);
		int err = 0;

		if (kvs_cache_pin_ready(ld->c, &key, &op->pin) != KVS_PIN_HIT)
			continue;
		if (copy_pinned(ld, rd, op, &err))
			kvs_cache_count(ld->c, KVS_CTR_shards_hit, 1);
		else if (err && !t->result)
			t->result = err;
		/* else a short slot: the op is still OP_NONE, pinned again below as a load */
	}
	for (uint32_t i = 0; i < t->nops; i++)
		left += t->ops[i].kind == OP_NONE;
	return left;
}

/* Step two: pin the rest in rotated order and submit the storage reads this process owns. */
static void pin_rest(struct kvs_loader *ld, struct kvs_task *t)
{
	const struct kvs_read *rd = t->rd;

	order_ops(ld, t);
	/* Before any storage read of the piece starts: the expiry argument of publish.c. */
	t->keep = kvs_keep_for(ld->c, &rd->block, &rd->fresh, rd->dev, rd->ino);
	bool defer = pool_may_serve(ld, t);

	for (uint32_t k = 0; k < t->nops; k++) {
		struct kvs_op *op = &t->ops[t->order[k]];

		if (op->kind == OP_NONE)
			pin_for_load(ld, rd, op, &t->keep, defer);
	}
	if (defer)
		own_loads(ld, t);
	kvs_prefetch_note(&ld->pf, rd, t->ops[t->nops - 1].shard);
	kvs_cache_reap_maybe(ld->c); /* dead ranks' pins come back while we are busy */
}

/* Did the cache take none of t's first piece (no shard READY, owned, or loading elsewhere: no
 * slot could be had)?  Then nothing is held and nothing copied, and the caller makes the real
 * call: the kernel reads what was asked, with the program's own depth, as without the shim. */
static bool none_taken(const struct kvs_task *t)
{
	if (t->off != t->rd->off || t->result)
		return false;
	for (uint32_t i = 0; i < t->nops; i++)
		if (t->ops[i].kind != OP_SELF)
			return false;
	return true;
}

/* The first half of a piece, on the calling thread: serve what is READY now, then pin the rest
 * in rotated order and submit the storage reads this process owns.  Returns true if every op
 * is served already (no wait, no finish needed beyond the fence). */
static bool submit_piece(struct kvs_loader *ld, struct kvs_task *t)
{
	uint32_t left = serve_hits(ld, t);

	if (left == 0 || t->result)
		return left == 0;
	pin_rest(ld, t);
	return false;
}

/* ------------------------------------------------------------------ finish */

/* Take a bounce buffer (blocks while all are in use). */
static int bounce_get(struct kvs_loader *ld)
{
	int i;

	pthread_mutex_lock(&ld->bounce_mu);
	while (!ld->bounce_free)
		pthread_cond_wait(&ld->bounce_cond, &ld->bounce_mu);
	i = __builtin_ctz(ld->bounce_free);
	ld->bounce_free &= ~(1u << i);
	pthread_mutex_unlock(&ld->bounce_mu);
	return i;
}

static void bounce_put(struct kvs_loader *ld, int i)
{
	pthread_mutex_lock(&ld->bounce_mu);
	ld->bounce_free |= 1u << i;
	pthread_cond_signal(&ld->bounce_cond);
	pthread_mutex_unlock(&ld->bounce_mu);
}

/* Can rd's host buffers take [pos, pos+len) of the request straight from a read at foff?
 * Always without O_DIRECT; with it, when every piece is page aligned (as the program's own
 * O_DIRECT read is, except its last piece at a file's end). */
static bool iov_direct_ok(const struct kvs_read *rd, uint64_t pos, uint64_t len, uint64_t foff)
{
	if (!rd->direct)
		return true;
	if (foff % KVS_PAGE_SZ || len % KVS_PAGE_SZ)
		return false;
	struct iov_walk w = {rd, 0, pos, len};
	char *base;
	uint64_t n;

	while (iov_next(&w, &base, &n))
		if ((uintptr_t)base % KVS_PAGE_SZ || n % KVS_PAGE_SZ)
			return false;
	return true;
}

/* Read [foff, foff+len) of the file into [pos, pos+len) of rd's host buffers.  Returns the
 * bytes read or -errno. */
static int64_t read_into_iov(const struct kvs_read *rd, uint64_t pos, uint64_t len, uint64_t foff)
{
	struct iov_walk w = {rd, 0, pos, len};
	uint64_t got = 0, n;
	char *dst;

	while (iov_next(&w, &dst, &n)) {
		int64_t r = kvs_read_full(rd->fd, dst, n, foff + got);
		if (r < 0)
			return got ? (int64_t)got : r;
		got += (uint64_t)r;
		if ((uint64_t)r < n)
			break; /* the end of the file */
	}
	return (int64_t)got;
}

/* Read op's wanted bytes ourselves, and only those: straight into host buffers when they can
 * take them, else through a bounce buffer (from the page the wanted bytes start in) and
 * copied.  Never the whole shard: a fallback costs storage what the program's own read would.
 * Returns 0 or -errno. */
static int read_self(struct kvs_loader *ld, const struct kvs_read *rd, struct kvs_op *op)
{
	uint64_t foff = op->shard * ld->shard_size + op->from;
	int64_t got;
	int b, r = 0;

	if (!copies_sync(rd))
		return -EAGAIN; /* a bounce buffer cannot be held until another's fence */
	kvs_cache_count(ld->c, KVS_CTR_fallbacks, 1);
	if (!rd->dest && iov_direct_ok(rd, op->pos, op->len, foff)) {
		got = read_into_iov(rd, op->pos, op->len, foff);
		kvs_cache_count(ld->c, KVS_CTR_backend_reads, 1);
		if (got < (int64_t)op->len)
			return got < 0 ? (int)got : -EIO;
		kvs_cache_count(ld->c, KVS_CTR_backend_bytes, (uint64_t)got);
		kvs_cache_tally_add(ld->c, rd->tally, KVS_TALLY_storage_bytes, (uint64_t)got);
		if (kvs_check_file(rd->fd, rd->dev, rd->ino, rd->write_once, &rd->block) ==
		    KVS_V_WRONG_FILE)
			return -ESTALE;
		return 0;
	}
	uint32_t want = op->from + op->len;
	uint32_t start = rd->direct ? op->from & ~(KVS_PAGE_SZ - 1) : op->from;
	uint32_t len = (rd->direct ? round_page(want) : want) - start;
	b = bounce_get(ld);
	got = kvs_read_full(rd->fd, ld->bounce[b], len, op->shard * ld->shard_size + start);
	kvs_cache_count(ld->c, KVS_CTR_backend_reads, 1);
	if (got < (int64_t)(want - start))
		r = got < 0 ? (int)got : -EIO;
	else if (kvs_check_file(rd->fd, rd->dev, rd->ino, rd->write_once, &rd->block) ==
		 KVS_V_WRONG_FILE)
		r = -ESTALE;
	if (r == 0) {
		kvs_cache_count(ld->c, KVS_CTR_backend_bytes, (uint64_t)got);
		kvs_cache_tally_add(ld->c, rd->tally, KVS_TALLY_storage_bytes, (uint64_t)got);
		r = copy_to(ld, rd, op->pos, (char *)ld->bounce[b] + (op->from - start), op->len);
	}
	bounce_put(ld, b);
	return r;
}

/* Wait for a pinned op and copy it (copy_pinned).  Returns false, with the pin released, if
 * it must be read by us; *err receives a copy's error. */
static bool finish_pinned(struct kvs_loader *ld, const struct kvs_read *rd, struct kvs_op *op,
			  int *err)
{
	struct kvs_cache *c = ld->c;
	bool ok = true;

	if (op->kind == OP_OWNER)
		wait_io_done(op);
	if (op->kind == OP_HIT) {
		kvs_cache_count(c, KVS_CTR_shards_hit, 1);
	} else {
		uint64_t t0 = kvs_mono_ns();
		int r = kvs_cache_wait(c, &op->pin, ld->wait_timeout_ns);

		if (op->kind == OP_WAIT) {
			kvs_cache_count(c, KVS_CTR_wait_ns, kvs_mono_ns() - t0);
			kvs_cache_count(c, KVS_CTR_shards_waited, 1);
		}
		ok = r == 0;
	}
	/* backend_only: the cache coordinates, storage serves; an owner's slot holds what it just
	 * read from storage, so only the others read for themselves. */
	if (ld->backend_only && op->kind != OP_OWNER)
		ok = false;
	if (ok && ld->backend_only) {
		ok = kvs_cache_length(c, &op->pin) >= op->from + op->len &&
		     !(*err = copy_to(ld, rd, op->pos,
				      (char *)kvs_cache_data(c, &op->pin) + op->from, op->len));
		if (ok)
			kvs_cache_count(c, KVS_CTR_copy_bytes, op->len);
		if (!copies_sync(rd)) {
			int r = rd->dest->fence(rd->dest->ctx); /* before the slot goes back */

			if (r && !*err)
				*err = r;
		}
		kvs_cache_mark_not_ready(c, &op->pin);
		kvs_cache_release(c, &op->pin);
		op->kind = OP_DONE;
		return ok || *err;
	}
	if (!ok) {
		kvs_cache_release(c, &op->pin);
		return false;
	}
	return copy_pinned(ld, rd, op, err) || *err;
}

/* The second half of a piece: wait, copy, read what could not be served, fence, release.
 * Every op is settled when it returns, whatever failed.  Returns 0 or -errno. */
static int finish_piece(struct kvs_loader *ld, struct kvs_task *t)
{
	const struct kvs_read *rd = t->rd;
	int result = (int)t->result;
	uint64_t first = 0, bytes = 0; /* the piece's first owned storage read, and their bytes */

	for (uint32_t i = 0; i < t->nops; i++) {
		const struct kvs_op *op = &t->ops[i];

		if (op->kind != OP_OWNER || !op->t_submit)
			continue;
		bytes += op->size;
		if (!first || op->t_submit < first)
			first = op->t_submit;
	}

	for (uint32_t k = 0; k < t->nops; k++) {
		struct kvs_op *op = &t->ops[t->order[k]];
		int err = 0;

		if (op->kind == OP_DONE || op->kind == OP_COPIED)
			continue;
		if (op->kind != OP_SELF && op->kind != OP_NONE && finish_pinned(ld, rd, op, &err)) {
			if (err && !result)
				result = err;
			continue;
		}
		op->kind = OP_DONE;
		if (!result)
			result = read_self(ld, rd, op);
	}
	/* Storage as a load sees it: the piece's wall time, whatever ran in parallel (the
	 * helper compares it with the pool's: remote_ns). */
	if (first) {
		kvs_cache_count(ld->c, KVS_CTR_storage_wall_ns, kvs_mono_ns() - first);
		kvs_cache_count(ld->c, KVS_CTR_storage_wall_bytes, bytes);
	}
	if (!copies_sync(rd)) {
		int r = rd->dest->fence(rd->dest->ctx);

		if (r && !result)
			result = r;
		for (uint32_t i = 0; i < t->nops; i++) {
			if (t->ops[i].kind == OP_COPIED) {
				kvs_cache_release(ld->c, &t->ops[i].pin); /* after the fence */
				t->ops[i].kind = OP_DONE;
			}
		}
	}
	return result;
}

/* Serve one piece on this thread, submit and finish.  Returns 0 or -errno. */
static int serve_piece(struct kvs_loader *ld, struct kvs_task *t)
{
	t->result = 0;
	if (submit_piece(ld, t) && copies_sync(t->rd))
		return (int)t->result;
	return finish_piece(ld, t);
}

/* The bytes a read of rd returns: min(len, file_size - off), 0 past the end; -EOVERFLOW for
 * a length the return type cannot carry. */
static int64_t read_length(const struct kvs_read *rd)
{
	uint64_t len;

	if (rd->off >= rd->file_size || rd->len == 0)
		return 0;
	len = rd->file_size - rd->off < rd->len ? rd->file_size - rd->off : rd->len;
	return len > (uint64_t)INT64_MAX / 2 ? -EOVERFLOW : (int64_t)len;
}

int64_t kvs_loader_read(struct kvs_loader *ld, const struct kvs_read *rd)
{
	struct kvs_task t = {.rd = rd};
	int64_t len = read_length(rd);

	if (len <= 0)
		return len;
	kvs_cache_count(ld->c, KVS_CTR_requests, 1);
	t.end = rd->off + (uint64_t)len;
	for (t.off = rd->off; t.off < t.end; t.off = t.piece_end) {
		t.result = 0;
		bool all = submit_piece(ld, &t);
		if (!all && none_taken(&t)) {
			kvs_cache_count(ld->c, KVS_CTR_fallbacks, 1);
			return -ENOBUFS; /* the cache is full of pinned slots: the real call reads
					  */
		}
		int r = all && copies_sync(rd) ? (int)t.result : finish_piece(ld, &t);

		if (r) {
			kvs_cache_count(ld->c, KVS_CTR_fallbacks, 1);
			return r;
		}
	}
	return len;
}

/* ------------------------------------------------------------------ asynchronous reads */

static void *completer_main(void *arg)
{
	struct kvs_loader *ld = arg;

	pthread_mutex_lock(&ld->mu);
	for (;;) {
		while (!ld->aq_head && !ld->stop)
			pthread_cond_wait(&ld->cond, &ld->mu);
		struct kvs_task *t = ld->aq_head;
		if (!t)
			break;
		ld->aq_head = t->next;
		if (!ld->aq_head)
			ld->aq_tail = NULL;
		ld->aq_len--;
		pthread_cond_broadcast(&ld->cond); /* room for a starter */
		pthread_mutex_unlock(&ld->mu);

		/* The first piece was submitted by the caller; the rest are served here. */
		int64_t r = t->nops ? finish_piece(ld, t) : 0;
		while (r == 0 && t->nops && t->piece_end < t->end) {
			t->off = t->piece_end;
			r = serve_piece(ld, t);
		}
		if (r)
			kvs_cache_count(ld->c, KVS_CTR_fallbacks, 1);
		else
			r = (int64_t)(t->end - t->rd->off);
		t->done(t, r);
		pthread_mutex_lock(&ld->mu);
	}
	pthread_mutex_unlock(&ld->mu);
	return NULL;
}

int kvs_loader_start(struct kvs_loader *ld, struct kvs_task *t, const struct kvs_read *rd,
		     void (*done)(struct kvs_task *t, int64_t result), void *arg)
{
	int64_t len = read_length(rd);
	uint32_t left;
	int r = 0;

	if (len < 0)
		return (int)len;
	if (len == 0) {
		t->result = 0;
		return 1;
	}
	*t = (struct kvs_task){.rd = rd, .done = done, .arg = arg};
	t->end = rd->off + (uint64_t)len;
	t->off = rd->off;
	kvs_cache_count(ld->c, KVS_CTR_requests, 1);
	/* Every shard READY and copied already (a hit into host memory): complete here, and
	 * spare the caller the queue and two thread wake-ups (the completion thread's, then its
	 * own).  Hits hold no pin once copied synchronously, so nothing waits on the queue's
	 * lock below while holding one. */
	left = serve_hits(ld, t);
	if (!left && !t->result && copies_sync(rd) && t->piece_end >= t->end) {
		t->result = len;
		return 1;
	}
	pthread_mutex_lock(&ld->mu);
	if (!ld->completer_started && !ld->stop) {
		r = kvs_thread_start(&ld->completer, completer_main, ld, KVS_STACK_FOREIGN);
		ld->completer_started = r == 0;
	}
	while (!r && ld->aq_len >= ld->aq_max && !ld->stop)
		pthread_cond_wait(&ld->cond, &ld->mu);
	if (!r && ld->stop)
		r = -ESHUTDOWN;
	if (!r)
		ld->aq_len++; /* our place in the queue, taken before any load's pin */
	pthread_mutex_unlock(&ld->mu);
	if (r) {
		t->result = r;	     /* so that finish_piece reads nothing itself */
		finish_piece(ld, t); /* fences and releases what the hits still hold */
		return r;
	}
	if (left && !t->result)
		pin_rest(ld, t);
	if (none_taken(t)) {
		/* Nothing held: give the queue place back, and let the caller submit it. */
		pthread_mutex_lock(&ld->mu);
		ld->aq_len--;
		pthread_cond_broadcast(&ld->cond);
		pthread_mutex_unlock(&ld->mu);
		kvs_cache_count(ld->c, KVS_CTR_fallbacks, 1);
		return -ENOBUFS;
	}
	pthread_mutex_lock(&ld->mu);
	if (ld->aq_tail)
		ld->aq_tail->next = t;
	else
		ld->aq_head = t;
	ld->aq_tail = t;
	pthread_cond_broadcast(&ld->cond);
	pthread_mutex_unlock(&ld->mu);
	return 0;
}

/* ------------------------------------------------------------------ copies by the caller */

int kvs_loader_pin(struct kvs_loader *ld, struct kvs_task *t, const struct kvs_read *rd)
{
	int64_t len = read_length(rd);
	uint64_t S = ld->shard_size;

	if (len <= 0)
		return len ? (int)len : -EINVAL;
	if ((rd->off + (uint64_t)len - 1) / S - rd->off / S >= KVS_TASK_OPS)
		return -E2BIG;
	*t = (struct kvs_task){.rd = rd, .off = rd->off, .end = rd->off + (uint64_t)len};
	plan_piece(ld, t);
	order_ops(ld, t);
	t->keep = kvs_keep_for(ld->c, &rd->block, &rd->fresh, rd->dev, rd->ino);
	bool defer = pool_may_serve(ld, t);
	for (uint32_t k = 0; k < t->nops; k++) {
		struct kvs_op *op = &t->ops[t->order[k]];
		int r = pin_for_load(ld, rd, op, &t->keep, defer);

		if (op->kind == OP_SELF) {
			if (defer)
				own_loads(ld,
					  t); /* the owned ones are started: unpin waits for them */
			kvs_loader_unpin(ld, t);
			return r < 0 ? r : -ENOSPC;
		}
	}
	if (defer)
		own_loads(ld, t);
	kvs_cache_count(ld->c, KVS_CTR_requests, 1);
	kvs_cache_reap_maybe(ld->c);
	return 0;
}

uint32_t kvs_loader_nops(const struct kvs_task *t)
{
	return t->nops;
}

bool kvs_loader_pinned_ready(const struct kvs_task *t)
{
	for (uint32_t i = 0; i < t->nops; i++)
		if (t->ops[i].kind != OP_HIT)
			return false;
	return true;
}

void kvs_loader_op(struct kvs_loader *ld, struct kvs_task *t, uint32_t i, const void **src,
		   uint64_t *pos, uint32_t *len)
{
	struct kvs_op *op = &t->ops[i];

	*src = (char *)kvs_cache_data(ld->c, &op->pin) + op->from;
	*pos = op->pos;
	*len = op->len;
}

int kvs_loader_settle(struct kvs_loader *ld, struct kvs_task *t)
{
	const struct kvs_read *rd = t->rd;
	int result = 0;

	for (uint32_t k = 0; k < t->nops; k++) {
		struct kvs_op *op = &t->ops[t->order[k]];
		uint32_t want = op->from + op->len;

		if (op->kind == OP_OWNER)
			wait_io_done(op);
		if (op->kind == OP_HIT) {
			/* A slot holds its key's bytes up to its length only; past them lie a
			 * neighbour's (a packed frame): never hand those out. */
			if (kvs_cache_length(ld->c, &op->pin) < want && !result)
				result = -EIO;
			kvs_cache_count(ld->c, KVS_CTR_shards_hit, 1);
		} else {
			uint64_t t0 = kvs_mono_ns();
			int r;

			/* The program's stream waits for these bytes: wait as long as a live
			 * owner takes, as the real read would (owner death ends the wait). */
			while ((r = kvs_cache_wait(ld->c, &op->pin, ld->wait_timeout_ns)) ==
			       -ETIMEDOUT)
				;
			if (op->kind == OP_WAIT) {
				kvs_cache_count(ld->c, KVS_CTR_wait_ns, kvs_mono_ns() - t0);
				kvs_cache_count(ld->c, KVS_CTR_shards_waited, 1);
			}
			if (r || kvs_cache_length(ld->c, &op->pin) < want) {
				/* Failed: our pin keeps the slot FAILED and ours; load it here. */
				char *dst = kvs_cache_data(ld->c, &op->pin);
				uint32_t start =
				    rd->direct ? op->from & ~(KVS_PAGE_SZ - 1) : op->from;
				uint32_t n = (rd->direct ? round_page(want) : want) - start;
				int64_t got =
				    start + n > kvs_cache_room(ld->c, &op->pin)
					? -EIO /* more than the slot holds: the real call reads it
						*/
					: kvs_read_full(rd->fd, dst + start, n,
							op->shard * ld->shard_size + start);

				kvs_cache_count(ld->c, KVS_CTR_fallbacks, 1);
				if (got < (int64_t)(want - start) && !result)
					result = got < 0 ? (int)got : -EIO;
				else if (kvs_check_file(rd->fd, rd->dev, rd->ino, rd->write_once,
							&rd->block) == KVS_V_WRONG_FILE &&
					 !result)
					result = -ESTALE;
			}
		}
	}
	return result;
}

void kvs_loader_unpin(struct kvs_loader *ld, struct kvs_task *t)
{
	for (uint32_t i = 0; i < t->nops; i++) {
		struct kvs_op *op = &t->ops[i];

		if (op->kind == OP_OWNER)
			wait_io_done(op); /* the backend may still write the slot */
		if (op->kind == OP_HIT || op->kind == OP_OWNER || op->kind == OP_WAIT)
			kvs_cache_release(ld->c, &op->pin);
		op->kind = OP_DONE;
	}
}

/* ------------------------------------------------------------------ life */

int kvs_loader_create(struct kvs_cache *c, const struct kvs_config *cfg, struct kvs_loader **out)
{
	struct kvs_loader *ld = calloc(1, sizeof(*ld));
	int r;

	if (!ld)
		return -ENOMEM;
	ld->c = c;
	ld->shard_size = kvs_cache_shard_size(c);
	ld->cfg_rank = cfg->loader_local_rank;
	ld->cfg_nranks = cfg->loader_local_rank_size;
	ld->rotate = cfg->loader_rotate;
	ld->backend_only = cfg->loader_backend_only;
	ld->wait_timeout_ns = cfg->loader_wait_timeout_ms * 1000000ull;
	ld->copy = kvs_copy_pick(cfg->loader_copy);
	ld->aq_max = (uint32_t)cfg->loader_waiting_queue_depth;
	pthread_mutex_init(&ld->mu, NULL);
	pthread_cond_init(&ld->cond, NULL);
	pthread_mutex_init(&ld->bounce_mu, NULL);
	pthread_cond_init(&ld->bounce_cond, NULL);
	r = -ENOMEM;
	for (int i = 0; i < BOUNCE; i++) {
		if (posix_memalign(&ld->bounce[i], KVS_PAGE_SZ, ld->shard_size)) {
			ld->bounce[i] = NULL;
			goto err;
		}
		ld->bounce_free |= 1u << i;
	}
	r = kvs_backend_create(cfg->loader_io, (unsigned)cfg->loader_io_depth, &ld->be);
	if (r)
		goto err;
	r = kvs_prefetch_start(&ld->pf, c, ld->be, cfg->loader_prefetch, ld->shard_size);
	if (r)
		goto err;
	ld->rm = kvs_remote_create(cfg, c);
	*out = ld;
	return 0;
err:
	kvs_loader_destroy(ld);
	return r;
}

void kvs_loader_destroy(struct kvs_loader *ld)
{
	if (!ld)
		return;
	pthread_mutex_lock(&ld->mu);
	ld->stop = true;
	pthread_cond_broadcast(&ld->cond);
	pthread_mutex_unlock(&ld->mu);
	if (ld->completer_started)
		pthread_join(ld->completer, NULL);
	kvs_prefetch_stop(&ld->pf);
	kvs_backend_destroy(ld->be); /* waits for read-aheads in flight */
	kvs_remote_destroy(ld->rm);
	for (int i = 0; i < BOUNCE; i++)
		free(ld->bounce[i]);
	pthread_cond_destroy(&ld->bounce_cond);
	pthread_mutex_destroy(&ld->bounce_mu);
	pthread_cond_destroy(&ld->cond);
	pthread_mutex_destroy(&ld->mu);
	free(ld);
}

void kvs_loader_forget(struct kvs_loader *ld)
{
	if (ld)
		kvs_backend_forget(ld->be);
}

const char *kvs_loader_backend(const struct kvs_loader *ld)
{
	return kvs_backend_name(ld->be);
}
