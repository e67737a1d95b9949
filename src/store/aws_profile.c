/* The AWS shared files, ~/.aws/credentials and ~/.aws/config (zbatch.h, zb_aws_profile_load).
 *
 * They are INI files as Python's configparser reads them for botocore: `[section]` headers,
 * `name = value` (or `name: value`) settings whose names are case-insensitive, whole-line
 * comments starting with '#' or ';', and indented lines that continue the setting above (the
 * nested `s3 =` blocks of the config file). Written by hand because no library of the tree
 * reads INI and the dialect is this small; every line that fits none of these is an error
 * naming the file and the line, never a guess. Values are credentials: no message ever holds
 * one. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/status.h"

typedef enum { CREDENTIALS_FILE, CONFIG_FILE } file_kind;

/* What one file says for the profile. */
typedef struct settings {
    char *key, *secret, *token, *region, *endpoint;
} settings;

static void
settings_free(settings *s)
{
    free(s->key);
    free(s->secret);
    free(s->token);
    free(s->region);
    free(s->endpoint);
    memset(s, 0, sizeof *s);
}

static char *
trim(char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
        s[--n] = '\0';
    return s;
}

/* Whether section `name` is the profile's: [NAME] in the credentials file; [profile NAME] in
 * the config file, where the default profile is also [default]. */
static bool
is_profile_section(file_kind kind, const char *name, const char *profile)
{
    if (kind == CREDENTIALS_FILE) return !strcmp(name, profile);
    if (!strcmp(profile, "default") && !strcmp(name, "default")) return true;
    if (strncmp(name, "profile", 7) || (name[7] != ' ' && name[7] != '\t')) return false;
    const char *p = name + 7;
    while (*p == ' ' || *p == '\t') p++;
    return !strcmp(p, profile);
}

static zb_status
set(char **slot, const char *value, const char *path, unsigned long line)
{
    free(*slot);
    *slot = NULL;
    if (!*value) return ZB_OK; /* "name =" gives nothing */
    *slot = strdup(value);
    return *slot ? ZB_OK : zb__err(ZB_E_NOMEM, "%s:%lu: out of memory", path, line);
}

static zb_status
assign(file_kind kind, const char *name, const char *value, settings *s, const char *path,
       unsigned long line)
{
    if (!strcmp(name, "aws_access_key_id")) return set(&s->key, value, path, line);
    if (!strcmp(name, "aws_secret_access_key")) return set(&s->secret, value, path, line);
    if (!strcmp(name, "aws_session_token")) return set(&s->token, value, path, line);
    if (kind == CONFIG_FILE && !strcmp(name, "region")) return set(&s->region, value, path, line);
    if (kind == CONFIG_FILE && !strcmp(name, "endpoint_url"))
        return set(&s->endpoint, value, path, line);
    return ZB_OK; /* other settings are the AWS CLI's business */
}

typedef struct parse_state {
    const char *path, *profile;
    file_kind kind;
    bool in_section, in_profile, *found;
    unsigned long line, profile_line;
} parse_state;

/* One line, already trimmed into `t` (`indented`: it started with a blank). */
static zb_status
parse_line(parse_state *ps, char *t, bool indented, settings *s)
{
    if (!*t || *t == '#' || *t == ';') return ZB_OK;
    if (indented && ps->in_section) return ZB_OK; /* continues the setting above */
    if (*t == '[') {
        char *end = strrchr(t, ']');
        if (!end || end[1])
            return zb__err(ZB_E_INVALID, "%s:%lu: a section header needs its closing ']'", ps->path,
                           ps->line);
        *end = '\0';
        char *name = trim(t + 1);
        bool mine = is_profile_section(ps->kind, name, ps->profile);
        if (mine && ps->profile_line)
            return zb__err(ZB_E_INVALID,
                           "%s:%lu: profile '%s' has a second section (the first "
                           "is at line %lu)",
                           ps->path, ps->line, ps->profile, ps->profile_line);
        if (mine) ps->profile_line = ps->line;
        if (mine) *ps->found = true;
        ps->in_section = true;
        ps->in_profile = mine;
        return ZB_OK;
    }
    char *delim = strpbrk(t, "=:");
    if (!delim)
        return zb__err(ZB_E_INVALID,
                       "%s:%lu: neither a [section], a 'name = value' setting nor a "
                       "comment",
                       ps->path, ps->line);
    if (!ps->in_section)
        return zb__err(ZB_E_INVALID, "%s:%lu: a setting before any [section]", ps->path, ps->line);
    *delim = '\0';
    char *name = trim(t), *value = trim(delim + 1);
    if (!*name)
        return zb__err(ZB_E_INVALID, "%s:%lu: a setting without a name", ps->path, ps->line);
    for (char *c = name; *c; c++) *c = (char)tolower((unsigned char)*c);
    return ps->in_profile ? assign(ps->kind, name, value, s, ps->path, ps->line) : ZB_OK;
}

static zb_status
parse_file(const char *path, file_kind kind, const char *profile, settings *s, bool *found)
{
    if (!path) return ZB_OK;
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT || errno == ENOTDIR) return ZB_OK; /* no such file: nothing said */
        return zb__err(ZB_E_IO, "%s: %s", path, strerror(errno));
    }
    parse_state ps = {.path = path, .profile = profile, .kind = kind, .found = found};
    char *buf = NULL;
    size_t cap = 0;
    ssize_t n;
    zb_status st = ZB_OK;
    while (st == ZB_OK && (n = getline(&buf, &cap, f)) >= 0) {
        ps.line++;
        bool indented = buf[0] == ' ' || buf[0] == '\t';
        if (memchr(buf, '\0', (size_t)n))
            st = zb__err(ZB_E_INVALID, "%s:%lu: a NUL byte (not a text file)", path, ps.line);
        else
            st = parse_line(&ps, trim(buf), indented, s);
    }
    if (st == ZB_OK && ferror(f)) st = zb__err(ZB_E_IO, "%s: read error", path);
    free(buf);
    fclose(f);
    return st;
}

zb_status
zb_aws_profile_load(const char *credentials_path, const char *config_path, const char *profile,
                    zb_aws_profile *out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_aws_profile_load: null out");
    memset(out, 0, sizeof *out);
    if (!profile || !*profile) profile = "default";
    settings c = {0}, g = {0};
    zb_status st = parse_file(credentials_path, CREDENTIALS_FILE, profile, &c, &out->found);
    if (st == ZB_OK) st = parse_file(config_path, CONFIG_FILE, profile, &g, &out->found);
    if (st != ZB_OK) {
        settings_free(&c);
        settings_free(&g);
        out->found = false;
        return st;
    }
    /* a key, its secret and token come together from one file: the credentials file first */
    settings *cred = c.key || c.secret ? &c : &g;
    out->access_key_id = cred->key;
    out->secret_access_key = cred->secret;
    out->session_token = cred->token;
    cred->key = cred->secret = cred->token = NULL;
    out->region = g.region;
    out->endpoint_url = g.endpoint;
    g.region = g.endpoint = NULL;
    settings_free(&c);
    settings_free(&g);
    return ZB_OK;
}

void
zb_aws_profile_free(zb_aws_profile *p)
{
    if (!p) return;
    free(p->access_key_id);
    free(p->secret_access_key);
    free(p->session_token);
    free(p->region);
    free(p->endpoint_url);
    memset(p, 0, sizeof *p);
}
