/*
 * pages: the memory a region lives in.  Which pages the file system of cache.dir gives a
 * region (their size and how they are had), how much of that memory is free, and where on the
 * node its pages go (cache.numa).
 *
 * DESIGN
 *
 * Kinds of pages (enum kvs_page_kind; the creator decides, the header records it, and every
 * process then follows the header, whatever its own configuration says):
 *
 *   base       4 KiB pages: a tmpfs mounted huge=never (/dev/shm's default), any other file
 *              system, or huge=advise with cache.huge_pages = off.
 *   tmpfs      the tmpfs gives every file huge pages of the PMD size (2 MiB on x86_64):
 *              mounted huge=always or huge=within_size (a region is sized before it is
 *              touched, so all of it is within its size), or THP's shmem_enabled = force.
 *              fallocate allocates them whole, without zeroing; the first touch zeroes one.
 *   advise     a tmpfs mounted huge=advise: huge pages only for faults in a mapping with
 *              MADV_HUGEPAGE.  Every process advises its own mapping, and the region's pages
 *              are allocated by faults (MADV_POPULATE_WRITE), never by fallocate, which has
 *              no mapping and would allocate 4 KiB pages for good.
 *   hugetlbfs  a hugetlbfs mount: pages of its own size from the node's pool (vm.nr_hugepages).
 *              The creator's mapping reserves the whole region from the pool (MAP_SHARED
 *              without MAP_NORESERVE), so no later fault can fail for want of a page and none
 *              raises SIGBUS: the free-space checks that tmpfs needs before each allocation do
 *              not apply, and the region's size is checked against the pool once, when it is
 *              built.  Pages are allocated (and zeroed by the kernel) by faults too: hugetlbfs's
 *              fallocate holds the file's lock while it zeroes, one page after the other.
 *              Since the creator reserves before it publishes, creators there take turns
 *              (region.c, lock_creators).
 *
 * THP's shmem_enabled = deny takes huge pages from every tmpfs, and is read as base.
 *
 * Geometry.  The data starts at a multiple of the page size and the file is a whole number of
 * pages (hugetlbfs requires it; on tmpfs it keeps a frame of a multiple of the page size on
 * whole pages).  Frames smaller than a page share one; what is allocated is then the page,
 * and each frame's word in the frame pages says only that its bytes have memory.
 *
 * Placement (cache.numa).  The creator binds the whole mapping (mbind, before any page of the
 * file exists) to the policy, and records it in the header: MPOL_INTERLEAVE over the memory
 * nodes it may use, MPOL_LOCAL, or nothing.  On tmpfs the policy is the file's (a shared
 * policy, kept with the inode): every later allocation, by any process's fault or fallocate,
 * follows it, so the creator's one call places the region.  hugetlbfs keeps no shared policy,
 * so every process that maps the region binds its own mapping the same way, and its pages are
 * allocated through such a mapping.  A failed mbind (a container without CAP_SYS_NICE under
 * the default seccomp profile) leaves the pages where the kernel puts them: the creator says so
 * once where the process may use more than one node, and records no policy.
 *
 * Prefault (cache.prefault; off by default, since it did not win: benchmarks.md).  A thread of
 * an attached process maps the frames holding a READY slot into its page tables
 * (MADV_POPULATE_READ), so its first loads take no fault per page.  It reads the frame pages
 * (acquire) and the slots' state words without a lock: a frame evicted meanwhile costs a
 * mapping, never a wrong byte.  Only frames whose pages exist: a read fault anywhere else would
 * allocate memory past the headroom's check.  It maps through the handle's own mapping, so
 * kvs_cache_close stops it (prefault_stop) and joins it before the mapping goes; a fork child
 * has no such thread.
 *
 * Nothing here writes shared memory: the header fields are written by the creator before
 * publication (region.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/mempolicy.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "config.h"
#include "internal.h"
#include "raw.h"
#include "sys.h"

#define THP_DIR "/sys/kernel/mm/transparent_hugepage/"

/* Bits of the node masks given to the kernel: more than any kernel's MAX_NUMNODES. */
#define NODE_BITS 4096u

/* Read a small file (sysfs, procfs) into buf, NUL-terminated; bytes read, or -errno.  Raw
 * system calls: inside the shim, read is our own hook. */
static ssize_t read_small(const char *path, char *buf, size_t len)
{
	int fd = kvs_sys_open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = kvs_syscall(SYS_read, fd, buf, len - 1);
	if (n < 0)
		n = -errno;
	kvs_sys_close(fd);
	buf[n > 0 ? n : 0] = '\0';
	return n;
}

static uint64_t read_u64(const char *path)
{
	char buf[32];

	return read_small(path, buf, sizeof(buf)) > 0 ? strtoull(buf, NULL, 10) : 0;
}

/* The bracketed choice of a sysfs setting ("always [madvise] never"), into out. */
static void read_choice(const char *path, char *out, size_t len)
{
	char buf[128], *a, *b;

	out[0] = '\0';
	if (read_small(path, buf, sizeof(buf)) <= 0 || !(a = strchr(buf, '[')) ||
	    !(b = strchr(a, ']')))
		return;
	snprintf(out, len, "%.*s", (int)(b - a - 1), a + 1);
}

/*
 * The huge= option of the tmpfs mounted on device dev, from /proc/self/mountinfo (the super
 * options after " - ", which tmpfs lists as ",huge=always" and omits for never), into out:
 * "never" when the mount has none, "" when no mount of dev is listed.
 */
static void tmpfs_huge_option(dev_t dev, char *out, size_t len)
{
	char want[32], *buf, *line, *nl;
	size_t have = 0, cap = 16384;
	int fd;

	out[0] = '\0';
	snprintf(want, sizeof(want), " %u:%u ", major(dev), minor(dev));
	buf = malloc(cap);
	fd = kvs_sys_open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
	if (!buf || fd < 0)
		goto out;
	for (;;) {
		ssize_t n = kvs_syscall(SYS_read, fd, buf + have, cap - 1 - have);

		if (n <= 0)
			break;
		have += (size_t)n;
		buf[have] = '\0';
		/* Whole lines only: the last, partial one waits for the next read. */
		for (line = buf; (nl = strchr(line, '\n')); line = nl + 1) {
			*nl = '\0';
			char *sep = strstr(line, " - "), *opt;

			if (!sep || !strstr(line, want) || strstr(line, want) > sep)
				continue;
			/* " - tmpfs SOURCE rw,size=...,huge=always" */
			opt = strrchr(sep, ' ');
			snprintf(out, len, "never");
			for (char *o = opt ? strstr(opt, "huge=") : NULL; o;
			     o = strstr(o + 1, "huge="))
				if (o[-1] == ',' || o[-1] == ' ')
					snprintf(out, len, "%.*s", (int)strcspn(o + 5, ", "),
						 o + 5);
			goto out;
		}
		have -= (size_t)(line - buf);
		memmove(buf, line, have);
		if (have == cap - 1) /* one line longer than the buffer: skip it */
			have = 0;
	}
out:
	if (fd >= 0)
		kvs_sys_close(fd);
	free(buf);
}

/* The hugetlb pool of pages of size bytes: total, free and reserved pages. */
static void hugetlb_pool(uint64_t size, uint64_t *total, uint64_t *free_p, uint64_t *resv)
{
	char path[128];
	int n = snprintf(path, sizeof(path), "/sys/kernel/mm/hugepages/hugepages-%llukB/",
			 (unsigned long long)(size >> 10));

	snprintf(path + n, sizeof(path) - (size_t)n, "nr_hugepages");
	*total = read_u64(path);
	snprintf(path + n, sizeof(path) - (size_t)n, "free_hugepages");
	*free_p = read_u64(path);
	snprintf(path + n, sizeof(path) - (size_t)n, "resv_hugepages");
	*resv = read_u64(path);
}

/* Free bytes of a hugetlbfs whose statfs is sf: the pool's pages neither used nor reserved,
 * within what a mount of limited size (size=) has left. */
static uint64_t hugetlbfs_free(const struct statfs *sf, struct kvs_memory *m)
{
	uint64_t size = (uint64_t)sf->f_bsize, total, free_p, resv, avail;

	hugetlb_pool(size, &total, &free_p, &resv);
	avail = free_p > resv ? free_p - resv : 0;
	if (m) {
		m->pool_pages = total;
		m->pool_free = avail;
	}
	if (sf->f_blocks > 0 && (uint64_t)sf->f_bavail < avail) {
		avail = (uint64_t)sf->f_bavail;
		if (m)
			m->mount_limited = true;
	}
	return avail * size;
}

static bool page_size_ok(uint64_t s)
{
	return s >= KVS_PAGE && s <= (1ull << 30) && !(s & (s - 1));
}

int kvs_memory_probe(int dirfd, int huge_pages, struct kvs_memory *m)
{
	struct statfs sf;
	struct stat st;

	memset(m, 0, sizeof(*m));
	m->page_size = KVS_PAGE;
	if (fstatfs(dirfd, &sf) < 0 || fstat(dirfd, &st) < 0)
		return -errno;
	m->thp_size = read_u64(THP_DIR "hpage_pmd_size");
	if (m->thp_size && !page_size_ok(m->thp_size))
		m->thp_size = 0;
	read_choice(THP_DIR "shmem_enabled", m->shmem_enabled, sizeof(m->shmem_enabled));
	switch ((unsigned long)sf.f_type) {
	case HUGETLBFS_MAGIC:
		snprintf(m->fs, sizeof(m->fs), "hugetlbfs");
		m->hugetlbfs = true;
		if (!page_size_ok((uint64_t)sf.f_bsize))
			return -EOPNOTSUPP;
		m->kind = KVS_PAGE_HUGETLBFS;
		m->page_size = (uint64_t)sf.f_bsize;
		m->free_bytes = hugetlbfs_free(&sf, m);
		return 0;
	case TMPFS_MAGIC:
		snprintf(m->fs, sizeof(m->fs), "tmpfs");
		m->tmpfs = true;
		tmpfs_huge_option(st.st_dev, m->huge, sizeof(m->huge));
		break;
	default:
		snprintf(m->fs, sizeof(m->fs), "0x%lx", (unsigned long)sf.f_type);
		break;
	}
	m->free_bytes = (uint64_t)sf.f_bavail * (uint64_t)sf.f_frsize;
	if (!m->tmpfs || !m->thp_size || !strcmp(m->shmem_enabled, "deny"))
		return 0;
	if (!strcmp(m->shmem_enabled, "force") || !strcmp(m->huge, "always") ||
	    !strcmp(m->huge, "within_size"))
		m->kind = KVS_PAGE_TMPFS;
	else if (!strcmp(m->huge, "advise") && huge_pages != KVS_HUGE_OFF)
		m->kind = KVS_PAGE_ADVISE;
	if (m->kind != KVS_PAGE_BASE)
		m->page_size = m->thp_size;
	return 0;
}

uint64_t kvs_memory_free(int fd, uint32_t kind)
{
	struct statfs sf;

	if (fstatfs(fd, &sf) < 0)
		return 0;
	if (kind == KVS_PAGE_HUGETLBFS && (unsigned long)sf.f_type == HUGETLBFS_MAGIC)
		return hugetlbfs_free(&sf, NULL);
	return (uint64_t)sf.f_bavail * (uint64_t)sf.f_frsize;
}

int kvs_cache_memory(const struct kvs_cache_params *cfg, struct kvs_memory *m)
{
	const char *dir = cfg->dir && *cfg->dir ? cfg->dir : "/dev/shm";
	int fd = kvs_sys_open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), r;

	if (fd < 0)
		return -errno;
	r = kvs_memory_probe(fd, cfg->huge_pages, m);
	kvs_sys_close(fd);
	return r;
}

const char *kvs_memory_fix(const struct kvs_memory *m, const char *dir, char *buf, size_t len)
{
	char sz[32];

	snprintf(sz, sizeof(sz), "%llu MiB", (unsigned long long)(m->thp_size >> 20));
	if (m->kind == KVS_PAGE_HUGETLBFS)
		snprintf(buf, len,
			 "its pool has %llu free pages; `sysctl -w vm.nr_hugepages=N` sets the "
			 "pages reserved on the node",
			 (unsigned long long)m->pool_free);
	else if (m->kind != KVS_PAGE_BASE)
		snprintf(buf, len, "none needed: %s gives %s pages", dir, sz);
	else if (!m->tmpfs)
		snprintf(buf, len,
			 "set cache.dir to a tmpfs mounted huge=advise or to a hugetlbfs mount "
			 "(%s is not a tmpfs)",
			 dir);
	else if (!m->thp_size)
		snprintf(buf, len,
			 "the kernel has no transparent huge pages: set cache.dir to a hugetlbfs "
			 "mount (`mount -t hugetlbfs none /dev/hugepages`) and reserve pages "
			 "(`sysctl -w vm.nr_hugepages=N`)");
	else if (!strcmp(m->shmem_enabled, "deny"))
		snprintf(buf, len,
			 "`echo never > " THP_DIR
			 "shmem_enabled` (deny takes huge pages from every "
			 "tmpfs), then `mount -o remount,huge=advise %s`",
			 dir);
	else if (!strcmp(m->huge, "advise"))
		snprintf(buf, len, "cache.huge_pages = auto gives a region %s pages there", sz);
	else
		snprintf(buf, len, "`mount -o remount,huge=advise %s` gives a region %s pages", dir,
			 sz);
	return buf;
}

const char *kvs_page_kind_word(uint32_t kind)
{
	switch (kind) {
	case KVS_PAGE_TMPFS:
		return "tmpfs";
	case KVS_PAGE_ADVISE:
		return "advise";
	case KVS_PAGE_HUGETLBFS:
		return "hugetlbfs";
	default:
		return "none";
	}
}

/* The memory nodes this process may use, into mask (NODE_BITS bits); how many, or -errno. */
static int allowed_nodes(unsigned long *mask)
{
	int n = 0;

	memset(mask, 0, NODE_BITS / 8);
	if (kvs_syscall(SYS_get_mempolicy, NULL, mask, NODE_BITS + 1, NULL, MPOL_F_MEMS_ALLOWED) <
	    0)
		return -errno;
	for (unsigned i = 0; i < NODE_BITS / (8 * sizeof(long)); i++)
		n += __builtin_popcountl(mask[i]);
	return n;
}

int kvs_memory_place(void *addr, size_t len, uint32_t numa, int *nodes)
{
	unsigned long mask[NODE_BITS / (8 * sizeof(long))];
	long r;

	*nodes = allowed_nodes(mask);
	switch (numa) {
	case KVS_NUMA_INTERLEAVE:
		if (*nodes <= 0)
			return *nodes < 0 ? *nodes : -EINVAL;
		r = kvs_syscall(SYS_mbind, addr, len, MPOL_INTERLEAVE, mask, NODE_BITS + 1, 0);
		break;
	case KVS_NUMA_LOCAL:
		r = kvs_syscall(SYS_mbind, addr, len, MPOL_LOCAL, NULL, 0, 0);
		break;
	default:
		return 0;
	}
	return r < 0 ? -errno : 0;
}

void kvs_memory_map_hints(struct kvs_cache *c, char *base, size_t len)
{
	int nodes;

	if (c->page_kind == KVS_PAGE_ADVISE)
		madvise(base + c->hdr->off_data, len - c->hdr->off_data, MADV_HUGEPAGE);
	/* hugetlbfs keeps no shared policy: each mapping carries the region's own. */
	if (c->page_kind == KVS_PAGE_HUGETLBFS && c->numa != KVS_NUMA_OFF)
		kvs_memory_place(base, len, c->numa, &nodes);
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

/* Frames the prefault maps with one call. */
#define PREFAULT_CHUNK 64u

/* Whether frame f holds a loaded shard (a READY slot), and so has its pages: a read fault of
 * a page that does not exist would allocate it past the headroom's check (populate.c).
 * Unlocked reads: a frame evicted meanwhile costs a mapping, never a wrong byte. */
static bool frame_loaded(const struct kvs_cache *c, uint32_t f)
{
	if (atomic_load_explicit(&c->fpages[f], memory_order_acquire) != KVS_PAGES_OK)
		return false; /* pairs with the release once the pages exist (populate.c) */
	for (uint32_t k = 0; k < c->per_frame; k++)
		if (st_of(load_relaxed(&c->slots[frame_first(c, f) + k].state)) == KVS_SLOT_READY)
			return true;
	return false;
}

static void *prefault_main(void *arg)
{
	struct kvs_cache *c = arg;
	uint32_t f = 0;

	while (f < c->nframes && !atomic_load_explicit(&c->prefault_stop, memory_order_relaxed)) {
		uint32_t g = f;

		/* A run of frames that hold loaded shards: what this process's loads will read. */
		while (g < c->nframes && g - f < PREFAULT_CHUNK && frame_loaded(c, g))
			g++;
		if (g == f) {
			f++;
			continue;
		}
		if (madvise(c->data + (size_t)f * c->shard_size, (size_t)(g - f) * c->shard_size,
			    MADV_POPULATE_READ) < 0 &&
		    errno == EINVAL)
			break; /* a kernel before 5.14 */
		f = g;
	}
	return NULL;
}

void kvs_memory_prefault_start(struct kvs_cache *c)
{
	if (c->watch || c->prefault_started)
		return;
	c->prefault_started =
	    kvs_thread_start(&c->prefault_th, prefault_main, c, KVS_STACK_OWN) == 0;
}

void kvs_memory_prefault_stop(struct kvs_cache *c)
{
	if (!c->prefault_started)
		return;
	atomic_store_explicit(&c->prefault_stop, true, memory_order_relaxed);
	pthread_join(c->prefault_th, NULL);
	c->prefault_started = false;
}
