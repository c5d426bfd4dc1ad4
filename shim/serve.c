/*
 * serve: see serve.h; and the synchronous POSIX read (kvs_shim_read, kvs_shim_readv).
 *
 * pos_mu[] serialise read/readv at the file position per file, as the kernel does per open
 * file description (we cannot tell descriptions apart, so two descriptions of one file also
 * wait for each other).
 *
 * The served path after attach calls no malloc and holds nothing across a point where the
 * thread could be cancelled: cancellation is disabled while it runs, and a cancel already
 * pending is acted on at entry, where the real call would have acted on it.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "anchor.h"
#include "atime.h"
#include "attach.h"
#include "cache.h"
#include "config.h"
#include "device.h"
#include "fdinfo.h"
#include "loader.h"
#include "log.h"
#include "observe.h"
#include "progmem.h"
#include "serve.h"
#include "shim.h"
#include "unserved.h"
#include "why.h"
#include "wonce.h"
#include "wthru.h"

#define POS_LOCKS 64
static pthread_mutex_t pos_mu[POS_LOCKS] = {[0 ... POS_LOCKS - 1] = PTHREAD_MUTEX_INITIALIZER};

void kvs_serve_pos_init(void)
{
	for (int i = 0; i < POS_LOCKS; i++)
		pthread_mutex_init(&pos_mu[i], NULL);
}

/* Does a read path serve fd, which kvs_fdinfo_get described as fi with result r?  Says why not.
 * any_mode: cuFile, which serves a descriptor whether it has O_DIRECT or not.  Caller holds
 * guard. */
bool kvs_serve_admit(int fd, int r, const struct kvs_fdinfo *fi, bool any_mode, uint64_t off,
		     uint64_t len)
{
	if (r)
		return false; /* fstat or fcntl failed: the real call will say why */
	if (!fi->kv) {
		if (fi->dev || fi->ino) /* a pipe or a socket (neither) needs no explaining */
			kvs_unserved_pass(fd, fi, KVS_WHY_NOT_KV, 0);
		return false;
	}
	if (!fi->readable) {
		kvs_unserved_pass(fd, fi, KVS_WHY_UNREADABLE, 0);
		return false;
	}
	if (!any_mode && !fi->direct && !kvs_shim_cfg.files_buffered) {
		kvs_unserved(KVS_CTR_unserved_buffered, KVS_CAUSE_UNSERVED_BUFFERED,
			     "a buffered read of a KV file (no O_DIRECT, files.buffered = false)",
			     fi, off, len);
		kvs_unserved_pass(fd, fi, KVS_WHY_BUFFERED, 0);
		return false;
	}
	return true;
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

/* May the read of fd (described as fi) write its buffers (buffers_writable)?  Else counted and
 * said: the real call answers EFAULT or a short count.  Caller holds guard. */
bool kvs_serve_buffers_fit(int fd, const struct kvs_fdinfo *fi, const struct iovec *iov, int iovcnt,
			   uint64_t off, uint64_t len)
{
	if (kvs_progmem_writable(iov, iovcnt))
		return true;
	kvs_unserved(KVS_CTR_unserved_buffers, KVS_CAUSE_UNSERVED_BUFFERS,
		     "a read of a KV file into memory the shim may not write", fi, off, len);
	kvs_unserved_pass(fd, fi, KVS_WHY_BUFFERS, 0);
	return false;
}

/* What an unserved count needs of rd's file: its size and root. */
struct kvs_fdinfo kvs_serve_fi_of(const struct kvs_read *rd)
{
	return (struct kvs_fdinfo){.kv = true, .size = rd->file_size, .root = rd->root};
}

/* The cache handed back rd, a read of fd it had taken (n < 0): the caller makes the real call.
 * Counted with its bytes, and said at debug (after_read says it once at info).  Caller holds
 * guard. */
void kvs_serve_fell_back(int fd, const struct kvs_read *rd, int64_t n)
{
	struct kvs_fdinfo fi = kvs_serve_fi_of(rd);

	kvs_observe_unserved(kvs_shim_cache, &fi, KVS_CTR_unserved_fallback, rd->off, rd->len);
	kvs_why(fd, rd->dev, rd->ino, KVS_WHY_FALLBACK, n < 0 ? (int)-n : 0);
}

/* Zero the request's bytes from pos to its end, as the kernel does for a short O_DIRECT read on
 * some file systems. */
void kvs_serve_zero_tail(const struct iovec *iov, int iovcnt, uint64_t pos)
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
struct kvs_read kvs_serve_make_read(const struct kvs_fdinfo *fi, int anchor, uint64_t off,
				    uint64_t len)
{
	kvs_atime_note(kvs_shim_cache, anchor, fi);
	return (struct kvs_read){
	    .fd = anchor,
	    .direct = fi->direct,
	    .fresh = {.changed_ns = fi->changed_ns,
		      .settle_ns = fi->settle_ns,
		      .revalidate_ns = kvs_shim_cfg.files_revalidate * 1000000ull,
		      .node_clock = fi->node_clock},
	    .block = fi->block,
	    .dev = fi->dev,
	    .ino = fi->ino,
	    .write_once = fi->write_once,
	    .file_size = fi->size,
	    .root = fi->root,
	    .tally = kvs_observe_ref(kvs_shim_cache, fi),
	    .off = off,
	    .len = len};
}

/* After a loader call: report a stuck region, and a read that fell back, once each. */
/* Said once: a load larger than the region (kvs_cache_outgrown). */
static _Atomic bool outgrown_said;

void kvs_serve_after_read(int64_t n)
{
	if (kvs_cache_take_euclean(kvs_shim_cache))
		kvs_log_once(
		    KVS_CAUSE_EUCLEAN, KVS_LOG_WARN,
		    "the region's shared state is stuck or corrupt (%s): reads that meet it "
		    "go to storage; see `kvshim stat`, and `kvshim reset` once no engine runs",
		    strerror(EUCLEAN));
	if (n < 0)
		kvs_log_once(KVS_CAUSE_READ_FALLBACK, n == -EUCLEAN ? KVS_LOG_WARN : KVS_LOG_INFO,
			     "a read went to storage directly (%s)", strerror((int)-n));
	else if (!atomic_load_explicit(&outgrown_said, memory_order_relaxed) &&
		 kvs_cache_outgrown(kvs_shim_cache) &&
		 !atomic_exchange_explicit(&outgrown_said, true, memory_order_relaxed))
		kvs_log_once(
		    KVS_CAUSE_CAPACITY, KVS_LOG_WARN,
		    "this process has read more from storage than the region holds "
		    "(cache.capacity %llu MiB) and evicted %llu shards to make room: a file "
		    "read again after its shards were evicted comes from storage again; "
		    "`kvshim check` says what the roots' files need",
		    (unsigned long long)(kvs_cache_capacity(kvs_shim_cache) >> 20),
		    (unsigned long long)kvs_cache_counted(kvs_shim_cache, KVS_CTR_evictions));
}

/* Attach the region and take fd's anchor (anchor.h: waits while another thread installs or
 * retires one).  The anchor, referenced (kvs_anchor_put it once the read is over), or -1 having
 * said why not.  Caller holds guard; a position lock, if any, before attach_mu and the anchors'
 * lock (neither is held while taking one). */
int kvs_serve_attach_anchor(int fd, const struct kvs_fdinfo *fi, uint64_t off, uint64_t len)
{
	if (!kvs_shim_attach()) {
		kvs_unserved(KVS_CTR_unserved_no_cache, KVS_CAUSE_UNSERVED_NO_CACHE,
			     "a read of a KV file while the cache cannot be used in this process",
			     fi, off, len);
		kvs_unserved_pass(fd, fi, KVS_WHY_NO_CACHE, 0);
		return -1;
	}
	int anchor = kvs_anchor_get(fd, fi);
	if (anchor < 0) {
		kvs_unserved(KVS_CTR_unserved_anchor, KVS_CAUSE_UNSERVED_ANCHOR,
			     "a read of a KV file the shim could not hold open (shim.log = debug "
			     "says why)",
			     fi, off, len);
		kvs_unserved_pass(fd, fi, KVS_WHY_ANCHOR, -anchor);
	}
	return anchor;
}

/* An O_DIRECT read must be aligned as O_DIRECT needs or the real call fails: serve only what
 * it would accept.  True when fi's read may be served; else counted and said.  Caller holds
 * guard. */
bool kvs_serve_direct_fits(int fd, const struct kvs_fdinfo *fi, const struct iovec *iov, int iovcnt,
			   off_t off)
{
	uint64_t len = 0;

	if (!fi->direct || direct_ok(fi, iov, iovcnt, off))
		return true;
	for (int i = 0; i < iovcnt; i++)
		len += iov[i].iov_len;
	kvs_unserved(KVS_CTR_unserved_misaligned, KVS_CAUSE_UNSERVED_MISALIGNED,
		     "an O_DIRECT read of a KV file not aligned as O_DIRECT needs", fi,
		     (uint64_t)off, len);
	kvs_unserved_pass(fd, fi, KVS_WHY_MISALIGNED, 0);
	return false;
}

/* A cuFile read of fd into memory the shim cannot copy to: counted and said.  Caller holds
 * guard. */
static void device_unserved(int fd, const struct kvs_fdinfo *fi, uint64_t off, uint64_t len)
{
	kvs_unserved(KVS_CTR_unserved_device, KVS_CAUSE_UNSERVED_DEVICE,
		     "a cuFile read of a KV file into memory the shim cannot copy to", fi, off,
		     len);
	kvs_unserved_pass(fd, fi, KVS_WHY_DEVICE, 0);
}

/*
 * A cuFile read's common part: fd a KV file (O_DIRECT or not: cuFile reads are served either
 * way), the destination classified and ready, the region attached, the anchor taken (in
 * a->rd.fd: the caller puts it once the read is over).  Fills *rd and a->tg.  Returns 0, or -1
 * to pass through (nothing held).  Caller holds guard.
 */
int kvs_serve_cufile_prepare(struct kvs_shim_async *a, int fd, uint64_t ptr, size_t size, off_t off)
{
	struct kvs_fdinfo fi;
	int anchor;

	if (off < 0 || size == 0 || size > KVS_MAX_RW_COUNT || ptr + size < ptr)
		return -1;
	if (!kvs_serve_admit(fd, kvs_fdinfo_get(fd, &fi), &fi, true, (uint64_t)off, size))
		return -1;
	if (kvs_device_target(&kvs_shim_cfg, ptr, size, &a->tg)) {
		device_unserved(fd, &fi, (uint64_t)off, size);
		return -1;
	}
	if (a->tg.host && !kvs_observe_on() &&
	    !kvs_serve_buffers_fit(fd, &fi, &a->tg.iov, 1, (uint64_t)off, size))
		return -1;
	if (kvs_observe_on()) { /* keyed and counted; the real library reads it */
		struct kvs_cache *c = kvs_shim_region(true);

		if (c)
			kvs_observe_read(c, &fi, (uint64_t)off, size);
		return -1;
	}
	anchor = kvs_serve_attach_anchor(fd, &fi, (uint64_t)off, size);
	if (anchor < 0)
		return -1;
	if (kvs_device_begin(&a->tg, kvs_shim_cache, &kvs_shim_cfg)) {
		kvs_anchor_put(anchor);
		device_unserved(fd, &fi, (uint64_t)off, size);
		return -1;
	}
	a->fd = fd;
	a->rd = kvs_serve_make_read(&fi, anchor, (uint64_t)off, size);
	if (a->tg.host) {
		a->rd.iov = &a->tg.iov;
		a->rd.iovcnt = 1;
	} else {
		a->rd.dest = &a->tg.dest;
	}
	return 0;
}

/* shim.mode = observe: a POSIX read of fd (described as fi) that would be served, keyed and
 * counted, unless fd is the descriptor of a cuFile handle: then it is libcufile's own read of
 * a cuFile read observed already (compatibility mode).  The caller then makes the real call.
 * Caller holds guard. */
void kvs_serve_observe_posix(int fd, const struct kvs_fdinfo *fi, uint64_t off, uint64_t len)
{
	struct kvs_cache *c = kvs_fdinfo_cufile_registered(fd) ? NULL : kvs_shim_region(true);

	if (c)
		kvs_observe_read(c, fi, off, len);
}

ssize_t kvs_shim_read(int fd, const struct iovec *iov, int iovcnt, off_t off, bool use_pos)
{
	int cancel_state, anchor;
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
	int saved = kvs_shim_in();
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
	/* The position of a read at it is not known yet: its bytes are counted from 0. */
	if (!kvs_serve_admit(fd, kvs_fdinfo_get(fd, &fi), &fi, false, use_pos ? 0 : (uint64_t)off,
			     len))
		goto out;
	/* Observe mode writes no buffer: the three system calls of the check are not its cost. */
	if (!kvs_observe_on() &&
	    !kvs_serve_buffers_fit(fd, &fi, iov, iovcnt, use_pos ? 0 : (uint64_t)off, len))
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
	if (!kvs_serve_direct_fits(fd, &fi, iov, iovcnt, off))
		goto out;
	/* The kernel moves at most MAX_RW_COUNT bytes in one call, whatever was asked. */
	if (len > KVS_MAX_RW_COUNT)
		len = KVS_MAX_RW_COUNT;
	if (kvs_observe_on()) { /* keyed and counted; the real call reads it */
		kvs_serve_observe_posix(fd, &fi, (uint64_t)off, len);
		goto out;
	}
	anchor = kvs_serve_attach_anchor(fd, &fi, (uint64_t)off, len);
	if (anchor < 0)
		goto out;
	rd = kvs_serve_make_read(&fi, anchor, (uint64_t)off, len);
	rd.iov = iov;
	rd.iovcnt = iovcnt;
	int64_t n = kvs_loader_read(kvs_shim_loader, &rd);
	kvs_anchor_put(anchor); /* the loader is done with it */
	kvs_serve_after_read(n);
	if (n < 0) {
		kvs_serve_fell_back(fd, &rd, n);
		goto out;
	}
	kvs_observe_served(kvs_shim_cache, rd.tally, (uint64_t)n);
	if (use_pos && lseek(fd, off + n, SEEK_SET) < 0)
		goto out; /* cannot happen on a regular file; the real read will redo it */
	if (fi.direct && fi.dio_zero_tail && n > 0 && (uint64_t)n < len)
		kvs_serve_zero_tail(iov, iovcnt, (uint64_t)n);
	ret = n;
out:
	if (pos_lock)
		pthread_mutex_unlock(pos_lock);
	pthread_setcancelstate(cancel_state, NULL);
	kvs_shim_out(saved);
	return ret;
}

ssize_t kvs_shim_readv(int fd, const struct iovec *iov, int iovcnt, off_t off, bool use_pos)
{
	struct iovec local[KVS_IOV_LOCAL];
	const struct iovec *v = NULL;
	struct kvs_fdinfo fi;
	uint64_t len = 0;

	if (kvs_shim_inside())
		return -1;
	int saved = kvs_shim_in();
	/* The array only for a KV file: every other descriptor's readv is the kernel's alone. */
	int r = kvs_fdinfo_get(fd, &fi);
	if (r == 0 && fi.kv)
		v = kvs_shim_iov_read(iov, iovcnt, local, &len);
	else if (r == 0 && (fi.dev || fi.ino)) /* a pipe or a socket (neither) needs no word */
		kvs_unserved_pass(fd, &fi, KVS_WHY_NOT_KV, 0);
	kvs_shim_out(saved);
	if (!v)
		return -1;
	if (!kvs_shim_wants(len)) {
		kvs_shim_note_small(fd, len);
		return -1;
	}
	return kvs_shim_read(fd, v, iovcnt, off, use_pos);
}
