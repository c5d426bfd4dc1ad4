/*
 * fdinfo: see fdinfo.h.
 *
 * The cache is a table indexed by descriptor number (below FD_SLOTS), mapped at first use (mmap,
 * not malloc: a hooked read may come from a signal handler), so a process that never reads a
 * KV file never maps it.  Each entry is guarded by a sequence counter: a writer makes it odd
 * (CAS, so concurrent writers skip rather than wait), writes, then makes it even again; a
 * reader retries or recomputes when it sees an odd or changed counter.  A torn read can
 * therefore never pass for a match.  The anchors the loader reads through are anchor.c's.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "fdinfo.h"

#define FD_SLOTS  65536
#define MAX_ROOTS 16

struct ident {
	uint64_t dev, ino, size, mtime_s, mtime_ns, ctime_s, ctime_ns;
};

/* What the table says about one descriptor. */
struct verdict {
	struct ident id;
	struct kvs_key block;
	uint32_t dio_mem, dio_off;
	uint32_t kv, zero_tail;
	uint64_t settle_ns;
	uint64_t node_clock; /* the stamps may be another machine's (settle_for) */
};

#define VERDICT_WORDS (sizeof(struct verdict) / 8)
_Static_assert(sizeof(struct verdict) % 8 == 0, "a verdict is whole words");

/* The verdict is stored as relaxed atomic words, so a reader racing a writer reads stale or
 * torn words, never undefined behaviour; the sequence counter then rejects the copy. */
struct entry {
	_Atomic uint32_t seq;
	_Atomic uint32_t kv_hint; /* the last verdict's kv, for kvs_fdinfo_known's quick test */
	_Atomic uint64_t w[VERDICT_WORDS];
};

static char roots[MAX_ROOTS][PATH_MAX];
static size_t root_len[MAX_ROOTS];
static int nroots;
static int64_t settle_ms = -1;
static struct entry *_Atomic table;

void kvs_fdinfo_set_settle(int64_t ms)
{
	settle_ms = ms;
}

int kvs_fdinfo_set_roots(const char *spec)
{
	char buf[PATH_MAX];
	const char *p = spec;

	nroots = 0;
	while (*p && nroots < MAX_ROOTS) {
		const char *end = strchr(p, ':');
		size_t n = end ? (size_t)(end - p) : strlen(p);

		if (n > 0 && n < sizeof(buf)) {
			memcpy(buf, p, n);
			buf[n] = '\0';
			if (realpath(buf, roots[nroots])) {
				root_len[nroots] = strlen(roots[nroots]);
				/* "/" as a root: every path is under it. */
				if (root_len[nroots] == 1)
					root_len[nroots] = 0;
				nroots++;
			}
		}
		if (!end)
			break;
		p = end + 1;
	}
	return nroots;
}

static bool under_roots(const char *path)
{
	for (int i = 0; i < nroots; i++) {
		size_t n = root_len[i];

		if (strncmp(path, roots[i], n) == 0 && (path[n] == '/' || path[n] == '\0'))
			return true;
	}
	return false;
}

static void ident_of(const struct stat *st, struct ident *id)
{
	memset(id, 0, sizeof(*id));
	id->dev = (uint64_t)st->st_dev;
	id->ino = (uint64_t)st->st_ino;
	id->size = (uint64_t)st->st_size;
	id->mtime_s = (uint64_t)st->st_mtim.tv_sec;
	id->mtime_ns = (uint64_t)st->st_mtim.tv_nsec;
	id->ctime_s = (uint64_t)st->st_ctim.tv_sec;
	id->ctime_ns = (uint64_t)st->st_ctim.tv_nsec;
}

static struct entry *table_get(bool create)
{
	struct entry *t = atomic_load(&table);

	if (t || !create)
		return t;
	t = mmap(NULL, FD_SLOTS * sizeof(*t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		 -1, 0);
	if (t == MAP_FAILED)
		return NULL;
	struct entry *expect = NULL;
	if (!atomic_compare_exchange_strong(&table, &expect, t)) {
		munmap(t, FD_SLOTS * sizeof(*t));
		t = expect;
	}
	return t;
}

/* Copy entry e into *out if it describes id.  Returns true on a consistent match. */
static bool entry_read(struct entry *e, const struct ident *id, struct verdict *out)
{
	uint64_t w[VERDICT_WORDS];
	uint32_t s1 = atomic_load_explicit(&e->seq, memory_order_acquire); /* pairs with write */

	if (s1 == 0 || (s1 & 1))
		return false;
	for (size_t i = 0; i < VERDICT_WORDS; i++)
		w[i] = atomic_load_explicit(&e->w[i], memory_order_relaxed);
	atomic_thread_fence(memory_order_acquire); /* the loads above happen before s2 */
	uint32_t s2 = atomic_load_explicit(&e->seq, memory_order_relaxed);
	memcpy(out, w, sizeof(*out));
	return s1 == s2 && memcmp(&out->id, id, sizeof(*id)) == 0;
}

static void entry_write(struct entry *e, const struct verdict *v)
{
	uint64_t w[VERDICT_WORDS];
	uint32_t s = atomic_load_explicit(&e->seq, memory_order_relaxed);

	if ((s & 1) || !atomic_compare_exchange_strong(&e->seq, &s, s + 1))
		return;				   /* another writer: leave it to them */
	atomic_thread_fence(memory_order_release); /* odd seq is visible before the words */
	memcpy(w, v, sizeof(*v));
	for (size_t i = 0; i < VERDICT_WORDS; i++)
		atomic_store_explicit(&e->w[i], w[i], memory_order_relaxed);
	atomic_store_explicit(&e->kv_hint, v->kv, memory_order_relaxed);
	atomic_store_explicit(&e->seq, s + 2, memory_order_release); /* pairs with entry_read */
}

/*
 * Are a file system's stamps written by this node's own clock?  Those of a local disk or of
 * memory are (this kernel stamps them); those of FUSE, NFS and every other type may come from
 * another machine (a Gluster client stamps with its own clock, an NFS server with its), so a
 * file there counts as settled only once this node has also seen its identity for
 * files.settle (loader/publish.c, kvs_keep_until).
 */
static bool stamps_local(unsigned long type)
{
	switch (type) {
	case 0xEF53:	 /* ext2/3/4 */
	case 0x58465342: /* XFS */
	case 0x9123683E: /* btrfs */
	case 0x01021994: /* tmpfs */
	case 0xF2F52010: /* F2FS */
	case 0x2FC12FC1: /* ZFS */
	case 0x794C7630: /* overlayfs */
	case 0xCA451A4E: /* bcachefs */
		return true;
	default:
		return false;
	}
}

/*
 * files.settle for a file: how long after its last change (mtime or ctime) the shim distrusts
 * its identity.  A write moves mtime when it starts and its data may land later; a file system
 * with coarse timestamps leaves a rewrite in the same tick with the same times; a client that
 * caches attributes reports old times for a while.  Shards read within this window are handed
 * to the readers of that load and not kept (loader.h, kvs_read.keep).  Defaults by type:
 * local file systems with fine timestamps 2 s (a slow write of a large block); FUSE 3 s (the
 * default 1 s attribute cache); anything else, NFS and other network file systems included,
 * 61 s (NFS caches attributes up to acregmax, 60 s).  Times with no sub-second part on both
 * stamps mean a coarse file system (ext2/ext3, FAT): 2 s more.
 */
static uint64_t settle_for(unsigned long type, const struct stat *st)
{
	uint64_t ms;

	if (settle_ms >= 0)
		return (uint64_t)settle_ms;
	if (stamps_local(type))
		ms = 2000;	     /* the local file systems (stamps_local) */
	else if (type == 0x65735546) /* FUSE */
		ms = 3000;
	else
		ms = 61000;
	if (st->st_mtim.tv_nsec == 0 && st->st_ctim.tv_nsec == 0)
		ms += 2000;
	return ms;
}

/* Compute the verdict for fd from scratch. */
static void classify(int fd, const struct stat *st, struct verdict *v)
{
	char link[64], path[PATH_MAX];
	ssize_t n;

	memset(v, 0, sizeof(*v));
	ident_of(st, &v->id);
	v->dio_mem = 512;
	v->dio_off = 512;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, path, sizeof(path) - 1);
	if (n <= 0)
		return;
	path[n] = '\0';
	v->kv = under_roots(path);
	if (!v->kv)
		return;
	kvs_block_id(st, &v->block);
	/* ext4, XFS and btrfs (iomap) zero the caller's buffer past the end of the file on a
	 * short O_DIRECT read; FUSE, NFS and tmpfs leave it alone.  The shim does the same. */
	struct statfs sf;
	unsigned long type = fstatfs(fd, &sf) == 0 ? (unsigned long)sf.f_type : 0;
	v->zero_tail = type == 0xEF53 || type == 0x58465342 || type == 0x9123683EUL;
	v->settle_ns = settle_for(type, st) * 1000000ull;
	v->node_clock = !stamps_local(type);
#ifdef STATX_DIOALIGN
	struct statx sx;
	if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
	    (sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_offset_align) {
		v->dio_mem = sx.stx_dio_mem_align ? sx.stx_dio_mem_align : 1;
		v->dio_off = sx.stx_dio_offset_align;
	}
#endif
}

static int describe(int fd, struct kvs_fdinfo *out, bool known_only)
{
	struct entry *t = table_get(!known_only);
	struct verdict got, fresh;
	struct stat st;
	struct ident id;
	int fl;

	memset(out, 0, sizeof(*out));
	if (known_only && (!t || fd < 0 || fd >= FD_SLOTS ||
			   !atomic_load_explicit(&t[fd].kv_hint, memory_order_relaxed)))
		return -ENOENT;
	if (fstat(fd, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode))
		return 0;
	fl = fcntl(fd, F_GETFL);
	if (fl < 0)
		return -errno;
	out->direct = fl & O_DIRECT;
	out->append = fl & O_APPEND;
	/* An O_PATH descriptor reads nothing: the kernel answers EBADF, so must we. */
	out->readable = (fl & O_ACCMODE) != O_WRONLY && !(fl & O_PATH);
	out->size = (uint64_t)st.st_size;
	out->dev = (uint64_t)st.st_dev;
	out->ino = (uint64_t)st.st_ino;
	uint64_t m = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
	uint64_t ch = (uint64_t)st.st_ctim.tv_sec * 1000000000ull + (uint64_t)st.st_ctim.tv_nsec;
	out->changed_ns = m > ch ? m : ch;
	ident_of(&st, &id);
	if (t && fd >= 0 && fd < FD_SLOTS && entry_read(&t[fd], &id, &got)) {
		fresh = got;
	} else {
		if (known_only)
			return -ENOENT;
		classify(fd, &st, &fresh);
		if (t && fd >= 0 && fd < FD_SLOTS)
			entry_write(&t[fd], &fresh);
	}
	out->kv = fresh.kv;
	out->block = fresh.block;
	out->dio_mem_align = fresh.dio_mem;
	out->dio_off_align = fresh.dio_off;
	out->dio_zero_tail = fresh.zero_tail;
	out->settle_ns = fresh.settle_ns;
	out->node_clock = fresh.node_clock;
	return known_only && !out->kv ? -ENOENT : 0;
}

int kvs_fdinfo_get(int fd, struct kvs_fdinfo *out)
{
	return describe(fd, out, false);
}

int kvs_fdinfo_known(int fd, struct kvs_fdinfo *out)
{
	return describe(fd, out, true);
}

bool kvs_fdinfo_hint_kv(int fd)
{
	struct entry *t = atomic_load_explicit(&table, memory_order_acquire);

	return t && fd >= 0 && fd < FD_SLOTS &&
	       atomic_load_explicit(&t[fd].kv_hint, memory_order_relaxed);
}
