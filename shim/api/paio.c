/*
 * paio: the engine of glibc's POSIX asynchronous I/O served by the cache (issue 8;
 * docs/design.md, "POSIX aio (`api/paio.c`)"), below its doors (hooks/posix_aio.c: the aio_ and
 * lio_listio names, one call each into kvs_paio_*).
 *
 * DESIGN.  aio_read (and each LIO_READ entry of lio_listio) that the cache can serve starts in
 * the loader (kvs_shim_read_start) and completes on its completion thread; every other request
 * goes to glibc's own aio and stays glibc's (a write to a KV file is first invalidated and
 * noted for write-through, api/paio_write.c: "Writes", in a table of its own, paio_wtable).  The
 * shim keeps a table of the served requests *in flight* only, keyed by the caller's aiocb.  At
 * completion it writes the result into the aiocb's own __return_value and __error_code, exactly the
 * two fields glibc's completion writes and glibc's aio_error and aio_return read, then removes the
 * request from the table.  From then on the aiocb is indistinguishable from one glibc
 * completed: aio_error, aio_return, aio_suspend and aio_cancel on it go to glibc and answer
 * right (0 at once, AIO_ALLDONE), and nothing is left behind for a caller that never calls
 * aio_return.  The table so answers one question, "is this aiocb a served read still running?",
 * and the hooks ask it only while any served read is running (paio_inflight, read without the
 * lock).
 *
 * A served read whose load fails is read with the real pread on the completion thread, so it
 * completes as it would have.  Notification (the aiocb's sigevent, copied at submission, and
 * lio_listio's list-wide sig) happens after the result is published: SIGEV_SIGNAL as glibc
 * sends it (rt_sigqueueinfo, si_code SI_ASYNCIO), SIGEV_THREAD on a new detached thread that
 * starts with every signal blocked, as glibc's helper does.
 *
 * lio_listio: served entries are started first; the others (writes, after invalidating the
 * shards they change; LIO_NOP; reads not served) go to the real lio_listio in one call, in
 * their order.  A group counts what is outstanding: one hold by the caller, each served entry,
 * and the real part as one (glibc tells us with a SIGEV_THREAD of ours when its part is done;
 * that function blocks every signal on glibc's notification thread before it may notify, so
 * the list-wide signal is never delivered to the thread that sends it).  LIO_WAIT waits for the
 * real part in the real call, then for the served entries on paio_cond.
 *
 * Locks: paio_mu guards both tables (and the write notes' pool), every group's fields and
 * paio_inflight's writes; paio_cond is broadcast on every served completion (aio_suspend and
 * LIO_WAIT wait on it). paio_mu is never held across a call into glibc's aio, the loader or a
 * notification.  paio_inflight is read without paio_mu by the hooks' fast path: a served request is
 * in the table (paio_inflight > 0, store under paio_mu) before aio_read returns, so a caller that
 * asks about its own aiocb after submitting sees it.  paio_mu is taken only with the shim's guard
 * held (paio_lock), by every thread, and aio_error, aio_return, aio_suspend and close
 * (async-signal-safe) do nothing but the real call inside the shim, so a signal handler never waits
 * for paio_mu held by the thread it interrupted; they allocate nothing (the write notes' pool,
 * aio_suspend's list on the stack or mapped).
 *
 * Files (their shared state and calls: api/paio_int.h): this one holds the entry points but
 * aio_write (aio_read, aio_error, aio_return, the waits of aio_suspend and LIO_WAIT,
 * aio_cancel, lio_listio); api/paio_serve.c the served reads, their completion, notification
 * and lio_listio's groups; api/paio_write.c the writes and their notes (aio_write, the close
 * rule); api/paio_table.c the two tables, paio_mu, paio_cond and the fork rule;
 * api/paio_real.c glibc's functions.
 */
#include <aio.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "deadline.h"
#include "paio.h"
#include "paio_int.h"
#include "raw.h"
#include "shim.h"

/* ------------------------------------------------------------------ the hooks */

int kvs_paio_read(int v, struct aiocb *cb)
{
	if (paio_candidate(cb) && paio_serve(cb, NULL) == 0)
		return 0;
	return paio_real_read(v, cb);
}

/* aio_error and aio_return are async-signal-safe: inside the shim (a handler that interrupted
 * it), the real call alone; else only the shim's own locks, and no memory allocated or freed. */
int kvs_paio_error(int v, const struct aiocb *cb)
{
	bool running = false;

	if (kvs_shim_inside())
		return paio_real_error(v, cb);
	if (cb && paio_busy()) {
		paio_lock();
		running = paio_find(cb) != NULL;
		paio_unlock();
	}
	if (running)
		return EINPROGRESS;
	int r = paio_real_error(v, cb);
	if (r != EINPROGRESS && cb && atomic_load_explicit(&paio_wpending, memory_order_relaxed)) {
		int saved = errno;

		/* glibc's aio_return only reads the result: asking it here changes nothing. */
		paio_write_seen(cb, r == 0 ? paio_real_return(v, (struct aiocb *)cb) : -1);
		errno = saved;
	}
	return r;
}

/* A completed served aiocb holds its result where glibc's aio_return reads it; a running one
 * has none yet (POSIX leaves the value undefined): -1, EINPROGRESS. */
ssize_t kvs_paio_return(int v, struct aiocb *cb)
{
	bool running = false;

	if (kvs_shim_inside())
		return paio_real_return(v, cb);
	if (cb && paio_busy()) {
		paio_lock();
		running = paio_find(cb) != NULL;
		paio_unlock();
	}
	if (running) {
		errno = EINPROGRESS;
		return -1;
	}
	ssize_t n = paio_real_return(v, cb);
	if (cb && atomic_load_explicit(&paio_wpending, memory_order_relaxed)) {
		int saved = errno;

		paio_write_seen(cb, n);
		errno = saved;
	}
	return n;
}

#define SLICE_NS      500000ull /* a mixed aio_suspend alternates glibc's wait and ours */
#define SUSPEND_LOCAL 64	/* aiocbs of an aio_suspend list kept on the stack */
#define SPINS	      20	/* yields before the first sleep on paio_cond */

/*
 * aio_suspend over served and glibc's aiocbs.  With no served one running in the list, it is
 * glibc's call (with the aiocbs not ours, which are all of them).  Otherwise: 0 as soon as a
 * listed served one is no longer in the table; served only: wait on paio_cond until the deadline;
 * mixed: glibc's aio_suspend on its aiocbs for a slice, then paio_cond for a slice.  A signal ends
 * glibc's slices with EINTR, which is returned; our waits on paio_cond do not see signals.
 */
int kvs_paio_suspend(int v, const struct aiocb *const list[], int nent,
		     const struct timespec *timeout)
{
	const struct aiocb **rest, *local[SUSPEND_LOCAL];
	uint64_t deadline = UINT64_MAX;
	int ret = -1, err = EAGAIN, spins = 0;

	/* Async-signal-safe: inside the shim (a handler that interrupted it), glibc's alone; else
	 * the list of glibc's aiocbs on the stack, or mapped for a long one (never malloc). */
	if (kvs_shim_inside() || !paio_busy() || !list || nent <= 0 ||
	    (timeout && (timeout->tv_nsec < 0 || timeout->tv_nsec >= 1000000000L)))
		return paio_real_suspend(v, list, nent, timeout);
	size_t rest_len = (size_t)nent * sizeof(*rest);
	rest = nent <= SUSPEND_LOCAL ? local
				     : kvs_sys_mmap(NULL, rest_len, PROT_READ | PROT_WRITE,
						    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (rest == MAP_FAILED)
		return paio_real_suspend(v, list, nent, timeout);
	deadline = kvs_deadline_ns(timeout);
	/* glibc adds the timeout to the monotonic clock's seconds, and one that overflows time_t
	 * ({LONG_MAX, 0}) fails the wait at once: EAGAIN unless a listed request is over already.
	 * The same here, where a served read is listed. */
	struct timespec mono;
	clock_gettime(CLOCK_MONOTONIC, &mono);
	bool glibc_overflows = timeout && timeout->tv_sec > LONG_MAX - mono.tv_sec - 1;
	for (;;) {
		int nreal = 0, served = 0;

		paio_lock();
		for (int i = 0; i < nent; i++) {
			if (!list[i])
				continue;
			if (paio_find(list[i]))
				served++;
			else
				rest[nreal++] = list[i];
		}
		if (served && glibc_overflows) {
			paio_unlock();
			struct timespec zero = {0, 0};
			ret = nreal && paio_real_suspend(v, rest, nreal, &zero) == 0 ? 0 : -1;
			err = EAGAIN;
			break;
		}
		if (served == 0) {
			paio_unlock();
			struct timespec left, *tp = NULL;
			if (timeout && glibc_overflows) {
				left = *timeout; /* glibc's answer to it, whatever that is */
				tp = &left;
			} else if (timeout) {
				uint64_t t = kvs_mono_ns();
				left = kvs_ns_ts(deadline > t ? deadline - t : 0);
				tp = &left;
			}
			/* A served one that completed meanwhile is now glibc-like: 0 at once. */
			ret = paio_real_suspend(v, rest, nreal, tp);
			err = errno;
			break;
		}
		uint64_t t = kvs_mono_ns();
		if (t >= deadline) {
			paio_unlock();
			break;
		}
		if (spins++ < SPINS) {
			/* A hit completes within microseconds: yield rather than sleep, which
			 * saves the futex wake-up on the completion thread's side. */
			paio_unlock();
			sched_yield();
			continue;
		}
		uint64_t until = nreal ? t + SLICE_NS : deadline;
		if (until > deadline)
			until = deadline;
		kvs_cond_wait_until(&paio_cond, &paio_mu, until);
		paio_unlock(); /* a served completion is seen at the top */
		if (nreal) {
			t = kvs_mono_ns();
			struct timespec slice =
			    kvs_ns_ts(deadline - t < SLICE_NS ? deadline - t : SLICE_NS);
			if (t < deadline && paio_real_suspend(v, rest, nreal, &slice) == 0) {
				ret = 0;
				break;
			}
			if (t < deadline && errno != EAGAIN) {
				err = errno;
				break;
			}
		}
	}
	if (rest != local)
		kvs_sys_munmap(rest, rest_len);
	if (ret)
		errno = err;
	return ret;
}

/* A served read cannot be cancelled (it is a copy from memory, done soon): AIO_NOTCANCELED
 * while it runs; once done it is glibc-like (AIO_ALLDONE from glibc). */
int kvs_paio_cancel(int v, int fd, struct aiocb *cb)
{
	bool running = false;
	int ret;

	if (!paio_busy())
		return paio_real_cancel(v, fd, cb);
	if (cb) {
		paio_lock();
		running = paio_find(cb) != NULL;
		paio_unlock();
		if (!running)
			return paio_real_cancel(v, fd, cb);
		if (kvs_sys_fcntl(fd, F_GETFL) < 0) {
			errno = EBADF;
			return -1;
		}
		if (cb->aio_fildes != fd) {
			errno = EINVAL;
			return -1;
		}
		return AIO_NOTCANCELED;
	}
	ret = paio_real_cancel(v, fd, NULL);
	if (ret == -1)
		return -1;
	paio_lock();
	for (int b = 0; b < NBUCKETS && !running; b++)
		for (struct req *r = paio_table[b]; r && !running; r = r->next)
			running = r->fd == fd;
	paio_unlock();
	return running ? AIO_NOTCANCELED : ret;
}

/* The writes of a LIO_WAIT list, over when the call returns: seen now. */
static void lio_writes_seen(int v, struct aiocb *const list[], int nent)
{
	for (int i = 0; i < nent && atomic_load(&paio_wpending); i++)
		if (list[i] && list[i]->aio_lio_opcode == LIO_WRITE)
			paio_write_seen_if_over(v, list[i]);
}

/*
 * lio_listio: see the top of the file.  Entries' own sigevents are honoured (glibc 2.4 and
 * later do: individual events as well as the list's).  LIO_WAIT returns -1 with the real
 * call's errno when it failed (EINTR, EAGAIN, EIO), else -1 EIO when a served entry failed;
 * either way only once the served entries are over.
 */
int kvs_paio_lio(int v, int mode, struct aiocb *const list[], int nent, struct sigevent *sig)
{
	struct aiocb **rest = NULL;
	struct group *g = NULL, *last;
	int nrest = 0, ret = 0, err = 0, i;
	bool any = false;

	if ((mode != LIO_WAIT && mode != LIO_NOWAIT) || !list || nent <= 0)
		return paio_real_lio(v, mode, list, nent, sig);
	for (i = 0; i < nent && !any; i++)
		any = list[i] && list[i]->aio_lio_opcode == LIO_READ && paio_candidate(list[i]);
	if (any) {
		rest = malloc((size_t)nent * sizeof(*rest));
		g = calloc(1, sizeof(*g));
	}
	if (!rest || !g) {
		/* Nothing to serve (or no memory to): glibc's call, after the invalidations. */
		free(rest);
		free(g);
		for (i = 0; i < nent; i++)
			if (list[i] && list[i]->aio_lio_opcode == LIO_WRITE)
				paio_before_write(list[i]);
		int r = paio_real_lio(v, mode, list, nent, sig);
		if (mode == LIO_WAIT) {
			int saved = errno;

			lio_writes_seen(v, list, nent); /* over: the program may reuse them now */
			errno = saved;
		}
		return r;
	}
	g->left = 1; /* the caller's hold */
	g->pid = getpid();
	if (mode == LIO_NOWAIT && sig && sig->sigev_notify != SIGEV_NONE) {
		g->notify = true;
		g->sev = *sig;
	}
	struct group *member = mode == LIO_WAIT || g->notify ? g : NULL;
	for (i = 0; i < nent; i++) {
		struct aiocb *cb = list[i];

		if (!cb)
			continue;
		if (cb->aio_lio_opcode == LIO_READ && paio_candidate(cb) &&
		    paio_serve(cb, member) == 0)
			continue;
		if (cb->aio_lio_opcode == LIO_WRITE)
			paio_before_write(cb);
		rest[nrest++] = cb;
	}
	if (nrest) {
		if (mode == LIO_WAIT) {
			ret = paio_real_lio(v, LIO_WAIT, rest, nrest, NULL);
			int e = errno;
			lio_writes_seen(v, rest, nrest);
			errno = e;
		} else if (g->notify) {
			struct sigevent s;

			memset(&s, 0, sizeof(s));
			s.sigev_notify = SIGEV_THREAD;
			s.sigev_notify_function = paio_real_part_done;
			s.sigev_value.sival_ptr = g;
			paio_lock();
			/* Dropped by paio_real_part_done: glibc notifies in every case but
			 * running out of memory for its list, where it notifies nobody. */
			g->left++;
			paio_unlock();
			ret = paio_real_lio(v, LIO_NOWAIT, rest, nrest, &s);
		} else {
			ret = paio_real_lio(v, LIO_NOWAIT, rest, nrest, NULL);
		}
		err = errno;
	}
	bool notify_last = g->notify; /* g may be freed by another thread once we drop our hold */

	paio_lock();
	if (mode == LIO_WAIT) {
		g->left--; /* our hold; the served entries drop the rest */
		while (g->left)
			pthread_cond_wait(&paio_cond, &paio_mu);
		if (ret == 0 && g->failed) {
			ret = -1;
			err = EIO;
		}
		last = g; /* ours to free */
	} else {
		last = paio_group_put(g);
		if (!notify_last)
			last = g; /* no member refers to it */
	}
	paio_unlock();
	if (mode == LIO_WAIT || !notify_last)
		free(last);
	else
		paio_group_notify(last);
	free(rest);
	if (ret)
		errno = err;
	return ret;
}
