/*
 * dlsym_sem_lib: a shared library of the dlsym semantics test (dlsym_sem.c), standing for an
 * interposer of the program's own: it defines read() and finds the one it wraps with
 * dlsym(RTLD_NEXT, "read"), called from this library, so glibc must take this library as the
 * caller.  If the caller were taken to be the preloaded shim (which comes before this library
 * in the search order), the answer would be this library's own read, and read would recurse.
 */
#include <dlfcn.h>
#include <unistd.h>

/* Not a tail call (noinline, and the result passes through a volatile): glibc takes the
 * caller from dlsym's return address, which must lie in this library. */
__attribute__((visibility("default"), noinline)) void *dlsym_sem_next_read(void)
{
	void *volatile p = dlsym(RTLD_NEXT, "read");

	return p;
}

__attribute__((visibility("default"))) ssize_t read(int fd, void *buf, size_t n)
{
	ssize_t (*next)(int, void *, size_t);

	*(void **)&next = dlsym_sem_next_read();
	return next ? next(fd, buf, n) : -1;
}
