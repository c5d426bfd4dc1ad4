/*
 * hooks_uring: the program's io_uring reads of KV files served at submission (see
 * hooks_uring.c).  liburing's submitting functions are interposed there; these are what the
 * other hooks tell it.  None changes errno or fails.
 */
#ifndef KVS_HOOKS_URING_H
#define KVS_HOOKS_URING_H

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
/* A library was unloaded (the dlclose hook): the liburing functions found for call sites are
 * forgotten. */
void kvs_uring_unloaded(void);
/* In the fork child. */
void kvs_uring_atfork_child(void);

#endif
