/*
 * value: the key table of keys.def as data, and the parsing and formatting of its values.
 *
 * DESIGN
 * Everything about a key (its type, field, default, bounds and help) comes from keys.def; this
 * file turns that table into a descriptor array (kvs_keys, keytab.h) and parses a value of any
 * key into its field (kvs_key_set), so no key is named here except for the few rules a table
 * cannot express (shard alignment, an absolute cache.dir, queue rounding).  Loading
 * (config.c), printing (print.c) and the tools' name hints (hints.c) drive everything from the
 * table.
 *
 * Concurrency: none to speak of; the table and the word lists are constant, and every function
 * writes only to its caller's buffers.
 */
#include "value.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "keytab.h"

/* Shards are allocated and read with O_DIRECT, hence aligned to 4 KiB whatever the page size. */
#define SHARD_ALIGN 4096u

/* The region is <cache.dir>/kvshim.<uid>.<name>: its name must fit NAME_MAX (255) with the
 * longest uid, and the directory a path of KVS_CACHE_DIR_MAX bytes, so that the whole path fits
 * the cache's buffer (cache/internal.h). */
#define NAME_LEN_MAX (255 - (sizeof("kvshim.4294967295.") - 1))

const struct kvs_key_desc kvs_keys[KVS_NKEYS] = {
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

/* Enum spellings (kvs_key_words); the first spelling of a value is the one printed.
 * NULL-terminated. */
static const struct kvs_word log_words[] = {
    {"error", KVS_LOG_ERROR},
    {"warn", KVS_LOG_WARN},
    {"info", KVS_LOG_INFO},
    {"debug", KVS_LOG_DEBUG},
    {NULL, 0},
};
static const struct kvs_word evict_words[] = {
    {"clock", KVS_EVICT_CLOCK},
    {"fifo", KVS_EVICT_FIFO},
    {NULL, 0},
};
static const struct kvs_word wait_words[] = {
    {"futex", KVS_WAIT_FUTEX},
    {"spin", KVS_WAIT_SPIN},
    {NULL, 0},
};
static const struct kvs_word prefetch_words[] = {
    {"off", KVS_PREFETCH_OFF},
    {"alloc", KVS_PREFETCH_ALLOC},
    {"read", KVS_PREFETCH_READ},
    {NULL, 0},
};
static const struct kvs_word io_words[] = {
    {"auto", KVS_IO_AUTO},
    {"io_uring", KVS_IO_URING},
    {"threads", KVS_IO_THREADS},
    {"uring", KVS_IO_URING}, /* liburing's own short name */
    {NULL, 0},
};
static const struct kvs_word populate_words[] = {
    {"lazy", KVS_POPULATE_LAZY},
    {"eager", KVS_POPULATE_EAGER},
    {"ahead", KVS_POPULATE_AHEAD},
    {NULL, 0},
};
static const struct kvs_word copy_words[] = {
    {"auto", KVS_COPY_AUTO},
    {"memcpy", KVS_COPY_MEMCPY},
    {"stream", KVS_COPY_STREAM},
    {NULL, 0},
};
static const struct kvs_word mismatch_words[] = {
    {"refuse", KVS_MISMATCH_REFUSE},
    {"rebuild", KVS_MISMATCH_REBUILD},
    {NULL, 0},
};
static const struct kvs_word huge_words[] = {
    {"auto", KVS_HUGE_AUTO},
    {"on", KVS_HUGE_ON},
    {"off", KVS_HUGE_OFF},
    {NULL, 0},
};
static const struct kvs_word numa_words[] = {
    {"interleave", KVS_NUMA_INTERLEAVE},
    {"local", KVS_NUMA_LOCAL},
    {"off", KVS_NUMA_OFF},
    {NULL, 0},
};
static const struct kvs_word remote_words[] = {
    {"none", KVS_REMOTE_NONE},
    {"mooncake", KVS_REMOTE_MOONCAKE},
    {NULL, 0},
};
static const struct kvs_word mode_words[] = {
    {"serve", KVS_MODE_SERVE},
    {"observe", KVS_MODE_OBSERVE},
    {NULL, 0},
};
static const struct kvs_word no_words[] = {{NULL, 0}}; /* for the types that are not enums */

/* A parsed value, before it is stored in its field. */
union value {
	bool b;
	uint64_t u; /* also AUTO, unless it is "auto" */
	int e;
	const char *s;
};

static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

/* Whether a and b are equal ignoring ASCII case. */
bool kvs_str_ieq(const char *a, const char *b)
{
	while (*a && kvs_ascii_lower(*a) == kvs_ascii_lower(*b)) {
		a++;
		b++;
	}
	return kvs_ascii_lower(*a) == kvs_ascii_lower(*b);
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
	switch (kvs_ascii_lower(*p)) {
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
		if (kvs_ascii_lower(*p) == 'i' && kvs_ascii_lower(p[1]) == 'b')
			p += 2;
		else if (kvs_ascii_lower(*p) == 'b')
			p++;
	} else if (kvs_ascii_lower(*p) == 'b') {
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
		if (kvs_str_ieq(s, yes[i])) {
			*out = true;
			return 0;
		}
		if (kvs_str_ieq(s, no[i])) {
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
const struct kvs_word *kvs_key_words(enum kvs_key_type t)
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
	case KT_ENUM_REMOTE:
		return remote_words;
	default:
		return no_words;
	}
}

const char *kvs_config_populate_word(uint32_t mode)
{
	for (const struct kvs_word *w = populate_words; w->word; w++)
		if ((uint32_t)w->val == mode)
			return w->word;
	return "lazy";
}

const char *kvs_config_numa_word(uint32_t numa)
{
	for (const struct kvs_word *w = numa_words; w->word; w++)
		if ((uint32_t)w->val == numa)
			return w->word;
	return "off";
}

/* Parse one of the words of an enum, ignoring case; -EINVAL if it is none. */
static int parse_word(const struct kvs_word *w, const char *s, int *out)
{
	for (; w->word; w++) {
		if (kvs_str_ieq(s, w->word)) {
			*out = w->val;
			return 0;
		}
	}
	return -EINVAL;
}

/* Print a size with the largest suffix that divides it exactly, so it reads back the same. */
void kvs_format_size(uint64_t v, char *buf, size_t len)
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
static void format_bound(const struct kvs_key_desc *k, uint64_t v, char *buf, size_t len)
{
	if (k->type == KT_SIZE || k->type == KT_SIZE_AUTO)
		kvs_format_size(v, buf, len);
	else if (k->type == KT_MODE)
		snprintf(buf, len, "%04llo", (unsigned long long)v);
	else
		snprintf(buf, len, "%llu", (unsigned long long)v);
}

/* Copy s into buf in double quotes, cut to KVS_QUOTE_MAX bytes, for a message. */
void kvs_quote(const char *s, char *buf, size_t len)
{
	size_t n = strlen(s);

	if (n > KVS_QUOTE_MAX)
		snprintf(buf, len, "\"%.*s...\"", KVS_QUOTE_MAX, s);
	else
		snprintf(buf, len, "\"%s\"", s);
}

/* What a value of type t should look like, for the reason of a parse error. */
static void expected(enum kvs_key_type t, char *buf, size_t len)
{
	const struct kvs_word *w = kvs_key_words(t);
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
static int parse_value(const struct kvs_key_desc *k, const char *s, union value *v, bool *is_auto,
		       char *why, size_t whylen)
{
	char q[KVS_QUOTE_MAX + 8], lo[32], hi[32], exp[96];
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
		*is_auto = kvs_str_ieq(s, "auto");
		ret = *is_auto ? 0 : parse_size(s, &v->u);
		ranged = !*is_auto;
		break;
	case KT_UINT:
		ret = parse_uint(s, &v->u);
		break;
	case KT_AUTO:
		*is_auto = kvs_str_ieq(s, "auto");
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
		ret = parse_word(kvs_key_words(k->type), s, &v->e);
		ranged = false;
		break;
	}

	kvs_quote(s, q, sizeof(q));
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
static int check_string(const struct kvs_key_desc *k, const char *s, char *why, size_t whylen)
{
	static const char name_chars[] =
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-";
	size_t n = strlen(s);
	char q[KVS_QUOTE_MAX + 8];

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
		kvs_quote(s, q, sizeof(q));
		snprintf(why, whylen, "bad character in name %s (allowed: A-Z a-z 0-9 . _ -)", q);
		return -EINVAL;
	}
	return 0;
}

/*
 * Parse s as a value of key id, apply the key's bounds and rules, and store it in cfg.
 * Returns 0, or -EINVAL with the reason (no location) in why; cfg is untouched on error.
 */
int kvs_key_set(struct kvs_config *cfg, int id, const char *s, char *why, size_t whylen)
{
	const struct kvs_key_desc *k = &kvs_keys[id];
	char *field = (char *)cfg + k->off;
	union value v = {0};
	bool is_auto = false;
	char q[KVS_QUOTE_MAX + 8];

	if (parse_value(k, s, &v, &is_auto, why, whylen))
		return -EINVAL;
	if ((k->type == KT_STR || k->type == KT_NAME) && check_string(k, s, why, whylen))
		return -EINVAL;

	/* The rules the table cannot express. */
	if (id == KVS_KEY_cache_shard_size && v.u % SHARD_ALIGN) {
		kvs_quote(s, q, sizeof(q));
		snprintf(why, whylen, "value %s is not a multiple of 4K", q);
		return -EINVAL;
	}
	if (id == KVS_KEY_cache_dir && (s[0] != '/' || strlen(s) > KVS_CACHE_DIR_MAX)) {
		kvs_quote(s, q, sizeof(q));
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

/* Write KVSHIM_<SECTION>_<KEY> of key k into buf (KVS_ENV_NAME_MAX bytes), or only its
 * KVSHIM_<SECTION>_ prefix. */
void kvs_key_env_name(const struct kvs_key_desc *k, bool with_key, char *buf)
{
	snprintf(buf, KVS_ENV_NAME_MAX, "KVSHIM_%s_%s", k->section, with_key ? k->key : "");
	for (; *buf; buf++)
		*buf = kvs_ascii_upper(*buf);
}
