/*
 * config: load the effective configuration from defaults, the INI file and the environment.
 *
 * DESIGN
 * Everything about a key (its type, field, default, bounds and help) comes from keys.def; this
 * file turns that table into a descriptor array and drives the defaults, the INI handler, the
 * environment overrides and the listing from it, so no key is named here except for the few
 * rules a table cannot express (shard alignment, queue rounding, capacity >= shard unless
 * auto).
 *
 * Loading writes into the caller's struct as it goes and, on the first error, overwrites it
 * with the defaults and shim_enable = false: the caller never sees a half-applied file.
 *
 * The file is read with base/raw.h's kvs_sys_open, kvs_sys_read and kvs_sys_close, not with
 * stdio nor libc's open/read/close: inside the LD_PRELOAD shim all of those names (fopen, fread,
 * open, read, close) are the shim's own hooks (scripts/check_layers.sh keeps config/ off
 * them).  The bytes reach inih through a reader callback, which hands it one line per call so
 * that the reader's count is the line number of the key being handled (the installed ini.h
 * declares handlers without a line number).
 *
 * Concurrency: no mutable state outside the caller's struct and the stack, except inih's own
 * knobs.  Debian's libinih turns inih's compile-time options into global variables; they are
 * set once, under pthread_once(), before the first parse, and only read after that, so parses
 * in several threads do not race.  Those globals must stay private to the shim (they are in its
 * static copy of inih, which the shim must not export).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* the GNU strerror_r(), which returns the text */
#endif

#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "raw.h"

/* Shards are allocated and read with O_DIRECT, hence aligned to 4 KiB whatever the page size. */
#define SHARD_ALIGN 4096u

/* The region is <cache.dir>/kvshim.<uid>.<name>: its name must fit NAME_MAX (255) with the
 * longest uid, and the directory a path of KVS_CACHE_DIR_MAX bytes, so that the whole path fits
 * the cache's buffer (cache/internal.h). */
#define NAME_LEN_MAX (255 - (sizeof("kvshim.4294967295.") - 1))

/* Values quoted in a message are cut to this many bytes, so the reason always fits. */
#define QUOTE_MAX 48

/* Longest KVSHIM_<SECTION>_<KEY> name the table produces, with room to spare. */
#define ENV_NAME_MAX 64

enum key_type {
	KT_BOOL,
	KT_SIZE,
	KT_SIZE_AUTO,
	KT_UINT,
	KT_AUTO,
	KT_PCT,
	KT_MODE,
	KT_STR,
	KT_NAME,
	KT_ENUM_LOG,
	KT_ENUM_EVICT,
	KT_ENUM_WAIT,
	KT_ENUM_PREFETCH,
	KT_ENUM_IO,
	KT_ENUM_POPULATE,
	KT_ENUM_COPY,
	KT_ENUM_MISMATCH,
	KT_ENUM_HUGE,
	KT_ENUM_NUMA,
	KT_ENUM_MODE,
};

struct key_desc {
	const char *section;
	const char *key;
	enum key_type type;
	size_t off;
	const char *def;
	uint64_t min, max;
	const char *help;
};

static const struct key_desc keys[KVS_NKEYS] = {
#define KVS_KEY(sec, key_, type_, field, def_, min_, max_, help_)                                  \
	[KVS_KEY_##field] = {.section = #sec,                                                      \
			     .key = #key_,                                                         \
			     .type = KT_##type_,                                                   \
			     .off = offsetof(struct kvs_config, field),                            \
			     .def = def_,                                                          \
			     .min = min_,                                                          \
			     .max = max_,                                                          \
			     .help = help_},
#include "keys.def"
#undef KVS_KEY
};

struct word {
	const char *word;
	int val;
};

/* Enum spellings; the first spelling of a value is the one printed. NULL-terminated. */
static const struct word log_words[] = {
    {"error", KVS_LOG_ERROR},
    {"warn", KVS_LOG_WARN},
    {"info", KVS_LOG_INFO},
    {"debug", KVS_LOG_DEBUG},
    {NULL, 0},
};
static const struct word evict_words[] = {
    {"clock", KVS_EVICT_CLOCK},
    {"fifo", KVS_EVICT_FIFO},
    {NULL, 0},
};
static const struct word wait_words[] = {
    {"futex", KVS_WAIT_FUTEX},
    {"spin", KVS_WAIT_SPIN},
    {NULL, 0},
};
static const struct word prefetch_words[] = {
    {"off", KVS_PREFETCH_OFF},
    {"alloc", KVS_PREFETCH_ALLOC},
    {"read", KVS_PREFETCH_READ},
    {NULL, 0},
};
static const struct word io_words[] = {
    {"auto", KVS_IO_AUTO},
    {"io_uring", KVS_IO_URING},
    {"threads", KVS_IO_THREADS},
    {"uring", KVS_IO_URING}, /* liburing's own short name */
    {NULL, 0},
};
static const struct word populate_words[] = {
    {"lazy", KVS_POPULATE_LAZY},
    {"eager", KVS_POPULATE_EAGER},
    {"ahead", KVS_POPULATE_AHEAD},
    {NULL, 0},
};
static const struct word copy_words[] = {
    {"auto", KVS_COPY_AUTO},
    {"memcpy", KVS_COPY_MEMCPY},
    {"stream", KVS_COPY_STREAM},
    {NULL, 0},
};
static const struct word mismatch_words[] = {
    {"refuse", KVS_MISMATCH_REFUSE},
    {"rebuild", KVS_MISMATCH_REBUILD},
    {NULL, 0},
};
static const struct word huge_words[] = {
    {"auto", KVS_HUGE_AUTO},
    {"on", KVS_HUGE_ON},
    {"off", KVS_HUGE_OFF},
    {NULL, 0},
};
static const struct word numa_words[] = {
    {"interleave", KVS_NUMA_INTERLEAVE},
    {"local", KVS_NUMA_LOCAL},
    {"off", KVS_NUMA_OFF},
    {NULL, 0},
};
static const struct word mode_words[] = {
    {"serve", KVS_MODE_SERVE},
    {"observe", KVS_MODE_OBSERVE},
    {NULL, 0},
};
static const struct word no_words[] = {{NULL, 0}}; /* for the types that are not enums */

/* A parsed value, before it is stored in its field. */
union value {
	bool b;
	uint64_t u; /* also AUTO, unless it is "auto" */
	int e;
	const char *s;
};

/* State of one kvs_config_load() call; lives on its stack. */
struct load_ctx {
	struct kvs_config *cfg;
	char *msg;
	size_t msglen;
	bool failed;	   /* an error has been recorded: the first one wins */
	unsigned err_line; /* its file line, or 0 */

	/* The INI file, as the reader callback sees it. */
	const char *path;
	int fd;
	bool eof;
	unsigned lineno;	       /* lines handed to inih so far */
	size_t start, end;	       /* unread bytes are buf[start, end) */
	char buf[KVS_CONFIG_LINE_MAX]; /* holds one whole line, '\n' included */
};

static pthread_once_t inih_once = PTHREAD_ONCE_INIT;

/* Set Debian libinih's run-time options once: room for our longest line, no continuation
 * lines (an indented line is a key of its own), and stop at the first error. */
static void inih_setup(void)
{
	/* ini.h: "must be 3 more than the longest line"; our reader strips '\n' anyway. */
	ini_max_line = KVS_CONFIG_LINE_MAX + 3;
	ini_allow_multiline = false;
	ini_stop_on_first_error = true;
}

static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

/* ASCII only: the C library's tolower() follows the locale (Turkish 'I'). */
static char to_lower(char c)
{
	return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

static char to_upper(char c)
{
	return c >= 'a' && c <= 'z' ? (char)(c - 'a' + 'A') : c;
}

/* Whether a and b are equal ignoring ASCII case. */
static bool str_ieq(const char *a, const char *b)
{
	while (*a && to_lower(*a) == to_lower(*b)) {
		a++;
		b++;
	}
	return to_lower(*a) == to_lower(*b);
}

/* Parse leading decimal digits of s into *out and point *end past them; -EINVAL if there are
 * none, -ERANGE if they overflow 64 bits. */
static int parse_digits(const char *s, const char **end, uint64_t *out)
{
	uint64_t v = 0;
	const char *p = s;

	if (!is_digit(*p))
		return -EINVAL;
	for (; is_digit(*p); p++) {
		unsigned d = (unsigned)(*p - '0');

		if (v > (UINT64_MAX - d) / 10)
			return -ERANGE;
		v = v * 10 + d;
	}
	*end = p;
	*out = v;
	return 0;
}

/* Parse a whole decimal integer; -EINVAL on anything else, -ERANGE on overflow. */
static int parse_uint(const char *s, uint64_t *out)
{
	const char *p;
	int ret = parse_digits(s, &p, out);

	if (ret)
		return ret;
	return *p ? -EINVAL : 0;
}

/* Parse a byte count with optional K/M/G/T (1024-based) and B or iB; -ERANGE on overflow. */
static int parse_size(const char *s, uint64_t *out)
{
	unsigned shift = 0;
	const char *p;
	uint64_t v;
	int ret;

	ret = parse_digits(s, &p, &v);
	if (ret)
		return ret;
	switch (to_lower(*p)) {
	case 'k':
		shift = 10;
		break;
	case 'm':
		shift = 20;
		break;
	case 'g':
		shift = 30;
		break;
	case 't':
		shift = 40;
		break;
	}
	if (shift) {
		p++;
		if (to_lower(*p) == 'i' && to_lower(p[1]) == 'b')
			p += 2;
		else if (to_lower(*p) == 'b')
			p++;
	} else if (to_lower(*p) == 'b') {
		p++;
	}
	if (*p)
		return -EINVAL;
	if (v > UINT64_MAX >> shift)
		return -ERANGE;
	*out = v << shift;
	return 0;
}

int kvs_parse_size(const char *s, uint64_t *out)
{
	return parse_size(s, out) ? -EINVAL : 0;
}

int kvs_parse_bool(const char *s, bool *out)
{
	static const char *const yes[] = {"true", "1", "yes", "on"};
	static const char *const no[] = {"false", "0", "no", "off"};

	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (str_ieq(s, yes[i])) {
			*out = true;
			return 0;
		}
		if (str_ieq(s, no[i])) {
			*out = false;
			return 0;
		}
	}
	return -EINVAL;
}

/* Parse a percentage, "5%" or "5"; -EINVAL or -ERANGE as parse_digits(). */
static int parse_pct(const char *s, uint64_t *out)
{
	const char *p;
	int ret = parse_digits(s, &p, out);

	if (ret)
		return ret;
	if (*p == '%')
		p++;
	return *p ? -EINVAL : 0;
}

/* Parse octal permission bits ("0600" or "640"); -ERANGE past 32 bits, which no mode needs. */
static int parse_mode(const char *s, uint64_t *out)
{
	uint64_t v = 0;

	if (!*s)
		return -EINVAL;
	for (; *s; s++) {
		if (*s < '0' || *s > '7')
			return -EINVAL;
		v = v * 8 + (uint64_t)(*s - '0');
		if (v > UINT32_MAX)
			return -ERANGE;
	}
	*out = v;
	return 0;
}

/* The spellings of an enum key type; none for other types. */
static const struct word *words_of(enum key_type t)
{
	switch (t) {
	case KT_ENUM_LOG:
		return log_words;
	case KT_ENUM_EVICT:
		return evict_words;
	case KT_ENUM_WAIT:
		return wait_words;
	case KT_ENUM_PREFETCH:
		return prefetch_words;
	case KT_ENUM_IO:
		return io_words;
	case KT_ENUM_POPULATE:
		return populate_words;
	case KT_ENUM_COPY:
		return copy_words;
	case KT_ENUM_MISMATCH:
		return mismatch_words;
	case KT_ENUM_HUGE:
		return huge_words;
	case KT_ENUM_NUMA:
		return numa_words;
	case KT_ENUM_MODE:
		return mode_words;
	default:
		return no_words;
	}
}

const char *kvs_config_populate_word(uint32_t mode)
{
	for (const struct word *w = populate_words; w->word; w++)
		if ((uint32_t)w->val == mode)
			return w->word;
	return "lazy";
}

const char *kvs_config_numa_word(uint32_t numa)
{
	for (const struct word *w = numa_words; w->word; w++)
		if ((uint32_t)w->val == numa)
			return w->word;
	return "off";
}

/* Parse one of the words of an enum, ignoring case; -EINVAL if it is none. */
static int parse_word(const struct word *w, const char *s, int *out)
{
	for (; w->word; w++) {
		if (str_ieq(s, w->word)) {
			*out = w->val;
			return 0;
		}
	}
	return -EINVAL;
}

/* Print a size with the largest suffix that divides it exactly, so it reads back the same. */
static void format_size(uint64_t v, char *buf, size_t len)
{
	static const char sfx[] = "KMGT";
	int i = -1;

	while (i < 3 && v && !(v & 1023)) {
		v >>= 10;
		i++;
	}
	if (i < 0)
		snprintf(buf, len, "%llu", (unsigned long long)v);
	else
		snprintf(buf, len, "%llu%c", (unsigned long long)v, sfx[i]);
}

/* Print a numeric bound of key k the way its values are written. */
static void format_bound(const struct key_desc *k, uint64_t v, char *buf, size_t len)
{
	if (k->type == KT_SIZE || k->type == KT_SIZE_AUTO)
		format_size(v, buf, len);
	else if (k->type == KT_MODE)
		snprintf(buf, len, "%04llo", (unsigned long long)v);
	else
		snprintf(buf, len, "%llu", (unsigned long long)v);
}

/* Copy s into buf in double quotes, cut to QUOTE_MAX bytes, for a message. */
static void quote(const char *s, char *buf, size_t len)
{
	size_t n = strlen(s);

	if (n > QUOTE_MAX)
		snprintf(buf, len, "\"%.*s...\"", QUOTE_MAX, s);
	else
		snprintf(buf, len, "\"%s\"", s);
}

/* What a value of type t should look like, for the reason of a parse error. */
static void expected(enum key_type t, char *buf, size_t len)
{
	const struct word *w = words_of(t);
	size_t n;

	switch (t) {
	case KT_BOOL:
		snprintf(buf, len, "true, false, 1, 0, yes, no, on or off");
		return;
	case KT_SIZE:
		snprintf(buf, len, "a byte count with optional K, M, G or T suffix");
		return;
	case KT_SIZE_AUTO:
		snprintf(buf, len, "auto or a byte count with optional K, M, G or T suffix");
		return;
	case KT_UINT:
		snprintf(buf, len, "a decimal integer");
		return;
	case KT_AUTO:
		snprintf(buf, len, "auto or a decimal integer");
		return;
	case KT_PCT:
		snprintf(buf, len, "a percentage such as 5%%");
		return;
	case KT_MODE:
		snprintf(buf, len, "octal permission bits such as 0600");
		return;
	default:
		break;
	}
	n = (size_t)snprintf(buf, len, "one of");
	for (; w->word && n < len; w++)
		n += (size_t)snprintf(buf + n, len - n, "%s %s", n > 6 ? "," : "", w->word);
}

/*
 * Parse s as a value of type k->type into *v (*is_auto for "auto") and apply k's bounds.
 * Returns 0, or -EINVAL with the reason in why.
 */
static int parse_value(const struct key_desc *k, const char *s, union value *v, bool *is_auto,
		       char *why, size_t whylen)
{
	char q[QUOTE_MAX + 8], lo[32], hi[32], exp[96];
	bool ranged = true;
	int ret;

	switch (k->type) {
	case KT_BOOL:
		ret = kvs_parse_bool(s, &v->b);
		ranged = false;
		break;
	case KT_SIZE:
		ret = parse_size(s, &v->u);
		break;
	case KT_SIZE_AUTO:
		*is_auto = str_ieq(s, "auto");
		ret = *is_auto ? 0 : parse_size(s, &v->u);
		ranged = !*is_auto;
		break;
	case KT_UINT:
		ret = parse_uint(s, &v->u);
		break;
	case KT_AUTO:
		*is_auto = str_ieq(s, "auto");
		ret = *is_auto ? 0 : parse_uint(s, &v->u);
		ranged = !*is_auto;
		break;
	case KT_PCT:
		ret = parse_pct(s, &v->u);
		break;
	case KT_MODE:
		ret = parse_mode(s, &v->u);
		break;
	case KT_STR:
	case KT_NAME:
		v->s = s;
		return 0; /* checked by check_string() */
	default:
		ret = parse_word(words_of(k->type), s, &v->e);
		ranged = false;
		break;
	}

	quote(s, q, sizeof(q));
	if (ret == -EINVAL) {
		expected(k->type, exp, sizeof(exp));
		snprintf(why, whylen, "bad value %s (expected %s)", q, exp);
		return -EINVAL;
	}
	if (ret == -ERANGE || (ranged && (v->u < k->min || v->u > k->max))) {
		format_bound(k, k->min, lo, sizeof(lo));
		format_bound(k, k->max, hi, sizeof(hi));
		snprintf(why, whylen, "value %s out of range (%s to %s)", q, lo, hi);
		return -EINVAL;
	}
	return 0;
}

/* Check a STR or NAME value s of key k; returns 0, or -EINVAL with the reason in why. */
static int check_string(const struct key_desc *k, const char *s, char *why, size_t whylen)
{
	static const char name_chars[] =
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-";
	size_t n = strlen(s);
	char q[QUOTE_MAX + 8];

	if (n >= KVS_CONFIG_STR_MAX) {
		snprintf(why, whylen, "value too long (%zu bytes, at most %d)", n,
			 KVS_CONFIG_STR_MAX - 1);
		return -EINVAL;
	}
	if (k->type != KT_NAME)
		return 0;
	/* The name becomes part of a file name: no '/', no spaces, nothing to quote. */
	if (!n) {
		snprintf(why, whylen, "empty name");
		return -EINVAL;
	}
	if (n > NAME_LEN_MAX) {
		snprintf(why, whylen, "name too long (%zu bytes, at most %zu)", n,
			 (size_t)NAME_LEN_MAX);
		return -EINVAL;
	}
	if (s[strspn(s, name_chars)]) {
		quote(s, q, sizeof(q));
		snprintf(why, whylen, "bad character in name %s (allowed: A-Z a-z 0-9 . _ -)", q);
		return -EINVAL;
	}
	return 0;
}

/*
 * Parse s as a value of key id, apply the key's bounds and rules, and store it in cfg.
 * Returns 0, or -EINVAL with the reason (no location) in why; cfg is untouched on error.
 */
static int set_key(struct kvs_config *cfg, int id, const char *s, char *why, size_t whylen)
{
	const struct key_desc *k = &keys[id];
	char *field = (char *)cfg + k->off;
	union value v = {0};
	bool is_auto = false;
	char q[QUOTE_MAX + 8];

	if (parse_value(k, s, &v, &is_auto, why, whylen))
		return -EINVAL;
	if ((k->type == KT_STR || k->type == KT_NAME) && check_string(k, s, why, whylen))
		return -EINVAL;

	/* The rules the table cannot express. */
	if (id == KVS_KEY_cache_shard_size && v.u % SHARD_ALIGN) {
		quote(s, q, sizeof(q));
		snprintf(why, whylen, "value %s is not a multiple of 4K", q);
		return -EINVAL;
	}
	if (id == KVS_KEY_cache_dir && (s[0] != '/' || strlen(s) > KVS_CACHE_DIR_MAX)) {
		quote(s, q, sizeof(q));
		snprintf(why, whylen, "value %s is not an absolute directory of at most %d bytes",
			 q, KVS_CACHE_DIR_MAX);
		return -EINVAL;
	}
	if (id == KVS_KEY_loader_running_queue_depth) {
		/* Indexed with a mask; the max is a power of two, so this cannot overflow. */
		uint64_t p = 1;

		while (p < v.u)
			p <<= 1;
		v.u = p;
	}

	switch (k->type) {
	case KT_BOOL:
		*(bool *)field = v.b;
		break;
	case KT_SIZE:
	case KT_UINT:
	case KT_PCT:
	case KT_MODE:
		*(uint64_t *)field = v.u;
		break;
	case KT_SIZE_AUTO:
		*(uint64_t *)field = is_auto ? 0 : v.u; /* min > 0: no clash with auto */
		break;
	case KT_AUTO:
		*(int64_t *)field = is_auto ? -1 : (int64_t)v.u; /* max < 2^63: no wrap */
		break;
	case KT_STR:
	case KT_NAME:
		memcpy(field, s, strlen(s) + 1);
		break;
	default:
		*(int *)field = v.e;
		break;
	}
	return 0;
}

/* Write KVSHIM_<SECTION>_<KEY> of key k into buf (ENV_NAME_MAX bytes), or only its
 * KVSHIM_<SECTION>_ prefix. */
static void env_name(const struct key_desc *k, bool with_key, char *buf)
{
	snprintf(buf, ENV_NAME_MAX, "KVSHIM_%s_%s", k->section, with_key ? k->key : "");
	for (; *buf; buf++)
		*buf = to_upper(*buf);
}

/* Fill cfg with the defaults of keys.def, parsed like any other input; returns the id of the
 * first default that fails (a bug in keys.def) with the reason in why, or -1. */
static int apply_defaults(struct kvs_config *cfg, char *why, size_t whylen)
{
	int bad = -1;

	memset(cfg, 0, sizeof(*cfg));
	for (int id = 0; id < KVS_NKEYS; id++) {
		if (set_key(cfg, id, keys[id].def, why, whylen) && bad < 0)
			bad = id;
		cfg->source[id] = KVS_SRC_DEFAULT;
	}
	return bad;
}

void kvs_config_defaults(struct kvs_config *cfg)
{
	char why[KVS_CONFIG_MSG_MAX];

	/* Cannot fail for a correct keys.def, which check_config proves. */
	apply_defaults(cfg, why, sizeof(why));
}

/* Record an error (printf-style, the whole message) unless one is already recorded. */
__attribute__((format(printf, 3, 4))) static void fail(struct load_ctx *c, unsigned line,
						       const char *fmt, ...)
{
	va_list ap;

	if (c->failed)
		return;
	c->failed = true;
	c->err_line = line;
	if (!c->msg || !c->msglen)
		return;
	va_start(ap, fmt);
	vsnprintf(c->msg, c->msglen, fmt, ap);
	va_end(ap);
	/* Paths, names and values come from outside: keep the promise of one printable line. */
	for (char *p = c->msg; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
}

/* Record an error about key id at wherever its current value came from. */
static void fail_at_key(struct load_ctx *c, int id, const char *why)
{
	const struct key_desc *k = &keys[id];
	char var[ENV_NAME_MAX];

	switch (c->cfg->source[id]) {
	case KVS_SRC_FILE:
		fail(c, c->cfg->line[id], "config: %s:%u: %s.%s: %s", c->path, c->cfg->line[id],
		     k->section, k->key, why);
		break;
	case KVS_SRC_ENV:
		env_name(k, true, var);
		fail(c, 0, "config: environment: %s: %s", var, why);
		break;
	default:
		fail(c, 0, "config: default: %s.%s: %s", k->section, k->key, why);
		break;
	}
}

/* Record an errno from a system call on the file, with no line. */
static void fail_errno(struct load_ctx *c, const char *what, int err)
{
	char buf[128];

	fail(c, 0, "config: %s: %s: %s", c->path, what, strerror_r(err, buf, sizeof(buf)));
}

/*
 * inih reader: copy the next line of the file, without its '\n', into str (num bytes).
 * Returns str, or NULL at the end of the file or after an error, which it records: a line of
 * KVS_CONFIG_LINE_MAX bytes or more, a NUL byte, or a failed read().
 */
static char *read_line(char *str, int num, void *stream)
{
	struct load_ctx *c = stream;
	char *line, *nl;
	size_t len;
	ssize_t n;

	if (c->failed)
		return NULL; /* the first error wins: stop inih now */
	for (;;) {
		line = c->buf + c->start;
		nl = memchr(line, '\n', c->end - c->start);
		if (nl)
			break;
		if (c->eof) {
			if (c->start == c->end)
				return NULL;
			nl = c->buf + c->end; /* a last line without '\n' */
			break;
		}
		if (c->start) {
			memmove(c->buf, line, c->end - c->start);
			c->end -= c->start;
			c->start = 0;
		}
		if (c->end == sizeof(c->buf)) {
			fail(c, c->lineno + 1, "config: %s:%u: line too long (at most %d bytes)",
			     c->path, c->lineno + 1, KVS_CONFIG_LINE_MAX - 1);
			return NULL;
		}
		n = kvs_sys_read(c->fd, c->buf + c->end, sizeof(c->buf) - c->end);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			fail_errno(c, "cannot read", errno);
			return NULL;
		}
		if (n == 0)
			c->eof = true;
		c->end += (size_t)n;
	}

	len = (size_t)(nl - line);
	c->lineno++;
	if (memchr(line, '\0', len)) {
		fail(c, c->lineno, "config: %s:%u: NUL byte in line", c->path, c->lineno);
		return NULL;
	}
	if (num < 0 || len >= (size_t)num) {
		/* inih's buffer is smaller than we asked for in inih_setup(). */
		fail(c, c->lineno, "config: %s:%u: line too long for the INI parser (%d bytes)",
		     c->path, c->lineno, num);
		return NULL;
	}
	memcpy(str, line, len);
	str[len] = '\0';
	c->start += len;
	if (c->start < c->end)
		c->start++; /* the '\n' */
	return str;
}

/* inih handler for one "name = value" under [section]; returns nonzero on success (inih's
 * convention, the opposite of ours). */
static int handle_key(void *user, const char *section, const char *name, const char *value)
{
	struct load_ctx *c = user;
	char why[KVS_CONFIG_MSG_MAX];
	bool known_section = false;
	int id;

	if (c->failed)
		return 0;
	for (id = 0; id < KVS_NKEYS; id++) {
		if (strcmp(section, keys[id].section))
			continue;
		known_section = true;
		if (!strcmp(name, keys[id].key))
			break;
	}
	if (id == KVS_NKEYS) {
		if (!*section)
			fail(c, c->lineno, "config: %s:%u: %s: key before any [section]", c->path,
			     c->lineno, name);
		else if (!known_section)
			fail(c, c->lineno, "config: %s:%u: %s.%s: unknown section [%s]", c->path,
			     c->lineno, section, name, section);
		else
			fail(c, c->lineno, "config: %s:%u: %s.%s: unknown key", c->path, c->lineno,
			     section, name);
		return 0;
	}
	if (set_key(c->cfg, id, value, why, sizeof(why))) {
		fail(c, c->lineno, "config: %s:%u: %s.%s: %s", c->path, c->lineno, section, name,
		     why);
		return 0;
	}
	c->cfg->source[id] = KVS_SRC_FILE;
	c->cfg->line[id] = c->lineno;
	return 1;
}

/* The value of variable name in envp, like getenv(), or NULL. */
static const char *env_get(char *const *envp, const char *name)
{
	size_t n = strlen(name);

	for (; *envp; envp++)
		if (!strncmp(*envp, name, n) && (*envp)[n] == '=')
			return *envp + n + 1;
	return NULL;
}

/*
 * Apply the INI file at path to c->cfg.  must: whether a missing file is an error (it is not
 * for the implicit /etc/kvshim/kvshim.ini).  Returns 0 or -EINVAL with the error recorded.
 */
static int load_file(struct load_ctx *c, const char *path, bool must)
{
	struct stat st;
	int ret = -EINVAL;

	c->path = path;
	/* O_NONBLOCK: opening a FIFO must not hang the host; it is refused below. */
	c->fd = kvs_sys_open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (c->fd < 0) {
		if (!must && (errno == ENOENT || errno == ENOTDIR))
			return 0;
		fail_errno(c, "cannot open", errno);
		return -EINVAL;
	}
	if (fstat(c->fd, &st)) {
		fail_errno(c, "cannot stat", errno);
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		fail(c, 0, "config: %s: not a regular file", path);
		goto out;
	}
	if (strlen(path) >= sizeof(c->cfg->path)) {
		fail(c, 0, "config: %s: path too long", path);
		goto out;
	}
	strcpy(c->cfg->path, path);

	pthread_once(&inih_once, inih_setup);
	/* ini_parse_stream() returns 0, or the line of the first syntax or handler error. */
	ret = ini_parse_stream(read_line, c, handle_key, c);
	if (ret > 0 && (!c->failed || (c->err_line && (unsigned)ret < c->err_line))) {
		/* inih found a syntax error before anything we recorded. */
		c->failed = false;
		fail(c, (unsigned)ret,
		     "config: %s:%d: syntax error (expected [section], key = value or a comment)",
		     path, ret);
	} else if (ret < 0 && !c->failed) {
		fail(c, 0, "config: %s: INI parser failed (%d)", path, ret);
	}
	ret = c->failed ? -EINVAL : 0;
out:
	kvs_sys_close(c->fd);
	return ret;
}

/* Apply KVSHIM_<SECTION>_<KEY> variables of envp to c->cfg; returns 0 or -EINVAL. */
static int load_env(struct load_ctx *c, char *const *envp)
{
	char var[ENV_NAME_MAX], why[KVS_CONFIG_MSG_MAX];

	for (; *envp; envp++) {
		const char *name = *envp, *eq = strchr(name, '=');
		size_t len;
		int id;

		if (strncmp(name, "KVSHIM_", 7) || !eq)
			continue;
		len = (size_t)(eq - name);
		/* Not keys: read elsewhere, or left to the tests and the tools. */
		if ((len == 13 && (!strncmp(name, "KVSHIM_CONFIG", 13) ||
				   !strncmp(name, "KVSHIM_ENABLE", 13))) ||
		    !strncmp(name, "KVSHIM_TEST_", 12))
			continue;

		for (id = 0; id < KVS_NKEYS; id++) {
			env_name(&keys[id], true, var);
			if (strlen(var) == len && !memcmp(var, name, len))
				break;
		}
		if (id == KVS_NKEYS) {
			/* KVSHIM_<SECTION>_x of a known section is a typo; anything else is not
			 * ours to judge. */
			for (id = 0; id < KVS_NKEYS; id++) {
				env_name(&keys[id], false, var);
				if (len > strlen(var) && !strncmp(name, var, strlen(var))) {
					fail(c, 0, "config: environment: %.*s: unknown key",
					     (int)len, name);
					return -EINVAL;
				}
			}
			continue;
		}
		if (set_key(c->cfg, id, eq + 1, why, sizeof(why))) {
			fail(c, 0, "config: environment: %.*s: %s", (int)len, name, why);
			return -EINVAL;
		}
		c->cfg->source[id] = KVS_SRC_ENV;
		c->cfg->line[id] = 0;
	}
	return 0;
}

/* Check the rules that tie keys together, once every source is applied; 0 or -EINVAL. */
static int check_all(struct load_ctx *c)
{
	const struct kvs_config *cfg = c->cfg;
	char why[KVS_CONFIG_MSG_MAX], a[32], b[32];
	int cap = KVS_KEY_cache_capacity, shard = KVS_KEY_cache_shard_size;

	/* capacity = auto (0) is sized when the region is built, in whole shards. */
	if (cfg->cache_capacity && cfg->cache_capacity < cfg->cache_shard_size) {
		format_size(cfg->cache_capacity, a, sizeof(a));
		format_size(cfg->cache_shard_size, b, sizeof(b));
		/* Blame the key set last: the later source, else the later line. */
		if (cfg->source[shard] > cfg->source[cap] ||
		    (cfg->source[shard] == cfg->source[cap] && cfg->line[shard] > cfg->line[cap])) {
			snprintf(why, sizeof(why), "%s is larger than cache.capacity (%s)", b, a);
			fail_at_key(c, shard, why);
		} else {
			snprintf(why, sizeof(why),
				 "%s is smaller than one shard (cache.shard_size %s)", a, b);
			fail_at_key(c, cap, why);
		}
		return -EINVAL;
	}
	return 0;
}

int kvs_config_load(struct kvs_config *cfg, const char *path, char *const *envp, char *msg,
		    size_t msglen)
{
	struct load_ctx c = {.cfg = cfg, .msg = msg, .msglen = msglen, .fd = -1};
	char why[KVS_CONFIG_MSG_MAX];
	const char *v;
	bool must = true;
	bool on;
	int id;

	if (msg && msglen)
		msg[0] = '\0';
	if (!envp)
		envp = environ; /* read without a lock, as getenv() does */

	id = apply_defaults(cfg, why, sizeof(why));
	if (id >= 0) {
		fail_at_key(&c, id, why);
		goto err;
	}

	if (!path) {
		path = env_get(envp, "KVSHIM_CONFIG");
		if (!path) {
			path = "/etc/kvshim/kvshim.ini";
			must = false;
		}
	}
	/* An empty KVSHIM_CONFIG (or path) asks for no file at all, not even the one in /etc. */
	if (*path && load_file(&c, path, must))
		goto err;

	if (load_env(&c, envp))
		goto err;

	/* KVSHIM_ENABLE comes last and can only turn the shim off: it is the kill switch. */
	v = env_get(envp, "KVSHIM_ENABLE");
	if (v) {
		if (kvs_parse_bool(v, &on)) {
			char q[QUOTE_MAX + 8];

			quote(v, q, sizeof(q));
			fail(&c, 0,
			     "config: environment: KVSHIM_ENABLE: bad value %s (expected %s)", q,
			     "true, false, 1, 0, yes, no, on or off");
			goto err;
		}
		if (!on) {
			cfg->shim_enable = false;
			cfg->source[KVS_KEY_shim_enable] = KVS_SRC_ENV;
			cfg->line[KVS_KEY_shim_enable] = 0;
			cfg->kvshim_enable_env_off = true;
		}
	}

	if (check_all(&c))
		goto err;
	return 0;

err:
	kvs_config_defaults(cfg);
	cfg->shim_enable = false;
	return -EINVAL;
}

/* Write the value of key id in cfg to out, as it would be written in the file. */
static int print_value(const struct kvs_config *cfg, int id, FILE *out)
{
	const struct key_desc *k = &keys[id];
	const char *field = (const char *)cfg + k->off;
	const struct word *w;
	char buf[32];
	uint64_t u;
	int64_t i;

	switch (k->type) {
	case KT_BOOL:
		return fputs(*(const bool *)field ? "true" : "false", out);
	case KT_SIZE:
		format_size(*(const uint64_t *)field, buf, sizeof(buf));
		return fputs(buf, out);
	case KT_SIZE_AUTO:
		u = *(const uint64_t *)field;
		if (!u)
			return fputs("auto", out);
		format_size(u, buf, sizeof(buf));
		return fputs(buf, out);
	case KT_UINT:
		return fprintf(out, "%llu", (unsigned long long)*(const uint64_t *)field);
	case KT_AUTO:
		i = *(const int64_t *)field;
		return i < 0 ? fputs("auto", out) : fprintf(out, "%lld", (long long)i);
	case KT_PCT:
		return fprintf(out, "%llu%%", (unsigned long long)*(const uint64_t *)field);
	case KT_MODE:
		u = *(const uint64_t *)field;
		return fprintf(out, "%04llo", (unsigned long long)u);
	case KT_STR:
	case KT_NAME:
		/* fputs("") returns 0 on success, like any non-negative result. */
		return fputs(field, out);
	default:
		for (w = words_of(k->type); w->word; w++)
			if (w->val == *(const int *)field)
				return fputs(w->word, out);
		return fprintf(out, "(invalid %d)", *(const int *)field);
	}
}

int kvs_config_print(const struct kvs_config *cfg, FILE *out, bool explain)
{
	char var[ENV_NAME_MAX];
	int err = 0;

	for (int id = 0; id < KVS_NKEYS && err >= 0; id++) {
		const struct key_desc *k = &keys[id];

		err = fprintf(out, "%s.%s = ", k->section, k->key);
		if (err >= 0)
			err = print_value(cfg, id, out);
		if (err >= 0)
			err = fputc('\n', out);
		if (err < 0 || !explain)
			continue;

		err = fprintf(out, "\tdefault %s, source ", *k->def ? k->def : "(empty)");
		if (err < 0)
			break;
		switch (cfg->source[id]) {
		case KVS_SRC_FILE:
			err = fprintf(out, "file %s:%u\n", cfg->path, cfg->line[id]);
			break;
		case KVS_SRC_ENV:
			if (id == KVS_KEY_shim_enable && cfg->kvshim_enable_env_off)
				snprintf(var, sizeof(var), "KVSHIM_ENABLE");
			else
				env_name(k, true, var);
			err = fprintf(out, "env %s\n", var);
			break;
		default:
			err = fputs("default\n", out);
			break;
		}
		if (err >= 0)
			err = fprintf(out, "\t%s\n", k->help);
	}
	/* stdio's errno is not reliable enough to pass on: say it was an I/O error. */
	if (err < 0 || fflush(out))
		return -EIO;
	return 0;
}

/* --- Names: known variables, near misses, hints, the sample file ------------------------- */

/* Longest name kvs_config_near compares; longer ones are near nothing. */
#define NEAR_MAX 64

/* A near miss is at most this many edits away (or ends in a known key, which counts as
 * NEAR_SUFFIX edits). */
#define NEAR_EDITS  3
#define NEAR_SUFFIX 2

/* Variables kvshim reads that are not keys. */
static const char *const env_extra[] = {"KVSHIM_CONFIG", "KVSHIM_ENABLE", "KVSHIM_LIBRARY"};

bool kvs_config_env_known(const char *name, size_t len)
{
	char var[ENV_NAME_MAX];

	if (len >= 12 && !strncmp(name, "KVSHIM_TEST_", 12))
		return true;
	for (size_t i = 0; i < sizeof(env_extra) / sizeof(env_extra[0]); i++)
		if (strlen(env_extra[i]) == len && !memcmp(env_extra[i], name, len))
			return true;
	for (int id = 0; id < KVS_NKEYS; id++) {
		env_name(&keys[id], true, var);
		if (strlen(var) == len && !memcmp(var, name, len))
			return true;
	}
	return false;
}

/* Edit distance (optimal string alignment: insert, delete, replace, swap two neighbours)
 * between a and b, ASCII case ignored; both shorter than NEAR_MAX. */
static unsigned distance(const char *a, const char *b)
{
	unsigned rows[3][NEAR_MAX + 1];
	size_t la = strlen(a), lb = strlen(b);
	unsigned *pp = rows[0], *p = rows[1], *cur = rows[2];

	for (size_t j = 0; j <= lb; j++)
		p[j] = (unsigned)j;
	for (size_t i = 1; i <= la; i++) {
		cur[0] = (unsigned)i;
		for (size_t j = 1; j <= lb; j++) {
			unsigned cost = to_lower(a[i - 1]) != to_lower(b[j - 1]);
			unsigned v = p[j] + 1;

			if (cur[j - 1] + 1 < v)
				v = cur[j - 1] + 1;
			if (p[j - 1] + cost < v)
				v = p[j - 1] + cost;
			if (i > 1 && j > 1 && to_lower(a[i - 1]) == to_lower(b[j - 2]) &&
			    to_lower(a[i - 2]) == to_lower(b[j - 1]) && pp[j - 2] + 1 < v)
				v = pp[j - 2] + 1;
			cur[j] = v;
		}
		unsigned *t = pp;

		pp = p;
		p = cur;
		cur = t;
	}
	return p[lb];
}

/* Whether name ends in sep followed by key (ASCII case ignored), with something before. */
static bool ends_in_key(const char *name, char sep, const char *key)
{
	size_t n = strlen(name), k = strlen(key);

	return n > k + 1 && name[n - k - 1] == sep && str_ieq(name + n - k, key);
}

int kvs_config_near(const char *name, char *out, size_t outlen)
{
	bool dotted = strchr(name, '.') != NULL;
	/* One edit, and one more per 10 characters: "FOO" is not a misspelt "MODE". */
	unsigned best = 1 + (unsigned)strlen(name) / 10;
	char cand[ENV_NAME_MAX + KVS_CONFIG_MSG_MAX];
	int n = -1;

	if (strlen(name) >= NEAR_MAX)
		return -ENOENT;
	if (best > NEAR_EDITS)
		best = NEAR_EDITS;
	best++;
	/* Keys first, then the variables that are not keys: a tie goes to the key. */
	for (int id = 0; id < KVS_NKEYS + (dotted ? 0 : 3); id++) {
		const char *key = NULL;
		unsigned d;

		if (id >= KVS_NKEYS) {
			snprintf(cand, sizeof(cand), "%s", env_extra[id - KVS_NKEYS]);
		} else if (dotted) {
			snprintf(cand, sizeof(cand), "%s.%s", keys[id].section, keys[id].key);
			key = keys[id].key;
		} else {
			env_name(&keys[id], true, cand);
			key = cand + strlen(cand) - strlen(keys[id].key);
		}
		d = distance(name, cand);
		/* A key in the wrong section: the key is right, the section is not. */
		if (key && d > NEAR_SUFFIX && ends_in_key(name, dotted ? '.' : '_', key))
			d = NEAR_SUFFIX;
		if (d < best) {
			best = d;
			snprintf(out, outlen, "%s", cand);
			n = (int)d;
		}
	}
	return n < 0 ? -ENOENT : n;
}

bool kvs_config_env_suspect(const char *name, size_t len)
{
	char buf[NEAR_MAX], near[ENV_NAME_MAX];
	int d;

	if (kvs_config_env_known(name, len))
		return false;
	if (len >= 6 && to_upper(name[0]) == 'K' && to_upper(name[1]) == 'V' &&
	    to_upper(name[2]) == 'S' && to_upper(name[3]) == 'H' && to_upper(name[4]) == 'I' &&
	    to_upper(name[5]) == 'M')
		return true;
	if (len >= sizeof(buf))
		return false;
	memcpy(buf, name, len);
	buf[len] = '\0';
	/* Only a near spelling of a whole name: "KVSIHM_CACHE_NAME", not any "..._NAME". */
	d = kvs_config_near(buf, near, sizeof(near));
	return d >= 0 && d <= 2 && distance(buf, near) <= 2;
}

void kvs_config_hint(const char *msg, char *hint, size_t len)
{
	static const char *const marks[] = {": unknown key", ": unknown section [",
					    ": key before any [section]"};
	char name[NEAR_MAX], near[ENV_NAME_MAX + KVS_CONFIG_MSG_MAX];
	const char *at = NULL, *start;
	size_t i, n;

	snprintf(hint, len, "`kvshim config --explain` lists every key, its default and meaning");
	for (i = 0; i < sizeof(marks) / sizeof(marks[0]) && !at; i++)
		at = strstr(msg, marks[i]);
	if (!at)
		return;
	i--;
	/* The name is the field before the mark: "...: NAME: unknown key". */
	for (start = at; start - 2 >= msg && !(start[-2] == ':' && start[-1] == ' '); start--)
		;
	n = (size_t)(at - start);
	if (!n || n >= sizeof(name))
		return;
	memcpy(name, start, n);
	name[n] = '\0';
	if (i == 2) {
		/* A key above every [section]: which section holds a key of that name? */
		for (int id = 0; id < KVS_NKEYS; id++) {
			if (str_ieq(keys[id].key, name)) {
				snprintf(hint, len, "put %s under [%s]", name, keys[id].section);
				return;
			}
		}
		snprintf(hint, len, "keys go under a [section] (see `kvshim config --explain`)");
		return;
	}
	if (kvs_config_near(name, near, sizeof(near)) >= 0) {
		const char *dot = strchr(near, '.');

		if (dot && strchr(name, '.') &&
		    !strcmp(strchr(name, '.') + 1, dot + 1)) /* only the section is wrong */
			snprintf(hint, len, "did you mean %s? (put %s under [%.*s])", near, dot + 1,
				 (int)(dot - near), near);
		else
			snprintf(hint, len, "did you mean %s?", near);
	}
}

int kvs_config_sample(FILE *out)
{
	const char *section = "";
	char var[ENV_NAME_MAX];
	int err;

	err = fputs("; kvshim.ini: the configuration of kvshim (docs/config.md).\n"
		    ";\n"
		    "; Every key is listed under its section with its default, commented out:\n"
		    "; uncomment a line to set that key.  Any key can also be set in the\n"
		    "; environment as KVSHIM_<SECTION>_<KEY>; KVSHIM_CONFIG names this file and\n"
		    "; KVSHIM_ENABLE=0 turns the shim off.  Sizes take K, M, G and T suffixes.\n"
		    "; `kvshim check` validates a file and the node before a launch.\n",
		    out);
	for (int id = 0; id < KVS_NKEYS && err >= 0; id++) {
		const struct key_desc *k = &keys[id];

		if (strcmp(section, k->section)) {
			section = k->section;
			err = fprintf(out, "\n[%s]\n", section);
			if (err < 0)
				break;
		}
		env_name(k, true, var);
		err = fprintf(out, "\n; %s (%s)\n;%s = %s\n", k->help, var, k->key, k->def);
	}
	if (err < 0 || fflush(out))
		return -EIO;
	return 0;
}
