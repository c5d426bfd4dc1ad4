/*
 * key: a file's identity, and the block id the cache keys its shards by.
 *
 * Every process on the node hashes the same identity of the same file to the same id, and a
 * file whose bytes may have changed gets a new id, so stale shards are never found.  Two
 * schemes (docs/design.md, "Keys"):
 *
 *   by change (the default): st_dev, st_ino, st_size, st_mtim, st_ctim.  Any write moves
 *   mtime or ctime, so it moves the id; so does a touch, chmod or rename, which change no
 *   byte (hooks/time.c moves the shards of a touch by a process under the shim).
 *
 *   by birth (files.write_once roots): st_dev, st_ino, st_size, the birth time
 *   (statx STATX_BTIME) and the inode generation (FS_IOC_GETVERSION).  A file there is
 *   written once, complete before any reader opens it, and never rewritten in place:
 *   touches, chmod, renames and atime do not move its id, and a file deleted and created
 *   again gets a new one even with the inode number, size and timestamp tick of the old (the
 *   generation is drawn at random by ext4 and XFS at every inode allocation; btrfs numbers
 *   inodes anew while mounted).  A file system that gives no generation cannot tell a new
 *   file from an old one of the same size, but for tmpfs, which never reuses a number (birth
 *   time alone): its files are keyed by change, and the caller says so (kvs_ident.write_once
 *   stays false).
 *
 * The two schemes hash different words behind different tags, so their ids never meet.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/sysmacros.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cache.h"
#include "raw.h"

void kvs_block_id(const struct stat *st, struct kvs_key *out)
{
	struct kvs_ident id;

	kvs_ident_from_stat(st, &id);
	kvs_ident_key(&id, out);
}

static struct kvs_time ts(int64_t sec, uint32_t nsec)
{
	return (struct kvs_time){sec, nsec};
}

/* statx, or fstat where the kernel or libc has none (no birth time then). */
static int stat_fd(int fd, struct kvs_ident *id)
{
#ifdef STATX_BTIME
	struct statx sx;

	if (statx(fd, "", AT_EMPTY_PATH, STATX_BASIC_STATS | STATX_BTIME, &sx) == 0) {
		id->dev = (uint64_t)makedev(sx.stx_dev_major, sx.stx_dev_minor);
		id->ino = sx.stx_ino;
		id->size = sx.stx_size;
		id->mode = sx.stx_mode;
		id->mtime = ts(sx.stx_mtime.tv_sec, sx.stx_mtime.tv_nsec);
		id->ctime = ts(sx.stx_ctime.tv_sec, sx.stx_ctime.tv_nsec);
		id->atime = ts(sx.stx_atime.tv_sec, sx.stx_atime.tv_nsec);
		id->has_btime = (sx.stx_mask & STATX_BTIME) != 0;
		if (id->has_btime)
			id->btime = ts(sx.stx_btime.tv_sec, sx.stx_btime.tv_nsec);
		return 0;
	}
	/* No statx here (an old kernel, or a seccomp filter that refuses it): fstat. */
	if (errno != ENOSYS && errno != EINVAL && errno != EPERM)
		return -errno;
#endif
	struct stat st;

	if (fstat(fd, &st) < 0)
		return -errno;
	kvs_ident_from_stat(&st, id);
	return 0;
}

void kvs_ident_from_stat(const struct stat *st, struct kvs_ident *id)
{
	memset(id, 0, sizeof(*id));
	id->dev = (uint64_t)st->st_dev;
	id->ino = (uint64_t)st->st_ino;
	id->size = (uint64_t)st->st_size;
	id->mode = (uint32_t)st->st_mode;
	id->mtime = ts(st->st_mtim.tv_sec, (uint32_t)st->st_mtim.tv_nsec);
	id->ctime = ts(st->st_ctim.tv_sec, (uint32_t)st->st_ctim.tv_nsec);
	id->atime = ts(st->st_atim.tv_sec, (uint32_t)st->st_atim.tv_nsec);
}

int kvs_ident_generation(int fd, struct kvs_ident *id)
{
	unsigned int gen = 0; /* FS_IOC_GETVERSION writes an int, whatever its name says */

	id->has_gen = false;
	id->gen = 0;
	if (ioctl(fd, FS_IOC_GETVERSION, &gen) != 0) {
		/* An O_PATH descriptor (the shim's looks at a path) answers EBADF: ask through a
		 * descriptor of the same inode opened for reading from it. */
		char link[64];
		int e = errno, rfd;

		if (e != EBADF)
			return -e;
		snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
		rfd = kvs_sys_openat(AT_FDCWD, link, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
		if (rfd < 0)
			return -e;
		int r = ioctl(rfd, FS_IOC_GETVERSION, &gen);
		e = errno;
		kvs_sys_close(rfd);
		if (r != 0)
			return -e;
	}
	id->has_gen = true;
	id->gen = gen;
	return 0;
}

/*
 * Without a generation, a birth time alone cannot tell a file from one created again in the
 * same timestamp tick on a reused inode number (overlayfs, NFS and FUSE give no generation,
 * and reuse numbers; measured: the same inode and birth time in 4837 of 5000 cycles of create,
 * unlink, create on overlayfs).  tmpfs hands out each number once per boot, so there the birth
 * time is enough; everywhere else such a file is keyed by change.
 */
bool kvs_ident_by_birth(const struct kvs_ident *id, unsigned long fs_type)
{
	return id->has_gen || (id->has_btime && fs_type == 0x01021994); /* tmpfs */
}

static unsigned long fs_type_of(int fd)
{
	struct statfs sf;

	return fstatfs(fd, &sf) == 0 ? (unsigned long)sf.f_type : 0;
}

int kvs_ident_of_fd(int fd, bool write_once, struct kvs_ident *id)
{
	memset(id, 0, sizeof(*id));
	int r = stat_fd(fd, id);

	if (r)
		return r;
	if (write_once && S_ISREG(id->mode))
		kvs_ident_generation(fd, id);
	id->write_once = write_once && (id->has_gen || kvs_ident_by_birth(id, fs_type_of(fd)));
	return 0;
}

void kvs_ident_key(const struct kvs_ident *id, struct kvs_key *out)
{
	if (!id->write_once) {
		/* The words and order of kvs_block_id, so that both give one id for one file. */
		uint64_t f[7] = {id->dev,	 id->ino,
				 id->size,	 (uint64_t)id->mtime.sec,
				 id->mtime.nsec, (uint64_t)id->ctime.sec,
				 id->ctime.nsec};
		XXH128_hash_t h = XXH3_128bits(f, sizeof(f));

		out->block_lo = h.low64;
		out->block_hi = h.high64;
	} else {
		uint64_t f[7] = {0x6b76732d6f6e6365ull, /* "kvs-once": never a by-change id */
				 id->dev,
				 id->ino,
				 id->size,
				 id->has_btime ? (uint64_t)id->btime.sec : UINT64_MAX,
				 id->has_btime ? id->btime.nsec : UINT64_MAX,
				 id->has_gen ? id->gen : UINT64_MAX};
		XXH128_hash_t h = XXH3_128bits(f, sizeof(f));

		out->block_lo = h.low64;
		out->block_hi = h.high64;
	}
	out->shard = 0;
}

bool kvs_ident_same(const struct kvs_ident *a, const struct kvs_ident *b)
{
	if (a->dev != b->dev || a->ino != b->ino || a->size != b->size ||
	    a->write_once != b->write_once)
		return false;
	if (a->write_once)
		return a->has_btime == b->has_btime && kvs_time_eq(a->btime, b->btime) &&
		       a->has_gen == b->has_gen && a->gen == b->gen;
	return kvs_time_eq(a->mtime, b->mtime) && kvs_time_eq(a->ctime, b->ctime);
}
