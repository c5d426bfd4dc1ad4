/*
 * cufile_types: the cuFile (GPUDirect Storage) ABI the shim hooks and the test fakes
 * implement, declared once under project names so that this header needs neither NVIDIA's
 * cufile.h nor cuda.h, and so that both can be included in the same translation unit
 * (tests/check_cufile_abi.c does, and pins every size, offset and value below against them).
 *
 * The names are NVIDIA's with a prefix: types CUfileX_t become kvs_cufile_x_t, constants
 * X become KVS_X (CU_FILE_SUCCESS -> KVS_CU_FILE_SUCCESS, CUFILE_READ -> KVS_CUFILE_READ).
 * Reference: libcufile 1.20.0.107 (the nvidia-cufile wheel, nvidia/cu13/include/cufile.h).
 *
 * What callers bind to.  `nm -D --with-symbol-versions` on the real nvidia/cu13/lib/
 * libcufile.so.0 (SONAME libcufile.so.0) shows no version definitions at all: every cuFile
 * function is exported unversioned, as plain `cuFileRead`, `cuFileDriverOpen`, and so on.
 * The one renamed entry point is the driver close: cufile.h says
 *	#define cuFileDriverClose cuFileDriverClose_v2
 * so a program compiled against the current header binds to `cuFileDriverClose_v2`, while
 * one built against an older header (and a dlsym of the literal string) binds to
 * `cuFileDriverClose`.  The library exports both, unversioned, and so must the shim and the
 * fake.  Names of the real library relevant here (all type T, no @version):
 *	cuFileDriverOpen cuFileDriverClose cuFileDriverClose_v2 cuFileUseCount
 *	cuFileDriverGetProperties cuFileGetVersion
 *	cuFileHandleRegister cuFileHandleDeregister cuFileBufRegister cuFileBufDeregister
 *	cuFileRead cuFileWrite cuFileReadv cuFileWritev
 *	cuFileBatchIOSetUp cuFileBatchIOSubmit cuFileBatchIOGetStatus cuFileBatchIOCancel
 *	cuFileBatchIODestroy
 *	cuFileReadAsync cuFileWriteAsync cuFileStreamRegister cuFileStreamDeregister
 *
 * Return conventions (cufile.h): calls returning kvs_cufile_error_t report err ==
 * KVS_CU_FILE_SUCCESS on success, and cu_err (a CUresult) when err is
 * KVS_CU_FILE_CUDA_DRIVER_ERROR.  cuFileRead/cuFileWrite return the bytes moved, -1 with errno
 * set for a system error, or -KVS_CU_FILE_x for a cuFile error; the async calls store the same
 * in *bytes_read_p when the stream reaches them.  A batch event's ret is a size_t carrying
 * the bytes moved or a negative error.
 */
#ifndef KVS_SHIM_CUFILE_TYPES_H
#define KVS_SHIM_CUFILE_TYPES_H

#include <stddef.h>
#include <sys/types.h>
#include <time.h>

struct sockaddr;
/* cuda.h's CUstream is `struct CUstream_st *`: the same incomplete tag, so the same type. */
struct CUstream_st;
typedef struct CUstream_st *kvs_cu_stream_t;
/* CUresult is an enum of non-negative values, four bytes wide. */
typedef int kvs_cu_result_t;

#define KVS_CUFILEOP_BASE_ERR 5000

/* CUfileOpError: every value of the reference header. */
typedef enum kvs_cufile_op_error {
	KVS_CU_FILE_SUCCESS = 0,
	KVS_CU_FILE_DRIVER_NOT_INITIALIZED = KVS_CUFILEOP_BASE_ERR + 1,
	KVS_CU_FILE_DRIVER_INVALID_PROPS = KVS_CUFILEOP_BASE_ERR + 2,
	KVS_CU_FILE_DRIVER_UNSUPPORTED_LIMIT = KVS_CUFILEOP_BASE_ERR + 3,
	KVS_CU_FILE_DRIVER_VERSION_MISMATCH = KVS_CUFILEOP_BASE_ERR + 4,
	KVS_CU_FILE_DRIVER_VERSION_READ_ERROR = KVS_CUFILEOP_BASE_ERR + 5,
	KVS_CU_FILE_DRIVER_CLOSING = KVS_CUFILEOP_BASE_ERR + 6,
	KVS_CU_FILE_PLATFORM_NOT_SUPPORTED = KVS_CUFILEOP_BASE_ERR + 7,
	KVS_CU_FILE_IO_NOT_SUPPORTED = KVS_CUFILEOP_BASE_ERR + 8,
	KVS_CU_FILE_DEVICE_NOT_SUPPORTED = KVS_CUFILEOP_BASE_ERR + 9,
	KVS_CU_FILE_NVFS_DRIVER_ERROR = KVS_CUFILEOP_BASE_ERR + 10,
	KVS_CU_FILE_CUDA_DRIVER_ERROR = KVS_CUFILEOP_BASE_ERR + 11,
	KVS_CU_FILE_CUDA_POINTER_INVALID = KVS_CUFILEOP_BASE_ERR + 12,
	KVS_CU_FILE_CUDA_MEMORY_TYPE_INVALID = KVS_CUFILEOP_BASE_ERR + 13,
	KVS_CU_FILE_CUDA_POINTER_RANGE_ERROR = KVS_CUFILEOP_BASE_ERR + 14,
	KVS_CU_FILE_CUDA_CONTEXT_MISMATCH = KVS_CUFILEOP_BASE_ERR + 15,
	KVS_CU_FILE_INVALID_MAPPING_SIZE = KVS_CUFILEOP_BASE_ERR + 16,
	KVS_CU_FILE_INVALID_MAPPING_RANGE = KVS_CUFILEOP_BASE_ERR + 17,
	KVS_CU_FILE_INVALID_FILE_TYPE = KVS_CUFILEOP_BASE_ERR + 18,
	KVS_CU_FILE_INVALID_FILE_OPEN_FLAG = KVS_CUFILEOP_BASE_ERR + 19,
	KVS_CU_FILE_DIO_NOT_SET = KVS_CUFILEOP_BASE_ERR + 20,
	KVS_CU_FILE_INVALID_VALUE = KVS_CUFILEOP_BASE_ERR + 22,
	KVS_CU_FILE_MEMORY_ALREADY_REGISTERED = KVS_CUFILEOP_BASE_ERR + 23,
	KVS_CU_FILE_MEMORY_NOT_REGISTERED = KVS_CUFILEOP_BASE_ERR + 24,
	KVS_CU_FILE_PERMISSION_DENIED = KVS_CUFILEOP_BASE_ERR + 25,
	KVS_CU_FILE_DRIVER_ALREADY_OPEN = KVS_CUFILEOP_BASE_ERR + 26,
	KVS_CU_FILE_HANDLE_NOT_REGISTERED = KVS_CUFILEOP_BASE_ERR + 27,
	KVS_CU_FILE_HANDLE_ALREADY_REGISTERED = KVS_CUFILEOP_BASE_ERR + 28,
	KVS_CU_FILE_DEVICE_NOT_FOUND = KVS_CUFILEOP_BASE_ERR + 29,
	KVS_CU_FILE_INTERNAL_ERROR = KVS_CUFILEOP_BASE_ERR + 30,
	KVS_CU_FILE_GETNEWFD_FAILED = KVS_CUFILEOP_BASE_ERR + 31,
	KVS_CU_FILE_NVFS_SETUP_ERROR = KVS_CUFILEOP_BASE_ERR + 33,
	KVS_CU_FILE_IO_DISABLED = KVS_CUFILEOP_BASE_ERR + 34,
	KVS_CU_FILE_BATCH_SUBMIT_FAILED = KVS_CUFILEOP_BASE_ERR + 35,
	KVS_CU_FILE_GPU_MEMORY_PINNING_FAILED = KVS_CUFILEOP_BASE_ERR + 36,
	KVS_CU_FILE_BATCH_FULL = KVS_CUFILEOP_BASE_ERR + 37,
	KVS_CU_FILE_ASYNC_NOT_SUPPORTED = KVS_CUFILEOP_BASE_ERR + 38,
	KVS_CU_FILE_INTERNAL_BATCH_SETUP_ERROR = KVS_CUFILEOP_BASE_ERR + 39,
	KVS_CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR = KVS_CUFILEOP_BASE_ERR + 40,
	KVS_CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR = KVS_CUFILEOP_BASE_ERR + 41,
	KVS_CU_FILE_INTERNAL_BATCH_CANCEL_ERROR = KVS_CUFILEOP_BASE_ERR + 42,
	KVS_CU_FILE_NOMEM_ERROR = KVS_CUFILEOP_BASE_ERR + 43,
	KVS_CU_FILE_IO_ERROR = KVS_CUFILEOP_BASE_ERR + 44,
	KVS_CU_FILE_INTERNAL_BUF_REGISTER_ERROR = KVS_CUFILEOP_BASE_ERR + 45,
	KVS_CU_FILE_HASH_OPR_ERROR = KVS_CUFILEOP_BASE_ERR + 46,
	KVS_CU_FILE_INVALID_CONTEXT_ERROR = KVS_CUFILEOP_BASE_ERR + 47,
	KVS_CU_FILE_NVFS_INTERNAL_DRIVER_ERROR = KVS_CUFILEOP_BASE_ERR + 48,
	KVS_CU_FILE_BATCH_NOCOMPAT_ERROR = KVS_CUFILEOP_BASE_ERR + 49,
	KVS_CU_FILE_IO_MAX_ERROR = KVS_CUFILEOP_BASE_ERR + 50,
} kvs_cufile_op_error_t;

/* CUfileError_t, returned by value (in registers: two four-byte fields). */
typedef struct kvs_cufile_error {
	kvs_cufile_op_error_t err; /* KVS_CU_FILE_SUCCESS or the failure */
	kvs_cu_result_t cu_err;	   /* the CUresult when err is KVS_CU_FILE_CUDA_DRIVER_ERROR */
} kvs_cufile_error_t;

/* CUfileDrvProps_t, filled by cuFileDriverGetProperties. */
typedef struct kvs_cufile_drv_props {
	struct {
		unsigned int major_version;
		unsigned int minor_version;
		size_t poll_thresh_size;
		size_t max_direct_io_size;
		unsigned int dstatusflags;
		unsigned int dcontrolflags;
	} nvfs;
	unsigned int fflags;
	unsigned int max_device_cache_size;
	unsigned int per_buffer_cache_size;
	unsigned int max_device_pinned_mem_size;
	unsigned int max_batch_io_size;
	unsigned int max_batch_io_timeout_msecs;
} kvs_cufile_drv_props_t;

/* cufileRDMAInfo_t, passed to a user-space file system's read and write. */
typedef struct kvs_cufile_rdma_info {
	int version;
	int desc_len;
	const char *desc_str;
} kvs_cufile_rdma_info_t;

/* CUfileFSOps_t: a user-space file system's operations (loff_t is off_t on LP64 Linux). */
typedef struct kvs_cufile_fs_ops {
	const char *(*fs_type)(const void *handle);
	int (*getRDMADeviceList)(const void *handle, struct sockaddr **hostaddrs);
	int (*getRDMADevicePriority)(const void *handle, char *, size_t, off_t,
				     const struct sockaddr *hostaddr);
	ssize_t (*read)(const void *handle, char *, size_t, off_t, const kvs_cufile_rdma_info_t *);
	ssize_t (*write)(const void *handle, const char *, size_t, off_t,
			 const kvs_cufile_rdma_info_t *);
} kvs_cufile_fs_ops_t;

/* enum CUfileFileHandleType. */
enum kvs_cufile_file_handle_type {
	KVS_CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1,
	KVS_CU_FILE_HANDLE_TYPE_OPAQUE_WIN32 = 2,
	KVS_CU_FILE_HANDLE_TYPE_USERSPACE_FS = 3,
};

/* CUfileDescr_t: what cuFileHandleRegister is given. */
typedef struct kvs_cufile_descr {
	enum kvs_cufile_file_handle_type type;
	union {
		int fd;	      /* KVS_CU_FILE_HANDLE_TYPE_OPAQUE_FD */
		void *handle; /* OPAQUE_WIN32, USERSPACE_FS */
	} handle;
	const kvs_cufile_fs_ops_t *fs_ops; /* USERSPACE_FS only */
} kvs_cufile_descr_t;

/* CUfileHandle_t: opaque, owned by the library that returned it. */
typedef void *kvs_cufile_handle_t;

/* CUfileOpcode_t. */
typedef enum kvs_cufile_opcode {
	KVS_CUFILE_READ = 0,
	KVS_CUFILE_WRITE = 1,
} kvs_cufile_opcode_t;

/* CUfileStatus_t: a batch entry's state, one bit each. */
typedef enum kvs_cufile_status {
	KVS_CUFILE_WAITING = 0x01, /* before submission */
	KVS_CUFILE_PENDING = 0x02, /* enqueued */
	KVS_CUFILE_INVALID = 0x04, /* ill-formed, or could not be enqueued */
	KVS_CUFILE_CANCELED = 0x08,
	KVS_CUFILE_COMPLETE = 0x10,
	KVS_CUFILE_TIMEOUT = 0x20,
	KVS_CUFILE_FAILED = 0x40,
} kvs_cufile_status_t;

/* CUfileBatchMode_t. */
typedef enum kvs_cufile_batch_mode {
	KVS_CUFILE_BATCH = 1,
} kvs_cufile_batch_mode_t;

/* CUfileIOParams_t: one batch entry as submitted. */
typedef struct kvs_cufile_io_params {
	kvs_cufile_batch_mode_t mode; /* must be the first field */
	union {
		struct {
			void *devPtr_base; /* device or host memory */
			off_t file_offset;
			off_t devPtr_offset;
			size_t size;
		} batch;
	} u;
	kvs_cufile_handle_t fh;
	kvs_cufile_opcode_t opcode;
	void *cookie;
} kvs_cufile_io_params_t;

/* CUfileIOEvents_t: one completed (or cancelled, failed) batch entry. */
typedef struct kvs_cufile_io_events {
	void *cookie;
	kvs_cufile_status_t status;
	size_t ret; /* bytes moved, or a negative error */
} kvs_cufile_io_events_t;

/* CUfileBatchHandle_t: opaque. */
typedef void *kvs_cufile_batch_handle_t;

/* cuFileStreamRegister flags; 15 (all four) means sizes and offsets are known at submission. */
#define KVS_CU_FILE_STREAM_FIXED_BUF_OFFSET    1
#define KVS_CU_FILE_STREAM_FIXED_FILE_OFFSET   2
#define KVS_CU_FILE_STREAM_FIXED_FILE_SIZE     4
#define KVS_CU_FILE_STREAM_PAGE_ALIGNED_INPUTS 8

/* The functions, as pointer types (what dlsym returns is cast to these). */
typedef kvs_cufile_error_t (*kvs_cufile_driver_open_fn)(void);
typedef kvs_cufile_error_t (*kvs_cufile_driver_close_fn)(void); /* also cuFileDriverClose_v2 */
typedef long (*kvs_cufile_use_count_fn)(void);
typedef kvs_cufile_error_t (*kvs_cufile_driver_get_properties_fn)(kvs_cufile_drv_props_t *props);
typedef kvs_cufile_error_t (*kvs_cufile_get_version_fn)(int *version);
typedef kvs_cufile_error_t (*kvs_cufile_handle_register_fn)(kvs_cufile_handle_t *fh,
							    kvs_cufile_descr_t *descr);
typedef void (*kvs_cufile_handle_deregister_fn)(kvs_cufile_handle_t fh);
typedef kvs_cufile_error_t (*kvs_cufile_buf_register_fn)(const void *bufPtr_base, size_t length,
							 int flags);
typedef kvs_cufile_error_t (*kvs_cufile_buf_deregister_fn)(const void *bufPtr_base);
typedef ssize_t (*kvs_cufile_read_fn)(kvs_cufile_handle_t fh, void *bufPtr_base, size_t size,
				      off_t file_offset, off_t bufPtr_offset);
typedef ssize_t (*kvs_cufile_write_fn)(kvs_cufile_handle_t fh, const void *bufPtr_base, size_t size,
				       off_t file_offset, off_t bufPtr_offset);
typedef kvs_cufile_error_t (*kvs_cufile_batch_setup_fn)(kvs_cufile_batch_handle_t *batch_idp,
							unsigned nr);
typedef kvs_cufile_error_t (*kvs_cufile_batch_submit_fn)(kvs_cufile_batch_handle_t batch_idp,
							 unsigned nr, kvs_cufile_io_params_t *iocbp,
							 unsigned int flags);
typedef kvs_cufile_error_t (*kvs_cufile_batch_get_status_fn)(kvs_cufile_batch_handle_t batch_idp,
							     unsigned min_nr, unsigned *nr,
							     kvs_cufile_io_events_t *iocbp,
							     struct timespec *timeout);
typedef kvs_cufile_error_t (*kvs_cufile_batch_cancel_fn)(kvs_cufile_batch_handle_t batch_idp);
typedef void (*kvs_cufile_batch_destroy_fn)(kvs_cufile_batch_handle_t batch_idp);
typedef kvs_cufile_error_t (*kvs_cufile_read_async_fn)(kvs_cufile_handle_t fh, void *bufPtr_base,
						       size_t *size_p, off_t *file_offset_p,
						       off_t *bufPtr_offset_p,
						       ssize_t *bytes_read_p,
						       kvs_cu_stream_t stream);
typedef kvs_cufile_error_t (*kvs_cufile_write_async_fn)(kvs_cufile_handle_t fh, void *bufPtr_base,
							size_t *size_p, off_t *file_offset_p,
							off_t *bufPtr_offset_p,
							ssize_t *bytes_written_p,
							kvs_cu_stream_t stream);
typedef kvs_cufile_error_t (*kvs_cufile_stream_register_fn)(kvs_cu_stream_t stream, unsigned flags);
typedef kvs_cufile_error_t (*kvs_cufile_stream_deregister_fn)(kvs_cu_stream_t stream);

/*
 * Every exported name with its pointer type, for tables of dlsym results and of hooks:
 * X(name, type).  Both driver-close names are listed: callers bind to either.
 */
#define KVS_CUFILE_API(X)                                                                          \
	X(cuFileDriverOpen, kvs_cufile_driver_open_fn)                                             \
	X(cuFileDriverClose, kvs_cufile_driver_close_fn)                                           \
	X(cuFileDriverClose_v2, kvs_cufile_driver_close_fn)                                        \
	X(cuFileUseCount, kvs_cufile_use_count_fn)                                                 \
	X(cuFileDriverGetProperties, kvs_cufile_driver_get_properties_fn)                          \
	X(cuFileGetVersion, kvs_cufile_get_version_fn)                                             \
	X(cuFileHandleRegister, kvs_cufile_handle_register_fn)                                     \
	X(cuFileHandleDeregister, kvs_cufile_handle_deregister_fn)                                 \
	X(cuFileBufRegister, kvs_cufile_buf_register_fn)                                           \
	X(cuFileBufDeregister, kvs_cufile_buf_deregister_fn)                                       \
	X(cuFileRead, kvs_cufile_read_fn)                                                          \
	X(cuFileWrite, kvs_cufile_write_fn)                                                        \
	X(cuFileBatchIOSetUp, kvs_cufile_batch_setup_fn)                                           \
	X(cuFileBatchIOSubmit, kvs_cufile_batch_submit_fn)                                         \
	X(cuFileBatchIOGetStatus, kvs_cufile_batch_get_status_fn)                                  \
	X(cuFileBatchIOCancel, kvs_cufile_batch_cancel_fn)                                         \
	X(cuFileBatchIODestroy, kvs_cufile_batch_destroy_fn)                                       \
	X(cuFileReadAsync, kvs_cufile_read_async_fn)                                               \
	X(cuFileWriteAsync, kvs_cufile_write_async_fn)                                             \
	X(cuFileStreamRegister, kvs_cufile_stream_register_fn)                                     \
	X(cuFileStreamDeregister, kvs_cufile_stream_deregister_fn)

#endif
