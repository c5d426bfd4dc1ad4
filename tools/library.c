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

int tool_set_preload(const char *lib, bool first)
{
	const char *old = getenv("LD_PRELOAD");
	size_t len = strlen(lib), cap = len + (old ? strlen(old) : 0) + 2;
	char *val, *p;
	int r = 0;

	/* The dynamic loader splits LD_PRELOAD at colons and spaces. */
	if (strpbrk(lib, ": \t")) {
		tool_err("%s: a path in LD_PRELOAD cannot hold a colon or a space", lib);
		return -EINVAL;
	}
	val = malloc(cap);
	if (!val) {
		tool_err("out of memory");
		return -ENOMEM;
	}
	p = val;
	if (first) {
		memcpy(p, lib, len);
		p += len;
	}
	while (old && *old) {
		size_t w = strcspn(old, ": \t");

		if (w && !(w == len && !memcmp(old, lib, len))) {
			if (p != val)
				*p++ = ':';
			memcpy(p, old, w);
			p += w;
		}
		old += w;
		old += strspn(old, ": \t");
	}
	if (!first) {
		if (p != val)
			*p++ = ':';
		memcpy(p, lib, len);
		p += len;
	}
	*p = '\0';
	if (setenv("LD_PRELOAD", val, 1) < 0) {
		r = -errno;
		tool_err("cannot set LD_PRELOAD: %s", strerror(-r));
	}
	free(val);
	return r;
}
