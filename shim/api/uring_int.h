/*
 * uring_int: what the two files of the io_uring engine share (uring.c, the serving; and
 * uring_rings.c, the tables), and nothing else includes.  The protocol is the DESIGN comment of
 * api/uring.c; tables_mu (uring_rings.c) guards the ring table and each ring's fields, and is
 * taken only through uring_lock_tables, with the shim's guard held.
 *
 * Calls run one way: uring.c calls uring_rings.c, never the reverse.
 */
#ifndef KVS_SHIM_URING_INT_H
#define KVS_SHIM_URING_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>

#define MAX_RINGS 64

/* A registered file: the descriptor number it was registered from, and its identity then. */
struct fixed {
	int fd;
	dev_t dev;
	ino_t ino;
};

struct ring {
	int fd; /* the ring's descriptor; -1: a free entry */
	/* The syscall door: what io_uring_setup said, and the mappings the mmap hook saw. */
	bool raw;
	unsigned flags, entries, off_head, off_tail, off_mask, off_array;
	char *sq_ring, *sqes;
	/* A submission was seen through one of the doors; the ring was first met mapped. */
	bool seen_submit, met_mapped;
	/* Registered files (either door); unknown: the ring changed its table itself. */
	struct fixed *files;
	unsigned nfiles;
	bool files_unknown;
};

/* Some ring may have changed another's registered files: no recorded table is trusted. */
extern _Atomic bool uring_fixed_untrusted;
/* Ring entries in use, read without the lock as a hint (relaxed). */
extern _Atomic int uring_nrings;

/* tables_mu, taken and released with the shim's guard raised around it (guard.h). */
void uring_lock_tables(void);
void uring_unlock_tables(void);
/* The ring entry for fd, made if want_new; NULL if none (or no room).  Caller holds
 * tables_mu. */
struct ring *uring_ring_locked(int fd, bool want_new);
/* A submission of fd's ring is being seen (*known: already noted by this caller). */
void uring_ring_seen(int fd, bool *known);
/* The program's descriptor for registered file idx of ring_fd, if the number still names the
 * file registered there; else -1. */
int uring_fixed_fd(int ring_fd, unsigned idx);

/* Why a ring's reads are passed through: counted in unserved_io_uring, said once a cause. */
enum cause { C_SQPOLL, C_NOP, C_REGRING, C_FIXED, C_UNSEEN, C_NCAUSES };
void uring_unserved(enum cause c, int fd);

#endif
