/*
 * check_cufile_abi: shim/cufile_types.h against NVIDIA's cufile.h, in one translation unit.
 * Compile time: every size, alignment and field offset, every enum value, and each function's
 * signature (through a shape macro instantiated once with NVIDIA's types, once with ours).
 * Run time: every name in KVS_CUFILE_API is exported by each library named on the command
 * line (the real libcufile.so.0, the fake), so that hooks and fakes export what callers bind to.
 *   check_cufile_abi [LIBCUFILE...]
 */
#include <cufile.h>
#include "cufile_types.h"

#include <dlfcn.h>
#include <stdio.h>

#define SAME_LAYOUT(ours, theirs)                                                                  \
	_Static_assert(sizeof(ours) == sizeof(theirs), "sizeof " #ours);                           \
	_Static_assert(_Alignof(ours) == _Alignof(theirs), "alignof " #ours)
#define SAME_FIELD(ours, theirs, field)                                                            \
	_Static_assert(offsetof(ours, field) == offsetof(theirs, field), #ours "." #field);        \
	_Static_assert(sizeof(((ours *)0)->field) == sizeof(((theirs *)0)->field),                 \
		       #ours "." #field " size")
/* A field of a scalar, pointer or function-pointer type: also the very same type. */
#define SAME_FIELD_T(ours, theirs, field)                                                          \
	SAME_FIELD(ours, theirs, field);                                                           \
	SAME_TYPE(__typeof__(((ours *)0)->field), __typeof__(((theirs *)0)->field))
#define SAME_VALUE(name) _Static_assert((long)KVS_##name == (long)name, #name)
#define SAME_TYPE(a, b)	 _Static_assert(__builtin_types_compatible_p(a, b), #a " is " #b)

/* CUfileOpError. */
SAME_LAYOUT(kvs_cufile_op_error_t, CUfileOpError);
SAME_VALUE(CUFILEOP_BASE_ERR);
SAME_VALUE(CU_FILE_SUCCESS);
SAME_VALUE(CU_FILE_DRIVER_NOT_INITIALIZED);
SAME_VALUE(CU_FILE_DRIVER_INVALID_PROPS);
SAME_VALUE(CU_FILE_DRIVER_UNSUPPORTED_LIMIT);
SAME_VALUE(CU_FILE_DRIVER_VERSION_MISMATCH);
SAME_VALUE(CU_FILE_DRIVER_VERSION_READ_ERROR);
SAME_VALUE(CU_FILE_DRIVER_CLOSING);
SAME_VALUE(CU_FILE_PLATFORM_NOT_SUPPORTED);
SAME_VALUE(CU_FILE_IO_NOT_SUPPORTED);
SAME_VALUE(CU_FILE_DEVICE_NOT_SUPPORTED);
SAME_VALUE(CU_FILE_NVFS_DRIVER_ERROR);
SAME_VALUE(CU_FILE_CUDA_DRIVER_ERROR);
SAME_VALUE(CU_FILE_CUDA_POINTER_INVALID);
SAME_VALUE(CU_FILE_CUDA_MEMORY_TYPE_INVALID);
SAME_VALUE(CU_FILE_CUDA_POINTER_RANGE_ERROR);
SAME_VALUE(CU_FILE_CUDA_CONTEXT_MISMATCH);
SAME_VALUE(CU_FILE_INVALID_MAPPING_SIZE);
SAME_VALUE(CU_FILE_INVALID_MAPPING_RANGE);
SAME_VALUE(CU_FILE_INVALID_FILE_TYPE);
SAME_VALUE(CU_FILE_INVALID_FILE_OPEN_FLAG);
SAME_VALUE(CU_FILE_DIO_NOT_SET);
SAME_VALUE(CU_FILE_INVALID_VALUE);
SAME_VALUE(CU_FILE_MEMORY_ALREADY_REGISTERED);
SAME_VALUE(CU_FILE_MEMORY_NOT_REGISTERED);
SAME_VALUE(CU_FILE_PERMISSION_DENIED);
SAME_VALUE(CU_FILE_DRIVER_ALREADY_OPEN);
SAME_VALUE(CU_FILE_HANDLE_NOT_REGISTERED);
SAME_VALUE(CU_FILE_HANDLE_ALREADY_REGISTERED);
SAME_VALUE(CU_FILE_DEVICE_NOT_FOUND);
SAME_VALUE(CU_FILE_INTERNAL_ERROR);
SAME_VALUE(CU_FILE_GETNEWFD_FAILED);
SAME_VALUE(CU_FILE_NVFS_SETUP_ERROR);
SAME_VALUE(CU_FILE_IO_DISABLED);
SAME_VALUE(CU_FILE_BATCH_SUBMIT_FAILED);
SAME_VALUE(CU_FILE_GPU_MEMORY_PINNING_FAILED);
SAME_VALUE(CU_FILE_BATCH_FULL);
SAME_VALUE(CU_FILE_ASYNC_NOT_SUPPORTED);
SAME_VALUE(CU_FILE_INTERNAL_BATCH_SETUP_ERROR);
SAME_VALUE(CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR);
SAME_VALUE(CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR);
SAME_VALUE(CU_FILE_INTERNAL_BATCH_CANCEL_ERROR);
SAME_VALUE(CU_FILE_NOMEM_ERROR);
SAME_VALUE(CU_FILE_IO_ERROR);
SAME_VALUE(CU_FILE_INTERNAL_BUF_REGISTER_ERROR);
SAME_VALUE(CU_FILE_HASH_OPR_ERROR);
SAME_VALUE(CU_FILE_INVALID_CONTEXT_ERROR);
SAME_VALUE(CU_FILE_NVFS_INTERNAL_DRIVER_ERROR);
SAME_VALUE(CU_FILE_BATCH_NOCOMPAT_ERROR);
SAME_VALUE(CU_FILE_IO_MAX_ERROR);

/* CUfileError_t, and the CUDA types it and the async calls carry. */
SAME_LAYOUT(kvs_cu_result_t, CUresult);
SAME_TYPE(kvs_cu_stream_t, CUstream);
SAME_LAYOUT(kvs_cufile_error_t, CUfileError_t);
SAME_FIELD(kvs_cufile_error_t, CUfileError_t, err);
SAME_FIELD(kvs_cufile_error_t, CUfileError_t, cu_err);

/* CUfileDrvProps_t. */
SAME_LAYOUT(kvs_cufile_drv_props_t, CUfileDrvProps_t);
SAME_FIELD(kvs_cufile_drv_props_t, CUfileDrvProps_t, nvfs);
SAME_FIELD_T(kvs_cufile_drv_props_t, CUfileDrvProps_t, nvfs.major_version);
SAME_FIELD_T(kvs_cufile_drv_props_t, CUfileDrvProps_t, nvfs.minor_version);
SAME_FIELD_T(kvs_cufile_drv_props_t, CUfileDrvProps_t, nvfs.poll_thresh_size);
SAME_FIELD_T(kvs_cufile_drv_props_t, CUfileDrvProps_t, nvfs.max_direct_io_size);
SAME_FIELD_T(kvs_cufile_drv_props_t, CUfileDrvProps_t, nvfs.dstatusflags);
SAME_FIELD_T(kvs_cufile_drv_props_t, CUfileDrvProps_t, nvfs.dcontrolflags);
SAME_FIELD_T(kvs_cufile_drv_props_t, CUfileDrvProps_t, fflags);
SAME_FIELD_T(kvs_cufile_drv_props_t, CUfileDrvProps_t, max_device_cache_size);
SAME_FIELD_T(kvs_cufile_drv_props_t, CUfileDrvProps_t, per_buffer_cache_size);
SAME_FIELD_T(kvs_cufile_drv_props_t, CUfileDrvProps_t, max_device_pinned_mem_size);
SAME_FIELD_T(kvs_cufile_drv_props_t, CUfileDrvProps_t, max_batch_io_size);
SAME_FIELD_T(kvs_cufile_drv_props_t, CUfileDrvProps_t, max_batch_io_timeout_msecs);

/* cufileRDMAInfo_t and CUfileFSOps_t. */
SAME_LAYOUT(kvs_cufile_rdma_info_t, cufileRDMAInfo_t);
SAME_FIELD_T(kvs_cufile_rdma_info_t, cufileRDMAInfo_t, version);
SAME_FIELD_T(kvs_cufile_rdma_info_t, cufileRDMAInfo_t, desc_len);
SAME_FIELD_T(kvs_cufile_rdma_info_t, cufileRDMAInfo_t, desc_str);
SAME_LAYOUT(kvs_cufile_fs_ops_t, CUfileFSOps_t);
SAME_FIELD_T(kvs_cufile_fs_ops_t, CUfileFSOps_t, fs_type);
SAME_FIELD_T(kvs_cufile_fs_ops_t, CUfileFSOps_t, getRDMADeviceList);
SAME_FIELD_T(kvs_cufile_fs_ops_t, CUfileFSOps_t, getRDMADevicePriority);
SAME_FIELD(kvs_cufile_fs_ops_t, CUfileFSOps_t, read);
SAME_FIELD(kvs_cufile_fs_ops_t, CUfileFSOps_t, write);
SAME_TYPE(off_t, loff_t);

/* CUfileFileHandleType and CUfileDescr_t. */
SAME_LAYOUT(enum kvs_cufile_file_handle_type, enum CUfileFileHandleType);
SAME_VALUE(CU_FILE_HANDLE_TYPE_OPAQUE_FD);
SAME_VALUE(CU_FILE_HANDLE_TYPE_OPAQUE_WIN32);
SAME_VALUE(CU_FILE_HANDLE_TYPE_USERSPACE_FS);
SAME_LAYOUT(kvs_cufile_descr_t, CUfileDescr_t);
SAME_FIELD(kvs_cufile_descr_t, CUfileDescr_t, type);
SAME_FIELD(kvs_cufile_descr_t, CUfileDescr_t, handle);
SAME_FIELD_T(kvs_cufile_descr_t, CUfileDescr_t, handle.fd);
SAME_FIELD_T(kvs_cufile_descr_t, CUfileDescr_t, handle.handle);
SAME_FIELD(kvs_cufile_descr_t, CUfileDescr_t, fs_ops);
SAME_TYPE(kvs_cufile_handle_t, CUfileHandle_t);

/* CUfileOpcode_t, CUfileStatus_t, CUfileBatchMode_t. */
SAME_LAYOUT(kvs_cufile_opcode_t, CUfileOpcode_t);
SAME_VALUE(CUFILE_READ);
SAME_VALUE(CUFILE_WRITE);
SAME_LAYOUT(kvs_cufile_status_t, CUfileStatus_t);
SAME_VALUE(CUFILE_WAITING);
SAME_VALUE(CUFILE_PENDING);
SAME_VALUE(CUFILE_INVALID);
SAME_VALUE(CUFILE_CANCELED);
SAME_VALUE(CUFILE_COMPLETE);
SAME_VALUE(CUFILE_TIMEOUT);
SAME_VALUE(CUFILE_FAILED);
SAME_LAYOUT(kvs_cufile_batch_mode_t, CUfileBatchMode_t);
SAME_VALUE(CUFILE_BATCH);

/* CUfileIOParams_t, CUfileIOEvents_t, CUfileBatchHandle_t. */
SAME_LAYOUT(kvs_cufile_io_params_t, CUfileIOParams_t);
SAME_FIELD(kvs_cufile_io_params_t, CUfileIOParams_t, mode);
SAME_FIELD(kvs_cufile_io_params_t, CUfileIOParams_t, u);
SAME_FIELD(kvs_cufile_io_params_t, CUfileIOParams_t, u.batch);
SAME_FIELD_T(kvs_cufile_io_params_t, CUfileIOParams_t, u.batch.devPtr_base);
SAME_FIELD_T(kvs_cufile_io_params_t, CUfileIOParams_t, u.batch.file_offset);
SAME_FIELD_T(kvs_cufile_io_params_t, CUfileIOParams_t, u.batch.devPtr_offset);
SAME_FIELD_T(kvs_cufile_io_params_t, CUfileIOParams_t, u.batch.size);
SAME_FIELD_T(kvs_cufile_io_params_t, CUfileIOParams_t, fh);
SAME_FIELD(kvs_cufile_io_params_t, CUfileIOParams_t, opcode);
SAME_FIELD_T(kvs_cufile_io_params_t, CUfileIOParams_t, cookie);
SAME_LAYOUT(kvs_cufile_io_events_t, CUfileIOEvents_t);
SAME_FIELD_T(kvs_cufile_io_events_t, CUfileIOEvents_t, cookie);
SAME_FIELD(kvs_cufile_io_events_t, CUfileIOEvents_t, status);
SAME_FIELD_T(kvs_cufile_io_events_t, CUfileIOEvents_t, ret);
SAME_TYPE(kvs_cufile_batch_handle_t, CUfileBatchHandle_t);

/* Stream registration flags. */
SAME_VALUE(CU_FILE_STREAM_FIXED_BUF_OFFSET);
SAME_VALUE(CU_FILE_STREAM_FIXED_FILE_OFFSET);
SAME_VALUE(CU_FILE_STREAM_FIXED_FILE_SIZE);
SAME_VALUE(CU_FILE_STREAM_PAGE_ALIGNED_INPUTS);

/*
 * Signatures.  Each shape is written once with its types as parameters: E error, H file
 * handle, D descriptor, P driver properties, B batch handle, I io params, V io events, S
 * stream.  Instantiated with NVIDIA's types it must be the declared function's type; with ours,
 * the project's pointer type; and the types substituted are pinned above.
 */
#define NV_TYPES                                                                                   \
	CUfileError_t, CUfileHandle_t, CUfileDescr_t, CUfileDrvProps_t, CUfileBatchHandle_t,       \
	    CUfileIOParams_t, CUfileIOEvents_t, CUstream
#define KVS_TYPES                                                                                  \
	kvs_cufile_error_t, kvs_cufile_handle_t, kvs_cufile_descr_t, kvs_cufile_drv_props_t,       \
	    kvs_cufile_batch_handle_t, kvs_cufile_io_params_t, kvs_cufile_io_events_t,             \
	    kvs_cu_stream_t
#define SHAPE(shape, ...) shape(__VA_ARGS__)
#define SAME_SIG(fn, ours, shape)                                                                  \
	SAME_TYPE(__typeof__(&fn), SHAPE(shape, NV_TYPES));                                        \
	SAME_TYPE(ours, SHAPE(shape, KVS_TYPES))

#define SIG_DRIVER(E, H, D, P, B, I, V, S)    E (*)(void)
#define SIG_USE_COUNT(E, H, D, P, B, I, V, S) long (*)(void)
#define SIG_PROPS(E, H, D, P, B, I, V, S)     E (*)(P *)
#define SIG_VERSION(E, H, D, P, B, I, V, S)   E (*)(int *)
#define SIG_HREG(E, H, D, P, B, I, V, S)      E (*)(H *, D *)
#define SIG_HDEREG(E, H, D, P, B, I, V, S)    void (*)(H)
#define SIG_BREG(E, H, D, P, B, I, V, S)      E (*)(const void *, size_t, int)
#define SIG_BDEREG(E, H, D, P, B, I, V, S)    E (*)(const void *)
#define SIG_READ(E, H, D, P, B, I, V, S)      ssize_t (*)(H, void *, size_t, off_t, off_t)
#define SIG_WRITE(E, H, D, P, B, I, V, S)     ssize_t (*)(H, const void *, size_t, off_t, off_t)
#define SIG_SETUP(E, H, D, P, B, I, V, S)     E (*)(B *, unsigned)
#define SIG_SUBMIT(E, H, D, P, B, I, V, S)    E (*)(B, unsigned, I *, unsigned int)
#define SIG_STATUS(E, H, D, P, B, I, V, S)    E (*)(B, unsigned, unsigned *, V *, struct timespec *)
#define SIG_CANCEL(E, H, D, P, B, I, V, S)    E (*)(B)
#define SIG_DESTROY(E, H, D, P, B, I, V, S)   void (*)(B)
#define SIG_ASYNC(E, H, D, P, B, I, V, S)     E (*)(H, void *, size_t *, off_t *, off_t *, ssize_t *, S)
#define SIG_SREG(E, H, D, P, B, I, V, S)      E (*)(S, unsigned)
#define SIG_SDEREG(E, H, D, P, B, I, V, S)    E (*)(S)

SAME_SIG(cuFileDriverOpen, kvs_cufile_driver_open_fn, SIG_DRIVER);
SAME_SIG(cuFileDriverClose, kvs_cufile_driver_close_fn, SIG_DRIVER); /* the _v2, by macro */
SAME_SIG(cuFileUseCount, kvs_cufile_use_count_fn, SIG_USE_COUNT);
SAME_SIG(cuFileDriverGetProperties, kvs_cufile_driver_get_properties_fn, SIG_PROPS);
SAME_SIG(cuFileGetVersion, kvs_cufile_get_version_fn, SIG_VERSION);
SAME_SIG(cuFileHandleRegister, kvs_cufile_handle_register_fn, SIG_HREG);
SAME_SIG(cuFileHandleDeregister, kvs_cufile_handle_deregister_fn, SIG_HDEREG);
SAME_SIG(cuFileBufRegister, kvs_cufile_buf_register_fn, SIG_BREG);
SAME_SIG(cuFileBufDeregister, kvs_cufile_buf_deregister_fn, SIG_BDEREG);
SAME_SIG(cuFileRead, kvs_cufile_read_fn, SIG_READ);
SAME_SIG(cuFileWrite, kvs_cufile_write_fn, SIG_WRITE);
SAME_SIG(cuFileBatchIOSetUp, kvs_cufile_batch_setup_fn, SIG_SETUP);
SAME_SIG(cuFileBatchIOSubmit, kvs_cufile_batch_submit_fn, SIG_SUBMIT);
SAME_SIG(cuFileBatchIOGetStatus, kvs_cufile_batch_get_status_fn, SIG_STATUS);
SAME_SIG(cuFileBatchIOCancel, kvs_cufile_batch_cancel_fn, SIG_CANCEL);
SAME_SIG(cuFileBatchIODestroy, kvs_cufile_batch_destroy_fn, SIG_DESTROY);
SAME_SIG(cuFileReadAsync, kvs_cufile_read_async_fn, SIG_ASYNC);
SAME_SIG(cuFileWriteAsync, kvs_cufile_write_async_fn, SIG_ASYNC);
SAME_SIG(cuFileStreamRegister, kvs_cufile_stream_register_fn, SIG_SREG);
SAME_SIG(cuFileStreamDeregister, kvs_cufile_stream_deregister_fn, SIG_SDEREG);

/* The exported names, stringised before cufile.h's cuFileDriverClose macro can apply. */
#define API_NAME(name, type) #name,
static const char *const api_names[] = {KVS_CUFILE_API(API_NAME)};

/* Count the names of KVS_CUFILE_API that the library at path does not export (-1: no load). */
static int missing_names(const char *path)
{
	void *h = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
	int missing = 0;

	if (!h) {
		printf("FAIL - dlopen %s: %s\n", path, dlerror());
		return -1;
	}
	for (size_t i = 0; i < sizeof(api_names) / sizeof(api_names[0]); i++) {
		if (!dlsym(h, api_names[i])) {
			printf("FAIL - %s does not export %s\n", path, api_names[i]);
			missing++;
		}
	}
	dlclose(h);
	return missing;
}

int main(int argc, char **argv)
{
	int fails = 0;

	printf("ok   - cufile_types.h: sizes, offsets, values and signatures agree with "
	       "cufile.h (compile time)\n");
	for (int i = 1; i < argc; i++) {
		int missing = missing_names(argv[i]);

		if (missing == 0)
			printf("ok   - %s exports all %zu names\n", argv[i],
			       sizeof(api_names) / sizeof(api_names[0]));
		else
			fails++;
	}
	return fails ? 1 : 0;
}
