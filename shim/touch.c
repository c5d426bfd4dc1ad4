/*
 * touch: see touch.h.
 *
 * Why the rekey is safe.  The shards move from the identity I1 read before the call to the
 * identity I2 read after it only when:
 *   - the call succeeded, and I2 is the same inode (dev, ino) with the same size as I1; a call
 *     that leaves mtime alone (UTIME_OMIT, llm-d's atime-only touch) also left I2's mtime
 *     equal to I1's, so a write in between, which moves mtime, is always seen there;
 *   - no write of the file under the shim was in flight at the look before, and none began or
 *     ended until the look after (the region's write sequence, kvs_cache_write_mark/_quiet);
 *   - I1 and I2 differ (else there is nothing to move).
 * A writer outside the shim that wrote before the look made I1 another identity than the one
 * the shards were loaded under, so there is nothing of I1 to move (or only what a load under
 * I1 kept, with the expiry that load had).  One that writes after the look after moves I2, as
 * it would have moved I1.  What is left is a write between the two looks that the call's own
 * mtime covers up: by a process outside the shim, or by one under it whose write the write
 * sequence does not follow (an io_uring write, an unstaged asynchronous one, a write in a
 * process that has not mapped the region; wseq.c says which begins cannot take their entry,
 * and those move its word all the same).  operations.md lists it among the things the shim
 * cannot see.
 *
 * kvs_cache_rekey_until keeps each shard's expiry, so a shard kept only until files.settle
 * stays kept only until then, and moves no pinned slot (a read of it is in progress: that one
 * shard is loaded again).  On a file system whose stamps may be another machine's (NFS, FUSE:
 * fdinfo.h, node_clock) the look before may come from the client's attribute cache, older
 * than a rewrite on the server that the call's reply then reveals: there the moved shards are
 * kept at most files.settle from now, which keeps operations.md's contract for that rewrite.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fdinfo.h"
#include "raw.h"
#include "shim.h"
#include "sys.h"
#include "touch.h"

/* Copy n bytes of the caller's memory at src, through the kernel: false (nothing copied) for a
 * pointer it would refuse, where a plain read would crash the program. */
static bool peek(void *dst, const void *src, size_t n)
{
	struct iovec l = {dst, n}, r = {(void *)src, n};

	return kvs_syscall(SYS_process_vm_readv, getpid(), &l, 1, &r, 1, 0) == (ssize_t)n;
}

bool kvs_touch_before(struct kvs_touch *t, const struct kvs_touch_target *tg)
{
	struct kvs_fdinfo fi;
	struct timespec ts[2];
	int saved;

	t->on = false;
	t->own_fd = false;
	if (!kvs_shim_enter(&saved))
		return false;
	t->keeps_mtime = false;
	if (tg->times) {
		if (!peek(ts, tg->times, sizeof(ts)))
			goto out; /* the kernel's EFAULT to give */
		t->keeps_mtime = ts[1].tv_nsec == UTIME_OMIT;
	}
	t->fd = tg->dirfd;
	if (!tg->on_fd) {
		/* A file on a device no root is on, or one found under no root before, is no KV
		 * file: one statx (a touch of any other file costs that alone, fdinfo.h).  Else
		 * its path is looked at once (open, readlink, close). */
		struct statx sx;
		if (kvs_syscall(SYS_statx, tg->dirfd, tg->path,
				AT_NO_AUTOMOUNT | (tg->nofollow ? AT_SYMLINK_NOFOLLOW : 0),
				STATX_TYPE | STATX_INO, &sx) != 0 ||
		    !S_ISREG(sx.stx_mode))
			goto out;
		uint64_t dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
		if (kvs_fdinfo_dev_outside(dev) || kvs_fdinfo_outside_known(dev, sx.stx_ino))
			goto out; /* no root on its device, or found under no root before */
		/* openat reads the path through the kernel: a bad pointer is its EFAULT. */
		t->fd = kvs_sys_openat(tg->dirfd, tg->path,
				       O_PATH | O_CLOEXEC | (tg->nofollow ? O_NOFOLLOW : 0));
		if (t->fd < 0)
			goto out;
		t->own_fd = true;
		/* Its path under no root (one readlink): no statx, no fcntl. */
		int root = kvs_fdinfo_opened(t->fd);
		kvs_fdinfo_forget(t->fd);
		if (root == -1) {
			struct stat st; /* noted if it is the file statx saw */
			if (fstat(t->fd, &st) == 0 && (uint64_t)st.st_dev == dev &&
			    (uint64_t)st.st_ino == sx.stx_ino)
				kvs_fdinfo_outside_note(dev, sx.stx_ino);
			goto out;
		}
	}
	/* Classified as any descriptor; the shim's own number is forgotten again at once. */
	int r = kvs_fdinfo_get(t->fd, &fi);
	if (t->own_fd)
		kvs_fdinfo_forget(t->fd);
	if (r || !fi.kv || fi.write_once)
		goto out;
	if (kvs_ident_of_fd(t->fd, false, &t->pre) || t->pre.dev != fi.dev || t->pre.ino != fi.ino)
		goto out;
	t->cap_ns = fi.node_clock ? kvs_node_ns() + fi.settle_ns : 0;
	/* Only a region that exists: a process that only touches files creates none. */
	t->c = kvs_shim_region(false);
	if (!t->c || !kvs_cache_write_mark(t->c, t->pre.dev, t->pre.ino, &t->mark))
		goto out;
	t->on = true;
out:
	if (!t->on && t->own_fd) {
		kvs_sys_close(t->fd);
		t->own_fd = false;
	}
	kvs_shim_out(saved);
	return t->on;
}

/* Move every cached shard of the file from pre's block id to post's, kept at most until cap_ns
 * (0: as they were); true if one moved. */
static bool rekey_file(struct kvs_cache *c, const struct kvs_ident *pre,
		       const struct kvs_ident *post, uint64_t cap_ns)
{
	struct kvs_key from, to;
	uint64_t S = kvs_cache_shard_size(c), n = (pre->size + S - 1) / S;
	bool moved = false;

	kvs_ident_key(pre, &from);
	kvs_ident_key(post, &to);
	for (uint64_t sh = 0; sh < n; sh++) {
		struct kvs_key a = kvs_shard_key(&from, sh), b = kvs_shard_key(&to, sh);

		moved |= kvs_cache_rekey_until(c, &a, &b, cap_ns) == 1;
	}
	return moved;
}

void kvs_touch_after(struct kvs_touch *t, int ret)
{
	struct kvs_ident post;
	int saved;

	if (!t->on)
		return;
	t->on = false;
	if (!kvs_shim_enter(&saved)) { /* cannot happen: it was on, and the call is over */
		if (t->own_fd)
			kvs_sys_close(t->fd);
		return;
	}
	if (ret == 0 && kvs_ident_of_fd(t->fd, false, &post) == 0 && post.dev == t->pre.dev &&
	    post.ino == t->pre.ino && post.size == t->pre.size &&
	    (!t->keeps_mtime || kvs_time_eq(post.mtime, t->pre.mtime)) &&
	    !kvs_ident_same(&post, &t->pre) &&
	    kvs_cache_write_quiet(t->c, t->pre.dev, t->pre.ino, t->mark) &&
	    rekey_file(t->c, &t->pre, &post, t->cap_ns))
		kvs_cache_count(t->c, KVS_CTR_touches_kept, 1);
	if (t->own_fd)
		kvs_sys_close(t->fd);
	kvs_shim_out(saved);
}
