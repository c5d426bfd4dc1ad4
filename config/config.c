/*
 * config: load the effective configuration from defaults, the INI file and the environment.
 *
 * DESIGN
 * The key table and the parsing of values are value.c's (keytab.h); this file applies them in
 * order of precedence: the defaults of keys.def, the INI file through inih, the KVSHIM_*
 * environment, KVSHIM_ENABLE; then the rule that ties keys together (capacity >= shard unless
 * auto).  Printing, --explain, the sample file and the name hints are the tools' (print.c,
 * hints.c, in the kvs_config_tools library), so the shim does not carry them.
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

#include "keytab.h"
#include "raw.h"
#include "value.h"

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
/* Fill cfg with the defaults of keys.def, parsed like any other input; returns the id of the
 * first default that fails (a bug in keys.def) with the reason in why, or -1. */
static int apply_defaults(struct kvs_config *cfg, char *why, size_t whylen)
{
	int bad = -1;

	memset(cfg, 0, sizeof(*cfg));
	for (int id = 0; id < KVS_NKEYS; id++) {
		if (kvs_key_set(cfg, id, kvs_keys[id].def, why, whylen) && bad < 0)
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
	const struct kvs_key_desc *k = &kvs_keys[id];
	char var[KVS_ENV_NAME_MAX];

	switch (c->cfg->source[id]) {
	case KVS_SRC_FILE:
		fail(c, c->cfg->line[id], "config: %s:%u: %s.%s: %s", c->path, c->cfg->line[id],
		     k->section, k->key, why);
		break;
	case KVS_SRC_ENV:
		kvs_key_env_name(k, true, var);
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
		if (strcmp(section, kvs_keys[id].section))
			continue;
		known_section = true;
		if (!strcmp(name, kvs_keys[id].key))
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
	if (kvs_key_set(c->cfg, id, value, why, sizeof(why))) {
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
	char var[KVS_ENV_NAME_MAX], why[KVS_CONFIG_MSG_MAX];

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
			kvs_key_env_name(&kvs_keys[id], true, var);
			if (strlen(var) == len && !memcmp(var, name, len))
				break;
		}
		if (id == KVS_NKEYS) {
			/* KVSHIM_<SECTION>_x of a known section is a typo; anything else is not
			 * ours to judge. */
			for (id = 0; id < KVS_NKEYS; id++) {
				kvs_key_env_name(&kvs_keys[id], false, var);
				if (len > strlen(var) && !strncmp(name, var, strlen(var))) {
					fail(c, 0, "config: environment: %.*s: unknown key",
					     (int)len, name);
					return -EINVAL;
				}
			}
			continue;
		}
		if (kvs_key_set(c->cfg, id, eq + 1, why, sizeof(why))) {
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
		kvs_format_size(cfg->cache_capacity, a, sizeof(a));
		kvs_format_size(cfg->cache_shard_size, b, sizeof(b));
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
			char q[KVS_QUOTE_MAX + 8];

			kvs_quote(v, q, sizeof(q));
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
