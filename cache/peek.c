/*
 * peek: what an object in /dev/shm is, for `kvshim ls`, without blocking on it and without
 * trusting it more than an attacher would.
 *
 * Nothing here maps the region or takes a lock: the header is read with one pread (its identity
 * lines are read-only after publication; refused_attaches, a statistic, may be a moment old),
 * and the attached processes are counted from their liveness locks (F_OFD_GETLK, which never
 * waits).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"
#include "raw.h"

static uint64_t ns_of(const struct timespec *ts)
{
	return (uint64_t)ts->tv_sec * 1000000000ull + (uint64_t)ts->tv_nsec;
}

/* Fill out from a stat of the object, and classify what kvs_cache_distrust refuses. */
static bool classify(const struct stat *st, uint32_t mode, struct kvs_peek *out)
{
	out->uid = (uint32_t)st->st_uid;
	out->size = (uint64_t)st->st_size;
	out->created_ns = ns_of(&st->st_ctim);
	if (!kvs_cache_distrust(st, mode, out->why, sizeof(out->why)))
		return false;
	if (!S_ISREG(st->st_mode))
		out->state = KVS_PEEK_NOT_REGION;
	else if (st->st_uid != geteuid())
		out->state = KVS_PEEK_FOREIGN;
	else
		out->state = KVS_PEEK_UNTRUSTED;
	return true;
}

int kvs_cache_peek(const char *path, uint32_t mode, struct kvs_peek *out)
{
	char msg[320], self[32];
	struct kvs_hdr h;
	struct stat st;
	int fd;

	memset(out, 0, sizeof(*out));
	out->live = -1;
	if (lstat(path, &st) < 0)
		return -errno;
	if (classify(&st, mode, out))
		return 0;
	fd = kvs_cache_open_file(path, O_RDONLY, mode, msg, sizeof(msg));
	if (fd < 0) {
		/* Replaced since lstat: say what is there now. */
		if (fd == -EPERM && lstat(path, &st) == 0 && classify(&st, mode, out))
			return 0;
		return fd;
	}
	if (fstat(fd, &st) < 0) {
		int r = -errno;

		kvs_sys_close(fd);
		return r;
	}
	classify(&st, mode, out); /* the file opened: trusted, so this only fills the figures */
	/* A raw system call: inside the shim, pread is our own hook. */
	if (kvs_syscall(SYS_pread64, fd, &h, sizeof(h), 0) != (long)sizeof(h) ||
	    h.magic != KVS_MAGIC) {
		out->state = KVS_PEEK_NOT_REGION;
		snprintf(out->why, sizeof(out->why), "no kvshim region header");
	} else if (h.version != KVS_LAYOUT_VERSION || h.hdr_bytes != sizeof(h)) {
		out->state = KVS_PEEK_LAYOUT;
		snprintf(
		    out->why, sizeof(out->why),
		    "layout version %u with a header of %u bytes; this kvshim reads version %u "
		    "of %zu",
		    h.version, h.hdr_bytes, KVS_LAYOUT_VERSION, sizeof(h));
	} else {
		out->state = KVS_PEEK_OK;
		out->created_ns = h.created_ns;
		out->capacity_bytes = h.capacity;
		out->shard_size = h.shard_size;
		out->slots = h.nslots;
		out->refused_attaches = load_relaxed(&h.refused_attaches);
		memcpy(out->built_by, h.built_by, sizeof(h.built_by));
	}
	if (out->state == KVS_PEEK_OK || out->state == KVS_PEEK_LAYOUT) {
		/* Through the descriptor just checked, not the name, which may change. */
		snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
		out->live = kvs_cache_live_processes(self);
		if (out->live < 0)
			out->live = -1;
	}
	kvs_sys_close(fd);
	return 0;
}
