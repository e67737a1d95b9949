/* The few S3 XML documents zbatch reads (ListObjectsV2 pages, InitiateMultipartUpload results,
 * error bodies), parsed with expat. Every byte is hostile: text is capped, names are checked to
 * lie below the listed prefix, and malformed XML is an error, never a guess. */
#include <expat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/remote.h"
#include "util/status.h"

#define TEXT_CAP 4096 /* S3 keys are at most 1024 bytes; tokens and messages are short */

typedef struct xml_walk {
    int depth;
    /* the element path we care about, by depth: [1] ListBucketResult, [2] Contents /
     * CommonPrefixes / NextContinuationToken / IsTruncated, [3] Key / Prefix */
    char names[4][32];
    char text[TEXT_CAP];
    size_t tlen;
    bool overflow;
    /* listing */
    const char *prefix;
    zb__s3_listing *out;
    bool truncated;
    char *token;
    zb_status st;
    /* first element by name */
    const char *want;
    char *found;
} xml_walk;

static const char *
local_name(const char *name)
{
    /* expat without namespace processing gives "ns:Name" for prefixed names */
    const char *c = strrchr(name, ':');
    return c ? c + 1 : name;
}

static void XMLCALL
on_start(void *ud, const XML_Char *name, const XML_Char **attrs)
{
    (void)attrs;
    xml_walk *w = ud;
    w->depth++;
    if (w->depth < 4) snprintf(w->names[w->depth], sizeof w->names[0], "%s", local_name(name));
    w->tlen = 0;
    w->overflow = false;
}

static void XMLCALL
on_text(void *ud, const XML_Char *s, int len)
{
    xml_walk *w = ud;
    if (len <= 0) return;
    if (w->tlen + (size_t)len >= TEXT_CAP) {
        w->overflow = true;
        return;
    }
    memcpy(w->text + w->tlen, s, (size_t)len);
    w->tlen += (size_t)len;
}

static zb_status
listing_add(zb__s3_listing *l, const char *name, size_t n, bool is_dir)
{
    for (size_t i = 0; i < l->n; i++) /* a key and a prefix of one name: keep the directory */
        if (strlen(l->names[i]) == n && !memcmp(l->names[i], name, n)) {
            l->is_dir[i] = l->is_dir[i] || is_dir;
            return ZB_OK;
        }
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        char **v = realloc(l->names, cap * sizeof *v);
        if (!v) return zb__err(ZB_E_NOMEM, "s3 list: out of memory");
        l->names = v;
        bool *d = realloc(l->is_dir, cap * sizeof *d);
        if (!d) return zb__err(ZB_E_NOMEM, "s3 list: out of memory");
        l->is_dir = d;
        l->cap = cap;
    }
    char *c = malloc(n + 1);
    if (!c) return zb__err(ZB_E_NOMEM, "s3 list: out of memory");
    memcpy(c, name, n);
    c[n] = '\0';
    l->names[l->n] = c;
    l->is_dir[l->n] = is_dir;
    l->n++;
    return ZB_OK;
}

/* A Contents/Key or CommonPrefixes/Prefix: the child name below the listed prefix. */
static zb_status
list_entry(xml_walk *w, bool is_dir)
{
    size_t pl = strlen(w->prefix);
    if (w->tlen < pl || memcmp(w->text, w->prefix, pl) != 0)
        return zb__err(ZB_E_CORRUPT, "s3 list: key \"%.200s\" is not below the prefix \"%s\"",
                       w->text, w->prefix);
    const char *name = w->text + pl;
    size_t n = w->tlen - pl;
    if (is_dir && n && name[n - 1] == '/') n--;
    if (n == 0) return ZB_OK; /* the prefix itself ("dir/" marker objects) */
    if (memchr(name, '/', n))
        return zb__err(ZB_E_CORRUPT, "s3 list: \"%.200s\" is not an immediate child of \"%s\"",
                       w->text, w->prefix);
    return listing_add(w->out, name, n, is_dir);
}

static void XMLCALL
on_end(void *ud, const XML_Char *name)
{
    xml_walk *w = ud;
    const char *ln = local_name(name);
    w->text[w->tlen] = '\0';
    if (w->want) {
        if (!w->found && !strcmp(ln, w->want) && !w->overflow) w->found = strdup(w->text);
    } else if (w->st == ZB_OK && w->depth >= 2) {
        if (w->overflow) {
            w->st =
                zb__err(ZB_E_CORRUPT, "s3 list: element <%s> longer than %d bytes", ln, TEXT_CAP);
        } else if (w->depth == 3 && !strcmp(w->names[2], "Contents") && !strcmp(ln, "Key")) {
            w->st = list_entry(w, false);
        } else if (w->depth == 3 && !strcmp(w->names[2], "CommonPrefixes") &&
                   !strcmp(ln, "Prefix")) {
            w->st = list_entry(w, true);
        } else if (w->depth == 2 && !strcmp(ln, "IsTruncated")) {
            w->truncated = !strcmp(w->text, "true");
        } else if (w->depth == 2 && !strcmp(ln, "NextContinuationToken")) {
            free(w->token);
            w->token = strdup(w->text);
            if (!w->token) w->st = zb__err(ZB_E_NOMEM, "s3 list: out of memory");
        }
    }
    w->tlen = 0;
    w->depth--;
}

static zb_status
parse(xml_walk *w, const char *xml, size_t len)
{
    XML_Parser p = XML_ParserCreate("UTF-8");
    if (!p) return zb__err(ZB_E_NOMEM, "xml: out of memory");
    XML_SetUserData(p, w);
    XML_SetElementHandler(p, on_start, on_end);
    XML_SetCharacterDataHandler(p, on_text);
    zb_status st = ZB_OK;
    if (len > (size_t)1 << 30 || XML_Parse(p, xml, (int)len, XML_TRUE) != XML_STATUS_OK)
        st = zb__err(ZB_E_CORRUPT, "malformed XML at line %lu: %s",
                     (unsigned long)XML_GetCurrentLineNumber(p),
                     XML_ErrorString(XML_GetErrorCode(p)));
    XML_ParserFree(p);
    return st;
}

zb_status
zb__s3_parse_list(const char *xml, size_t len, const char *prefix, zb__s3_listing *out)
{
    xml_walk w = {.prefix = prefix, .out = out};
    free(out->next_token);
    out->next_token = NULL;
    zb_status st = parse(&w, xml, len);
    if (st == ZB_OK) st = w.st;
    if (st == ZB_OK && w.depth != 0) st = zb__err(ZB_E_CORRUPT, "s3 list: unbalanced XML");
    if (st == ZB_OK && w.truncated && (!w.token || !*w.token))
        st = zb__err(ZB_E_CORRUPT, "s3 list: a truncated page without NextContinuationToken");
    if (st == ZB_OK && w.truncated) {
        out->next_token = w.token;
        w.token = NULL;
    }
    free(w.token);
    return st;
}

void
zb__s3_listing_free(zb__s3_listing *l)
{
    if (!l) return;
    for (size_t i = 0; i < l->n; i++) free(l->names[i]);
    free(l->names);
    free(l->is_dir);
    free(l->next_token);
    memset(l, 0, sizeof *l);
}

char *
zb__xml_text(const char *xml, size_t len, const char *name)
{
    xml_walk w = {.want = name};
    if (!xml || parse(&w, xml, len) != ZB_OK) {
        free(w.found);
        zb_clear_error();
        return NULL;
    }
    return w.found;
}
