/*
 * hooks_cufile: the cuFile doors (hooks/cufile.c, hooks/cufile_batch.c).  What the dlsym door
 * (hooks/dl.c) asks of them, and the batch doors whose addresses hooks/cufile.c answers with.
 */
#ifndef KVS_SHIM_HOOKS_CUFILE_H
#define KVS_SHIM_HOOKS_CUFILE_H

#include <time.h>

#include "cufile_types.h"

/*
 * The dlsym door's answer for a name that starts with "cuFile" (dlsym.h): the shim's door for
 * it, KVS_DLSYM_NULL or NULL (pass through), as api/cufile.h's kvs_cufile_answer says.  Takes
 * no lock other than ld.so's.
 */
void *kvs_cufile_dlsym(void *handle, const char *name, const char *version);

/* hooks/cufile_batch.c's doors, exported under libcufile's names. */
kvs_cufile_error_t cuFileBatchIOSetUp(kvs_cufile_batch_handle_t *batch_idp, unsigned nr);
kvs_cufile_error_t cuFileBatchIOSubmit(kvs_cufile_batch_handle_t batch_idp, unsigned nr,
				       kvs_cufile_io_params_t *iocbp, unsigned int flags);
kvs_cufile_error_t cuFileBatchIOGetStatus(kvs_cufile_batch_handle_t batch_idp, unsigned min_nr,
					  unsigned *nr, kvs_cufile_io_events_t *iocbp,
					  struct timespec *timeout);
kvs_cufile_error_t cuFileBatchIOCancel(kvs_cufile_batch_handle_t batch_idp);
void cuFileBatchIODestroy(kvs_cufile_batch_handle_t batch_idp);

#endif
