/*
 * publish: the check after a storage read, and publication (see publish.h).
 */
#include <errno.h>
#include <sys/stat.h>
#include <time.h>

#include "publish.h"
#include "sys.h"

enum kvs_verdict kvs_check_file(int fd, uint64_t dev, uint64_t ino, bool write_once,
				const struct kvs_key *block)
{
	struct kvs_ident id;
	struct kvs_key now;

	if (kvs_ident_of_fd(fd, write_once, &id) < 0 || id.dev != dev || id.ino != ino)
		return KVS_V_WRONG_FILE;
	kvs_ident_key(&id, &now);
	return now.block_lo == block->block_lo && now.block_hi == block->block_hi ? KVS_V_KEEP
										  : KVS_V_HAND_OUT;
}

/*
 * Why an unsettled shard may be kept until its load started plus files.settle, and why the
 * check after the read stays (the contract of operations.md: after a write has returned, a
 * read that starts files.settle later never returns old bytes).
 *
 * A load starts at t0 (this call, before the storage read is submitted).  Every write that
 * had returned by t0 is in the bytes the read gets.  A write W the bytes may miss had not
 * returned by t0: W returned at some tW > t0.  The load is kept until t0 + settle, and no pin
 * taken at or after that moment is served by it (slot.c drops the slot, loading or READY).
 * So every read it serves started before t0 + settle < tW + settle: less than files.settle
 * after W returned, which the contract allows.  From t0 + settle on, one process of the node
 * loads the shard again, and that load starts after W returned: it is kept for good if the
 * file is settled by then.
 *
 * Settled means that no write can leave the identity as it is: the file's last change is
 * files.settle old (longer than the file system's timestamp tick, its attribute caches and a
 * write in flight), so a later write moves mtime and the bytes get another block id.  On a
 * file system whose stamps another machine's clock wrote (fr->node_clock), a stamp may make a
 * new file look old; there the identity must also have been seen by this node for
 * files.settle, on this node's clock (seen.c).
 *
 * The check after each read (kvs_check_file) stays: a file that is no longer (dev, ino) fails
 * the load, and one whose identity moved while it was read is handed to this load's readers
 * only, since its bytes may be half old, half new under either identity.
 */
struct kvs_keep kvs_keep_for(struct kvs_cache *c, const struct kvs_key *block,
			     const struct kvs_fresh *fr, uint64_t dev, uint64_t ino)
{
	struct timespec ts;
	struct kvs_keep k = {.dev = dev, .ino = ino};
	uint64_t mono = kvs_node_ns(); /* shared: the initial time namespace's */

	/* Before the clocks: a write that begins after the mark moves it (the publication's
	 * check), one in flight now refuses it. */
	k.marked = kvs_cache_write_mark(c, dev, ino, &k.mark);
	/* A file mapped writable anywhere on the node now: nothing of this load is kept, even if
	 * the mapping goes before the publication (a store into a dirty page moves no stamp, so
	 * the load may be keyed by an identity that the drops at mmap and munmap never name). */
	k.marked = k.marked && !kvs_cache_map_busy(c, dev, ino);
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t real = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	/* A stamp in the future (another clock, or a lie) is not settled.  No settle window (a
	 * write-once root, or files.settle = 0): nothing to wait for. */
	bool settled =
	    !fr->settle_ns || (real >= fr->changed_ns && real - fr->changed_ns >= fr->settle_ns);
	if (fr->node_clock && fr->settle_ns) {
		uint64_t seen = kvs_cache_first_seen(c, block, mono); /* recorded either way */

		settled = settled && mono - seen >= fr->settle_ns;
	}
	if (!settled)
		k.until = mono + fr->settle_ns;
	if (fr->revalidate_ns && (!k.until || mono + fr->revalidate_ns < k.until))
		k.until = mono + fr->revalidate_ns;
	return k;
}

enum kvs_verdict kvs_publish_loaded(struct kvs_cache *c, const struct kvs_pin *pin,
				    enum kvs_verdict v, uint32_t size, const struct kvs_keep *keep)
{
	/* A write of the file in flight at the mark, or begun or ended since, or a writable shared
	 * mapping of it anywhere on the node now: handed out, not kept. */
	if (v == KVS_V_KEEP &&
	    (!(keep->marked && kvs_cache_write_quiet(c, keep->dev, keep->ino, keep->mark)) ||
	     kvs_cache_map_busy(c, keep->dev, keep->ino)))
		v = KVS_V_HAND_OUT;
	if (v == KVS_V_WRONG_FILE)
		kvs_cache_mark_failed(c, pin, ESTALE);
	else if (v == KVS_V_KEEP)
		kvs_cache_mark_ready(c, pin, size);
	else
		kvs_cache_mark_ready_unkept(c, pin, size);
	return v;
}
