/*
 * uring: the engine of the program's io_uring reads of KV files served at submission (see
 * api/uring.c).  What its doors tell it: liburing's names (hooks/uring.c), libc's syscall() and
 * mmap (hooks/syscall.c, hooks/posix.c), the close and fork fan-outs.  None changes errno or
 * fails.
 */
#ifndef KVS_SHIM_URING_H
#define KVS_SHIM_URING_H

#include <stdbool.h>

struct io_uring;

/* liburing is about to hand ring's pending entries to the kernel: serve them,
 * [*khead, sqe_tail), or with flushed_only those the kernel would take now,
 * [*khead, min(*ktail, *khead + limit)). */
void kvs_uring_serve_liburing(struct io_uring *ring, bool flushed_only, unsigned limit);
/* liburing registered files (fds NULL: all empty) over [off, off + n) of ring_fd's table
 * (replace: the whole table), unregistered them (files_drop), or changed them in a way the
 * shim cannot follow (files_unknown: the ring's fixed-file reads are passed through). */
void kvs_uring_files_set(int ring_fd, unsigned off, const int *fds, unsigned n, bool replace);
void kvs_uring_files_drop(int ring_fd);
void kvs_uring_files_unknown(int ring_fd);
/* ring fd is closed, or its ring exited: forgotten. */
void kvs_uring_ring_forget(int fd);

/* libc's syscall(): io_uring_setup returned fd for params (struct io_uring_params). */
void kvs_uring_setup_done(int fd, const void *params);
/* libc's syscall(): io_uring_enter(fd, to_submit, ..., flags) is about to be made. */
void kvs_uring_enter(int fd, unsigned to_submit, unsigned flags);
/* libc's syscall(): io_uring_register(fd, opcode, arg, nr) answered result. */
void kvs_uring_register(int fd, unsigned opcode, const void *arg, unsigned nr, long result);
/* mmap(..., fd, off) returned addr (MAP_FAILED: nothing). */
void kvs_uring_mapped(int fd, long off, void *addr);
/* The program closed fd. */
void kvs_uring_closed(int fd);
/* In the fork child. */
void kvs_uring_atfork_child(void);

#endif
