/*
 * hooks_posix_aio: glibc's POSIX aio, served by the cache (the hooks are exported names; see
 * hooks_posix_aio.c).  What other hooks need of it:
 */
#ifndef KVS_SHIM_HOOKS_POSIX_AIO_H
#define KVS_SHIM_HOOKS_POSIX_AIO_H

/* The program is about to close fd: its aio writes noted for write-through and never seen
 * over (the program did not ask aio_error or aio_return) keep nothing, so that the close
 * does not wait on them for ever.  One load when none is noted; errno unchanged. */
void kvs_aio_closing(int fd);

/* Its fork rule (fanout.c): prepare takes the table's lock, the parent releases it, the child
 * forgets the parent's requests and noted writes and makes its lock and condition anew. */
void kvs_posix_aio_atfork_prepare(void);
void kvs_posix_aio_atfork_parent(void);
void kvs_posix_aio_atfork_child(void);

#endif
