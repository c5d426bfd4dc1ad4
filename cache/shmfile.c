/*
 * shmfile: see shmfile.h; and kvs_cache_path, kvs_cache_distrust and kvs_cache_open_file
 * (cache.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "raw.h"
#include "shmfile.h"

bool kvs_region_test_no_tmpfile;

int kvs_cache_path(const struct kvs_cache_params *cfg, char *buf, size_t len)
{
	const char *dir = cfg->dir && *cfg->dir ? cfg->dir : "/dev/shm";
	size_t dlen = strlen(dir);

	while (dlen > 1 && dir[dlen - 1] == '/')
		dlen--; /* "/dev/shm/" names the directory "/dev/shm" */
	/* The effective uid: the one that owns what this process creates, and that trust is
	 * checked against. */
	int n = snprintf(buf, len, "%.*s/kvshim.%u.%s", (int)dlen, dlen == 1 ? "" : dir,
			 (unsigned)geteuid(), cfg->name);

	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static const char *kind_of(mode_t m)
{
	switch (m & S_IFMT) {
	case S_IFREG:
		return "a regular file";
	case S_IFDIR:
		return "a directory";
	case S_IFIFO:
		return "a FIFO";
	case S_IFCHR:
		return "a character device";
	case S_IFBLK:
		return "a block device";
	case S_IFSOCK:
		return "a socket";
	case S_IFLNK:
		return "a symbolic link";
	default:
		return "of an unknown type";
	}
}

bool kvs_cache_distrust(const struct stat *st, uint32_t mode, char *why, size_t len)
{
	uid_t me = geteuid();

	if (!S_ISREG(st->st_mode))
		snprintf(why, len, "is %s, not a regular file", kind_of(st->st_mode));
	else if (st->st_uid != me)
		snprintf(why, len, "owned by uid %u, not %u", (unsigned)st->st_uid, (unsigned)me);
	else if (st->st_nlink != 1)
		snprintf(why, len, "has %lu links", (unsigned long)st->st_nlink);
	else if ((st->st_mode & 07777) & ~(mode_t)mode)
		snprintf(why, len, "mode %04o is wider than cache.mode %04o",
			 (unsigned)(st->st_mode & 07777), (unsigned)mode);
	else
		return false;
	return true;
}

int kvs_cache_open_file(const char *path, int oflags, uint32_t mode, char *msg, size_t msglen)
{
	char why[96];
	struct stat st;
	int fd, r;

	/* O_NONBLOCK: a FIFO or a device at the path must not block the open. */
	fd = kvs_sys_open(path, oflags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		r = -errno;
		if (r == -ELOOP) {
			snprintf(msg, msglen, "refusing %s: is a symbolic link", path);
			return -EPERM;
		}
		if (r != -ENOENT)
			snprintf(msg, msglen, "cannot open %s: %s", path, strerror(-r));
		return r;
	}
	if (fstat(fd, &st) < 0) {
		r = -errno;
		snprintf(msg, msglen, "cannot stat %s: %s", path, strerror(-r));
		goto err_close;
	}
	if (kvs_cache_distrust(&st, mode, why, sizeof(why))) {
		snprintf(msg, msglen, "refusing %s: %s (`kvshim reset` removes it)", path, why);
		r = -EPERM;
		goto err_close;
	}
	/* A regular file: blocking mode is irrelevant to it, but leave nothing unusual set. */
	if (kvs_sys_fcntl(fd, F_SETFL, kvs_sys_fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0) {
		r = -errno;
		goto err_close;
	}
	return fd;

err_close:
	kvs_sys_close(fd);
	return r;
}

/* Create an unnamed file in dirfd's directory, or where the file system cannot, a file with
 * an unguessable name (written to name); -errno on failure. */
int kvs_shm_open_unnamed(int dirfd, const char *path, char *name, size_t namelen)
{
	unsigned char rnd[16];
	int fd, n;

	name[0] = '\0';
	if (!kvs_region_test_no_tmpfile) {
		fd = kvs_sys_openat(dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
		if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL))
			return fd >= 0 ? fd : -errno;
	}
	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
		return -EAGAIN;
	n = snprintf(name, namelen, "%s.build.%d.", path, (int)getpid());
	for (size_t i = 0; i < sizeof(rnd) && n > 0 && (size_t)n + 2 < namelen; i++)
		n += snprintf(name + n, namelen - (size_t)n, "%02x", rnd[i]);
	fd = kvs_sys_open(name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		fd = -errno;
		name[0] = '\0';
	}
	return fd;
}

/* Give the built file fd (named name, or unnamed if name is "") the region's path, replacing
 * what is there only if replace (cache.on_mismatch = rebuild; the caller checked what it
 * replaces).  0, -EEXIST when another creator won, or -errno. */
int kvs_shm_publish(int fd, const char *name, const char *path, bool replace)
{
	char self[32], tmp[300];
	unsigned char rnd[8];
	int n;

	if (replace) {
		if (*name) /* a named build: rename it over the region */
			return kvs_sys_rename(name, path) ? -errno : 0;
		/* Unnamed: a name of its own first, which rename then moves over the region. */
		if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
			return -EAGAIN;
		n = snprintf(tmp, sizeof(tmp), "%s.build.%d.", path, (int)getpid());
		for (size_t i = 0; i < sizeof(rnd) && n > 0 && (size_t)n + 2 < sizeof(tmp); i++)
			n += snprintf(tmp + n, sizeof(tmp) - (size_t)n, "%02x", rnd[i]);
		snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
		if (linkat(AT_FDCWD, self, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW) < 0)
			return -errno;
		if (kvs_sys_rename(tmp, path) < 0) {
			int r = -errno;

			unlink(tmp);
			return r;
		}
		return 0;
	}
	if (!*name) {
		snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
		return linkat(AT_FDCWD, self, AT_FDCWD, path, AT_SYMLINK_FOLLOW) ? -errno : 0;
	}
	if (kvs_sys_renameat2(AT_FDCWD, name, AT_FDCWD, path, RENAME_NOREPLACE) == 0)
		return 0;
	if (errno != EINVAL && errno != ENOSYS)
		return -errno;
	/* No RENAME_NOREPLACE either: link, then unlink (two links meanwhile: an attacher in
	 * that window refuses it and reads storage once). */
	if (link(name, path) < 0)
		return -errno;
	unlink(name);
	return 0;
}

int kvs_shm_open_dir(const char *path, const struct kvs_cache_params *cfg, char *dir, size_t dirlen,
		     struct kvs_memory *mem, char *msg, size_t msglen)
{
	const char *slash = strrchr(path, '/');
	int dirfd, r;

	snprintf(dir, dirlen, "%.*s", slash && slash != path ? (int)(slash - path) : 1,
		 slash && slash != path ? path : "/");
	dirfd = kvs_sys_open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0) {
		r = -errno;
		snprintf(msg, msglen, "cannot open %s (cache.dir): %s", dir, strerror(-r));
		return r;
	}
	r = kvs_memory_probe(dirfd, cfg->huge_pages, mem);
	if (r) {
		snprintf(msg, msglen, "cannot tell what memory %s (cache.dir) gives: %s", dir,
			 strerror(-r));
		kvs_sys_close(dirfd);
		return r;
	}
	return dirfd;
}
