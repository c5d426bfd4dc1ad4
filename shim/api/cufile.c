/*
 * cufile: the engine of the cuFile calls (see cufile.h), below their doors (hooks/cufile.c);
 * the batch calls are in api/cufile_batch.c.
 *
 * DESIGN.  Shared state:
 *   real[]    the real library's functions, found on first use, in this order: the library
 *             handle a caller looked cuFile names up in (lib), the next object after the shim
 *             (a NEEDED libcufile), a libcufile loaded anywhere (a plugin linked to it and
 *             loaded RTLD_LOCAL, which no lookup through the global scope finds: NIXL's GDS
 *             plugin), and last cuda.cufile_library, opened by the shim.  A pointer into the
 *             shim itself is refused at every step (calling it would be a loop).  Stored
 *             with a CAS from NULL, so the first finder wins and every reader sees a whole
 *             pointer; loaded relaxed (a function pointer carries no data we depend on).  A
 *             dlsym through another libcufile's handle replaces the entry it looks up.
 *   lib       the libcufile handle a caller looked cuFile names up in (the one that caller
 *             uses), else the one the shim opened (lib_ours: it holds a reference).
 *   Unloading: the shim's dlclose (hooks/cufile.c) runs the real one and then drops
 *             (kvs_cufile_unloaded) every entry of real[] that no loaded object contains any
 *             more, and lib with them unless it is ours: a library unloaded and loaded again
 *             at another address is found again.
 *   handles[] fh -> fd for OPAQUE_FD handles registered through the shim.  Under handles_mu:
 *             a lookup per cuFile read costs one uncontended lock against milliseconds of I/O.
 *             A handle the table has no room for is simply not served.
 * The engine takes no lock while calling the real library.
 */
#include <dlfcn.h>
#include <link.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "config.h"
#include "cufile.h"
#include "dlsym.h"
#include "elfsym.h"
#include "fdinfo.h"
#include "log.h"
#include "shim.h"

#define MAX_HANDLES 4096

static const char *const names[KVS_CF_N] = {
#define KVS_CF_NAME(name, type) [KVS_CF_##name] = #name,
    KVS_CUFILE_API(KVS_CF_NAME)
#undef KVS_CF_NAME
};

static void *_Atomic real[KVS_CF_N];
static void *_Atomic lib;
static _Atomic bool lib_ours;

static pthread_mutex_t handles_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
	kvs_cufile_handle_t fh;
	int fd;
} handles[MAX_HANDLES];
static unsigned nhandles;

/* ------------------------------------------------------------------ the real library */

/* Is handle (a dlopen handle) libcufile? */
static bool is_cufile(void *handle)
{
	struct link_map *lm = NULL;
	const char *base;

	if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) || !lm || !lm->l_name)
		return false;
	base = strrchr(lm->l_name, '/');
	base = base ? base + 1 : lm->l_name;
	return strncmp(base, "libcufile.so", 12) == 0;
}

static void remember(enum kvs_cufile_fn fn, void *p)
{
	void *none = NULL;

	atomic_compare_exchange_strong(&real[fn], &none, p);
}

/* p, unless it is NULL or in the shim. */
static void *not_shim(void *p)
{
	return p && !kvs_dlsym_in_shim(p) ? p : NULL;
}

struct find {
	const char *name;
	void *found;	  /* found_symbol: the function */
	const void *addr; /* contains: the address looked for */
	bool inside;	  /* contains: some loaded object maps it */
};

static bool is_cufile_name(const char *path)
{
	const char *base = path ? strrchr(path, '/') : NULL;

	base = base ? base + 1 : path;
	return base && strncmp(base, "libcufile.so", 12) == 0;
}

/* dl_iterate_phdr holds the loader's list lock (not the lock dlopen holds across
 * constructors) while each object is looked at, so none is unloaded under the lookup. */
static int found_symbol(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct find *f = arg;

	(void)size;
	if (!is_cufile_name(info->dlpi_name))
		return 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		if (info->dlpi_phdr[i].p_type != PT_DYNAMIC)
			continue;
		f->found = not_shim(kvs_elf_object_symbol(
		    info->dlpi_addr, (const void *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr),
		    f->name, NULL));
		return f->found != NULL;
	}
	return 0;
}

static int contains(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct find *f = arg;
	uintptr_t a = (uintptr_t)f->addr;

	(void)size;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t lo = info->dlpi_addr + ph->p_vaddr;

		if (ph->p_type == PT_LOAD && a >= lo && a - lo < ph->p_memsz) {
			f->inside = true;
			return 1;
		}
	}
	return 0;
}

/* name in a libcufile loaded anywhere in the process (RTLD_LOCAL too), or NULL. */
static void *loaded_symbol(const char *name)
{
	struct find f = {.name = name};

	dl_iterate_phdr(found_symbol, &f);
	return f.found;
}

/* fn in cuda.cufile_library, opened by the shim (lib, unless another thread's lib came first),
 * or NULL, said once. */
static void *own_library_symbol(enum kvs_cufile_fn fn)
{
	const char *path = kvs_shim_cufile_library();
	void *h, *none = NULL, *p = NULL;

	h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
	if (!h)
		h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h && !atomic_compare_exchange_strong(&lib, &none, h)) {
		kvs_dlclose_real(h);
		h = none;
	} else if (h) {
		atomic_store(&lib_ours, true);
	}
	if (h)
		p = not_shim(kvs_dlsym_real(h, names[fn]));
	if (!p)
		kvs_log_once(KVS_CAUSE_CUFILE, KVS_LOG_WARN,
			     "no real libcufile has %s (cuda.cufile_library = %s)", names[fn],
			     path);
	return p;
}

void *kvs_cufile_real(enum kvs_cufile_fn fn)
{
	void *p = atomic_load_explicit(&real[fn], memory_order_relaxed);
	void *h;

	if (p)
		return p;
	h = atomic_load(&lib);
	if (h)
		p = not_shim(kvs_dlsym_real(h, names[fn]));
	if (!p) /* a NEEDED libcufile is the next object after the shim */
		p = not_shim(kvs_dlsym_real(RTLD_NEXT, names[fn]));
	if (!p)
		p = loaded_symbol(names[fn]);
	if (!p && !h)
		p = own_library_symbol(fn);
	if (p)
		remember(fn, p);
	return p;
}

bool kvs_cufile_real_any(void)
{
	bool remembered = false;

	for (int i = 0; i < KVS_CF_N && !remembered; i++)
		remembered = atomic_load_explicit(&real[i], memory_order_relaxed) != NULL;
	return remembered;
}

/* After a dlclose: forget what no loaded object maps any more. */
void kvs_cufile_unloaded(void)
{
	bool gone = false;

	for (int i = 0; i < KVS_CF_N; i++) {
		void *p = atomic_load_explicit(&real[i], memory_order_relaxed);
		struct find f = {.addr = p};

		if (!p)
			continue;
		dl_iterate_phdr(contains, &f);
		if (!f.inside && atomic_compare_exchange_strong(&real[i], &p, NULL))
			gone = true;
	}
	if (gone && !atomic_load(&lib_ours))
		atomic_store(&lib, NULL); /* a handle of the library that went */
}

/* ------------------------------------------------------------------ handles */

static void handle_add(kvs_cufile_handle_t fh, int fd)
{
	pthread_mutex_lock(&handles_mu);
	for (unsigned i = 0; i < nhandles; i++) {
		if (handles[i].fh == fh) {
			kvs_fdinfo_cufile_ref(handles[i].fd, false);
			kvs_fdinfo_cufile_ref(fd, true);
			handles[i].fd = fd; /* the library reused a handle value */
			goto out;
		}
	}
	if (nhandles < MAX_HANDLES) {
		handles[nhandles++] = (__typeof__(handles[0])){fh, fd};
		kvs_fdinfo_cufile_ref(fd, true);
	}
out:
	pthread_mutex_unlock(&handles_mu);
}

static void handle_remove(kvs_cufile_handle_t fh)
{
	pthread_mutex_lock(&handles_mu);
	for (unsigned i = 0; i < nhandles; i++) {
		if (handles[i].fh == fh) {
			kvs_fdinfo_cufile_ref(handles[i].fd, false);
			handles[i] = handles[--nhandles];
			break;
		}
	}
	pthread_mutex_unlock(&handles_mu);
}

int kvs_cufile_fd(kvs_cufile_handle_t fh)
{
	int fd = -1;

	if (!fh)
		return -1;
	pthread_mutex_lock(&handles_mu);
	for (unsigned i = 0; i < nhandles; i++) {
		if (handles[i].fh == fh) {
			fd = handles[i].fd;
			break;
		}
	}
	pthread_mutex_unlock(&handles_mu);
	return fd;
}

/* ------------------------------------------------------------------ the calls */

static const kvs_cufile_error_t no_library = {KVS_CU_FILE_DRIVER_NOT_INITIALIZED, 0};
static const kvs_cufile_error_t ok_error = {KVS_CU_FILE_SUCCESS, 0};

kvs_cufile_error_t kvs_cufile_handle_register(kvs_cufile_handle_t *fh, kvs_cufile_descr_t *descr)
{
	kvs_cufile_handle_register_fn fn =
	    (kvs_cufile_handle_register_fn)kvs_cufile_real(KVS_CF_cuFileHandleRegister);
	kvs_cufile_error_t e;

	if (!fn)
		return no_library;
	e = fn(fh, descr);
	/* Only descriptors are served; a user-space file system's reads are its own. */
	if (e.err == KVS_CU_FILE_SUCCESS && fh && descr &&
	    descr->type == KVS_CU_FILE_HANDLE_TYPE_OPAQUE_FD && kvs_shim_wants(SIZE_MAX))
		handle_add(*fh, descr->handle.fd);
	return e;
}

void kvs_cufile_handle_deregister(kvs_cufile_handle_t fh)
{
	kvs_cufile_handle_deregister_fn fn =
	    (kvs_cufile_handle_deregister_fn)kvs_cufile_real(KVS_CF_cuFileHandleDeregister);

	handle_remove(fh);
	if (fn)
		fn(fh);
}

ssize_t kvs_cufile_read(kvs_cufile_handle_t fh, void *buf, size_t size, off_t file_offset,
			off_t buf_offset)
{
	kvs_cufile_read_fn fn = (kvs_cufile_read_fn)kvs_cufile_real(KVS_CF_cuFileRead);
	int fd = kvs_cufile_fd(fh);

	if (fd >= 0 && buf && buf_offset >= 0 && kvs_shim_wants(size)) {
		ssize_t n = kvs_shim_read_to(fd, (uint64_t)(uintptr_t)buf + (uint64_t)buf_offset,
					     size, file_offset);
		if (n >= 0)
			return n;
	}
	if (!fn)
		return -KVS_CU_FILE_DRIVER_NOT_INITIALIZED;
	return fn(fh, buf, size, file_offset, buf_offset);
}

ssize_t kvs_cufile_write(kvs_cufile_handle_t fh, const void *buf, size_t size, off_t file_offset,
			 off_t buf_offset)
{
	kvs_cufile_write_fn fn = (kvs_cufile_write_fn)kvs_cufile_real(KVS_CF_cuFileWrite);
	int fd = kvs_cufile_fd(fh);
	ssize_t n;

	if (!fn)
		return -KVS_CU_FILE_DRIVER_NOT_INITIALIZED;
	if (fd >= 0 && file_offset >= 0)
		kvs_shim_invalidate(fd, file_offset, size, false, 0);
	/* Write-through: the bytes are copied from the buffer (through the driver for device
	 * memory) once the real write has them, and kept when the file is closed. */
	struct kvs_shim_cfwrite w;
	bool staged =
	    fd >= 0 && buf &&
	    kvs_shim_cufile_write_before(&w, fd, (uint64_t)(uintptr_t)buf + (uint64_t)buf_offset,
					 size, file_offset);
	/* The real write as the shim's own call: the pwrite or syscall() libcufile makes inside it
	 * (compatibility mode) is this write, followed already, not another one. */
	(void)kvs_shim_in();
	n = fn(fh, buf, size, file_offset, buf_offset);
	kvs_shim_out(errno); /* the real write's errno, as it left it */
	if (staged)
		kvs_shim_cufile_write_after(&w, fd, n);
	if (fd >= 0 && file_offset >= 0) /* after the write: a negative pos_delta says so */
		kvs_shim_invalidate(fd, file_offset, size, false, -(off_t)size);
	return n;
}

/* ------------------------------------------------------------------ streams */

/* Streams registered with fixed sizes and offsets (cuFileStreamRegister flags 1|2|4): a read
 * on one may be served, its parameters read at submission.  Under handles_mu. */
#define MAX_STREAMS 256
#define FIXED                                                                                      \
	(KVS_CU_FILE_STREAM_FIXED_BUF_OFFSET | KVS_CU_FILE_STREAM_FIXED_FILE_OFFSET |              \
	 KVS_CU_FILE_STREAM_FIXED_FILE_SIZE)
static kvs_cu_stream_t streams[MAX_STREAMS];
static unsigned nstreams;

static bool stream_fixed(kvs_cu_stream_t st)
{
	bool found = false;

	pthread_mutex_lock(&handles_mu);
	for (unsigned i = 0; i < nstreams && !found; i++)
		found = streams[i] == st;
	pthread_mutex_unlock(&handles_mu);
	return found;
}

static void stream_forget(kvs_cu_stream_t st)
{
	pthread_mutex_lock(&handles_mu);
	for (unsigned i = 0; i < nstreams; i++) {
		if (streams[i] == st) {
			streams[i] = streams[--nstreams];
			break;
		}
	}
	pthread_mutex_unlock(&handles_mu);
}

kvs_cufile_error_t kvs_cufile_stream_register(kvs_cu_stream_t stream, unsigned flags)
{
	kvs_cufile_stream_register_fn fn =
	    (kvs_cufile_stream_register_fn)kvs_cufile_real(KVS_CF_cuFileStreamRegister);
	kvs_cufile_error_t e;

	if (!fn)
		return no_library;
	e = fn(stream, flags);
	stream_forget(stream); /* registered again: the new flags count */
	if (e.err == KVS_CU_FILE_SUCCESS && (flags & FIXED) == FIXED) {
		pthread_mutex_lock(&handles_mu);
		if (nstreams < MAX_STREAMS)
			streams[nstreams++] = stream;
		pthread_mutex_unlock(&handles_mu);
	}
	return e;
}

kvs_cufile_error_t kvs_cufile_stream_deregister(kvs_cu_stream_t stream)
{
	kvs_cufile_stream_deregister_fn fn =
	    (kvs_cufile_stream_deregister_fn)kvs_cufile_real(KVS_CF_cuFileStreamDeregister);

	stream_forget(stream);
	return fn ? fn(stream) : no_library;
}

kvs_cufile_error_t kvs_cufile_read_async(kvs_cufile_handle_t fh, void *buf, size_t *size_p,
					 off_t *file_offset_p, off_t *buf_offset_p,
					 ssize_t *bytes_read_p, kvs_cu_stream_t stream)
{
	kvs_cufile_read_async_fn fn =
	    (kvs_cufile_read_async_fn)kvs_cufile_real(KVS_CF_cuFileReadAsync);
	int fd = kvs_cufile_fd(fh);

	/* Served only when the parameters may be read now: the stream fixed them.  A KV file's
	 * read on another stream is counted (unserved_stream). */
	if (fd >= 0 && buf && size_p && file_offset_p && buf_offset_p && bytes_read_p &&
	    *buf_offset_p >= 0 && kvs_shim_wants(*size_p)) {
		if (!stream_fixed(stream))
			kvs_shim_note_stream(fd, (uint64_t)*file_offset_p, *size_p);
		else if (kvs_shim_read_to_stream(
			     fd, (uint64_t)(uintptr_t)buf + (uint64_t)*buf_offset_p, *size_p,
			     *file_offset_p, bytes_read_p, stream) == 0)
			return ok_error;
	}
	return fn ? fn(fh, buf, size_p, file_offset_p, buf_offset_p, bytes_read_p, stream)
		  : no_library;
}

/* ------------------------------------------------------------------ the dlsym answer */

/* The real function if a libcufile is loaded already: never loads one (a program probing for
 * libcufile must not load it by asking). */
static void *loaded_real(enum kvs_cufile_fn fn)
{
	void *p = atomic_load_explicit(&real[fn], memory_order_relaxed), *h;

	if (p)
		return p;
	p = not_shim(kvs_dlsym_real(RTLD_NEXT, names[fn]));
	if (!p)
		p = loaded_symbol(names[fn]);
	if (!p) {
		h = dlopen(kvs_shim_cufile_library(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
		if (h) {
			p = not_shim(kvs_dlsym_real(h, names[fn]));
			kvs_dlclose_real(
			    h); /* drops the reference RTLD_NOLOAD took; the library stays */
		}
	}
	return p;
}

/* dlsym(RTLD_DEFAULT, name), fn's name: glibc would find the shim's export first.  Answer as if
 * the shim were not there: NULL while no libcufile is loaded (a probe sees none), the real
 * function when the shim is off (on false), the hook otherwise. */
static void *default_answer(enum kvs_cufile_fn fn, const char *name, bool on)
{
	void *p = kvs_dlsym_real(RTLD_DEFAULT, name);

	if (!p || !kvs_dlsym_in_shim(p))
		return NULL;
	void *r = loaded_real(fn);
	if (!r) {
		kvs_dlsym_real(RTLD_NEXT, name); /* fails, and sets dlerror as glibc would */
		return KVS_DLSYM_NULL;
	}
	return on ? NULL : r;
}

void *kvs_cufile_answer(void *handle, const char *name, const char *version,
			void *const hooks[KVS_CF_N])
{
	int fn = -1;
	void *p;

	for (int i = 0; i < KVS_CF_N && fn < 0; i++)
		if (strcmp(names[i], name) == 0)
			fn = i;
	if (fn < 0 || !hooks[fn] || handle == RTLD_NEXT)
		return NULL;
	bool on = kvs_shim_wants(SIZE_MAX);
	if (handle == RTLD_DEFAULT)
		return default_answer(fn, name, on);
	if (!on || !is_cufile(handle))
		return NULL;
	p = version && *version ? kvs_dlvsym_real(handle, name, version)
				: kvs_dlsym_real(handle, name);
	if (!p)
		return KVS_DLSYM_NULL; /* the library lacks it: dlerror says so, as it would */
	/* The handle the caller uses, and its function: another libcufile than the one looked
	 * up before (loaded again, elsewhere) replaces it. */
	if (atomic_load(&lib) != handle && !atomic_load(&lib_ours))
		atomic_store(&lib, handle);
	if (!kvs_dlsym_in_shim(p))
		atomic_store_explicit(&real[fn], p, memory_order_relaxed);
	return hooks[fn];
}
