/*
 * libkvshim-reenter.so: a dlsym that calls read() before it answers, preloaded ahead of
 * libkvshim.so (hostile_test.sh case 11).  The shim resolves the real libc functions with
 * dlsym; when that dlsym re-enters one of the shim's hooks on the same thread, resolution must
 * not wait for itself (it once did: pthread_once on the same control, a deadlock).  Once the
 * shim interposes dlsym itself, this is what every lookup through it looks like.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

__attribute__((visibility("default"))) void *dlsym(void *handle, const char *name)
{
	static void *(*real)(void *, const char *);
	char c;
	int fd = open("/dev/zero", O_RDONLY | O_CLOEXEC);

	if (fd >= 0) {
		(void)!read(fd, &c, 1); /* a hooked call, from inside the shim's own resolution */
		close(fd);
	}
	if (!real)
		real = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
	if (!real)
		real = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
	return real ? real(handle, name) : NULL;
}
