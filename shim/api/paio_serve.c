/*
 * paio_serve: the POSIX aio engine's served reads (paio_int.h): one started in the loader
 * (paio_serve), its completion on the loader's completion thread (req_done: the result written
 * into the caller's aiocb, then the notification), and lio_listio's groups.  The protocol is
 * the DESIGN comment of api/paio.c.
 */
#include <aio.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "paio_int.h"
#include "raw.h"
#include "shim.h"

/* ------------------------------------------------------------------ notification */

struct thread_note {
	void (*fn)(union sigval);
	union sigval value;
};

static void *note_thread(void *arg)
{
	struct thread_note n = *(struct thread_note *)arg;

	free(arg);
	n.fn(n.value);
	return NULL;
}

/* Deliver sev as glibc's aio does (__aio_notify_only). */
static void notify(const struct sigevent *sev, pid_t pid)
{
	if (sev->sigev_notify == SIGEV_SIGNAL) {
		siginfo_t si;

		memset(&si, 0, sizeof(si));
		si.si_signo = sev->sigev_signo;
		si.si_code = SI_ASYNCIO;
		si.si_pid = pid;
		si.si_uid = getuid();
		si.si_value = sev->sigev_value;
		kvs_syscall(SYS_rt_sigqueueinfo, pid, sev->sigev_signo, &si);
	} else if (sev->sigev_notify == SIGEV_THREAD && sev->sigev_notify_function) {
		struct thread_note *n = malloc(sizeof(*n));
		pthread_attr_t def, *attr = sev->sigev_notify_attributes;
		sigset_t all, old;
		pthread_t t;

		if (!n)
			return;
		n->fn = sev->sigev_notify_function;
		n->value = sev->sigev_value;
		if (!attr) {
			pthread_attr_init(&def);
			pthread_attr_setdetachstate(&def, PTHREAD_CREATE_DETACHED);
			attr = &def;
		}
		/* The function starts with every signal blocked, as on glibc's helper thread. */
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		int r = pthread_create(&t, attr, note_thread, n);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		int state = PTHREAD_CREATE_DETACHED;
		if (attr != &def && pthread_attr_getdetachstate(attr, &state) != 0)
			state = PTHREAD_CREATE_DETACHED; /* cannot tell: never detach twice */
		if (r)
			free(n);
		else if (state == PTHREAD_CREATE_JOINABLE)
			pthread_detach(t); /* joinable by the caller's attributes, but nobody can:
					      a thread created detached may be gone already */
		if (attr == &def)
			pthread_attr_destroy(&def);
	}
}

/* Drop one from g's count.  Caller holds paio_mu.  Returns g when the caller must notify and free
 * it (the last one out of a LIO_NOWAIT group with a sig); wakes a LIO_WAIT caller. */
struct group *paio_group_put(struct group *g)
{
	if (--g->left)
		return NULL;
	if (g->notify)
		return g;
	pthread_cond_broadcast(&paio_cond); /* the LIO_WAIT caller, who frees g */
	return NULL;
}

void paio_group_notify(struct group *g)
{
	if (g) {
		notify(&g->sev, g->pid);
		free(g);
	}
}

/* glibc's SIGEV_THREAD for the real part of a LIO_NOWAIT list: every real entry is over.  It
 * runs on glibc's notification thread, which glibc starts with no signal blocked (for the
 * program's own SIGEV_THREAD functions) and ends when this returns.  A list-wide signal sent
 * from a thread that takes it would be delivered to that thread (the kernel prefers the
 * sender), whose default action for an RT signal kills the process; glibc sends its own from
 * its helper thread, where every signal is blocked.  So block them all here, for good. */
void paio_real_part_done(union sigval v)
{
	struct group *g = v.sival_ptr, *last;
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, NULL);
	paio_lock();
	last = paio_group_put(g);
	paio_unlock();
	paio_group_notify(last);
}

/* The loader's completion thread: r's read is over.  Publish, then notify. */
static void req_done(struct kvs_shim_async *a, int64_t result)
{
	struct req *r = a->arg;
	struct group *last = NULL;
	int saved = errno;

	if (result < 0) {
		/* Not served after all: read it as glibc would have, synchronously, here. */
		ssize_t n;

		do
			n = kvs_sys_pread(r->fd, r->iov.iov_base, r->iov.iov_len, (off_t)r->off);
		while (n < 0 && errno == EINTR);
		result = n < 0 ? -errno : n;
	}
	/* The caller may free or reuse cb as soon as it sees these (under paio_mu, below). */
	r->cb->__return_value = result < 0 ? -1 : (ssize_t)result;
	r->cb->__error_code = result < 0 ? (int)-result : 0;
	paio_lock();
	paio_unlink_req(r);
	if (r->g) {
		if (result < 0)
			r->g->failed = true;
		last = paio_group_put(r->g);
	}
	pthread_cond_broadcast(&paio_cond); /* aio_suspend and LIO_WAIT callers */
	paio_unlock();
	notify(&r->sev, r->pid);
	paio_group_notify(last);
	free(r);
	errno = saved;
}

/* Can cb be served at all (a read the cache could take)? */
bool paio_candidate(const struct aiocb *cb)
{
	return cb && cb->aio_offset >= 0 && cb->aio_buf && kvs_shim_wants(cb->aio_nbytes);
}

/* Serve cb as a member of g (or alone).  Returns 0 (it is ours until it completes) or -1 (the
 * caller submits it to glibc; nothing changed). */
int paio_serve(struct aiocb *cb, struct group *g)
{
	struct req *r;

	paio_setup();
	r = malloc(sizeof(*r));
	if (!r)
		return -1;
	memset(r, 0, sizeof(*r));
	r->a.arg = r;
	r->iov = (struct iovec){(void *)cb->aio_buf, cb->aio_nbytes};
	r->cb = cb;
	r->fd = cb->aio_fildes;
	r->off = cb->aio_offset;
	r->pid = getpid();
	r->sev = cb->aio_sigevent;
	r->g = g;
	/* In the table before the read starts: it may complete before kvs_shim_read_start
	 * returns. */
	cb->__error_code = EINPROGRESS;
	cb->__return_value = 0;
	paio_lock();
	r->next = paio_table[paio_bucket(cb)];
	paio_table[paio_bucket(cb)] = r;
	/* pairs with paio_busy() */
	atomic_fetch_add_explicit(&paio_inflight, 1, memory_order_release);
	if (g)
		g->left++;
	paio_unlock();
	int rc = kvs_shim_read_start(&r->a, r->fd, &r->iov, 1, r->off, req_done);
	if (rc == 1)
		req_done(&r->a, r->a.result); /* a hit, over already: complete it here */
	if (rc >= 0)
		return 0;
	paio_lock();
	paio_unlink_req(r);
	if (g)
		g->left--; /* the caller's hold keeps it above zero */
	paio_unlock();
	free(r);
	return -1;
}
