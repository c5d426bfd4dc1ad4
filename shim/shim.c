/*
 * shim: configuration, lazy attach, fork, and the serve-or-pass-through decision.
 *
 * DESIGN.  Global state, and who writes it:
 *   cfg, min_read         written once by the thread that runs init, read-only afterwards.
 *   state                 UNINIT, then INITING (taken by one thread with a CAS), then OFF/ON,
 *                         written once at the end of init (release), read by every hook
 *                         (acquire).  Not pthread_once: init calls dlsym and dlopen, which
 *                         take the loader's lock, and a thread inside a dlopen (holding it,
 *                         running a constructor that reads) must not wait for init; while
 *                         another thread initialises, a hook makes the real call.
 *   attached, cache, loader
 *                         written under attach_mu by the first cacheable read (attach) and by
 *                         the fork child handler (single-threaded then); read by hooks after
 *                         an acquire load of attached, which the attacher sets last (release).
 *   guard                 per thread: nonzero while the shim's own code runs, so a hook
 *                         entered meanwhile goes straight to the real function: a signal
 *                         handler that interrupts a served read and reads again (it gets the
 *                         real call, never a lock we hold), or a library the shim calls into
 *                         (libcufile, the CUDA driver) calling a hooked name.  The shim's own
 *                         code does not enter its hooks: its internals and the libraries under
 *                         it make their system calls through base/raw.h
 *                         (scripts/check_layers.sh keeps it so).
 *   pos_mu[]              serialise read/readv at the file position per file, as the kernel
 *                         does per open file description (we cannot tell descriptions apart,
 *                         so two descriptions of one file also wait for each other).
 * The loader's threads call no hooked function (raw system calls only).
 *
 * The served path after attach calls no malloc and holds nothing across a point where the
 * thread could be cancelled: cancellation is disabled while it runs, and a cancel already
 * pending is acted on at entry, where the real call would have acted on it.
 *
 * Fork.  Every resource has a rule in the child: the region's mapping and descriptor are
 * dropped (kvs_cache_forget), the loader's threads do not exist and its io_uring is closed
 * (kvs_loader_forget), the anchors are closed (kvs_anchor_atfork_child), the populating
 * walker's descriptor is closed (cache/populate.c), and the child attaches anew.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "cache_params.h"
#include "config.h"
#include "cufile.h"
#include "cufile_types.h"
#include "device.h"
#include "anchor.h"
#include "atime.h"
#include "fdinfo.h"
#include "hooks_uring.h"
#include "loader.h"
#include "log.h"
#include "observe.h"
#include "raw.h"
#include "real.h"
#include "shim.h"
#include "sys.h"
#include "why.h"
#include "wonce.h"
#include "wthru.h"

enum { ST_UNINIT, ST_INITING, ST_OFF, ST_ON };

#define KVS_MAX_RW_COUNT 0x7ffff000ull /* Linux's MAX_RW_COUNT: INT_MAX rounded down to a page */
enum { AT_NONE, AT_OK, AT_FAILED };

static struct kvs_config cfg;
static uint64_t min_read = UINT64_MAX;
static _Atomic int state = ST_UNINIT;
static pthread_mutex_t attach_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int attached = AT_NONE; /* the loader */
static _Atomic int mapped = AT_NONE;   /* the region */
static struct kvs_cache *cache;
static struct kvs_loader *loader;
static __thread int guard __attribute__((tls_model("initial-exec")));
#define POS_LOCKS 64
static pthread_mutex_t pos_mu[POS_LOCKS];

/* fork() waits for an attach in progress, so the child never inherits a half-made one (a
 * descriptor it would not know to close would keep the parent's liveness lock alive). */
static void atfork_prepare(void)
{
	pthread_mutex_lock(&attach_mu);
}

static void atfork_parent(void)
{
	pthread_mutex_unlock(&attach_mu);
}

/* The fork child: the parent's threads do not exist here and its mapping, descriptor and
 * process slot are the parent's.  Drop them without touching shared state; the child attaches
 * again, as itself, at its first cacheable read. */
static void settle_atfork_child(void);

static void atfork_child(void)
{
	if (loader)
		kvs_loader_forget(loader); /* its threads are gone; its memory is abandoned */
	if (cache)
		kvs_cache_forget(cache);
	kvs_anchor_atfork_child();
	kvs_device_atfork_child();
	settle_atfork_child();
	kvs_wthru_atfork_child();
	kvs_uring_atfork_child();
	kvs_wonce_atfork_child();
	kvs_atime_atfork_child();
	for (int i = 0; i < POS_LOCKS; i++)
		pthread_mutex_init(&pos_mu[i], NULL); /* a parent's thread may have held one */
	cache = NULL;
	loader = NULL;
	atomic_store(&attached, AT_NONE);
	atomic_store(&mapped, AT_NONE);
	pthread_mutex_unlock(&attach_mu);
}

static void init(void)
{
	char msg[KVS_CONFIG_MSG_MAX];
	int on = ST_OFF;

	guard++;
	kvs_real_init();
	if (kvs_config_load(&cfg, NULL, NULL, msg, sizeof(msg))) {
		kvs_log_once(KVS_CAUSE_CONFIG, KVS_LOG_ERROR, "%s; the shim is off", msg);
		goto out;
	}
	kvs_log_set_level(cfg.shim_log);
	kvs_log_set_file(cfg.shim_log_file);
	if (!cfg.shim_enable)
		goto out;
	if (kvs_fdinfo_set_roots(cfg.files_roots) == 0) {
		if (cfg.files_roots[0])
			kvs_log_once(KVS_CAUSE_CONFIG, KVS_LOG_WARN,
				     "files.roots: no usable directory in \"%s\"; the shim is off",
				     cfg.files_roots);
		else
			kvs_log_once(KVS_CAUSE_CONFIG, KVS_LOG_INFO,
				     "files.roots is empty: the shim serves nothing");
		goto out;
	}
	if (kvs_fdinfo_set_write_once(cfg.files_write_once) == 0 && cfg.files_write_once[0])
		kvs_log_once(KVS_CAUSE_CONFIG, KVS_LOG_WARN,
			     "files.write_once: no usable directory in \"%s\": its files are kept "
			     "as files.roots keeps them",
			     cfg.files_write_once);
	min_read = cfg.files_min_read ? cfg.files_min_read : 1;
	kvs_fdinfo_set_settle(cfg.files_settle);
	kvs_observe_configure(&cfg);
	if (kvs_observe_on())
		cfg.files_write_through = false; /* a region of keys has no room for bytes */
	kvs_wthru_configure(&cfg);
	for (int i = 0; i < POS_LOCKS; i++)
		pthread_mutex_init(&pos_mu[i], NULL);
	if (pthread_atfork(atfork_prepare, atfork_parent, atfork_child))
		goto out;
	on = ST_ON;
out:
	atomic_store_explicit(&state, on, memory_order_release); /* pairs with kvs_shim_wants */
	guard--;
}

bool kvs_shim_wants(size_t len)
{
	if (guard)
		return false;
	int st = atomic_load_explicit(&state, memory_order_acquire); /* pairs with init's store */
	if (st == ST_UNINIT && atomic_compare_exchange_strong(&state, &st, ST_INITING)) {
		int saved = errno; /* a hook that passes through must leave errno as libc would */

		init();
		errno = saved;
	}
	return atomic_load_explicit(&state, memory_order_acquire) == ST_ON && len >= min_read;
}

bool kvs_shim_enter(int *saved_errno)
{
	if (guard)
		return false;
	kvs_shim_wants(0); /* the configuration, loaded once */
	if (atomic_load_explicit(&state, memory_order_acquire) != ST_ON) /* pairs with init */
		return false;
	*saved_errno = errno;
	guard++;
	return true;
}

void kvs_shim_leave(int saved_errno)
{
	guard--;
	errno = saved_errno;
}

bool kvs_shim_inside(void)
{
	return guard != 0;
}

void kvs_shim_hold(void)
{
	guard++;
}

void kvs_shim_drop(void)
{
	guard--;
}

/* Is the page at p (page-aligned) readable?  FUTEX_WAIT reads the word at p as the kernel
 * reads user memory (EFAULT where it cannot), and with a zero timeout never sleeps: EAGAIN
 * (another value) or ETIMEDOUT (the same) both say readable. */
static bool page_readable(uintptr_t p)
{
	struct timespec zero = {0, 0};

	return kvs_syscall(SYS_futex, (uint32_t *)p, FUTEX_WAIT | FUTEX_PRIVATE_FLAG, 0, &zero, NULL,
		       0) == 0 ||
	       errno != EFAULT;
}

static _Atomic bool vm_readv_denied; /* process_vm_readv is not allowed here (seccomp) */

bool kvs_shim_copy_in(void *dst, const void *src, size_t n)
{
	struct iovec l = {dst, n}, r = {(void *)src, n};
	int saved = errno;
	bool ok = true;

	if (n == 0)
		return true;
	if (!atomic_load_explicit(&vm_readv_denied, memory_order_relaxed)) {
		ssize_t got = kvs_syscall(SYS_process_vm_readv, getpid(), &l, 1, &r, 1, 0);

		ok = got == (ssize_t)n;
		if (ok || got >= 0 || errno == EFAULT)
			goto out;
		atomic_store_explicit(&vm_readv_denied, true, memory_order_relaxed); /* EPERM */
	}
	/* Without it: every page probed as the kernel would read it, then a plain copy (a page the
	 * program unmaps in between is its own race, as with the kernel's copy). */
	for (uintptr_t pg = (uintptr_t)src & ~(uintptr_t)4095; ok && pg < (uintptr_t)src + n;
	     pg += 4096)
		ok = page_readable(pg);
	if (ok)
		memcpy(dst, src, n);
out:
	errno = saved;
	return ok;
}

const struct iovec *kvs_shim_iov_read(const struct iovec *iov, int iovcnt, struct iovec *local,
				      uint64_t *len)
{
	uint64_t n = 0;

	if (!iov || iovcnt <= 0 || iovcnt > IOV_MAX)
		return NULL;
	for (int at = 0; at < iovcnt; at += KVS_IOV_LOCAL) {
		int k = iovcnt - at < KVS_IOV_LOCAL ? iovcnt - at : KVS_IOV_LOCAL;

		if (!kvs_shim_copy_in(local, iov + at, (size_t)k * sizeof(*iov)))
			return NULL;
		for (int i = 0; i < k; i++) {
			if (local[i].iov_len > SSIZE_MAX - n)
				return NULL;
			n += local[i].iov_len;
		}
	}
	*len = n;
	return iovcnt <= KVS_IOV_LOCAL ? local : iov;
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
	const struct kvs_cache_params *params = kvs_observe_params(&cfg);
	int r = params
		    ? kvs_cache_open(params, create ? KVS_OPEN_CREATE : 0, &cache, msg, sizeof(msg))
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
		kvs_observe_mapped(cache); /* before the hooks may see it (the store below) */
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
	return m == AT_OK ? cache : NULL;
}

static struct kvs_cache *region(void)
{
	return region_mapped(true);
}

struct kvs_cache *kvs_shim_region(bool create)
{
	return region_mapped(create);
}

/* Map the region and start the loader, once; a failure is final for this process. */
static bool attach(void)
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
	r = kvs_loader_create(cache, &cfg, &loader);
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
		     kvs_cache_self(cache), kvs_loader_backend(loader));
	if (cfg.loader_io == KVS_IO_URING)
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

/* A KV file (fi, or NULL when it was not described) read at off for len bytes, or mapped, in a
 * way the shim passes through: count it with its bytes (observe.h), say so once at info, so
 * that an operator sees the shim loaded but out of the path, and why.  Caller holds guard. */
static void unserved(enum kvs_counter_id id, enum kvs_cause cause, const char *what,
		     const struct kvs_fdinfo *fi, uint64_t off, uint64_t len)
{
	kvs_observe_unserved(region(), fi, id, off, len);
	kvs_log_once(cause, KVS_LOG_INFO, "%s: not served (counted in `kvshim stat` unserved_*)",
		     what);
}

/* Say at debug why a read of fd (described as fi) passes through. */
static void pass(int fd, const struct kvs_fdinfo *fi, enum kvs_why why, int err)
{
	kvs_why(fd, fi->dev, fi->ino, why, err);
}

/* Does a read path serve fd, which kvs_fdinfo_get described as fi with result r?  Says why not.
 * any_mode: cuFile, which serves a descriptor whether it has O_DIRECT or not.  Caller holds
 * guard. */
static bool admit(int fd, int r, const struct kvs_fdinfo *fi, bool any_mode, uint64_t off,
		  uint64_t len)
{
	if (r)
		return false; /* fstat or fcntl failed: the real call will say why */
	if (!fi->kv) {
		if (fi->dev || fi->ino) /* a pipe or a socket (neither) needs no explaining */
			pass(fd, fi, KVS_WHY_NOT_KV, 0);
		return false;
	}
	if (!fi->readable) {
		pass(fd, fi, KVS_WHY_UNREADABLE, 0);
		return false;
	}
	if (!any_mode && !fi->direct && !cfg.files_buffered) {
		unserved(KVS_CTR_unserved_buffered, KVS_CAUSE_UNSERVED_BUFFERED,
			 "a buffered read of a KV file (no O_DIRECT, files.buffered = false)", fi,
			 off, len);
		pass(fd, fi, KVS_WHY_BUFFERED, 0);
		return false;
	}
	return true;
}

void kvs_shim_note_small(int fd, size_t len)
{
	/* Only in a process that has mapped the region already: one load for a descriptor known
	 * not to be a KV file; one look (statx, the path) the first time a descriptor is read
	 * small before anything else classified it (a 12 KiB header read first), then its class
	 * is known until its close. */
	if (guard || len == 0 || len >= min_read ||
	    atomic_load_explicit(&mapped, memory_order_acquire) != AT_OK || kvs_fdinfo_not_kv(fd))
		return;
	int saved = errno;
	struct kvs_fdinfo fi;
	guard++;
	fi.kv = false;
	if (kvs_fdinfo_hint_kv(fd) || (kvs_fdinfo_get(fd, &fi) == 0 && fi.kv)) {
		/* A descriptor known already is not looked at again: its root is not known. */
		unserved(KVS_CTR_unserved_small, KVS_CAUSE_UNSERVED_SMALL,
			 "a read of a KV file shorter than files.min_read", fi.kv ? &fi : NULL, 0,
			 len);
		if (kvs_log_wants(KVS_LOG_DEBUG) && kvs_fdinfo_known(fd, &fi) == 0)
			pass(fd, &fi, KVS_WHY_SMALL, 0);
	}
	guard--;
	errno = saved;
}

/* fd, if it is a KV file, read (or mapped) for len bytes at off and passed through for a reason
 * the shim counts (id) and says once (cause, what; why at debug). */
static void note_kv_unserved(int fd, enum kvs_counter_id id, enum kvs_cause cause, const char *what,
			     enum kvs_why why, uint64_t off, uint64_t len)
{
	struct kvs_fdinfo fi;

	if (fd < 0 || !kvs_shim_wants(SIZE_MAX))
		return;
	int saved = errno;
	guard++;
	if (kvs_fdinfo_get(fd, &fi) == 0 && fi.kv) {
		unserved(id, cause, what, &fi, off, len);
		pass(fd, &fi, why, 0);
	}
	guard--;
	errno = saved;
}

void kvs_shim_note_mmap(int fd, uint64_t len)
{
	note_kv_unserved(fd, KVS_CTR_unserved_mmap, KVS_CAUSE_UNSERVED_MMAP,
			 "a KV file mapped with mmap (its reads are page faults)", KVS_WHY_MMAP, 0,
			 len);
}

void kvs_shim_mapped(int fd, int prot, int flags)
{
	struct kvs_fdinfo fi;

	if (guard || fd < 0 || !(flags & MAP_SHARED) || (flags & MAP_ANONYMOUS) || !kvs_wthru_on())
		return;
	int saved = errno;
	guard++;
	/* PROT_WRITE, or a descriptor that lets mprotect add it later. */
	int fl = (prot & PROT_WRITE) ? O_RDWR : kvs_sys_fcntl(fd, F_GETFL);
	if (fl >= 0 && (fl & O_ACCMODE) == O_RDWR && kvs_fdinfo_get(fd, &fi) == 0 && fi.kv)
		kvs_wthru_mapped(fi.dev, fi.ino);
	guard--;
	errno = saved;
}

void kvs_shim_note_stdio(int fd, uint64_t len)
{
	/* The stream's position is not asked for: the bytes are counted as asked. */
	note_kv_unserved(fd, KVS_CTR_unserved_stdio, KVS_CAUSE_UNSERVED_STDIO,
			 "an fread of a KV file on a stream with bytes to write, ungetc'd bytes or "
			 "wide characters",
			 KVS_WHY_STDIO, 0, len);
}

void kvs_shim_note_uring_unserved(int fd, uint64_t off, uint64_t len)
{
	struct kvs_fdinfo fi;

	if (!kvs_shim_wants(SIZE_MAX))
		return;
	int saved = errno;
	guard++;
	fi.kv = false;
	if (fd < 0 || (kvs_fdinfo_get(fd, &fi) == 0 && fi.kv))
		kvs_observe_unserved(region(), fi.kv ? &fi : NULL, KVS_CTR_unserved_io_uring, off,
				     len);
	guard--;
	errno = saved;
}

/* O_DIRECT reads must be aligned or the real call fails: serve only what it would accept. */
static bool direct_ok(const struct kvs_fdinfo *fi, const struct iovec *iov, int iovcnt, off_t off)
{
	if ((uint64_t)off % fi->dio_off_align)
		return false;
	for (int i = 0; i < iovcnt; i++)
		if ((uintptr_t)iov[i].iov_base % fi->dio_mem_align ||
		    iov[i].iov_len % fi->dio_off_align)
			return false;
	return true;
}

/* Is the page at p (page-aligned) writable?  FUTEX_WAKE_OP adds 0 to the word at p atomically,
 * which the kernel does only on memory the process may write (faulting it in as the copy would),
 * answering EFAULT otherwise; the value is unchanged even if another thread writes it. */
static bool page_writable(uintptr_t p)
{
	return kvs_syscall(SYS_futex, (uint32_t *)p, FUTEX_WAKE_OP | FUTEX_PRIVATE_FLAG, 0, NULL,
		       (uint32_t *)p, FUTEX_OP(FUTEX_OP_ADD, 0, FUTEX_OP_CMP_EQ, 0)) >= 0;
}

/*
 * Can the request's buffers take the bytes?  The kernel answers EFAULT (or a short count) for a
 * buffer it cannot write, where memcpy would crash the engine; such a read goes to the real call.
 * Two cheap looks per buffer, under 1% of a 1 MiB memcpy (kvshim-bench-read probe):
 *   - its first and last page are writable (page_writable): not read-only, not PROT_NONE, not
 *     unmapped, not device memory the kernel cannot fault in;
 *   - msync(MS_ASYNC) over the whole range: ENOMEM when any part is unmapped (a buffer freed or
 *     half unmapped).  It walks mappings, not pages, and writes nothing back (MS_ASYNC is a no-op
 *     on Linux).
 * A page in the middle whose protection alone differs from both ends is not seen.
 */
static bool buffers_writable(const struct iovec *iov, int iovcnt)
{
	for (int i = 0; i < iovcnt; i++) {
		uintptr_t a = (uintptr_t)iov[i].iov_base & ~(uintptr_t)4095;
		uintptr_t e =
		    ((uintptr_t)iov[i].iov_base + iov[i].iov_len + 4095) & ~(uintptr_t)4095;

		if (iov[i].iov_len == 0)
			continue;
		if (!page_writable(a) || !page_writable(e - 4096) ||
		    msync((void *)a, e - a, MS_ASYNC))
			return false;
	}
	return true;
}

/* May the read of fd (described as fi) write its buffers (buffers_writable)?  Else counted and
 * said: the real call answers EFAULT or a short count.  Caller holds guard. */
static bool buffers_fit(int fd, const struct kvs_fdinfo *fi, const struct iovec *iov, int iovcnt,
			uint64_t off, uint64_t len)
{
	if (buffers_writable(iov, iovcnt))
		return true;
	unserved(KVS_CTR_unserved_buffers, KVS_CAUSE_UNSERVED_BUFFERS,
		 "a read of a KV file into memory the shim may not write", fi, off, len);
	pass(fd, fi, KVS_WHY_BUFFERS, 0);
	return false;
}

/* What an unserved count needs of rd's file: its size and root. */
static struct kvs_fdinfo fi_of(const struct kvs_read *rd)
{
	return (struct kvs_fdinfo){.kv = true, .size = rd->file_size, .root = rd->root};
}

/* The cache handed back rd, a read of fd it had taken (n < 0): the caller makes the real call.
 * Counted with its bytes, and said at debug (after_read says it once at info).  Caller holds
 * guard. */
static void fell_back(int fd, const struct kvs_read *rd, int64_t n)
{
	struct kvs_fdinfo fi = fi_of(rd);

	kvs_observe_unserved(cache, &fi, KVS_CTR_unserved_fallback, rd->off, rd->len);
	kvs_why(fd, rd->dev, rd->ino, KVS_WHY_FALLBACK, n < 0 ? (int)-n : 0);
}

/* Zero the request's bytes from pos to its end, as the kernel does for a short O_DIRECT read on
 * some file systems. */
static void zero_tail(const struct iovec *iov, int iovcnt, uint64_t pos)
{
	for (int i = 0; i < iovcnt; i++) {
		uint64_t l = iov[i].iov_len;

		if (pos >= l) {
			pos -= l;
			continue;
		}
		memset((char *)iov[i].iov_base + pos, 0, l - pos);
		pos = 0;
	}
}

/* The kvs_read of a served read of fi's file through anchor, destination left to the caller.
 * A read the cache serves does not reach the file: its atime is kept by atime.c. */
static struct kvs_read make_read(const struct kvs_fdinfo *fi, int anchor, uint64_t off,
				 uint64_t len)
{
	kvs_atime_note(cache, anchor, fi);
	return (struct kvs_read){.fd = anchor,
				 .direct = fi->direct,
				 .fresh = {.changed_ns = fi->changed_ns,
					   .settle_ns = fi->settle_ns,
					   .revalidate_ns = cfg.files_revalidate * 1000000ull,
					   .node_clock = fi->node_clock},
				 .block = fi->block,
				 .dev = fi->dev,
				 .ino = fi->ino,
				 .write_once = fi->write_once,
				 .file_size = fi->size,
				 .root = fi->root,
				 .tally = kvs_observe_ref(cache, fi),
				 .off = off,
				 .len = len};
}

/* After a loader call: report a stuck region, and a read that fell back, once each. */
static void after_read(int64_t n)
{
	if (kvs_cache_take_euclean(cache))
		kvs_log_once(
		    KVS_CAUSE_EUCLEAN, KVS_LOG_WARN,
		    "the region's shared state is stuck or corrupt (%s): reads that meet it "
		    "go to storage; see `kvshim stat`, and `kvshim reset` once no engine runs",
		    strerror(EUCLEAN));
	if (n < 0)
		kvs_log_once(KVS_CAUSE_READ_FALLBACK, n == -EUCLEAN ? KVS_LOG_WARN : KVS_LOG_INFO,
			     "a read went to storage directly (%s)", strerror((int)-n));
}

/* Attach the region and take fd's anchor (anchor.h: waits while another thread installs or
 * retires one).  The anchor, referenced (kvs_anchor_put it once the read is over), or -1 having
 * said why not.  Caller holds guard; a position lock, if any, before attach_mu and the anchors'
 * lock (neither is held while taking one). */
static int attach_anchor(int fd, const struct kvs_fdinfo *fi, uint64_t off, uint64_t len)
{
	if (!attach()) {
		unserved(KVS_CTR_unserved_no_cache, KVS_CAUSE_UNSERVED_NO_CACHE,
			 "a read of a KV file while the cache cannot be used in this process", fi,
			 off, len);
		pass(fd, fi, KVS_WHY_NO_CACHE, 0);
		return -1;
	}
	int anchor = kvs_anchor_get(fd, fi);
	if (anchor < 0) {
		unserved(KVS_CTR_unserved_anchor, KVS_CAUSE_UNSERVED_ANCHOR,
			 "a read of a KV file the shim could not hold open (shim.log = debug "
			 "says why)",
			 fi, off, len);
		pass(fd, fi, KVS_WHY_ANCHOR, -anchor);
	}
	return anchor;
}

/* An O_DIRECT read must be aligned as O_DIRECT needs or the real call fails: serve only what
 * it would accept.  True when fi's read may be served; else counted and said.  Caller holds
 * guard. */
static bool direct_fits(int fd, const struct kvs_fdinfo *fi, const struct iovec *iov, int iovcnt,
			off_t off)
{
	uint64_t len = 0;

	if (!fi->direct || direct_ok(fi, iov, iovcnt, off))
		return true;
	for (int i = 0; i < iovcnt; i++)
		len += iov[i].iov_len;
	unserved(KVS_CTR_unserved_misaligned, KVS_CAUSE_UNSERVED_MISALIGNED,
		 "an O_DIRECT read of a KV file not aligned as O_DIRECT needs", fi, (uint64_t)off,
		 len);
	pass(fd, fi, KVS_WHY_MISALIGNED, 0);
	return false;
}

/* shim.mode = observe: a POSIX read of fd (described as fi) that would be served, keyed and
 * counted, unless fd is the descriptor of a cuFile handle: then it is libcufile's own read of
 * a cuFile read observed already (compatibility mode).  The caller then makes the real call.
 * Caller holds guard. */
static void observe_posix(int fd, const struct kvs_fdinfo *fi, uint64_t off, uint64_t len)
{
	struct kvs_cache *c = kvs_cufile_fd_registered(fd) ? NULL : region();

	if (c)
		kvs_observe_read(c, fi, off, len);
}

ssize_t kvs_shim_read(int fd, const struct iovec *iov, int iovcnt, off_t off, bool use_pos)
{
	int saved = errno, cancel_state, anchor;
	pthread_mutex_t *pos_lock = NULL;
	struct kvs_fdinfo fi;
	struct kvs_read rd;
	ssize_t ret = -1;
	uint64_t len = 0;

	if (iovcnt <= 0 || iovcnt > IOV_MAX)
		return -1;
	for (int i = 0; i < iovcnt; i++) {
		if (iov[i].iov_len > SSIZE_MAX - len)
			return -1;
		len += iov[i].iov_len;
	}
	guard++;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
	/* The position of a read at it is not known yet: its bytes are counted from 0. */
	if (!admit(fd, kvs_fdinfo_get(fd, &fi), &fi, false, use_pos ? 0 : (uint64_t)off, len))
		goto out;
	/* Observe mode writes no buffer: the three system calls of the check are not its cost. */
	if (!kvs_observe_on() &&
	    !buffers_fit(fd, &fi, iov, iovcnt, use_pos ? 0 : (uint64_t)off, len))
		goto out;
	if (use_pos) {
		pos_lock = &pos_mu[(fi.ino ^ fi.dev * 31) % POS_LOCKS];
		pthread_mutex_lock(pos_lock);
		off = lseek(fd, 0, SEEK_CUR);
		if (off < 0)
			goto out;
	}
	if (off < 0)
		goto out;
	if (!direct_fits(fd, &fi, iov, iovcnt, off))
		goto out;
	/* The kernel moves at most MAX_RW_COUNT bytes in one call, whatever was asked. */
	if (len > KVS_MAX_RW_COUNT)
		len = KVS_MAX_RW_COUNT;
	if (kvs_observe_on()) { /* keyed and counted; the real call reads it */
		observe_posix(fd, &fi, (uint64_t)off, len);
		goto out;
	}
	anchor = attach_anchor(fd, &fi, (uint64_t)off, len);
	if (anchor < 0)
		goto out;
	rd = make_read(&fi, anchor, (uint64_t)off, len);
	rd.iov = iov;
	rd.iovcnt = iovcnt;
	int64_t n = kvs_loader_read(loader, &rd);
	kvs_anchor_put(anchor); /* the loader is done with it */
	after_read(n);
	if (n < 0) {
		fell_back(fd, &rd, n);
		goto out;
	}
	kvs_observe_served(cache, rd.tally, (uint64_t)n);
	if (use_pos && lseek(fd, off + n, SEEK_SET) < 0)
		goto out; /* cannot happen on a regular file; the real read will redo it */
	if (fi.direct && fi.dio_zero_tail && n > 0 && (uint64_t)n < len)
		zero_tail(iov, iovcnt, (uint64_t)n);
	ret = n;
out:
	if (pos_lock)
		pthread_mutex_unlock(pos_lock);
	pthread_setcancelstate(cancel_state, NULL);
	guard--;
	errno = saved;
	return ret;
}

ssize_t kvs_shim_readv(int fd, const struct iovec *iov, int iovcnt, off_t off, bool use_pos)
{
	struct iovec local[KVS_IOV_LOCAL];
	const struct iovec *v = NULL;
	struct kvs_fdinfo fi;
	uint64_t len = 0;
	int saved = errno;

	if (guard)
		return -1;
	guard++;
	/* The array only for a KV file: every other descriptor's readv is the kernel's alone. */
	int r = kvs_fdinfo_get(fd, &fi);
	if (r == 0 && fi.kv)
		v = kvs_shim_iov_read(iov, iovcnt, local, &len);
	else if (r == 0 && (fi.dev || fi.ino)) /* a pipe or a socket (neither) needs no word */
		pass(fd, &fi, KVS_WHY_NOT_KV, 0);
	guard--;
	errno = saved;
	if (!v)
		return -1;
	if (!kvs_shim_wants(len)) {
		kvs_shim_note_small(fd, len);
		return -1;
	}
	return kvs_shim_read(fd, v, iovcnt, off, use_pos);
}

/* A cuFile read of fd into memory the shim cannot copy to: counted and said.  Caller holds
 * guard. */
static void device_unserved(int fd, const struct kvs_fdinfo *fi, uint64_t off, uint64_t len)
{
	unserved(KVS_CTR_unserved_device, KVS_CAUSE_UNSERVED_DEVICE,
		 "a cuFile read of a KV file into memory the shim cannot copy to", fi, off, len);
	pass(fd, fi, KVS_WHY_DEVICE, 0);
}

/*
 * A cuFile read's common part: fd a KV file (O_DIRECT or not: cuFile reads are served either
 * way), the destination classified and ready, the region attached, the anchor taken (in
 * a->rd.fd: the caller puts it once the read is over).  Fills *rd and a->tg.  Returns 0, or -1
 * to pass through (nothing held).  Caller holds guard.
 */
static int prepare_to(struct kvs_shim_async *a, int fd, uint64_t ptr, size_t size, off_t off)
{
	struct kvs_fdinfo fi;
	int anchor;

	if (off < 0 || size == 0 || size > KVS_MAX_RW_COUNT || ptr + size < ptr)
		return -1;
	if (!admit(fd, kvs_fdinfo_get(fd, &fi), &fi, true, (uint64_t)off, size))
		return -1;
	if (kvs_device_target(&cfg, ptr, size, &a->tg)) {
		device_unserved(fd, &fi, (uint64_t)off, size);
		return -1;
	}
	if (a->tg.host && !kvs_observe_on() &&
	    !buffers_fit(fd, &fi, &a->tg.iov, 1, (uint64_t)off, size))
		return -1;
	if (kvs_observe_on()) { /* keyed and counted; the real library reads it */
		struct kvs_cache *c = region();

		if (c)
			kvs_observe_read(c, &fi, (uint64_t)off, size);
		return -1;
	}
	anchor = attach_anchor(fd, &fi, (uint64_t)off, size);
	if (anchor < 0)
		return -1;
	if (kvs_device_begin(&a->tg, cache, &cfg)) {
		kvs_anchor_put(anchor);
		device_unserved(fd, &fi, (uint64_t)off, size);
		return -1;
	}
	a->fd = fd;
	a->rd = make_read(&fi, anchor, (uint64_t)off, size);
	if (a->tg.host) {
		a->rd.iov = &a->tg.iov;
		a->rd.iovcnt = 1;
	} else {
		a->rd.dest = &a->tg.dest;
	}
	return 0;
}

ssize_t kvs_shim_read_to(int fd, uint64_t ptr, size_t size, off_t off)
{
	int saved = errno, cancel_state;
	struct kvs_shim_async a;
	ssize_t ret = -1;

	guard++;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
	if (prepare_to(&a, fd, ptr, size, off))
		goto out;
	int64_t n = kvs_loader_read(loader, &a.rd);
	kvs_anchor_put(a.rd.fd);
	after_read(n);
	if (n < 0)
		fell_back(fd, &a.rd, n);
	if (n >= 0) {
		kvs_cache_count(cache, KVS_CTR_cufile_requests, 1);
		kvs_observe_served(cache, a.rd.tally, (uint64_t)n);
		ret = n;
	}
out:
	pthread_setcancelstate(cancel_state, NULL);
	guard--;
	errno = saved;
	return ret;
}

/* A served asynchronous POSIX read that stopped short at the end of the file: zero the rest
 * of its buffers where the kernel would (a short O_DIRECT read on ext4, XFS, btrfs), as the
 * synchronous path does. */
static void async_tail(struct kvs_shim_async *a, int64_t result)
{
	if (a->posix && a->zero_tail && result >= 0 && (uint64_t)result < a->rd.len)
		zero_tail(a->rd.iov, a->rd.iovcnt, (uint64_t)result);
}

static void async_done(struct kvs_task *t, int64_t result)
{
	struct kvs_shim_async *a = t->arg;

	async_tail(a, result);
	after_read(result);
	if (result < 0)
		fell_back(a->fd, &a->rd, result); /* a->done reads it for real */
	else
		kvs_observe_served(cache, a->rd.tally, (uint64_t)result);
	if (result >= 0 && !a->posix)
		kvs_cache_count(cache, KVS_CTR_cufile_requests, 1);
	int anchor = a->rd.fd;
	a->done(a, result); /* may read again through the anchor (kernel AIO), then reuse a */
	kvs_anchor_put(anchor);
}

/* kvs_loader_start for a prepared a: 0 (a->done will be called, and the anchor put after
 * it), 1 (over already: a->result), -1 (not started).  The anchor is put here for the last
 * two. */
static int start_async(struct kvs_shim_async *a)
{
	int r = kvs_loader_start(loader, &a->task, &a->rd, async_done, a);

	if (r != 1) {
		if (r != 0) {
			kvs_anchor_put(a->rd.fd);
			fell_back(a->fd, &a->rd, r); /* the caller passes it through */
		}
		return r == 0 ? 0 : -1;
	}
	kvs_anchor_put(a->rd.fd); /* a hit: the loader read nothing through it */
	a->result = a->task.result;
	async_tail(a, a->result);
	after_read(a->result);
	kvs_observe_served(cache, a->rd.tally, (uint64_t)a->result);
	if (!a->posix)
		kvs_cache_count(cache, KVS_CTR_cufile_requests, 1);
	return 1;
}

int kvs_shim_read_to_start(struct kvs_shim_async *a, int fd, uint64_t ptr, size_t size, off_t off,
			   void (*done)(struct kvs_shim_async *a, int64_t result))
{
	int saved = errno, cancel_state, ret = -1;

	guard++;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
	a->done = done;
	a->posix = false;
	if (prepare_to(a, fd, ptr, size, off) == 0)
		ret = start_async(a);
	pthread_setcancelstate(cancel_state, NULL);
	guard--;
	errno = saved;
	return ret;
}

static bool shim_on(void);

bool kvs_shim_observing(void)
{
	return shim_on() && kvs_observe_on();
}

void kvs_shim_observe_to(int fd, uint64_t ptr, size_t size, off_t off)
{
	int saved = errno, cancel_state;
	struct kvs_shim_async a;

	guard++;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
	memset(&a.tg, 0, sizeof(a.tg));
	(void)prepare_to(&a, fd, ptr, size, off); /* observes, then passes it through (-1) */
	pthread_setcancelstate(cancel_state, NULL);
	guard--;
	errno = saved;
}

int kvs_shim_read_start(struct kvs_shim_async *a, int fd, const struct iovec *iov, int iovcnt,
			off_t off, void (*done)(struct kvs_shim_async *a, int64_t result))
{
	int saved = errno, cancel_state, ret = -1, anchor;
	struct kvs_fdinfo fi;
	uint64_t len = 0;

	if (iovcnt <= 0 || iovcnt > IOV_MAX || off < 0)
		return -1;
	for (int i = 0; i < iovcnt; i++) {
		if (iov[i].iov_len > SSIZE_MAX - len)
			return -1;
		len += iov[i].iov_len;
	}
	if (len == 0 || len > KVS_MAX_RW_COUNT)
		return -1;
	guard++;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
	memset(&a->tg, 0, sizeof(a->tg));
	a->done = done;
	a->zero_tail = false;
	if (!admit(fd, kvs_fdinfo_get(fd, &fi), &fi, false, (uint64_t)off, len))
		goto out;
	if (!direct_fits(fd, &fi, iov, iovcnt, off))
		goto out;
	if (!kvs_observe_on() && !buffers_fit(fd, &fi, iov, iovcnt, (uint64_t)off, len))
		goto out;
	if (kvs_observe_on()) { /* keyed and counted; the real call reads it */
		observe_posix(fd, &fi, (uint64_t)off, len);
		goto out;
	}
	anchor = attach_anchor(fd, &fi, (uint64_t)off, len);
	if (anchor < 0)
		goto out;
	a->fd = fd;
	a->rd = make_read(&fi, anchor, (uint64_t)off, len);
	a->rd.iov = iov;
	a->rd.iovcnt = iovcnt;
	a->posix = true;
	a->zero_tail = fi.direct && fi.dio_zero_tail;
	ret = start_async(a);
out:
	pthread_setcancelstate(cancel_state, NULL);
	guard--;
	errno = saved;
	return ret;
}

/*
 * cuFileReadAsync (design.md, "cuFileReadAsync: stream order").  The copies from the slots go
 * on the program's stream, so they must not read a slot before its shard is READY, and
 * nothing may block the driver's host-function thread (host functions of every stream of the
 * process may share it).  After the pins, one of two orders:
 *
 *   SETTLED  every shard was READY at the pin, or there is no other way: the calling thread
 *            settles (kvs_loader_settle; for hits it waits for nothing), then enqueues the
 *            copies, which may read the slots whenever the driver likes;
 *   GATED    a miss, and copies that read their sources in stream order (cuMemcpyBatchAsync
 *            with CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, or cuMemcpyHtoDAsync from slots pinned
 *            by one registration each): a gate (gpu.h) on the stream first, then the copies;
 *            the settler thread settles and raises the gate; the stream goes on then.
 *
 * Last on the stream in both, stream_done: a host function that only releases, counts and
 * reports (it never blocks).  Once anything is on the stream the rest must follow (nothing
 * can be taken back), so a later failure becomes the read's error; before that, a failure
 * passes the read through.
 *
 * The settler: one thread per process, started with the first GATED read, that settles the
 * reads queued to it (settle_head/tail under settle_mu, signalled on settle_cond) one after
 * the other; their loads are in flight already, so it mostly waits.  It writes only
 * sr->settle_err, then raises the gate (release), and touches sr no more: stream_done, which
 * runs only after the stream is past the gate, loads the gate (acquire) before it reads
 * settle_err, and frees sr.  The fork child forgets the queue and the thread, which it does
 * not have.
 */

/* A read on the program's stream: lives from the enqueue until stream_done. */
struct stream_read {
	struct kvs_shim_async a;
	ssize_t *bytes_read;
	int64_t result;		  /* what *bytes_read gets, unless settle_err */
	bool gated;		  /* GATED: gate is on the stream, the settler raises it */
	struct kvs_gpu_gate gate; /* GATED */
	int settle_err;		  /* written by the settler before the raise */
	struct stream_read *next; /* the settler's queue */
};

static pthread_mutex_t settle_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t settle_cond = PTHREAD_COND_INITIALIZER;
static struct stream_read *settle_head, *settle_tail; /* under settle_mu */
static bool settler_running;			      /* under settle_mu */

static void *settler(void *arg)
{
	(void)arg;
	guard++; /* the shim's own thread: any hooked call it makes is the real one */
	for (;;) {
		pthread_mutex_lock(&settle_mu);
		while (!settle_head)
			pthread_cond_wait(&settle_cond, &settle_mu);
		struct stream_read *sr = settle_head;
		settle_head = sr->next;
		if (!settle_head)
			settle_tail = NULL;
		pthread_mutex_unlock(&settle_mu);

		sr->settle_err = kvs_loader_settle(loader, &sr->a.task);
		kvs_gpu_gate_raise(
		    &sr->gate); /* pairs with stream_done's load; sr is not ours now */
	}
	return NULL;
}

/* Is there a settler (started now if need be)? */
static bool settler_ready(void)
{
	pthread_mutex_lock(&settle_mu);
	if (!settler_running)
		settler_running = kvs_thread_start(NULL, settler, NULL, KVS_STACK_OWN) == 0;
	bool ok = settler_running;
	pthread_mutex_unlock(&settle_mu);
	return ok;
}

/* Queue sr for the settler (settler_ready said yes: it never stops). */
static void settle_later(struct stream_read *sr)
{
	sr->next = NULL;
	pthread_mutex_lock(&settle_mu);
	if (settle_tail)
		settle_tail->next = sr;
	else
		settle_head = sr;
	settle_tail = sr;
	pthread_cond_signal(&settle_cond);
	pthread_mutex_unlock(&settle_mu);
}

static void settle_atfork_child(void)
{
	pthread_mutex_init(&settle_mu, NULL);
	pthread_cond_init(&settle_cond, NULL);
	settle_head = settle_tail = NULL; /* the parent's reads, on the parent's streams */
	settler_running = false;
}

/* Last on the stream: the copies are over; release, count and report.  Never blocks. */
static void stream_done(void *arg)
{
	struct stream_read *sr = arg;

	if (sr->gated) {
		/* pairs with the raise: settle_err is the settler's last word */
		(void)atomic_load_explicit(sr->gate.word, memory_order_acquire);
		if (sr->settle_err && sr->result >= 0)
			sr->result = sr->settle_err;
		kvs_device_gate_release(&sr->a.tg, &sr->gate);
	}
	kvs_loader_unpin(loader, &sr->a.task);
	kvs_anchor_put(sr->a.rd.fd); /* a failed shard was read through it by the settle */
	if (sr->result >= 0) {
		kvs_cache_count(cache, KVS_CTR_h2d_bytes, (uint64_t)sr->result);
		kvs_cache_count(cache, KVS_CTR_cufile_requests, 1);
		kvs_observe_served(cache, sr->a.rd.tally, (uint64_t)sr->result);
	} else {
		kvs_cache_count(cache, KVS_CTR_failures, 1);
	}
	*sr->bytes_read = (ssize_t)sr->result;
	free(sr);
}

/* Is every slot of sr pinned by one registration (read by the driver in stream order)? */
static bool stream_pinned(struct stream_read *sr)
{
	for (uint32_t i = 0; i < kvs_loader_nops(&sr->a.task); i++) {
		const void *src;
		uint64_t pos;
		uint32_t len;

		kvs_loader_op(loader, &sr->a.task, i, &src, &pos, &len);
		if (!kvs_device_pinned(&sr->a.tg, src, len))
			return false;
	}
	return true;
}

/* Enqueue sr's copies on stream: one batch (in_order or at the call), else, when plain is
 * allowed, one cuMemcpyHtoDAsync each.  Returns 0, or -errno with *queued saying whether any
 * may be on the stream. */
static int stream_copies(struct stream_read *sr, void *stream, bool batch, bool in_order,
			 bool plain, bool *queued)
{
	uint32_t n = kvs_loader_nops(&sr->a.task);
	uint64_t pos[KVS_TASK_OPS];
	const void *src[KVS_TASK_OPS];
	size_t len[KVS_TASK_OPS];

	*queued = false;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t l;

		kvs_loader_op(loader, &sr->a.task, i, &src[i], &pos[i], &l);
		len[i] = l;
	}
	if (batch) {
		int r = kvs_device_stream_copies(&sr->a.tg, stream, n, pos, src, len, in_order);

		*queued = r != -ENOTSUP;
		if (r != -ENOTSUP || !plain)
			return r;
	}
	for (uint32_t i = 0; i < n; i++) {
		int r = kvs_device_stream_copy(&sr->a.tg, stream, pos[i], src[i], len[i]);

		if (r)
			return r;
		*queued = true;
	}
	return 0;
}

/* A cuFileReadAsync of fi's file (len bytes at off) passed to the real library: counted and
 * said.  Caller holds guard. */
static void stream_unserved(const struct kvs_fdinfo *fi, uint64_t off, uint64_t len)
{
	unserved(KVS_CTR_unserved_stream, KVS_CAUSE_UNSERVED_STREAM,
		 "a cuFileReadAsync of a KV file on a stream not registered with fixed sizes and "
		 "offsets, into host memory, or longer than 16 shards",
		 fi, off, len);
}

void kvs_shim_note_stream(int fd, uint64_t off, uint64_t len)
{
	struct kvs_fdinfo fi;

	if (fd < 0 || !kvs_shim_wants(SIZE_MAX))
		return;
	int saved = errno;
	guard++;
	if (kvs_fdinfo_get(fd, &fi) == 0 && fi.kv)
		stream_unserved(&fi, off, len);
	guard--;
	errno = saved;
}

int kvs_shim_read_to_stream(int fd, uint64_t ptr, size_t size, off_t off, ssize_t *bytes_read,
			    void *stream)
{
	int saved = errno, cancel_state, ret = -1, anchor = -1;
	struct stream_read *sr = calloc(1, sizeof(*sr));

	if (!sr || !bytes_read)
		goto out_free;
	guard++;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
	if (prepare_to(&sr->a, fd, ptr, size, off))
		goto out;
	anchor = sr->a.rd.fd; /* held until stream_done, or put on the way out */
	/* A capturing stream runs what is enqueued at every launch of its graph, after the
	 * first has freed sr: not a read the shim can serve (nor one it can ask about). */
	if (sr->a.tg.host || kvs_device_stream_capturing(&sr->a.tg, stream) != 0) {
		struct kvs_fdinfo fi = fi_of(&sr->a.rd);

		stream_unserved(&fi, sr->a.rd.off, sr->a.rd.len);
		goto out;
	}
	int r = kvs_loader_pin(loader, &sr->a.task, &sr->a.rd);
	if (r == -E2BIG) {
		struct kvs_fdinfo fi = fi_of(&sr->a.rd);

		/* longer than a task's shards: the stream is the library's */
		stream_unserved(&fi, sr->a.rd.off, sr->a.rd.len);
		goto out;
	} else if (r) {
		fell_back(fd, &sr->a.rd, r);
		goto out;
	}
	sr->bytes_read = bytes_read;
	sr->result = (int64_t)(sr->a.task.end - sr->a.rd.off);

	bool batch = kvs_device_has_batch(&sr->a.tg);
	bool pinned = stream_pinned(sr);
	if (!kvs_loader_pinned_ready(&sr->a.task) && (batch || pinned) && settler_ready() &&
	    kvs_device_gate_wait(&sr->a.tg, stream, &sr->gate) == 0) {
		sr->gated = true;
	} else if ((r = kvs_loader_settle(loader, &sr->a.task))) {
		kvs_loader_unpin(loader, &sr->a.task); /* nothing on the stream: pass through */
		fell_back(fd, &sr->a.rd, r);
		goto out;
	}
	/* GATED: in stream order (batch, else pinned slots).  SETTLED: the slots are READY, so
	 * any order: pinned slots by DMA, else a batch that reads them during the call without
	 * waiting for the stream (a pageable cuMemcpyHtoDAsync may wait for it first). */
	bool queued;
	r = stream_copies(sr, stream, sr->gated ? batch : batch && !pinned, sr->gated,
			  !sr->gated || pinned, &queued);
	if (r && !queued && !sr->gated) {
		kvs_loader_unpin(loader, &sr->a.task); /* nothing on the stream: pass through */
		fell_back(fd, &sr->a.rd, r);
		goto out;
	}
	if (r)
		sr->result = -KVS_CU_FILE_CUDA_DRIVER_ERROR;
	bool gated = sr->gated;
	if (kvs_device_stream_func(&sr->a.tg, stream, stream_done, sr)) {
		/* Cannot happen after the first enqueue worked, short of a dying context: the
		 * pins stay until the process exits, and the reaper returns them then. */
		kvs_log_once(KVS_CAUSE_CUFILE, KVS_LOG_WARN,
			     "cuFileReadAsync: the driver refused a host function; pins kept");
		if (gated)
			sr->gated = false; /* stream_done will not run: nothing reads it */
	}
	/* From here on sr belongs to stream_done (and, GATED, to the settler until it raises
	 * the gate): not touched again. */
	if (gated)
		settle_later(sr);
	sr = NULL;
	ret = 0;
	anchor = -1; /* stream_done puts it, or the pins keep it */
out:
	kvs_anchor_put(anchor);
	pthread_setcancelstate(cancel_state, NULL);
	guard--;
out_free:
	free(sr);
	errno = saved;
	return ret;
}

const char *kvs_shim_cufile_library(void)
{
	kvs_shim_wants(0); /* the configuration, loaded once */
	int st = atomic_load_explicit(&state, memory_order_acquire); /* pairs with init's */
	if ((st == ST_ON || st == ST_OFF) && cfg.cuda_cufile_library[0])
		return cfg.cuda_cufile_library;
	return "libcufile.so.0"; /* being loaded by another thread, or empty: the default */
}

/* Is the shim on (the configuration loaded first if need be)?  Not from the shim's own code. */
static bool shim_on(void)
{
	return kvs_shim_wants(0) || atomic_load_explicit(&state, memory_order_acquire) == ST_ON;
}

/* Every write is looked at, whatever its size (a header patched after the blocks must be
 * seen): a descriptor known not to be a KV file costs one load (fdinfo.h), one that is costs
 * statx and fcntl. */
static int write_look(int fd, struct kvs_fdinfo *fi)
{
	return kvs_fdinfo_get(fd, fi);
}

/*
 * The cuFileWrite this thread is inside, when the shim staged it (kvs_shim_cufile_write_before
 * to _after): libcufile in compatibility mode moves the bytes with its own pwrite (or kernel
 * AIO), which the write hooks see, nested in the shim's cuFileWrite.  Those writes are the
 * cuFileWrite's own bytes, already staged and covered by its write token: staging them again
 * would give the range two staged copies and the file two tokens, and it would not be kept.
 * A write on this thread, of this file, inside this range, is left to the outer one; any other
 * write (another thread's, another range) is handled as always.
 */
static __thread struct {
	bool on;
	uint64_t dev, ino, off, len;
} cf_outer __attribute__((tls_model("initial-exec")));

static bool inside_cufile_write(const struct kvs_fdinfo *fi, int64_t off, uint64_t len)
{
	return cf_outer.on && fi->dev == cf_outer.dev && fi->ino == cf_outer.ino && off >= 0 &&
	       (uint64_t)off >= cf_outer.off && len <= cf_outer.len &&
	       (uint64_t)off - cf_outer.off <= cf_outer.len - len;
}

const struct iovec *kvs_shim_write_iov(int fd, const struct iovec *iov, int iovcnt,
				       struct iovec *local, uint64_t *len)
{
	const struct iovec *v = NULL;
	struct kvs_fdinfo fi;

	if (guard || !shim_on() ||
	    (!kvs_wthru_on() && atomic_load_explicit(&mapped, memory_order_acquire) != AT_OK))
		return NULL;
	int saved = errno;
	guard++;
	if (kvs_fdinfo_get(fd, &fi) == 0 && fi.kv)
		v = kvs_shim_iov_read(iov, iovcnt, local, len);
	guard--;
	errno = saved;
	return v;
}

/* The region for a write of a file fi describes: with write-through on, or for a file keyed by
 * birth (a write does not move its id: what the region holds of it must go), mapped for it;
 * else the one a process has mapped already (a reader), whose writes still move the write
 * sequences.  NULL: nothing to do.  Caller holds guard. */
static struct kvs_cache *write_region(const struct kvs_fdinfo *fi)
{
	if (kvs_wthru_on() || fi->write_once)
		return region();
	return atomic_load_explicit(&mapped, memory_order_acquire) == AT_OK ? cache : NULL;
}

/* A write of fi's file that is not staged (write-through off, the pools spent, flags or a
 * place it cannot follow): followed as a change (kvs_wthru_change), or at least through the
 * file's write sequence, so that no staged copy of the file, this process's or another's, is
 * published over it.  True when kvs_shim_write_after must follow.  Caller holds guard. */
static bool follow_change(struct kvs_cache *c, struct kvs_wthru_op *op, int fd,
			  const struct kvs_fdinfo *fi, int64_t off, uint64_t len, bool named)
{
	if (kvs_wthru_change(c, op, fd, fi, off, len, named))
		return true;
	kvs_cache_write_begin(c, fi->dev, fi->ino, &op->tok);
	op->tok_only = op->tok.held;
	return op->tok_only;
}

bool kvs_shim_write_before(struct kvs_wthru_op *op, int fd, const struct iovec *iov, int iovcnt,
			   uint64_t len, int64_t off, bool stream)
{
	struct kvs_fdinfo fi;
	bool r = false;

	op->f = NULL;
	op->tok_only = false;
	if (guard || len == 0 || !shim_on())
		return false;
	/* The kernel moves at most MAX_RW_COUNT bytes in one call, whatever was asked. */
	if (len > KVS_MAX_RW_COUNT)
		len = KVS_MAX_RW_COUNT;
	int saved = errno;
	guard++;
	int got = write_look(fd, &fi);
	if (got == 0 && fi.kv && inside_cufile_write(&fi, off, iov ? len : 0))
		got = -EALREADY; /* libcufile moving the shim's own cuFileWrite: staged already */
	struct kvs_cache *c = got || !fi.kv ? NULL : write_region(&fi);
	if (c && iov)
		r = kvs_wthru_before(c, op, fd, &fi, iov, iovcnt, len, off,
				     stream ? KVS_WT_STREAM : 0, NULL, NULL);
	if (c && !r)
		r = follow_change(c, op, fd, &fi, off < 0 ? KVS_WT_AT_POS : off, len, true);
	guard--;
	errno = saved;
	return r;
}

void kvs_shim_write_after(struct kvs_wthru_op *op, int fd, ssize_t ret)
{
	int saved = errno;

	guard++;
	if (op->tok_only)
		kvs_cache_write_end(cache, &op->tok); /* the region is mapped */
	else
		kvs_wthru_after(cache, op, fd, ret); /* staged: the region is mapped */
	guard--;
	errno = saved;
}

bool kvs_shim_write_submitted(struct kvs_shim_wpend *p, int fd, const struct iovec *iov, int iovcnt,
			      uint64_t off)
{
	struct iovec local[KVS_IOV_LOCAL];
	struct kvs_fdinfo fi;
	uint64_t len = 0;
	bool r = false;

	p->op.f = NULL;
	p->op.tok_only = false;
	p->fd = fd;
	if (guard || !shim_on() || off > (uint64_t)INT64_MAX)
		return false;
	int saved = errno;
	guard++;
	const struct iovec *v = kvs_shim_iov_read(iov, iovcnt, local, &len);
	if (len > KVS_MAX_RW_COUNT)
		len = KVS_MAX_RW_COUNT;
	int got = v && len ? write_look(fd, &fi) : -1;
	struct kvs_cache *c =
	    got || !fi.kv || inside_cufile_write(&fi, (int64_t)off, len) ? NULL : write_region(&fi);
	/* Its bytes are copied now (deferred): the program may reuse its buffers as soon as it
	 * knows the write is over, before the shim hears of it. */
	if (c)
		r = kvs_wthru_before(c, &p->op, fd, &fi, v, iovcnt, len, (int64_t)off,
				     KVS_WT_DEFERRED, NULL, NULL) ||
		    follow_change(c, &p->op, fd, &fi, (int64_t)off, len, true);
	guard--;
	errno = saved;
	return r;
}

void kvs_shim_write_completed(struct kvs_shim_wpend *p, ssize_t ret)
{
	if (p)
		kvs_shim_write_after(&p->op, p->fd, ret); /* noted: the region is mapped */
}

bool kvs_shim_change_before(struct kvs_shim_change *ch, int fd, int64_t off, const int64_t *offp,
			    uint64_t len, bool named)
{
	ch->on = false;
	ch->op.f = NULL;
	ch->op.tok_only = false;
	if (guard || len == 0 || !shim_on())
		return false;
	int saved = errno;
	guard++;
	struct kvs_cache *c =
	    kvs_fdinfo_get(fd, &ch->fi) || !ch->fi.kv ? NULL : write_region(&ch->fi);
	/* The program's offset, read as the kernel reads it: one it refuses changes nothing. */
	if (c && offp && (!kvs_shim_copy_in(&off, offp, sizeof(off)) || off < 0))
		c = NULL;
	if (c) {
		ch->fd = fd;
		ch->first = 0;
		ch->last = UINT64_MAX;
		if (off >= 0) {
			uint64_t S = kvs_cache_shard_size(c);

			ch->first = (uint64_t)off / S;
			ch->last = len - 1 > UINT64_MAX - (uint64_t)off
				       ? UINT64_MAX / S
				       : ((uint64_t)off + len - 1) / S;
			/* A write-once file changed over bytes it held: all of it goes (wonce.h).
			 */
			if (kvs_wonce_rewrites(c, fd, &ch->fi, (uint64_t)off, len, false)) {
				ch->first = 0;
				ch->last = UINT64_MAX;
			}
		}
		/* The shards as they are, whoever loaded them; again after it
		 * (kvs_shim_change_after): those loaded while it landed. */
		kvs_cache_invalidate(c, &ch->fi.block, ch->first, ch->last);
		ch->on = follow_change(c, &ch->op, fd, &ch->fi, off, len, named);
	}
	guard--;
	errno = saved;
	return ch->on;
}

void kvs_shim_change_after(struct kvs_shim_change *ch, ssize_t ret)
{
	struct kvs_fdinfo fi;

	if (!ch->on)
		return;
	int saved = errno;
	kvs_shim_write_after(&ch->op, ch->fd, ret);
	guard++;
	if (kvs_fdinfo_get(ch->fd, &fi) == 0 && fi.kv)
		kvs_cache_invalidate(cache, &fi.block, ch->first, ch->last);
	guard--;
	errno = saved;
}

void kvs_shim_change_now(int fd, int64_t off, uint64_t len)
{
	struct kvs_shim_change ch;

	if (kvs_shim_change_before(&ch, fd, off, NULL, len, true))
		kvs_shim_change_after(&ch, (ssize_t)len);
}

static int device_src_copy(void *ctx, uint64_t pos, void *dst, size_t n)
{
	return kvs_device_copy_to_host(ctx, pos, dst, n);
}

bool kvs_shim_cufile_write_before(struct kvs_shim_cfwrite *w, int fd, uint64_t ptr, size_t size,
				  off_t off)
{
	struct kvs_fdinfo fi;
	bool r = false;

	w->op.f = NULL;
	if (guard || off < 0 || size == 0 || size > KVS_MAX_RW_COUNT || ptr + size < ptr ||
	    !shim_on() || !kvs_wthru_on())
		return false;
	int saved = errno;
	guard++;
	struct kvs_cache *c = kvs_fdinfo_get(fd, &fi) == 0 && fi.kv ? region() : NULL;
	if (c && kvs_device_target(&cfg, ptr, size, &w->tg) == 0) {
		w->iov = (struct iovec){(void *)(uintptr_t)ptr, size};
		/* Device memory: the bytes come through the driver; host memory: a plain copy. */
		r = kvs_wthru_before(c, &w->op, fd, &fi, &w->iov, 1, size, off, KVS_WT_DEFERRED,
				     w->tg.host ? NULL : device_src_copy, &w->tg);
	}
	if (r) /* the real call's own writes of these bytes are this one's (inside_cufile_write) */
		cf_outer.dev = fi.dev, cf_outer.ino = fi.ino, cf_outer.off = (uint64_t)off,
		cf_outer.len = size, cf_outer.on = true;
	guard--;
	errno = saved;
	return r;
}

void kvs_shim_cufile_write_after(struct kvs_shim_cfwrite *w, int fd, ssize_t ret)
{
	cf_outer.on = false;
	kvs_shim_write_after(&w->op, fd, ret);
}

struct wt_file *kvs_shim_closing(int fd)
{
	struct wt_file *f;

	if (guard || !kvs_wthru_busy() ||
	    atomic_load_explicit(&mapped, memory_order_acquire) != AT_OK)
		return NULL;
	int saved = errno;
	guard++;
	f = kvs_wthru_closing(cache, fd, KVS_WT_CLOSE);
	guard--;
	errno = saved;
	return f;
}

struct wt_file *kvs_shim_fclosing(int fd, int64_t pos, int *dupfd)
{
	struct wt_file *f;

	*dupfd = -1;
	if (fd < 0 || guard || !kvs_wthru_busy() ||
	    atomic_load_explicit(&mapped, memory_order_acquire) != AT_OK)
		return NULL;
	int saved = errno;
	guard++;
	f = kvs_wthru_closing(cache, fd, pos);
	if (f)
		*dupfd = (int)kvs_syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, 0);
	guard--;
	errno = saved;
	return f;
}

void kvs_shim_fclosed(struct wt_file *f, int dupfd, int ret)
{
	int saved = errno;

	guard++;
	kvs_wthru_stream_closed(cache, f, dupfd, ret);
	guard--;
	errno = saved;
}

void kvs_shim_closed(struct wt_file *f, int ret)
{
	int saved = errno;

	guard++;
	kvs_wthru_closed(cache, f, ret);
	guard--;
	errno = saved;
}

struct wt_file *kvs_shim_truncating(int fd, struct kvs_wtok *tok)
{
	struct wt_file *f;

	if (guard || !kvs_wthru_busy() ||
	    atomic_load_explicit(&mapped, memory_order_acquire) != AT_OK)
		return NULL;
	int saved = errno;
	guard++;
	f = kvs_wthru_truncating(cache, fd, tok);
	guard--;
	errno = saved;
	return f;
}

void kvs_shim_truncated(struct wt_file *f, int fd, struct kvs_wtok *tok, int ret)
{
	int saved = errno;

	guard++;
	kvs_wthru_truncated(cache, f, fd, tok, ret);
	guard--;
	errno = saved;
}

void kvs_shim_synced(int fd)
{
	if (guard || !kvs_wthru_busy() ||
	    atomic_load_explicit(&mapped, memory_order_acquire) != AT_OK)
		return;
	int saved = errno;
	guard++;
	kvs_wthru_synced(cache, fd);
	guard--;
	errno = saved;
}

void kvs_shim_renamed(int dirfd, const char *path)
{
	if (guard || atomic_load_explicit(&mapped, memory_order_acquire) != AT_OK ||
	    !kvs_wthru_on())
		return;
	int saved = errno;
	guard++;
	kvs_wthru_renamed(cache, dirfd, path);
	guard--;
	errno = saved;
}

bool kvs_shim_opening(struct kvs_wonce_open *o, int dirfd, const char *path, int flags)
{
	o->on = false;
	if (guard || !kvs_fdinfo_any_write_once() || !shim_on())
		return false;
	int saved = errno;
	guard++;
	bool on = kvs_wonce_opening(o, region, dirfd, path, flags);
	guard--;
	errno = saved;
	return on;
}

void kvs_shim_opened(const struct kvs_wonce_open *o, int fd)
{
	int saved = errno;

	guard++;
	kvs_wonce_opened(o, fd);
	guard--;
	errno = saved;
}

bool kvs_shim_is_kv(int fd)
{
	struct kvs_fdinfo fi;

	if (guard || fd < 0 || !shim_on())
		return false;
	int saved = errno;
	guard++;
	bool kv = kvs_fdinfo_get(fd, &fi) == 0 && fi.kv;
	guard--;
	errno = saved;
	return kv;
}

void kvs_shim_fd_gone(int fd)
{
	kvs_fdinfo_forget(fd);
	kvs_wonce_closed(fd);
}

void kvs_shim_fds_gone(unsigned int lo, unsigned int hi)
{
	kvs_fdinfo_forget_range(lo, hi);
	kvs_wonce_closed_range(lo, hi);
}

void kvs_shim_invalidate(int fd, off_t off, size_t len, bool use_pos, off_t pos_delta)
{
	int saved = errno;
	struct kvs_fdinfo fi;

	if (guard || len == 0 || kvs_fdinfo_not_kv(fd) || !shim_on())
		return;
	guard++;
	if (kvs_fdinfo_get(fd, &fi) || !fi.kv)
		goto out;
	/* A file keyed by birth keeps its id through a write: the region must be mapped to drop
	 * what it held.  One keyed by change gets a new id from the write, so only a process
	 * with the region mapped already has anything to tidy. */
	struct kvs_cache *c = atomic_load_explicit(&mapped, memory_order_acquire) == AT_OK ? cache
			      : fi.write_once ? region()
					      : NULL;
	if (!c)
		goto out;
	if (use_pos) {
		off = lseek(fd, 0, SEEK_CUR);
		if (off < 0 || off + pos_delta < 0)
			goto out;
		off += pos_delta;
	}
	uint64_t S = kvs_cache_shard_size(c);
	/* pos_delta < 0: the call after the write (hooks_posix.c's AROUND_WRITE). */
	if (kvs_wonce_rewrites(c, fd, &fi, (uint64_t)off, len, pos_delta < 0))
		kvs_cache_invalidate(c, &fi.block, 0, fi.size ? (fi.size - 1) / S : 0);
	else
		kvs_cache_invalidate(c, &fi.block, (uint64_t)off / S,
				     ((uint64_t)off + len - 1) / S);
out:
	guard--;
	errno = saved;
}
