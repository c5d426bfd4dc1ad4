/*
 * progmem: see progmem.h; kvs_shim_copy_in and kvs_shim_iov_read (shim.h) too.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "progmem.h"
#include "raw.h"
#include "shim.h"
#include "sys.h"

/* Is the page at p (page-aligned) readable?  FUTEX_WAIT reads the word at p as the kernel
 * reads user memory (EFAULT where it cannot), and with a zero timeout never sleeps: EAGAIN
 * (another value) or ETIMEDOUT (the same) both say readable. */
static bool page_readable(uintptr_t p)
{
	struct timespec zero = {0, 0};

	return kvs_syscall(SYS_futex, (uint32_t *)p, FUTEX_WAIT | FUTEX_PRIVATE_FLAG, 0, &zero,
			   NULL, 0) == 0 ||
	       errno != EFAULT;
}

static _Atomic bool vm_readv_denied; /* process_vm_readv is not allowed here (seccomp) */

bool kvs_shim_copy_in(void *dst, const void *src, size_t n)
{
	struct iovec l = {dst, n}, r = {(void *)src, n};
	int saved = errno;
	bool ok = true;

	if (n == 0)
		return true;
	if (!atomic_load_explicit(&vm_readv_denied, memory_order_relaxed)) {
		ssize_t got = kvs_syscall(SYS_process_vm_readv, getpid(), &l, 1, &r, 1, 0);

		ok = got == (ssize_t)n;
		if (ok || got >= 0 || errno == EFAULT)
			goto out;
		atomic_store_explicit(&vm_readv_denied, true, memory_order_relaxed); /* EPERM */
	}
	/* Without it: every page probed as the kernel would read it, then a plain copy (a page the
	 * program unmaps in between is its own race, as with the kernel's copy). */
	for (uintptr_t pg = (uintptr_t)src & ~(uintptr_t)4095; ok && pg < (uintptr_t)src + n;
	     pg += 4096)
		ok = page_readable(pg);
	if (ok)
		memcpy(dst, src, n);
out:
	errno = saved;
	return ok;
}

const struct iovec *kvs_shim_iov_read(const struct iovec *iov, int iovcnt, struct iovec *local,
				      uint64_t *len)
{
	uint64_t n = 0;

	if (!iov || iovcnt <= 0 || iovcnt > IOV_MAX)
		return NULL;
	for (int at = 0; at < iovcnt; at += KVS_IOV_LOCAL) {
		int k = iovcnt - at < KVS_IOV_LOCAL ? iovcnt - at : KVS_IOV_LOCAL;

		if (!kvs_shim_copy_in(local, iov + at, (size_t)k * sizeof(*iov)))
			return NULL;
		for (int i = 0; i < k; i++) {
			if (local[i].iov_len > SSIZE_MAX - n)
				return NULL;
			n += local[i].iov_len;
		}
	}
	*len = n;
	return iovcnt <= KVS_IOV_LOCAL ? local : iov;
}

/* Is the page at p (page-aligned) writable?  FUTEX_WAKE_OP adds 0 to the word at p atomically,
 * which the kernel does only on memory the process may write (faulting it in as the copy would),
 * answering EFAULT otherwise; the value is unchanged even if another thread writes it. */
static bool page_writable(uintptr_t p)
{
	return kvs_syscall(SYS_futex, (uint32_t *)p, FUTEX_WAKE_OP | FUTEX_PRIVATE_FLAG, 0, NULL,
			   (uint32_t *)p, FUTEX_OP(FUTEX_OP_ADD, 0, FUTEX_OP_CMP_EQ, 0)) >= 0;
}

/*
 * Can the request's buffers take the bytes?  The kernel answers EFAULT (or a short count) for a
 * buffer it cannot write, where memcpy would crash the engine; such a read goes to the real call.
 * Two cheap looks per buffer, under 1% of a 1 MiB memcpy (kvshim-bench-read probe):
 *   - its first and last page are writable (page_writable): not read-only, not PROT_NONE, not
 *     unmapped, not device memory the kernel cannot fault in;
 *   - msync(MS_ASYNC) over the whole range: ENOMEM when any part is unmapped (a buffer freed or
 *     half unmapped).  It walks mappings, not pages, and writes nothing back (MS_ASYNC is a no-op
 *     on Linux).
 * A page in the middle whose protection alone differs from both ends is not seen.
 */
bool kvs_progmem_writable(const struct iovec *iov, int iovcnt)
{
	for (int i = 0; i < iovcnt; i++) {
		uintptr_t a = (uintptr_t)iov[i].iov_base & ~(uintptr_t)4095;
		uintptr_t e =
		    ((uintptr_t)iov[i].iov_base + iov[i].iov_len + 4095) & ~(uintptr_t)4095;

		if (iov[i].iov_len == 0)
			continue;
		if (!page_writable(a) || !page_writable(e - 4096) ||
		    msync((void *)a, e - a, MS_ASYNC))
			return false;
	}
	return true;
}

bool kvs_progmem_store(void *dst, const void *src, size_t n)
{
	struct iovec v = {dst, n};
	int saved = errno;
	bool ok = kvs_progmem_writable(&v, 1);

	if (ok)
		memcpy(dst, src, n);
	errno = saved;
	return ok;
}
