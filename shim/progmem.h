/*
 * progmem: the program's memory as the kernel would treat it.  The shim reads the program's
 * arrays (iovecs, iocbs) and writes its buffers; where the kernel answers EFAULT or a short
 * count, the shim must not crash the engine, so it looks first, or copies with the kernel.
 * kvs_shim_copy_in and kvs_shim_iov_read (shim.h) are the reading half; this is the writing
 * half.
 */
#ifndef KVS_SHIM_PROGMEM_H
#define KVS_SHIM_PROGMEM_H

#include <stdbool.h>
#include <sys/uio.h>

/* Can the request's buffers take the bytes?  Two cheap looks per buffer (its first and last
 * page writable, and msync(MS_ASYNC) over the range: no part unmapped); a page in the middle
 * whose protection alone differs from both ends is not seen.  False: make the real call. */
bool kvs_progmem_writable(const struct iovec *iov, int iovcnt);

/* Store n bytes at dst, program memory the kernel reads (an iocb): false, with nothing
 * stored, where a page of it is not writable (kvs_progmem_writable). */
bool kvs_progmem_store(void *dst, const void *src, size_t n);

#endif
