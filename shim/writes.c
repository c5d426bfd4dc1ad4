/*
 * writes: the write side's entry points for the hooks (shim.h): writes, changes and
 * closes followed for write-through (wthru.h) and write-once roots (wonce.h), and the
 * invalidation of what a write changes.
 */

#include <errno.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "anchor.h"
#include "atime.h"
#include "attach.h"
#include "cache.h"
#include "device.h"
#include "fdinfo.h"
#include "loader.h"
#include "observe.h"
#include "raw.h"
#include "serve.h"
#include "shim.h"
#include "shmap.h"
#include "sys.h"
#include "unserved.h"
#include "unseen.h"
#include "unseen_marks.h"
#include "wonce.h"
#include "wthru.h"
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

	if (kvs_shim_inside() || !kvs_shim_on() || (!kvs_wthru_on() && !kvs_shim_is_mapped()))
		return NULL;
	int saved = kvs_shim_in();
	if (kvs_fdinfo_get(fd, &fi) == 0 && fi.kv)
		v = kvs_shim_iov_read(iov, iovcnt, local, len);
	kvs_shim_out(saved);
	return v;
}

/* The region for a write of a file fi describes: with write-through on, or for a file keyed by
 * birth (a write does not move its id: what the region holds of it must go), mapped for it;
 * else the one a process has mapped already (a reader), whose writes still move the write
 * sequences.  NULL: nothing to do.  Caller holds guard. */
static struct kvs_cache *write_region(const struct kvs_fdinfo *fi)
{
	if (kvs_wthru_on() || fi->write_once)
		return kvs_shim_region(true);
	return kvs_shim_is_mapped() ? kvs_shim_cache : NULL;
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
	if (kvs_shim_inside() || len == 0 || !kvs_shim_on())
		return false;
	/* The kernel moves at most MAX_RW_COUNT bytes in one call, whatever was asked. */
	if (len > KVS_MAX_RW_COUNT)
		len = KVS_MAX_RW_COUNT;
	int saved = kvs_shim_in();
	int got = write_look(fd, &fi);
	if (got == 0 && fi.kv && inside_cufile_write(&fi, off, iov ? len : 0))
		got = -EALREADY; /* libcufile moving the shim's own cuFileWrite: staged already */
	struct kvs_cache *c = got || !fi.kv ? NULL : write_region(&fi);
	if (c && iov)
		r = kvs_wthru_before(c, op, fd, &fi, iov, iovcnt, len, off,
				     stream ? KVS_WT_STREAM : 0, NULL, NULL);
	if (c && !r)
		r = follow_change(c, op, fd, &fi, off < 0 ? KVS_WT_AT_POS : off, len, true);
	kvs_shim_out(saved);
	return r;
}

void kvs_shim_write_after(struct kvs_wthru_op *op, int fd, ssize_t ret)
{
	int saved = kvs_shim_in();

	if (op->tok_only)
		kvs_cache_write_end(kvs_shim_cache, &op->tok); /* the region is mapped */
	else
		kvs_wthru_after(kvs_shim_cache, op, fd, ret); /* staged: the region is mapped */
	kvs_shim_out(saved);
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
	if (kvs_shim_inside() || !kvs_shim_on() || off > (uint64_t)INT64_MAX)
		return false;
	int saved = kvs_shim_in();
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
	kvs_shim_out(saved);
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
	if (kvs_shim_inside() || len == 0 || !kvs_shim_on())
		return false;
	int saved = kvs_shim_in();
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
	kvs_shim_out(saved);
	return ch->on;
}

void kvs_shim_change_after(struct kvs_shim_change *ch, ssize_t ret)
{
	struct kvs_fdinfo fi;

	if (!ch->on)
		return;
	kvs_shim_write_after(&ch->op, ch->fd, ret);
	int saved = kvs_shim_in();
	if (ret >= 0) /* a rewrite of a write-once file counts once made */
		kvs_wonce_made(kvs_shim_cache, ch->fd, &ch->fi);
	if (kvs_fdinfo_get(ch->fd, &fi) == 0 && fi.kv)
		kvs_cache_invalidate(kvs_shim_cache, &fi.block, ch->first, ch->last);
	kvs_shim_out(saved);
}

bool kvs_shim_truncate_before(struct kvs_shim_change *ch, int fd, int64_t len)
{
	struct stat st;

	ch->on = false;
	if (len < 0 || !kvs_shim_wants(SIZE_MAX) || kvs_fdinfo_not_kv(fd))
		return false;
	int saved = errno;
	bool on = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
		  kvs_shim_change_before(ch, fd, len < st.st_size ? len : (int64_t)st.st_size, NULL,
					 UINT64_MAX, true);
	errno = saved;
	return on;
}

int kvs_shim_truncate_path_before(struct kvs_shim_change *ch, const char *path, int64_t len)
{
	struct stat st;

	ch->on = false;
	if (!path || len < 0 || !kvs_shim_wants(SIZE_MAX))
		return -1;
	int saved = errno, fd = kvs_sys_open(path, O_PATH | O_CLOEXEC);
	if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
			!kvs_shim_change_before(ch, fd, len < st.st_size ? len : st.st_size, NULL,
						UINT64_MAX, false))) {
		kvs_sys_close(fd);
		fd = -1;
	}
	errno = saved;
	return fd;
}

void kvs_shim_truncate_path_after(struct kvs_shim_change *ch, int fd, int ret)
{
	if (fd < 0)
		return;
	int saved = errno;
	kvs_shim_change_after(ch, ret);
	kvs_fdinfo_forget(fd); /* the number is the shim's for a moment only */
	kvs_sys_close(fd);
	errno = saved;
}

void kvs_shim_fd_born(int fd)
{
	if (fd >= 0) {
		kvs_fdinfo_forget(fd);
		kvs_unseen_forget(fd);
	}
}

void kvs_shim_fd_duped(int fd)
{
	kvs_unseen_forget(fd);
}

void kvs_shim_change_now(int fd, int64_t off, uint64_t len)
{
	struct kvs_shim_change ch;

	if (kvs_shim_change_before(&ch, fd, off, NULL, len, true))
		kvs_shim_change_after(&ch, (ssize_t)len);
}

void kvs_shim_mapped(const void *addr, int fd, int prot, int flags, int64_t off, uint64_t len)
{
	struct kvs_fdinfo fi;
	struct kvs_cache *c;
	bool kv = false;

	if (kvs_shim_inside() || fd < 0 || !(flags & MAP_SHARED) || (flags & MAP_ANONYMOUS) ||
	    !kvs_shim_on())
		return;
	int saved = kvs_shim_in();
	/* PROT_WRITE, or a descriptor that lets mprotect add it later. */
	int fl = (prot & PROT_WRITE) ? O_RDWR : kvs_sys_fcntl(fd, F_GETFL);
	if (fl >= 0 && (fl & O_ACCMODE) == O_RDWR && kvs_fdinfo_get(fd, &fi) == 0 && fi.kv) {
		kv = true;
		if (kvs_wthru_on())
			kvs_wthru_mapped(fi.dev, fi.ino);
		/* No load of the file is kept on the node until the mapping goes (shmap.h). */
		if ((c = kvs_shim_region(true)))
			kvs_shmap_begin(c, fi.dev, fi.ino, &fi.block, addr, (uint64_t)off,
					(size_t)len);
	}
	kvs_shim_out(saved);
	/* Stores through it change the file where no hook sees them: the range goes now, as a
	 * write over it would (a write-once file that held data there counts as rewritten). */
	if (kv && (prot & PROT_WRITE))
		kvs_shim_change_now(fd, off, len);
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
	if (kvs_shim_inside() || off < 0 || size == 0 || size > KVS_MAX_RW_COUNT ||
	    ptr + size < ptr || !kvs_shim_on() || !kvs_wthru_on())
		return false;
	int saved = kvs_shim_in();
	struct kvs_cache *c = kvs_fdinfo_get(fd, &fi) == 0 && fi.kv ? kvs_shim_region(true) : NULL;
	if (c && kvs_device_target(&kvs_shim_cfg, ptr, size, &w->tg) == 0) {
		w->iov = (struct iovec){(void *)(uintptr_t)ptr, size};
		/* Device memory: the bytes come through the driver; host memory: a plain copy. */
		r = kvs_wthru_before(c, &w->op, fd, &fi, &w->iov, 1, size, off, KVS_WT_DEFERRED,
				     w->tg.host ? NULL : device_src_copy, &w->tg);
	}
	if (r) /* the real call's own writes of these bytes are this one's (inside_cufile_write) */
		cf_outer.dev = fi.dev, cf_outer.ino = fi.ino, cf_outer.off = (uint64_t)off,
		cf_outer.len = size, cf_outer.on = true;
	kvs_shim_out(saved);
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

	if (kvs_shim_inside() || !kvs_wthru_busy() || !kvs_shim_is_mapped())
		return NULL;
	int saved = kvs_shim_in();
	f = kvs_wthru_closing(kvs_shim_cache, fd, KVS_WT_CLOSE);
	kvs_shim_out(saved);
	return f;
}

struct wt_file *kvs_shim_fclosing(int fd, int64_t pos, int *dupfd)
{
	struct wt_file *f;

	*dupfd = -1;
	if (fd < 0 || kvs_shim_inside() || !kvs_wthru_busy() || !kvs_shim_is_mapped())
		return NULL;
	int saved = kvs_shim_in();
	f = kvs_wthru_closing(kvs_shim_cache, fd, pos);
	if (f)
		*dupfd = (int)kvs_syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, 0);
	kvs_shim_out(saved);
	return f;
}

void kvs_shim_fclosed(struct wt_file *f, int dupfd, int ret)
{
	int saved = kvs_shim_in();

	kvs_wthru_stream_closed(kvs_shim_cache, f, dupfd, ret);
	kvs_shim_out(saved);
}

void kvs_shim_closed(struct wt_file *f, int ret)
{
	int saved = kvs_shim_in();

	kvs_wthru_closed(kvs_shim_cache, f, ret);
	kvs_shim_out(saved);
}

struct wt_file *kvs_shim_truncating(int fd, struct kvs_wtok *tok)
{
	struct wt_file *f;

	if (kvs_shim_inside() || !kvs_wthru_busy() || !kvs_shim_is_mapped())
		return NULL;
	int saved = kvs_shim_in();
	f = kvs_wthru_truncating(kvs_shim_cache, fd, tok);
	kvs_shim_out(saved);
	return f;
}

void kvs_shim_truncated(struct wt_file *f, int fd, struct kvs_wtok *tok, int ret)
{
	int saved = kvs_shim_in();

	kvs_wthru_truncated(kvs_shim_cache, f, fd, tok, ret);
	kvs_shim_out(saved);
}

void kvs_shim_synced(int fd)
{
	if (kvs_shim_inside() || !kvs_wthru_busy() || !kvs_shim_is_mapped())
		return;
	int saved = kvs_shim_in();
	kvs_wthru_synced(kvs_shim_cache, fd);
	kvs_shim_out(saved);
}

void kvs_shim_renamed(int dirfd, const char *path)
{
	kvs_fdinfo_outside_forget();
	if (kvs_shim_inside() || !kvs_shim_is_mapped() || !kvs_wthru_on())
		return;
	int saved = kvs_shim_in();
	kvs_wthru_renamed(kvs_shim_cache, dirfd, path);
	kvs_shim_out(saved);
}

/* The region, mapped (created if need be) on first use: what an open on a write-once root
 * asks for (wonce.h). */
static struct kvs_cache *region_created(void)
{
	return kvs_shim_region(true);
}

void kvs_shim_opening(struct kvs_wonce_open *o, int dirfd, const char *path, int flags)
{
	o->on = false;
	/* The configuration first: the open may be the process's first hooked call (dd, cp, a
	 * shell's >), before which no root is known.  Only a truncation must be looked at before
	 * the open (the file's size, which names its shards, is gone after it); every other open
	 * is looked at after it (kvs_shim_opened), through the descriptor it gives. */
	if (kvs_shim_inside() || !(flags & O_TRUNC) || !kvs_shim_on() ||
	    !kvs_fdinfo_any_write_once())
		return;
	int saved = kvs_shim_in();
	kvs_wonce_opening(o, region_created, dirfd, path, flags);
	kvs_shim_out(saved);
}

void kvs_shim_opened(struct kvs_wonce_open *o, int fd, int flags)
{
	struct kvs_fdinfo fi;

	if (fd < 0)
		return;
	kvs_shim_fd_born(fd); /* atomics: whatever the number was, it is this open's now */
	if (kvs_shim_inside() || !kvs_shim_on())
		return;
	int saved = kvs_shim_in();
	bool writes = (flags & O_ACCMODE) != O_RDONLY;
	/* A writable open: the number's class now, by its path (one readlink), so that its
	 * writes to a file outside the roots cost no system call. */
	int root = writes ? kvs_fdinfo_opened(fd) : -2;
	if (o->on) {
		kvs_wonce_opened(o, fd); /* a truncation, looked at before the open */
	} else if (writes && root != -1 && kvs_fdinfo_any_write_once() &&
		   kvs_fdinfo_get(fd, &fi) == 0 && fi.kv && fi.write_once) {
		/* A write-once file opened for writing: its size now is the bytes it held. */
		o->on = true;
		o->truncates = false;
		o->dev = fi.dev;
		o->ino = fi.ino;
		o->open_size = fi.size;
		o->c = NULL;
		kvs_wonce_opened(o, fd);
	}
	kvs_shim_out(saved);
	kvs_unseen_opened(fd, flags);
}

bool kvs_shim_is_kv(int fd)
{
	struct kvs_fdinfo fi;

	if (kvs_shim_inside() || fd < 0 || !kvs_shim_on())
		return false;
	int saved = kvs_shim_in();
	bool kv = kvs_fdinfo_get(fd, &fi) == 0 && fi.kv;
	kvs_shim_out(saved);
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
	struct kvs_fdinfo fi;

	if (kvs_shim_inside() || len == 0 || kvs_fdinfo_not_kv(fd) || !kvs_shim_on())
		return;
	int saved = kvs_shim_in();
	if (kvs_fdinfo_get(fd, &fi) || !fi.kv)
		goto out;
	/* A file keyed by birth keeps its id through a write: the region must be mapped to drop
	 * what it held.  One keyed by change gets a new id from the write, so only a process
	 * with the region mapped already has anything to tidy. */
	struct kvs_cache *c = kvs_shim_is_mapped() ? kvs_shim_cache
			      : fi.write_once	   ? kvs_shim_region(true)
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
	/* pos_delta < 0: the call after the write (hooks/posix.c's AROUND_WRITE). */
	if (kvs_wonce_rewrites(c, fd, &fi, (uint64_t)off, len, pos_delta < 0))
		kvs_cache_invalidate(c, &fi.block, 0, fi.size ? (fi.size - 1) / S : 0);
	else
		kvs_cache_invalidate(c, &fi.block, (uint64_t)off / S,
				     ((uint64_t)off + len - 1) / S);
out:
	kvs_shim_out(saved);
}
