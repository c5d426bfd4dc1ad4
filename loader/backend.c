/*
 * backend: storage reads (see backend.h).
 *
 * DESIGN.  Both kinds bound the reads in flight with one counter under be->mu; submitters
 * sleep on be->room while it is at depth.
 *   io_uring: submitters take be->mu to fill and submit SQEs (so any thread may submit); one
 *     reaper thread owns the completion queue, finishes short or interrupted reads
 *     synchronously (rare: end of file, signals) and calls done().
 *   threads:  depth worker threads pop bios from a list under be->mu and read synchronously.
 * Destroy waits until nothing is in flight, then stops the threads (a NOP with no bio for the
 * reaper, a flag and a broadcast for the workers).
 *
 * A failed submission.  io_uring_get_sqe hands out an entry of the SQ ring, and it stays
 * there until the kernel consumes it: if io_uring_submit fails (or consumes only entries
 * before ours), the read would reach the kernel with the next submit, after we have read it
 * synchronously and its buffer and bio have been reused.  So under be->mu, while our SQE is
 * still unconsumed (io_uring_sq_ready() > 0: no SQPOLL, so only io_uring_enter under be->mu
 * consumes), it is rewritten into a NOP whose user_data is IGNORE, which the reaper skips;
 * then the read is done on the submitting thread as before.
 *
 * The reaper never leaves on an error, only on the stop NOP: a reaper gone would leave every
 * read in flight undone and the loader's wait_io_done waiting for ever.  If
 * io_uring_wait_cqe fails other than with EINTR, it polls with io_uring_peek_cqe and a 1 ms
 * sleep instead, until a wait works again.
 */
#include <errno.h>
/* before liburing.h: see CMakeLists.txt.  The shim's own copy of liburing is renamed kvs_*;
 * the names the shim also exports (io_uring_submit, io_uring_queue_exit) are called by their
 * kvs_ names here, so that no reader takes them for the shim's hooks. */
#include "kvs_uring_names.h"
#include <liburing.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "backend.h"
#include "config.h"
#include "raw.h"
#include "sys.h"

struct kvs_backend {
	bool uring;
	unsigned depth;
	unsigned test_delay_us; /* kvs_backend_test_delay_us when created */
	bool test_fail_wait;	/* kvs_backend_test_fail_wait when created */
	pthread_mutex_t mu;
	pthread_cond_t room; /* in_flight dropped below depth, or became 0 */
	pthread_cond_t work; /* threads: a bio was queued, or stop */
	unsigned in_flight;
	bool stop;
	struct kvs_bio *head, *tail; /* threads: the queue */
	struct io_uring ring;
	unsigned nthreads;
	pthread_t threads[];
};

unsigned kvs_backend_test_delay_us;
unsigned kvs_backend_test_fail_submits;
unsigned kvs_backend_test_short_reads;
unsigned kvs_backend_test_fail_thread;
bool kvs_backend_test_fail_wait;

/* user_data of a NOP that stands in for a read whose submission failed: nothing to finish.
 * Distinct from NULL, the stop NOP's. */
#define IGNORE ((void *)&kvs_backend_test_fail_submits)

/* kvs_backend_test_short_reads cuts a read to a multiple of this (O_DIRECT alignment). */
#define KVS_TEST_SHORT 4096u

int64_t kvs_read_full(int fd, void *buf, uint64_t len, uint64_t off)
{
	uint64_t got = 0;

	while (got < len) {
		long n = kvs_syscall(SYS_pread64, fd, (char *)buf + got, len - got, off + got);

		if (n < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return got ? (int64_t)got : -errno;
		}
		if (n == 0)
			break;
		got += (uint64_t)n;
	}
	return (int64_t)got;
}

/* One read is over: give its room back, then tell its owner. */
static void finish(struct kvs_backend *be, struct kvs_bio *bio)
{
	pthread_mutex_lock(&be->mu);
	be->in_flight--;
	pthread_cond_broadcast(&be->room);
	pthread_mutex_unlock(&be->mu);
	bio->done(bio);
}

static void *reaper(void *arg)
{
	struct kvs_backend *be = arg;

	for (;;) {
		struct io_uring_cqe *cqe;
		int r = be->test_fail_wait ? -EIO : io_uring_wait_cqe(&be->ring, &cqe);

		if (r == -EINTR)
			continue;
		if (r < 0) {
			/* Unexpected: poll, so the reads in flight still finish. */
			if (io_uring_peek_cqe(&be->ring, &cqe)) {
				usleep(1000);
				continue;
			}
		}
		struct kvs_bio *bio = io_uring_cqe_get_data(cqe);
		int res = cqe->res;

		io_uring_cqe_seen(&be->ring, cqe);
		if (!bio)
			break; /* the stop NOP */
		if (bio == IGNORE)
			continue; /* stands in for a read done synchronously */
		if (be->test_delay_us)
			usleep(be->test_delay_us);
		/* The kernel orders the submitter's writes to bio before this completion; taking
		 * be->mu (which the submitter held) says so in a way race detectors can see. */
		pthread_mutex_lock(&be->mu);
		pthread_mutex_unlock(&be->mu);
		if (res == -EINTR || res == -EAGAIN) {
			bio->result = kvs_read_full(bio->fd, bio->buf, bio->len, bio->off);
		} else if (res < 0) {
			bio->result = res;
		} else if ((uint32_t)res < bio->len && res > 0) {
			/* Short: continue synchronously until end of file or error. */
			int64_t more =
			    kvs_read_full(bio->fd, (char *)bio->buf + res, bio->len - (uint32_t)res,
					  bio->off + (uint32_t)res);
			bio->result = more < 0 ? res : res + more;
		} else {
			bio->result = res;
		}
		finish(be, bio);
	}
	return NULL;
}

static void *worker(void *arg)
{
	struct kvs_backend *be = arg;

	pthread_mutex_lock(&be->mu);
	for (;;) {
		while (!be->head && !be->stop)
			pthread_cond_wait(&be->work, &be->mu);
		if (!be->head)
			break;
		struct kvs_bio *bio = be->head;
		be->head = bio->next;
		if (!be->head)
			be->tail = NULL;
		pthread_mutex_unlock(&be->mu);
		if (be->test_delay_us)
			usleep(be->test_delay_us);
		bio->result = kvs_read_full(bio->fd, bio->buf, bio->len, bio->off);
		finish(be, bio);
		pthread_mutex_lock(&be->mu);
	}
	pthread_mutex_unlock(&be->mu);
	return NULL;
}

/* Start the threads of a backend; returns 0 or -errno. */
static int start_threads(struct kvs_backend *be, unsigned n, void *(*fn)(void *))
{
	int r = 0;

	for (be->nthreads = 0; be->nthreads < n && !r; be->nthreads += !r) {
		if (kvs_backend_test_fail_thread && --kvs_backend_test_fail_thread == 0)
			r = -EAGAIN;
		else
			r = kvs_thread_start(&be->threads[be->nthreads], fn, be, KVS_STACK_OWN);
	}
	return r;
}

int kvs_backend_create(int mode, unsigned depth, struct kvs_backend **out)
{
	struct kvs_backend *be;
	int r = -ENOSYS;

	if (depth == 0)
		depth = 1;
	be = calloc(1, sizeof(*be) + sizeof(pthread_t) * depth);
	if (!be)
		return -ENOMEM;
	be->depth = depth;
	be->test_delay_us = kvs_backend_test_delay_us;
	be->test_fail_wait = kvs_backend_test_fail_wait;
	pthread_mutex_init(&be->mu, NULL);
	pthread_cond_init(&be->room, NULL);
	pthread_cond_init(&be->work, NULL);
	/* auto means threads.  The kernel does not wait, when a process is SIGKILLed, for the
	 * io_uring reads it has in flight (only "tracked" requests are waited for at exit): an
	 * O_DIRECT read can land in a slot after the dead owner was reclaimed and the slot reused
	 * for another key, which the soak showed as another shard's bytes.  A thread in pread
	 * holds the process, and so its liveness lock, until its read is done. */
	if (mode == KVS_IO_URING) {
		r = io_uring_queue_init(depth < 4096 ? depth : 4096, &be->ring, 0);
		if (r == 0) {
			be->uring = true;
			r = start_threads(be, 1, reaper);
			if (r == 0)
				goto out;
			/* Could not start the reaper: nothing is in flight, so just leave. */
			kvs_io_uring_queue_exit(&be->ring);
			be->uring = false;
		}
		if (mode == KVS_IO_URING)
			goto err;
	}
	r = start_threads(be, depth, worker);
	if (r) {
		kvs_backend_destroy(be);
		return r;
	}
out:
	*out = be;
	return 0;
err:
	pthread_cond_destroy(&be->work);
	pthread_cond_destroy(&be->room);
	pthread_mutex_destroy(&be->mu);
	free(be);
	return r;
}

void kvs_backend_wait_room(struct kvs_backend *be)
{
	pthread_mutex_lock(&be->mu);
	while (be->in_flight >= be->depth)
		pthread_cond_wait(&be->room, &be->mu);
	pthread_mutex_unlock(&be->mu);
}

void kvs_backend_submit(struct kvs_backend *be, struct kvs_bio *bio)
{
	bio->got = 0;
	bio->next = NULL;
	pthread_mutex_lock(&be->mu);
	while (be->in_flight >= be->depth)
		pthread_cond_wait(&be->room, &be->mu);
	be->in_flight++;
	if (be->uring) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&be->ring);

		if (sqe) {
			uint32_t len = bio->len;

			if (kvs_backend_test_short_reads && len > KVS_TEST_SHORT) {
				kvs_backend_test_short_reads--; /* as if storage stopped halfway */
				len = (len / 2 + KVS_TEST_SHORT - 1) / KVS_TEST_SHORT *
				      KVS_TEST_SHORT;
			}
			io_uring_prep_read(sqe, bio->fd, bio->buf, len, bio->off);
			io_uring_sqe_set_data(sqe, bio);
			if (kvs_backend_test_fail_submits)
				kvs_backend_test_fail_submits--; /* as if io_uring_enter failed */
			else
				kvs_io_uring_submit(&be->ring);
			/* Ours is the newest SQE: consumed iff none is left. */
			if (io_uring_sq_ready(&be->ring) == 0) {
				pthread_mutex_unlock(&be->mu);
				return;
			}
			/* Not consumed: the kernel must never see this read. */
			io_uring_prep_nop(sqe);
			io_uring_sqe_set_data(sqe, IGNORE);
		}
		/* No SQE or the submit failed: read on this thread instead. */
		pthread_mutex_unlock(&be->mu);
		bio->result = kvs_read_full(bio->fd, bio->buf, bio->len, bio->off);
		finish(be, bio);
		return;
	}
	if (be->tail)
		be->tail->next = bio;
	else
		be->head = bio;
	be->tail = bio;
	pthread_cond_signal(&be->work);
	pthread_mutex_unlock(&be->mu);
}

/* Queue the NOP that stops the reaper and see the kernel take it, retrying for about a second.
 * Caller holds be->mu.  Returns whether it was taken. */
static bool send_stop(struct kvs_backend *be)
{
	bool queued = false;

	for (int tries = 0; tries < 1000; tries++) {
		if (!queued) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&be->ring);

			if (sqe) {
				io_uring_prep_nop(sqe);
				io_uring_sqe_set_data(sqe, NULL);
				queued = true;
			}
		}
		kvs_io_uring_submit(&be->ring);
		if (queued && io_uring_sq_ready(&be->ring) == 0)
			return true;
		usleep(1000);
	}
	return false;
}

void kvs_backend_destroy(struct kvs_backend *be)
{
	if (!be)
		return;
	pthread_mutex_lock(&be->mu);
	while (be->in_flight)
		pthread_cond_wait(&be->room, &be->mu);
	be->stop = true;
	if (be->uring && be->nthreads && !send_stop(be)) {
		/* The reaper leaves only on the stop NOP: without it, joining would hang.  Leave
		 * the reaper and what it uses alone (a leak, never a hang). */
		pthread_mutex_unlock(&be->mu);
		return;
	}
	pthread_cond_broadcast(&be->work);
	pthread_mutex_unlock(&be->mu);
	for (unsigned i = 0; i < be->nthreads; i++)
		pthread_join(be->threads[i], NULL);
	if (be->uring)
		kvs_io_uring_queue_exit(&be->ring);
	pthread_cond_destroy(&be->work);
	pthread_cond_destroy(&be->room);
	pthread_mutex_destroy(&be->mu);
	free(be);
}

const char *kvs_backend_name(const struct kvs_backend *be)
{
	return be->uring ? "io_uring" : "threads";
}

void kvs_backend_forget(struct kvs_backend *be)
{
	if (be && be->uring) {
		kvs_io_uring_queue_exit(&be->ring);
		be->uring = false;
	}
}
