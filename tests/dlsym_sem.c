/*
 * dlsym_sem: what dlsym and dlvsym answer, printed as lines that do not depend on where the
 * libraries were mapped, so that a run under LD_PRELOAD=libkvshim.so can be compared with a
 * run without it (dlsym_sem_test.sh does):
 *   next_read_from_lib OBJECT+OFFSET   dlsym(RTLD_NEXT, "read") called from dlsym_sem_lib
 *   read_through_lib OK|FAIL           a read() through the library's wrapper works
 *   default_cufile_before NULL|SET     dlsym(RTLD_DEFAULT, "cuFileRead"), no libcufile loaded
 *   dlerror_after_default NULL|SET     dlerror() right after that
 *   dlerror_after_missing NULL|SET     dlerror() after dlsym(RTLD_DEFAULT, a missing name)
 *   dlvsym_libc_dlsym OK|FAIL          dlvsym(libc, "dlsym", "GLIBC_2.34") finds getpid
 *   default_cufile_after NULL|SET      the same as before, once LIBCUFILE is dlopen()ed
 *                                      RTLD_GLOBAL (omitted without an argument)
 *   cufile_missing_name NULL|SET, dlerror_after_cufile_missing NULL|SET
 *                                      dlsym(libcufile handle, "cuFileNoSuchName") and dlerror
 *   dlsym_sem [LIBCUFILE]
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void *dlsym_sem_next_read(void);

static const char *set(const void *p)
{
	return p ? "SET" : "NULL";
}

/* "OBJECT+OFFSET" of p: the base name of the object holding it and the offset in it. */
static void where(const char *label, void *p)
{
	Dl_info in;

	if (!p || !dladdr(p, &in) || !in.dli_fname) {
		printf("%s %s\n", label, p ? "UNKNOWN" : "NULL");
		return;
	}
	const char *base = strrchr(in.dli_fname, '/');
	printf("%s %s+%#lx\n", label, base ? base + 1 : in.dli_fname,
	       (unsigned long)((char *)p - (char *)in.dli_fbase));
}

int main(int argc, char **argv)
{
	void *(*glibc_dlsym)(void *, const char *);
	void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
	char c;
	int fd;
	void *p;

	where("next_read_from_lib", dlsym_sem_next_read());
	fd = open("/proc/self/cmdline", O_RDONLY);
	printf("read_through_lib %s\n", fd >= 0 && read(fd, &c, 1) == 1 ? "OK" : "FAIL");
	close(fd);

	dlerror();
	p = dlsym(RTLD_DEFAULT, "cuFileRead");
	printf("default_cufile_before %s\n", set(p));
	printf("dlerror_after_default %s\n", set(dlerror()));
	p = dlsym(RTLD_DEFAULT, "kvshim_test_no_such_symbol");
	printf("dlerror_after_missing %s\n", set(dlerror()));

	*(void **)&glibc_dlsym = libc ? dlvsym(libc, "dlsym", "GLIBC_2.34") : NULL;
	printf("dlvsym_libc_dlsym %s\n",
	       glibc_dlsym && glibc_dlsym(libc, "getpid") == dlsym(libc, "getpid") &&
		       glibc_dlsym(libc, "getpid")
		   ? "OK"
		   : "FAIL");

	if (argc > 1) {
		void *h = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);

		if (!h) {
			printf("dlopen_libcufile FAIL %s\n", dlerror());
			return 2;
		}
		printf("default_cufile_after %s\n", set(dlsym(RTLD_DEFAULT, "cuFileRead")));
		dlerror();
		p = dlsym(h, "cuFileNoSuchName");
		printf("cufile_missing_name %s\n", set(p));
		printf("dlerror_after_cufile_missing %s\n", set(dlerror()));
	}
	return 0;
}
