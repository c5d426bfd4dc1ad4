/*
 * log: see log.h.  The printed-causes mask is an atomic word so that two threads reporting the
 * same cause at once print it once.
 *
 * Every line is "kvshim: <time> pid <pid> <level>: <message>\n".  The time is formatted here,
 * from clock_gettime(CLOCK_REALTIME) and a days-to-civil conversion, because localtime and
 * strftime take the libc's time-zone lock, which a host may hold in a thread we interrupt.
 *
 * With shim.log_file set, each message opens the file (O_APPEND, so lines from several
 * processes do not overwrite each other), writes one line and closes it, all through raw system
 * calls so that no hook of ours runs.  Holding no descriptor between messages keeps the shim out
 * of its host's descriptor table: a host that closes every fd above 2, or dup2()s over ours,
 * cannot make us write into one of its files.  Messages are at most one per cause per process,
 * so the extra open is nothing (kvs_log_line, at debug only, says a little more: once per
 * descriptor and cause).  log_path is written once, by init() before any message of an
 * attached process, and only read afterwards.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "raw.h"

static _Atomic unsigned printed;
static _Atomic int max_level = KVS_LOG_WARN;
static char log_path[KVS_CONFIG_STR_MAX];
static int log_path_bad; /* an errno that makes log_path unusable, or 0 */
static atomic_flag open_failed_said = ATOMIC_FLAG_INIT;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void kvs_log_set_level(int level)
{
	atomic_store(&max_level, level);
}

void kvs_log_set_file(const char *path)
{
	size_t n = 0, len = path ? strlen(path) : 0;

	log_path[0] = '\0';
	log_path_bad = 0;
	if (!len)
		return;
	/* A relative name is taken from the working directory now, not at each message. */
	if (path[0] != '/' && kvs_syscall(SYS_getcwd, log_path, sizeof(log_path)) > 0) {
		n = strlen(log_path);
		if (n + 1 < sizeof(log_path) && log_path[n - 1] != '/')
			log_path[n++] = '/';
	}
	if (n + len >= sizeof(log_path)) {
		snprintf(log_path, sizeof(log_path), "%s", path);
		log_path_bad = ENAMETOOLONG; /* said at the first message, which goes to stderr */
		return;
	}
	memcpy(log_path + n, path, len + 1);
}

/* Write "YYYY-MM-DDTHH:MM:SS.mmmZ" (24 bytes, no terminator) at out. */
static void format_time(char *out)
{
	struct timespec ts = {0, 0};
	long long days, secs;
	unsigned doe, yoe, doy, mp, d, m, ms;
	long long era, y;
	unsigned v[6];
	static const unsigned width[6] = {4, 2, 2, 2, 2, 2};
	static const char sep[6] = {'-', '-', 'T', ':', ':', '.'};

	clock_gettime(CLOCK_REALTIME, &ts);
	secs = (long long)ts.tv_sec;
	days = secs / 86400;
	secs %= 86400;
	if (secs < 0) {
		secs += 86400;
		days--;
	}
	/* civil_from_days (H. Hinnant): the proleptic Gregorian date of a day count from 1970. */
	days += 719468;
	era = (days >= 0 ? days : days - 146096) / 146097;
	doe = (unsigned)(days - era * 146097);
	yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	y = (long long)yoe + era * 400;
	doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
	mp = (5 * doy + 2) / 153;
	d = doy - (153 * mp + 2) / 5 + 1;
	m = mp < 10 ? mp + 3 : mp - 9;
	y += m <= 2;
	ms = (unsigned)(ts.tv_nsec / 1000000);

	v[0] = (unsigned)(y < 0 ? 0 : y > 9999 ? 9999 : y);
	v[1] = m;
	v[2] = d;
	v[3] = (unsigned)(secs / 3600);
	v[4] = (unsigned)(secs / 60 % 60);
	v[5] = (unsigned)(secs % 60);
	for (int i = 0; i < 6; i++) {
		for (unsigned w = width[i], x = v[i]; w > 0; w--, x /= 10)
			out[w - 1] = (char)('0' + x % 10);
		out += width[i];
		*out++ = sep[i];
	}
	out[2] = (char)('0' + ms % 10);
	out[1] = (char)('0' + ms / 10 % 10);
	out[0] = (char)('0' + ms / 100);
	out[3] = 'Z';
}

/* Format the prefix of a line at level into buf; returns its length. */
static int format_prefix(char *buf, size_t size, int level)
{
	char when[25];

	format_time(when);
	when[24] = '\0';
	return snprintf(buf, size, "kvshim: %s pid %ld %s: ", when, (long)getpid(),
			level >= 0 && level <= KVS_LOG_DEBUG ? level_names[level] : "?");
}

/* The text of errno e, without strerror's translation lookup (which takes the locale lock). */
const char *kvs_log_error_text(int e)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 32)
	const char *s = strerrordesc_np(e);

	return s ? s : "unknown error";
#else
	return strerror(e);
#endif
}

/* Write one whole line to stderr, or to shim.log_file when it opens. */
static void emit(const char *line, size_t n)
{
	char buf[KVS_CONFIG_STR_MAX + 200];
	long fd = -1;
	int e = log_path_bad, m;

	if (!log_path[0]) {
		kvs_syscall(SYS_write, 2, line, n);
		return;
	}
	if (!e) {
		/* libc's syscall() (ours passes openat through): -1 and errno on failure. */
		fd = kvs_syscall(SYS_openat, AT_FDCWD, log_path,
				 O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
		if (fd >= 0) {
			kvs_syscall(SYS_write, (int)fd, line, n);
			kvs_syscall(SYS_close, (int)fd); /* pairs with the openat above */
			return;
		}
		e = errno;
	}
	if (!atomic_flag_test_and_set(&open_failed_said)) {
		m = format_prefix(buf, sizeof(buf), KVS_LOG_WARN);
		m += snprintf(buf + m, sizeof(buf) - (size_t)m,
			      "shim.log_file %s: %s; logging to stderr\n", log_path,
			      kvs_log_error_text(e));
		if (m > (int)sizeof(buf) - 1)
			m = (int)sizeof(buf) - 1;
		kvs_syscall(SYS_write, 2, buf, (size_t)m);
	}
	kvs_syscall(SYS_write, 2, line, n);
}

/* Format and write one line at level; the caller has applied the filter. */
static void vlog(int level, const char *fmt, va_list ap)
{
	char buf[700];
	int n, saved_errno;

	n = format_prefix(buf, sizeof(buf), level);
	n += vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
	if (n > (int)sizeof(buf) - 2)
		n = (int)sizeof(buf) - 2;
	buf[n++] = '\n';
	saved_errno = errno; /* the host's errno survives our writes and opens */
	emit(buf, (size_t)n);
	errno = saved_errno;
}

bool kvs_log_wants(int level)
{
	return level <= atomic_load(&max_level);
}

_Static_assert(KVS_CAUSE_NCAUSES <= 32, "one bit per cause in printed");

void kvs_log_once(enum kvs_cause cause, int level, const char *fmt, ...)
{
	va_list ap;

	if (!kvs_log_wants(level))
		return;
	if (atomic_fetch_or(&printed, 1u << cause) & (1u << cause))
		return;
	va_start(ap, fmt);
	vlog(level, fmt, ap);
	va_end(ap);
}

void kvs_log_line(int level, const char *fmt, ...)
{
	va_list ap;

	if (!kvs_log_wants(level))
		return;
	va_start(ap, fmt);
	vlog(level, fmt, ap);
	va_end(ap);
}
