/*
 * wthru_map: files this process maps shared and writable, for write-through (see wthru.c,
 * DESIGN, and "shared mappings" below).  It sits on wthru_state.c (wt_on, wt_mu, the staged
 * files) and is called by the mmap hook (kvs_wthru_mapped), the writes (wthru.c:
 * wt_mapped_locked) and the publication (wthru_publish.c: wt_mapped_now); it calls nothing
 * above it.
 *
 * STATE
 *
 * maps, nmaps and maps_full are written and read under wt_mu, by any thread (the mmap hook,
 * the writes, the publications).  maps_hint (nmaps + maps_full) is written under wt_mu, read
 * under it by wt_mapped_locked and without it by wt_mapped_now (one relaxed load, so that a
 * process that maps nothing shared and writable neither takes the lock nor reads
 * /proc/self/maps at publication; a record made after that load is not seen by that
 * publication).  /proc/self/maps is read without wt_mu.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "atomics.h"
#include "raw.h"
#include "wthru_int.h"

/* ------------------------------------------------------------------ shared mappings */

/*
 * Stores through a writable MAP_SHARED mapping change a file with no call the shim sees (and,
 * once its page is writable, with no new timestamp).  The mmap hook records the file
 * (kvs_wthru_mapped): a staged copy of it is poisoned then, and so is every write of it
 * staged while the record stands, and its publication is refused.  A publication that finds no
 * shared mapping of the file left in /proc/self/maps drops the record (the one look that
 * costs: a read of that file, at the publication of a file mapped that way); a record made
 * where /proc/self/maps does not name the file as fstat does (overlayfs, no /proc) is never
 * dropped, nor are records past KVS_WT_MAPS (maps_full: no file is published again).
 */
struct wt_map {
	uint64_t dev, ino;
	uint32_t gen; /* moved by every mapping of the file made */
	bool sticky;  /* /proc/self/maps does not show it: never dropped */
};

static struct wt_map maps[KVS_WT_MAPS]; /* under wt_mu */
static int nmaps;
static bool maps_full;
static _Atomic int maps_hint; /* nmaps + maps_full, written under wt_mu, read by anyone */

static int map_find_locked(uint64_t dev, uint64_t ino)
{
	for (int i = 0; i < nmaps; i++)
		if (maps[i].dev == dev && maps[i].ino == ino)
			return i;
	return -1;
}

/* Is (dev, ino) mapped by this process in a mapping /proc/self/maps marks shared?  Hex, then
 * decimal, parsed here (no stdio: this runs in close).  1 yes, 0 no, -1 cannot tell. */
static int maps_has(uint64_t dev, uint64_t ino)
{
	char buf[4096];
	size_t have = 0;
	int fd = kvs_sys_open("/proc/self/maps", O_RDONLY | O_CLOEXEC), found = 0;

	if (fd < 0)
		return -1;
	for (;;) {
		ssize_t n = kvs_sys_read(fd, buf + have, sizeof(buf) - have);

		if (n <= 0) {
			found = n < 0 ? -1 : found;
			break;
		}
		have += (size_t)n;
		char *line = buf, *nl;
		while (!found && (nl = memchr(line, '\n', have - (size_t)(line - buf)))) {
			/* "start-end perms offset maj:min inode path" */
			char *p = line;
			int field = 0;
			uint64_t v[3] = {0, 0, 0}; /* major, minor, inode */
			bool shared = false;
			for (; p < nl && field < 5; p++) {
				if (*p == ' ') {
					field++;
					continue;
				}
				if (field == 1 && p - line > 0 && p[1] == ' ')
					shared = *p == 's'; /* the fourth letter of "rw-s" */
				if (field == 3 && *p == ':')
					v[0] = v[1], v[1] = 0;
				else if (field == 3)
					v[1] =
					    v[1] * 16 +
					    (uint64_t)(*p <= '9' ? *p - '0' : (*p | 32) - 'a' + 10);
				else if (field == 4)
					v[2] = v[2] * 10 + (uint64_t)(*p - '0');
			}
			found = shared && v[0] == major(dev) && v[1] == minor(dev) && v[2] == ino;
			line = nl + 1;
		}
		if (found)
			break;
		have -= (size_t)(line - buf);
		memmove(buf, line, have);
		/* A line longer than the buffer (a long path): not one this can read. */
		if (have == sizeof(buf))
			have = 0;
	}
	kvs_sys_close(fd);
	return found;
}

void kvs_wthru_mapped(uint64_t dev, uint64_t ino)
{
	if (!wt_on)
		return;
	int seen = maps_has(dev, ino);
	pthread_mutex_lock(&wt_mu);
	int i = map_find_locked(dev, ino);
	if (i < 0 && nmaps < KVS_WT_MAPS) {
		i = nmaps++;
		maps[i] = (struct wt_map){.dev = dev, .ino = ino};
	}
	if (i < 0) {
		maps_full = true;
	} else {
		maps[i].gen++;
		maps[i].sticky = maps[i].sticky || seen != 1;
	}
	store_relaxed(&maps_hint, nmaps + maps_full);
	struct wt_file *f = wt_find_locked(dev, ino);
	if (f)
		f->poisoned = true; /* stores may land over what it staged */
	pthread_mutex_unlock(&wt_mu);
}

/* May (dev, ino) be mapped shared and writable by this process now (its publication then keeps
 * nothing)?  A record whose mapping is gone is dropped here (the answer is still yes: the
 * writes staged meanwhile may have met the stores).  Not under wt_mu: it reads a file. */
bool wt_mapped_now(uint64_t dev, uint64_t ino)
{
	if (!load_relaxed(&maps_hint))
		return false;
	pthread_mutex_lock(&wt_mu);
	int i = map_find_locked(dev, ino);
	bool keep = maps_full || i < 0 || maps[i].sticky;
	uint32_t gen = i >= 0 ? maps[i].gen : 0;
	pthread_mutex_unlock(&wt_mu);
	if (i < 0 && !maps_full)
		return false;
	if (keep || maps_has(dev, ino) != 0)
		return true;
	pthread_mutex_lock(&wt_mu);
	i = map_find_locked(dev, ino);
	if (i >= 0 && maps[i].gen == gen) { /* no mapping made since the look */
		maps[i] = maps[--nmaps];
		store_relaxed(&maps_hint, nmaps + maps_full);
	}
	pthread_mutex_unlock(&wt_mu);
	return true;
}

bool wt_mapped_locked(uint64_t dev, uint64_t ino)
{
	return load_relaxed(&maps_hint) && (maps_full || map_find_locked(dev, ino) >= 0);
}
