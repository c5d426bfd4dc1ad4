/*
 * serve_stream: cuFileReadAsync, reads ordered on the program's stream (design.md,
 * "cuFileReadAsync: stream order").  The copies from the slots go on the program's stream, so
 * they must not read a slot before its shard is READY, and nothing may block the driver's
 * host-function thread (host functions of every stream of the process may share it).  After the
 * pins, one of two orders:
 *
 *   SETTLED  every shard was READY at the pin, or there is no other way: the calling thread
 *            settles (kvs_loader_settle; for hits it waits for nothing), then enqueues the
 *            copies, which may read the slots whenever the driver likes;
 *   GATED    a miss, and copies that read their sources in stream order (cuMemcpyBatchAsync
 *            with CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, or cuMemcpyHtoDAsync from slots pinned
 *            by one registration each): a gate (gpu.h) on the stream first, then the copies;
 *            the settler thread settles and raises the gate; the stream goes on then.
 *
 * Last on the stream in both, stream_done: a host function that only releases, counts and
 * reports (it never blocks).  Once anything is on the stream the rest must follow (nothing
 * can be taken back), so a later failure becomes the read's error; before that, a failure
 * passes the read through.
 *
 * The settler: one thread per process, started with the first GATED read, that settles the
 * reads queued to it (settle_head/tail under settle_mu, signalled on settle_cond) one after
 * the other; their loads are in flight already, so it mostly waits.  It writes only
 * sr->settle_err, then raises the gate (release), and touches sr no more: stream_done, which
 * runs only after the stream is past the gate, loads the gate (acquire) before it reads
 * settle_err, and frees sr.  The fork child forgets the queue and the thread, which it does
 * not have.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "anchor.h"
#include "attach.h"
#include "cache.h"
#include "config.h"
#include "cufile_types.h"
#include "device.h"
#include "fdinfo.h"
#include "loader.h"
#include "log.h"
#include "observe.h"
#include "serve.h"
#include "shim.h"
#include "sys.h"
#include "unserved.h"

/* A read on the program's stream: lives from the enqueue until stream_done. */
struct stream_read {
	struct kvs_shim_async a;
	ssize_t *bytes_read;
	int64_t result;		  /* what *bytes_read gets, unless settle_err */
	bool gated;		  /* GATED: gate is on the stream, the settler raises it */
	struct kvs_gpu_gate gate; /* GATED */
	int settle_err;		  /* written by the settler before the raise */
	struct stream_read *next; /* the settler's queue */
};

static pthread_mutex_t settle_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t settle_cond = PTHREAD_COND_INITIALIZER;
static struct stream_read *settle_head, *settle_tail; /* under settle_mu */
static bool settler_running;			      /* under settle_mu */

static void *settler(void *arg)
{
	(void)arg;
	(void)kvs_shim_in(); /* the shim's own thread, inside for its life */
	for (;;) {
		pthread_mutex_lock(&settle_mu);
		while (!settle_head)
			pthread_cond_wait(&settle_cond, &settle_mu);
		struct stream_read *sr = settle_head;
		settle_head = sr->next;
		if (!settle_head)
			settle_tail = NULL;
		pthread_mutex_unlock(&settle_mu);

		sr->settle_err = kvs_loader_settle(kvs_shim_loader, &sr->a.task);
		kvs_gpu_gate_raise(
		    &sr->gate); /* pairs with stream_done's load; sr is not ours now */
	}
	return NULL;
}

/* Is there a settler (started now if need be)? */
static bool settler_ready(void)
{
	pthread_mutex_lock(&settle_mu);
	if (!settler_running)
		settler_running = kvs_thread_start(NULL, settler, NULL, KVS_STACK_OWN) == 0;
	bool ok = settler_running;
	pthread_mutex_unlock(&settle_mu);
	return ok;
}

/* Queue sr for the settler (settler_ready said yes: it never stops). */
static void settle_later(struct stream_read *sr)
{
	sr->next = NULL;
	pthread_mutex_lock(&settle_mu);
	if (settle_tail)
		settle_tail->next = sr;
	else
		settle_head = sr;
	settle_tail = sr;
	pthread_cond_signal(&settle_cond);
	pthread_mutex_unlock(&settle_mu);
}

void kvs_stream_atfork_child(void)
{
	pthread_mutex_init(&settle_mu, NULL);
	pthread_cond_init(&settle_cond, NULL);
	settle_head = settle_tail = NULL; /* the parent's reads, on the parent's streams */
	settler_running = false;
}

/* Last on the stream: the copies are over; release, count and report.  Never blocks. */
static void stream_done(void *arg)
{
	struct stream_read *sr = arg;

	if (sr->gated) {
		/* pairs with the raise: settle_err is the settler's last word */
		(void)atomic_load_explicit(sr->gate.word, memory_order_acquire);
		if (sr->settle_err && sr->result >= 0)
			sr->result = sr->settle_err;
		kvs_device_gate_release(&sr->a.tg, &sr->gate);
	}
	kvs_loader_unpin(kvs_shim_loader, &sr->a.task);
	kvs_anchor_put(sr->a.rd.fd); /* a failed shard was read through it by the settle */
	if (sr->result >= 0) {
		kvs_cache_count(kvs_shim_cache, KVS_CTR_h2d_bytes, (uint64_t)sr->result);
		kvs_cache_count(kvs_shim_cache, KVS_CTR_cufile_requests, 1);
		kvs_observe_served(kvs_shim_cache, sr->a.rd.tally, (uint64_t)sr->result);
	} else {
		kvs_cache_count(kvs_shim_cache, KVS_CTR_failures, 1);
	}
	*sr->bytes_read = (ssize_t)sr->result;
	free(sr);
}

/* Is every slot of sr pinned by one registration (read by the driver in stream order)? */
static bool stream_pinned(struct stream_read *sr)
{
	for (uint32_t i = 0; i < kvs_loader_nops(&sr->a.task); i++) {
		const void *src;
		uint64_t pos;
		uint32_t len;

		kvs_loader_op(kvs_shim_loader, &sr->a.task, i, &src, &pos, &len);
		if (!kvs_device_pinned(&sr->a.tg, src, len))
			return false;
	}
	return true;
}

/* Enqueue sr's copies on stream: one batch (in_order or at the call), else, when plain is
 * allowed, one cuMemcpyHtoDAsync each.  Returns 0, or -errno with *queued saying whether any
 * may be on the stream. */
static int stream_copies(struct stream_read *sr, void *stream, bool batch, bool in_order,
			 bool plain, bool *queued)
{
	uint32_t n = kvs_loader_nops(&sr->a.task);
	uint64_t pos[KVS_TASK_OPS];
	const void *src[KVS_TASK_OPS];
	size_t len[KVS_TASK_OPS];

	*queued = false;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t l;

		kvs_loader_op(kvs_shim_loader, &sr->a.task, i, &src[i], &pos[i], &l);
		len[i] = l;
	}
	if (batch) {
		int r = kvs_device_stream_copies(&sr->a.tg, stream, n, pos, src, len, in_order);

		*queued = r != -ENOTSUP;
		if (r != -ENOTSUP || !plain)
			return r;
	}
	for (uint32_t i = 0; i < n; i++) {
		int r = kvs_device_stream_copy(&sr->a.tg, stream, pos[i], src[i], len[i]);

		if (r)
			return r;
		*queued = true;
	}
	return 0;
}

/* A cuFileReadAsync of fi's file (len bytes at off) passed to the real library: counted and
 * said.  Caller holds guard. */
static void stream_unserved(const struct kvs_fdinfo *fi, uint64_t off, uint64_t len)
{
	kvs_unserved(
	    KVS_CTR_unserved_stream, KVS_CAUSE_UNSERVED_STREAM,
	    "a cuFileReadAsync of a KV file on a stream not registered with fixed sizes and "
	    "offsets, into host memory, or longer than 16 shards",
	    fi, off, len);
}

void kvs_shim_note_stream(int fd, uint64_t off, uint64_t len)
{
	struct kvs_fdinfo fi;

	if (fd < 0 || !kvs_shim_wants(SIZE_MAX))
		return;
	int saved = kvs_shim_in();
	if (kvs_fdinfo_get(fd, &fi) == 0 && fi.kv)
		stream_unserved(&fi, off, len);
	kvs_shim_out(saved);
}

int kvs_shim_read_to_stream(int fd, uint64_t ptr, size_t size, off_t off, ssize_t *bytes_read,
			    void *stream)
{
	int saved = errno, cancel_state, ret = -1, anchor = -1;
	struct stream_read *sr = calloc(1, sizeof(*sr));

	if (!sr || !bytes_read)
		goto out_free;
	(void)kvs_shim_in(); /* errno is kept from the entry, before calloc */
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
	if (kvs_serve_cufile_prepare(&sr->a, fd, ptr, size, off))
		goto out;
	anchor = sr->a.rd.fd; /* held until stream_done, or put on the way out */
	/* A capturing stream runs what is enqueued at every launch of its graph, after the
	 * first has freed sr: not a read the shim can serve (nor one it can ask about). */
	if (sr->a.tg.host || kvs_device_stream_capturing(&sr->a.tg, stream) != 0) {
		struct kvs_fdinfo fi = kvs_serve_fi_of(&sr->a.rd);

		stream_unserved(&fi, sr->a.rd.off, sr->a.rd.len);
		goto out;
	}
	int r = kvs_loader_pin(kvs_shim_loader, &sr->a.task, &sr->a.rd);
	if (r == -E2BIG) {
		struct kvs_fdinfo fi = kvs_serve_fi_of(&sr->a.rd);

		/* longer than a task's shards: the stream is the library's */
		stream_unserved(&fi, sr->a.rd.off, sr->a.rd.len);
		goto out;
	} else if (r) {
		kvs_serve_fell_back(fd, &sr->a.rd, r);
		goto out;
	}
	sr->bytes_read = bytes_read;
	sr->result = (int64_t)(sr->a.task.end - sr->a.rd.off);

	bool batch = kvs_device_has_batch(&sr->a.tg);
	bool pinned = stream_pinned(sr);
	if (!kvs_loader_pinned_ready(&sr->a.task) && (batch || pinned) && settler_ready() &&
	    kvs_device_gate_wait(&sr->a.tg, stream, &sr->gate) == 0) {
		sr->gated = true;
	} else if ((r = kvs_loader_settle(kvs_shim_loader, &sr->a.task))) {
		kvs_loader_unpin(kvs_shim_loader,
				 &sr->a.task); /* nothing on the stream: pass through */
		kvs_serve_fell_back(fd, &sr->a.rd, r);
		goto out;
	}
	/* GATED: in stream order (batch, else pinned slots).  SETTLED: the slots are READY, so
	 * any order: pinned slots by DMA, else a batch that reads them during the call without
	 * waiting for the stream (a pageable cuMemcpyHtoDAsync may wait for it first). */
	bool queued;
	r = stream_copies(sr, stream, sr->gated ? batch : batch && !pinned, sr->gated,
			  !sr->gated || pinned, &queued);
	if (r && !queued && !sr->gated) {
		kvs_loader_unpin(kvs_shim_loader,
				 &sr->a.task); /* nothing on the stream: pass through */
		kvs_serve_fell_back(fd, &sr->a.rd, r);
		goto out;
	}
	if (r)
		sr->result = -KVS_CU_FILE_CUDA_DRIVER_ERROR;
	bool gated = sr->gated;
	if (kvs_device_stream_func(&sr->a.tg, stream, stream_done, sr)) {
		/* Cannot happen after the first enqueue worked, short of a dying context: the
		 * pins stay until the process exits, and the reaper returns them then. */
		kvs_log_once(KVS_CAUSE_CUFILE, KVS_LOG_WARN,
			     "cuFileReadAsync: the driver refused a host function; pins kept");
		if (gated)
			sr->gated = false; /* stream_done will not run: nothing reads it */
	}
	/* From here on sr belongs to stream_done (and, GATED, to the settler until it raises
	 * the gate): not touched again. */
	if (gated)
		settle_later(sr);
	sr = NULL;
	ret = 0;
	anchor = -1; /* stream_done puts it, or the pins keep it */
out:
	kvs_anchor_put(anchor);
	pthread_setcancelstate(cancel_state, NULL);
	kvs_shim_out(saved);
out_free:
	free(sr);
	errno = saved;
	return ret;
}
