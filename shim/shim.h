/*
 * shim: what the hooks call.  The doors (hooks/) and the engines below them (api/) are built on
 * this contract: the read decision, "serve this read from the cache or make the real call"
 * (kvs_shim_read and kvs_shim_readv in serve.c; the asynchronous and cuFile forms in
 * serve_async.c and serve_stream.c), the notes of what is passed through (unserved.c), and
 * the write side: writes, changes, closes and renames (writes.c).
 *
 * Life of a process: nothing happens at load time.  The first hooked call loads the
 * configuration (attach.c: one thread initialises, the others make the real call meanwhile);
 * the first cacheable read maps the region, attaches and starts the loader.  After fork the
 * child forgets the parent's mapping and threads and starts over lazily.  The shim's own code
 * calls no name it exports (base/raw.h; scripts/check_layers.sh).  A per-thread guard, raised
 * while it runs, sends a hook entered on the same thread meanwhile (a signal handler, or
 * libcufile or the CUDA driver calling a hooked name) straight to the real function.
 */
#ifndef KVS_SHIM_H
#define KVS_SHIM_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "device.h"
#include "fdinfo.h"
#include "guard.h"
#include "loader.h"
#include "wthru_op.h"

#define KVS_EXPORT __attribute__((visibility("default")))

/*
 * Serve a read of fd into iov from the cache.  use_pos: read at (and advance) the file
 * position, as read/readv do; else read at off, as pread does.  Returns the byte count the
 * real call would return, or -1 when the caller must make the real call (nothing was changed:
 * not the buffers' promised content, not the position, not errno).
 *
 * Signal handlers.  Once the process is attached (its first cacheable read), a served read
 * allocates nothing and waits on no lock a handler could have interrupted on the same thread
 * (the guard sends a handler's read to the real call while the shim runs there): a read from
 * a signal handler is served.  The attach itself maps the region, allocates the loader and
 * starts its threads (malloc, pthread_create): not async-signal-safe.  A process whose first
 * cacheable read comes from a signal handler that interrupted malloc or pthread_create on the
 * same thread can deadlock there (docs/design.md, "Known limitations").
 */
ssize_t kvs_shim_read(int fd, const struct iovec *iov, int iovcnt, off_t off, bool use_pos);

/* iovecs of a vector call the shim reads on the caller's stack (64: 1 KiB); a longer array is
 * read in pieces. */
#define KVS_IOV_LOCAL 64

/* kvs_shim_read for the program's own iovec array (readv, preadv, preadv2): the array is read
 * only when fd is a KV file, and then as the kernel reads it (kvs_shim_copy_in), so that an
 * array the kernel would refuse (EFAULT, EINVAL) is the real call's to refuse, never a crash.
 * Returns as kvs_shim_read; a read shorter than files.min_read is counted (note_small). */
ssize_t kvs_shim_readv(int fd, const struct iovec *iov, int iovcnt, off_t off, bool use_pos);

/* Invalidate the cached shards of fd's file that a write of len bytes at off changes; with
 * use_pos, at the file position plus pos_delta (0 before a write, minus the count after it).
 * Hooks call it before the write (the old identity's shards) and after it (shards another
 * process may have loaded while the write was landing), with a negative pos_delta after it
 * whether or not use_pos (wonce.h judges a rewrite before the write only).  Never fails;
 * never changes errno. */
void kvs_shim_invalidate(int fd, off_t off, size_t len, bool use_pos, off_t pos_delta);

/* An open of path (relative to dirfd) with flags is about to be made (kvs_shim_opening: only
 * an O_TRUNC of a write-once file is looked at before it, wonce.h), and returned fd, or -1
 * (kvs_shim_opened, after every open, by any door): the number's earlier life is forgotten
 * (kvs_shim_fd_born), a writable open's class is set by its path (one readlink: its writes to a
 * file outside the roots then cost no system call), a write-once file opened for writing has
 * its size noted, and an O_DIRECT open of a KV file is marked (unseen.h).  errno unchanged. */
struct kvs_wonce_open;
void kvs_shim_opening(struct kvs_wonce_open *o, int dirfd, const char *path, int flags);
void kvs_shim_opened(struct kvs_wonce_open *o, int fd, int flags);

/* Is fd a KV file (looked at once: fdinfo.h)?  errno unchanged. */
bool kvs_shim_is_kv(int fd);

/* The program closed or replaced fd, or [lo, hi]: what the shim knew of those numbers goes
 * (fdinfo.h, wonce.h).  Atomics only, async-signal-safe. */
void kvs_shim_fd_gone(int fd);
void kvs_shim_fds_gone(unsigned int lo, unsigned int hi);
/* An open (any door) just gave the program fd: what fdinfo knew of the number belongs to an
 * earlier life, whose close the hooks may not have seen (glibc's pclose, freopen, closedir
 * close inside libc).  Atomics only. */
void kvs_shim_fd_born(int fd);
/* fd is about to be duplicated (dup2, dup3, F_DUPFD): its file lives on under another number,
 * whose reads are not fd's (unseen.h: the mark goes uncounted).  Atomics only. */
void kvs_shim_fd_duped(int fd);

/* Closes (kvs_shim_fds_closing, _dup_closing, _range_closing) and forks: hooks/fanout.h. */

/* A cuFile read served asynchronously (a batch entry): storage for the whole read, owned by
 * the caller until done() is called. */
struct kvs_shim_async {
	struct kvs_task task;
	struct kvs_read rd;
	struct kvs_device_target tg;
	void (*done)(struct kvs_shim_async *a, int64_t result);
	void *arg;	/* the caller's */
	bool posix;	/* a POSIX or kernel AIO read (kvs_shim_read_start), not a cuFile one */
	bool zero_tail; /* posix: a short O_DIRECT read zeroes the rest, as the kernel's would */
	int fd;		/* the program's descriptor (for the debug line of a fallback) */
	int64_t result; /* the byte count, when a start returned 1 */
};

/*
 * Serve an asynchronous POSIX read (aio_read, lio_listio, io_submit) of fd: the iovecs at file
 * offset off, under the same rules as kvs_shim_read (a KV file, O_DIRECT or files.buffered,
 * aligned as O_DIRECT needs, writable buffers).  Returns 0 and calls done(a, bytes or -errno)
 * once, from the loader's completion thread (a negative result: make the real read, or
 * report it); 1 when it is over already (hits copied on this thread: a->result holds the byte
 * count; done will not be called); or -1 at once (not served: the caller submits it to the
 * real interface; done will not be called).  a, iov and the buffers must stay valid until done.
 * errno unchanged.
 */
int kvs_shim_read_start(struct kvs_shim_async *a, int fd, const struct iovec *iov, int iovcnt,
			off_t off, void (*done)(struct kvs_shim_async *a, int64_t result));

/*
 * Serve a cuFile read of fd: size bytes at file offset off into the memory at ptr, device or
 * host.  Returns the bytes read (short only at the end of the file), or -1: make the real
 * call (nothing promised about the destination; errno unchanged).
 */
ssize_t kvs_shim_read_to(int fd, uint64_t ptr, size_t size, off_t off);

/* The same, asynchronously: returns 0 and calls done(a, bytes or -errno) once, from the
 * loader's completion thread (a negative result: make the real call); returns 1 when the read
 * is over already (every shard was a hit, copied on this thread: a->result holds the byte
 * count, done will not be called); or returns -1 at once (make the real call; done will not
 * be called). */
int kvs_shim_read_to_start(struct kvs_shim_async *a, int fd, uint64_t ptr, size_t size, off_t off,
			   void (*done)(struct kvs_shim_async *a, int64_t result));

/* shim.mode = observe (observe.h): is the shim on and observing?  One load after the first
 * hooked call.  kvs_shim_observe_to: a cuFile read of size bytes at off into ptr that the
 * caller passes to the real library as it is, keyed and counted as kvs_shim_read_to_start
 * would have taken it (a batch entry: the batch then goes whole to the real Submit, as
 * without the shim). */
bool kvs_shim_observing(void);
void kvs_shim_observe_to(int fd, uint64_t ptr, size_t size, off_t off);

/*
 * cuFileReadAsync on a stream whose sizes and offsets were fixed at registration: size bytes
 * at off into the device memory at ptr, in stream order.  Enqueues on stream: a host function
 * that waits until the shards are loaded, the copies from the region, and a host function that
 * releases the pins and stores the byte count (or a negative error) in *bytes_read.  Returns 0
 * once enqueued, or -1: make the real call (nothing was enqueued).
 */
int kvs_shim_read_to_stream(int fd, uint64_t ptr, size_t size, off_t off, ssize_t *bytes_read,
			    void *stream);

/*
 * Write-through around a write (wthru.h): kvs_shim_write_before before the real call of len
 * bytes from iov (the caller's count: for a program's array, kvs_shim_write_iov's; iov NULL: a
 * write whose bytes are not kept, followed as a change) at off (or -1: at the file position);
 * true means kvs_shim_write_after must follow with the real call's result.  kvs_shim_closing before
 * a real close (a staged file to publish, or NULL at the cost of one load when nothing is staged),
 * kvs_shim_closed after it; kvs_shim_synced after an fsync or fdatasync that returned 0;
 * kvs_shim_renamed after a rename that returned 0, with the new name (relative to dirfd);
 * kvs_shim_truncating before an ftruncate (the file to hand kvs_shim_truncated after it, or NULL).
 * None changes errno or fails.
 */
struct kvs_wthru_op;
struct wt_file;
/* The program's iovec array of a vector write (writev, pwritev, pwritev2) to fd, for the calls
 * around it: read only when fd is a KV file and write-through or the region is in use, as the
 * kernel reads it.  Returns the array to hand kvs_shim_write_before (local, KVS_IOV_LOCAL
 * entries of the caller's, or iov once read whole) with its byte count in *len; NULL when there
 * is nothing to do around the write, or the kernel will refuse the array: the real call alone. */
const struct iovec *kvs_shim_write_iov(int fd, const struct iovec *iov, int iovcnt,
				       struct iovec *local, uint64_t *len);
bool kvs_shim_write_before(struct kvs_wthru_op *op, int fd, const struct iovec *iov, int iovcnt,
			   uint64_t len, int64_t off, bool stream);
void kvs_shim_write_after(struct kvs_wthru_op *op, int fd, ssize_t ret);
struct wt_file *kvs_shim_closing(int fd);
void kvs_shim_closed(struct wt_file *f, int ret);
void kvs_shim_synced(int fd);
void kvs_shim_renamed(int dirfd, const char *path);
struct wt_file *kvs_shim_truncating(int fd, struct kvs_wtok *tok);
/* fclose of a stream on fd at position pos (ftello, -1 unknown): kvs_shim_fclosing before the
 * real fclose (the staged file, and a descriptor of it in *dupfd that outlives the stream),
 * kvs_shim_fclosed after it.  stream (kvs_shim_write_before): an fwrite at the stream's
 * position off (wthru.h, KVS_WT_STREAM). */
struct wt_file *kvs_shim_fclosing(int fd, int64_t pos, int *dupfd);
void kvs_shim_fclosed(struct wt_file *f, int dupfd, int ret);

/* cuFileWrite of size bytes from ptr (device or host memory) to fd at off: stage it for
 * write-through (true: kvs_shim_cufile_write_after must follow with the real call's byte
 * count, or -1), its bytes copied now, before the real call (through the driver for device
 * memory).  w lives on the caller's stack between the two. */
struct kvs_shim_cfwrite {
	struct kvs_wthru_op op;
	struct kvs_device_target tg;
	struct iovec iov;
};
bool kvs_shim_cufile_write_before(struct kvs_shim_cfwrite *w, int fd, uint64_t ptr, size_t size,
				  off_t off);
void kvs_shim_cufile_write_after(struct kvs_shim_cfwrite *w, int fd, ssize_t ret);

/* An asynchronous write (aio_write, LIO_WRITE, kernel AIO PWRITE/PWRITEV) of iov (the program's
 * array, read as the kernel reads it) to fd at off is about to be submitted: note it in p for
 * write-through, its bytes copied now (false: not noted, nothing to complete).  Once its result
 * is seen (aio_error, aio_return, an io_event), kvs_shim_write_completed(p) with it (-1: failed,
 * or never submitted) keeps what it wrote; p is the caller's again after that.  Completion
 * takes no lock but the shim's own, under its guard, and allocates nothing: it may run in a
 * signal handler (aio_error, aio_return, close).  Neither changes errno. */
struct kvs_shim_wpend {
	int fd;
	struct kvs_wthru_op op;
};
bool kvs_shim_write_submitted(struct kvs_shim_wpend *p, int fd, const struct iovec *iov, int iovcnt,
			      uint64_t off);
void kvs_shim_write_completed(struct kvs_shim_wpend *p, ssize_t ret);

/*
 * A change of fd's file whose bytes write-through does not copy (fallocate, copy_file_range,
 * sendfile, splice, truncate by path): kvs_shim_change_before before the real call, for
 * [off, off + len) (len UINT64_MAX: to any end; off KVS_WT_AT_POS: at the file position;
 * KVS_WT_ANYWHERE: the whole file; offp, when not NULL: the offset is the program's at offp,
 * read as the kernel reads it, once fd is known to be a KV file), then kvs_shim_change_after with
 * its result when it returned true.  The shards it touches are dropped from the cache before and
 * after it, the file's write sequence moves, and this process's staged copy of the file keeps
 * nothing of them (wthru.h, kvs_wthru_change).  named: fd is the program's (else the shim's own,
 * for a change by path).  kvs_shim_change_now: one that has been handed to the kernel already (an
 * io_uring write), both at once.  None changes errno.
 */
struct kvs_shim_change {
	struct kvs_wthru_op op;
	struct kvs_fdinfo fi;
	int fd;
	bool on;
	uint64_t first, last; /* the shards it touches */
};
bool kvs_shim_change_before(struct kvs_shim_change *ch, int fd, int64_t off, const int64_t *offp,
			    uint64_t len, bool named);
void kvs_shim_change_after(struct kvs_shim_change *ch, ssize_t ret);
void kvs_shim_change_now(int fd, int64_t off, uint64_t len);
/* kvs_shim_change_before for a truncation of fd to len (ftruncate, by descriptor): every byte
 * from the lesser of the file's size now and len on changes (a cut, or the zeros of a growth
 * after a partial last shard).  One fstat for a descriptor not known to be another file. */
bool kvs_shim_truncate_before(struct kvs_shim_change *ch, int fd, int64_t len);
/* The same by path (truncate, SYS_truncate): the file looked at through a descriptor of the
 * shim's own (O_PATH), returned (or -1: nothing to do) for kvs_shim_truncate_path_after, which
 * takes the real call's result and closes it. */
int kvs_shim_truncate_path_before(struct kvs_shim_change *ch, const char *path, int64_t len);
void kvs_shim_truncate_path_after(struct kvs_shim_change *ch, int fd, int ret);
void kvs_shim_truncated(struct wt_file *f, int fd, struct kvs_wtok *tok, int ret);
/* mmap of len bytes of fd at off with prot and flags succeeded at addr: a KV file mapped
 * MAP_SHARED through a descriptor that can write keeps nothing of write-through while the
 * mapping lives (wthru.h, kvs_wthru_mapped), and is a write in flight on the node until it is
 * unmapped (shmap.h: no load of the file is kept meanwhile); mapped with PROT_WRITE, the range
 * is a change of the file now (kvs_shim_change_now: its shards dropped, a write-once file that
 * held data there counted as rewritten).  Never changes errno. */
void kvs_shim_mapped(const void *addr, int fd, int prot, int flags, int64_t off, uint64_t len);

/* What the shim sees but does not serve, counted (stat unserved_*) and said once at info:
 * a read shorter than files.min_read of a KV file (only in a process that has mapped the
 * region; one load for a descriptor known not to be one, one look at a descriptor not yet
 * classified); a mapping of fd (mmap hook).  None changes errno or fails. */
void kvs_shim_note_small(int fd, size_t len);
void kvs_shim_note_mmap(int fd, uint64_t len);
/* An fread of len bytes of fd's stream that cannot be served (bytes to write, ungetc'd bytes,
 * wide): counted as unserved_stdio when fd is a KV file.  Never changes errno. */
void kvs_shim_note_stdio(int fd, uint64_t len);
/* A read of len bytes at off of fd (-1: a registered file the shim cannot name; len 0: not
 * known) through an io_uring that the shim passes through: counted as unserved_io_uring when
 * fd is a KV file.  The cause is said by the caller.  Never changes errno. */
void kvs_shim_note_uring_unserved(int fd, uint64_t off, uint64_t len);
/* A cuFileReadAsync of len bytes at off of fd passed to the real library because its stream
 * does not fix its parameters: counted as unserved_stream when fd is a KV file.  Never changes
 * errno. */
void kvs_shim_note_stream(int fd, uint64_t off, uint64_t len);

/* cuda.cufile_library, the configuration loaded first if need be; "libcufile.so.0" while
 * another thread loads it, or when the key is empty (never "": dlopen("") is the program). */
const char *kvs_shim_cufile_library(void);

/* True when a read of len bytes could be served (the shim is on and len >= files.min_read);
 * the cheap test every hook makes before anything else. */
bool kvs_shim_wants(size_t len);

/* Enter the shim's own code from a hook that does more than the real call: false (do nothing
 * more) when the shim is off or this thread is inside the shim already (a libc call of its
 * own, a signal handler that interrupted it); else errno is saved into *saved_errno and the
 * guard raised (kvs_shim_in) until kvs_shim_out(*saved_errno), which restores both. */
bool kvs_shim_enter(int *saved_errno);

/* The region, mapped on first use without starting the loader (it takes a process-table
 * slot), created if absent when create; NULL when it cannot be mapped, or (create false) does
 * not exist.  The caller holds the guard (kvs_shim_enter). */
struct kvs_cache *kvs_shim_region(bool create);

/* The recursion guard: guard.h. */

/* Copy n bytes of the program's memory at src to dst as the kernel reads it (process_vm_readv
 * on this process): false where the kernel would answer EFAULT, dst then undefined.  One
 * system call (about 1.5 us): for arrays of KV calls, never on every call. */
bool kvs_shim_copy_in(void *dst, const void *src, size_t n);

/* The program's iovec array iov, read as the kernel reads it (kvs_shim_copy_in): the bytes it
 * describes in *len, and the array to use from here on: local (iovcnt <= KVS_IOV_LOCAL: a
 * copy, which the program can no longer change or unmap under the shim), or iov itself, read
 * whole once (a longer one, in pieces through local).  NULL where the kernel refuses the array
 * (unreadable: EFAULT; iovcnt outside [1, IOV_MAX], a total past SSIZE_MAX: EINVAL), for the
 * real call to say so.  errno unchanged. */
const struct iovec *kvs_shim_iov_read(const struct iovec *iov, int iovcnt, struct iovec *local,
				      uint64_t *len);

#endif
