/*
 * log: see log.h.  The printed-causes mask is an atomic word so that two threads reporting the
 * same cause at once print it once.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "config.h"
#include "log.h"

static _Atomic unsigned printed;
static _Atomic int max_level = KVS_LOG_WARN;

void kvs_log_set_level(int level)
{
	atomic_store(&max_level, level);
}

void kvs_log_once(enum kvs_cause cause, int level, const char *fmt, ...)
{
	char buf[600];
	va_list ap;
	int n;

	if (level > atomic_load(&max_level))
		return;
	if (atomic_fetch_or(&printed, 1u << cause) & (1u << cause))
		return;
	n = snprintf(buf, sizeof(buf), "kvshim: ");
	va_start(ap, fmt);
	n += vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(buf) - 2)
		n = (int)sizeof(buf) - 2;
	buf[n++] = '\n';
	syscall(SYS_write, 2, buf, (size_t)n);
}
