/*
 * guard: the recursion guard, one pair.  kvs_shim_guard is per thread, nonzero while the
 * shim's own code runs on it.  A hook entered meanwhile makes the real call and nothing more:
 * a signal handler that interrupts a served read and reads again gets the real call, never a
 * lock the shim holds; a library the shim calls into (libcufile, the CUDA driver) calling a
 * hooked name reaches the real function.  (The shim's own code does not enter its hooks: it
 * makes its system calls through base/raw.h and reaches libc through kvs_real,
 * scripts/check_layers.sh keeps it so.)
 *
 * kvs_shim_in raises the guard and returns errno; kvs_shim_out(saved) lowers it and gives
 * errno back: every entry into the shim's own code that must leave errno as the program's
 * brackets its work with the two.  A thread of the shim's own raises it once for its life.
 *
 * Each hook of a function POSIX lists as async-signal-safe (read, write, close, fsync,
 * fdatasync, ftruncate, rename, renameat, fcntl, aio_error, aio_return, aio_suspend) asks
 * kvs_shim_inside at its first line, and every lock such a hook may take beyond it is taken
 * only inside the guard, by every thread: so a hook that is not inside never waits for a lock
 * its own thread holds, and none of them allocates or frees memory.  What is not
 * async-signal-safe is said where it is (the first attach and the first write-through of a
 * process: docs/design.md, "Known limitations").
 */
#ifndef KVS_SHIM_GUARD_H
#define KVS_SHIM_GUARD_H

#include <errno.h>
#include <stdbool.h>

extern __thread int kvs_shim_guard __attribute__((tls_model("initial-exec")));

static inline int kvs_shim_in(void)
{
	int saved = errno;

	kvs_shim_guard++;
	return saved;
}

static inline void kvs_shim_out(int saved_errno)
{
	kvs_shim_guard--;
	errno = saved_errno;
}

/* Is the shim's own code running on this thread? */
static inline bool kvs_shim_inside(void)
{
	return kvs_shim_guard != 0;
}

#endif
