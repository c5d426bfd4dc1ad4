/*
 * unseen: see unseen.h.  The marks themselves are unseen_marks.c's (atomics, below fdinfo.c,
 * which clears them at every look); this file decides what is marked (kvs_unseen_opened) and
 * counts what is pending at exit.
 */
#include <fcntl.h>
#include <stdint.h>
#include <sys/syscall.h>

#include "attach.h"
#include "cache.h"
#include "fdinfo.h"
#include "raw.h"
#include "shim.h"
#include "unseen.h"
#include "unseen_marks.h"

void kvs_unseen_opened(int fd, int flags)
{
	struct kvs_fdinfo fi;

	if (fd < 0 || fd >= KVS_UNSEEN_SLOTS || !(flags & O_DIRECT) ||
	    (flags & O_ACCMODE) == O_WRONLY || (flags & O_PATH) || !kvs_shim_wants(SIZE_MAX))
		return;
	int saved = kvs_shim_in();
	/* The look at the open is the shim's own: the mark comes after it. */
	if (kvs_fdinfo_get(fd, &fi) == 0 && fi.kv)
		kvs_unseen_mark(fd, kvs_syscall(SYS_getpid));
	kvs_shim_out(saved);
}

/* At exit, what is pending is counted, if this process read no KV file the shim saw: a loader
 * that reads through the shim and opens a file it then reads nothing of (a probe, a spare
 * descriptor per thread) is not one whose reads went where the shim cannot see.  Not at _exit
 * or a kill. */
__attribute__((destructor)) static void unseen_at_exit(void)
{
	struct kvs_cache *c;

	if (!kvs_unseen_pending() || kvs_shim_inside() || !kvs_shim_wants(SIZE_MAX) ||
	    kvs_syscall(SYS_getpid) != kvs_unseen_owner())
		return;
	int saved = kvs_shim_in();
	if (!(kvs_shim_is_mapped() && kvs_cache_counted(kvs_shim_cache, KVS_CTR_read_bytes)) &&
	    (c = kvs_shim_region(true)))
		kvs_cache_count(c, KVS_CTR_unserved_unseen, kvs_unseen_pending_take());
	kvs_shim_out(saved);
}
