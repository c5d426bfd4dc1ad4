/*
 * sys: see sys.h.
 */
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>

#include "sys.h"

int kvs_thread_start(pthread_t *th, void *(*fn)(void *), void *arg, size_t stack)
{
	pthread_attr_t a;
	sigset_t all, old;
	pthread_t ignored;
	int r;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&a);
	if (stack)
		pthread_attr_setstacksize(&a, stack);
	if (!th)
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	r = pthread_create(th ? th : &ignored, &a, fn, arg);
	pthread_attr_destroy(&a);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return -r;
}

void kvs_close_if_ours(int fd, uint64_t dev, uint64_t ino)
{
	struct stat st;
	int fl;

	if (fd < 0)
		return;
	fl = (int)syscall(SYS_fcntl, fd, F_GETFD);
	if (fl >= 0 && (fl & FD_CLOEXEC) && fstat(fd, &st) == 0 && (uint64_t)st.st_dev == dev &&
	    (uint64_t)st.st_ino == ino)
		syscall(SYS_close, fd);
}
