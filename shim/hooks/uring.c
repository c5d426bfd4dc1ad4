/*
 * hooks_uring: liburing's names, the doors of the program's io_uring reads (the engine:
 * api/uring.c, whose DESIGN comment says what is served).  Each submitting name serves the ring's
 * pending entries (kvs_uring_serve_liburing), then calls the caller's own liburing; each
 * registration name records what it registered.  The real function is the caller's liburing
 * (the library its own lookup scope finds: a plugin's private liburing too), never the shim's
 * own copy, which is renamed (CMakeLists.txt): found once per call site and cached.
 */
#include <dlfcn.h>
#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "dlsym.h"
#include "elfsym.h"
#include "hooks_uring.h"
#include "shim.h"
#include "uring.h"

#define MAX_CALLER 16

/* The caller's liburing function name: the definition its own lookup scope finds (a plugin's
 * private liburing too), else the next one after the shim, else any loaded liburing's; never
 * the shim's own.  Cached per call site (the return address): dladdr and dlopen take the
 * loader's lock, a submit must not. */
static void *resolve_for(const char *name, const void *caller)
{
	Dl_info info;
	void *p = NULL;

	if (dladdr(caller, &info) && info.dli_fname && info.dli_fname[0]) {
		void *h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
		if (h) {
			p = kvs_dlsym_real(h, name);
			kvs_dlclose_real(h);
		}
	}
	if (!p || kvs_dlsym_in_shim(p))
		p = kvs_dlsym_real(RTLD_NEXT, name);
	if (!p || kvs_dlsym_in_shim(p))
		p = kvs_elf_symbol("liburing.so", name, NULL);
	return p && !kvs_dlsym_in_shim(p) ? p : NULL;
}

#define NSLOTS 14

static struct {
	const void *_Atomic site;
	void *_Atomic fn;
} cache[NSLOTS][MAX_CALLER];
static pthread_mutex_t insert_mu = PTHREAD_MUTEX_INITIALIZER;

void kvs_uring_unloaded(void)
{
	/* A library was unloaded: a call site or a liburing function cached may be gone, or be
	 * another's code now.  Sites first, so a reader that still finds one finds its fn or a
	 * NULL (a miss). */
	pthread_mutex_lock(&insert_mu);
	for (int k = 0; k < NSLOTS; k++)
		for (int i = 0; i < MAX_CALLER; i++)
			atomic_store_explicit(&cache[k][i].site, NULL, memory_order_relaxed);
	for (int k = 0; k < NSLOTS; k++)
		for (int i = 0; i < MAX_CALLER; i++)
			atomic_store_explicit(&cache[k][i].fn, NULL, memory_order_relaxed);
	pthread_mutex_unlock(&insert_mu);
}

static void *caller_fn(const char *name, int slot, const void *caller)
{
	for (int i = 0; i < MAX_CALLER; i++) {
		const void *s = atomic_load_explicit(&cache[slot][i].site, memory_order_acquire);
		if (s == caller) {
			void *p = atomic_load_explicit(&cache[slot][i].fn, memory_order_relaxed);
			if (p)
				return p;
			break;
		}
		if (!s)
			break;
	}
	int saved = errno;
	void *p = resolve_for(name, caller);
	errno = saved;
	/* One inserter at a time: fn first, then the site (release), so that a reader that finds
	 * the site finds its fn.  A full cache only costs the next call another lookup. */
	pthread_mutex_lock(&insert_mu);
	for (int i = 0; p && i < MAX_CALLER; i++) {
		const void *s = atomic_load_explicit(&cache[slot][i].site, memory_order_relaxed);

		if (s == caller)
			break;
		if (!s) {
			atomic_store_explicit(&cache[slot][i].fn, p, memory_order_relaxed);
			atomic_store_explicit(&cache[slot][i].site, caller, memory_order_release);
			break;
		}
	}
	pthread_mutex_unlock(&insert_mu);
	return p;
}

#define CALLER()	       __builtin_extract_return_addr(__builtin_return_address(0))
#define REAL(slot, name, type) ((type)caller_fn(name, slot, CALLER()))

KVS_EXPORT int io_uring_submit(struct io_uring *ring)
{
	int (*fn)(struct io_uring *) = REAL(0, "io_uring_submit", int (*)(struct io_uring *));

	if (!fn)
		return -ENOSYS;
	kvs_uring_serve_liburing(ring, false, 0);
	return fn(ring);
}

KVS_EXPORT int io_uring_submit_and_wait(struct io_uring *ring, unsigned wait_nr)
{
	int (*fn)(struct io_uring *, unsigned) =
	    REAL(1, "io_uring_submit_and_wait", int (*)(struct io_uring *, unsigned));

	if (!fn)
		return -ENOSYS;
	kvs_uring_serve_liburing(ring, false, 0);
	return fn(ring, wait_nr);
}

KVS_EXPORT int io_uring_submit_and_wait_timeout(struct io_uring *ring,
						struct io_uring_cqe **cqe_ptr, unsigned wait_nr,
						struct __kernel_timespec *ts, sigset_t *sigmask)
{
	typedef int (*fn_t)(struct io_uring *, struct io_uring_cqe **, unsigned,
			    struct __kernel_timespec *, sigset_t *);
	fn_t fn = REAL(2, "io_uring_submit_and_wait_timeout", fn_t);

	if (!fn)
		return -ENOSYS;
	kvs_uring_serve_liburing(ring, false, 0);
	return fn(ring, cqe_ptr, wait_nr, ts, sigmask);
}

KVS_EXPORT int io_uring_submit_and_get_events(struct io_uring *ring)
{
	int (*fn)(struct io_uring *) =
	    REAL(3, "io_uring_submit_and_get_events", int (*)(struct io_uring *));

	if (!fn)
		return -ENOSYS;
	kvs_uring_serve_liburing(ring, false, 0);
	return fn(ring);
}

KVS_EXPORT int io_uring_wait_cqes(struct io_uring *ring, struct io_uring_cqe **cqe_ptr,
				  unsigned wait_nr, struct __kernel_timespec *ts, sigset_t *sigmask)
{
	typedef int (*fn_t)(struct io_uring *, struct io_uring_cqe **, unsigned,
			    struct __kernel_timespec *, sigset_t *);
	fn_t fn = REAL(4, "io_uring_wait_cqes", fn_t);

	if (!fn)
		return -ENOSYS;
	/* It submits only with a timeout on a kernel without IORING_FEAT_EXT_ARG (a timeout
	 * entry); otherwise it may be the completion thread of a program whose other thread is
	 * filling entries: hands off the ring. */
	if (ring && ts && !(ring->features & IORING_FEAT_EXT_ARG))
		kvs_uring_serve_liburing(ring, false, 0);
	return fn(ring, cqe_ptr, wait_nr, ts, sigmask);
}

KVS_EXPORT int __io_uring_get_cqe(struct io_uring *ring, struct io_uring_cqe **cqe_ptr,
				  unsigned submit, unsigned wait_nr, sigset_t *sigmask)
{
	typedef int (*fn_t)(struct io_uring *, struct io_uring_cqe **, unsigned, unsigned,
			    sigset_t *);
	fn_t fn = REAL(5, "__io_uring_get_cqe", fn_t);

	if (!fn)
		return -ENOSYS;
	if (submit && ring)
		kvs_uring_serve_liburing(ring, true, submit); /* only what it hands the kernel */
	return fn(ring, cqe_ptr, submit, wait_nr, sigmask);
}

KVS_EXPORT int io_uring_register_files(struct io_uring *ring, const int *files, unsigned nr)
{
	int (*fn)(struct io_uring *, const int *, unsigned) =
	    REAL(6, "io_uring_register_files", int (*)(struct io_uring *, const int *, unsigned));
	int r = fn ? fn(ring, files, nr) : -ENOSYS;

	if (r == 0 && ring) {
		int saved = errno;
		kvs_uring_files_set(ring->ring_fd, 0, files, nr, true);
		errno = saved;
	}
	return r;
}

KVS_EXPORT int io_uring_register_files_tags(struct io_uring *ring, const int *files,
					    const __u64 *tags, unsigned nr)
{
	typedef int (*fn_t)(struct io_uring *, const int *, const __u64 *, unsigned);
	fn_t fn = REAL(7, "io_uring_register_files_tags", fn_t);
	int r = fn ? fn(ring, files, tags, nr) : -ENOSYS;

	if (r == 0 && ring) {
		int saved = errno;
		kvs_uring_files_set(ring->ring_fd, 0, files, nr, true);
		errno = saved;
	}
	return r;
}

KVS_EXPORT int io_uring_register_files_sparse(struct io_uring *ring, unsigned nr)
{
	typedef int (*fn_t)(struct io_uring *, unsigned);
	fn_t fn = REAL(8, "io_uring_register_files_sparse", fn_t);
	int r = fn ? fn(ring, nr) : -ENOSYS;

	if (r == 0 && ring) {
		int saved = errno;
		kvs_uring_files_set(ring->ring_fd, 0, NULL, nr, true);
		errno = saved;
	}
	return r;
}

KVS_EXPORT int io_uring_register_files_update(struct io_uring *ring, unsigned off, const int *files,
					      unsigned nr)
{
	typedef int (*fn_t)(struct io_uring *, unsigned, const int *, unsigned);
	fn_t fn = REAL(9, "io_uring_register_files_update", fn_t);
	int r = fn ? fn(ring, off, files, nr) : -ENOSYS;

	if (r >= 0 && ring) {
		int saved = errno;
		if ((unsigned)r == nr)
			kvs_uring_files_set(ring->ring_fd, off, files, nr, false);
		else
			kvs_uring_files_unknown(ring->ring_fd); /* which slots took is not said */
		errno = saved;
	}
	return r;
}

KVS_EXPORT int io_uring_register_files_update_tag(struct io_uring *ring, unsigned off,
						  const int *files, const __u64 *tags, unsigned nr)
{
	typedef int (*fn_t)(struct io_uring *, unsigned, const int *, const __u64 *, unsigned);
	fn_t fn = REAL(10, "io_uring_register_files_update_tag", fn_t);
	int r = fn ? fn(ring, off, files, tags, nr) : -ENOSYS;

	if (r >= 0 && ring) {
		int saved = errno;
		if ((unsigned)r == nr)
			kvs_uring_files_set(ring->ring_fd, off, files, nr, false);
		else
			kvs_uring_files_unknown(ring->ring_fd);
		errno = saved;
	}
	return r;
}

KVS_EXPORT int io_uring_unregister_files(struct io_uring *ring)
{
	int (*fn)(struct io_uring *) =
	    REAL(11, "io_uring_unregister_files", int (*)(struct io_uring *));
	int r = fn ? fn(ring) : -ENOSYS;

	if (r == 0 && ring)
		kvs_uring_files_drop(ring->ring_fd);
	return r;
}

/* liburing's raw register call (its own system call): the file registrations are noted as
 * through syscall(). */
KVS_EXPORT int io_uring_register(unsigned int fd, unsigned int opcode, const void *arg,
				 unsigned int nr_args)
{
	typedef int (*fn_t)(unsigned int, unsigned int, const void *, unsigned int);
	fn_t fn = REAL(13, "io_uring_register", fn_t);
	int r = fn ? fn(fd, opcode, arg, nr_args) : -ENOSYS;
	int saved = errno;

	kvs_uring_register((int)fd, opcode, arg, nr_args, r);
	errno = saved;
	return r;
}

KVS_EXPORT void io_uring_queue_exit(struct io_uring *ring)
{
	void (*fn)(struct io_uring *) =
	    REAL(12, "io_uring_queue_exit", void (*)(struct io_uring *));
	int fd = ring ? ring->ring_fd : -1;

	if (fn)
		fn(ring);
	if (fd >= 0) {
		int saved = errno;
		kvs_uring_ring_forget(fd);
		errno = saved;
	}
}

void kvs_uring_doors_atfork_child(void)
{
	pthread_mutex_init(&insert_mu, NULL); /* a parent's thread may have held it */
}
