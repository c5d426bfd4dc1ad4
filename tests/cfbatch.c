/*
 * cfbatch: two cuFileBatchIOSubmit calls racing on one batch of one entry, under the shim
 * (gpu_faults case 11).  Thread A submits a read into memory the driver does not know (a
 * PROT_NONE mapping: the shim refuses it, so the real library gets it, one entry alone); while the
 * real submit is under way (FAKECUFILE_SUBMIT_DELAY_US) and fails (FAKECUFILE_FAIL=batch_submit),
 * the main thread submits a read into device memory.  Then every event is collected.
 *
 *   cfbatch FILE      prints each Submit's answer, the events, and "consistent" when every
 *                     entry whose Submit succeeded is reported exactly once with its own
 *                     cookie and a plausible result (else "INCONSISTENT: why")
 *
 * Exit 0 unless the command could not run (2).  Needs libcuda.so.1 and libcufile.so.0 (the
 * fakes of tests/fake).
 */
#include "cufile_types.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define LEN (1u << 20)

static struct {
	kvs_cufile_handle_register_fn reg;
	kvs_cufile_batch_setup_fn setup;
	kvs_cufile_batch_submit_fn submit;
	kvs_cufile_batch_get_status_fn status;
	kvs_cufile_batch_destroy_fn destroy;
} cf;

static kvs_cufile_batch_handle_t batch;
static kvs_cufile_handle_t fh;
static kvs_cufile_io_params_t io_a, io_b;
static kvs_cufile_error_t err_a;

static void die(const char *what)
{
	fprintf(stderr, "cfbatch: %s: %s\n", what, dlerror() ? dlerror() : "failed");
	exit(2);
}

static void *sym(void *h, const char *name)
{
	void *p = dlsym(h, name);

	if (!p)
		die(name);
	return p;
}

/* Device memory from the driver: cuInit, the primary context, cuMemAlloc. */
static void *device_alloc(size_t len)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	unsigned long long d = 0;
	void *ctx = NULL;
	int dev = 0;

	if (!h)
		die("dlopen libcuda.so.1");
	int (*init)(unsigned) = sym(h, "cuInit");
	int (*device_get)(int *, int) = sym(h, "cuDeviceGet");
	int (*retain)(void **, int) = sym(h, "cuDevicePrimaryCtxRetain");
	int (*set_current)(void *) = sym(h, "cuCtxSetCurrent");
	int (*alloc)(unsigned long long *, size_t) = sym(h, "cuMemAlloc_v2");
	if (init(0) || device_get(&dev, 0) || retain(&ctx, dev) || set_current(ctx) ||
	    alloc(&d, len))
		die("CUDA set-up");
	return (void *)(uintptr_t)d;
}

static void *submit_a(void *arg)
{
	(void)arg;
	err_a = cf.submit(batch, 1, &io_a, 0);
	return NULL;
}

static void entry(kvs_cufile_io_params_t *io, void *buf)
{
	memset(io, 0, sizeof(*io));
	io->mode = KVS_CUFILE_BATCH;
	io->opcode = KVS_CUFILE_READ;
	io->fh = fh;
	io->u.batch.devPtr_base = buf;
	io->u.batch.size = LEN;
	io->cookie = io;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: cfbatch FILE\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	void *dev = device_alloc(LEN);
	void *h = dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		die("dlopen libcufile.so.0");
	cf.reg = (kvs_cufile_handle_register_fn)sym(h, "cuFileHandleRegister");
	cf.setup = (kvs_cufile_batch_setup_fn)sym(h, "cuFileBatchIOSetUp");
	cf.submit = (kvs_cufile_batch_submit_fn)sym(h, "cuFileBatchIOSubmit");
	cf.status = (kvs_cufile_batch_get_status_fn)sym(h, "cuFileBatchIOGetStatus");
	cf.destroy = (kvs_cufile_batch_destroy_fn)sym(h, "cuFileBatchIODestroy");
	int fd = open(argv[1], O_RDONLY);
	kvs_cufile_descr_t descr = {.type = KVS_CU_FILE_HANDLE_TYPE_OPAQUE_FD};
	descr.handle.fd = fd;
	if (fd < 0 || cf.reg(&fh, &descr).err || cf.setup(&batch, 1).err)
		die("register, set up");
	/* Memory neither the driver nor the process can write: the shim passes it through. */
	void *nowhere = mmap(NULL, LEN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (nowhere == MAP_FAILED)
		die("mmap");
	entry(&io_a, nowhere);
	entry(&io_b, dev);

	pthread_t t;
	pthread_create(&t, NULL, submit_a, NULL);
	usleep(100000); /* A's real submit is under way */
	kvs_cufile_error_t err_b = cf.submit(batch, 1, &io_b, 0);
	pthread_join(t, NULL);
	printf("submit A (unknown memory): %d; submit B (device memory): %d\n", (int)err_a.err,
	       (int)err_b.err);

	int seen_a = 0, seen_b = 0, unknown = 0;
	const char *why = NULL;
	for (int round = 0; round < 20; round++) {
		kvs_cufile_io_events_t ev[4];
		unsigned nr = 4;
		struct timespec timeout = {0, 100000000};

		if (cf.status(batch, 0, &nr, ev, &timeout).err)
			break;
		for (unsigned k = 0; k < nr; k++) {
			printf("event: %s status %#x ret %zd\n",
			       ev[k].cookie == &io_a   ? "A"
			       : ev[k].cookie == &io_b ? "B"
						       : "?",
			       (unsigned)ev[k].status, (ssize_t)ev[k].ret);
			if (ev[k].cookie == &io_a) {
				seen_a++;
				if (ev[k].status == KVS_CUFILE_COMPLETE && ev[k].ret != LEN)
					why = "A's event carries another entry's result";
			} else if (ev[k].cookie == &io_b) {
				seen_b++;
				if (ev[k].status != KVS_CUFILE_COMPLETE || ev[k].ret != LEN)
					why = "B's read failed";
			} else {
				unknown++;
			}
		}
	}
	if (!why && unknown)
		why = "an unknown cookie";
	if (!why && seen_a != (err_a.err == KVS_CU_FILE_SUCCESS))
		why = "A reported other than once";
	if (!why && seen_b != (err_b.err == KVS_CU_FILE_SUCCESS))
		why = "B reported other than once";
	if (why)
		printf("INCONSISTENT: %s\n", why);
	else
		printf("consistent\n");
	cf.destroy(batch);
	return 0;
}
