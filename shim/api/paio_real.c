/*
 * paio_real: glibc's own POSIX aio functions, found once (the plain names and their 64 names),
 * for the files of the POSIX aio engine (paio_int.h; the protocol is the DESIGN comment of
 * api/paio.c).  Each paio_real_* answers as glibc's function, errno included, or -1 ENOSYS when
 * glibc's cannot be found.
 */
#include <aio.h>
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>

#include "dlsym.h"
#include "elfsym.h"
#include "paio_int.h"

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

int paio_real_read(int v, struct aiocb *cb)
{
	int (*fn)(struct aiocb *) = real_fn(v, R_READ);

	if (!fn)
		NOSYS(-1);
	return fn(cb);
}

int paio_real_write(int v, struct aiocb *cb)
{
	int (*fn)(struct aiocb *) = real_fn(v, R_WRITE);

	if (!fn)
		NOSYS(-1);
	return fn(cb);
}

int paio_real_lio(int v, int mode, struct aiocb *const list[], int nent, struct sigevent *sig)
{
	int (*fn)(int, struct aiocb *const[], int, struct sigevent *) = real_fn(v, R_LIO);

	if (!fn)
		NOSYS(-1);
	return fn(mode, list, nent, sig);
}

int paio_real_error(int v, const struct aiocb *cb)
{
	int (*fn)(const struct aiocb *) = real_fn(v, R_ERROR);

	if (!fn)
		NOSYS(-1);
	return fn(cb);
}

ssize_t paio_real_return(int v, struct aiocb *cb)
{
	ssize_t (*fn)(struct aiocb *) = real_fn(v, R_RETURN);

	if (!fn)
		NOSYS(-1);
	return fn(cb);
}

int paio_real_suspend(int v, const struct aiocb *const list[], int nent,
		      const struct timespec *timeout)
{
	int (*fn)(const struct aiocb *const[], int, const struct timespec *) =
	    real_fn(v, R_SUSPEND);

	if (!fn)
		NOSYS(-1);
	return fn(list, nent, timeout);
}

int paio_real_cancel(int v, int fd, struct aiocb *cb)
{
	int (*fn)(int, struct aiocb *) = real_fn(v, R_CANCEL);

	if (!fn)
		NOSYS(-1);
	return fn(fd, cb);
}
