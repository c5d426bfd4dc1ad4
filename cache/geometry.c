/*
 * geometry: see geometry.h; and for the tools, kvs_cache_fits and kvs_cache_check_config
 * (cache.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include "geometry.h"
#include "shmfile.h"
#include "internal.h"
#include "raw.h"
#include "sys.h"

/* capacity = auto refuses a region of fewer slots than this. */
#define KVS_AUTO_MIN_SLOTS 8u

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

static uint32_t pow2_at_least(uint64_t v)
{
	uint32_t p = 1;

	while (p < v && p < (1u << 30))
		p <<= 1;
	return p;
}

/* Slot records per frame: one for each 64 KiB of it (files.min_read's default: so a packed
 * slot costs the cache at most that, or its pages rounded up), a power of two, at least 1, at
 * most KVS_MAX_PER_FRAME.  Each costs 128 bytes of metadata and 36 of bucket and seen
 * entries: 0.26% of the data. */
static uint32_t per_frame_for(uint64_t shard_size)
{
	uint64_t want = shard_size / (16 * KVS_PAGE);
	uint32_t k = 1;

	while ((uint64_t)k * 2 <= want && k * 2 <= KVS_MAX_PER_FRAME)
		k *= 2;
	return k;
}

/* A page size of a header: 0 (a region built before it was recorded) is 4 KiB; anything but a
 * power of two from 4 KiB to 1 GiB is refused (0). */
static uint64_t page_of(uint64_t page_size)
{
	if (!page_size)
		return KVS_PAGE;
	return page_size >= KVS_PAGE && page_size <= (1ull << 30) && !(page_size & (page_size - 1))
		   ? page_size
		   : 0;
}

/* Derive every offset from the four dimensions that define a region (frames: hdr.nslots) and
 * the size of its pages (pages.c): the data starts on a page, and the file is whole pages.  A
 * region of keys only ends where the data would start. */
static int dims_from(struct dims *d, uint64_t shard_size, uint64_t nframes, uint64_t nreserved,
		     uint64_t nprocs, uint64_t page, bool keys_only)
{
	memset(d, 0, sizeof(*d));
	if (shard_size == 0 || shard_size % KVS_PAGE || shard_size > UINT32_MAX || !page_of(page))
		return -EINVAL;
	d->page = page_of(page);
	d->per_frame = per_frame_for(shard_size);
	if (nframes == 0 || nframes * d->per_frame >= (1u << 30) || nreserved >= nframes)
		return -EINVAL;
	if (nprocs == 0 || nprocs > 4096)
		return -EINVAL;
	d->shard_size = shard_size;
	d->nframes = (uint32_t)nframes;
	d->nslots = (uint32_t)nframes * d->per_frame;
	d->capacity = nframes * shard_size;
	d->nreserved = (uint32_t)nreserved;
	d->nbuckets = pow2_at_least(d->nslots);
	d->nstripes = d->nbuckets < KVS_MAX_STRIPES ? d->nbuckets : KVS_MAX_STRIPES;
	d->nprocs = (uint32_t)nprocs;
	d->keys_only = keys_only;

	uint64_t off = align_up(sizeof(struct kvs_hdr), KVS_CACHELINE);
	d->off_procs = off;
	off = align_up(off + (uint64_t)d->nprocs * sizeof(struct kvs_proc), KVS_CACHELINE);
	d->off_tally = off;
	off += (uint64_t)(KVS_TALLY_PODS + KVS_TALLY_ROOTS) * sizeof(struct kvs_tally);
	d->off_stripes = off;
	off += (uint64_t)d->nstripes * sizeof(struct kvs_stripe);
	d->off_buckets = off;
	off = align_up(off + (uint64_t)d->nbuckets * 4, KVS_CACHELINE);
	d->off_slots = off;
	off += (uint64_t)d->nslots * sizeof(struct kvs_slot);
	d->off_frames = off;
	off = align_up(off + (uint64_t)d->nframes * 4, KVS_CACHELINE);
	d->off_access = off;
	off = align_up(off + d->nframes, KVS_CACHELINE);
	d->off_seen = off;
	d->nseen = d->nbuckets < 64 ? 64 : d->nbuckets; /* a power of two, >= KVS_SEEN_WAYS */
	off += (uint64_t)d->nseen * sizeof(struct kvs_seen);
	d->off_wseq = off;
	off = align_up(off + (uint64_t)d->nseen * 8, d->page);
	d->off_data = off;
	d->total = keys_only ? off : align_up(off + d->capacity, d->page);
	return 0;
}

/* The region of n slots, on pages of page bytes, that the configuration asks for. */
int kvs_dims_for(const struct kvs_cache_params *cfg, uint64_t n, uint64_t page, struct dims *d)
{
	uint64_t reserved = n * cfg->reserved / 100;

	if (n && reserved >= n)
		reserved = n - 1;
	return dims_from(d, cfg->shard_size, n, reserved, cfg->max_processes, page, cfg->keys_only);
}

/* The region the configuration asks for on pages of page bytes; with capacity = auto, one of
 * the smallest size that auto accepts (the real size is set by kvs_region_fit or read from the
 * region). */
int kvs_dims_of(const struct kvs_cache_params *cfg, uint64_t page, struct dims *d)
{
	uint64_t shard = cfg->shard_size;

	if (!cfg->capacity)
		return kvs_dims_for(cfg, KVS_AUTO_MIN_SLOTS, page, d);
	return kvs_dims_for(cfg, shard ? cfg->capacity / shard : 0, page, d);
}

/* The header of the region file fd, if it has this magic: 0, else -EPROTO. */
int kvs_region_read_header(int fd, struct kvs_hdr *h)
{
	/* A raw system call: inside the shim, pread is our own hook. */
	if (kvs_syscall(SYS_pread64, fd, h, sizeof(*h), 0) != (long)sizeof(*h) ||
	    h->magic != KVS_MAGIC)
		return -EPROTO;
	return 0;
}

/* The region a file's header describes (a watcher takes the region as it is). */
int kvs_dims_of_file(int fd, struct dims *d)
{
	struct kvs_hdr h;

	if (kvs_region_read_header(fd, &h))
		return -EPROTO;
	return dims_from(d, h.shard_size, h.nslots, h.nreserved, h.nprocs, h.page_size,
			 h.keys_only != 0)
		   ? -EPROTO
		   : 0;
}

#define MISMATCH(field, have, want)                                                                \
	do {                                                                                       \
		if ((uint64_t)(have) != (uint64_t)(want)) {                                        \
			snprintf(msg, msglen,                                                      \
				 "region %s has %s %" PRIu64 ", the configuration wants %" PRIu64  \
				 " (run `kvshim reset` to rebuild it)",                            \
				 c->path, field, (uint64_t)(have), (uint64_t)(want));              \
			return -EPROTO;                                                            \
		}                                                                                  \
	} while (0)

/* Refuse a region whose identity or dimensions differ from d. */
int kvs_region_check(struct kvs_cache *c, const struct dims *d, size_t file_size, char *msg,
		     size_t msglen)
{
	/* One policy per region: processes evicting differently would defeat each other.  A
	 * watcher evicts nothing and takes the region's. */
	int eviction = c->watch ? -1 : c->eviction;

	const struct kvs_hdr *h = c->hdr;

	if (file_size < sizeof(*h)) {
		snprintf(msg, msglen, "region %s is truncated (%zu bytes)", c->path, file_size);
		return -EPROTO;
	}
	MISMATCH("magic", h->magic, KVS_MAGIC);
	atomic_thread_fence(memory_order_acquire); /* pairs with the fence in build() */
	MISMATCH("layout version", h->version, KVS_LAYOUT_VERSION);
	MISMATCH("header size", h->hdr_bytes, sizeof(*h));
	MISMATCH("keys only (1: a region of shim.mode = observe)", h->keys_only, d->keys_only);
	/* The dimensions an operator sets come first, so the message names the key that differs. */
	MISMATCH("shard_size", h->shard_size, d->shard_size);
	MISMATCH("capacity", h->capacity, d->capacity);
	MISMATCH("max_processes", h->nprocs, d->nprocs);
	MISMATCH("reserved slots", h->nreserved, d->nreserved);
	if (eviction >= 0)
		MISMATCH("eviction (0 clock, 1 fifo)", h->eviction, eviction);
	MISMATCH("slots", h->nslots, d->nframes);
	MISMATCH("slots per frame", h->per_frame, d->per_frame);
	MISMATCH("page size", page_of(h->page_size), d->page);
	if (h->page_kind > KVS_PAGE_HUGETLBFS)
		MISMATCH("page kind", h->page_kind, KVS_PAGE_BASE);
	MISMATCH("buckets", h->nbuckets, d->nbuckets);
	MISMATCH("stripes", h->nstripes, d->nstripes);
	MISMATCH("total_bytes", h->total_bytes, d->total);
	MISMATCH("file size", file_size, d->total);
	MISMATCH("pins per process", h->npins, KVS_PINS_PER_PROC);
	MISMATCH("off_procs", h->off_procs, d->off_procs);
	MISMATCH("off_tally", h->off_tally, d->off_tally);
	MISMATCH("off_stripes", h->off_stripes, d->off_stripes);
	MISMATCH("off_buckets", h->off_buckets, d->off_buckets);
	MISMATCH("off_slots", h->off_slots, d->off_slots);
	MISMATCH("off_frames", h->off_frames, d->off_frames);
	MISMATCH("off_access", h->off_access, d->off_access);
	MISMATCH("off_seen", h->off_seen, d->off_seen);
	MISMATCH("seen entries", h->nseen, d->nseen);
	MISMATCH("off_wseq", h->off_wseq, d->off_wseq);
	MISMATCH("off_data", h->off_data, d->off_data);
	return 0;
}

/* Format v bytes as a short figure ("1.5 GiB") into buf. */
static const char *human(uint64_t v, char *buf, size_t len)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double x = (double)v;
	int u = 0;

	while (x >= 1024.0 && u < 4) {
		x /= 1024.0;
		u++;
	}
	snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", x, unit[u]);
	return buf;
}

/* Where the room of mem is, for a message: "/dev/shm has 1.5 GiB free", "the pool of 2 MiB
 * huge pages has 0 B free (neither used nor reserved)". */
static const char *room_text(const struct kvs_memory *mem, const char *dir, uint64_t free_b,
			     char *buf, size_t len)
{
	char a[32], b[32];

	if (mem->hugetlbfs && mem->mount_limited)
		snprintf(buf, len, "the hugetlbfs %s has %s free within its size=", dir,
			 human(free_b, b, sizeof(b)));
	else if (mem->hugetlbfs)
		snprintf(buf, len,
			 "the pool of %s huge pages has %s free (neither used nor reserved)",
			 human(mem->page_size, a, sizeof(a)), human(free_b, b, sizeof(b)));
	else
		snprintf(buf, len, "%s has %s free", dir, human(free_b, b, sizeof(b)));
	return buf;
}

/* The fix for want more bytes than mem has room for, for a message. */
static const char *room_fix(const struct kvs_memory *mem, const char *dir, uint64_t want, char *buf,
			    size_t len)
{
	uint64_t short_by = want > mem->free_bytes ? want - mem->free_bytes : 1;

	if (mem->hugetlbfs && mem->mount_limited)
		snprintf(buf, len, "a larger size= for the hugetlbfs mount %s", dir);
	else if (mem->hugetlbfs)
		snprintf(buf, len, "reserve more huge pages (`sysctl -w vm.nr_hugepages=%llu`)",
			 (unsigned long long)(mem->pool_pages +
					      (short_by + mem->page_size - 1) / mem->page_size));
	else if (!strcmp(dir, "/dev/shm"))
		snprintf(buf, len, "a larger /dev/shm (docker --shm-size)");
	else
		snprintf(buf, len, "a larger %s", dir);
	return buf;
}

/*
 * Check that a region of d's size fits in the free space that mem (the file system of dir)
 * has, less cache.shm_headroom, or (cache.capacity = auto) set d to the most slots that fit on
 * pages of d->page.  reclaim: bytes that the build frees (the region it replaces), counted as
 * free.  Returns 0, or -ENOSPC with one line in msg.
 */
int kvs_region_fit(const struct kvs_memory *mem, const char *dir, struct dims *d,
		   const struct kvs_cache_params *cfg, uint64_t reclaim, const char *path,
		   char *msg, size_t msglen)
{
	uint64_t shard = cfg->shard_size, free_b, room, n, page = d->page;
	char a[32], h[32], where[160], fix[96];

	free_b = mem->free_bytes + reclaim;
	room = free_b > cfg->shm_headroom ? free_b - cfg->shm_headroom : 0;
	room_text(mem, dir, free_b, where, sizeof(where));
	human(cfg->shm_headroom, h, sizeof(h));
	if (cfg->capacity) {
		if (d->total <= room)
			return 0;
		snprintf(msg, msglen,
			 "cannot build %s: %s: cache.capacity %s needs %s, %s and "
			 "cache.shm_headroom keeps %s; set a smaller cache.capacity, "
			 "cache.capacity = auto, or %s",
			 path, strerror(ENOSPC), human(d->capacity, a, sizeof(a)),
			 human(d->total, (char[32]){0}, 32), where, h,
			 room_fix(mem, dir, d->total + cfg->shm_headroom, fix, sizeof(fix)));
		return -ENOSPC;
	}
	/* The control plane grows with the slots: step down until the whole region fits. */
	n = room / shard;
	if (n >= (1u << 30))
		n = (1u << 30) - 1;
	while (n >= KVS_AUTO_MIN_SLOTS) {
		if (kvs_dims_for(cfg, n, page, d) == 0 && d->total <= room)
			return 0;
		uint64_t over = d->total > room ? (d->total - room + shard - 1) / shard : 1;
		n = n > over ? n - over : 0;
	}
	kvs_dims_for(cfg, KVS_AUTO_MIN_SLOTS, page, d);
	snprintf(msg, msglen,
		 "cannot build %s: %s: cache.capacity = auto, but %s and "
		 "cache.shm_headroom keeps %s, not room for %u slots of %s; free some, lower "
		 "cache.shm_headroom, or %s",
		 path, strerror(ENOSPC), where, h, KVS_AUTO_MIN_SLOTS, human(shard, a, sizeof(a)),
		 room_fix(mem, dir, d->total + cfg->shm_headroom, fix, sizeof(fix)));
	return -ENOSPC;
}

int kvs_cache_fits(const struct kvs_cache_params *cfg, char *msg, size_t msglen)
{
	char path[sizeof(((struct kvs_cache *)0)->path)], dir[sizeof(path)];
	struct kvs_memory mem;
	struct dims d;
	int dirfd, r;

	msg[0] = '\0';
	r = kvs_cache_path(cfg, path, sizeof(path));
	if (r)
		return r;
	dirfd = kvs_shm_open_dir(path, cfg, dir, sizeof(dir), &mem, msg, msglen);
	if (dirfd < 0)
		return dirfd;
	if (kvs_dims_of(cfg, mem.page_size, &d)) {
		snprintf(msg, msglen, "the cache dimensions are out of range");
		r = -EINVAL;
		goto out;
	}
	r = kvs_region_fit(&mem, dir, &d, cfg, 0, path, msg,
			   msglen); /* the rule create() applies */
out:
	kvs_sys_close(dirfd);
	return r;
}

int kvs_cache_check_config(struct kvs_cache *c, const struct kvs_cache_params *cfg, char *msg,
			   size_t msglen)
{
	int eviction = c->eviction;
	bool watch = c->watch;
	struct stat st;
	struct dims d;
	int r;

	msg[0] = '\0';
	/* As attach() does: capacity = auto takes the region's own slot count. */
	r = cfg->capacity ? kvs_dims_of(cfg, c->page_size, &d)
			  : kvs_dims_for(cfg, c->hdr->nslots, c->page_size, &d);
	if (r) {
		snprintf(msg, msglen, "the cache dimensions are out of range");
		return -EINVAL;
	}
	if (fstat(kvs_ownfd_peek(&c->own), &st) < 0)
		return -errno;
	/* kvs_region_check as an attacher of this configuration would run it. */
	c->watch = false;
	c->eviction = cfg->eviction;
	r = kvs_region_check(c, &d, (size_t)st.st_size, msg, msglen);
	c->watch = watch;
	c->eviction = eviction;
	return r;
}
