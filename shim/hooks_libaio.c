/*
 * hooks_libaio: kernel AIO served by the cache (docs/design.md, "Kernel AIO (`hooks_libaio.c`)").
 *
 * Two doors lead to the same code: libc's syscall() for the io_* numbers (UCM's AIO engine
 * calls it directly; hooks_syscall.c sends them to kvs_libaio_syscall) and libaio's io_submit,
 * io_getevents, io_pgetevents, io_cancel and io_destroy (NIXL's POSIX plugin, fio's libaio
 * engine).  Internally every function returns
 * -errno, as libaio does; syscall() turns that into -1 and errno.  The kernel part of a call
 * goes to libaio's real function when the caller came through libaio and it can be found,
 * else to the raw system call (which is all libaio does).  libc's syscall() is the shim's for
 * every number (its hook, at the end of this file): the io_uring numbers go on to
 * hooks_uring.c, the timestamp numbers to touch.h, the numbers that change a file's bytes are
 * followed as a change (changing), a descriptor closed or replaced is told to fdinfo, and every
 * other number goes straight to the kernel (kvs_raw6, base/raw.h).
 *
 * DESIGN.  Per io context (aio_context_t) the shim keeps a struct kctx, made at the first
 * io_submit on it.  io_submit walks the iocbs in order: a read the cache takes
 * (kvs_shim_read_start) becomes a served entry; every run of others goes to the kernel in one
 * call, before any served entry after it is started, so that a run the kernel accepts only in
 * part ends the submit with nothing of ours started past that point (the kernel's rule for
 * partial submission).  A served entry completes on the loader's completion thread: a failed
 * load is read again with a raw pread/preadv of the same range, the event goes on the
 * context's done queue, and then, for IOCB_FLAG_RESFD, 1 is written to the eventfd.
 * io_getevents reports queued served events first, then polls the kernel (without waiting),
 * and if still short of min_nr waits: on the condition variable while served entries are in
 * flight (in 1 ms slices when kernel entries may be outstanding, so their completions are
 * seen), else in the kernel (in 10 ms slices, so a served entry another thread submits
 * meanwhile is seen).  A context that never had a served entry is passed straight through.
 * io_cancel of a served entry answers -EAGAIN (it will complete); io_destroy waits for served
 * entries in flight, drops their events and destroys the kernel's context.
 *
 * Locks: ctx_mu guards the list of contexts (held briefly, never across a call); each
 * context's mu guards its counters, queues and entries; cond signals a served completion.
 * Lock order: ctx_mu before a context's mu (only in find/create).  No lock is held across a
 * system call, a call into libaio or into the loader.  kpending (kernel entries submitted and
 * not reaped) is a hint: it decides how often a wait looks at the kernel, never correctness.
 *
 * Fork: the child has none of the parent's contexts (the kernel does not copy them) and none
 * of its loader threads; the child handler forgets the list (its memory is abandoned).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/aio_abi.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "deadline.h"
#include "dlsym.h"
#include "fdinfo.h"
#include "hooks_libaio.h"
#include "hooks_uring.h"
#include "raw.h"
#include "shim.h"
#include "touch.h"

#ifndef IOCB_FLAG_IOPRIO
#define IOCB_FLAG_IOPRIO (1 << 1)
#endif

/* ------------------------------------------------------------------ raw system calls */

/* kvs_raw6 (raw.h): the kernel's answer, -errno on failure, errno untouched. */
#define RAW(n, a, b, c, d, e, f)                                                                   \
	kvs_raw6((n), (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), (long)(f))

/* ------------------------------------------------------------------ libaio's functions */

/* libaio's names take an io_context_t (a pointer); the value is the aio_context_t. */
typedef int (*la_submit_fn)(void *, long, struct iocb **);
typedef int (*la_getevents_fn)(void *, long, long, struct io_event *, struct timespec *);
typedef int (*la_cancel_fn)(void *, struct iocb *, struct io_event *);
typedef int (*la_destroy_fn)(void *);

static struct {
	la_submit_fn submit;
	la_getevents_fn getevents;
	la_cancel_fn cancel;
	la_destroy_fn destroy;
} la;

/* Resolved once, without pthread_once: the resolving thread calls dlsym and dlopen, which take
 * the loader's lock, and a thread inside a dlopen (holding that lock, running a constructor
 * that submits) must not wait for it.  A thread that finds libaio's functions not resolved
 * yet makes the raw system calls instead, which is all libaio makes. */
enum { LA_UNRESOLVED, LA_RESOLVING, LA_RESOLVED };
static _Atomic int la_state = LA_UNRESOLVED;

/* True once la is filled (acquire: pairs with the release in la_ready). */
static bool la_ready(void);

/* The next definition past the shim (libaio is a NEEDED library of its callers), or, for a
 * libaio loaded privately by a dlopen'ed plugin, the one in the loaded libaio.so.1. */
static void *la_symbol(void *h, const char *name)
{
	void *p = kvs_dlsym_real(h, name);

	return p && !kvs_dlsym_in_shim(p) ? p : NULL;
}

static void la_resolve(void)
{
	void *h = NULL;

	kvs_dlsym_resolve();
	la.submit = (la_submit_fn)la_symbol(RTLD_NEXT, "io_submit");
	if (!la.submit) {
		h = dlopen("libaio.so.1", RTLD_NOW | RTLD_NOLOAD);
		if (!h)
			return; /* raw system calls, which is what libaio makes */
		la.submit = (la_submit_fn)la_symbol(h, "io_submit");
	}
	la.getevents = (la_getevents_fn)la_symbol(h ? h : RTLD_NEXT, "io_getevents");
	la.cancel = (la_cancel_fn)la_symbol(h ? h : RTLD_NEXT, "io_cancel");
	la.destroy = (la_destroy_fn)la_symbol(h ? h : RTLD_NEXT, "io_destroy");
	if (h)
		dlclose(h); /* RTLD_NOLOAD took a reference; the library stays loaded */
}

static bool la_ready(void)
{
	int s = atomic_load_explicit(&la_state, memory_order_acquire); /* pairs below */

	if (s == LA_UNRESOLVED && atomic_compare_exchange_strong(&la_state, &s, LA_RESOLVING)) {
		la_resolve();
		atomic_store_explicit(&la_state, LA_RESOLVED,
				      memory_order_release); /* pairs above */
		return true;
	}
	return s == LA_RESOLVED;
}

/* Which door the call came through: libaio's functions, or syscall(). */
enum via { VIA_SYSCALL, VIA_LIBAIO };

/* Set while this thread is inside one of libaio's real functions: libaio makes its system
 * calls through libc's syscall(), which is ours; those go straight to the kernel, or every
 * kernel entry would be looked at twice (a write noted twice for write-through). */
static __thread int in_libaio __attribute__((tls_model("initial-exec")));

#define LIBAIO_CALL(call)                                                                          \
	({                                                                                         \
		in_libaio++;                                                                       \
		long r_ = (call);                                                                  \
		in_libaio--;                                                                       \
		r_;                                                                                \
	})

static long k_submit(enum via v, aio_context_t ctx, long nr, struct iocb **p)
{
	if (v == VIA_LIBAIO && la_ready() && la.submit)
		return LIBAIO_CALL(la.submit((void *)ctx, nr, p));
	return RAW(SYS_io_submit, ctx, nr, p, 0, 0, 0);
}

/* sig: io_pgetevents' struct __aio_sigset, or NULL for io_getevents. */
static long k_getevents(enum via v, aio_context_t ctx, long min_nr, long nr, struct io_event *ev,
			struct timespec *ts, const void *sig)
{
	if (sig)
#ifdef SYS_io_pgetevents
		return RAW(SYS_io_pgetevents, ctx, min_nr, nr, ev, ts, sig);
#else
		return -ENOSYS;
#endif
	if (v == VIA_LIBAIO && la_ready() && la.getevents)
		return LIBAIO_CALL(la.getevents((void *)ctx, min_nr, nr, ev, ts));
	return RAW(SYS_io_getevents, ctx, min_nr, nr, ev, ts, 0);
}

static long k_cancel(enum via v, aio_context_t ctx, struct iocb *cb, struct io_event *res)
{
	if (v == VIA_LIBAIO && la_ready() && la.cancel)
		return LIBAIO_CALL(la.cancel((void *)ctx, cb, res));
	return RAW(SYS_io_cancel, ctx, cb, res, 0, 0, 0);
}

static long k_destroy(enum via v, aio_context_t ctx)
{
	if (v == VIA_LIBAIO && la_ready() && la.destroy)
		return LIBAIO_CALL(la.destroy((void *)ctx));
	return RAW(SYS_io_destroy, ctx, 0, 0, 0, 0, 0);
}

/* The kernel's completion ring, mapped at the context's address: libaio peeks at it to skip
 * a system call that cannot return anything.  Only done for a context the kernel accepted. */
struct aio_ring_head {
	unsigned id, nr, head, tail, magic, compat_features, incompat_features, header_length;
};
#define AIO_RING_MAGIC 0xa10a10a1u

static bool ring_empty(aio_context_t ctx)
{
	const volatile struct aio_ring_head *r = (const volatile struct aio_ring_head *)ctx;

	return r->magic == AIO_RING_MAGIC && r->head == r->tail;
}

/* ------------------------------------------------------------------ contexts and entries */

#define INLINE_IOV	 4
#define KVS_SUBMIT_CHUNK 32 /* iocbs of one io_submit read onto the stack at a time */

struct kctx;

/* A served iocb, from io_submit until io_getevents reports it (or io_destroy drops it). */
struct served {
	struct kvs_shim_async a; /* a.arg: this entry */
	struct kctx *c;
	struct io_event ev; /* data and obj at submit, res at completion */
	uint32_t flags;
	int resfd; /* our descriptor of the eventfd (IOCB_FLAG_RESFD), or -1 */
	off_t off;
	int iovcnt;
	struct iovec *iov; /* inl, or malloc'd for a long PREADV */
	struct iovec inl[INLINE_IOV];
	struct served *prev, *next; /* live list, done queue or free list */
};

/* A kernel write (PWRITE, PWRITEV) of a KV file, noted for write-through (wthru.h) until its
 * event is seen; under its context's mu. */
struct kwrite {
	uint64_t obj; /* the iocb */
	struct kvs_shim_wpend p;
	struct kwrite *next;
};

struct kctx {
	aio_context_t id;
	pthread_mutex_t mu;
	pthread_cond_t cond;
	unsigned running;		  /* served entries whose callback has not finished */
	long kpending;			  /* kernel entries submitted and not reaped (a hint) */
	bool ever_served;		  /* false: every call passes straight through */
	struct served *live;		  /* in flight (doubly linked) */
	struct served *dq_head, *dq_tail; /* completed, not reported yet */
	struct served *free;
	struct kwrite *writes; /* kernel writes noted for write-through, until their event */
	unsigned nwrites;
	struct kctx *next;
};

static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static struct kctx *ctxs;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void atfork_child(void)
{
	pthread_mutex_init(&ctx_mu, NULL); /* a parent's thread may have held it */
	ctxs = NULL;			   /* the kernel gave the child none of them */
}

static void atfork_register(void)
{
	pthread_atfork(NULL, NULL, atfork_child);
}

/* The context ctx, unlinked from the list if unlink; NULL if the shim keeps none. */
static struct kctx *find(aio_context_t ctx, bool unlink)
{
	struct kctx **p, *c = NULL;

	pthread_mutex_lock(&ctx_mu);
	for (p = &ctxs; *p; p = &(*p)->next) {
		if ((*p)->id == ctx) {
			c = *p;
			if (unlink)
				*p = c->next;
			break;
		}
	}
	pthread_mutex_unlock(&ctx_mu);
	return c;
}

/* The context ctx, made if need be; NULL when the kernel does not know ctx (its io_submit of
 * nothing answers -EINVAL) or memory is short: then the caller passes through. */
static struct kctx *find_or_make(aio_context_t ctx)
{
	struct kctx *c = find(ctx, false), *other;

	if (c)
		return c;
	if (RAW(SYS_io_submit, ctx, 0, NULL, 0, 0, 0) != 0)
		return NULL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	pthread_once(&atfork_once, atfork_register);
	c->id = ctx;
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cond, NULL);
	pthread_mutex_lock(&ctx_mu);
	for (other = ctxs; other && other->id != ctx; other = other->next)
		;
	if (!other) {
		c->next = ctxs;
		ctxs = c;
	}
	pthread_mutex_unlock(&ctx_mu);
	if (other) { /* another thread made it meanwhile */
		pthread_cond_destroy(&c->cond);
		pthread_mutex_destroy(&c->mu);
		free(c);
		c = other;
	}
	return c;
}

static void entry_release(struct kctx *c, struct served *s) /* caller holds c->mu */
{
	if (s->iov != s->inl)
		free(s->iov);
	s->iov = s->inl;
	s->next = c->free;
	c->free = s;
}

static void live_unlink(struct kctx *c, struct served *s) /* caller holds c->mu */
{
	if (s->prev)
		s->prev->next = s->next;
	else
		c->live = s->next;
	if (s->next)
		s->next->prev = s->prev;
	s->prev = s->next = NULL;
}

/* Is fd an eventfd?  The kernel refuses an IOCB_FLAG_RESFD that is not (EINVAL). */
static bool is_eventfd(int fd)
{
	char link[64], target[32];
	long n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = RAW(SYS_readlink, (long)link, (long)target, sizeof(target) - 1, 0, 0, 0);
	if (n <= 0)
		return false;
	target[n] = '\0';
	return strcmp(target, "anon_inode:[eventfd]") == 0;
}

/* Is fd still the eventfd we dup'ed (F_DUPFD_CLOEXEC), as far as one can tell? */
static bool ours_eventfd(int fd)
{
	long fl = RAW(SYS_fcntl, fd, F_GETFD, 0, 0, 0, 0);

	return fl >= 0 && (fl & FD_CLOEXEC) && is_eventfd(fd);
}

/* Our descriptors of the eventfds of served entries (IOCB_FLAG_RESFD), by number: set at the
 * dup, cleared by whoever closes it (the completion) or gives it up (the program closes the
 * number: kvs_libaio_numbers_closing).  Only the one that clears the bit writes and closes. */
#define RESFD_SLOTS 65536
static _Atomic uint64_t resfd_ours[RESFD_SLOTS / 64];

static _Atomic uint64_t resfd_closing[RESFD_SLOTS / 64]; /* being written and closed now */
static __thread int in_release __attribute__((tls_model("initial-exec")));

void kvs_libaio_numbers_closing(unsigned int lo, unsigned int hi)
{
	kvs_bitmap_take_range(resfd_ours, RESFD_SLOTS, lo, hi, NULL, NULL);
	if (!in_release) /* a completion on this thread that a handler interrupted: not waited */
		kvs_bitmap_wait_clear(resfd_closing, RESFD_SLOTS, lo, hi, KVS_OWNFD_WAIT_NS);
}

bool kvs_libaio_numbers_in(unsigned int lo, unsigned int hi)
{
	return kvs_bitmap_any(resfd_ours, RESFD_SLOTS, lo, hi) ||
	       kvs_bitmap_any(resfd_closing, RESFD_SLOTS, lo, hi);
}

/* The shim is done with its eventfd descriptor fd: signal it (if signal) and close it, if it
 * is still ours.  Announced first (resfd_closing), so that a program's close of the number,
 * finding the bit in resfd_ours gone, waits for this close before it is made. */
static void resfd_done(int fd, bool signal)
{
	static const uint64_t one = 1;

	if (fd < 0 || fd >= RESFD_SLOTS)
		return; /* none (no IOCB_FLAG_RESFD) */
	uint64_t bit = 1ull << (fd % 64);
	in_release++;
	atomic_fetch_or(&resfd_closing[fd / 64], bit);
	if ((atomic_fetch_and(&resfd_ours[fd / 64], ~bit) & bit) && ours_eventfd(fd)) {
		if (signal)
			RAW(SYS_write, fd, &one, sizeof(one), 0, 0, 0);
		RAW(SYS_close, fd, 0, 0, 0, 0, 0);
	}
	atomic_fetch_and(&resfd_closing[fd / 64], ~bit);
	in_release--;
}

/* A served entry is over (the loader's completion thread): a failed load is read here as the
 * kernel would have read it, through the anchor (a dup of the program's descriptor, valid
 * until this returns), so the event carries the kernel's answer either way. */
static void served_done(struct kvs_shim_async *a, int64_t result)
{
	struct served *s = a->arg;
	struct kctx *c = s->c;
	uint32_t flags = s->flags;
	int resfd = s->resfd;

	if (result < 0) {
		int fd = a->rd.fd;

		if (s->iovcnt == 1)
			result = RAW(SYS_pread64, fd, s->iov[0].iov_base, s->iov[0].iov_len, s->off,
				     0, 0);
		else
			result = RAW(SYS_preadv, fd, s->iov, s->iovcnt, (unsigned long)s->off,
				     (unsigned long)((uint64_t)s->off >> 32), 0);
	}
	pthread_mutex_lock(&c->mu);
	s->ev.res = result;
	live_unlink(c, s);
	if (c->dq_tail)
		c->dq_tail->next = s;
	else
		c->dq_head = s;
	c->dq_tail = s;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->mu);
	/* s may be reported and reused from here on: only the copies above are used.  The
	 * program may have closed our number meanwhile (a close loop) and opened a file there:
	 * written to and closed only if the close hooks did not give it to the program
	 * (resfd_release) and it is still an eventfd (a close they did not see). */
	if (flags & IOCB_FLAG_RESFD)
		resfd_done(resfd, true);
	pthread_mutex_lock(&c->mu);
	c->running--;
	pthread_cond_broadcast(&c->cond); /* io_destroy waits for running == 0 */
	pthread_mutex_unlock(&c->mu);
}

/* Bytes cb reads if the shim could serve it; 0 if it is not a read the shim takes.  One with
 * a RESFD that is not an eventfd is the kernel's to refuse. */
static size_t candidate(const struct iocb *cb)
{
	size_t len = 0;

	if (!cb || cb->aio_rw_flags || cb->aio_reserved2 || (int64_t)cb->aio_offset < 0 ||
	    (cb->aio_flags & ~(uint32_t)(IOCB_FLAG_RESFD | IOCB_FLAG_IOPRIO)))
		return 0;
	if ((cb->aio_flags & IOCB_FLAG_RESFD) && !is_eventfd((int)cb->aio_resfd))
		return 0;
	if (cb->aio_lio_opcode == IOCB_CMD_PREAD) {
		len = (size_t)cb->aio_nbytes;
	} else if (cb->aio_lio_opcode == IOCB_CMD_PREADV) {
		struct iovec local[KVS_IOV_LOCAL];
		uint64_t n = 0;

		/* The program's array, read as the kernel reads it: one it refuses is its own. */
		if (!kvs_shim_wants(SIZE_MAX) || cb->aio_nbytes > IOV_MAX ||
		    !kvs_shim_iov_read((const struct iovec *)(uintptr_t)cb->aio_buf,
				       (int)cb->aio_nbytes, local, &n))
			return 0;
		len = (size_t)n;
	} else {
		return 0;
	}
	return len && kvs_shim_wants(len) ? len : 0;
}

/* Start cb (a copy of the program's iocb at obj) as a served entry of c; 0, or -1 when the
 * cache does not take it. */
static int start(struct kctx *c, const struct iocb *cb, struct iocb *obj)
{
	struct served *s;
	int n = cb->aio_lio_opcode == IOCB_CMD_PREADV ? (int)cb->aio_nbytes : 1;

	pthread_mutex_lock(&c->mu);
	s = c->free;
	if (s)
		c->free = s->next;
	pthread_mutex_unlock(&c->mu);
	if (!s) {
		s = calloc(1, sizeof(*s));
		if (!s)
			return -1;
		s->iov = s->inl;
	}
	if (n > INLINE_IOV && !(s->iov = malloc((size_t)n * sizeof(*s->iov)))) {
		s->iov = s->inl;
		goto refused;
	}
	if (cb->aio_lio_opcode == IOCB_CMD_PREADV) {
		if (!kvs_shim_copy_in(s->iov, (const void *)(uintptr_t)cb->aio_buf,
				      (size_t)n * sizeof(*s->iov)))
			goto refused; /* changed under us since candidate() read it: the kernel's */
	} else
		s->iov[0] = (struct iovec){(void *)(uintptr_t)cb->aio_buf, (size_t)cb->aio_nbytes};
	s->c = c;
	s->a.arg = s;
	s->ev = (struct io_event){.data = cb->aio_data, .obj = (uint64_t)(uintptr_t)obj};
	s->flags = cb->aio_flags;
	/* The kernel holds the eventfd from submission: so do we, by a descriptor of our own
	 * (the program may close or reuse its number before the completion). */
	s->resfd = -1;
	if ((s->flags & IOCB_FLAG_RESFD) &&
	    (s->resfd = (int)RAW(SYS_fcntl, cb->aio_resfd, F_DUPFD_CLOEXEC, 0, 0, 0, 0)) < 0)
		goto refused;
	if (s->resfd >= RESFD_SLOTS) {
		RAW(SYS_close, s->resfd, 0, 0, 0, 0, 0); /* beyond the table: the kernel's read */
		goto refused;
	}
	if (s->resfd >= 0)
		atomic_fetch_or(&resfd_ours[s->resfd / 64], 1ull << (s->resfd % 64));
	s->off = (off_t)cb->aio_offset;
	s->iovcnt = n;
	pthread_mutex_lock(&c->mu);
	s->prev = NULL;
	s->next = c->live;
	if (c->live)
		c->live->prev = s;
	c->live = s;
	c->running++;
	c->ever_served = true;
	pthread_mutex_unlock(&c->mu);
	int r = kvs_shim_read_start(&s->a, (int)cb->aio_fildes, s->iov, n, s->off, served_done);
	if (r == 1)
		served_done(&s->a, s->a.result); /* a hit, over already: its event now */
	if (r >= 0)
		return 0;
	resfd_done(s->resfd, false);
	pthread_mutex_lock(&c->mu);
	live_unlink(c, s);
	c->running--;
	entry_release(c, s);
	pthread_mutex_unlock(&c->mu);
	return -1;
refused:
	pthread_mutex_lock(&c->mu);
	entry_release(c, s);
	pthread_mutex_unlock(&c->mu);
	return -1;
}

/* ------------------------------------------------------------------ the calls */

/* A write to a KV file changes what the cache holds: drop the shards it covers before the
 * kernel has it (the file's new times then keep the rest from being served stale). */
static void invalidate_write(const struct iocb *cb)
{
	size_t len = 0;

	if (!cb || (int64_t)cb->aio_offset < 0)
		return;
	if (cb->aio_lio_opcode == IOCB_CMD_PWRITE) {
		len = (size_t)cb->aio_nbytes;
	} else if (cb->aio_lio_opcode == IOCB_CMD_PWRITEV) {
		struct iovec local[KVS_IOV_LOCAL];
		uint64_t n = 0;

		/* Read as the kernel reads it; one it refuses fails the entry, which changes
		 * nothing. */
		if (cb->aio_nbytes <= IOV_MAX &&
		    kvs_shim_iov_read((const struct iovec *)(uintptr_t)cb->aio_buf,
				      (int)cb->aio_nbytes, local, &n))
			len = (size_t)n;
	}
	if (len)
		kvs_shim_invalidate((int)cb->aio_fildes, (off_t)cb->aio_offset, len, false, 0);
}

/* Note cb (a copy of the program's iocb) in p for write-through when it is a write of a KV
 * file; false: not noted. */
static bool note_write(struct kvs_shim_wpend *p, const struct iocb *cb)
{
	if (!cb || (int64_t)cb->aio_offset < 0 || cb->aio_rw_flags)
		return false;
	if (cb->aio_lio_opcode == IOCB_CMD_PWRITE) {
		struct iovec v = {(void *)(uintptr_t)cb->aio_buf, (size_t)cb->aio_nbytes};

		return kvs_shim_write_submitted(p, (int)cb->aio_fildes, &v, 1, cb->aio_offset);
	}
	if (cb->aio_lio_opcode == IOCB_CMD_PWRITEV && cb->aio_nbytes <= IOV_MAX)
		return kvs_shim_write_submitted(p, (int)cb->aio_fildes,
						(const struct iovec *)(uintptr_t)cb->aio_buf,
						(int)cb->aio_nbytes, cb->aio_offset);
	return false;
}

/* The noted write of the iocb at obj, taken out; NULL if none.  Caller holds c->mu. */
static struct kwrite *take_write(struct kctx *c, uint64_t obj)
{
	for (struct kwrite **pp = &c->writes; *pp; pp = &(*pp)->next) {
		if ((*pp)->obj == obj) {
			struct kwrite *w = *pp;

			*pp = w->next;
			c->nwrites--;
			return w;
		}
	}
	return NULL;
}

/* Complete w's write with result n (-1: failed, or never submitted), and free it. */
static void complete_write(struct kwrite *w, ssize_t n)
{
	if (w) {
		kvs_shim_write_completed(&w->p, n);
		free(w);
	}
}

/* n events came from the kernel into ev: the writes among them are over. */
static void kernel_events(struct kctx *c, const struct io_event *ev, long n)
{
	for (long k = 0; k < n; k++) {
		pthread_mutex_lock(&c->mu);
		struct kwrite *w = c->nwrites ? take_write(c, ev[k].obj) : NULL;
		pthread_mutex_unlock(&c->mu);
		complete_write(w, ev[k].res < 0 ? -1 : (ssize_t)ev[k].res);
	}
}

/* Submit a run of entries to the kernel (p: the program's pointers; cbs: copies of the iocbs
 * they name), noting its writes for write-through first (their bytes are copied now, and
 * their notes are in the list before the kernel has them: another thread may reap their
 * events before io_submit returns); the entries it did not take are not writes in flight. */
static long submit_run(enum via v, struct kctx *c, aio_context_t ctx, long nr, struct iocb **p,
		       const struct iocb *cbs)
{
	bool noted[KVS_SUBMIT_CHUNK] = {false};
	long n;

	for (long k = 0; k < nr; k++) {
		struct kwrite *w = malloc(sizeof(*w));

		if (!w || !note_write(&w->p, &cbs[k])) {
			free(w);
			continue;
		}
		noted[k] = true;
		w->obj = (uint64_t)(uintptr_t)p[k];
		pthread_mutex_lock(&c->mu);
		/* A note left on this iocb (its event was reaped where the shim does not look):
		 * that write is of no use now. */
		struct kwrite *stale = take_write(c, w->obj);
		w->next = c->writes;
		c->writes = w;
		c->nwrites++;
		pthread_mutex_unlock(&c->mu);
		complete_write(stale, -1);
	}
	n = k_submit(v, ctx, nr, p);
	for (long k = n < 0 ? 0 : n; k < nr; k++) {
		if (!noted[k])
			continue;
		pthread_mutex_lock(&c->mu);
		struct kwrite *gone = take_write(c, (uint64_t)(uintptr_t)p[k]);
		pthread_mutex_unlock(&c->mu);
		complete_write(gone, -1); /* never submitted */
	}
	return n;
}

/* Copy up to k leading entries of the program's iocb array p, pointers to ptr and the iocbs
 * they name to cbs, as the kernel reads them (it answers EFAULT for the first it cannot):
 * returns how many could be read. */
static long read_iocbs(struct iocb **p, long k, struct iocb **ptr, struct iocb *cbs)
{
	if (!kvs_shim_copy_in(ptr, p, (size_t)k * sizeof(*p))) {
		long all = k;

		for (k = 0; k < all && kvs_shim_copy_in(&ptr[k], &p[k], sizeof(*p));)
			k++; /* the pointers before the first the kernel cannot read */
	}
	for (long i = 0; i < k; i++)
		if (!kvs_shim_copy_in(&cbs[i], ptr[i], sizeof(*cbs)))
			return i;
	return k;
}

static long do_submit(enum via v, aio_context_t ctx, long nr, struct iocb **p)
{
	struct iocb *ptr[KVS_SUBMIT_CHUNK], cbs[KVS_SUBMIT_CHUNK];
	struct kctx *c;

	if (nr <= 0 || !p || !kvs_shim_wants(SIZE_MAX) || !(c = find_or_make(ctx)))
		return k_submit(v, ctx, nr, p);
	/* A chunk at a time: the program's pointers and iocbs read as the kernel reads them,
	 * then looked at through the copies (the kernel reads the program's again). */
	for (long base = 0; base < nr;) {
		long k = nr - base < KVS_SUBMIT_CHUNK ? nr - base : KVS_SUBMIT_CHUNK;
		long good = read_iocbs(p + base, k, ptr, cbs), i = 0;

		if (good == 0) {
			/* The kernel's answer for an entry it cannot read: nothing past it. */
			long n = k_submit(v, ctx, 1, p + base);

			if (n > 0) /* it could read it after all (the program remapped it) */
				n = base + n;
			return base ? base : n;
		}
		while (i < good) {
			if (candidate(&cbs[i]) && start(c, &cbs[i], ptr[i]) == 0) {
				i++;
				continue;
			}
			/* A run for the kernel: this entry and the non-candidates after it.  A
			 * candidate the cache then refuses starts a run of its own. */
			long j = i + 1, n;

			while (j < good && !candidate(&cbs[j]))
				j++;
			for (long q = i; q < j; q++)
				invalidate_write(&cbs[q]);
			n = submit_run(v, c, ctx, j - i, p + base + i, cbs + i);
			if (n < 0)
				return base + i ? base + i : n;
			if (n > 0) {
				pthread_mutex_lock(&c->mu);
				c->kpending += n;
				pthread_mutex_unlock(&c->mu);
			}
			i += n;
			if (i < j)
				return base + i;
		}
		base += good;
	}
	return nr;
}

/* Move up to room reported served events into ev.  Caller holds c->mu. */
static long harvest(struct kctx *c, struct io_event *ev, long room)
{
	long n = 0;

	while (n < room && c->dq_head) {
		struct served *s = c->dq_head;

		c->dq_head = s->next;
		if (!c->dq_head)
			c->dq_tail = NULL;
		ev[n++] = s->ev;
		entry_release(c, s);
	}
	return n;
}

#define SLICE_KERNEL_NS 1000000ull  /* a wait on served entries looks at the kernel this often */
#define SLICE_WAIT_NS	10000000ull /* any wait looks at the other side at least this often */

static void reaped(struct kctx *c, long n)
{
	pthread_mutex_lock(&c->mu);
	c->kpending = n < c->kpending ? c->kpending - n : 0;
	pthread_mutex_unlock(&c->mu);
}

static long do_getevents(enum via v, aio_context_t ctx, long min_nr, long nr, struct io_event *ev,
			 struct timespec *ts, const void *sig)
{
	struct kctx *c = find(ctx, false);
	uint64_t deadline = UINT64_MAX;
	long got = 0, n;

	/* Anything odd (and every context without served entries) is the kernel's to answer. */
	if (!c || min_nr < 0 || nr < min_nr || !ev ||
	    (ts && (ts->tv_sec < 0 || ts->tv_nsec < 0 || ts->tv_nsec >= 1000000000L)))
		return k_getevents(v, ctx, min_nr, nr, ev, ts, sig);
	pthread_mutex_lock(&c->mu);
	bool pass = !c->ever_served;
	pthread_mutex_unlock(&c->mu);
	if (pass) {
		n = k_getevents(v, ctx, min_nr, nr, ev, ts, sig);
		if (n > 0) {
			reaped(c, n);
			kernel_events(c, ev, n);
		}
		return n;
	}
	deadline = kvs_deadline_ns(ts);
	pthread_mutex_lock(&c->mu);
	for (;;) {
		got += harvest(c, ev + got, nr - got);
		bool ours = c->running > 0 || c->dq_head;
		long kp = c->kpending;
		pthread_mutex_unlock(&c->mu);

		if (got < nr && kp > 0 && !ring_empty(ctx)) {
			struct timespec zero = {0, 0};

			n = k_getevents(v, ctx, 0, nr - got, ev + got, &zero, sig);
			if (n < 0)
				return got ? got : n;
			kernel_events(c, ev + got, n);
			got += n;
			reaped(c, n);
		}
		if (got >= min_nr || got >= nr)
			return got;
		uint64_t t = kvs_mono_ns();
		if (t >= deadline)
			return got;
		uint64_t left = deadline - t;
		if (!ours) {
			/* Nothing of ours can complete: wait in the kernel. */
			struct timespec sl = kvs_ns_ts(left < SLICE_WAIT_NS ? left : SLICE_WAIT_NS);

			n = k_getevents(v, ctx, min_nr - got, nr - got, ev + got, &sl, sig);
			if (n < 0)
				return got ? got : n;
			kernel_events(c, ev + got, n);
			got += n;
			reaped(c, n);
			pthread_mutex_lock(&c->mu);
			continue;
		}
		uint64_t slice = kp > 0 ? SLICE_KERNEL_NS : SLICE_WAIT_NS;
		if (slice > left)
			slice = left;
		struct timespec rt;
		clock_gettime(CLOCK_REALTIME, &rt);
		uint64_t abs = (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec + slice;
		rt = kvs_ns_ts(abs);
		pthread_mutex_lock(&c->mu);
		if (!c->dq_head && c->running)
			pthread_cond_timedwait(&c->cond, &c->mu, &rt);
	}
}

static long do_cancel(enum via v, aio_context_t ctx, struct iocb *cb, struct io_event *res)
{
	struct kctx *c = find(ctx, false);
	long r;

	if (c) {
		bool ours = false;

		pthread_mutex_lock(&c->mu);
		for (struct served *s = c->live; s && !ours; s = s->next)
			ours = s->ev.obj == (uint64_t)(uintptr_t)cb;
		for (struct served *s = c->dq_head; s && !ours; s = s->next)
			ours = s->ev.obj == (uint64_t)(uintptr_t)cb;
		pthread_mutex_unlock(&c->mu);
		if (ours)
			return -EAGAIN; /* a read from memory: it completes, and is reported */
	}
	r = k_cancel(v, ctx, cb, res);
	if (c && r == 0) {
		reaped(c, 1); /* the old kernels' cancel: the event came back here */
		if (res)
			kernel_events(c, res, 1);
	}
	return r;
}

static long do_destroy(enum via v, aio_context_t ctx)
{
	struct kctx *c = find(ctx, true);

	if (c) {
		struct served *s, *next;

		pthread_mutex_lock(&c->mu);
		while (c->running) /* the loader writes into the entries until then */
			pthread_cond_wait(&c->cond, &c->mu);
		pthread_mutex_unlock(&c->mu);
		for (s = c->dq_head; s; s = next) {
			next = s->next;
			if (s->iov != s->inl)
				free(s->iov);
			free(s);
		}
		for (s = c->free; s; s = next) {
			next = s->next;
			free(s);
		}
		while (c->writes) /* their events will never be seen: keep nothing of them */
			complete_write(take_write(c, c->writes->obj), -1);
		pthread_cond_destroy(&c->cond);
		pthread_mutex_destroy(&c->mu);
		free(c);
	}
	return k_destroy(v, ctx);
}

/* ------------------------------------------------------------------ the exported names */

int io_submit(void *ctx, long nr, struct iocb **ios);
int io_getevents(void *ctx, long min_nr, long nr, struct io_event *events,
		 struct timespec *timeout);
int io_pgetevents(void *ctx, long min_nr, long nr, struct io_event *events,
		  struct timespec *timeout, sigset_t *sigmask);
int io_cancel(void *ctx, struct iocb *iocb, struct io_event *evt);
int io_destroy(void *ctx);

bool kvs_libaio_syscall(long number, const long *a, long *r)
{
	if (in_libaio) { /* libaio's own system call, inside one of ours: the kernel's */
		*r = kvs_raw6(number, a[0], a[1], a[2], a[3], a[4], a[5]);
		return true;
	}
	switch (number) {
	case SYS_io_submit:
		*r = do_submit(VIA_SYSCALL, (aio_context_t)a[0], a[1], (struct iocb **)a[2]);
		return true;
	case SYS_io_getevents:
		*r = do_getevents(VIA_SYSCALL, (aio_context_t)a[0], a[1], a[2],
				  (struct io_event *)a[3], (struct timespec *)a[4], NULL);
		return true;
#ifdef SYS_io_pgetevents
	case SYS_io_pgetevents:
		/* A NULL sigset pointer is plain io_getevents to the kernel. */
		*r = do_getevents(VIA_SYSCALL, (aio_context_t)a[0], a[1], a[2],
				  (struct io_event *)a[3], (struct timespec *)a[4],
				  a[5] ? (const void *)a[5] : NULL);
		return true;
#endif
	case SYS_io_cancel:
		*r = do_cancel(VIA_SYSCALL, (aio_context_t)a[0], (struct iocb *)a[1],
			       (struct io_event *)a[2]);
		return true;
	case SYS_io_destroy:
		*r = do_destroy(VIA_SYSCALL, (aio_context_t)a[0]);
		return true;
	default:
		return false;
	}
}

/* libaio's calls answer -errno and leave errno alone. */
KVS_EXPORT int io_submit(void *ctx, long nr, struct iocb **ios)
{
	return (int)do_submit(VIA_LIBAIO, (aio_context_t)ctx, nr, ios);
}

KVS_EXPORT int io_getevents(void *ctx, long min_nr, long nr, struct io_event *events,
			    struct timespec *timeout)
{
	return (int)do_getevents(VIA_LIBAIO, (aio_context_t)ctx, min_nr, nr, events, timeout, NULL);
}

KVS_EXPORT int io_pgetevents(void *ctx, long min_nr, long nr, struct io_event *events,
			     struct timespec *timeout, sigset_t *sigmask)
{
	struct {
		const sigset_t *mask;
		size_t size;
	} sig = {sigmask, _NSIG / 8};

	return (int)do_getevents(VIA_LIBAIO, (aio_context_t)ctx, min_nr, nr, events, timeout,
				 sigmask ? &sig : NULL);
}

KVS_EXPORT int io_cancel(void *ctx, struct iocb *iocb, struct io_event *evt)
{
	return (int)do_cancel(VIA_LIBAIO, (aio_context_t)ctx, iocb, evt);
}

KVS_EXPORT int io_destroy(void *ctx)
{
	return (int)do_destroy(VIA_LIBAIO, (aio_context_t)ctx);
}
