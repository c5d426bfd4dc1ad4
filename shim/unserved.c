/*
 * unserved: see unserved.h.
 */

#include <errno.h>

#include "attach.h"
#include "cache.h"
#include "fdinfo.h"
#include "log.h"
#include "observe.h"
#include "shim.h"
#include "unserved.h"
#include "unseen_marks.h"
#include "why.h"
/* A KV file (fi, or NULL when it was not described) read at off for len bytes, or mapped, in a
 * way the shim passes through: count it with its bytes (observe.h), say so once at info, so
 * that an operator sees the shim loaded but out of the path, and why.  Caller holds guard. */
void kvs_unserved(enum kvs_counter_id id, enum kvs_cause cause, const char *what,
		  const struct kvs_fdinfo *fi, uint64_t off, uint64_t len)
{
	kvs_observe_unserved(kvs_shim_region(true), fi, id, off, len);
	kvs_log_once(cause, KVS_LOG_INFO, "%s: not served (counted in `kvshim stat` unserved_*)",
		     what);
}

/* Say at debug why a read of fd (described as fi) passes through. */
void kvs_unserved_pass(int fd, const struct kvs_fdinfo *fi, enum kvs_why why, int err)
{
	kvs_why(fd, fi->dev, fi->ino, why, err);
}

void kvs_shim_note_small(int fd, size_t len)
{
	kvs_unseen_looked(fd); /* a read the shim saw, too short to serve */
	/* Only in a process that has mapped the region already: one load for a descriptor known
	 * not to be a KV file; one look (statx, the path) the first time a descriptor is read
	 * small before anything else classified it (a 12 KiB header read first), then its class
	 * is known until its close. */
	if (kvs_shim_inside() || len == 0 || len >= kvs_shim_min_read || !kvs_shim_is_mapped() ||
	    kvs_fdinfo_not_kv(fd))
		return;
	struct kvs_fdinfo fi;
	int saved = kvs_shim_in();
	fi.kv = false;
	if (kvs_fdinfo_hint_kv(fd) || (kvs_fdinfo_get(fd, &fi) == 0 && fi.kv)) {
		/* A descriptor known already is not looked at again: its root is not known. */
		kvs_unserved(KVS_CTR_unserved_small, KVS_CAUSE_UNSERVED_SMALL,
			     "a read of a KV file shorter than files.min_read", fi.kv ? &fi : NULL,
			     0, len);
		if (kvs_log_wants(KVS_LOG_DEBUG) && kvs_fdinfo_known(fd, &fi) == 0)
			kvs_unserved_pass(fd, &fi, KVS_WHY_SMALL, 0);
	}
	kvs_shim_out(saved);
}

/* fd, if it is a KV file, read (or mapped) for len bytes at off and passed through for a reason
 * the shim counts (id) and says once (cause, what; why at debug). */
static void note_kv_unserved(int fd, enum kvs_counter_id id, enum kvs_cause cause, const char *what,
			     enum kvs_why why, uint64_t off, uint64_t len)
{
	struct kvs_fdinfo fi;

	if (fd < 0 || !kvs_shim_wants(SIZE_MAX))
		return;
	int saved = kvs_shim_in();
	if (kvs_fdinfo_get(fd, &fi) == 0 && fi.kv) {
		kvs_unserved(id, cause, what, &fi, off, len);
		kvs_unserved_pass(fd, &fi, why, 0);
	}
	kvs_shim_out(saved);
}

void kvs_shim_note_mmap(int fd, uint64_t len)
{
	note_kv_unserved(fd, KVS_CTR_unserved_mmap, KVS_CAUSE_UNSERVED_MMAP,
			 "a KV file mapped with mmap (its reads are page faults)", KVS_WHY_MMAP, 0,
			 len);
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
	int saved = kvs_shim_in();
	fi.kv = false;
	if (fd < 0 || (kvs_fdinfo_get(fd, &fi) == 0 && fi.kv))
		kvs_observe_unserved(kvs_shim_region(true), fi.kv ? &fi : NULL,
				     KVS_CTR_unserved_io_uring, off, len);
	kvs_shim_out(saved);
}
