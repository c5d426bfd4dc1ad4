/*
 * paio: the engine of glibc's POSIX asynchronous I/O served by the cache (issue 8;
 * docs/design.md, "POSIX aio (`api/paio.c`)"), below its doors (hooks/posix_aio.c: the aio_ and
 * lio_listio names, one call each into kvs_paio_*).
 *
 * DESIGN.  aio_read (and each LIO_READ entry of lio_listio) that the cache can serve starts in
 * the loader (kvs_shim_read_start) and completes on its completion thread; every other request
 * goes to glibc's own aio and stays glibc's (a write to a KV file is first invalidated and
 * noted for write-through, below: "Writes", in a table of its own, wtable).  The shim keeps a
 * table of the served requests *in flight* only, keyed by the caller's aiocb.  At completion it
 * writes the result into the aiocb's own __return_value and __error_code, exactly the two
 * fields glibc's completion writes and glibc's aio_error and aio_return read, then removes the
 * request from the table.  From then on the aiocb is indistinguishable from one glibc
 * completed: aio_error, aio_return, aio_suspend and aio_cancel on it go to glibc and answer
 * right (0 at once, AIO_ALLDONE), and nothing is left behind for a caller that never calls
 * aio_return.  The table so answers one question, "is this aiocb a served read still running?",
 * and the hooks ask it only while any served read is running (inflight, read without the lock).
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
 * real part in the real call, then for the served entries on cond.
 *
 * Locks: mu guards both tables (and the write notes' pool), every group's fields and inflight's
 * writes; cond is broadcast on every served completion (aio_suspend and LIO_WAIT wait on it).
 * mu is never held across a call into glibc's aio, the loader or a notification.  inflight is
 * read without mu by the hooks' fast path: a served request is in the table (inflight > 0,
 * store under mu) before aio_read returns, so a caller that asks about its own aiocb after
 * submitting sees it.  mu is taken only with the shim's guard held (lock_mu), by every thread,
 * and aio_error, aio_return, aio_suspend and close (async-signal-safe) do nothing but the real
 * call inside the shim, so a signal handler never waits for mu held by the thread it
 * interrupted; they allocate nothing (the write notes' pool, aio_suspend's list on the stack or
 * mapped).
 */
#include <aio.h>
#include <dlfcn.h>
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
#include "dlsym.h"
#include "elfsym.h"
#include "paio.h"
#include "raw.h"
#include "shim.h"

/* ------------------------------------------------------------------ the real functions */

enum { R_READ, R_WRITE, R_LIO, R_ERROR, R_RETURN, R_SUSPEND, R_CANCEL, R_N };

/* [0]: the plain names, [1]: the 64 names (aliases of the same functions on LP64, looked up
 * apart in case something ahead of libc hooks only one of them). */
static const char *const real_names[2][R_N] = {
    {"aio_read", "aio_write", "lio_listio", "aio_error", "aio_return", "aio_suspend", "aio_cancel"},
    {"aio_read64", "aio_write64", "lio_listio64", "aio_error64", "aio_return64", "aio_suspend64",
     "aio_cancel64"},
};
static void *real_fns[2][R_N];

enum { UNRESOLVED, RESOLVING, RESOLVED };
static _Atomic int real_state = UNRESOLVED;
static __thread int resolving_here;

/*
 * Find glibc's functions (libc since 2.34, librt before), once.  No pthread_once, for the
 * reason real.c gives.  There is no raw system call to fall back on, and a thread that finds
 * another resolving must not wait for it either: the resolver is in dlsym, which takes the
 * loader's lock, and the waiter may hold that lock (a dlopen whose constructor submits aio).
 * So the waiter takes libc's own definition from libc's symbol table (kvs_elf_symbol: no
 * lock) for its call, or waits only where libc has none (glibc before 2.34: librt).  A
 * re-entry on the resolving thread itself finds NULL and fails with ENOSYS.  A pointer into
 * the shim is refused: calling it would loop.
 */
static void real_resolve(void)
{
	int s = atomic_load_explicit(&real_state, memory_order_acquire); /* pairs below */

	if (s == RESOLVED || resolving_here)
		return;
	if (s == UNRESOLVED && atomic_compare_exchange_strong(&real_state, &s, RESOLVING)) {
		resolving_here = 1;
		for (int v = 0; v < 2; v++)
			for (int i = 0; i < R_N; i++) {
				void *p = kvs_dlsym_real(RTLD_NEXT, real_names[v][i]);

				real_fns[v][i] = p && !kvs_dlsym_in_shim(p) ? p : NULL;
			}
		resolving_here = 0;
		/* pairs with the acquire loads above and below */
		atomic_store_explicit(&real_state, RESOLVED, memory_order_release);
		return;
	}
}

static void *real_fn(int v, int i)
{
	real_resolve();
	if (atomic_load_explicit(&real_state, memory_order_acquire) == RESOLVED) /* pairs above */
		return real_fns[v][i];
	if (resolving_here)
		return NULL;
	void *p = kvs_elf_symbol("libc.so.", real_names[v][i], NULL);
	if (p)
		return p; /* libc's own, while another thread resolves */
	while (atomic_load_explicit(&real_state, memory_order_acquire) != RESOLVED)
		sched_yield(); /* librt's: only dlsym finds it; another thread is in it */
	return real_fns[v][i];
}

#define NOSYS(ret)                                                                                 \
	do {                                                                                       \
		errno = ENOSYS;                                                                    \
		return (ret);                                                                      \
	} while (0)

static int real_read(int v, struct aiocb *cb)
{
	int (*fn)(struct aiocb *) = real_fn(v, R_READ);

	if (!fn)
		NOSYS(-1);
	return fn(cb);
}

static int real_write(int v, struct aiocb *cb)
{
	int (*fn)(struct aiocb *) = real_fn(v, R_WRITE);

	if (!fn)
		NOSYS(-1);
	return fn(cb);
}

static int real_lio(int v, int mode, struct aiocb *const list[], int nent, struct sigevent *sig)
{
	int (*fn)(int, struct aiocb *const[], int, struct sigevent *) = real_fn(v, R_LIO);

	if (!fn)
		NOSYS(-1);
	return fn(mode, list, nent, sig);
}

static int real_error(int v, const struct aiocb *cb)
{
	int (*fn)(const struct aiocb *) = real_fn(v, R_ERROR);

	if (!fn)
		NOSYS(-1);
	return fn(cb);
}

static ssize_t real_return(int v, struct aiocb *cb)
{
	ssize_t (*fn)(struct aiocb *) = real_fn(v, R_RETURN);

	if (!fn)
		NOSYS(-1);
	return fn(cb);
}

static int real_suspend(int v, const struct aiocb *const list[], int nent,
			const struct timespec *timeout)
{
	int (*fn)(const struct aiocb *const[], int, const struct timespec *) =
	    real_fn(v, R_SUSPEND);

	if (!fn)
		NOSYS(-1);
	return fn(list, nent, timeout);
}

static int real_cancel(int v, int fd, struct aiocb *cb)
{
	int (*fn)(int, struct aiocb *) = real_fn(v, R_CANCEL);

	if (!fn)
		NOSYS(-1);
	return fn(fd, cb);
}

/* ------------------------------------------------------------------ served requests */

struct group {
	unsigned left;	     /* outstanding: the caller's hold, served entries, the real part */
	bool failed;	     /* a served entry failed */
	bool notify;	     /* LIO_NOWAIT with a sig: the last one out notifies and frees */
	struct sigevent sev; /* lio_listio's sig, copied */
	pid_t pid;	     /* the submitter, for SIGEV_SIGNAL */
};

struct req {
	struct kvs_shim_async a; /* a.arg: this request */
	struct iovec iov;
	struct aiocb *cb;
	int fd;
	off_t off;
	pid_t pid;
	struct sigevent sev; /* cb->aio_sigevent at submission */
	struct group *g;     /* lio_listio's group, or NULL */
	struct req *next;    /* the bucket's chain */
};

#define NBUCKETS 256

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond; /* CLOCK_MONOTONIC; initialised with the fork handlers */
static struct req *table[NBUCKETS];
static _Atomic unsigned inflight; /* served requests in the table; written under mu */
static _Atomic int setup_state;	  /* 0, 1 being set up, 2 done */

/* Writes to KV files noted for write-through until the program sees them over (below,
 * "Writes"); under mu, wpending read without it.  Entries come from a pool mapped once (wfree,
 * under mu): aio_error, aio_return and close give them back, and may run in a signal handler,
 * where free() could wait for the arena lock of the malloc it interrupted. */
struct wreq {
	const struct aiocb *cb;
	int fd; /* cb's descriptor at submission (the aiocb itself is not read again) */
	struct kvs_shim_wpend p;
	struct wreq *next;
};
#define WPOOL 4096 /* writes noted at once; past that a write is followed as a change */
static struct wreq *wtable[NBUCKETS];
static _Atomic unsigned wpending;
static struct wreq *wpool, *wfree;
static bool wpool_failed;

/* mu is taken with the shim's guard held, by every thread: a signal handler that interrupts a
 * thread holding it finds the guard set and makes the real call (shim.h, kvs_shim_inside). */
static void lock_mu(void)
{
	kvs_shim_hold();
	pthread_mutex_lock(&mu);
}

static void unlock_mu(void)
{
	pthread_mutex_unlock(&mu);
	kvs_shim_drop();
}

/* Every entry of the pool free.  Caller holds mu, or is the only thread (fork child). */
static void wpool_reset(void)
{
	wfree = NULL;
	for (int i = WPOOL - 1; wpool && i >= 0; i--) {
		wpool[i].next = wfree;
		wfree = &wpool[i];
	}
}

/* A free entry, or NULL (the pool cannot be mapped, or is spent).  Caller holds mu. */
static struct wreq *wreq_get(void)
{
	if (!wpool && !wpool_failed) {
		void *p = kvs_sys_mmap(NULL, WPOOL * sizeof(struct wreq), PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		wpool_failed = p == MAP_FAILED;
		wpool = wpool_failed ? NULL : p;
		wpool_reset();
	}
	struct wreq *w = wfree;
	if (w)
		wfree = w->next;
	return w;
}

static void wreq_put(struct wreq *w) /* caller holds mu */
{
	w->next = wfree;
	wfree = w;
}

static unsigned bucket(const struct aiocb *cb)
{
	uintptr_t h = (uintptr_t)cb;

	h ^= h >> 17;
	h *= 0x9E3779B97F4A7C15ull;
	return (unsigned)(h >> 56) % NBUCKETS;
}

/* The running served request of cb, or NULL.  Caller holds mu. */
static struct req *find(const struct aiocb *cb)
{
	struct req *r = table[bucket(cb)];

	while (r && r->cb != cb)
		r = r->next;
	return r;
}

/* Caller holds mu. */
static void unlink_req(struct req *r)
{
	struct req **p = &table[bucket(r->cb)];

	while (*p && *p != r)
		p = &(*p)->next;
	if (*p)
		*p = r->next;
	atomic_fetch_sub_explicit(&inflight, 1, memory_order_release); /* pairs with busy() */
}

/* Is any served request running?  Without the lock; see the top of the file. */
static bool busy(void)
{
	return atomic_load_explicit(&inflight, memory_order_acquire) != 0; /* pairs with writes */
}

/* A fork while another thread holds mu would leave it locked in the child.  The child's
 * served requests never complete (the loader is forgotten), as glibc's do not either. */
void kvs_posix_aio_atfork_prepare(void)
{
	lock_mu(); /* released by the parent's or the child's handler */
}
void kvs_posix_aio_atfork_parent(void)
{
	unlock_mu();
}
void kvs_posix_aio_atfork_child(void)
{
	/* The noted writes are the parent's (their staged files are forgotten in the child):
	 * drop them without a look, as glibc's requests are not the child's either. */
	for (int i = 0; i < NBUCKETS; i++)
		wtable[i] = NULL;
	atomic_store(&wpending, 0);
	wpool_reset();
	unlock_mu();
	/* A parent thread may have been waiting on cond: its state is the parent's. */
	kvs_cond_init_mono(&cond);
}

/* Once, before the first served request: cond on the monotonic clock (the fork handlers are
 * hooks/fanout.c's). */
static void setup(void)
{
	int s = atomic_load_explicit(&setup_state, memory_order_acquire); /* pairs below */

	if (s == 2)
		return;
	if (s == 0 && atomic_compare_exchange_strong(&setup_state, &s, 1)) {
		kvs_cond_init_mono(&cond);
		atomic_store_explicit(&setup_state, 2, memory_order_release); /* pairs above */
		return;
	}
	while (atomic_load_explicit(&setup_state, memory_order_acquire) != 2)
		sched_yield();
}

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

/* Drop one from g's count.  Caller holds mu.  Returns g when the caller must notify and free
 * it (the last one out of a LIO_NOWAIT group with a sig); wakes a LIO_WAIT caller. */
static struct group *group_put(struct group *g)
{
	if (--g->left)
		return NULL;
	if (g->notify)
		return g;
	pthread_cond_broadcast(&cond); /* the LIO_WAIT caller, who frees g */
	return NULL;
}

static void group_notify(struct group *g)
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
static void real_part_done(union sigval v)
{
	struct group *g = v.sival_ptr, *last;
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, NULL);
	lock_mu();
	last = group_put(g);
	unlock_mu();
	group_notify(last);
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
	/* The caller may free or reuse cb as soon as it sees these (under mu, below). */
	r->cb->__return_value = result < 0 ? -1 : (ssize_t)result;
	r->cb->__error_code = result < 0 ? (int)-result : 0;
	lock_mu();
	unlink_req(r);
	if (r->g) {
		if (result < 0)
			r->g->failed = true;
		last = group_put(r->g);
	}
	pthread_cond_broadcast(&cond); /* aio_suspend and LIO_WAIT callers */
	unlock_mu();
	notify(&r->sev, r->pid);
	group_notify(last);
	free(r);
	errno = saved;
}

/* Can cb be served at all (a read the cache could take)? */
static bool candidate(const struct aiocb *cb)
{
	return cb && cb->aio_offset >= 0 && cb->aio_buf && kvs_shim_wants(cb->aio_nbytes);
}

/* Serve cb as a member of g (or alone).  Returns 0 (it is ours until it completes) or -1 (the
 * caller submits it to glibc; nothing changed). */
static int serve(struct aiocb *cb, struct group *g)
{
	struct req *r;

	setup();
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
	lock_mu();
	r->next = table[bucket(cb)];
	table[bucket(cb)] = r;
	atomic_fetch_add_explicit(&inflight, 1, memory_order_release); /* pairs with busy() */
	if (g)
		g->left++;
	unlock_mu();
	int rc = kvs_shim_read_start(&r->a, r->fd, &r->iov, 1, r->off, req_done);
	if (rc == 1)
		req_done(&r->a, r->a.result); /* a hit, over already: complete it here */
	if (rc >= 0)
		return 0;
	lock_mu();
	unlink_req(r);
	if (g)
		g->left--; /* the caller's hold keeps it above zero */
	unlock_mu();
	free(r);
	return -1;
}

/* ------------------------------------------------------------------ the hooks */

int kvs_paio_read(int v, struct aiocb *cb)
{
	if (candidate(cb) && serve(cb, NULL) == 0)
		return 0;
	return real_read(v, cb);
}

/*
 * Writes.  A write changes the shards it covers: they are dropped before it is submitted.
 * glibc completes it on its own thread, so its bytes are kept for write-through (wthru.h)
 * only once the program sees it complete: aio_error answering 0 or aio_return.  Until then
 * it is noted in wtable (under mu; wpending, read without mu, says whether to look).
 * Completing one takes no lock but the shim's, and frees nothing (the pool): aio_error,
 * aio_return and close may run in a signal handler.
 */

/* The noted write of cb (fd >= 0: any of fd, cb ignored), taken out of the table; NULL if
 * none.  wreq_give_back it once completed. */
static struct wreq *take_write(const struct aiocb *cb, int fd)
{
	struct wreq *w = NULL;

	if (!atomic_load_explicit(&wpending, memory_order_acquire)) /* pairs with before_write */
		return NULL;
	lock_mu();
	for (int i = fd >= 0 ? 0 : (int)bucket(cb); i < NBUCKETS && !w; i++) {
		for (struct wreq **pp = &wtable[i]; *pp; pp = &(*pp)->next) {
			if (fd >= 0 ? (*pp)->fd == fd : (*pp)->cb == cb) {
				w = *pp;
				*pp = w->next;
				atomic_fetch_sub_explicit(&wpending, 1, memory_order_release);
				break;
			}
		}
		if (fd < 0)
			break;
	}
	unlock_mu();
	return w;
}

/* Complete w's write with result n (-1: failed, or unknown), and give w back. */
static void complete_write(struct wreq *w, ssize_t n)
{
	if (!w)
		return;
	kvs_shim_write_completed(&w->p, n);
	lock_mu();
	wreq_put(w);
	unlock_mu();
}

static void before_write(const struct aiocb *cb)
{
	if (!cb || cb->aio_offset < 0)
		return;
	kvs_shim_invalidate(cb->aio_fildes, cb->aio_offset, cb->aio_nbytes, false, 0);
	/* A rewrite of a write-once file counts at the submission (its result comes later). */
	if (cb->aio_nbytes)
		kvs_shim_invalidate(cb->aio_fildes, cb->aio_offset, cb->aio_nbytes, false,
				    -(off_t)cb->aio_nbytes);
	struct iovec io = {(void *)(uintptr_t)cb->aio_buf, cb->aio_nbytes};
	/* An aiocb reused without its result collected: the old write is of no use now. */
	complete_write(take_write(cb, -1), -1);
	setup(); /* the fork handlers that keep mu sane */
	lock_mu();
	struct wreq *w = wreq_get();
	unlock_mu();
	if (!w) {
		/* No room to note it: followed at once, as a change that keeps nothing. */
		kvs_shim_change_now(cb->aio_fildes, cb->aio_offset, cb->aio_nbytes);
		return;
	}
	if (!kvs_shim_write_submitted(&w->p, cb->aio_fildes, &io, 1, (uint64_t)cb->aio_offset)) {
		lock_mu();
		wreq_put(w);
		unlock_mu();
		return;
	}
	w->cb = cb;
	w->fd = cb->aio_fildes;
	lock_mu();
	w->next = wtable[bucket(cb)];
	wtable[bucket(cb)] = w;
	atomic_fetch_add_explicit(&wpending, 1, memory_order_release); /* pairs with take_write */
	unlock_mu();
}

/* The program saw cb's write over with result n (-1: failed). */
static void write_seen(const struct aiocb *cb, ssize_t n)
{
	complete_write(take_write(cb, -1), n);
}

/* cb's write, if it is over by glibc's account (aio_error != EINPROGRESS), seen now. */
static void write_seen_if_over(int v, const struct aiocb *cb)
{
	int r = real_error(v, cb);

	if (r != EINPROGRESS)
		write_seen(cb, r == 0 ? real_return(v, (struct aiocb *)cb) : -1);
}

void kvs_aio_closing(int fd)
{
	if (!atomic_load_explicit(&wpending, memory_order_acquire)) /* pairs with before_write */
		return;
	int saved = errno;
	/* Writes of fd the program never asked about: whether they are over is not known here
	 * (their aiocbs may be gone), so they keep nothing, and the close finds the file free. */
	for (struct wreq *w; (w = take_write(NULL, fd));)
		complete_write(w, -1);
	errno = saved;
}

int kvs_paio_write(int v, struct aiocb *cb)
{
	before_write(cb);
	int r = real_write(v, cb);
	if (r != 0) {
		int saved = errno;

		write_seen(cb, -1);
		errno = saved;
	}
	return r;
}

/* aio_error and aio_return are async-signal-safe: inside the shim (a handler that interrupted
 * it), the real call alone; else only the shim's own locks, and no memory allocated or freed. */
int kvs_paio_error(int v, const struct aiocb *cb)
{
	bool running = false;

	if (kvs_shim_inside())
		return real_error(v, cb);
	if (cb && busy()) {
		lock_mu();
		running = find(cb) != NULL;
		unlock_mu();
	}
	if (running)
		return EINPROGRESS;
	int r = real_error(v, cb);
	if (r != EINPROGRESS && cb && atomic_load_explicit(&wpending, memory_order_relaxed)) {
		int saved = errno;

		/* glibc's aio_return only reads the result: asking it here changes nothing. */
		write_seen(cb, r == 0 ? real_return(v, (struct aiocb *)cb) : -1);
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
		return real_return(v, cb);
	if (cb && busy()) {
		lock_mu();
		running = find(cb) != NULL;
		unlock_mu();
	}
	if (running) {
		errno = EINPROGRESS;
		return -1;
	}
	ssize_t n = real_return(v, cb);
	if (cb && atomic_load_explicit(&wpending, memory_order_relaxed)) {
		int saved = errno;

		write_seen(cb, n);
		errno = saved;
	}
	return n;
}

#define SLICE_NS      500000ull /* a mixed aio_suspend alternates glibc's wait and ours */
#define SUSPEND_LOCAL 64	/* aiocbs of an aio_suspend list kept on the stack */
#define SPINS	      20	/* yields before the first sleep on cond */

/*
 * aio_suspend over served and glibc's aiocbs.  With no served one running in the list, it is
 * glibc's call (with the aiocbs not ours, which are all of them).  Otherwise: 0 as soon as a
 * listed served one is no longer in the table; served only: wait on cond until the deadline;
 * mixed: glibc's aio_suspend on its aiocbs for a slice, then cond for a slice.  A signal ends
 * glibc's slices with EINTR, which is returned; our waits on cond do not see signals.
 */
int kvs_paio_suspend(int v, const struct aiocb *const list[], int nent,
		     const struct timespec *timeout)
{
	const struct aiocb **rest, *local[SUSPEND_LOCAL];
	uint64_t deadline = UINT64_MAX;
	int ret = -1, err = EAGAIN, spins = 0;

	/* Async-signal-safe: inside the shim (a handler that interrupted it), glibc's alone; else
	 * the list of glibc's aiocbs on the stack, or mapped for a long one (never malloc). */
	if (kvs_shim_inside() || !busy() || !list || nent <= 0 ||
	    (timeout && (timeout->tv_nsec < 0 || timeout->tv_nsec >= 1000000000L)))
		return real_suspend(v, list, nent, timeout);
	size_t rest_len = (size_t)nent * sizeof(*rest);
	rest = nent <= SUSPEND_LOCAL ? local
				     : kvs_sys_mmap(NULL, rest_len, PROT_READ | PROT_WRITE,
						    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (rest == MAP_FAILED)
		return real_suspend(v, list, nent, timeout);
	deadline = kvs_deadline_ns(timeout);
	/* glibc adds the timeout to the monotonic clock's seconds, and one that overflows time_t
	 * ({LONG_MAX, 0}) fails the wait at once: EAGAIN unless a listed request is over already.
	 * The same here, where a served read is listed. */
	struct timespec mono;
	clock_gettime(CLOCK_MONOTONIC, &mono);
	bool glibc_overflows = timeout && timeout->tv_sec > LONG_MAX - mono.tv_sec - 1;
	for (;;) {
		int nreal = 0, served = 0;

		lock_mu();
		for (int i = 0; i < nent; i++) {
			if (!list[i])
				continue;
			if (find(list[i]))
				served++;
			else
				rest[nreal++] = list[i];
		}
		if (served && glibc_overflows) {
			unlock_mu();
			struct timespec zero = {0, 0};
			ret = nreal && real_suspend(v, rest, nreal, &zero) == 0 ? 0 : -1;
			err = EAGAIN;
			break;
		}
		if (served == 0) {
			unlock_mu();
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
			ret = real_suspend(v, rest, nreal, tp);
			err = errno;
			break;
		}
		uint64_t t = kvs_mono_ns();
		if (t >= deadline) {
			unlock_mu();
			break;
		}
		if (spins++ < SPINS) {
			/* A hit completes within microseconds: yield rather than sleep, which
			 * saves the futex wake-up on the completion thread's side. */
			unlock_mu();
			sched_yield();
			continue;
		}
		uint64_t until = nreal ? t + SLICE_NS : deadline;
		if (until > deadline)
			until = deadline;
		kvs_cond_wait_until(&cond, &mu, until);
		unlock_mu(); /* a served completion is seen at the top */
		if (nreal) {
			t = kvs_mono_ns();
			struct timespec slice =
			    kvs_ns_ts(deadline - t < SLICE_NS ? deadline - t : SLICE_NS);
			if (t < deadline && real_suspend(v, rest, nreal, &slice) == 0) {
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

	if (!busy())
		return real_cancel(v, fd, cb);
	if (cb) {
		lock_mu();
		running = find(cb) != NULL;
		unlock_mu();
		if (!running)
			return real_cancel(v, fd, cb);
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
	ret = real_cancel(v, fd, NULL);
	if (ret == -1)
		return -1;
	lock_mu();
	for (int b = 0; b < NBUCKETS && !running; b++)
		for (struct req *r = table[b]; r && !running; r = r->next)
			running = r->fd == fd;
	unlock_mu();
	return running ? AIO_NOTCANCELED : ret;
}

/* The writes of a LIO_WAIT list, over when the call returns: seen now. */
static void lio_writes_seen(int v, struct aiocb *const list[], int nent)
{
	for (int i = 0; i < nent && atomic_load(&wpending); i++)
		if (list[i] && list[i]->aio_lio_opcode == LIO_WRITE)
			write_seen_if_over(v, list[i]);
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
		return real_lio(v, mode, list, nent, sig);
	for (i = 0; i < nent && !any; i++)
		any = list[i] && list[i]->aio_lio_opcode == LIO_READ && candidate(list[i]);
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
				before_write(list[i]);
		int r = real_lio(v, mode, list, nent, sig);
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
		if (cb->aio_lio_opcode == LIO_READ && candidate(cb) && serve(cb, member) == 0)
			continue;
		if (cb->aio_lio_opcode == LIO_WRITE)
			before_write(cb);
		rest[nrest++] = cb;
	}
	if (nrest) {
		if (mode == LIO_WAIT) {
			ret = real_lio(v, LIO_WAIT, rest, nrest, NULL);
			int e = errno;
			lio_writes_seen(v, rest, nrest);
			errno = e;
		} else if (g->notify) {
			struct sigevent s;

			memset(&s, 0, sizeof(s));
			s.sigev_notify = SIGEV_THREAD;
			s.sigev_notify_function = real_part_done;
			s.sigev_value.sival_ptr = g;
			lock_mu();
			g->left++; /* dropped by real_part_done: glibc notifies in every case but
				      running out of memory for its list, where it notifies nobody
				    */
			unlock_mu();
			ret = real_lio(v, LIO_NOWAIT, rest, nrest, &s);
		} else {
			ret = real_lio(v, LIO_NOWAIT, rest, nrest, NULL);
		}
		err = errno;
	}
	bool notify_last = g->notify; /* g may be freed by another thread once we drop our hold */

	lock_mu();
	if (mode == LIO_WAIT) {
		g->left--; /* our hold; the served entries drop the rest */
		while (g->left)
			pthread_cond_wait(&cond, &mu);
		if (ret == 0 && g->failed) {
			ret = -1;
			err = EIO;
		}
		last = g; /* ours to free */
	} else {
		last = group_put(g);
		if (!notify_last)
			last = g; /* no member refers to it */
	}
	unlock_mu();
	if (mode == LIO_WAIT || !notify_last)
		free(last);
	else
		group_notify(last);
	free(rest);
	if (ret)
		errno = err;
	return ret;
}
