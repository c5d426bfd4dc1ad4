/*
 * kaio_kernel: the kernel part of the kernel AIO engine's calls (kaio_int.h): libaio's real
 * io_submit, io_getevents, io_cancel and io_destroy when the caller came through libaio and
 * they can be found, else the raw system call (which is all libaio makes); io_pgetevents is
 * always the system call.  The protocol is the DESIGN comment of api/kaio.c.
 */
#include <dlfcn.h>
#include <errno.h>
#include <linux/aio_abi.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <time.h>

#include "dlsym.h"
#include "kaio.h"
#include "kaio_int.h"
#include "raw.h"

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
__thread int kaio_in_libaio __attribute__((tls_model("initial-exec")));

#define LIBAIO_CALL(call)                                                                          \
	({                                                                                         \
		kaio_in_libaio++;                                                                  \
		long r_ = (call);                                                                  \
		kaio_in_libaio--;                                                                  \
		r_;                                                                                \
	})

long kaio_real_submit(enum kvs_kaio_via v, aio_context_t ctx, long nr, struct iocb **p)
{
	if (v == KVS_KAIO_LIBAIO && la_ready() && la.submit)
		return LIBAIO_CALL(la.submit((void *)ctx, nr, p));
	return RAW(SYS_io_submit, ctx, nr, p, 0, 0, 0);
}

/* sig: io_pgetevents' struct __aio_sigset, or NULL for io_getevents. */
long kaio_real_getevents(enum kvs_kaio_via v, aio_context_t ctx, long min_nr, long nr,
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

long kaio_real_cancel(enum kvs_kaio_via v, aio_context_t ctx, struct iocb *cb, struct io_event *res)
{
	if (v == KVS_KAIO_LIBAIO && la_ready() && la.cancel)
		return LIBAIO_CALL(la.cancel((void *)ctx, cb, res));
	return RAW(SYS_io_cancel, ctx, cb, res, 0, 0, 0);
}

long kaio_real_destroy(enum kvs_kaio_via v, aio_context_t ctx)
{
	if (v == KVS_KAIO_LIBAIO && la_ready() && la.destroy)
		return LIBAIO_CALL(la.destroy((void *)ctx));
	return RAW(SYS_io_destroy, ctx, 0, 0, 0, 0, 0);
}
