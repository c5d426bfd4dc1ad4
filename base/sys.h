/*
 * sys: the system facilities the libraries (cache/, loader/) and the shim use in several
 * places, wrapped once.  Part of base/, the ground floor: it depends on nothing in the project,
 * and its system calls are raw (raw.h), never a name the shim exports.
 *
 *   futex wait/wake  private (threads of one process) or shared (processes mapping the
 *                    region); a wait returns on a wake, a value change, a signal or timeout,
 *                    so every caller loops on its own condition.
 *   kvs_mono_ns      CLOCK_MONOTONIC in nanoseconds.
 *   kvs_thread_start a thread started with every signal blocked (the host's signals are not
 *                    ours to take), optionally detached, with a small stack or the one a
 *                    thread of the program gets.
 */
#ifndef KVS_SYS_H
#define KVS_SYS_H

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "raw.h"

/* Sleep while *word == expect, at most ns nanoseconds (0: no limit). */
static inline void kvs_futex_wait(_Atomic uint32_t *word, uint32_t expect, uint64_t ns, bool shared)
{
	struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
			      .tv_nsec = (long)(ns % 1000000000ull)};

	kvs_syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT | (shared ? 0 : FUTEX_PRIVATE_FLAG),
		    expect, ns ? &ts : NULL, NULL, 0);
}

/* Wake up to n sleepers on word (INT_MAX: all).  Harmless on memory nobody waits on. */
static inline void kvs_futex_wake(_Atomic uint32_t *word, int n, bool shared)
{
	kvs_syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE | (shared ? 0 : FUTEX_PRIVATE_FLAG), n,
		    NULL, NULL, 0);
}

static inline uint64_t kvs_mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * CLOCK_MONOTONIC as the node's initial time namespace reads it, in nanoseconds: the clock of
 * every time the region shares between processes (slot expiries, the seen table), whatever
 * time namespace a process runs in.  A process in one with a monotonic offset (unshare --time,
 * a container runtime that virtualises uptime) reads its own clock that much ahead or behind;
 * the offset (/proc/self/timens_offsets, relative to the initial namespace) is taken off.
 * kvs_node_clock_init reads it, at every open of a region (a fork child may live in another
 * namespace than its parent); without the file (no time namespaces, no /proc) it is 0.
 */
extern _Atomic int64_t kvs_node_offset_ns;
void kvs_node_clock_init(void);

static inline uint64_t kvs_node_ns(void)
{
	return kvs_mono_ns() -
	       (uint64_t)atomic_load_explicit(&kvs_node_offset_ns, memory_order_relaxed);
}

/*
 * The shim's own long-held descriptors (the region's, the populate walk's, the anchors, kernel
 * AIO's /dev/null) live among the program's numbers, and a program may
 * close them: a daemon's close loop, close_range, a dup2 onto a number it thinks free.  Its
 * next open may then get the number.  Using the number from then on would act on the
 * program's file (a fallocate that grows it, an unlock of its record locks, a close of its
 * pipe).
 *
 * kvs_fd_is: is fd still a descriptor of ours, as far as one can tell?  Open, O_CLOEXEC (every
 * descriptor the shim makes has it) and of the file (dev, ino).  A number the program reopened
 * on the same file with O_CLOEXEC passes; the owners are therefore told of the program's
 * closes by the hooks as well (kvs_ownfd_closing, anchor.h's kvs_anchor_numbers_closing).
 *
 * kvs_close_if_ours: close fd only if kvs_fd_is.  A raw close: never the program's hooked one.
 */
bool kvs_fd_is(int fd, uint64_t dev, uint64_t ino);
void kvs_close_if_ours(int fd, uint64_t dev, uint64_t ino);

/* kvs_fd_move_high: a descriptor the shim just opened, moved above the numbers programs use
 * (1024, or half the soft RLIMIT_NOFILE where that is lower; F_DUPFD_CLOEXEC, the old number
 * closed), so that a program's dup2 onto a small number never lands on it (and never drops
 * the program's record locks with it).  Returns the new number, or fd itself where nothing is
 * free up there.  kvs_fd_dup_high: a new descriptor of fd's file (F_DUPFD_CLOEXEC) up there,
 * else at the lowest free number; -1 and errno untouched on failure. */
int kvs_fd_move_high(int fd);
int kvs_fd_dup_high(int fd);

/* Clear bits lo to hi (inclusive, clipped to nbits) of the bitmap map, calling each(bit, arg)
 * for every bit this call cleared (each may be NULL).  Lock-free, async-signal-safe: for the
 * close hooks' "these numbers are the program's now" (anchor.c, api/kaio.c). */
void kvs_bitmap_take_range(_Atomic uint64_t *map, unsigned int nbits, unsigned int lo,
			   unsigned int hi, void (*each)(unsigned int bit, void *arg), void *arg);

/*
 * kvs_ownfd: one such descriptor that other threads use while the program may close its
 * number.  Who writes what:
 *
 *   word      the number (low 32 bits, -1 for none) and a generation (high 32 bits), one
 *             word so that a move is one CAS: the owner sets it (kvs_ownfd_set, before others
 *             can see it, or kvs_ownfd_publish, by CAS from none); kvs_ownfd_closing moves it
 *             (a new number, or none) and kvs_ownfd_close takes it out, each by CAS with the
 *             next generation.
 *   users[g]  the calls on a number of a generation of parity g: raised, then the word looked
 *             at again (sequentially consistent, against the mover's CAS and its look at the
 *             count: a user counted after the move sees the new word and lets go).
 *   dev, ino  its file, written before the number is set.
 *
 * kvs_ownfd_get: the number, held (kvs_ownfd_put it with the ticket) while the caller makes
 * its calls on it, or -1 (nothing held) when there is none or it is no longer ours (kvs_fd_is:
 * a close the hooks did not see).
 *
 * kvs_ownfd_closing: the program is about to close the numbers lo to hi.  A number among them
 * moves to 1024 or above hi (F_DUPFD_CLOEXEC: the same open file description, so its record
 * locks stay; high, so that a close loop over the low numbers moves it once), or, with no
 * number free above hi (a close_range to the top), becomes none; then the calls on the old
 * number's generation are waited for (at most KVS_OWNFD_WAIT_NS; never on a thread that holds
 * one itself: a signal handler that interrupted it), so the program's close comes after them.
 * Async-signal-safe, as close is.
 *
 * kvs_ownfd_close: the owner is done with it: closed if still ours while the word still names
 * it and the closer counts as its user, so that a program's close of the number waits for
 * that close; then taken out.
 *
 * kvs_ownfd_peek: the number now, for the owner before it is shared, or for calls that cannot
 * harm another file (fstat, fstatvfs).
 */
struct kvs_ownfd {
	_Atomic uint64_t word;
	_Atomic uint32_t users[2];
	uint64_t dev, ino;
};
#define KVS_OWNFD_INIT                                                                             \
	{                                                                                          \
		0xffffffffull, {0, 0}, 0, 0                                                        \
	}
#define KVS_OWNFD_WAIT_NS 2000000000ull
int kvs_ownfd_get(struct kvs_ownfd *o, unsigned int *ticket);
void kvs_ownfd_put(struct kvs_ownfd *o, unsigned int ticket);
void kvs_ownfd_closing(struct kvs_ownfd *o, unsigned int lo, unsigned int hi);
void kvs_ownfd_close(struct kvs_ownfd *o);
void kvs_ownfd_set(struct kvs_ownfd *o, int fd);
bool kvs_ownfd_publish(struct kvs_ownfd *o, int fd);
/* The parent's users are not the fork child's: forget them. */
void kvs_ownfd_atfork_child(struct kvs_ownfd *o);

static inline int kvs_ownfd_peek(struct kvs_ownfd *o)
{
	return (int)(uint32_t)atomic_load(&o->word);
}

/* Is any bit lo to hi of map set (loads only)?  Is o's number among lo to hi now?  For the
 * close hooks' first look, which costs no system call. */
bool kvs_bitmap_any(_Atomic uint64_t *map, unsigned int nbits, unsigned int lo, unsigned int hi);
bool kvs_ownfd_in(struct kvs_ownfd *o, unsigned int lo, unsigned int hi);

/* Wait (at most max_ns) until bits lo to hi of map are all clear: a closer that announced a
 * number there (set its bit) finished.  For the close hooks (anchor.c, api/kaio.c). */
void kvs_bitmap_wait_clear(_Atomic uint64_t *map, unsigned int nbits, unsigned int lo,
			   unsigned int hi, uint64_t max_ns);

/* Stacks for kvs_thread_start.  KVS_STACK_OWN: a thread that runs only the shim's code and
 * system calls.  KVS_STACK_FOREIGN: one that calls into other libraries (the CUDA driver,
 * libcufile), whose call chains are theirs to size: it gets the stack a thread the program
 * creates gets (pthread_getattr_default_np; 8 MiB by default, reserved, not committed). */
#define KVS_STACK_OWN	  (64u * 1024)
#define KVS_STACK_FOREIGN 0u

/* Start fn(arg) with every signal blocked and a stack of stack bytes (KVS_STACK_*); detached
 * if th is NULL.  Returns 0 or -errno. */
int kvs_thread_start(pthread_t *th, void *(*fn)(void *), void *arg, size_t stack);

/* A 64-bit mix of a file's (st_dev, st_ino) (murmur3's finaliser): the one hash of a file's
 * identity for every table keyed by it (the region's write sequences, the anchors' locked files,
 * atime's recent notes).  The region's tables depend on its value: changing it needs a new layout
 * version. */
static inline uint64_t kvs_hash_file(uint64_t dev, uint64_t ino)
{
	uint64_t x = dev * 0x9e3779b97f4a7c15ULL ^ ino;

	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ULL;
	x ^= x >> 33;
	return x;
}

#endif
