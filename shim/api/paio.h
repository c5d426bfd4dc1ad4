/*
 * paio: the engine of glibc's POSIX aio served by the cache (api/paio.c), below its doors
 * (hooks/posix_aio.c).  Each entry point answers as the glibc function of its name (v 0:
 * aio_read and the others; v 1: their 64 names, whose aiocb64 is an aiocb on the 64-bit
 * systems the shim is built for), errno included.
 */
#ifndef KVS_SHIM_PAIO_H
#define KVS_SHIM_PAIO_H

#include <aio.h>
#include <signal.h>
#include <sys/types.h>
#include <time.h>

int kvs_paio_read(int v, struct aiocb *cb);
int kvs_paio_write(int v, struct aiocb *cb);
int kvs_paio_error(int v, const struct aiocb *cb);
ssize_t kvs_paio_return(int v, struct aiocb *cb);
int kvs_paio_suspend(int v, const struct aiocb *const list[], int nent,
		     const struct timespec *timeout);
int kvs_paio_cancel(int v, int fd, struct aiocb *cb);
int kvs_paio_lio(int v, int mode, struct aiocb *const list[], int nent, struct sigevent *sig);

/* The program is about to close fd: its aio writes noted for write-through and never seen
 * over (the program did not ask aio_error or aio_return) keep nothing, so that the close
 * does not wait on them for ever.  One load when none is noted; errno unchanged. */
void kvs_aio_closing(int fd);

/* Its fork rule (hooks/fanout.c): prepare takes the table's lock, the parent releases it, the child
 * forgets the parent's requests and noted writes and makes its lock and condition anew. */
void kvs_posix_aio_atfork_prepare(void);
void kvs_posix_aio_atfork_parent(void);
void kvs_posix_aio_atfork_child(void);

#endif
