/*
 * prefetch: the shard after a recent read (see prefetch.h).
 *
 * DESIGN
 *
 * Readers note a read (kvs_prefetch_note: under mu, the file and the shard after the read go
 * into recent[], overwriting the oldest) and signal cond.  The thread takes one valid entry at
 * a time, drops mu, and acts on its copy: "alloc" preallocates the slot; "read" pins it and,
 * when it owns it, submits a storage read from the io[] pool, whose completion (on a backend
 * thread) publishes the slot, releases the pin and frees the pool entry.
 *
 * io[].busy: taken by the thread with an acquire CAS, given back by the completion with a
 * release store, so the completion's writes to the entry are seen by its next user.  Nothing
 * else is shared: recent[] is only touched under mu.
 */
#include <errno.h>
#include <stddef.h>

#include "atomics.h"
#include "config.h"
#include "loader.h"
#include "prefetch.h"
#include "publish.h"
#include "sys.h"

#define KVS_PAGE_SZ 4096u

void kvs_prefetch_note(struct kvs_prefetcher *pf, const struct kvs_read *rd, uint64_t last)
{
	uint64_t next = last + 1;

	if (!pf->started || next * pf->shard_size >= rd->file_size)
		return;
	pthread_mutex_lock(&pf->mu);
	struct kvs_recent *r = &pf->recent[pf->next++ % KVS_PREFETCH_RECENT];
	r->block = rd->block;
	r->dev = rd->dev;
	r->ino = rd->ino;
	r->write_once = rd->write_once;
	r->next_shard = next;
	r->file_size = rd->file_size;
	r->direct = rd->direct;
	r->fresh = rd->fresh;
	r->fd = rd->fd;
	r->valid = true;
	pthread_cond_signal(&pf->cond);
	pthread_mutex_unlock(&pf->mu);
}

static void read_ahead_done(struct kvs_bio *bio)
{
	struct kvs_prefetch_io *io = (struct kvs_prefetch_io *)bio;
	struct kvs_cache *c = io->pf->c;

	kvs_cache_count(c, KVS_CTR_backend_reads, 1);
	if (bio->result >= (int64_t)io->size) {
		kvs_cache_count(c, KVS_CTR_backend_bytes, io->size);
		kvs_publish_loaded(
		    c, &io->pin,
		    kvs_check_file(bio->fd, io->dev, io->ino, io->write_once, &io->block), io->size,
		    &io->keep);
	} else {
		kvs_cache_mark_failed(c, &io->pin, bio->result < 0 ? (int)-bio->result : EIO);
	}
	kvs_cache_release(c, &io->pin);
	store_release(&io->busy, 0); /* pairs with the acquire CAS in read_ahead() */
}

/* Read ahead one remembered shard: pin it; if we own it, read it in the background. */
static void read_ahead(struct kvs_prefetcher *pf, const struct kvs_recent *r)
{
	struct kvs_key k = kvs_shard_key(&r->block, r->next_shard);
	struct kvs_prefetch_io *io = NULL;

	/* The anchor may name another file by now (the program moved on): then skip it.  The
	 * check after the read catches a change during it. */
	if (kvs_check_file(r->fd, r->dev, r->ino, r->write_once, &r->block) != KVS_V_KEEP)
		return;
	for (int i = 0; i < KVS_PREFETCH_RECENT && !io; i++) {
		uint32_t idle = 0;

		/* Pairs with the release in read_ahead_done(). */
		if (cas_acq_rel(&pf->io[i].busy, &idle, 1))
			io = &pf->io[i];
	}
	if (!io)
		return; /* every read-ahead entry is in flight */
	io->keep = kvs_keep_for(pf->c, &r->block, &r->fresh, r->dev, r->ino);
	uint64_t off = r->next_shard * pf->shard_size;
	uint64_t size = kvs_shard_bytes(r->file_size, off, pf->shard_size);
	int res = kvs_cache_pin_load(pf->c, &k, KVS_ALLOC_PREFETCH, (uint32_t)size, io->keep.until,
				     &io->pin);
	if (res != KVS_PIN_OWNER) {
		if (res >= 0)
			kvs_cache_release(pf->c, &io->pin);
		store_release(&io->busy, 0);
		return;
	}
	io->pf = pf;
	io->block = r->block;
	io->dev = r->dev;
	io->ino = r->ino;
	io->write_once = r->write_once;
	io->size = (uint32_t)size;
	io->bio.fd = r->fd;
	io->bio.buf = kvs_cache_data(pf->c, &io->pin);
	io->bio.off = off;
	io->bio.len = r->direct ? (io->size + KVS_PAGE_SZ - 1) & ~(KVS_PAGE_SZ - 1) : io->size;
	if (io->bio.len > kvs_cache_room(pf->c, &io->pin))
		io->bio.len = kvs_cache_room(pf->c, &io->pin); /* a slot of another size: short */
	io->bio.done = read_ahead_done;
	kvs_cache_count(pf->c, KVS_CTR_prefetches, 1);
	kvs_backend_submit(pf->be, &io->bio);
}

static void *prefetch_main(void *arg)
{
	struct kvs_prefetcher *pf = arg;

	pthread_mutex_lock(&pf->mu);
	while (!pf->stop) {
		struct kvs_recent r = {.valid = false};

		for (uint32_t i = 0; i < KVS_PREFETCH_RECENT && !r.valid; i++) {
			if (pf->recent[i].valid) {
				r = pf->recent[i];
				pf->recent[i].valid = false;
			}
		}
		if (!r.valid) {
			pthread_cond_wait(&pf->cond, &pf->mu);
			continue;
		}
		pthread_mutex_unlock(&pf->mu);
		if (pf->mode == KVS_PREFETCH_READ) {
			read_ahead(pf, &r);
		} else {
			struct kvs_key k = kvs_shard_key(&r.block, r.next_shard);
			uint64_t size = kvs_shard_bytes(r.file_size, r.next_shard * pf->shard_size,
							pf->shard_size);
			kvs_cache_prealloc(pf->c, &k,
					   (uint32_t)size); /* counts prefetches itself */
		}
		pthread_mutex_lock(&pf->mu);
	}
	pthread_mutex_unlock(&pf->mu);
	return NULL;
}

int kvs_prefetch_start(struct kvs_prefetcher *pf, struct kvs_cache *c, struct kvs_backend *be,
		       int mode, uint64_t shard_size)
{
	pf->c = c;
	pf->be = be;
	pf->mode = mode;
	pf->shard_size = shard_size;
	pthread_mutex_init(&pf->mu, NULL);
	pthread_cond_init(&pf->cond, NULL);
	for (int i = 0; i < KVS_PREFETCH_RECENT; i++)
		pf->recent[i].fd = -1;
	if (mode == KVS_PREFETCH_OFF)
		return 0;
	int r = kvs_thread_start(&pf->thread, prefetch_main, pf, KVS_STACK_OWN);
	if (r == 0)
		pf->started = true;
	return r;
}

void kvs_prefetch_stop(struct kvs_prefetcher *pf)
{
	if (!pf->started)
		return;
	pthread_mutex_lock(&pf->mu);
	pf->stop = true;
	pthread_cond_signal(&pf->cond);
	pthread_mutex_unlock(&pf->mu);
	pthread_join(pf->thread, NULL);
	pf->started = false;
}
