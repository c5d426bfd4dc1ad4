/*
 * harm2_ctor: a library whose constructor reads a KV file, after a pause, while the thread
 * that dlopen()ed it holds the dynamic loader's lock (harm2 initlock): if the shim's first
 * hooked call is being initialised on another thread meanwhile, and that initialisation waits
 * for the loader's lock, the constructor must not wait for it in turn.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((visibility("default"))) int harm2_ctor_result = -1;

__attribute__((constructor)) static void ctor(void)
{
	/* Static, not mmap()ed: mmap is hooked, and nothing hooked may run here before the main
	 * thread's first call. */
	static char buf[1 << 20] __attribute__((aligned(4096)));
	const char *path = getenv("KVS_HARM2_FILE");
	int fd;

	usleep(300000); /* the main thread calls its first hooked function meanwhile */
	if (!path || (fd = open(path, O_RDONLY | O_DIRECT)) < 0)
		return;
	harm2_ctor_result = (int)pread(fd, buf, 1 << 20, 0);
	close(fd);
}
