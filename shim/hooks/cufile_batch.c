/*
 * hooks_cufile_batch: libcufile's batch names, the doors of cuFile batches (their engine:
 * api/cufile_batch.c), one call each into kvs_cufile_batch_*.
 */
#include <time.h>

#include "cufile.h"
#include "hooks_cufile.h"
#include "shim.h"

KVS_EXPORT kvs_cufile_error_t cuFileBatchIOSetUp(kvs_cufile_batch_handle_t *batch_idp, unsigned nr)
{
	return kvs_cufile_batch_setup(batch_idp, nr);
}

KVS_EXPORT kvs_cufile_error_t cuFileBatchIOSubmit(kvs_cufile_batch_handle_t batch_idp, unsigned nr,
						  kvs_cufile_io_params_t *iocbp, unsigned int flags)
{
	return kvs_cufile_batch_submit(batch_idp, nr, iocbp, flags);
}

KVS_EXPORT kvs_cufile_error_t cuFileBatchIOGetStatus(kvs_cufile_batch_handle_t batch_idp,
						     unsigned min_nr, unsigned *nr,
						     kvs_cufile_io_events_t *iocbp,
						     struct timespec *timeout)
{
	return kvs_cufile_batch_get_status(batch_idp, min_nr, nr, iocbp, timeout);
}

KVS_EXPORT kvs_cufile_error_t cuFileBatchIOCancel(kvs_cufile_batch_handle_t batch_idp)
{
	return kvs_cufile_batch_cancel(batch_idp);
}

KVS_EXPORT void cuFileBatchIODestroy(kvs_cufile_batch_handle_t batch_idp)
{
	kvs_cufile_batch_destroy(batch_idp);
}
