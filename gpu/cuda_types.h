/*
 * The few CUDA driver API types and constants that gpu/ uses, declared here so that the build
 * never needs the CUDA toolkit.  Names carry a kvs_cu_ / KVS_CU_ prefix so that a file may
 * include cuda.h as well: tests/check_gpu.c does, and checks every value below against it.
 * Function pointer types are for the ABI each entry point has under the name gpu/ asks for
 * (the `_v2` versions where cuda.h maps a name to one).
 */
#ifndef KVS_GPU_CUDA_TYPES_H
#define KVS_GPU_CUDA_TYPES_H

#include <stddef.h>

typedef int kvs_cu_result;
typedef unsigned long long kvs_cu_deviceptr;
typedef int kvs_cu_device;
typedef struct kvs_cu_ctx_st *kvs_cu_context;
typedef struct kvs_cu_stream_st *kvs_cu_stream;
typedef void (*kvs_cu_hostfn)(void *);

enum {
	KVS_CU_SUCCESS = 0,
	KVS_CU_ERROR_INVALID_VALUE = 1,
	KVS_CU_ERROR_OUT_OF_MEMORY = 2,
	KVS_CU_ERROR_NOT_INITIALIZED = 3,
	KVS_CU_ERROR_DEINITIALIZED = 4,
	KVS_CU_ERROR_NO_DEVICE = 100,
	KVS_CU_ERROR_INVALID_DEVICE = 101,
	KVS_CU_ERROR_INVALID_CONTEXT = 201,
	KVS_CU_ERROR_INVALID_HANDLE = 400,
	KVS_CU_ERROR_NOT_FOUND = 500,
	KVS_CU_ERROR_NOT_READY = 600,
	KVS_CU_ERROR_CONTEXT_IS_DESTROYED = 709,
	KVS_CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
	KVS_CU_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
	KVS_CU_ERROR_NOT_PERMITTED = 800,
	KVS_CU_ERROR_NOT_SUPPORTED = 801,
	KVS_CU_ERROR_UNKNOWN = 999,
};

/* CUmemorytype */
enum {
	KVS_CU_MEMORYTYPE_HOST = 1,
	KVS_CU_MEMORYTYPE_DEVICE = 2,
	KVS_CU_MEMORYTYPE_ARRAY = 3,
	KVS_CU_MEMORYTYPE_UNIFIED = 4,
};

/* CUpointer_attribute */
typedef enum kvs_cu_pointer_attribute {
	KVS_CU_POINTER_ATTRIBUTE_CONTEXT = 1,
	KVS_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
	KVS_CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
	KVS_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
	KVS_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
	KVS_CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
} kvs_cu_pointer_attribute;

#define KVS_CU_MEMHOSTREGISTER_PORTABLE		       0x01
#define KVS_CU_MEMHOSTREGISTER_DEVICEMAP	       0x02
#define KVS_CU_STREAM_NON_BLOCKING		       0x1
#define KVS_CU_STREAM_WAIT_VALUE_GEQ		       0x0
#define KVS_CU_STREAM_CAPTURE_STATUS_NONE	       0
#define KVS_CU_GET_PROC_ADDRESS_DEFAULT		       0
#define KVS_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM	       0x1
#define KVS_CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL 0x2

/* CUmemLocation and CUmemcpyAttributes (cuMemcpyBatchAsync, CUDA 12.8+). */
struct kvs_cu_mem_location {
	int type;
	int id;
};
struct kvs_cu_memcpy_attributes {
	int src_access_order;
	struct kvs_cu_mem_location src_loc_hint;
	struct kvs_cu_mem_location dst_loc_hint;
	unsigned int flags;
};

#endif
