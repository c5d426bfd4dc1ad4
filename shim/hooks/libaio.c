/*
 * hooks_libaio: libaio's names, the doors of kernel AIO (its engine: api/kaio.c).  libaio's calls
 * answer -errno and leave errno alone, as the engine does.
 */
#include <linux/aio_abi.h>
#include <signal.h>
#include <time.h>

#include "kaio.h"
#include "shim.h"

int io_submit(void *ctx, long nr, struct iocb **ios);
int io_getevents(void *ctx, long min_nr, long nr, struct io_event *events,
		 struct timespec *timeout);
int io_pgetevents(void *ctx, long min_nr, long nr, struct io_event *events,
		  struct timespec *timeout, sigset_t *sigmask);
int io_cancel(void *ctx, struct iocb *iocb, struct io_event *evt);
int io_destroy(void *ctx);

KVS_EXPORT int io_submit(void *ctx, long nr, struct iocb **ios)
{
	return (int)kvs_kaio_submit(KVS_KAIO_LIBAIO, (aio_context_t)ctx, nr, ios);
}

KVS_EXPORT int io_getevents(void *ctx, long min_nr, long nr, struct io_event *events,
			    struct timespec *timeout)
{
	return (int)kvs_kaio_getevents(KVS_KAIO_LIBAIO, (aio_context_t)ctx, min_nr, nr, events,
				       timeout, NULL);
}

KVS_EXPORT int io_pgetevents(void *ctx, long min_nr, long nr, struct io_event *events,
			     struct timespec *timeout, sigset_t *sigmask)
{
	/* The kernel's sigset argument: the mask and its size. */
	struct {
		const sigset_t *mask;
		size_t size;
	} sig = {sigmask, _NSIG / 8};

	return (int)kvs_kaio_getevents(KVS_KAIO_LIBAIO, (aio_context_t)ctx, min_nr, nr, events,
				       timeout, sigmask ? &sig : NULL);
}

KVS_EXPORT int io_cancel(void *ctx, struct iocb *iocb, struct io_event *evt)
{
	return (int)kvs_kaio_cancel(KVS_KAIO_LIBAIO, (aio_context_t)ctx, iocb, evt);
}

KVS_EXPORT int io_destroy(void *ctx)
{
	return (int)kvs_kaio_destroy(KVS_KAIO_LIBAIO, (aio_context_t)ctx);
}
