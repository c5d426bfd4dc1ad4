/*
 * maplock: which files a process of the node can store into through a writable shared mapping
 * (kvs_cache_map_hold, _release, _busy in cache.h).
 *
 * DESIGN
 *
 * One byte per file class, KVS_MAPLOCK_BASE + hash(dev, ino) % KVS_MAPLOCK_BYTES, of the
 * region's file, far past the process table's liveness bytes (proc.c) and the populating
 * walk's (layout.h).  A process holding a writable shared mapping of a file holds a read
 * lock (F_OFD_SETLK, F_RDLCK) on the file's byte through the region's descriptor; any number
 * of processes may hold it at once.  Whether the file is mapped so anywhere on the node is one
 * F_OFD_GETLK of a write lock on that byte: another process's read lock conflicts with it.
 *
 *   who writes what          a process's own holds: maplock_n[byte] (process memory, under
 *                            maplock_mu), the lock taken at 0 -> 1, dropped at 1 -> 0 (OFD
 *                            locks of one description merge: the count is what keeps a second
 *                            mapping of the same file covered when the first goes)
 *   what a reader may see    a lock taken before its look, or not yet; its own holds from its
 *                            counts (F_OFD_GETLK never reports the caller's own description)
 *   a process dies           the kernel drops its locks with its last descriptor of the
 *                            region's file description: nothing to repair, nothing left held
 *   a fork                   the child shares the parent's description, so the parent's locks
 *                            cover the child's inherited mappings until the parent drops them;
 *                            the child's handle starts with no counts (it is a new handle)
 *
 * Two files on one byte make each other look mapped: a load that is not kept, never one kept
 * wrongly.  A look that fails (no descriptor, an error) answers busy.
 */
#include <errno.h>
#include <fcntl.h>

#include "internal.h"
#include "sys.h"

static uint32_t map_byte(uint64_t dev, uint64_t ino)
{
	return (uint32_t)(kvs_hash_file(dev, ino) % KVS_MAPLOCK_BYTES);
}

/* F_OFD_SETLK (type) or F_OFD_GETLK of the byte; 0 or -errno, *seen the lock found. */
static int map_lock(struct kvs_cache *c, int cmd, short type, uint32_t byte, short *seen)
{
	struct flock fl = {.l_type = type,
			   .l_whence = SEEK_SET,
			   .l_start = (off_t)(KVS_MAPLOCK_BASE + byte),
			   .l_len = 1};
	unsigned int ticket;
	int fd = kvs_ownfd_get(&c->own, &ticket), r = 0;

	if (fd < 0)
		return -EBADF;
	if (kvs_sys_fcntl(fd, cmd, &fl) < 0)
		r = -errno;
	kvs_ownfd_put(&c->own, ticket);
	if (!r && seen)
		*seen = fl.l_type;
	return r;
}

int kvs_cache_map_hold(struct kvs_cache *c, uint64_t dev, uint64_t ino)
{
	uint32_t b = map_byte(dev, ino);
	int r = 0;

	pthread_mutex_lock(&c->maplock_mu);
	if (c->maplock_n[b] == UINT16_MAX)
		r = -EOVERFLOW;
	else if (c->maplock_n[b] == 0)
		r = map_lock(c, F_OFD_SETLK, F_RDLCK, b, NULL);
	if (!r)
		store_relaxed(&c->maplock_n[b], (uint16_t)(c->maplock_n[b] + 1));
	pthread_mutex_unlock(&c->maplock_mu);
	return r;
}

void kvs_cache_map_release(struct kvs_cache *c, uint64_t dev, uint64_t ino)
{
	uint32_t b = map_byte(dev, ino);

	pthread_mutex_lock(&c->maplock_mu);
	if (c->maplock_n[b] == 1)
		map_lock(c, F_OFD_SETLK, F_UNLCK, b, NULL);
	if (c->maplock_n[b])
		store_relaxed(&c->maplock_n[b], (uint16_t)(c->maplock_n[b] - 1));
	pthread_mutex_unlock(&c->maplock_mu);
}

bool kvs_cache_map_busy(struct kvs_cache *c, uint64_t dev, uint64_t ino)
{
	uint32_t b = map_byte(dev, ino);
	short seen = F_UNLCK;

	if (load_relaxed(&c->maplock_n[b]))
		return true; /* this process's own */
	return map_lock(c, F_OFD_GETLK, F_WRLCK, b, &seen) != 0 || seen != F_UNLCK;
}
