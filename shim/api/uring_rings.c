/*
 * uring_rings: the io_uring engine's tables (uring_int.h): the rings the shim knows, by
 * descriptor, each with what the syscall door saw of it (io_uring_setup's offsets, the
 * mappings) and its registered files (either door); the passed-through causes said once
 * (uring_unserved); the syscall door's records (kvs_uring_setup_done, kvs_uring_mapped,
 * kvs_uring_register) and the close and fork rules.  The protocol is the DESIGN comment of
 * api/uring.c ("Threads": tables_mu).
 */
#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "shim.h"
#include "uring.h"
#include "uring_int.h"

#define MAX_FIXED 65536

/* ------------------------------------------------------------------ tables */

static pthread_mutex_t tables_mu = PTHREAD_MUTEX_INITIALIZER;
/* Some ring may have changed another's registered files (MSG_RING, a registration through a
 * registered ring descriptor): no recorded table is trusted any more. */
_Atomic bool uring_fixed_untrusted;
static struct ring rings[MAX_RINGS]; /* under tables_mu */
_Atomic int uring_nrings;	     /* entries in use, read without the lock as a hint */

/* tables_mu is taken with the shim's guard held, by every thread: close (async-signal-safe)
 * forgets a ring under it, and a signal handler that interrupts a thread holding it finds the
 * guard set and makes the real call (guard.h). */
void uring_lock_tables(void)
{
	(void)kvs_shim_in(); /* errno is the caller's business here: kept as it goes */
	pthread_mutex_lock(&tables_mu);
}

void uring_unlock_tables(void)
{
	pthread_mutex_unlock(&tables_mu);
	kvs_shim_out(errno);
}

/* The ring entry for fd, made if want_new.  Caller holds tables_mu. */
struct ring *uring_ring_locked(int fd, bool want_new)
{
	struct ring *free_one = NULL;

	if (fd < 0)
		return NULL; /* liburing's REGISTERED_FD_ONLY rings: no descriptor to key them */

	for (int i = 0; i < MAX_RINGS; i++) {
		if (rings[i].fd == fd)
			return &rings[i];
		if (rings[i].fd < 0 && !free_one)
			free_one = &rings[i];
	}
	if (!want_new || !free_one)
		return NULL;
	free(free_one->files);
	*free_one = (struct ring){.fd = fd};
	atomic_fetch_add_explicit(&uring_nrings, 1, memory_order_relaxed);
	return free_one;
}
/* fd is closed, or its ring is exited: forget the ring.  A ring mapped through libc's mmap
 * whose submissions no door saw (fio 3.33 sets up through syscall() but enters with an inline
 * system call; a static liburing) is said now: the program used it where the shim cannot
 * see (its memory is not read here: rings are often unmapped before they are closed). */
void kvs_uring_ring_forget(int fd)
{
	if (!atomic_load_explicit(&uring_nrings, memory_order_relaxed))
		return;
	bool unseen = false;
	uring_lock_tables();
	struct ring *r = uring_ring_locked(fd, false);
	if (r) {
		unseen = !r->seen_submit && (r->met_mapped || r->sq_ring);
		/* Its file table is freed by the entry's next user (uring_ring_locked): close,
		 * which may run in a signal handler, frees nothing. */
		*r = (struct ring){.fd = -1, .files = r->files};
		atomic_fetch_sub_explicit(&uring_nrings, 1, memory_order_relaxed);
	}
	uring_unlock_tables();
	if (unseen)
		uring_unserved(C_UNSEEN, -1);
}

/* A submission of fd's ring is being seen (once per ring it takes the lock). */
void uring_ring_seen(int fd, bool *known)
{
	if (*known || !atomic_load_explicit(&uring_nrings, memory_order_relaxed))
		return;
	uring_lock_tables();
	struct ring *r = uring_ring_locked(fd, false);
	if (r)
		r->seen_submit = true;
	uring_unlock_tables();
	*known = true;
}

__attribute__((constructor)) static void rings_init(void)
{
	for (int i = 0; i < MAX_RINGS; i++)
		rings[i].fd = -1;
}

/* Replace [off, off+n) of fd's ring's registered files with fds (NULL: all empty). */
void kvs_uring_files_set(int ring_fd, unsigned off, const int *fds, unsigned n, bool replace)
{
	if (n > MAX_FIXED || off > MAX_FIXED - n)
		return;
	uring_lock_tables();
	struct ring *r = uring_ring_locked(ring_fd, true);
	if (r && replace) {
		free(r->files);
		r->files = NULL;
		r->nfiles = 0;
		r->files_unknown = false;
	}
	if (r && off + n > r->nfiles) {
		struct fixed *f = realloc(r->files, (off + n) * sizeof(*f));
		if (!f) {
			r->files_unknown = true;
		} else {
			for (unsigned i = r->nfiles; i < off + n; i++)
				f[i] = (struct fixed){.fd = -1};
			r->files = f;
			r->nfiles = off + n;
		}
	}
	for (unsigned i = 0; r && r->files && off + n <= r->nfiles && i < n; i++) {
		struct stat st;
		int fd = fds ? fds[i] : -1;

		if (fd >= 0 && fstat(fd, &st) == 0)
			r->files[off + i] = (struct fixed){fd, st.st_dev, st.st_ino};
		else
			r->files[off + i] = (struct fixed){.fd = -1};
	}
	uring_unlock_tables();
}

void kvs_uring_files_drop(int ring_fd)
{
	if (!atomic_load_explicit(&uring_nrings, memory_order_relaxed))
		return;
	uring_lock_tables();
	struct ring *r = uring_ring_locked(ring_fd, false);
	if (r) {
		free(r->files);
		r->files = NULL;
		r->nfiles = 0;
		r->files_unknown = false;
	}
	uring_unlock_tables();
}

/* The program's descriptor for registered file idx of ring_fd, if the number still names the
 * file registered there; else -1. */
int uring_fixed_fd(int ring_fd, unsigned idx)
{
	int fd = -1;
	dev_t dev = 0;
	ino_t ino = 0;
	struct stat st;

	if (atomic_load_explicit(&uring_fixed_untrusted, memory_order_relaxed))
		return -1;
	uring_lock_tables();
	struct ring *r = uring_ring_locked(ring_fd, false);
	if (r && !r->files_unknown && idx < r->nfiles) {
		fd = r->files[idx].fd;
		dev = r->files[idx].dev;
		ino = r->files[idx].ino;
	}
	uring_unlock_tables();
	if (fd >= 0 && (fstat(fd, &st) != 0 || st.st_dev != dev || st.st_ino != ino))
		fd = -1; /* closed and reused since: the table's file is not this number's */
	return fd;
}

void kvs_uring_files_unknown(int ring_fd)
{
	uring_lock_tables();
	struct ring *r = uring_ring_locked(ring_fd, true);
	if (r)
		r->files_unknown = true;
	uring_unlock_tables();
}

/* ------------------------------------------------------------------ passed through */

void uring_unserved(enum cause c, int fd)
{
	static const char *const what[C_NCAUSES] = {
	    "an io_uring with SQPOLL (the kernel takes its entries on its own thread)",
	    "an io_uring on a kernel without IORING_NOP_INJECT_RESULT (Linux 6.10)",
	    "io_uring_enter through a registered ring descriptor",
	    "a registered file of an io_uring whose file table the ring changed itself",
	    "an io_uring whose submissions the shim could not see (its system calls are not "
	    "libc's, nor its calls liburing's through the PLT)",
	};
	static const enum kvs_cause cause[C_NCAUSES] = {
	    KVS_CAUSE_URING_SQPOLL, KVS_CAUSE_URING_NOP,    KVS_CAUSE_URING_REGRING,
	    KVS_CAUSE_URING_FIXED,  KVS_CAUSE_URING_UNSEEN,
	};

	kvs_shim_note_uring_unserved(fd, 0, 0);
	kvs_log_once(cause[c], KVS_LOG_INFO,
		     "%s: reads of KV files through it are not served (counted in "
		     "unserved_io_uring)",
		     what[c]);
}

/* ------------------------------------------------------------------ the syscall door */

void kvs_uring_setup_done(int fd, const void *params)
{
	const struct io_uring_params *p = params;

	if (fd < 0 || !p)
		return;
	uring_lock_tables();
	struct ring *r = uring_ring_locked(fd, true);
	if (r) {
		free(r->files);
		*r = (struct ring){.fd = fd,
				   .raw = true,
				   .flags = p->flags,
				   .entries = p->sq_entries,
				   .off_head = p->sq_off.head,
				   .off_tail = p->sq_off.tail,
				   .off_mask = p->sq_off.ring_mask,
				   .off_array = p->sq_off.array};
	}
	uring_unlock_tables();
}

void kvs_uring_mapped(int fd, long off, void *addr)
{
	if (fd < 0 || addr == MAP_FAILED || (off != IORING_OFF_SQ_RING && off != IORING_OFF_SQES))
		return;
	bool known = false;
	if (atomic_load_explicit(&uring_nrings, memory_order_relaxed)) {
		uring_lock_tables();
		struct ring *r = uring_ring_locked(fd, false);
		if (r && r->raw) {
			known = true;
			if (off == IORING_OFF_SQ_RING)
				r->sq_ring = addr;
			else
				r->sqes = addr;
		}
		uring_unlock_tables();
	}
	if (known || off != IORING_OFF_SQ_RING)
		return;
	/* A ring the shim has not seen set up (liburing makes its system calls itself): noted,
	 * and said at its close if no submission of it was ever seen (ring_forget). */
	char link[64], path[32];
	int saved = errno;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(path, link, sizeof(link) - 1);
	if (n > 0 && (link[n] = '\0', strcmp(link, "anon_inode:[io_uring]") == 0)) {
		uring_lock_tables();
		struct ring *r = uring_ring_locked(fd, true);
		if (r && !r->raw)
			r->met_mapped = true;
		uring_unlock_tables();
	}
	errno = saved;
}

void kvs_uring_register(int fd, unsigned opcode, const void *arg, unsigned nr, long result)
{
	enum {
		REGISTER_FILES = 2,
		UNREGISTER_FILES = 3,
		REGISTER_FILES_UPDATE = 6,
		REGISTER_FILES2 = 13,
		REGISTER_FILES_UPDATE2 = 14,
	};
	if (result < 0)
		return;
	if (opcode & (1U << 31)) { /* IORING_REGISTER_USE_REGISTERED_RING: fd is not a ring's */
		atomic_store(&uring_fixed_untrusted, true);
		return;
	}
	switch (opcode) {
	case REGISTER_FILES:
		kvs_uring_files_set(fd, 0, arg, nr, true);
		break;
	case UNREGISTER_FILES:
		kvs_uring_files_drop(fd);
		break;
	case REGISTER_FILES_UPDATE: {
		const struct io_uring_files_update *u = arg;
		if (u && (unsigned)result == nr)
			kvs_uring_files_set(fd, u->offset, (const int *)(uintptr_t)u->fds, nr,
					    false);
		else
			kvs_uring_files_unknown(fd);
		break;
	}
	case REGISTER_FILES2: {
		const struct io_uring_rsrc_register *rr = arg;
		if (rr && nr == sizeof(*rr))
			kvs_uring_files_set(fd, 0, (const int *)(uintptr_t)rr->data, rr->nr, true);
		else
			kvs_uring_files_unknown(fd);
		break;
	}
	case REGISTER_FILES_UPDATE2: {
		const struct io_uring_rsrc_update2 *u = arg;
		if (u && nr == sizeof(*u) && (unsigned)result == u->nr)
			kvs_uring_files_set(fd, u->offset, (const int *)(uintptr_t)u->data, u->nr,
					    false);
		else
			kvs_uring_files_unknown(fd);
		break;
	}
	default:
		break;
	}
}

void kvs_uring_closed(int fd)
{
	kvs_uring_ring_forget(fd);
}

void kvs_uring_atfork_child(void)
{
	pthread_mutex_init(&tables_mu, NULL);
}
