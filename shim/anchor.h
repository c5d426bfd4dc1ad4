/*
 * anchor: the shim's own descriptors of the KV files it reads.
 *
 * The loader reads storage on other threads, later than the hook ran: through the program's
 * descriptor number it could read another file that a dup2 (or a close and an open) put there
 * meanwhile, and publish those bytes under this file's key.  So it reads through an anchor:
 * the shim's own dup of the program's descriptor, taken at the first served read of that
 * number, checked against the read's file identity (fstat) before each use, and again after
 * each storage read.  A read holds a reference on its anchor from kvs_anchor_get to
 * kvs_anchor_put, and an anchor is never closed while one is held: a read whose program
 * descriptor was closed and reused meanwhile still reads its own file, and a failed load can
 * be read again through the anchor (kernel AIO's rule: the kernel holds the file).
 *
 * Closing any descriptor of a file drops the process's POSIX record locks on it.  So an anchor
 * of a file the program may have locked (it called fcntl F_SETLK/F_SETLKW or lockf on it:
 * kvs_anchor_note_lock) is closed only once no descriptor of the program names the file any
 * more (a scan of /proc/self/fd); any other is closed as soon as it is retired: when the
 * program closes the number, or the number names another file at its next served read.
 * Anchors are O_CLOEXEC; a fork child closes those it still holds.
 *
 * What a caller may count on: no function allocates memory (the tables are mmap'ed once) and
 * every one leaves errno alone.  kvs_anchor_get and kvs_anchor_closing take one process-wide
 * mutex and wait for it, held by another thread for a few system calls (dup, fstat, statx,
 * close; a scan of /proc/self/fd for a file the program locked).  A call from a signal handler
 * that interrupted this very thread while it holds that mutex, or is taking it, does not wait:
 * kvs_anchor_get answers -EBUSY and kvs_anchor_closing leaves the anchor for a later
 * retirement.  That is what makes them safe to call from a handler under glibc, but they are
 * not async-signal-safe in POSIX's sense: pthread_mutex_lock and strtol are not on its
 * list.  kvs_anchor_put and kvs_anchor_note_lock use atomics and fstat only.
 */
#ifndef KVS_SHIM_ANCHOR_H
#define KVS_SHIM_ANCHOR_H

#include "fdinfo.h"

/* The anchor of fd, a KV file kvs_fdinfo_get just described as fi: a descriptor of the
 * shim's own whose file has exactly fi's identity, made on first use, with a reference taken
 * (kvs_anchor_put it).  Waits while another thread installs or retires an anchor.  Returns the
 * descriptor, or -errno (-EBADF: fd out of range; -ESTALE: the file changed between the two
 * looks; -EMFILE: the dup's number is beyond the tables; -EBUSY: called from a signal handler
 * that interrupted this thread inside this module; or dup's or fstat's error) and the caller
 * passes through, holding nothing. */
int kvs_anchor_get(int fd, const struct kvs_fdinfo *fi);

/* Drop the reference kvs_anchor_get took; the last one on a retired anchor closes it.
 * A negative anchor is ignored. */
void kvs_anchor_put(int anchor);

/* One more reference on anchor, which the caller holds one on already (so it cannot be closed
 * meanwhile): for work that uses it later, on another thread (atime.c), and ends with
 * kvs_anchor_put.  Atomics only. */
void kvs_anchor_hold(int anchor);

/* The program is about to close fd: retire its anchor, if any (closed now, or parked while the
 * program may hold locks on the file, or when the last reference goes), waiting for the mutex
 * as kvs_anchor_get does.  One load when fd has none. */
void kvs_anchor_closing(int fd);

/* The program is about to close the numbers lo to hi itself (a close loop, close_range, a dup2
 * onto one): the anchors among them are the program's to close from now on.  The shim forgets
 * them and never closes those numbers (what the program opens there next is its own); a read
 * that holds one finds the number gone or another file's (its fstat checks).  Atomics only. */
void kvs_anchor_numbers_closing(unsigned int lo, unsigned int hi);
/* Is any anchor, or a close of one in progress, among lo to hi?  Loads only. */
bool kvs_anchor_numbers_in(unsigned int lo, unsigned int hi);

/* The program takes a POSIX record lock on fd's file (fcntl F_SETLK/F_SETLKW, lockf): from now
 * on its anchors are kept while the program has a descriptor of it. */
void kvs_anchor_note_lock(int fd);

/* The fork child: close every anchor it still holds (what the program has taken over since
 * is left alone) and forget them. */
void kvs_anchor_atfork_child(void);

#endif
