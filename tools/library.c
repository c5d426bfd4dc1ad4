/*
 * library: where the shim's library is, for `kvshim run` (which preloads it) and `kvshim check`
 * (which checks it); see cmd_common.h.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd_common.h"

int tool_usable_file(const char *path, char *out)
{
	if (!realpath(path, out))
		return -errno;
	if (access(out, R_OK) < 0)
		return -errno;
	return 0;
}

int tool_find_library(char *lib, char *why, size_t whylen)
{
	static const char *const rel[] = {"", "/../lib", "/../shim"};
	const char *env = getenv("KVSHIM_LIBRARY");
	char self[PATH_MAX], cand[PATH_MAX + 32];
	ssize_t n;
	char *slash;
	int r;

	if (env && *env) {
		r = tool_usable_file(env, lib);
		if (r)
			snprintf(why, whylen, "KVSHIM_LIBRARY=%s: %s", env, strerror(-r));
		return r;
	}
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n < 0) {
		r = -errno;
		snprintf(why, whylen,
			 "cannot find " SHIM_NAME " (/proc/self/exe: %s); set KVSHIM_LIBRARY",
			 strerror(-r));
		return r;
	}
	self[n] = '\0';
	slash = strrchr(self, '/');
	if (slash)
		*slash = '\0';
	for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
		snprintf(cand, sizeof(cand), "%s%s/" SHIM_NAME, self, rel[i]);
		if (tool_usable_file(cand, lib) == 0)
			return 0;
	}
	snprintf(why, whylen,
		 "cannot find " SHIM_NAME " in %s, %s/../lib or %s/../shim; set KVSHIM_LIBRARY",
		 self, self, self);
	return -ENOENT;
}
