/*
 * fanout: the two events every module of the shim hears, each told to them in one written
 * order from one place: a fork (pthread_atfork's three handlers) and a close of descriptors.
 * Calling every module is calling down: nothing below includes this header.  The fork
 * handlers are registered by this module's constructor, at load.
 */
#ifndef KVS_SHIM_FANOUT_H
#define KVS_SHIM_FANOUT_H

/* The program is about to close [lo, hi] (close, close_range, dup2 or dup3 onto newfd), before
 * the kernel does: the shim's own descriptors among those numbers move away or become the
 * program's (cache.h, kvs_cache_fds_closing; anchor.h, kvs_anchor_numbers_closing), so that the
 * shim never acts on what the program opens there next.  Async-signal-safe; errno unchanged. */
void kvs_shim_fds_closing(unsigned int lo, unsigned int hi);
/* The same for dup2 or dup3(oldfd, newfd, flags) (flags 0 for dup2) and close_range(lo, hi,
 * flags): nothing when the call closes nothing (oldfd == newfd, a bad oldfd or flags,
 * CLOSE_RANGE_CLOEXEC, lo > hi). */
void kvs_shim_dup_closing(int oldfd, int newfd, int flags);
void kvs_shim_range_closing(unsigned int lo, unsigned int hi, unsigned int flags);

#endif
