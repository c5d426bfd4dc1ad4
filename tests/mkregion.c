/*
 * mkregion: make the region the configuration names, for tests/tools_test.sh.
 *
 *   mkregion           create (or attach to) the region, add to two counters, detach, exit 0
 *   mkregion FILE      the same, but stay attached: write FILE once attached (the test waits
 *                      for it), then sleep until killed
 *
 * Counters added per run: requests += 3, backend_bytes += 4096; the rank is set to 5.  The
 * configuration comes from the environment (KVSHIM_CONFIG, KVSHIM_<SECTION>_<KEY>) as for the
 * shim.  Exit status 1 with a message on stderr on any failure; the note kvs_cache_open gives
 * when it replaced a region (cache.on_mismatch = rebuild) goes to stderr too.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "cache_params.h"
#include "config.h"

/* Create FILE to tell the test this process is attached; 0 or -errno. */
static int signal_ready(const char *file)
{
	int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	if (fd < 0)
		return -errno;
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	char msg[KVS_CONFIG_MSG_MAX];
	struct kvs_cache *c = NULL;
	struct kvs_config *cfg;
	int r;

	cfg = calloc(1, sizeof(*cfg));
	if (!cfg) {
		fprintf(stderr, "mkregion: out of memory\n");
		return 1;
	}
	if (kvs_config_load(cfg, NULL, NULL, msg, sizeof(msg))) {
		fprintf(stderr, "mkregion: %s\n", msg);
		return 1;
	}
	r = kvs_cache_open(KVS_CACHE_PARAMS(cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg));
	if (r) {
		fprintf(stderr, "mkregion: %s\n", *msg ? msg : strerror(-r));
		return 1;
	}
	if (*msg) /* a region replaced (cache.on_mismatch = rebuild) */
		fprintf(stderr, "mkregion: %s\n", msg);
	kvs_cache_count(c, KVS_CTR_requests, 3);
	kvs_cache_count(c, KVS_CTR_backend_bytes, 4096);
	kvs_cache_set_rank(c, 5);
	if (argc > 1) {
		r = signal_ready(argv[1]);
		if (r) {
			fprintf(stderr, "mkregion: %s: %s\n", argv[1], strerror(-r));
			return 1;
		}
		for (;;)
			pause();
	}
	kvs_cache_close(c);
	free(cfg);
	return 0;
}
