/*
 * why: see why.h.  One word per descriptor number remembers what was said: the upper 48 bits
 * hold a tag of the file (dev, ino), the lower 16 one bit per cause.  A different tag means
 * another file now has the number, so the word starts over.  Two threads may both print the
 * same line when they race on a fresh word; a debug line twice is harmless, and the word needs
 * no lock.  The table is static and untouched (so never paged in) until the first debug line.
 */
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "why.h"

#define WHY_SLOTS  65536
#define CAUSE_BITS 16
_Static_assert(KVS_WHY_NCAUSES <= CAUSE_BITS, "one bit per cause in a word's low 16 bits");

static _Atomic uint64_t said[WHY_SLOTS];

static const char *const text[KVS_WHY_NCAUSES] = {
    [KVS_WHY_NOT_KV] = "not under files.roots",
    [KVS_WHY_UNREADABLE] = "not open for reading",
    [KVS_WHY_BUFFERED] = "a buffered read (no O_DIRECT) and files.buffered = false",
    [KVS_WHY_SMALL] = "shorter than files.min_read",
    [KVS_WHY_MISALIGNED] = "O_DIRECT, but offset, length or buffer not aligned as it needs",
    [KVS_WHY_BUFFERS] = "the destination is not memory the shim may write",
    [KVS_WHY_DEVICE] = "a cuFile destination the shim cannot copy to",
    [KVS_WHY_NO_CACHE] = "the cache is not attached (see the warning before)",
    [KVS_WHY_ANCHOR] = "the shim could not hold the file open",
    [KVS_WHY_FALLBACK] = "the cache failed the read; storage answered",
    [KVS_WHY_MMAP] = "mapped with mmap, so its reads are page faults",
    [KVS_WHY_STDIO] =
	"an fread on a stream with bytes to write, ungetc'd bytes, or wide characters",
};

/* A tag of the file in the word's upper 48 bits, never 0 (0 marks a word never used). */
static uint64_t tag_of(uint64_t dev, uint64_t ino)
{
	uint64_t h = (ino * 0x9E3779B97F4A7C15ull) ^ (dev * 0xC2B2AE3D27D4EB4Full);

	h &= ~((1ull << CAUSE_BITS) - 1);
	return h ? h : 1ull << CAUSE_BITS;
}

/* Mark (fd, tag, why) said; true when it was not said before. */
static bool first_time(int fd, uint64_t tag, enum kvs_why why)
{
	_Atomic uint64_t *w = &said[fd];
	uint64_t old = atomic_load_explicit(w, memory_order_relaxed), next;

	do {
		if ((old & ~((1ull << CAUSE_BITS) - 1)) == tag) {
			if (old & (1ull << why))
				return false;
			next = old | (1ull << why);
		} else {
			next = tag | (1ull << why);
		}
	} while (!atomic_compare_exchange_weak_explicit(w, &old, next, memory_order_relaxed,
							memory_order_relaxed));
	return true;
}

void kvs_why(int fd, uint64_t dev, uint64_t ino, enum kvs_why why, int err)
{
	char link[32], path[PATH_MAX];
	int saved = errno;
	ssize_t n;

	if (!kvs_log_wants(KVS_LOG_DEBUG) || fd < 0 || fd >= WHY_SLOTS ||
	    (unsigned)why >= KVS_WHY_NCAUSES || !first_time(fd, tag_of(dev, ino), why))
		return;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, path, sizeof(path) - 1);
	if (n < 0)
		n = snprintf(path, sizeof(path), "?");
	path[n] = '\0';
	if (err)
		kvs_log_line(KVS_LOG_DEBUG, "fd %d (%s): passed through: %s (%s)", fd, path,
			     text[why], kvs_log_error_text(err));
	else
		kvs_log_line(KVS_LOG_DEBUG, "fd %d (%s): passed through: %s", fd, path, text[why]);
	errno = saved;
}
