/*
 * loader: rotated-order loading of a read's shards (see loader.h).
 *
 * DESIGN
 *
 * A task is one intercepted read, or a piece of at most STACK_OPS shards of a longer one: its
 * shards ("ops"), the rotated order to visit them in, and a completion word.  It lives on the
 * calling thread's stack (no malloc: a hooked read may come from a signal handler) and the
 * calling thread sleeps on the completion word until the transfer thread sets it, so the task
 * outlives every use by the loader's threads.
 *
 *   calling thread   pins every shard that is READY now (kvs_cache_pin_ready), copies and
 *                    releases it; if all were, returns without a hand-off.  Else queues the
 *                    task (mutex + condvar, bounded by loader.waiting_queue_depth) and sleeps.
 *   dispatch thread  pops a task, takes the rank (loader.local_rank or the dense rank among
 *                    attached processes), pins the remaining shards in rotated order: local
 *                    rank r of R starts at slice r % R, steps by R, then takes the next slice.
 *                    A pin that elects it owner submits the storage read at once; the read's
 *                    completion (on a backend thread) publishes READY or FAILED.  Then it
 *                    pushes the task into the SPSC ring (loader.running_queue_depth).  With
 *                    nothing queued it preallocates or reads ahead shard+1 of recent tasks.
 *   transfer thread  pops a task and, in the same order, waits for each shard on its state
 *                    word, copies it out and releases the pin.  A shard that failed, timed out
 *                    (loader.wait_timeout_ms) or could not be pinned is read by this thread
 *                    into a bounce buffer and copied.  Then it completes the task.
 *
 * Owners never wait for other processes before publishing (publication happens on the backend
 * thread), so two ranks each waiting for a shard the other owns cannot deadlock.
 *
 * Fields of struct task: ops[].kind/pin/bio are written by dispatch before the push into the
 * ring (release) and read by transfer after the pop (acquire); the backend thread touches only
 * its op's bio and the slot.  t->result is written by transfer before the release store of
 * t->done, which the calling thread loads with acquire.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "atomics.h"
#include "backend.h"
#include "config.h"
#include "loader.h"
#include "ring.h"
#include "sys.h"

#define STACK_OPS   16
#define RECENT	    8
#define KVS_PAGE_SZ 4096u

enum op_kind {
	OP_DONE = -1, /* served on the calling thread */
	OP_HIT = KVS_PIN_HIT,
	OP_OWNER = KVS_PIN_OWNER,
	OP_WAIT = KVS_PIN_WAIT,
	OP_SELF = 3, /* not pinned: read it ourselves */
};

struct task;

struct op {
	const struct kvs_read *rd;
	uint64_t shard;
	uint64_t pos;  /* where its bytes go, as an offset into the request */
	uint32_t from; /* first byte wanted, within the shard */
	uint32_t len;  /* bytes wanted */
	uint32_t size; /* the shard's bytes in the file (short for the last one) */
	int kind;
	struct kvs_pin pin;
	struct kvs_bio bio;
	_Atomic uint32_t io_done; /* owner: the backend is finished with bio and the op */
};

struct task {
	const struct kvs_read *rd;
	struct op *ops;
	uint32_t nops;
	uint32_t *order;
	_Atomic uint32_t done;
	int64_t result; /* 0, or -errno: the caller falls back */
	struct task *next;
};

/* A file recently read, for prefetch.  fd is the shim's anchor of it (never closed here: the
 * anchor belongs to the shim, and closing a descriptor would drop the program's record locks);
 * read-ahead checks before and after that it still names the same file. */
struct recent {
	struct kvs_key block;
	uint64_t dev, ino;
	uint64_t next_shard, file_size;
	int fd;
	bool direct, valid;
};

/* A read-ahead in flight; a fixed pool, so that no loader thread calls malloc. */
struct prefetch_io {
	struct kvs_bio bio;
	struct kvs_loader *ld;
	struct kvs_pin pin;
	struct kvs_key block;
	uint64_t dev, ino;
	uint32_t size;
	_Atomic uint32_t busy;
};

struct kvs_loader {
	struct kvs_cache *c;
	struct kvs_backend *be;
	uint64_t shard_size;
	int64_t cfg_rank, cfg_nranks;
	bool rotate, backend_only;
	int prefetch;
	uint64_t wait_timeout_ns;

	pthread_mutex_t mu; /* guards the waiting queue, recent[], stop */
	pthread_cond_t cond;
	struct task *qhead, *qtail;
	uint32_t qlen, qmax;
	bool stop;
	struct recent recent[RECENT];
	uint32_t nrecent_next;
	struct prefetch_io pio[RECENT];

	struct kvs_spsc running;
	void *bounce; /* transfer thread's buffer for reading a shard itself */
	pthread_t dispatch_thread, transfer_thread;
	bool dispatch_started, transfer_started;
};

static uint32_t round_page(uint32_t v)
{
	return (v + KVS_PAGE_SZ - 1) & ~(KVS_PAGE_SZ - 1);
}

/* Copy len bytes of src to the request's iovecs, starting pos bytes into them. */
static void copy_out(const struct kvs_read *rd, uint64_t pos, const char *src, uint64_t len)
{
	for (int i = 0; i < rd->iovcnt && len; i++) {
		uint64_t l = rd->iov[i].iov_len;

		if (pos >= l) {
			pos -= l;
			continue;
		}
		uint64_t n = l - pos < len ? l - pos : len;
		memcpy((char *)rd->iov[i].iov_base + pos, src, n);
		src += n;
		len -= n;
		pos = 0;
	}
}

static struct kvs_key shard_key(const struct kvs_key *block, uint64_t shard)
{
	struct kvs_key k = {block->block_lo, block->block_hi, shard};

	return k;
}

/* What a storage read through fd may be used for, judged after it: the file must still be
 * (dev, ino), else the bytes are another file's; kept only if its identity is still block. */
enum verdict { V_KEEP, V_HAND_OUT, V_WRONG_FILE };

static enum verdict check_file(int fd, uint64_t dev, uint64_t ino, const struct kvs_key *block)
{
	struct stat st;
	struct kvs_key now;

	if (fstat(fd, &st) < 0 || (uint64_t)st.st_dev != dev || (uint64_t)st.st_ino != ino)
		return V_WRONG_FILE;
	kvs_block_id(&st, &now);
	return now.block_lo == block->block_lo && now.block_hi == block->block_hi ? V_KEEP
										  : V_HAND_OUT;
}

/* Publish a loaded shard as the check after its read allows. */
static void publish_loaded(struct kvs_cache *c, const struct kvs_pin *pin, enum verdict v,
			   bool keep, uint32_t size)
{
	if (v == V_WRONG_FILE)
		kvs_cache_mark_failed(c, pin, ESTALE);
	else if (v == V_KEEP && keep)
		kvs_cache_mark_ready(c, pin, size);
	else
		kvs_cache_mark_ready_unkept(c, pin, size);
}

/* ------------------------------------------------------------------ backend completions */

/* A storage read of an owned shard is over: publish it (this wakes the waiters), then tell the
 * transfer thread that the op is ours no longer.  Nothing here touches the op after that. */
static void owner_read_done(struct kvs_bio *bio)
{
	struct op *op = (struct op *)((char *)bio - offsetof(struct op, bio));
	struct kvs_cache *c = bio->arg;

	kvs_cache_count(c, KVS_CTR_backend_reads, 1);
	if (bio->result >= (int64_t)op->size) {
		const struct kvs_read *rd = op->rd;

		kvs_cache_count(c, KVS_CTR_backend_bytes, (uint64_t)op->size);
		kvs_cache_count(c, KVS_CTR_shards_loaded, 1);
		publish_loaded(c, &op->pin, check_file(bio->fd, rd->dev, rd->ino, &rd->block),
			       rd->keep, op->size);
	} else {
		kvs_cache_count(c, KVS_CTR_failures, 1);
		kvs_cache_mark_failed(c, &op->pin, bio->result < 0 ? (int)-bio->result : EIO);
	}
	_Atomic uint32_t *done = &op->io_done;
	store_release(done, 1); /* pairs with wait_io_done(); the op may be freed from here on */
	/* A wake on memory the task's owner has just released is harmless: the stack stays
	 * mapped, and the kernel answers EFAULT for an unmapped address. */
	kvs_futex_wake(done, 1, false);
}

/* Transfer: wait until the backend has finished with an owned op, however long storage takes:
 * giving up would free the op under the read (the real call would wait just the same). */
static void wait_io_done(struct op *op)
{
	for (int spins = 0; !load_acquire(&op->io_done); spins++) {
		if (spins < 100) {
			cpu_relax();
			continue;
		}
		kvs_futex_wait(&op->io_done, 0, 0, false);
	}
}

static void submit_owned(struct kvs_loader *ld, const struct kvs_read *rd, struct op *op)
{
	struct kvs_bio *bio = &op->bio;

	bio->fd = rd->fd;
	bio->buf = kvs_cache_data(ld->c, &op->pin);
	bio->off = op->shard * ld->shard_size;
	bio->len = rd->direct ? round_page(op->size) : op->size;
	bio->done = owner_read_done;
	bio->arg = ld->c;
	store_relaxed(&op->io_done, 0);
	kvs_backend_submit(ld->be, bio);
}

static void prefetch_done(struct kvs_bio *bio)
{
	struct prefetch_io *io = (struct prefetch_io *)bio;
	struct kvs_cache *c = io->ld->c;

	kvs_cache_count(c, KVS_CTR_backend_reads, 1);
	if (bio->result >= (int64_t)io->size) {
		kvs_cache_count(c, KVS_CTR_backend_bytes, io->size);
		publish_loaded(c, &io->pin, check_file(bio->fd, io->dev, io->ino, &io->block), true,
			       io->size);
	} else {
		kvs_cache_mark_failed(c, &io->pin, bio->result < 0 ? (int)-bio->result : EIO);
	}
	kvs_cache_release(c, &io->pin);
	store_release(&io->busy, 0); /* pairs with the acquire in read_ahead() */
}

/* ------------------------------------------------------------------ dispatch */

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

/* The visiting order of a task's ops: rotated by this process's rank, or natural. */
static void order_ops(struct kvs_loader *ld, struct task *t)
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

static void remember(struct kvs_loader *ld, struct task *t)
{
	const struct kvs_read *rd = t->rd;
	struct op *last = &t->ops[t->nops - 1];
	uint64_t next = last->shard + 1;

	/* A file whose times are not settled is not worth reading ahead: it would not be kept. */
	if (ld->prefetch == KVS_PREFETCH_OFF || next * ld->shard_size >= rd->file_size || !rd->keep)
		return;
	pthread_mutex_lock(&ld->mu);
	struct recent *r = &ld->recent[ld->nrecent_next++ % RECENT];
	r->block = rd->block;
	r->dev = rd->dev;
	r->ino = rd->ino;
	r->next_shard = next;
	r->file_size = rd->file_size;
	r->direct = rd->direct;
	r->fd = rd->fd;
	r->valid = true;
	pthread_mutex_unlock(&ld->mu);
}

/* Read ahead one remembered shard: pin it; if we own it, read it in the background. */
static void read_ahead(struct kvs_loader *ld, struct recent *r)
{
	struct kvs_key k = shard_key(&r->block, r->next_shard);
	struct prefetch_io *io = NULL;

	/* The anchor may name another file by now (the program moved on): then skip it.  The
	 * check after the read catches a change during it. */
	if (check_file(r->fd, r->dev, r->ino, &r->block) != V_KEEP)
		return;
	for (int i = 0; i < RECENT && !io; i++) {
		uint32_t idle = 0;

		/* Pairs with the release in prefetch_done(). */
		if (cas_acq_rel(&ld->pio[i].busy, &idle, 1))
			io = &ld->pio[i];
	}
	if (!io)
		return; /* every read-ahead slot is in flight */
	int res = kvs_cache_pin(ld->c, &k, KVS_ALLOC_PREFETCH, &io->pin);
	if (res != KVS_PIN_OWNER) {
		if (res >= 0)
			kvs_cache_release(ld->c, &io->pin);
		store_release(&io->busy, 0);
		return;
	}
	uint64_t off = r->next_shard * ld->shard_size;
	io->ld = ld;
	io->block = r->block;
	io->dev = r->dev;
	io->ino = r->ino;
	io->size =
	    (uint32_t)(r->file_size - off < ld->shard_size ? r->file_size - off : ld->shard_size);
	io->bio.fd = r->fd;
	io->bio.buf = kvs_cache_data(ld->c, &io->pin);
	io->bio.off = off;
	io->bio.len = r->direct ? round_page(io->size) : io->size;
	io->bio.done = prefetch_done;
	kvs_cache_count(ld->c, KVS_CTR_prefetches, 1);
	kvs_backend_submit(ld->be, &io->bio);
}

/* With the queue empty: act on one remembered task.  Called with ld->mu held; returns with it
 * held.  Returns true if there was something to do. */
static bool prefetch_one(struct kvs_loader *ld)
{
	for (uint32_t i = 0; i < RECENT; i++) {
		struct recent r = ld->recent[i];

		if (!r.valid)
			continue;
		ld->recent[i].valid = false;
		pthread_mutex_unlock(&ld->mu);
		if (ld->prefetch == KVS_PREFETCH_READ) {
			read_ahead(ld, &r);
		} else {
			struct kvs_key k = shard_key(&r.block, r.next_shard);
			kvs_cache_prealloc(ld->c, &k); /* counts prefetches itself */
		}
		pthread_mutex_lock(&ld->mu);
		return true;
	}
	return false;
}

static void dispatch_task(struct kvs_loader *ld, struct task *t)
{
	const struct kvs_read *rd = t->rd;

	order_ops(ld, t);
	for (uint32_t k = 0; k < t->nops; k++) {
		struct op *op = &t->ops[t->order[k]];

		if (op->kind == OP_DONE)
			continue;
		struct kvs_key key = shard_key(&rd->block, op->shard);
		int st = kvs_cache_lookup(ld->c, &key);

		/* Claim a shard only when we can read it now: an owner whose read waits behind its
		 * own queue would hold up every rank waiting for it, while another rank with room
		 * could have loaded it.  Shards others already load are pinned without waiting. */
		if (st != KVS_SLOT_READY && st != KVS_SLOT_LOADING)
			kvs_backend_wait_room(ld->be);
		int r = kvs_cache_pin(ld->c, &key, KVS_ALLOC_LOAD, &op->pin);

		op->kind = r >= 0 ? r : OP_SELF;
		if (r == KVS_PIN_OWNER)
			submit_owned(ld, rd, op);
	}
	remember(ld, t);
	kvs_spsc_push(&ld->running, t);
	kvs_cache_reap_maybe(ld->c); /* dead ranks' pins come back while we are busy */
}

static void *dispatch_main(void *arg)
{
	struct kvs_loader *ld = arg;

	pthread_mutex_lock(&ld->mu);
	for (;;) {
		while (!ld->qhead && !ld->stop) {
			if (!prefetch_one(ld))
				pthread_cond_wait(&ld->cond, &ld->mu);
		}
		if (!ld->qhead)
			break;
		struct task *t = ld->qhead;
		ld->qhead = t->next;
		if (!ld->qhead)
			ld->qtail = NULL;
		ld->qlen--;
		pthread_cond_broadcast(&ld->cond); /* room for a submitter */
		pthread_mutex_unlock(&ld->mu);
		dispatch_task(ld, t);
		pthread_mutex_lock(&ld->mu);
	}
	pthread_mutex_unlock(&ld->mu);
	kvs_spsc_push(&ld->running, NULL); /* stops the transfer thread */
	return NULL;
}

/* ------------------------------------------------------------------ transfer */

/* Read op's shard ourselves into the bounce buffer and copy the wanted part. */
static int read_self(struct kvs_loader *ld, struct task *t, struct op *op)
{
	const struct kvs_read *rd = t->rd;
	uint32_t want = op->from + op->len;
	uint32_t len = rd->direct ? round_page(want) : want;
	int64_t got;

	kvs_cache_count(ld->c, KVS_CTR_fallbacks, 1);
	got = kvs_read_full(rd->fd, ld->bounce, len, op->shard * ld->shard_size);
	kvs_cache_count(ld->c, KVS_CTR_backend_reads, 1);
	if (got < (int64_t)want)
		return got < 0 ? (int)got : -EIO;
	if (check_file(rd->fd, rd->dev, rd->ino, &rd->block) == V_WRONG_FILE)
		return -ESTALE;
	kvs_cache_count(ld->c, KVS_CTR_backend_bytes, (uint64_t)got);
	copy_out(rd, op->pos, (char *)ld->bounce + op->from, op->len);
	return 0;
}

/* Wait for a pinned op, copy it, release it.  Returns false if it must be read by us. */
static bool finish_pinned(struct kvs_loader *ld, struct task *t, struct op *op)
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
	if (ok && kvs_cache_length(c, &op->pin) >= op->from + op->len) {
		copy_out(t->rd, op->pos, (char *)kvs_cache_data(c, &op->pin) + op->from, op->len);
		kvs_cache_count(c, KVS_CTR_copy_bytes, op->len);
	} else {
		ok = false;
	}
	if (ld->backend_only && op->kind == OP_OWNER)
		kvs_cache_mark_not_ready(c, &op->pin);
	kvs_cache_release(c, &op->pin);
	return ok;
}

static void complete(struct task *t, int64_t result)
{
	t->result = result;
	store_release(&t->done, 1); /* pairs with the acquire load in kvs_loader_read() */
	kvs_futex_wake(&t->done, 1, false);
}

static void *transfer_main(void *arg)
{
	struct kvs_loader *ld = arg;
	struct task *t;

	while ((t = kvs_spsc_pop(&ld->running))) {
		int64_t result = 0;

		for (uint32_t k = 0; k < t->nops; k++) {
			struct op *op = &t->ops[t->order[k]];

			if (op->kind == OP_DONE)
				continue;
			if (op->kind != OP_SELF && finish_pinned(ld, t, op))
				continue;
			int r = result ? 0 : read_self(ld, t, op);
			if (r)
				result = r;
		}
		complete(t, result);
	}
	return NULL;
}

/* ------------------------------------------------------------------ calling thread */

/* Serve bytes [off, off + len) of rd's request, which span at most STACK_OPS shards, so that
 * the task and its ops live on this thread's stack.  Returns 0 or -errno. */
static int64_t serve_chunk(struct kvs_loader *ld, const struct kvs_read *rd, uint64_t off,
			   uint64_t len)
{
	struct op ops[STACK_OPS];
	uint32_t order[STACK_OPS];
	struct task t = {.rd = rd, .ops = ops, .order = order};
	uint64_t S = ld->shard_size;
	uint64_t first = off / S, last = (off + len - 1) / S;

	t.nops = (uint32_t)(last - first + 1);
	/* Serve what is READY now on this thread: no hand-off costs more than these copies. */
	uint32_t left = 0;
	for (uint32_t i = 0; i < t.nops; i++) {
		struct op *op = &t.ops[i];
		uint64_t sh = first + i, start = sh * S;
		uint64_t from = off > start ? off - start : 0;
		uint64_t end = off + len < start + S ? off + len - start : S;

		op->rd = rd;
		op->shard = sh;
		op->from = (uint32_t)from;
		op->len = (uint32_t)(end - from);
		op->pos = start + from - rd->off;
		op->size = (uint32_t)(rd->file_size - start < S ? rd->file_size - start : S);
		op->kind = OP_SELF;
		struct kvs_key key = shard_key(&rd->block, sh);
		if (!ld->backend_only &&
		    kvs_cache_pin_ready(ld->c, &key, &op->pin) == KVS_PIN_HIT) {
			bool whole = kvs_cache_length(ld->c, &op->pin) >= op->from + op->len;

			if (whole) {
				copy_out(rd, op->pos,
					 (char *)kvs_cache_data(ld->c, &op->pin) + op->from,
					 op->len);
				kvs_cache_count(ld->c, KVS_CTR_shards_hit, 1);
				kvs_cache_count(ld->c, KVS_CTR_copy_bytes, op->len);
				op->kind = OP_DONE;
			}
			kvs_cache_release(ld->c, &op->pin);
			if (whole)
				continue;
		}
		left++;
	}
	if (left == 0)
		return 0;

	pthread_mutex_lock(&ld->mu);
	while (ld->qlen >= ld->qmax && !ld->stop)
		pthread_cond_wait(&ld->cond, &ld->mu);
	if (ld->stop) {
		pthread_mutex_unlock(&ld->mu);
		return -ESHUTDOWN;
	}
	if (ld->qtail)
		ld->qtail->next = &t;
	else
		ld->qhead = &t;
	ld->qtail = &t;
	ld->qlen++;
	pthread_cond_broadcast(&ld->cond);
	pthread_mutex_unlock(&ld->mu);

	while (!load_acquire(&t.done)) /* pairs with complete() */
		kvs_futex_wait(&t.done, 0, 0, false);
	if (t.result)
		kvs_cache_count(ld->c, KVS_CTR_fallbacks, 1);
	return t.result;
}

int64_t kvs_loader_read(struct kvs_loader *ld, const struct kvs_read *rd)
{
	uint64_t S = ld->shard_size, len, off, end;

	if (rd->off >= rd->file_size || rd->len == 0)
		return 0;
	len = rd->file_size - rd->off < rd->len ? rd->file_size - rd->off : rd->len;
	if (len > (uint64_t)INT64_MAX / 2)
		return -EOVERFLOW;
	kvs_cache_count(ld->c, KVS_CTR_requests, 1);
	/* A long read goes as several tasks of at most STACK_OPS shards, one after the other. */
	for (off = rd->off, end = rd->off + len; off < end;) {
		uint64_t stop = (off / S + STACK_OPS) * S;

		if (stop > end)
			stop = end;
		int64_t r = serve_chunk(ld, rd, off, stop - off);
		if (r < 0)
			return r;
		off = stop;
	}
	return (int64_t)len;
}

/* ------------------------------------------------------------------ life */

int kvs_loader_create(struct kvs_cache *c, const struct kvs_config *cfg, struct kvs_loader **out)
{
	struct kvs_loader *ld = calloc(1, sizeof(*ld));
	uint32_t ring = 2;
	int r;

	if (!ld)
		return -ENOMEM;
	ld->c = c;
	ld->shard_size = kvs_cache_shard_size(c);
	ld->cfg_rank = cfg->loader_local_rank;
	ld->cfg_nranks = cfg->loader_local_rank_size;
	ld->rotate = cfg->loader_rotate;
	ld->backend_only = cfg->loader_backend_only;
	ld->prefetch = cfg->loader_prefetch;
	ld->wait_timeout_ns = cfg->loader_wait_timeout_ms * 1000000ull;
	ld->qmax = (uint32_t)cfg->loader_waiting_queue_depth;
	for (int i = 0; i < RECENT; i++)
		ld->recent[i].fd = -1;
	pthread_mutex_init(&ld->mu, NULL);
	pthread_cond_init(&ld->cond, NULL);
	while (ring < cfg->loader_running_queue_depth && ring < (1u << 20))
		ring <<= 1;
	r = -ENOMEM;
	if (kvs_spsc_init(&ld->running, ring))
		goto err;
	if (posix_memalign(&ld->bounce, KVS_PAGE_SZ, ld->shard_size)) {
		ld->bounce = NULL;
		goto err;
	}
	r = kvs_backend_create(cfg->loader_io, (unsigned)cfg->loader_io_depth, &ld->be);
	if (r)
		goto err;
	r = kvs_thread_start(&ld->transfer_thread, transfer_main, ld);
	if (r)
		goto err;
	ld->transfer_started = true;
	r = kvs_thread_start(&ld->dispatch_thread, dispatch_main, ld);
	if (r)
		goto err;
	ld->dispatch_started = true;
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
	if (ld->dispatch_started)
		pthread_join(ld->dispatch_thread, NULL);
	else if (ld->transfer_started)
		kvs_spsc_push(&ld->running, NULL);
	if (ld->transfer_started)
		pthread_join(ld->transfer_thread, NULL);
	kvs_backend_destroy(ld->be); /* waits for read-aheads in flight */
	kvs_spsc_free(&ld->running);
	free(ld->bounce);
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
