/* The chunk objects an array has in its store (stored.h).
 *
 * A chunk key is the array path, the key prefix ("c/" or "c." in Zarr v3's default encoding,
 * nothing in v2 and v3's "v2" encoding) and one decimal index per dimension joined by the
 * separator (FORMATS.md §1-§2). With "/" as separator each index is a directory level, with
 * "." the whole key is one name; the listing recurses as deep as the key can go and parses
 * what it finds, and a name counts only if formatting its coordinates gives the same key. */
#include "stored.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/status.h"
#include "zarr/array.h"
#include "zarr/meta.h"

#define REL_CAP 512

typedef struct walk {
    zb_store *store;
    const zb_array *a;
    int nd;
    uint64_t hi[ZB_MAX_DIMS]; /* chunk objects per dimension */
    const char *base;         /* the array's path ("" at the root) */
    char rel[REL_CAP];        /* the directory being listed, relative to base */
    int depth;
    uint64_t *coords;
    size_t n, cap;
    zb_status st;
} walk;

/* Parses one decimal index (no sign, no leading zeros) ending at `end`; false otherwise. */
static bool
parse_index(const char *s, const char *end, uint64_t *out)
{
    if (s == end || (*s == '0' && end - s > 1)) return false;
    uint64_t v = 0;
    for (; s < end; s++) {
        if (*s < '0' || *s > '9' || v > (UINT64_MAX - 9) / 10) return false;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *out = v;
    return true;
}

/* The coordinates of key `rel` (relative to the array), if it is one of its chunk keys. */
static bool
parse_key(const walk *w, const char *rel, uint64_t *g)
{
    const zb__array_meta *m = &w->a->meta;
    size_t np = strlen(m->key_prefix);
    if (strncmp(rel, m->key_prefix, np) != 0) return false;
    const char *s = rel + np;
    for (int d = 0; d < w->nd; d++) {
        const char *end = d + 1 < w->nd ? strchr(s, m->sep) : s + strlen(s);
        if (!end || !parse_index(s, end, &g[d]) || g[d] >= w->hi[d]) return false;
        s = d + 1 < w->nd ? end + 1 : end;
    }
    return *s == '\0';
}

static int
on_entry(void *ctx, const char *name, bool is_dir)
{
    walk *w = ctx;
    char rel[REL_CAP];
    int len = snprintf(rel, sizeof rel, "%s%s", w->rel, name);
    if (len < 0 || (size_t)len >= sizeof rel - 1) return 0; /* too long to be a chunk key */
    if (is_dir) {
        /* a level of a "/"-separated key: at most the prefix's and one per dimension */
        if (w->depth > w->nd) return 0;
        char saved[REL_CAP], prefix[4096 + REL_CAP];
        int pl = snprintf(prefix, sizeof prefix, "%s%s%s", w->base, w->base[0] ? "/" : "", rel);
        if (pl < 0 || (size_t)pl >= sizeof prefix) return 0;
        memcpy(saved, w->rel, sizeof saved);
        memcpy(w->rel, rel, (size_t)len);
        w->rel[len] = '/';
        w->rel[len + 1] = '\0';
        w->depth++;
        zb_status st = zb_store_list(w->store, prefix, on_entry, w);
        w->depth--;
        memcpy(w->rel, saved, sizeof saved);
        if (st != ZB_OK) w->st = st;
        return w->st != ZB_OK;
    }
    uint64_t g[ZB_MAX_DIMS];
    if (!parse_key(w, rel, g)) return 0;
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        uint64_t *c = realloc(w->coords, cap * (size_t)w->nd * sizeof *c);
        if (!c) {
            w->st = zb__err(ZB_E_NOMEM, "%s: out of memory listing chunks", w->a->path);
            return 1;
        }
        w->coords = c;
        w->cap = cap;
    }
    memcpy(w->coords + w->n * (size_t)w->nd, g, (size_t)w->nd * sizeof *g);
    w->n++;
    return 0;
}

static int
cmp_coords(const uint64_t *a, const uint64_t *b, int nd)
{
    for (int d = 0; d < nd; d++)
        if (a[d] != b[d]) return a[d] < b[d] ? -1 : 1;
    return 0;
}

/* Rows of nd values into C order: a merge sort, as qsort takes no context for nd. */
static void
sort_rows(uint64_t *rows, uint64_t *tmp, size_t n, int nd)
{
    if (n < 2) return;
    size_t h = n / 2, k = (size_t)nd;
    sort_rows(rows, tmp, h, nd);
    sort_rows(rows + h * k, tmp, n - h, nd);
    size_t i = 0, j = h, o = 0;
    while (i < h || j < n) {
        bool left = j >= n || (i < h && cmp_coords(rows + i * k, rows + j * k, nd) <= 0);
        memcpy(tmp + o * k, rows + (left ? i++ : j++) * k, k * sizeof *tmp);
        o++;
    }
    memcpy(rows, tmp, n * k * sizeof *tmp);
}

zb_status
zb__stored_chunks(zb_store *store, const zb_array *a, uint64_t **coords, size_t *n)
{
    *coords = NULL;
    *n = 0;
    walk w = {.store = store, .a = a, .nd = a->meta.ndim};
    for (int d = 0; d < w.nd; d++) {
        w.hi[d] = (a->meta.shape[d] + a->meta.chunks[d] - 1) / a->meta.chunks[d];
        if (w.hi[d] == 0) return ZB_OK;
    }
    w.base = a->path;
    zb_status st = zb_store_list(store, w.base, on_entry, &w);
    if (st == ZB_E_NOTFOUND) {
        zb_clear_error();
        st = ZB_OK;
    }
    if (st == ZB_OK) st = w.st;
    if (st == ZB_OK && w.n > 1) {
        uint64_t *tmp = malloc(w.n * (size_t)w.nd * sizeof *tmp);
        if (!tmp)
            st = zb__err(ZB_E_NOMEM, "%s: out of memory listing chunks", a->path);
        else
            sort_rows(w.coords, tmp, w.n, w.nd);
        free(tmp);
    }
    if (st != ZB_OK) {
        free(w.coords);
        return st;
    }
    *coords = w.coords;
    *n = w.n;
    return ZB_OK;
}
