/*
 * publish: the check after a storage read, and publication (see publish.h).
 */
#include <errno.h>
#include <sys/stat.h>

#include "publish.h"

enum kvs_verdict kvs_check_file(int fd, uint64_t dev, uint64_t ino, const struct kvs_key *block)
{
	struct stat st;
	struct kvs_key now;

	if (fstat(fd, &st) < 0 || (uint64_t)st.st_dev != dev || (uint64_t)st.st_ino != ino)
		return KVS_V_WRONG_FILE;
	kvs_block_id(&st, &now);
	return now.block_lo == block->block_lo && now.block_hi == block->block_hi ? KVS_V_KEEP
										  : KVS_V_HAND_OUT;
}

void kvs_publish_loaded(struct kvs_cache *c, const struct kvs_pin *pin, enum kvs_verdict v,
			bool keep, uint32_t size)
{
	if (v == KVS_V_WRONG_FILE)
		kvs_cache_mark_failed(c, pin, ESTALE);
	else if (v == KVS_V_KEEP && keep)
		kvs_cache_mark_ready(c, pin, size);
	else
		kvs_cache_mark_ready_unkept(c, pin, size);
}
