/* The conversion's output through one store (convert_int.h, "the output"): a local directory
 * or an s3:// bucket prefix. The work directory is always local; only what the collection is
 * made of goes through here. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/convert_int.h"
#include "util/status.h"
#include "write/atomistic_int.h"

zb_status
cv_output_open(zb_convert *cv, const zb_remote_opts *remote)
{
    const char *o = cv->output;
    if (!strncmp(o, "http://", 7) || !strncmp(o, "https://", 8))
        return zb__err(ZB_E_INVALID,
                       "%s: http(s):// stores are read-only; convert into a "
                       "directory or an s3:// URL",
                       o);
    cv->remote = strstr(o, "://") != NULL && strncmp(o, "file://", 7) != 0;
    if (!cv->remote) {
        /* a directory not made yet is opened by cv_output_make */
        if (cv_exists(o)) return cv_output_open_dir(o, cv->buffered_output, &cv->out);
        return ZB_OK;
    }
    zb_store_opts so = ZB_STORE_OPTS_DEFAULT;
    so.remote = remote;
    return zb_store_open_opts(o, &so, &cv->out);
}

zb_status
cv_output_open_dir(const char *dir, bool buffered, zb_store **out)
{
    zb_store_opts so = ZB_STORE_OPTS_DEFAULT;
    so.direct_io = !buffered;
    return zb_store_open_file_opts(dir, &so, out);
}

zb_status
cv_output_make(zb_convert *cv)
{
    if (cv->out) return ZB_OK;
    ZB_TRY(cv_mkdirs(cv->output));
    return cv_output_open_dir(cv->output, cv->buffered_output, &cv->out);
}

bool
cv_output_has(zb_convert *cv, const char *key)
{
    uint64_t size;
    bool has = zb_store_size(cv->out, key, &size) == ZB_OK;
    zb_clear_error();
    return has;
}

zb_status
cv_output_put(zb_convert *cv, const char *key, const void *data, size_t len)
{
    return zb_store_put(cv->out, key, data, len);
}

zb_status
cv_output_read(zb_convert *cv, const char *key, char **text, size_t *len)
{
    uint8_t *data = NULL;
    uint64_t n = 0;
    ZB_TRY(zb_store_read_all(cv->out, key, &data, &n));
    *text = (char *)data;
    *len = (size_t)n;
    return ZB_OK;
}

zb_status
cv_output_remove(zb_convert *cv, const char *prefix)
{
    if (!cv->remote) {
        char path[4200];
        int n = snprintf(path, sizeof path, "%s/%s", cv->output, prefix);
        if (n < 0 || (size_t)n >= sizeof path)
            return zb__err(ZB_E_INVALID, "%s: path too long", cv->output);
        return cv_remove_tree(path); /* directories too, which the file store keeps */
    }
    return zb__at_remove_tree(cv->out, prefix);
}

/* ---- fingerprints of what the output holds -------------------------------------------------- */

typedef struct key_list {
    char **keys;
    size_t n, cap;
    zb_status st;
    const char *prefix;
    char **dirs; /* children that are directories, to descend into */
    size_t ndirs, dcap;
} key_list;

static zb_status
push(char ***v, size_t *n, size_t *cap, const char *s)
{
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 64;
        char **p = realloc(*v, c * sizeof *p);
        if (!p) return zb__err(ZB_E_NOMEM, "listing the output");
        *v = p;
        *cap = c;
    }
    if (!((*v)[*n] = strdup(s))) return zb__err(ZB_E_NOMEM, "listing the output");
    (*n)++;
    return ZB_OK;
}

static int
on_child(void *ctx, const char *name, bool is_dir)
{
    key_list *l = ctx;
    char key[4200];
    int n = snprintf(key, sizeof key, "%s/%s", l->prefix, name);
    if (n < 0 || (size_t)n >= sizeof key) {
        l->st = zb__err(ZB_E_INVALID, "%s/%s: key too long", l->prefix, name);
        return 1;
    }
    l->st = is_dir ? push(&l->dirs, &l->ndirs, &l->dcap, key) : push(&l->keys, &l->n, &l->cap, key);
    return l->st != ZB_OK;
}

/* Every object below `prefix`, at any depth, into l->keys. */
static zb_status
list_all(zb_store *store, const char *prefix, key_list *l)
{
    size_t first_dir = l->ndirs;
    l->prefix = prefix;
    zb_status st = zb_store_list(store, prefix, on_child, l);
    if (st == ZB_OK) st = l->st;
    /* the children found here are listed after this level's listing ended */
    size_t end = l->ndirs;
    for (size_t i = first_dir; i < end && st == ZB_OK; i++) st = list_all(store, l->dirs[i], l);
    return st;
}

static int
cmp_keys(const void *a, const void *b)
{
    return cv_cmp_walk(*(char *const *)a, *(char *const *)b);
}

/* CRC-64 and size of one object, read in blocks (a shard may be large) until one comes back
 * short: no size request first, which halves the round trips to a bucket. The blocks and the
 * buffer are aligned for direct reads (zb_store_opts.direct_io): the bytes written directly
 * are not in the page cache, and reading them through it would cost what writing saved. */
zb_status
cv_object_crc(zb_store *store, const char *key, uint8_t *buf, size_t block, uint64_t *size,
              uint64_t *crc)
{
    uint64_t c = 0, off = 0, got = 0;
    do {
        ZB_TRY(zb_store_get(store, key, off, block, buf, &got));
        c = cv_crc64(c, buf, (size_t)got);
        off += got;
    } while (got == block);
    *size = off;
    *crc = c;
    return ZB_OK;
}

struct cv_checked {
    char *key;
    uint64_t size, crc;
};

static int
cmp_checked(const void *a, const void *b)
{
    return strcmp(((const struct cv_checked *)a)->key, ((const struct cv_checked *)b)->key);
}

/* The record of object `key` read back, or NULL (cv->lock held). */
static struct cv_checked *
checked_find(zb_convert *cv, const char *key)
{
    struct cv_checked k = {(char *)key, 0, 0};
    return cv->n_checked ? bsearch(&k, cv->checked, cv->n_checked, sizeof k, cmp_checked) : NULL;
}

zb_status
cv_output_remember(zb_convert *cv, const char *key, uint64_t size, uint64_t crc)
{
    zb_status st = ZB_OK;
    pthread_mutex_lock(&cv->lock);
    struct cv_checked *c = checked_find(cv, key);
    if (c) {
        c->size = size;
        c->crc = crc;
    } else {
        if (cv->n_checked == cv->cap_checked) {
            size_t cap = cv->cap_checked ? 2 * cv->cap_checked : 256;
            struct cv_checked *p = realloc(cv->checked, cap * sizeof *p);
            if (p) cv->checked = p, cv->cap_checked = cap;
        }
        char *k = cv->n_checked < cv->cap_checked ? strdup(key) : NULL;
        if (!k) {
            st = zb__err(ZB_E_NOMEM, "remembering %s", key);
        } else { /* into its place: the list stays sorted for checked_find */
            size_t at = cv->n_checked;
            while (at > 0 && strcmp(cv->checked[at - 1].key, key) > 0) at--;
            memmove(cv->checked + at + 1, cv->checked + at,
                    (cv->n_checked - at) * sizeof *cv->checked);
            cv->checked[at] = (struct cv_checked){k, size, crc};
            cv->n_checked++;
        }
    }
    pthread_mutex_unlock(&cv->lock);
    return st;
}

void
cv_output_forget_all(zb_convert *cv)
{
    for (size_t i = 0; i < cv->n_checked; i++) free(cv->checked[i].key);
    free(cv->checked);
    cv->checked = NULL;
    cv->n_checked = cv->cap_checked = 0;
}

/* Object `key`'s size and CRC-64: remembered from its read-back when its size is still the one
 * read, else read now. */
static zb_status
output_crc(zb_convert *cv, const char *key, uint8_t *buf, size_t block, uint64_t *size,
           uint64_t *crc)
{
    pthread_mutex_lock(&cv->lock);
    struct cv_checked *c = checked_find(cv, key), seen = c ? *c : (struct cv_checked){0};
    pthread_mutex_unlock(&cv->lock);
    uint64_t now = 0;
    if (c && zb_store_size(cv->out, key, &now) == ZB_OK && now == seen.size) {
        *size = seen.size;
        *crc = seen.crc;
        return ZB_OK;
    }
    return cv_object_crc(cv->out, key, buf, block, size, crc);
}

zb_status
cv_output_fingerprint(zb_convert *cv, const char *prefix, uint64_t *size, uint64_t *crc)
{
    key_list l = {0};
    zb_status st = list_all(cv->out, prefix, &l);
    if (st == ZB_OK && l.n == 0)
        st = zb__err(ZB_E_NOTFOUND, "%s/%s: nothing there", cv->output, prefix);
    if (st == ZB_OK) qsort(l.keys, l.n, sizeof *l.keys, cmp_keys);
    enum { BLOCK = 4 << 20 };
    uint8_t *buf = st == ZB_OK ? aligned_alloc(ZB_STORE_DIRECT_ALIGN, BLOCK) : NULL;
    if (st == ZB_OK && !buf) st = zb__err(ZB_E_NOMEM, "a read buffer");
    uint64_t total = 0, c = 0;
    size_t skip = strlen(prefix) + 1;
    for (size_t i = 0; i < l.n && st == ZB_OK; i++) {
        uint64_t n = 0, oc = 0;
        st = output_crc(cv, l.keys[i], buf, BLOCK, &n, &oc);
        char line[4200];
        int ll = snprintf(line, sizeof line, "%s\t%" PRIu64 "\t%016" PRIx64 "\n", l.keys[i] + skip,
                          n, oc);
        if (st == ZB_OK) c = cv_crc64(c, line, (size_t)ll);
        total += n;
    }
    free(buf);
    for (size_t i = 0; i < l.n; i++) free(l.keys[i]);
    for (size_t i = 0; i < l.ndirs; i++) free(l.dirs[i]);
    free(l.keys);
    free(l.dirs);
    *size = total;
    *crc = c;
    return st;
}
