/*
 * hooks_posix_aio: glibc's POSIX aio names, the doors of POSIX aio served by the cache (its
 * engine: api/paio.c, docs/design.md, "POSIX aio (`api/paio.c`)").  The 64 names take an aiocb64,
 * which is an aiocb on the 64-bit systems the shim is built for.
 */
#include <aio.h>

#include "paio.h"
#include "shim.h"

KVS_EXPORT int aio_read(struct aiocb *cb)
{
	return kvs_paio_read(0, cb);
}

KVS_EXPORT int aio_read64(struct aiocb64 *cb)
{
	return kvs_paio_read(1, (struct aiocb *)cb);
}

KVS_EXPORT int aio_write(struct aiocb *cb)
{
	return kvs_paio_write(0, cb);
}

KVS_EXPORT int aio_write64(struct aiocb64 *cb)
{
	return kvs_paio_write(1, (struct aiocb *)cb);
}

KVS_EXPORT int aio_error(const struct aiocb *cb)
{
	return kvs_paio_error(0, cb);
}

KVS_EXPORT int aio_error64(const struct aiocb64 *cb)
{
	return kvs_paio_error(1, (const struct aiocb *)cb);
}

KVS_EXPORT ssize_t aio_return(struct aiocb *cb)
{
	return kvs_paio_return(0, cb);
}

KVS_EXPORT ssize_t aio_return64(struct aiocb64 *cb)
{
	return kvs_paio_return(1, (struct aiocb *)cb);
}

KVS_EXPORT int aio_suspend(const struct aiocb *const list[], int nent,
			   const struct timespec *timeout)
{
	return kvs_paio_suspend(0, list, nent, timeout);
}

KVS_EXPORT int aio_suspend64(const struct aiocb64 *const list[], int nent,
			     const struct timespec *timeout)
{
	return kvs_paio_suspend(1, (const struct aiocb *const *)list, nent, timeout);
}

KVS_EXPORT int aio_cancel(int fd, struct aiocb *cb)
{
	return kvs_paio_cancel(0, fd, cb);
}

KVS_EXPORT int aio_cancel64(int fd, struct aiocb64 *cb)
{
	return kvs_paio_cancel(1, fd, (struct aiocb *)cb);
}

KVS_EXPORT int lio_listio(int mode, struct aiocb *const list[], int nent, struct sigevent *sig)
{
	return kvs_paio_lio(0, mode, list, nent, sig);
}

KVS_EXPORT int lio_listio64(int mode, struct aiocb64 *const list[], int nent, struct sigevent *sig)
{
	return kvs_paio_lio(1, mode, (struct aiocb *const *)list, nent, sig);
}
