/*
 * attach: the shim's process state: the configuration at first use, the region mapped for
 * counting, the lazy attach of the loader, the guard, and fork.  (The serve-or-pass-through
 * decision is serve.c's, what is passed through unserved.c's, the writes writes.c's.)
 *
 * DESIGN.  Global state, and who writes it:
 *   kvs_shim_cfg, kvs_shim_min_read
 *                         written once by the thread that runs init, read-only afterwards.
 *   state                 UNINIT, then INITING (taken by one thread with a CAS), then OFF/ON,
 *                         written once at the end of init (release), read by every hook
 *                         (acquire).  Not pthread_once: init calls dlsym and dlopen, which
 *                         take the loader's lock, and a thread inside a dlopen (holding it,
 *                         running a constructor that reads) must not wait for init; while
 *                         another thread initialises, a hook makes the real call.
 *   attached, mapped, kvs_shim_cache, kvs_shim_loader
 *                         written under attach_mu by the first cacheable read (attach) and by
 *                         the fork child handler (single-threaded then); read by hooks after
 *                         an acquire load of attached, which the attacher sets last (release).
 *   kvs_shim_guard        per thread (guard.c; guard.h says what it keeps out and the one
 *                         pair that raises and lowers it).
 * The loader's threads call no hooked function (raw system calls only).
 *
 * Fork: hooks/fanout.c holds the one list of every module's rule; this file's own (the region's
 * mapping and descriptor dropped, kvs_cache_forget; the loader's threads forgotten and its
 * io_uring closed, kvs_loader_forget; the child attaches anew) is
 * kvs_shim_attach_atfork_child.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "atime.h"
#include "attach.h"
#include "cache.h"
#include "cache_params.h"
#include "config.h"
#include "fdinfo.h"
#include "loader.h"
#include "log.h"
#include "observe.h"
#include "raw.h"
#include "real.h"
#include "shim.h"
#include "wthru.h"
enum { ST_UNINIT, ST_INITING, ST_OFF, ST_ON };
enum { AT_NONE, AT_OK, AT_FAILED };

struct kvs_config kvs_shim_cfg;
uint64_t kvs_shim_min_read = UINT64_MAX;
struct kvs_cache *kvs_shim_cache;
struct kvs_loader *kvs_shim_loader;
static _Atomic int state = ST_UNINIT;
static _Atomic bool refused; /* kvs_shim_refuse */
static pthread_mutex_t attach_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int attached = AT_NONE; /* the loader */
static _Atomic int mapped = AT_NONE;   /* the region */

/* The process whose memory this is (init, and the fork child).  A child of vfork, or of
 * clone(CLONE_VM), runs in its parent's memory with a descriptor table of its own: its closes
 * (CPython's subprocess: close_range after vfork) must not move or give up its parent's
 * descriptors. */
static _Atomic long owner_pid;

/* fork() waits for an attach in progress, so the child never inherits a half-made one (a
 * descriptor it would not know to close would keep the parent's liveness lock alive). */
void kvs_shim_attach_atfork_prepare(void)
{
	pthread_mutex_lock(&attach_mu);
}

void kvs_shim_attach_atfork_parent(void)
{
	pthread_mutex_unlock(&attach_mu);
}

void kvs_shim_attach_atfork_child(void)
{
	if (kvs_shim_loader)
		kvs_loader_forget(
		    kvs_shim_loader); /* its threads are gone; its memory is abandoned */
	if (kvs_shim_cache)
		kvs_cache_forget(kvs_shim_cache);
	kvs_shim_cache = NULL;
	kvs_shim_loader = NULL;
	atomic_store(&owner_pid, kvs_syscall(SYS_getpid));
	atomic_store(&attached, AT_NONE);
	atomic_store(&mapped, AT_NONE);
	pthread_mutex_unlock(&attach_mu);
}

static void init(void)
{
	char msg[KVS_CONFIG_MSG_MAX];
	int on = ST_OFF;
	int saved = kvs_shim_in(); /* a hook that passes through must leave errno as libc would */

	atomic_store(&owner_pid, kvs_syscall(SYS_getpid));
	kvs_real_init();
	/* The fork handlers are registered at load, whether the shim turns on or not: POSIX aio's
	 * table lock is taken by its writes either way (api/paio_write.c). */
	if (atomic_load(&refused))
		goto out;
	if (kvs_config_load(&kvs_shim_cfg, NULL, NULL, msg, sizeof(msg))) {
		kvs_log_once(KVS_CAUSE_CONFIG, KVS_LOG_ERROR, "%s; the shim is off", msg);
		goto out;
	}
	kvs_log_set_level(kvs_shim_cfg.shim_log);
	kvs_log_set_file(kvs_shim_cfg.shim_log_file);
	if (!kvs_shim_cfg.shim_enable)
		goto out;
	if (kvs_fdinfo_set_roots(kvs_shim_cfg.files_roots) == 0) {
		if (kvs_shim_cfg.files_roots[0])
			kvs_log_once(KVS_CAUSE_CONFIG, KVS_LOG_WARN,
				     "files.roots: no usable directory in \"%s\"; the shim is off",
				     kvs_shim_cfg.files_roots);
		else
			kvs_log_once(KVS_CAUSE_CONFIG, KVS_LOG_INFO,
				     "files.roots is empty: the shim serves nothing");
		goto out;
	}
	if (kvs_fdinfo_set_write_once(kvs_shim_cfg.files_write_once) == 0 &&
	    kvs_shim_cfg.files_write_once[0])
		kvs_log_once(KVS_CAUSE_CONFIG, KVS_LOG_WARN,
			     "files.write_once: no usable directory in \"%s\": its files are kept "
			     "as files.roots keeps them",
			     kvs_shim_cfg.files_write_once);
	kvs_shim_min_read = kvs_shim_cfg.files_min_read ? kvs_shim_cfg.files_min_read : 1;
	kvs_fdinfo_set_settle(kvs_shim_cfg.files_settle);
	kvs_observe_configure(&kvs_shim_cfg);
	if (kvs_observe_on())
		kvs_shim_cfg.files_write_through =
		    false; /* a region of keys has no room for bytes */
	kvs_wthru_configure(&kvs_shim_cfg);
	on = ST_ON;
out:
	atomic_store_explicit(&state, on, memory_order_release); /* pairs with kvs_shim_wants */
	kvs_shim_out(saved);
}

bool kvs_shim_wants(size_t len)
{
	if (kvs_shim_inside())
		return false;
	int st = atomic_load_explicit(&state, memory_order_acquire); /* pairs with init's store */
	if (st == ST_UNINIT && atomic_compare_exchange_strong(&state, &st, ST_INITING))
		init();
	return atomic_load_explicit(&state, memory_order_acquire) == ST_ON &&
	       len >= kvs_shim_min_read;
}

bool kvs_shim_enter(int *saved_errno)
{
	if (kvs_shim_inside())
		return false;
	kvs_shim_wants(0); /* the configuration, loaded once */
	if (atomic_load_explicit(&state, memory_order_acquire) != ST_ON) /* pairs with init */
		return false;
	*saved_errno = kvs_shim_in();
	return true;
}

void kvs_shim_refuse(void)
{
	atomic_store(&refused, true);
}

/* Map the region, once (a failure is final for this process); with create false, only one
 * that exists (its absence is no failure: a later call may create it).  Caller holds
 * attach_mu. */
static bool map_locked(bool create)
{
	char msg[512];
	int m = atomic_load_explicit(&mapped, memory_order_relaxed);

	if (m != AT_NONE)
		return m == AT_OK;
	m = AT_FAILED;
	/* shim.mode = observe: the region of keys only, <cache.name>.observe (observe.h). */
	const struct kvs_cache_params *params = kvs_observe_params(&kvs_shim_cfg);
	int r = params ? kvs_cache_open(params, create ? KVS_OPEN_CREATE : 0, &kvs_shim_cache, msg,
					sizeof(msg))
		       : -ENAMETOOLONG;
	if (r == -ENOENT && !create)
		return false; /* nothing to map yet */
	if (r)
		kvs_log_once(KVS_CAUSE_ATTACH, KVS_LOG_WARN,
			     "cannot use the cache (%s); reads go to storage",
			     msg[0] ? msg : strerror(-r));
	else
		m = AT_OK;
	if (!r)
		kvs_observe_mapped(
		    kvs_shim_cache); /* before the hooks may see it (the store below) */
	if (!r && msg[0]) /* cache.on_mismatch = rebuild replaced the region: say so, once */
		kvs_log_once(KVS_CAUSE_ATTACH, KVS_LOG_WARN, "%s", msg);
	atomic_store_explicit(&mapped, m, memory_order_release); /* publishes cache */
	return m == AT_OK;
}

/* The region, mapped on first use without the loader: enough to count what is not served.
 * NULL when it cannot be mapped (with create false: also when there is none yet). */
static struct kvs_cache *region_mapped(bool create)
{
	int m = atomic_load_explicit(&mapped, memory_order_acquire); /* pairs in map_locked */

	if (m == AT_NONE) {
		pthread_mutex_lock(&attach_mu);
		map_locked(create);
		pthread_mutex_unlock(&attach_mu);
		m = atomic_load_explicit(&mapped, memory_order_acquire);
	}
	return m == AT_OK ? kvs_shim_cache : NULL;
}

struct kvs_cache *kvs_shim_region(bool create)
{
	return region_mapped(create);
}

bool kvs_shim_in_owner(void)
{
	return kvs_syscall(SYS_getpid) == atomic_load_explicit(&owner_pid, memory_order_relaxed);
}

bool kvs_shim_is_mapped(void)
{
	return atomic_load_explicit(&mapped, memory_order_acquire) ==
	       AT_OK; /* pairs in map_locked */
}

bool kvs_shim_attach(void)
{
	int a = atomic_load_explicit(&attached, memory_order_acquire); /* pairs below */
	int r;

	if (a != AT_NONE)
		return a == AT_OK;
	pthread_mutex_lock(&attach_mu);
	a = atomic_load(&attached);
	if (a != AT_NONE)
		goto out;
	a = AT_FAILED;
	if (!map_locked(true))
		goto out;
	r = kvs_loader_create(kvs_shim_cache, &kvs_shim_cfg, &kvs_shim_loader);
	if (r) {
		kvs_log_once(KVS_CAUSE_LOADER, KVS_LOG_WARN,
			     "cannot start the loader (%s); reads go to storage", strerror(-r));
		goto out; /* the region stays mapped: what is not served is still counted */
	}
	if (kvs_atime_start())
		kvs_log_once(
		    KVS_CAUSE_LOADER, KVS_LOG_WARN,
		    "cannot start the thread that keeps atime; files served from the cache "
		    "keep the atime of their last storage read");
	kvs_log_once(KVS_CAUSE_ATTACHED, KVS_LOG_INFO,
		     "attached as process %d, backend %s, kvshim " KVS_VERSION,
		     kvs_cache_self(kvs_shim_cache), kvs_loader_backend(kvs_shim_loader));
	if (kvs_shim_cfg.loader_io == KVS_IO_URING)
		kvs_log_once(
		    KVS_CAUSE_IO_URING, KVS_LOG_WARN,
		    "loader.io = io_uring: if this process is SIGKILLed, the kernel does not "
		    "wait for its reads in flight, and one can land in a slot already given to "
		    "another shard; use threads (auto) outside benchmarks");
	a = AT_OK;
out:
	atomic_store_explicit(&attached, a, memory_order_release); /* publishes cache, loader */
	pthread_mutex_unlock(&attach_mu);
	return a == AT_OK;
}

const char *kvs_shim_cufile_library(void)
{
	kvs_shim_wants(0); /* the configuration, loaded once */
	int st = atomic_load_explicit(&state, memory_order_acquire); /* pairs with init's */
	if ((st == ST_ON || st == ST_OFF) && kvs_shim_cfg.cuda_cufile_library[0])
		return kvs_shim_cfg.cuda_cufile_library;
	return "libcufile.so.0"; /* being loaded by another thread, or empty: the default */
}

bool kvs_shim_on(void)
{
	return kvs_shim_wants(0) || atomic_load_explicit(&state, memory_order_acquire) == ST_ON;
}
