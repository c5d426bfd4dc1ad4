/*
 * touch: see touch.h.
 *
 * Why the rekey is safe.  The shards move from the identity I1 read before the call to the
 * identity I2 read after it only when:
 *   - the call succeeded, and I2 is the same inode (dev, ino) with the same size as I1;
 *   - no write of the file under the shim was in flight at the look before, and none began or
 *     ended until the look after (the region's write sequence, kvs_cache_write_mark/_quiet):
 *     every write of a process under the shim is seen there;
 *   - I1 and I2 differ (else there is nothing to move).
 * A writer outside the shim that wrote before the look made I1 another identity than the one
 * the shards were loaded under, so there is nothing of I1 to move (or only what a load under
 * I1 kept, with the expiry that load had).  One that writes after the look after moves I2, as
 * it would have moved I1.  What is left is a write outside the shim between the two looks,
 * which the stamps of the touch cover up: operations.md lists it among the things the shim
 * cannot see.  kvs_cache_rekey keeps each shard's expiry, so a shard kept only until files.settle
 * stays kept only until then, and moves no pinned slot (a read of it is in progress: that one
 * shard is loaded again).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fdinfo.h"
#include "real.h"
#include "shim.h"
#include "touch.h"

bool kvs_touch_before(struct kvs_touch *t, int dirfd, const char *path, bool nofollow)
{
	struct kvs_fdinfo fi;
	int saved;

	t->on = false;
	t->own_fd = false;
	if (!kvs_shim_enter(&saved))
		return false;
	t->fd = dirfd;
	if (path) {
		t->fd = openat(dirfd, path, O_PATH | O_CLOEXEC | (nofollow ? O_NOFOLLOW : 0));
		if (t->fd < 0)
			goto out;
		t->own_fd = true;
	}
	/* Classified as any descriptor; the shim's own number is forgotten again at once. */
	int r = kvs_fdinfo_get(t->fd, &fi);
	if (t->own_fd)
		kvs_fdinfo_forget(t->fd);
	if (r || !fi.kv || fi.write_once)
		goto out;
	if (kvs_ident_of_fd(t->fd, false, &t->pre) || t->pre.dev != fi.dev || t->pre.ino != fi.ino)
		goto out;
	t->c = kvs_shim_region();
	if (!t->c || !kvs_cache_write_mark(t->c, t->pre.dev, t->pre.ino, &t->mark))
		goto out;
	t->on = true;
out:
	if (!t->on && t->own_fd) {
		kvs_real_init();
		kvs_real.close(t->fd);
		t->own_fd = false;
	}
	kvs_shim_leave(saved);
	return t->on;
}

/* Move every cached shard of the file from pre's block id to post's; true if one moved. */
static bool rekey_file(struct kvs_cache *c, const struct kvs_ident *pre,
		       const struct kvs_ident *post)
{
	struct kvs_key from, to;
	uint64_t S = kvs_cache_shard_size(c), n = (pre->size + S - 1) / S;
	bool moved = false;

	kvs_ident_key(pre, &from);
	kvs_ident_key(post, &to);
	for (uint64_t sh = 0; sh < n; sh++) {
		struct kvs_key a = kvs_shard_key(&from, sh), b = kvs_shard_key(&to, sh);

		moved |= kvs_cache_rekey(c, &a, &b) == 1;
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
			kvs_real.close(t->fd);
		return;
	}
	if (ret == 0 && kvs_ident_of_fd(t->fd, false, &post) == 0 && post.dev == t->pre.dev &&
	    post.ino == t->pre.ino && post.size == t->pre.size && !kvs_ident_same(&post, &t->pre) &&
	    kvs_cache_write_quiet(t->c, t->pre.dev, t->pre.ino, t->mark) &&
	    rekey_file(t->c, &t->pre, &post))
		kvs_cache_count(t->c, KVS_CTR_touches_kept, 1);
	if (t->own_fd)
		kvs_real.close(t->fd);
	kvs_shim_leave(saved);
}
