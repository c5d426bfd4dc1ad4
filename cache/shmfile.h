/*
 * shmfile: the region's file: its path, the trust-checked open of what is at it, and the
 * creation of a new one that no process can see half-built (an unnamed file, or one with an
 * unguessable name) and its publication under the path.  Private to cache/ (region.c,
 * shmfile.c); the essay at the top of region.c says why ("Trust", "Publication").
 */
#ifndef KVS_CACHE_SHMFILE_H
#define KVS_CACHE_SHMFILE_H

#include <stdbool.h>
#include <stddef.h>

/* Create an unnamed file in dirfd's directory, or where the file system cannot, a file with
 * an unguessable name (written to name); -errno on failure. */
int kvs_shm_open_unnamed(int dirfd, const char *path, char *name, size_t namelen);

/* Give the built file fd (named name, or unnamed if name is "") the region's path, replacing
 * what is there only if replace (cache.on_mismatch = rebuild; the caller checked what it
 * replaces).  0, -EEXIST when another creator won, or -errno. */
int kvs_shm_publish(int fd, const char *name, const char *path, bool replace);

struct kvs_memory;
struct kvs_cache_params;

/* Open the directory of the region path (O_DIRECTORY, into dir) and tell what memory its file
 * system gives (pages.c).  The directory's descriptor, or -errno with one line in msg. */
int kvs_shm_open_dir(const char *path, const struct kvs_cache_params *cfg, char *dir, size_t dirlen,
		     struct kvs_memory *mem, char *msg, size_t msglen);

#endif
