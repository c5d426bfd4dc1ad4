/*
 * kaio: the engine of kernel AIO served by the cache (docs/design.md, "Kernel AIO
 * (`api/kaio.c`)").
 *
 * Two doors lead to it: libc's syscall() for the io_* numbers (UCM's AIO engine calls it
 * directly; hooks/syscall.c sends them to kvs_libaio_syscall) and libaio's io_submit,
 * io_getevents, io_pgetevents, io_cancel and io_destroy (NIXL's POSIX plugin, fio's libaio
 * engine; their doors are hooks/libaio.c).  Internally every function returns
 * -errno, as libaio does; syscall() turns that into -1 and errno.  The kernel part of a call
 * goes to libaio's real function when the caller came through libaio and it can be found,
 * else to the raw system call (which is all libaio does).  libc's syscall() is the shim's for
 * every number (hooks/syscall.c): the io_* numbers come here, through kvs_libaio_syscall.
 *
 * DESIGN.  Every event comes from the kernel, so every reaper finds it where the kernel puts
 * it: libaio's io_getevents (which peeks at the completion ring, a static libaio's too, and
 * makes no system call when it is empty), SYS_io_getevents, io_pgetevents, a program that
 * reads the ring itself, and the eventfd of IOCB_FLAG_RESFD.  io_submit looks at the iocbs a
 * chunk at a time (KVS_SUBMIT_CHUNK).  The reads the cache takes (kvs_shim_read_start) are all
 * started, then waited for: the loader runs them together, owners reading storage while the
 * others wait on the state words.  Each read the cache served is then handed to the kernel as
 * its carrier: the program's iocb, rewritten in place, writes the read's bytes to /dev/null (a
 * shim descriptor, kvs_ownfd), which the kernel completes at once with that count, through the
 * program's context, aio_data, eventfd and iocb address, as it would have completed the read.  The
 * whole chunk, carriers and the program's other entries in their order, goes to the kernel in one
 * call.  A read the cache did not serve (a failed load, a short read at the end of a file:
 * carrier_set) goes to the kernel as it is, and so do carriers the kernel did not take (put back as
 * they were).  io_getevents, io_pgetevents, io_cancel and io_destroy are the kernel's; the shim
 * only looks at their events for the writes it noted for write-through.
 *
 * The price: an io_submit with served reads returns once their bytes are in the buffers (a
 * buffered read's io_submit does the same in the kernel), and a served iocb reads as its
 * carrier from then on.  The shim never writes an iocb once it is in the kernel: the kernel
 * names an event by the address it read the iocb from and posts it during the call, and from
 * then on the program may free or reuse that memory (another thread may reap the event before
 * io_submit returns).  A carrier submitted again gets its read back (carrier_undo).
 * Why not complete later, from the loader: for the same reason, the shim cannot write an iocb
 * after io_submit returns.
 *
 * Locks: ctx_mu guards the list of contexts (held briefly, never across a call); each
 * context's mu guards its noted writes.  Lock order: ctx_mu before a context's mu (only in
 * find/create).  No lock is held across a system call, a call into libaio or into the loader.
 *
 * Fork: the child has none of the parent's contexts (the kernel does not copy them) and none
 * of its loader threads; the child handler forgets the list (its memory is abandoned) and
 * keeps the inherited /dev/null descriptor.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/aio_abi.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dlsym.h"
#include "fdinfo.h"
#include "kaio.h"
#include "progmem.h"
#include "raw.h"
#include "shim.h"
#include "sys.h"
#include "touch.h"
#include "uring.h"

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
		kvs_dlclose_real(h); /* RTLD_NOLOAD took a reference; the library stays loaded */
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

static long k_submit(enum kvs_kaio_via v, aio_context_t ctx, long nr, struct iocb **p)
{
	if (v == KVS_KAIO_LIBAIO && la_ready() && la.submit)
		return LIBAIO_CALL(la.submit((void *)ctx, nr, p));
	return RAW(SYS_io_submit, ctx, nr, p, 0, 0, 0);
}

/* sig: io_pgetevents' struct __aio_sigset, or NULL for io_getevents. */
static long k_getevents(enum kvs_kaio_via v, aio_context_t ctx, long min_nr, long nr,
			struct io_event *ev, struct timespec *ts, const void *sig)
{
	if (sig)
#ifdef SYS_io_pgetevents
		return RAW(SYS_io_pgetevents, ctx, min_nr, nr, ev, ts, sig);
#else
		return -ENOSYS;
#endif
	if (v == KVS_KAIO_LIBAIO && la_ready() && la.getevents)
		return LIBAIO_CALL(la.getevents((void *)ctx, min_nr, nr, ev, ts));
	return RAW(SYS_io_getevents, ctx, min_nr, nr, ev, ts, 0);
}

static long k_cancel(enum kvs_kaio_via v, aio_context_t ctx, struct iocb *cb, struct io_event *res)
{
	if (v == KVS_KAIO_LIBAIO && la_ready() && la.cancel)
		return LIBAIO_CALL(la.cancel((void *)ctx, cb, res));
	return RAW(SYS_io_cancel, ctx, cb, res, 0, 0, 0);
}

static long k_destroy(enum kvs_kaio_via v, aio_context_t ctx)
{
	if (v == KVS_KAIO_LIBAIO && la_ready() && la.destroy)
		return LIBAIO_CALL(la.destroy((void *)ctx));
	return RAW(SYS_io_destroy, ctx, 0, 0, 0, 0, 0);
}

/* ------------------------------------------------------------------ contexts */

#define INLINE_IOV	 4
#define KVS_SUBMIT_CHUNK 64 /* iocbs of one io_submit looked at, and served, together */

/* A kernel write (PWRITE, PWRITEV) of a KV file, noted for write-through (wthru.h) until its
 * event is seen; under its context's mu. */
struct kwrite {
	uint64_t obj; /* the iocb */
	struct kvs_shim_wpend p;
	struct kwrite *next;
};

/* What the shim keeps of an io context: its kernel writes in flight, nothing else. */
struct kctx {
	aio_context_t id;
	pthread_mutex_t mu;
	struct kwrite *writes; /* kernel writes noted for write-through, until their event */
	unsigned nwrites;
	struct kctx *next;
};

static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static struct kctx *ctxs;

static pthread_mutex_t carriers_mu = PTHREAD_MUTEX_INITIALIZER; /* the carriers' table */

/* The carriers' descriptor: /dev/null, opened for writing at the first served entry. */
static struct kvs_ownfd devnull = KVS_OWNFD_INIT;

void kvs_libaio_atfork_child(void)
{
	pthread_mutex_init(&ctx_mu, NULL);	/* a parent's thread may have held it */
	pthread_mutex_init(&carriers_mu, NULL); /* the same */
	ctxs = NULL;				/* the kernel gave the child none of them */
	kvs_ownfd_atfork_child(&devnull);	/* the descriptor is inherited, its users are not */
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
	c->id = ctx;
	pthread_mutex_init(&c->mu, NULL);
	pthread_mutex_lock(&ctx_mu);
	for (other = ctxs; other && other->id != ctx; other = other->next)
		;
	if (!other) {
		c->next = ctxs;
		ctxs = c;
	}
	pthread_mutex_unlock(&ctx_mu);
	if (other) { /* another thread made it meanwhile */
		pthread_mutex_destroy(&c->mu);
		free(c);
		c = other;
	}
	return c;
}

/* ------------------------------------------------------------------ carriers */

void kvs_libaio_numbers_closing(unsigned int lo, unsigned int hi)
{
	kvs_ownfd_closing(&devnull, lo, hi);
}

bool kvs_libaio_numbers_in(unsigned int lo, unsigned int hi)
{
	return kvs_ownfd_in(&devnull, lo, hi);
}

/* The carriers' descriptor, held (kvs_ownfd_put with *ticket), or -1: serve nothing. */
static int devnull_get(unsigned int *ticket)
{
	int fd = kvs_ownfd_get(&devnull, ticket);
	struct stat st;

	if (fd >= 0)
		return fd;
	if (kvs_ownfd_peek(&devnull) >= 0)
		return -1; /* there, but not ours any more (a close the hooks did not see) */
	fd = kvs_sys_openat(AT_FDCWD, "/dev/null", O_WRONLY | O_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	fd = kvs_fd_move_high(fd);
	if (RAW(SYS_fstat, fd, &st, 0, 0, 0, 0) != 0 || !S_ISCHR(st.st_mode)) {
		kvs_sys_close(fd);
		return -1;
	}
	devnull.dev = (uint64_t)st.st_dev;
	devnull.ino = (uint64_t)st.st_ino;
	if (!kvs_ownfd_publish(&devnull, fd))
		kvs_sys_close(fd); /* another thread was first: use its */
	return kvs_ownfd_get(&devnull, ticket);
}

/* Carriers the program may submit again as they are (an iocb prepared once and submitted
 * again without io_prep_*), by the iocb's address: what it was and what it is now.  Under
 * carriers_mu; a slot is overwritten by the next carrier that hashes there. */
#define CARRIERS 1024
static struct carried {
	uintptr_t obj;
	struct iocb was, as;
} carriers[CARRIERS];

static struct carried *carried_slot(uintptr_t obj)
{
	return &carriers[(obj >> 6) * 0x9E3779B97F4A7C15ull >> 54];
}

/* Rewrite the program's iocb at obj (cb: our copy of it) into the carrier of a served read
 * that gave all its len bytes: a write of them to /dev/null, which the kernel completes at
 * once with that count, through the program's context, its aio_data, its eventfd and its
 * iocb's address.  Only the opcode and the descriptor change (PREAD to PWRITE, PREADV to
 * PWRITEV over the same array: the same count either way).  The iocb stays so once submitted:
 * the kernel posts the event during the io_submit, and the program may then free its memory.
 * False, with the iocb untouched: the entry goes to the kernel as it is.  A short read (the
 * end of the file) is never carried: a carrier's count is its aio_nbytes, and a program that
 * compares its result with aio_nbytes must see it short. */
static bool carrier_set(struct iocb *obj, const struct iocb *cb, size_t len, int64_t result,
			int nullfd)
{
	struct iocb k = *cb;

	if (result < 0 || (uint64_t)result != len)
		return false;
	k.aio_fildes = (uint32_t)nullfd;
	k.aio_lio_opcode =
	    cb->aio_lio_opcode == IOCB_CMD_PREADV ? IOCB_CMD_PWRITEV : IOCB_CMD_PWRITE;
	if (!kvs_progmem_store(obj, &k, sizeof(k)))
		return false;
	struct carried *e = carried_slot((uintptr_t)obj);
	pthread_mutex_lock(&carriers_mu);
	*e = (struct carried){(uintptr_t)obj, *cb, k};
	pthread_mutex_unlock(&carriers_mu);
	return true;
}

/* The program submits the iocb at obj (cb: our copy) again: if it still holds a carrier's
 * opcode and descriptor (the program may have changed its offset, buffer or data, as a reused
 * iocb is), those two are put back as they were, in the program's memory and in cb, before
 * the kernel reads it (the program owns it again: it is submitting it).  A carrier whose slot
 * another took since is not known any more: it goes to the kernel as a write to /dev/null, so
 * the slots are many (CARRIERS) and a miss is a read that returns no bytes, said nowhere. */
static void carrier_undo(struct iocb *obj, struct iocb *cb)
{
	struct carried *e = carried_slot((uintptr_t)obj), c;

	pthread_mutex_lock(&carriers_mu);
	c = *e;
	pthread_mutex_unlock(&carriers_mu);
	if (c.obj != (uintptr_t)obj || cb->aio_fildes != c.as.aio_fildes ||
	    cb->aio_lio_opcode != c.as.aio_lio_opcode)
		return;
	struct iocb k = *cb;
	k.aio_fildes = c.was.aio_fildes;
	k.aio_lio_opcode = c.was.aio_lio_opcode;
	if (kvs_progmem_store(obj, &k, sizeof(k)))
		*cb = k;
}

/* ------------------------------------------------------------------ served entries */

/* A served iocb of one io_submit, from its start until its result is known. */
struct served {
	struct kvs_shim_async a; /* a.arg: the batch */
	int64_t result;		 /* bytes, or -errno: the kernel reads it */
	size_t len;		 /* bytes asked for */
	int iovcnt;
	struct iovec *iov; /* inl, or malloc'd for a long PREADV */
	struct iovec inl[INLINE_IOV];
};

/* The served entries of one chunk of an io_submit; on the submitting thread's heap. */
struct batch {
	_Atomic uint32_t running; /* started entries whose result is not in yet: a futex word */
	bool started[KVS_SUBMIT_CHUNK];
	struct served e[KVS_SUBMIT_CHUNK];
};

/* A served entry is over (the loader's completion thread).  The result is stored before the
 * count drops (release: pairs with the acquire in batch_wait); the last one wakes the
 * submitter, which may free the batch as soon as it sees 0: the wake is the last touch. */
static void served_done(struct kvs_shim_async *a, int64_t result)
{
	struct served *s = (struct served *)a;
	struct batch *b = a->arg;

	s->result = result;
	if (atomic_fetch_sub_explicit(&b->running, 1, memory_order_release) == 1)
		kvs_futex_wake(&b->running, 1, false); /* on freed memory at worst: harmless */
}

/* Wait until every started entry of b has its result. */
static void batch_wait(struct batch *b)
{
	uint32_t n;

	while ((n = atomic_load_explicit(&b->running, memory_order_acquire)) != 0) /* pairs above */
		kvs_futex_wait(&b->running, n, 0, false);
}

/* Bytes cb reads if the shim could serve it; 0 if it is not a read the shim takes. */
static size_t candidate(const struct iocb *cb)
{
	size_t len = 0;

	if (!cb || cb->aio_rw_flags || cb->aio_reserved2 || (int64_t)cb->aio_offset < 0 ||
	    (cb->aio_flags & ~(uint32_t)(IOCB_FLAG_RESFD | IOCB_FLAG_IOPRIO)))
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

/* Start cb (our copy of a program's iocb) as entry s of batch b: true when the cache took it
 * (its result is then in s->result once b's count says so). */
static bool start(struct batch *b, struct served *s, const struct iocb *cb, size_t len)
{
	int n = cb->aio_lio_opcode == IOCB_CMD_PREADV ? (int)cb->aio_nbytes : 1;

	s->iov = s->inl;
	if (n > INLINE_IOV && !(s->iov = malloc((size_t)n * sizeof(*s->iov)))) {
		s->iov = s->inl;
		return false;
	}
	if (cb->aio_lio_opcode == IOCB_CMD_PREADV) {
		if (!kvs_shim_copy_in(s->iov, (const void *)(uintptr_t)cb->aio_buf,
				      (size_t)n * sizeof(*s->iov)))
			goto refused; /* changed under us since candidate() read it: the kernel's */
	} else {
		s->iov[0] = (struct iovec){(void *)(uintptr_t)cb->aio_buf, (size_t)cb->aio_nbytes};
	}
	s->iovcnt = n;
	s->len = len;
	s->a.arg = b;
	atomic_fetch_add_explicit(&b->running, 1, memory_order_relaxed);
	int r = kvs_shim_read_start(&s->a, (int)cb->aio_fildes, s->iov, n, (off_t)cb->aio_offset,
				    served_done);
	if (r == 0)
		return true; /* served_done will count it */
	atomic_fetch_sub_explicit(&b->running, 1, memory_order_relaxed);
	if (r == 1) {
		s->result = s->a.result; /* a hit, over already */
		return true;
	}
refused:
	if (s->iov != s->inl)
		free(s->iov);
	s->iov = s->inl;
	return false;
}

static void batch_free(struct batch *b)
{
	if (!b)
		return;
	for (int i = 0; i < KVS_SUBMIT_CHUNK; i++)
		if (b->started[i] && b->e[i].iov != b->e[i].inl)
			free(b->e[i].iov);
	free(b);
}

/* ------------------------------------------------------------------ writes */

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
	if (len) {
		kvs_shim_invalidate((int)cb->aio_fildes, (off_t)cb->aio_offset, len, false, 0);
		/* A rewrite of a write-once file counts at the submission (its event comes later,
		 * maybe where the shim does not look). */
		kvs_shim_invalidate((int)cb->aio_fildes, (off_t)cb->aio_offset, len, false,
				    -(off_t)len);
	}
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
static long submit_run(enum kvs_kaio_via v, struct kctx *c, aio_context_t ctx, long nr,
		       struct iocb **p, const struct iocb *cbs)
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

/* Submit good (>= 1) readable entries of the program's array p (ptr: its pointers; cbs: our
 * copies of the iocbs) as the kernel would: the reads the cache takes are served first, all of
 * them started before any is waited for, and each then handed to the kernel as its carrier
 * (carrier_set) in its place among the others, in one system call.  Returns the kernel's
 * answer for the call. */
static long submit_chunk(enum kvs_kaio_via v, struct kctx *c, aio_context_t ctx, long good,
			 struct iocb **p, struct iocb **ptr, struct iocb *cbs)
{
	struct batch *b = NULL;
	bool carried[KVS_SUBMIT_CHUNK] = {false};
	unsigned int ticket = 0;
	int nullfd = -1;
	long n;

	for (long i = 0; i < good; i++)
		carrier_undo(ptr[i], &cbs[i]);
	for (long i = 0; i < good; i++) {
		size_t len = candidate(&cbs[i]);

		if (!len)
			continue;
		if (!b) {
			if (!(b = malloc(sizeof(*b))))
				break;
			atomic_init(&b->running, 0);
			memset(b->started, 0, sizeof(b->started));
		}
		b->started[i] = start(b, &b->e[i], &cbs[i], len);
	}
	if (b)
		batch_wait(b);
	/* The carriers' descriptor held from here to the submit only: a close of its number by the
	 * program waits for that (kvs_ownfd_closing), never for a load. */
	if (b)
		nullfd = devnull_get(&ticket);
	for (long i = 0; b && nullfd >= 0 && i < good; i++)
		if (b->started[i])
			carried[i] =
			    carrier_set(ptr[i], &cbs[i], b->e[i].len, b->e[i].result, nullfd);
	for (long i = 0; i < good; i++)
		if (!carried[i])
			invalidate_write(&cbs[i]);
	/* The kernel posts a carrier's event during the call, and another thread may reap it and
	 * free the iocb before the call returns: no touch of an iocb the kernel took after this. */
	n = submit_run(v, c, ctx, good, p, cbs);
	/* Those it did not take (it stops at the first it refuses) it never read and will post
	 * nothing for: still the program's, to submit again or read itself, as they were. */
	for (long i = n < 0 ? 0 : n; i < good; i++)
		if (carried[i])
			kvs_progmem_store(ptr[i], &cbs[i], sizeof(cbs[i]));
	if (nullfd >= 0)
		kvs_ownfd_put(&devnull, ticket);
	batch_free(b);
	return n;
}

long kvs_kaio_submit(enum kvs_kaio_via v, aio_context_t ctx, long nr, struct iocb **p)
{
	struct iocb *ptr[KVS_SUBMIT_CHUNK], cbs[KVS_SUBMIT_CHUNK];
	struct kctx *c;

	if (nr <= 0 || !p || !kvs_shim_wants(SIZE_MAX) || !(c = find_or_make(ctx)))
		return k_submit(v, ctx, nr, p);
	/* A chunk at a time: the program's pointers and iocbs read as the kernel reads them,
	 * then looked at through the copies (the kernel reads the program's again). */
	for (long base = 0; base < nr;) {
		long k = nr - base < KVS_SUBMIT_CHUNK ? nr - base : KVS_SUBMIT_CHUNK;
		long good = read_iocbs(p + base, k, ptr, cbs), n;

		if (good == 0) {
			/* The kernel's answer for an entry it cannot read: nothing past it. */
			n = k_submit(v, ctx, 1, p + base);
			if (n > 0) /* it could read it after all (the program remapped it) */
				n = base + n;
			return base ? base : n;
		}
		n = submit_chunk(v, c, ctx, good, p + base, ptr, cbs);
		if (n < 0)
			return base ? base : n;
		base += n;
		if (n < good)
			return base; /* the kernel took part of it: nothing past that point */
	}
	return nr;
}

/* ------------------------------------------------------------------ reaping */

long kvs_kaio_getevents(enum kvs_kaio_via v, aio_context_t ctx, long min_nr, long nr,
			struct io_event *ev, struct timespec *ts, const void *sig)
{
	struct kctx *c = find(ctx, false);
	long n = k_getevents(v, ctx, min_nr, nr, ev, ts, sig);

	if (c && n > 0 && ev)
		kernel_events(c, ev, n);
	return n;
}

long kvs_kaio_cancel(enum kvs_kaio_via v, aio_context_t ctx, struct iocb *cb, struct io_event *res)
{
	struct kctx *c = find(ctx, false);
	long r = k_cancel(v, ctx, cb, res);

	if (c && r == 0 && res)
		kernel_events(c, res, 1); /* the old kernels' cancel: the event came back here */
	return r;
}

long kvs_kaio_destroy(enum kvs_kaio_via v, aio_context_t ctx)
{
	struct kctx *c = find(ctx, true);

	if (c) {
		while (c->writes) /* their events will never be seen: keep nothing of them */
			complete_write(take_write(c, c->writes->obj), -1);
		pthread_mutex_destroy(&c->mu);
		free(c);
	}
	return k_destroy(v, ctx);
}

bool kvs_libaio_syscall(long number, const long *a, long *r)
{
	if (in_libaio) { /* libaio's own system call, inside one of ours: the kernel's */
		*r = kvs_raw6(number, a[0], a[1], a[2], a[3], a[4], a[5]);
		return true;
	}
	switch (number) {
	case SYS_io_submit:
		*r = kvs_kaio_submit(KVS_KAIO_SYSCALL, (aio_context_t)a[0], a[1],
				     (struct iocb **)a[2]);
		return true;
	case SYS_io_getevents:
		*r = kvs_kaio_getevents(KVS_KAIO_SYSCALL, (aio_context_t)a[0], a[1], a[2],
					(struct io_event *)a[3], (struct timespec *)a[4], NULL);
		return true;
#ifdef SYS_io_pgetevents
	case SYS_io_pgetevents:
		/* A NULL sigset pointer is plain io_getevents to the kernel. */
		*r = kvs_kaio_getevents(KVS_KAIO_SYSCALL, (aio_context_t)a[0], a[1], a[2],
					(struct io_event *)a[3], (struct timespec *)a[4],
					a[5] ? (const void *)a[5] : NULL);
		return true;
#endif
	case SYS_io_cancel:
		*r = kvs_kaio_cancel(KVS_KAIO_SYSCALL, (aio_context_t)a[0], (struct iocb *)a[1],
				     (struct io_event *)a[2]);
		return true;
	case SYS_io_destroy:
		*r = kvs_kaio_destroy(KVS_KAIO_SYSCALL, (aio_context_t)a[0]);
		return true;
	default:
		return false;
	}
}
