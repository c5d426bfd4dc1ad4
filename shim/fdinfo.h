/*
 * fdinfo: is this descriptor a KV file, which block is it, and how may it be read?
 *
 * A descriptor is a KV file when statx says it is a regular file and its path (from
 * /proc/self/fd) lies under one of files.roots.  That class is decided once per descriptor and
 * holds until the number is closed or replaced (kvs_fdinfo_forget, called by the close, dup2,
 * dup3, close_range and fclose hooks): a descriptor known not to be a KV file costs no system
 * call.  For a KV file every look re-reads its identity (cache.h, struct kvs_ident: by change,
 * or by birth under a files.write_once root) and gives the block id of what it holds now.
 * The protocol of the table is the essay at the top of fdinfo.c.
 *
 * kvs_fdinfo_forget, _forget_range, _hint_kv and _not_kv are atomics only, async-signal-safe.
 * A look (kvs_fdinfo_get, _known) makes system calls, and the first look of a write-once root
 * on a file system without a generation says so once (a formatted line): a served read from a
 * signal handler relies on the looks before it.  The descriptors the loader reads through are
 * anchor.h's.
 */
#ifndef KVS_SHIM_FDINFO_H
#define KVS_SHIM_FDINFO_H

#include <stdbool.h>
#include <stdint.h>

#include "cache.h"

/* A mount's rule for atime at a read (statfs f_flags): noatime, relatime (the default: when
 * atime is older than mtime or ctime, or a day old), strictatime (every read). */
enum { KVS_ATIME_NEVER, KVS_ATIME_RELATIME, KVS_ATIME_STRICT };

struct kvs_fdinfo {
	bool kv;
	bool write_once;	/* keyed by birth: a files.write_once root that gives an id */
	bool direct;		/* O_DIRECT is set on the descriptor now */
	bool append;		/* O_APPEND is set on the descriptor now */
	bool readable;		/* opened for reading (not O_WRONLY, not O_PATH) */
	struct kvs_key block;	/* valid when kv */
	uint64_t dev, ino;	/* st_dev, st_ino */
	uint64_t size;		/* st_size now */
	uint64_t changed_ns;	/* the later of st_mtim and st_ctim, ns since the epoch */
	uint64_t settle_ns;	/* files.settle for this file (0 when write_once) */
	bool node_clock;	/* its file system's stamps may come from another machine's clock */
	int atime_rule;		/* the mount's: KVS_ATIME_NEVER, _RELATIME or _STRICT */
	bool atime_due;		/* a read now would move its atime (kvs_fdinfo_atime_due) */
	uint32_t dio_mem_align; /* O_DIRECT alignment of buffers */
	uint32_t dio_off_align; /* O_DIRECT alignment of offsets and lengths */
	bool dio_zero_tail;	/* a short O_DIRECT read zeroes the rest of the buffers */
	int root;		/* which of files.roots it lies under (kvs_fdinfo_root) */
};

/* Set the roots (colon-separated directories; each is canonicalised, missing ones dropped).
 * Returns the number of usable roots. */
int kvs_fdinfo_set_roots(const char *roots);

/* Root i of files.roots as canonicalised, or NULL past the last. */
const char *kvs_fdinfo_root(int i);

/* Set the write-once roots (files.write_once, the same form).  Returns how many are usable. */
int kvs_fdinfo_set_write_once(const char *dirs);

/* Is a file on device dev outside every root, by its device alone (no root on it, and no mount
 * below a root)?  False when it may be under one, or the devices are not known.  No system
 * call. */
bool kvs_fdinfo_dev_outside(uint64_t dev);

/*
 * Files on a root's file system found under no root by a touch's look by path (touch.c), as
 * a hash of (dev, ino) in a small set-associative table: their next touch costs the statx
 * alone, not the open, readlink, fstat and close.  A rename by this process forgets them all
 * (the file may have moved under a root: kvs_fdinfo_outside_forget, from kvs_shim_renamed); a
 * rename or link by another process, a bind mount, or an inode number reused is not seen, and
 * such a file's touches are then not followed: a miss after each, never a stale byte
 * (touch.h).  Only for that: a wrong entry must cost no more than a miss.  Atomics only.
 */
bool kvs_fdinfo_outside_known(uint64_t dev, uint64_t ino);
void kvs_fdinfo_outside_note(uint64_t dev, uint64_t ino);
void kvs_fdinfo_outside_forget(void);

/* Descriptor numbers a cuFile handle registered through the shim names (api/cufile.c counts them,
 * under its handles' lock; one relaxed load to ask; a number that had 255 handles at once
 * stays registered).  In observe mode a POSIX read of such a descriptor is libcufile's own,
 * moving the bytes of a cuFile read already observed (compatibility mode), and is not
 * observed again (serve.c). */
void kvs_fdinfo_cufile_ref(int fd, bool up);
bool kvs_fdinfo_cufile_registered(int fd);

/* fd was just opened: its class by its path alone (one readlink), NOT_KV when the path lies
 * under no root.  Returns the root it lies under, -1 (outside every root: NOT_KV stored), or -2
 * (not looked at: no roots, no path, a number beyond the table). */
int kvs_fdinfo_opened(int fd);

/* Is any write-once root configured (one load)? */
bool kvs_fdinfo_any_write_once(void);

/* Set files.settle in milliseconds, or -1 for the default of each file system type
 * (docs/operations.md has the table). */
void kvs_fdinfo_set_settle(int64_t ms);

/* Describe fd.  Returns 0 (fi->kv says whether it is a KV file; for a descriptor known not to
 * be one nothing else is filled, and no system call is made), or -errno when statx/fcntl fail
 * (then the caller passes through). */
int kvs_fdinfo_get(int fd, struct kvs_fdinfo *out);

/* Describe fd only if it is known as a KV file (no path lookup).  Returns 0 when fd is a known
 * KV file, -ENOENT otherwise. */
int kvs_fdinfo_known(int fd, struct kvs_fdinfo *out);

/* Would a read now move the atime of the file id describes, on a mount of that rule?  Under
 * strictatime: once it is a second old (a read a second moves it, as near as the shim keeps). */
bool kvs_fdinfo_atime_due(int rule, const struct kvs_ident *id);

/* Is fd known as a KV file / known not to be one?  One load, no system call. */
bool kvs_fdinfo_hint_kv(int fd);
bool kvs_fdinfo_not_kv(int fd);

/* The program closed or replaced fd (close, dup2, dup3, fclose), or [lo, hi] (close_range):
 * whatever was known of those numbers is forgotten.  Atomics only, async-signal-safe. */
void kvs_fdinfo_forget(int fd);
void kvs_fdinfo_forget_range(unsigned int lo, unsigned int hi);

#endif
