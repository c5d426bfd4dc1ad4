/*
 * fdinfo: see fdinfo.h.
 *
 * DESIGN
 *
 * A table indexed by descriptor number (below FD_SLOTS), mapped at first use (mmap, not
 * malloc: a hooked call may come from a signal handler), so a process that never looks at a
 * descriptor never maps it.  Each entry holds two things of different lifetimes:
 *
 *   cls      what the descriptor is, decided once by its path and file type: UNKNOWN, NOT_KV
 *            (a pipe, a socket, a file outside files.roots) or KV.  It holds until the number
 *            is closed or replaced (kvs_fdinfo_forget: close, dup2, dup3, close_range and their
 *            syscall() numbers, fclose), since a descriptor's open file is the same inode for
 *            its whole life.  NOT_KV answers with no system call at all: a program's writes to
 *            its logs and sockets cost one load.
 *   verdict  for a KV descriptor: its file (dev, ino), its root's rules (write-once), its
 *            O_DIRECT alignment and file system rules, and the block id of the identity it was
 *            last seen with.  Every look re-reads the identity (statx, and the generation on a
 *            write-once root) and hashes a new block id when it moved; the path is looked up
 *            again only when (dev, ino) moved (a close the shim did not see, and the number
 *            reused).
 *
 * The verdict is guarded by a sequence counter: a writer makes it odd (CAS, so concurrent
 * writers skip rather than wait), writes, then makes it even again; a reader retries or
 * recomputes when it sees an odd or changed counter, so a torn read never passes for a match.
 * cls is one atomic byte; kvs_fdinfo_forget stores UNKNOWN and moves the counter, so a reader
 * that raced it looks again.  A close the shim does not see (an io_uring close, a close inside
 * another library's code) leaves cls as it was: a KV verdict is caught by the (dev, ino) check,
 * a NOT_KV one makes the file's reads and writes through that number pass through as any file
 * outside the roots (a miss, never a wrong byte: a write unseen still moves the identity of a
 * file keyed by change).  The anchors the loader reads through are anchor.c's.
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
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "fdinfo.h"
#include "unseen_marks.h"
#include "log.h"
#include "raw.h"
#include "sys.h"

#define FD_SLOTS  65536
#define MAX_ROOTS 16
#define DAY_NS	  (86400ull * 1000000000ull)

enum { CLS_UNKNOWN = 0, CLS_NOT_KV = 1, CLS_KV = 2 };

/* What the table says about one KV descriptor. */
struct verdict {
	/* per descriptor: decided by its path and file system */
	uint64_t dev, ino;
	uint32_t dio_mem, dio_off;
	uint32_t zero_tail, node_clock;
	uint32_t once_root; /* under a files.write_once root */
	uint32_t fs_gen;    /* the file system answered FS_IOC_GETVERSION */
	uint32_t atime;	    /* the mount's atime rule: KVS_ATIME_* */
	uint32_t root;	    /* the index in files.roots of the root it lies under */
	uint64_t fs_type;
	/* per identity: the words it was matched on, and what follows from them */
	uint64_t size;
	int64_t v1_s, v2_s; /* by change: mtime, ctime; by birth: btime, 0 */
	uint32_t v1_ns, v2_ns;
	uint64_t gen;
	uint64_t write_once; /* keyed by birth */
	struct kvs_key block;
	uint64_t settle_ns;
};

#define VERDICT_WORDS (sizeof(struct verdict) / 8)
_Static_assert(sizeof(struct verdict) % 8 == 0, "a verdict is whole words");

/* The verdict is stored as relaxed atomic words, so a reader racing a writer reads stale or
 * torn words, never undefined behaviour; the sequence counter then rejects the copy. */
struct entry {
	_Atomic uint32_t seq;
	_Atomic uint8_t cls;
	_Atomic uint64_t w[VERDICT_WORDS];
};

static char roots[MAX_ROOTS][PATH_MAX];
static size_t root_len[MAX_ROOTS];
static int nroots;
static char once[MAX_ROOTS][PATH_MAX];
static size_t once_len[MAX_ROOTS];
static int nonce;
static _Atomic uint32_t once_noid_said; /* one bit per write-once root said to have no id */
static int64_t settle_ms = -1;
static struct entry *_Atomic table;

void kvs_fdinfo_set_settle(int64_t ms)
{
	settle_ms = ms;
}

/* Canonicalise each directory of spec (colon-separated) into dirs; missing ones dropped. */
static int parse_dirs(const char *spec, char dirs[][PATH_MAX], size_t *len)
{
	char buf[PATH_MAX];
	const char *p = spec;
	int n = 0;

	while (*p && n < MAX_ROOTS) {
		const char *end = strchr(p, ':');
		size_t k = end ? (size_t)(end - p) : strlen(p);

		if (k > 0 && k < sizeof(buf)) {
			memcpy(buf, p, k);
			buf[k] = '\0';
			if (realpath(buf, dirs[n])) {
				len[n] = strlen(dirs[n]);
				/* "/" as a root: every path is under it. */
				if (len[n] == 1)
					len[n] = 0;
				n++;
			}
		}
		if (!end)
			break;
		p = end + 1;
	}
	return n;
}

static int under(const char *path, char dirs[][PATH_MAX], const size_t *len, int n);

/* The devices a file under a root can be on: each root's, and each mount's below a root
 * (read from /proc/self/mountinfo: "ID PARENT MAJOR:MINOR ROOT MOUNTPOINT ..."); when they do
 * not fit, or a root is "/", ndevs is -1: any device may be. */
#define MAX_DEVS 32
static uint64_t devs[MAX_DEVS];
static int ndevs = -1;

static void add_dev(uint64_t d)
{
	for (int i = 0; i < ndevs; i++)
		if (devs[i] == d)
			return;
	if (ndevs >= 0 && ndevs < MAX_DEVS)
		devs[ndevs++] = d;
	else
		ndevs = -1;
}

static void collect_devs(void)
{
	static char buf[65536]; /* at configuration load, on one thread */
	struct stat st;
	ssize_t n = 0, got;

	ndevs = 0;
	for (int i = 0; i < nroots && ndevs >= 0; i++) {
		if (!root_len[i] || stat(roots[i], &st) != 0) {
			ndevs = -1;
			return;
		}
		add_dev((uint64_t)st.st_dev);
	}
	int fd = kvs_sys_open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ndevs = -1;
		return;
	}
	while (n < (ssize_t)sizeof(buf) - 1 &&
	       (got = kvs_sys_read(fd, buf + n, sizeof(buf) - 1 - (size_t)n)) > 0)
		n += got;
	kvs_sys_close(fd);
	if (n >= (ssize_t)sizeof(buf) - 1) {
		ndevs = -1; /* too many mounts to be sure: any device may hold a root */
		return;
	}
	buf[n] = '\0';
	for (char *line = buf, *next; ndevs >= 0 && *line; line = next) {
		unsigned maj, min;
		char point[PATH_MAX];

		next = strchr(line, '\n');
		next = next ? next + 1 : line + strlen(line);
		if (sscanf(line, "%*u %*u %u:%u %*s %4095s", &maj, &min, point) == 3 &&
		    under(point, roots, root_len, nroots) >= 0)
			add_dev((uint64_t)makedev(maj, min));
	}
}

int kvs_fdinfo_set_roots(const char *spec)
{
	nroots = parse_dirs(spec, roots, root_len);
	collect_devs();
	return nroots;
}

/* How many cuFile handles name each descriptor number (fdinfo.h), saturating at 255, never
 * decremented from there. */
#define CUFILE_FDS 65536
static _Atomic uint8_t cufile_refs[CUFILE_FDS];

void kvs_fdinfo_cufile_ref(int fd, bool up)
{
	if (fd < 0 || fd >= CUFILE_FDS)
		return;
	uint8_t n = atomic_load_explicit(&cufile_refs[fd], memory_order_relaxed);

	if (n != UINT8_MAX && (up || n))
		atomic_store_explicit(&cufile_refs[fd], (uint8_t)(up ? n + 1 : n - 1),
				      memory_order_relaxed);
}

bool kvs_fdinfo_cufile_registered(int fd)
{
	return fd >= 0 && fd < CUFILE_FDS &&
	       atomic_load_explicit(&cufile_refs[fd], memory_order_relaxed) != 0;
}

/* The files found under no root (fdinfo.h): tags never 0, in sets of OUTSIDE_WAYS. */
#define OUTSIDE_SLOTS 1024
#define OUTSIDE_WAYS  4
static _Atomic uint64_t outside[OUTSIDE_SLOTS];
static _Atomic bool outside_any;

static _Atomic uint64_t *outside_set(uint64_t tag)
{
	return &outside[tag % (OUTSIDE_SLOTS / OUTSIDE_WAYS) * OUTSIDE_WAYS];
}

bool kvs_fdinfo_outside_known(uint64_t dev, uint64_t ino)
{
	uint64_t tag = kvs_hash_file(dev, ino) | 1;
	_Atomic uint64_t *set = outside_set(tag);

	for (int w = 0; w < OUTSIDE_WAYS; w++)
		if (atomic_load_explicit(&set[w], memory_order_relaxed) == tag)
			return true;
	return false;
}

void kvs_fdinfo_outside_note(uint64_t dev, uint64_t ino)
{
	uint64_t tag = kvs_hash_file(dev, ino) | 1;
	_Atomic uint64_t *set = outside_set(tag);
	int w = 0; /* an empty way, else one by the tag's other bits */

	while (w < OUTSIDE_WAYS && atomic_load_explicit(&set[w], memory_order_relaxed))
		w++;
	if (w == OUTSIDE_WAYS)
		w = (int)((tag >> 32) % OUTSIDE_WAYS);
	atomic_store_explicit(&set[w], tag, memory_order_relaxed);
	atomic_store_explicit(&outside_any, true, memory_order_relaxed);
}

void kvs_fdinfo_outside_forget(void)
{
	if (!atomic_load_explicit(&outside_any, memory_order_relaxed))
		return;
	atomic_store_explicit(&outside_any, false, memory_order_relaxed);
	for (int i = 0; i < OUTSIDE_SLOTS; i++)
		atomic_store_explicit(&outside[i], 0, memory_order_relaxed);
}

bool kvs_fdinfo_dev_outside(uint64_t dev)
{
	if (ndevs < 0)
		return false;
	for (int i = 0; i < ndevs; i++)
		if (devs[i] == dev)
			return false;
	return true;
}

const char *kvs_fdinfo_root(int i)
{
	return i >= 0 && i < nroots ? (root_len[i] ? roots[i] : "/") : NULL;
}

int kvs_fdinfo_set_write_once(const char *spec)
{
	nonce = parse_dirs(spec, once, once_len);
	return nonce;
}

bool kvs_fdinfo_any_write_once(void)
{
	return nonce > 0;
}

/* The index of the first of dirs that path lies under, or -1. */
static int under(const char *path, char dirs[][PATH_MAX], const size_t *len, int n)
{
	for (int i = 0; i < n; i++) {
		size_t k = len[i];

		if (strncmp(path, dirs[i], k) == 0 && (path[k] == '/' || path[k] == '\0'))
			return i;
	}
	return -1;
}

static struct entry *table_get(bool create)
{
	struct entry *t = atomic_load_explicit(&table, memory_order_acquire);

	if (t || !create)
		return t;
	t = kvs_sys_mmap(NULL, FD_SLOTS * sizeof(*t), PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (t == MAP_FAILED)
		return NULL;
	struct entry *expect = NULL;
	if (!atomic_compare_exchange_strong(&table, &expect, t)) {
		kvs_sys_munmap(t, FD_SLOTS * sizeof(*t));
		t = expect;
	}
	return t;
}

/* Copy entry e's verdict into *out.  Returns true on a consistent copy of a written one. */
static bool entry_read(struct entry *e, struct verdict *out)
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
	return s1 == s2;
}

/* Write entry e, if its counter is still s (the value read before the look that found v): a
 * forget or another writer since means the look may describe a file the number no longer
 * names, and the entry is left to the next look. */
static void entry_write(struct entry *e, uint32_t s, const struct verdict *v, uint8_t cls)
{
	uint64_t w[VERDICT_WORDS];

	if ((s & 1) || !atomic_compare_exchange_strong(&e->seq, &s, s + 1))
		return;				   /* moved since the look: leave it */
	atomic_thread_fence(memory_order_release); /* odd seq is visible before the words */
	if (v) {
		memcpy(w, v, sizeof(*v));
		for (size_t i = 0; i < VERDICT_WORDS; i++)
			atomic_store_explicit(&e->w[i], w[i], memory_order_relaxed);
	}
	atomic_store_explicit(&e->cls, cls, memory_order_relaxed);
	atomic_store_explicit(&e->seq, s + 2, memory_order_release); /* pairs with entry_read */
}

/*
 * Are a file system's stamps written by this node's own clock?  Those of a local disk or of
 * memory are (this kernel stamps them); those of FUSE, NFS and every other type may come from
 * another machine (a Gluster client stamps with its own clock, an NFS server with its), so a
 * file there counts as settled only once this node has also seen its identity for
 * files.settle (loader/publish.c, kvs_keep_for).
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
 * files.settle for a file keyed by change: how long after its last change (mtime or ctime) the
 * shim distrusts its identity.  A write moves mtime when it starts and its data may land
 * later; a file system with coarse timestamps leaves a rewrite in the same tick with the same
 * times; a client that caches attributes reports old times for a while.  Shards read within
 * this window are kept only that long (loader/publish.c, kvs_keep_for).  Defaults by type:
 * local file systems with fine timestamps 2 s (a slow write of a large block); FUSE 3 s (the
 * default 1 s attribute cache); anything else, NFS and other network file systems included,
 * 61 s (NFS caches attributes up to acregmax, 60 s).  Times with no sub-second part on both
 * stamps mean a coarse file system (ext2/ext3, FAT): 2 s more.  A file keyed by birth (a
 * write-once root) has none: it was complete before anyone read it.
 */
static uint64_t settle_for(unsigned long type, const struct kvs_ident *id)
{
	uint64_t ms;

	if (id->write_once)
		return 0;
	if (settle_ms >= 0)
		return (uint64_t)settle_ms;
	if (stamps_local(type))
		ms = 2000;	     /* the local file systems (stamps_local) */
	else if (type == 0x65735546) /* FUSE */
		ms = 3000;
	else
		ms = 61000;
	if (id->mtime.nsec == 0 && id->ctime.nsec == 0)
		ms += 2000;
	return ms;
}

/* The words of id's scheme that v is matched on (no hashing: this runs at every look). */
static void identity_words(struct verdict *v, const struct kvs_ident *id)
{
	v->size = id->size;
	v->write_once = id->write_once;
	if (id->write_once) {
		v->v1_s = id->has_btime ? id->btime.sec : -1;
		v->v1_ns = id->has_btime ? id->btime.nsec : 0;
		v->v2_s = 0;
		v->v2_ns = 0;
		v->gen = id->has_gen ? id->gen : UINT64_MAX;
	} else {
		v->v1_s = id->mtime.sec;
		v->v1_ns = id->mtime.nsec;
		v->v2_s = id->ctime.sec;
		v->v2_ns = id->ctime.nsec;
		v->gen = 0;
	}
}

/* v's identity words from id, and what follows from them: the block id and settle. */
static void set_identity(struct verdict *v, const struct kvs_ident *id)
{
	identity_words(v, id);
	kvs_ident_key(id, &v->block);
	v->settle_ns = settle_for((unsigned long)v->fs_type, id) * 1000000ull;
}

static bool same_identity(const struct verdict *v, const struct kvs_ident *id)
{
	struct verdict w;

	identity_words(&w, id);
	return w.size == v->size && w.write_once == v->write_once && w.v1_s == v->v1_s &&
	       w.v1_ns == v->v1_ns && w.v2_s == v->v2_s && w.v2_ns == v->v2_ns && w.gen == v->gen;
}

/* Say once per write-once root that its file system cannot key files by birth. */
static void say_no_birth_id(int root)
{
	uint32_t bit = 1u << root;

	if (atomic_fetch_or(&once_noid_said, bit) & bit)
		return;
	kvs_log_line(KVS_LOG_WARN,
		     "files.write_once: %s is on a file system that gives no inode generation, so "
		     "a file created anew on a reused inode cannot be told from an old one of the "
		     "same size; its files are kept as files.roots keeps them (by their change "
		     "times, with files.settle)",
		     once[root]);
}

/* Decide fd's class from scratch (its path), and for a KV file its whole verdict. */
static uint8_t classify(int fd, struct kvs_ident *id, struct verdict *v)
{
	char link[64], path[PATH_MAX];
	ssize_t n;

	memset(v, 0, sizeof(*v));
	v->dev = id->dev;
	v->ino = id->ino;
	v->dio_mem = 512;
	v->dio_off = 512;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, path, sizeof(path) - 1);
	if (n <= 0)
		return CLS_NOT_KV;
	path[n] = '\0';
	int root = under(path, roots, root_len, nroots);
	if (root < 0)
		return CLS_NOT_KV;
	v->root = (uint32_t)root;
	/* ext4, XFS and btrfs (iomap) zero the caller's buffer past the end of the file on a
	 * short O_DIRECT read; FUSE, NFS and tmpfs leave it alone.  The shim does the same. */
	struct statfs sf = {0};
	unsigned long type = fstatfs(fd, &sf) == 0 ? (unsigned long)sf.f_type : 0;
	int oroot = under(path, once, once_len, nonce);
	v->once_root = oroot >= 0;
	if (v->once_root) {
		v->fs_gen = kvs_ident_generation(fd, id) == 0;
		id->write_once = kvs_ident_by_birth(id, type);
		if (!id->write_once)
			say_no_birth_id(oroot);
	}
	v->fs_type = type;
	v->atime = (sf.f_flags & ST_NOATIME)	? KVS_ATIME_NEVER
		   : (sf.f_flags & ST_RELATIME) ? KVS_ATIME_RELATIME
						: KVS_ATIME_STRICT;
	v->zero_tail = type == 0xEF53 || type == 0x58465342 || type == 0x9123683EUL;
	v->node_clock = !stamps_local(type);
#ifdef STATX_DIOALIGN
	struct statx sx;
	if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
	    (sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_offset_align) {
		v->dio_mem = sx.stx_dio_mem_align ? sx.stx_dio_mem_align : 1;
		v->dio_off = sx.stx_dio_offset_align;
	}
#endif
	set_identity(v, id);
	return CLS_KV;
}

bool kvs_fdinfo_atime_due(int rule, const struct kvs_ident *id)
{
	uint64_t a = kvs_time_ns(id->atime), m = kvs_time_ns(id->mtime),
		 ch = kvs_time_ns(id->ctime);

	if (rule == KVS_ATIME_NEVER)
		return false;
	if (rule == KVS_ATIME_RELATIME && (a <= m || a <= ch))
		return true;
	/* The coarse clock (a tick old at most) is fine for a second's or a day's rule, and costs
	 * the hit path next to nothing. */
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME_COARSE, &ts);
	uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	return now > a && now - a >= (rule == KVS_ATIME_STRICT ? 1000000000ull : DAY_NS);
}

static int describe(int fd, struct kvs_fdinfo *out, bool known_only)
{
	struct entry *t = table_get(!known_only), *e = NULL;
	struct verdict v;
	struct kvs_ident id;
	uint8_t cls = CLS_UNKNOWN;
	int fl, r;

	memset(out, 0, sizeof(*out));
	if (t && fd >= 0 && fd < FD_SLOTS) {
		e = &t[fd];
		cls = atomic_load_explicit(&e->cls, memory_order_acquire); /* pairs with write */
	}
	if (cls == CLS_NOT_KV)
		return known_only ? -ENOENT : 0; /* no system call: it cannot have become one */
	if (known_only && cls != CLS_KV)
		return -ENOENT;
	uint32_t seq0 = e ? atomic_load_explicit(&e->seq, memory_order_acquire) : 0;
	r = kvs_ident_of_fd(fd, false, &id);
	if (r)
		return r;
	if (!S_ISREG(id.mode)) {
		if (e)
			entry_write(e, seq0, NULL, CLS_NOT_KV);
		return known_only ? -ENOENT : 0;
	}
	fl = kvs_sys_fcntl(fd, F_GETFL);
	if (fl < 0)
		return -errno;
	bool have = cls == CLS_KV && entry_read(e, &v) &&
		    atomic_load_explicit(&e->seq, memory_order_relaxed) == seq0 &&
		    v.dev == id.dev && v.ino == id.ino;
	if (have) {
		/* The same file as last time: only its identity may have moved. */
		if (v.once_root) {
			if (v.fs_gen)
				kvs_ident_generation(fd, &id);
			id.write_once = kvs_ident_by_birth(&id, (unsigned long)v.fs_type);
		}
		if (!same_identity(&v, &id)) {
			set_identity(&v, &id);
			entry_write(e, seq0, &v, CLS_KV);
		}
	} else {
		if (known_only)
			return -ENOENT;
		cls = classify(fd, &id, &v);
		if (e)
			entry_write(e, seq0, cls == CLS_KV ? &v : NULL, cls);
		if (cls != CLS_KV) {
			out->dev = id.dev;
			out->ino = id.ino;
			return 0;
		}
	}
	out->kv = true;
	out->write_once = v.write_once;
	out->direct = fl & O_DIRECT;
	out->append = fl & O_APPEND;
	/* An O_PATH descriptor reads nothing: the kernel answers EBADF, so must we. */
	out->readable = (fl & O_ACCMODE) != O_WRONLY && !(fl & O_PATH);
	out->size = id.size;
	out->dev = id.dev;
	out->ino = id.ino;
	uint64_t m = kvs_time_ns(id.mtime), ch = kvs_time_ns(id.ctime);
	out->changed_ns = m > ch ? m : ch;
	out->atime_rule = (int)v.atime;
	out->atime_due = kvs_fdinfo_atime_due(out->atime_rule, &id);
	out->block = v.block;
	out->dio_mem_align = v.dio_mem;
	out->dio_off_align = v.dio_off;
	out->dio_zero_tail = v.zero_tail;
	out->settle_ns = v.settle_ns;
	out->node_clock = v.node_clock;
	out->root = (int)v.root;
	return 0;
}

int kvs_fdinfo_get(int fd, struct kvs_fdinfo *out)
{
	kvs_unseen_looked(fd); /* a read or a write the shim saw */
	return describe(fd, out, false);
}

int kvs_fdinfo_known(int fd, struct kvs_fdinfo *out)
{
	kvs_unseen_looked(fd);
	return describe(fd, out, true);
}

bool kvs_fdinfo_hint_kv(int fd)
{
	struct entry *t = atomic_load_explicit(&table, memory_order_acquire);

	return t && fd >= 0 && fd < FD_SLOTS &&
	       atomic_load_explicit(&t[fd].cls, memory_order_relaxed) == CLS_KV;
}

int kvs_fdinfo_opened(int fd)
{
	char link[64], path[PATH_MAX];
	struct entry *t = nroots ? table_get(true) : NULL;
	ssize_t n;

	if (!t || fd < 0 || fd >= FD_SLOTS)
		return -2;
	struct entry *e = &t[fd];
	uint32_t seq0 = atomic_load_explicit(&e->seq, memory_order_acquire);
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, path, sizeof(path) - 1);
	if (n <= 0)
		return -2;
	path[n] = '\0';
	int root = under(path, roots, root_len, nroots);
	if (root < 0)
		entry_write(e, seq0, NULL,
			    CLS_NOT_KV); /* as classify would say, without the rest */
	return root;
}

bool kvs_fdinfo_not_kv(int fd)
{
	struct entry *t = atomic_load_explicit(&table, memory_order_acquire);

	return t && fd >= 0 && fd < FD_SLOTS &&
	       atomic_load_explicit(&t[fd].cls, memory_order_relaxed) == CLS_NOT_KV;
}

void kvs_fdinfo_forget(int fd)
{
	struct entry *t = atomic_load_explicit(&table, memory_order_acquire);

	if (!t || fd < 0 || fd >= FD_SLOTS)
		return;
	struct entry *e = &t[fd];
	/* Move the counter whatever the class: a look in progress on another thread (begun
	 * before the number changed hands) then finds it moved and stores nothing.  From an even
	 * value only: an odd one is a writer's between its CAS and its last store; it may store
	 * a class of the old file, which a look re-checks ((dev, ino) for KV) or, for NOT_KV,
	 * keeps until the next forget: the race of a program that uses a number while another
	 * thread replaces it. */
	uint32_t s = atomic_load_explicit(&e->seq, memory_order_relaxed);
	if (!(s & 1))
		atomic_compare_exchange_strong(&e->seq, &s, s + 2);
	atomic_store_explicit(&e->cls, CLS_UNKNOWN, memory_order_release);
}

void kvs_fdinfo_forget_range(unsigned int lo, unsigned int hi)
{
	struct entry *t = atomic_load_explicit(&table, memory_order_acquire);

	if (!t || lo >= FD_SLOTS)
		return;
	if (hi >= FD_SLOTS)
		hi = FD_SLOTS - 1;
	/* Numbers never looked at (counter 0) are left alone: close_range(3, ~0U) before an exec
	 * must not write (and so allocate) every page of the table. */
	for (unsigned int fd = lo; fd <= hi; fd++)
		if (atomic_load_explicit(&t[fd].seq, memory_order_relaxed))
			kvs_fdinfo_forget((int)fd);
}
