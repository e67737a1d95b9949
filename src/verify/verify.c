/* zb_verify: checks a store and lists what is wrong with it (include/zbatch_verify.h).
 *
 * The readers stop at the first error; this walks everything and keeps going, so one run
 * names every broken chunk, pointer and length. It is built from the reader's own pieces (the
 * tree loader, the metadata parsers, the unit decoder and the shard index validation), so a
 * store verify calls clean is one the readers read, and what verify reports is what they
 * would fail on. Layout rules: shared FORMATS.md §6 (anndata) and §8 (AtomicData).
 *
 * Order: the marker (an uncommitted store is reported and nothing else), the tree of node
 * documents, the consolidated snapshot against it, every array's metadata, every chunk, then
 * the layout rules per group. Layout rules skip arrays whose chunks failed: their values are
 * unknown and the failure is already listed. */
#include "zbatch_verify.h"

#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset.h"
#include "util/buf.h"
#include "util/intload.h"
#include "util/json.h"
#include "util/status.h"
#include "zarr/array.h"
#include "zarr/meta.h"
#include "zarr/shard.h"
#include "zarr/tree.h"
#include "stored.h"

#define KEY_CAP 4600
#define MSG_CAP 1400
/* Values per block when pointer, index and mask arrays are scanned: 512 KiB of int64. */
#define BLOCK_VALUES 65536

/* One array node of the tree. */
typedef struct varr {
    const zb__tree_node *node;
    zb_array *a; /* NULL when its metadata is invalid or unsupported (already reported) */
    bool bad;    /* some chunk failed: its values are not checked */
} varr;

typedef struct verifier {
    zb_store *store;
    zb_verify_report *r;
    size_t cap;      /* findings kept */
    size_t kept_cap; /* allocated entries of r->problems */
    zb_ctx *ctx;
    zb__tree *tree;
    varr *arrays; /* in tree order, so sorted by path */
    size_t narrays;
    zb__buf enc, unit;
    bool listed;     /* the store lists keys (else the consolidated snapshot is the tree) */
    zb_status fatal; /* ZB_E_NOMEM while recording: the run stops */
} verifier;

/* ---- findings ------------------------------------------------------------------------- */

static void finding(verifier *v, zb_verify_severity sev, zb_status st, const char *key,
                    const char *fmt, ...) ZB_PRINTF(5, 6);

static void
finding(verifier *v, zb_verify_severity sev, zb_status st, const char *key, const char *fmt, ...)
{
    zb_verify_report *r = v->r;
    if (sev == ZB_VERIFY_PROBLEM)
        r->n_problems++;
    else
        r->n_notes++;
    if (r->n_kept >= v->cap || v->fatal != ZB_OK) return;
    if (r->n_kept == v->kept_cap) {
        size_t cap = v->kept_cap ? v->kept_cap * 2 : 16;
        if (cap > v->cap) cap = v->cap;
        zb_verify_problem *p = realloc(r->problems, cap * sizeof *p);
        if (!p) {
            v->fatal = zb__err(ZB_E_NOMEM, "verify: out of memory for the report");
            return;
        }
        r->problems = p;
        v->kept_cap = cap;
    }
    char msg[MSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* one line per finding, whatever the store's strings hold */
    for (char *c = msg; *c; c++)
        if (*c == '\n' || *c == '\r') *c = ' ';
    zb_verify_problem *p = &r->problems[r->n_kept];
    p->severity = sev;
    p->status = st;
    p->key = strdup(key && *key ? key : "/");
    p->message = strdup(msg);
    if (!p->key || !p->message) {
        free(p->key);
        free(p->message);
        v->fatal = zb__err(ZB_E_NOMEM, "verify: out of memory for the report");
        return;
    }
    r->n_kept++;
}

/* The library's detail message for a failure about `key`, without a leading "key: " (the
 * finding already names the key). */
static const char *
detail(const char *key)
{
    const char *m = zb_last_error();
    size_t n = strlen(key);
    if (n && !strncmp(m, key, n) && m[n] == ':' && m[n + 1] == ' ') m += n + 2;
    return *m ? m : "failed";
}

/* A finding for a failed library call about `key`; ZB_E_NOMEM stops the run instead. */
static void
failed(verifier *v, zb_status st, const char *key, const char *context)
{
    if (st == ZB_E_NOMEM) {
        if (v->fatal == ZB_OK) v->fatal = st;
        return;
    }
    finding(v, ZB_VERIFY_PROBLEM, st, key, "%s%s%s", context ? context : "", context ? ": " : "",
            detail(key));
}

static void
join(char *buf, size_t cap, const char *a, const char *b)
{
    int n =
        a[0] && b[0] ? snprintf(buf, cap, "%s/%s", a, b) : snprintf(buf, cap, "%s", a[0] ? a : b);
    if (n < 0 || (size_t)n >= cap) buf[cap - 1] = '\0'; /* keys beyond the store's limit */
}

static const char *
shown(const char *path)
{
    return path[0] ? path : "/";
}

/* ---- tree lookups --------------------------------------------------------------------- */

static varr *
find_array(verifier *v, const char *path)
{
    size_t lo = 0, hi = v->narrays;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(v->arrays[mid].node->path, path);
        if (c == 0) return &v->arrays[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* The array `name` below group `base`, or NULL (no node, not an array). */
static varr *
child_array(verifier *v, const char *base, const char *name)
{
    char p[KEY_CAP];
    join(p, sizeof p, base, name);
    return find_array(v, p);
}

static const zb__tree_node *
child_node(verifier *v, const char *base, const char *name)
{
    char p[KEY_CAP];
    join(p, sizeof p, base, name);
    return zb__tree_find(v->tree, p);
}

/* The direct children of `base` are visited by scanning the tree: node counts are small (a
 * few hundred in an anndata store) next to the chunks each array holds. */
static const char *
child_name(const zb__tree_node *n, const char *base)
{
    size_t len = strlen(base);
    const char *p = n->path;
    if (len) {
        if (strncmp(p, base, len) || p[len] != '/') return NULL;
        p += len + 1;
    }
    if (!*p || strchr(p, '/')) return NULL;
    return p;
}

static const char *
attr_str(json_object *attrs, const char *key)
{
    json_object *s = zb__json_get(attrs, key);
    return json_object_is_type(s, json_type_string) ? json_object_get_string(s) : NULL;
}

static bool
is_int_dtype(zb_dtype dt)
{
    return dt >= ZB_DT_INT8 && dt <= ZB_DT_UINT64;
}

/* Rows along axis 0 (an array that is checked has ndim >= 1 where this is asked). */
static uint64_t
rows_of(const varr *va)
{
    return va->a->meta.ndim ? va->a->meta.shape[0] : 1;
}

/* ---- the marker ----------------------------------------------------------------------- */

/* True (and a problem) when the writers' marker is at `path`. */
static bool
check_marker(verifier *v, const char *path)
{
    char key[KEY_CAP];
    join(key, sizeof key, path, ZB_INCOMPLETE_MARKER);
    uint64_t size = 0;
    zb_status st = zb_store_size(v->store, key, &size);
    if (st == ZB_E_NOTFOUND) {
        zb_clear_error();
        return false;
    }
    if (st != ZB_OK) {
        failed(v, st, key, "cannot look for the write marker");
        return false;
    }
    /* The marker is a short JSON naming its writer; say which when it parses. */
    char who[160] = "";
    uint8_t buf[512];
    uint64_t got = 0;
    if (size < sizeof buf && zb_store_get(v->store, key, 0, size, buf, &got) == ZB_OK) {
        json_object *doc = NULL;
        if (zb__json_parse((const char *)buf, (size_t)got, key, &doc) == ZB_OK) {
            const char *w = attr_str(doc, "writer"), *l = attr_str(doc, "layout");
            if (w || l)
                snprintf(who, sizeof who, " (%s%s%s writer)", w ? w : "", w && l ? " " : "",
                         l ? l : "");
            json_object_put(doc);
        }
    }
    zb_clear_error();
    finding(v, ZB_VERIFY_PROBLEM, ZB_E_INCOMPLETE, key,
            "incomplete: a write was not committed%s; '%s' is not a valid store until its "
            "writer commits (rerun the write)",
            who, shown(path));
    return true;
}

/* ---- metadata ------------------------------------------------------------------------- */

static void
doc_key(char *buf, size_t cap, const zb__tree_node *n)
{
    join(buf, cap, n->path,
         n->zarr_format == 2 ? (n->is_array ? ".zarray" : ".zgroup") : "zarr.json");
}

static zb_status
parse_meta(const zb__tree_node *n, zb__array_meta *m)
{
    return n->zarr_format == 2 ? zb__meta_from_v2_obj(n->doc, n->attrs, n->path, m)
                               : zb__meta_from_v3_obj(n->doc, n->path, m);
}

/* Parses and opens every array of the tree; checks v2 group documents (the tree loader only
 * asks them to be objects). */
static zb_status
open_arrays(verifier *v)
{
    size_t n = 0;
    for (size_t i = 0; i < v->tree->n; i++) n += v->tree->nodes[i].is_array;
    v->arrays = calloc(n ? n : 1, sizeof *v->arrays);
    if (!v->arrays) return v->fatal = ZB_E_NOMEM;
    char key[KEY_CAP];
    for (size_t i = 0; i < v->tree->n && v->fatal == ZB_OK; i++) {
        const zb__tree_node *nd = &v->tree->nodes[i];
        doc_key(key, sizeof key, nd);
        if (!nd->is_array) {
            json_object *zf = zb__json_get(nd->doc, "zarr_format");
            if (nd->zarr_format == 2 &&
                (!json_object_is_type(zf, json_type_int) || json_object_get_int64(zf) != 2))
                finding(v, ZB_VERIFY_PROBLEM, ZB_E_METADATA, key, "zarr_format is not 2");
            continue;
        }
        varr *va = &v->arrays[v->narrays++];
        va->node = nd;
        v->r->n_arrays++;
        zb__array_meta m;
        zb_status st = parse_meta(nd, &m);
        if (st == ZB_OK) st = zb__array_open_meta(v->store, nd->path, &m, &va->a);
        if (st == ZB_E_UNSUPPORTED) {
            finding(v, ZB_VERIFY_NOTE, st, key, "not checked: %s", detail(nd->path));
        } else if (st != ZB_OK) {
            failed(v, st, key, NULL);
        }
    }
    return v->fatal;
}

/* Deep equality of two JSON values in which NaN equals NaN (attributes may hold NaN, and a
 * consolidated copy of one is still the same value). */
static bool
json_same(json_object *a, json_object *b)
{
    json_type ta = json_object_get_type(a), tb = json_object_get_type(b);
    if (ta != tb) return false;
    switch (ta) {
    case json_type_null:
        return true;
    case json_type_boolean:
        return json_object_get_boolean(a) == json_object_get_boolean(b);
    case json_type_double: {
        double x = json_object_get_double(a), y = json_object_get_double(b);
        return x == y || (isnan(x) && isnan(y));
    }
    case json_type_int:
        if (zb__json_is_big_uint(a) || zb__json_is_big_uint(b))
            return zb__json_is_big_uint(a) && zb__json_is_big_uint(b) &&
                   json_object_get_uint64(a) == json_object_get_uint64(b);
        return json_object_get_int64(a) == json_object_get_int64(b);
    case json_type_string:
        return json_object_get_string_len(a) == json_object_get_string_len(b) &&
               !memcmp(json_object_get_string(a), json_object_get_string(b),
                       (size_t)json_object_get_string_len(a));
    case json_type_array: {
        size_t n = json_object_array_length(a);
        if (n != json_object_array_length(b)) return false;
        for (size_t i = 0; i < n; i++)
            if (!json_same(json_object_array_get_idx(a, i), json_object_array_get_idx(b, i)))
                return false;
        return true;
    }
    case json_type_object: {
        if (json_object_object_length(a) != json_object_object_length(b)) return false;
        json_object_object_foreach(a, k, av)
        {
            json_object *bv = NULL;
            if (!json_object_object_get_ex(b, k, &bv) || !json_same(av, bv)) return false;
        }
        return true;
    }
    }
    return false;
}

static void
dims_text(char *buf, size_t cap, const uint64_t *d, int n)
{
    size_t w = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && w + 24 < cap; i++)
        w += (size_t)snprintf(buf + w, cap - w, "%s%" PRIu64, i ? ", " : "[", d[i]);
    snprintf(buf + w, cap - w, "%s", n ? "]" : "[]");
}

/* Compares one array as the snapshot has it with its own document. */
static void
compare_array_meta(verifier *v, const zb__tree_node *disk, const zb__tree_node *snap,
                   const char *key)
{
    zb__array_meta a, b;
    if (parse_meta(disk, &a) != ZB_OK) return; /* reported with the arrays */
    zb_status st = parse_meta(snap, &b);
    if (st != ZB_OK) {
        zb__meta_free(&a);
        if (st != ZB_E_UNSUPPORTED)
            finding(v, ZB_VERIFY_PROBLEM, st, key, "consolidated metadata entry: %s",
                    detail(disk->path));
        return;
    }
    char x[256], y[256];
    if (a.ndim != b.ndim || memcmp(a.shape, b.shape, sizeof(uint64_t) * (size_t)a.ndim)) {
        dims_text(x, sizeof x, a.shape, a.ndim);
        dims_text(y, sizeof y, b.shape, b.ndim);
        finding(v, ZB_VERIFY_PROBLEM, ZB_E_METADATA, key,
                "shape %s, but the consolidated metadata says %s (a stale snapshot: readers "
                "that use it see the old shape)",
                x, y);
    } else if (memcmp(a.chunks, b.chunks, sizeof(uint64_t) * (size_t)a.ndim) ||
               a.dtype != b.dtype) {
        finding(v, ZB_VERIFY_PROBLEM, ZB_E_METADATA, key,
                "chunks or dtype differ from the consolidated metadata");
    }
    zb__meta_free(&a);
    zb__meta_free(&b);
}

/* Loads the consolidated snapshot (when the root has one) and compares it with the tree of
 * node documents. */
static void
check_consolidated(verifier *v, const char *root)
{
    const zb__tree_node *top = zb__tree_find(v->tree, root);
    if (!top || top->is_array) return;
    char key[KEY_CAP];
    join(key, sizeof key, root, v->tree->zarr_format == 2 ? ".zmetadata" : "zarr.json");
    if (v->tree->zarr_format == 3 && !zb__json_get(top->doc, "consolidated_metadata")) return;
    if (v->tree->zarr_format == 2) {
        uint64_t size;
        zb_status st = zb_store_size(v->store, key, &size);
        zb_clear_error();
        if (st != ZB_OK) return;
    }
    zb__tree *snap = NULL;
    zb_status st = zb__tree_load(v->store, root, true, &snap);
    if (st != ZB_OK) {
        failed(v, st, key, "consolidated metadata");
        return;
    }
    char nkey[KEY_CAP];
    for (size_t i = 0; i < v->tree->n; i++) {
        const zb__tree_node *d = &v->tree->nodes[i];
        const zb__tree_node *s = zb__tree_find(snap, d->path);
        doc_key(nkey, sizeof nkey, d);
        if (!s) {
            finding(v, ZB_VERIFY_PROBLEM, ZB_E_METADATA, nkey,
                    "missing from the consolidated metadata in %s (readers that use it do not "
                    "see this %s)",
                    key, d->is_array ? "array" : "group");
        } else if (s->is_array != d->is_array) {
            finding(v, ZB_VERIFY_PROBLEM, ZB_E_METADATA, nkey,
                    "a%s, but the consolidated metadata says a%s",
                    d->is_array ? "n array" : " group", s->is_array ? "n array" : " group");
        } else {
            if (!json_same(d->attrs, s->attrs))
                finding(v, ZB_VERIFY_PROBLEM, ZB_E_METADATA, nkey,
                        "attributes differ from the consolidated metadata in %s (a stale "
                        "snapshot)",
                        key);
            if (d->is_array) compare_array_meta(v, d, s, nkey);
        }
    }
    for (size_t i = 0; i < snap->n; i++) {
        const zb__tree_node *s = &snap->nodes[i];
        if (zb__tree_find(v->tree, s->path)) continue;
        finding(v, ZB_VERIFY_PROBLEM, ZB_E_METADATA, shown(s->path),
                "listed in the consolidated metadata, but the node's own document is missing");
    }
    zb__tree_free(snap);
}

/* ---- chunks --------------------------------------------------------------------------- */

/* Odometer over grid coordinates [0, hi) on every axis; false when done. */
static bool
next_coord(uint64_t *g, const uint64_t *hi, int nd)
{
    for (int d = nd - 1; d >= 0; d--) {
        if (++g[d] < hi[d]) return true;
        g[d] = 0;
    }
    return false;
}

/* The chunk objects (chunks, or shards) of an array to visit: the stored ones, found by
 * listing, so an array declaring a grid of 2^60 chunks with three stored costs three; on a
 * store that cannot list, every grid position (then a missing one counts as it is met). */
typedef struct units {
    int nd;
    uint64_t hi[ZB_MAX_DIMS];
    uint64_t *coords; /* listed: n rows of nd */
    size_t n, i;
    bool grid, started;
} units;

/* Opens the walk; false (reported) when the listing fails. In listed mode the grid positions
 * without an object are added to n_missing at once. */
static bool
units_open(verifier *v, varr *va, units *u)
{
    const zb__array_meta *m = &va->a->meta;
    memset(u, 0, sizeof *u);
    u->nd = m->ndim;
    uint64_t total = 1;
    for (int d = 0; d < u->nd; d++) {
        u->hi[d] = (m->shape[d] + m->chunks[d] - 1) / m->chunks[d];
        if (!zb__mul_u64(total, u->hi[d], &total)) total = UINT64_MAX;
    }
    zb_status st = zb__stored_chunks(v->store, va->a, &u->coords, &u->n);
    if (st == ZB_E_UNSUPPORTED) {
        zb_clear_error();
        u->grid = true;
        return true;
    }
    if (st != ZB_OK) {
        failed(v, st, va->a->path, "listing its chunks");
        va->bad = true;
        return false;
    }
    v->r->n_missing += total - u->n;
    return true;
}

/* The next object's grid coordinates into g; false when done. */
static bool
units_next(units *u, uint64_t *g)
{
    if (!u->grid) {
        if (u->i >= u->n) return false;
        memcpy(g, u->coords + u->i++ * (size_t)u->nd, (size_t)u->nd * sizeof *g);
        return true;
    }
    if (!u->started) {
        u->started = true;
        for (int d = 0; d < u->nd; d++) {
            g[d] = 0;
            if (u->hi[d] == 0) return false;
        }
        return true;
    }
    return next_coord(g, u->hi, u->nd);
}

static void
units_close(units *u)
{
    free(u->coords);
}

/* The `len` bytes at `off` of array a's object `key`, read into v->enc (zb__unit_read: never a
 * view, so a store written a moment ago through the same handle is seen as written); a
 * problem (and NULL) when it fails. `what` names the part of the object read (an inner
 * chunk), or is NULL for the whole object. */
static const uint8_t *
fetch(verifier *v, const zb_array *a, const char *key, uint64_t off, uint64_t len, const char *what)
{
    const uint8_t *data = NULL;
    zb_status st = zb__unit_read(a, key, off, len, &v->enc, &data, NULL);
    if (st != ZB_OK) failed(v, st, key, what);
    return st == ZB_OK ? data : NULL;
}

static void
check_plain(verifier *v, varr *va)
{
    const zb_array *a = va->a;
    const zb__array_meta *m = &a->meta;
    uint64_t g[ZB_MAX_DIMS] = {0};
    units u;
    if (!units_open(v, va, &u)) return;
    char key[KEY_CAP];
    while (v->fatal == ZB_OK && units_next(&u, g)) {
        zb_status st = zb__meta_chunk_key(m, a->path, g, key, sizeof key);
        if (st != ZB_OK) {
            failed(v, st, a->path, NULL);
            va->bad = true;
            break;
        }
        uint64_t size = 0;
        st = zb_store_size(v->store, key, &size);
        if (st == ZB_E_NOTFOUND) {
            zb_clear_error();
            v->r->n_missing++;
            continue;
        }
        v->r->n_chunks++;
        if (st != ZB_OK) {
            failed(v, st, key, NULL);
            va->bad = true;
            continue;
        }
        const uint8_t *enc = fetch(v, a, key, 0, size, NULL);
        if (!enc) {
            va->bad = true;
            continue;
        }
        st = zb__array_decode_unit(a, v->ctx, enc, (size_t)size, v->unit.data, key);
        if (st != ZB_OK) {
            failed(v, st, key, NULL);
            va->bad = true;
        }
    }
    units_close(&u);
}

/* Every shard: its index read and validated, every non-empty inner chunk decoded. */
static void
check_shards(verifier *v, varr *va)
{
    const zb_array *a = va->a;
    const zb__array_meta *m = &a->meta;
    int nd = m->ndim;
    uint64_t s[ZB_MAX_DIMS] = {0}, cps[ZB_MAX_DIMS], grid[ZB_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        cps[d] = m->chunks[d] / a->inner[d];
        grid[d] = (m->shape[d] + a->inner[d] - 1) / a->inner[d];
    }
    units u;
    if (!units_open(v, va, &u)) return;
    char key[KEY_CAP], what[160];
    while (v->fatal == ZB_OK && units_next(&u, s)) {
        zb_status st = zb__meta_chunk_key(m, a->path, s, key, sizeof key);
        if (st != ZB_OK) {
            failed(v, st, a->path, NULL);
            va->bad = true;
            break;
        }
        uint64_t *e = NULL, n = 0;
        bool missing = false;
        st = zb__array_shard_index(a, v->ctx, s, &e, &n, &missing);
        if (st != ZB_OK) {
            /* a shard cut short lands here: its index is not where the end says it is */
            failed(v, st, key, "shard index");
            va->bad = true;
            continue;
        }
        if (missing) {
            v->r->n_missing++;
            continue;
        }
        for (uint64_t j = 0; j < n && v->fatal == ZB_OK; j++) {
            if (e[2 * j] == ZB_SHARD_EMPTY) {
                /* count the empty entries that stand for chunks inside the array */
                uint64_t rest = j;
                bool inside = true;
                for (int d = nd - 1; d >= 0; d--) {
                    inside = inside && s[d] * cps[d] + rest % cps[d] < grid[d];
                    rest /= cps[d];
                }
                v->r->n_missing += inside;
                continue;
            }
            v->r->n_chunks++;
            snprintf(what, sizeof what, "inner chunk %" PRIu64 " at [%" PRIu64 ", %" PRIu64 ")", j,
                     e[2 * j], e[2 * j] + e[2 * j + 1]);
            const uint8_t *enc = fetch(v, a, key, e[2 * j], e[2 * j + 1], what);
            if (!enc) {
                va->bad = true;
                continue;
            }
            st = zb__array_decode_unit(a, v->ctx, enc, (size_t)e[2 * j + 1], v->unit.data, key);
            if (st != ZB_OK) {
                failed(v, st, key, what);
                va->bad = true;
            }
        }
        free(e);
    }
    units_close(&u);
}

/* Strings, 0-d arrays and arrays with codecs on whole shards go through the row reader, one
 * read unit (or shard) of rows at a time. */
static void
check_by_rows(verifier *v, varr *va)
{
    const zb_array *a = va->a;
    const zb__array_meta *m = &a->meta;
    bool whole = zb__array_whole_shard(a);
    uint64_t rows = rows_of(va);
    uint64_t block = m->ndim == 0 ? 1 : whole ? m->chunks[0] : a->inner[0];
    if (m->ndim > 0 && a->row_elems == 0) return;
    /* the rows of the stored objects only (units_open), one object row (m->chunks[0] rows)
     * after another; 0-d arrays have their one chunk */
    units u = {0};
    uint64_t og[ZB_MAX_DIMS] = {0}, obj_rows = m->ndim ? m->chunks[0] : 1, next_obj = 0;
    bool listed = m->ndim > 0;
    if (listed && !units_open(v, va, &u)) return;
    if (listed && u.grid) listed = false; /* cannot list: every row, as before */
    char key[KEY_CAP];
    for (uint64_t r0 = 0; r0 < rows && v->fatal == ZB_OK; r0 += block) {
        if (listed && r0 >= next_obj) {
            /* the next stored object row at or after r0 (objects come in C order) */
            bool more = false;
            while (units_next(&u, og))
                if ((og[0] + 1) * obj_rows > r0) {
                    more = true;
                    break;
                }
            if (!more) break;
            if (og[0] * obj_rows > r0) r0 = og[0] * obj_rows;
            next_obj = og[0] * obj_rows + obj_rows < rows ? og[0] * obj_rows + obj_rows : rows;
        }
        uint64_t r1 = rows - r0 < block ? rows : r0 + block;
        zb_ctx_stats before, after;
        zb_ctx_get_stats(v->ctx, &before);
        zb_status st;
        if (m->dtype == ZB_DT_STRING) {
            zb_strings strs;
            st = zb_array_read_strings(a, r0, r1, &strs, v->ctx);
            zb_strings_free(&strs);
        } else {
            uint64_t bytes = (r1 - r0) * a->row_elems * m->itemsize;
            st = zb__buf_reserve(&v->unit, bytes ? (size_t)bytes : 1);
            if (st == ZB_OK) st = zb_array_read_rows(a, r0, r1, v->unit.data, v->unit.cap, v->ctx);
        }
        zb_ctx_get_stats(v->ctx, &after);
        v->r->n_chunks += after.chunks_decoded - before.chunks_decoded;
        if (!listed)
            v->r->n_missing += after.chunks_filled - before.chunks_filled; /* else
                                                     counted by the listing (units_open) */
        if (st != ZB_OK) {
            /* name the first unit (or shard) of the block: exact for 1-d arrays; the detail
             * message is kept aside while the key is built */
            char msg[1100];
            snprintf(msg, sizeof msg, "%s", zb_last_error());
            uint64_t g[ZB_MAX_DIMS] = {0};
            g[0] = m->ndim ? r0 / a->inner[0] : 0;
            if (zb__array_unit_object(a, g, key, sizeof key, NULL, NULL) != ZB_OK)
                snprintf(key, sizeof key, "%s", a->path);
            zb__err(st, "%s", msg);
            if (after.chunks_decoded == before.chunks_decoded) v->r->n_chunks++;
            failed(v, st, key, NULL);
            va->bad = true;
        }
    }
    units_close(&u);
}

static void
check_chunks(verifier *v, varr *va)
{
    const zb_array *a = va->a;
    const zb__array_meta *m = &a->meta;
    if (m->dtype == ZB_DT_STRING || m->ndim == 0 || zb__array_whole_shard(a)) {
        check_by_rows(v, va);
        return;
    }
    uint64_t unit = zb__array_unit_bytes(a);
    zb_status st = zb__buf_reserve(&v->unit, unit ? (size_t)unit : 1);
    if (st != ZB_OK) {
        failed(v, st, a->path, NULL);
        va->bad = true;
        return;
    }
    if (m->chain.ab == ZB_AB_SHARDING)
        check_shards(v, va);
    else
        check_plain(v, va);
}

/* ---- values, block by block ----------------------------------------------------------- */

/* The integer values of an array in C order, read block by block. Blocks are whole chunks of
 * rows (at least BLOCK_VALUES values), so each chunk is decoded once as callers walk forward
 * (a pointer pair is read p, then p+1). */
typedef struct ival {
    verifier *v;
    varr *va;
    uint64_t n;         /* values */
    uint64_t row_elems; /* values per row */
    uint64_t block_rows;
    uint64_t base, len; /* values held: [base, base + len) */
    int64_t *val;
    zb__buf raw;
    bool failed;
} ival;

static zb_status
ival_init(ival *it, verifier *v, varr *va)
{
    memset(it, 0, sizeof *it);
    it->v = v;
    it->va = va;
    const zb_array *a = va->a;
    it->row_elems = a->meta.ndim ? a->row_elems : 1;
    it->n = a->meta.ndim ? a->total_elems : 1;
    if (it->row_elems == 0) return ZB_OK; /* no values: every get is past the end */
    uint64_t chunk = a->meta.ndim ? a->inner[0] : 1;
    uint64_t rows = it->row_elems >= BLOCK_VALUES ? 1 : BLOCK_VALUES / it->row_elems;
    it->block_rows = (rows + chunk - 1) / chunk * chunk;
    uint64_t nval;
    if (!zb__mul_u64(it->block_rows, it->row_elems, &nval) || nval > ZB_BUF_MAX / sizeof(int64_t))
        return zb__err(ZB_E_OVERFLOW, "%s: value block too large", a->path);
    it->val = malloc((size_t)nval * sizeof *it->val);
    if (!it->val) return zb__err(ZB_E_NOMEM, "verify: out of memory for a value block");
    return ZB_OK;
}

static void
ival_free(ival *it)
{
    free(it->val);
    zb__buf_free(&it->raw);
}

/* A value of an integer array; a uint64 above INT64_MAX saturates, so every bound check on it
 * fails (no pointer or index is that large). */
static int64_t
load_int(const uint8_t *p, zb_dtype dt)
{
    int64_t v;
    zb__load_int(p, dt, &v);
    return v;
}

/* Value i; false when it cannot be read (a problem is recorded once) or is past the end. */
static bool
ival_get(ival *it, uint64_t i, int64_t *out)
{
    if (i >= it->base && i - it->base < it->len) {
        *out = it->val[i - it->base];
        return true;
    }
    if (it->failed || i >= it->n) return false;
    const zb_array *a = it->va->a;
    uint64_t rows = rows_of(it->va);
    uint64_t r0 = i / it->row_elems / it->block_rows * it->block_rows;
    uint64_t r1 = rows - r0 < it->block_rows ? rows : r0 + it->block_rows;
    uint64_t nval = (r1 - r0) * it->row_elems;
    size_t isz = a->meta.itemsize;
    zb_status st = zb__buf_reserve(&it->raw, (size_t)(nval * isz));
    if (st == ZB_OK) st = zb_array_read_rows(a, r0, r1, it->raw.data, it->raw.cap, it->v->ctx);
    if (st != ZB_OK) {
        failed(it->v, st, a->path, "cannot read values");
        it->failed = true;
        return false;
    }
    for (uint64_t k = 0; k < nval; k++)
        it->val[k] = load_int(it->raw.data + k * isz, a->meta.dtype);
    it->base = r0 * it->row_elems;
    it->len = nval;
    *out = it->val[i - it->base];
    return true;
}

/* What a pointer scan found. */
typedef enum scan_result {
    SCAN_UNREAD = -1, /* the values could not be read (a problem is recorded) */
    SCAN_INVALID = 0, /* read, but not starting at 0 or decreasing (a problem is recorded) */
    SCAN_OK = 1
} scan_result;

/* Scans a pointer array over entries [0, n_entries): it must start at 0 and never decrease.
 * *last gets ptr[n_entries-1] unless the values could not be read. */
static scan_result
scan_pointers(verifier *v, varr *va, uint64_t n_entries, const char *unit_name, int64_t *last)
{
    ival it;
    if (ival_init(&it, v, va) != ZB_OK) {
        v->fatal = ZB_E_NOMEM;
        return SCAN_UNREAD;
    }
    const char *key = va->node->path;
    scan_result res = SCAN_OK;
    uint64_t decreases = 0, first_at = 0;
    int64_t prev = 0, first_a = 0, first_b = 0, x = 0;
    for (uint64_t i = 0; i < n_entries; i++) {
        if (!ival_get(&it, i, &x)) {
            res = SCAN_UNREAD;
            break;
        }
        if (i == 0 && x != 0) {
            finding(v, ZB_VERIFY_PROBLEM, ZB_E_CORRUPT, key, "starts at %" PRId64 ", not 0", x);
            res = SCAN_INVALID;
        }
        if (i > 0 && x < prev && !decreases++) {
            first_at = i - 1;
            first_a = prev;
            first_b = x;
        }
        prev = x;
    }
    if (decreases) {
        finding(v, ZB_VERIFY_PROBLEM, ZB_E_CORRUPT, key,
                "not monotone: decreases at %" PRIu64 " position%s, first at %s %" PRIu64
                ": [%" PRIu64 "] = %" PRId64 " > [%" PRIu64 "] = %" PRId64,
                decreases, decreases == 1 ? "" : "s", unit_name, first_at, first_at, first_a,
                first_at + 1, first_b);
        if (res == SCAN_OK) res = SCAN_INVALID;
    }
    *last = prev;
    ival_free(&it);
    return res;
}

/* Counts the values of `va` outside [lo, hi) and reports the first. */
static void
scan_range(verifier *v, varr *va, int64_t lo, int64_t hi, const char *what, const char *why)
{
    ival it;
    if (ival_init(&it, v, va) != ZB_OK) {
        v->fatal = ZB_E_NOMEM;
        return;
    }
    uint64_t bad = 0, first_at = 0;
    int64_t first = 0, x = 0;
    for (uint64_t i = 0; i < it.n; i++) {
        if (!ival_get(&it, i, &x)) break;
        if (x < lo || x >= hi) {
            if (!bad++) {
                first_at = i;
                first = x;
            }
        }
    }
    if (bad)
        finding(v, ZB_VERIFY_PROBLEM, ZB_E_CORRUPT, va->node->path,
                "%" PRIu64 " %s outside [%" PRId64 ", %" PRId64 ")%s, first at element %" PRIu64
                ": %" PRId64,
                bad, what, lo, hi, why, first_at, first);
    ival_free(&it);
}

/* ---- anndata (FORMATS.md §6) ---------------------------------------------------------- */

/* The [rows, cols] of a sparse group's "shape" attribute; false (and a problem) otherwise. */
static bool
sparse_shape(verifier *v, const zb__tree_node *g, uint64_t shape[2])
{
    json_object *s = zb__json_get(g->attrs, "shape");
    bool ok = json_object_is_type(s, json_type_array) && json_object_array_length(s) == 2;
    for (size_t i = 0; ok && i < 2; i++) {
        json_object *d = json_object_array_get_idx(s, i);
        ok = json_object_is_type(d, json_type_int) && json_object_get_int64(d) >= 0;
        if (ok) shape[i] = (uint64_t)json_object_get_int64(d);
    }
    if (!ok)
        finding(v, ZB_VERIFY_PROBLEM, ZB_E_METADATA, shown(g->path),
                "%s group: the \"shape\" attribute is not [n_obs, n_vars]",
                attr_str(g->attrs, "encoding-type"));
    return ok;
}

static void
check_sparse(verifier *v, const zb__tree_node *g, bool csr)
{
    const char *kind = csr ? "csr_matrix" : "csc_matrix";
    uint64_t shape[2];
    if (!sparse_shape(v, g, shape)) return;
    uint64_t major = csr ? shape[0] : shape[1], minor = csr ? shape[1] : shape[0];
    static const char *const parts[3] = {"indptr", "indices", "data"};
    varr *p[3];
    for (int k = 0; k < 3; k++) {
        p[k] = child_array(v, g->path, parts[k]);
        if (!p[k]) {
            char key[KEY_CAP];
            join(key, sizeof key, g->path, parts[k]);
            finding(v, ZB_VERIFY_PROBLEM, ZB_E_METADATA, key,
                    "missing: a %s group holds data, indices and indptr arrays", kind);
        }
    }
    if (!p[0] || !p[1] || !p[2]) return;
    for (int k = 0; k < 3; k++) {
        if (!p[k]->a) return; /* its metadata problem is listed */
        if (p[k]->a->meta.ndim != 1) {
            finding(v, ZB_VERIFY_PROBLEM, ZB_E_METADATA, p[k]->node->path,
                    "a %s %s array must be 1-d (it has %d dimensions)", kind, parts[k],
                    p[k]->a->meta.ndim);
            return;
        }
        if (k < 2 && !is_int_dtype(p[k]->a->meta.dtype)) {
            finding(v, ZB_VERIFY_PROBLEM, ZB_E_METADATA, p[k]->node->path,
                    "%s must be an integer array, not %s", parts[k],
                    zb_dtype_name(p[k]->a->meta.dtype));
            return;
        }
    }
    varr *indptr = p[0], *indices = p[1], *data = p[2];
    uint64_t n_ptr = rows_of(indptr), nnz = rows_of(data);
    if (rows_of(indices) != nnz)
        finding(v, ZB_VERIFY_PROBLEM, ZB_E_CORRUPT, indices->node->path,
                "%" PRIu64 " entries, but %s has %" PRIu64, rows_of(indices), data->node->path,
                nnz);
    bool len_ok = n_ptr == major + 1;
    if (!len_ok)
        finding(v, ZB_VERIFY_PROBLEM, ZB_E_CORRUPT, indptr->node->path,
                "%" PRIu64 " entries, but shape [%" PRIu64 ", %" PRIu64 "] needs %" PRIu64
                " (%s + 1)",
                n_ptr, shape[0], shape[1], major + 1, csr ? "n_obs" : "n_vars");
    /* values are scanned only where the lengths agree: a length that disagrees is reported
     * above, and may be anything a damaged document says (2^40 entries, 60 stored) */
    if (v->r->metadata_only) return;
    if (!indptr->bad && n_ptr > 0 && len_ok) {
        int64_t last = 0;
        if (scan_pointers(v, indptr, n_ptr, csr ? "row" : "column", &last) != SCAN_UNREAD) {
            if (last != (int64_t)nnz)
                finding(v, ZB_VERIFY_PROBLEM, ZB_E_CORRUPT, indptr->node->path,
                        "ends at %" PRId64 ", but %s has %" PRIu64 " elements", last,
                        data->node->path, nnz);
        }
    }
    if (!indices->bad && rows_of(indices) == nnz)
        scan_range(v, indices, 0, minor > INT64_MAX ? INT64_MAX : (int64_t)minor,
                   csr ? "column ids" : "row ids", csr ? " (n_vars)" : " (n_obs)");
}

/* The rows of a dataframe column: an array, a categorical's codes, a nullable's values. */
static varr *
column_array(verifier *v, const zb__tree_node *col)
{
    if (col->is_array) return find_array(v, col->path);
    const char *et = attr_str(col->attrs, "encoding-type");
    if (!et) return NULL;
    if (!strcmp(et, "categorical")) return child_array(v, col->path, "codes");
    if (!strncmp(et, "nullable-", 9)) return child_array(v, col->path, "values");
    return NULL;
}

/* The length of a dataframe (its index), or false when it has none (a problem). */
static bool
dataframe_len(verifier *v, const zb__tree_node *df, uint64_t *n, bool report)
{
    const char *idx = attr_str(df->attrs, "_index");
    varr *ia = child_array(v, df->path, idx ? idx : "_index");
    if (ia && !ia->a) return false; /* its metadata is already listed */
    if (!ia || ia->a->meta.ndim != 1) {
        if (report) {
            char key[KEY_CAP];
            join(key, sizeof key, df->path, idx ? idx : "_index");
            finding(v, ZB_VERIFY_PROBLEM, ZB_E_METADATA, key,
                    "%s: the dataframe's index array (the \"_index\" attribute names it)",
                    ia ? "not a 1-d array" : "missing");
        }
        return false;
    }
    *n = ia->a->meta.shape[0];
    return true;
}

static void
check_dataframe(verifier *v, const zb__tree_node *df)
{
    uint64_t n;
    if (!dataframe_len(v, df, &n, true)) return;
    const char *idx = attr_str(df->attrs, "_index");
    if (!idx) idx = "_index";
    json_object *order = zb__json_get(df->attrs, "column-order");
    if (json_object_is_type(order, json_type_array)) {
        for (size_t i = 0; i < json_object_array_length(order); i++) {
            json_object *c = json_object_array_get_idx(order, i);
            if (!json_object_is_type(c, json_type_string)) continue;
            if (!child_node(v, df->path, json_object_get_string(c))) {
                char key[KEY_CAP];
                join(key, sizeof key, df->path, json_object_get_string(c));
                finding(v, ZB_VERIFY_PROBLEM, ZB_E_METADATA, key,
                        "missing: the dataframe's column-order lists it");
            }
        }
    }
    for (size_t i = 0; i < v->tree->n; i++) {
        const zb__tree_node *col = &v->tree->nodes[i];
        const char *name = child_name(col, df->path);
        if (!name || !strcmp(name, idx)) continue;
        varr *va = column_array(v, col);
        if (!va || !va->a || va->a->meta.ndim == 0) continue;
        if (rows_of(va) != n) { /* reported; its values are not scanned (its shape may be
                                   anything a damaged document says, 2^40 rows) */
            finding(v, ZB_VERIFY_PROBLEM, ZB_E_CORRUPT, va->node->path,
                    "%" PRIu64 " rows, but the dataframe index has %" PRIu64, rows_of(va), n);
            continue;
        }
        const char *et = col->is_array ? NULL : attr_str(col->attrs, "encoding-type");
        if (et && !strncmp(et, "nullable-", 9)) {
            varr *mask = child_array(v, col->path, "mask");
            if (mask && mask->a && mask->a->meta.ndim && rows_of(mask) != n)
                finding(v, ZB_VERIFY_PROBLEM, ZB_E_CORRUPT, mask->node->path,
                        "%" PRIu64 " rows, but the dataframe index has %" PRIu64, rows_of(mask), n);
        }
        if (et && !strcmp(et, "categorical") && !v->r->metadata_only && !va->bad &&
            is_int_dtype(va->a->meta.dtype)) {
            varr *cats = child_array(v, col->path, "categories");
            if (cats && cats->a && cats->a->meta.ndim == 1)
                scan_range(v, va, -1, (int64_t)cats->a->meta.shape[0], "codes",
                           " (-1 = missing, else a category)");
        }
    }
}

/* The shape of an anndata element: an array's shape, a sparse group's "shape" attribute, a
 * dataframe's length; false when it has none. */
static bool
element_shape(verifier *v, const zb__tree_node *el, uint64_t *rows, uint64_t *cols, bool *has_cols)
{
    *has_cols = false;
    if (el->is_array) {
        varr *va = find_array(v, el->path);
        if (!va || !va->a || va->a->meta.ndim == 0) return false;
        *rows = va->a->meta.shape[0];
        *has_cols = va->a->meta.ndim >= 2;
        if (*has_cols) *cols = va->a->meta.shape[1];
        return true;
    }
    const char *et = attr_str(el->attrs, "encoding-type");
    if (et && (!strcmp(et, "csr_matrix") || !strcmp(et, "csc_matrix"))) {
        json_object *s = zb__json_get(el->attrs, "shape");
        if (!json_object_is_type(s, json_type_array) || json_object_array_length(s) != 2)
            return false; /* reported with the sparse group */
        int64_t r, c;
        if (zb__json_i64(json_object_array_get_idx(s, 0), "shape", &r) != ZB_OK ||
            zb__json_i64(json_object_array_get_idx(s, 1), "shape", &c) != ZB_OK || r < 0 || c < 0) {
            zb_clear_error();
            return false;
        }
        *rows = (uint64_t)r;
        *cols = (uint64_t)c;
        *has_cols = true;
        return true;
    }
    if (et && !strcmp(et, "dataframe")) return dataframe_len(v, el, rows, false);
    return false;
}

/* Checks an element against the axes of its AnnData: rows (n_obs or n_vars) and, when
 * `want_cols`, columns. */
static void
check_element(verifier *v, const zb__tree_node *el, uint64_t want_rows, const char *rows_name,
              const uint64_t *want_cols, const char *cols_name)
{
    uint64_t rows = 0, cols = 0;
    bool has_cols;
    if (!element_shape(v, el, &rows, &cols, &has_cols)) return;
    if (rows != want_rows)
        finding(v, ZB_VERIFY_PROBLEM, ZB_E_CORRUPT, el->path,
                "%" PRIu64 " rows, but %s is %" PRIu64, rows, rows_name, want_rows);
    else if (want_cols && has_cols && cols != *want_cols)
        finding(v, ZB_VERIFY_PROBLEM, ZB_E_CORRUPT, el->path,
                "%" PRIu64 " columns, but %s is %" PRIu64, cols, cols_name, *want_cols);
}

static void
check_anndata(verifier *v, const zb__tree_node *g)
{
    const zb__tree_node *obs = child_node(v, g->path, "obs"), *var = child_node(v, g->path, "var");
    if (!obs || !var) {
        finding(v, ZB_VERIFY_PROBLEM, ZB_E_METADATA, shown(g->path),
                "an anndata group needs obs and var dataframes; %s is missing",
                obs ? "var" : "obs");
        return;
    }
    uint64_t n_obs, n_vars;
    if (!dataframe_len(v, obs, &n_obs, false) || !dataframe_len(v, var, &n_vars, false)) return;
    const zb__tree_node *x = child_node(v, g->path, "X");
    if (x) check_element(v, x, n_obs, "n_obs (obs)", &n_vars, "n_vars (var)");
    /* mapping groups: each child is one element */
    static const struct {
        const char *group;
        bool rows_obs, cols, cols_obs;
    } maps[] = {{"layers", true, true, false},
                {"obsm", true, false, false},
                {"varm", false, false, false},
                {"obsp", true, true, true},
                {"varp", false, true, false}};
    for (size_t m = 0; m < sizeof maps / sizeof maps[0]; m++) {
        char base[KEY_CAP];
        join(base, sizeof base, g->path, maps[m].group);
        for (size_t i = 0; i < v->tree->n; i++) {
            const zb__tree_node *el = &v->tree->nodes[i];
            if (!child_name(el, base)) continue;
            uint64_t want_cols = maps[m].cols_obs ? n_obs : n_vars;
            check_element(v, el, maps[m].rows_obs ? n_obs : n_vars,
                          maps[m].rows_obs ? "n_obs (obs)" : "n_vars (var)",
                          maps[m].cols ? &want_cols : NULL,
                          maps[m].cols_obs ? "n_obs (obs)" : "n_vars (var)");
        }
    }
}

/* ---- nvalchemi AtomicData (FORMATS.md §8) --------------------------------------------- */

static bool
is_atomic_group(verifier *v, const zb__tree_node *g)
{
    const zb__tree_node *core = child_node(v, g->path, "core");
    return zb__json_get(g->attrs, "fields") && child_array(v, g->path, "meta/atoms_ptr") && core &&
           !core->is_array;
}

/* Compares an array's rows with what the committed samples need: fewer is a problem, more an
 * uncommitted tail (a note). */
static void
check_rows_needed(verifier *v, varr *va, uint64_t need, const char *why)
{
    if (!va->a) return;
    if (va->a->meta.ndim == 0) {
        finding(v, ZB_VERIFY_PROBLEM, ZB_E_METADATA, va->node->path,
                "a 0-d array: every AtomicData array has one row per %s", why);
        return;
    }
    uint64_t rows = rows_of(va);
    if (rows < need)
        finding(v, ZB_VERIFY_PROBLEM, ZB_E_CORRUPT, va->node->path,
                "%" PRIu64 " rows, but the committed samples need %" PRIu64 " (%s)", rows, need,
                why);
    else if (rows > need)
        finding(v, ZB_VERIFY_NOTE, ZB_OK, va->node->path,
                "%" PRIu64 " rows past the committed %" PRIu64 " (%s): an uncommitted tail left "
                "by an interrupted append (readers ignore it); zb_atomic_recover "
                "or the next append cuts it back",
                rows - need, need, why);
}

/* A pointer array of the atomic layout: present, 1-d integer, N+1 entries (more is a tail);
 * then scanned. Returns true with *total = ptr[N] when usable. */
static bool
atomic_pointer(verifier *v, const char *base, const char *name, uint64_t n, int64_t *total)
{
    char key[KEY_CAP];
    join(key, sizeof key, base, name);
    varr *va = find_array(v, key);
    if (!va) {
        finding(v, ZB_VERIFY_PROBLEM, ZB_E_METADATA, key,
                "missing: AtomicData stores hold "
                "meta/atoms_ptr and meta/edges_ptr");
        return false;
    }
    if (!va->a) return false;
    if (va->a->meta.ndim != 1 || !is_int_dtype(va->a->meta.dtype)) {
        finding(v, ZB_VERIFY_PROBLEM, ZB_E_METADATA, key,
                "a pointer array must be a 1-d integer array");
        return false;
    }
    check_rows_needed(v, va, n + 1, "num_samples + 1 entries");
    if (rows_of(va) < n + 1 || v->r->metadata_only || va->bad) return false;
    return scan_pointers(v, va, n + 1, "sample", total) == SCAN_OK;
}

/* Every neighbor_list index of a live sample p lies in [atoms_ptr[p], atoms_ptr[p+1]) (§8.3);
 * soft-deleted samples (samples_mask false, when the mask is readable) are skipped, as
 * nvalchemi's delete zero-fills their rows. */
static void
check_edge_index(verifier *v, const char *base, varr *nl, uint64_t n, uint64_t n_edges)
{
    if (!nl->a || nl->bad || !is_int_dtype(nl->a->meta.dtype) || nl->a->meta.ndim != 2 ||
        nl->a->meta.shape[1] != 2) {
        if (nl->a && !nl->bad)
            finding(v, ZB_VERIFY_PROBLEM, ZB_E_METADATA, nl->node->path,
                    "neighbor_list must be an [E, 2] integer array");
        return;
    }
    if (rows_of(nl) < n_edges) return; /* reported by the row check */
    varr *ap = child_array(v, base, "meta/atoms_ptr"), *ep = child_array(v, base, "meta/edges_ptr");
    varr *sm = child_array(v, base, "meta/samples_mask");
    bool use_mask = sm && sm->a && !sm->bad && sm->a->meta.ndim == 1 &&
                    (sm->a->meta.dtype == ZB_DT_BOOL || is_int_dtype(sm->a->meta.dtype)) &&
                    rows_of(sm) >= n;
    ival nv, av, ev, mv;
    memset(&mv, 0, sizeof mv);
    if (ival_init(&nv, v, nl) != ZB_OK || ival_init(&av, v, ap) != ZB_OK ||
        ival_init(&ev, v, ep) != ZB_OK || (use_mask && ival_init(&mv, v, sm) != ZB_OK)) {
        v->fatal = ZB_E_NOMEM;
        return;
    }
    uint64_t p = 0, bad = 0, first_e = 0, first_p = 0;
    int64_t lo = 0, hi = 0, end = 0, first_x = 0, first_lo = 0, first_hi = 0, live = 1;
    bool ok = ival_get(&ev, 1, &end) && ival_get(&av, 0, &lo) && ival_get(&av, 1, &hi) &&
              (!use_mask || ival_get(&mv, 0, &live));
    for (uint64_t e = 0; ok && e < n_edges; e++) {
        /* the sample that owns edge e: pointers are monotone here (checked before) */
        while ((int64_t)e >= end && p + 1 < n) {
            p++;
            ok = ival_get(&ev, p + 1, &end) && ival_get(&av, p, &lo) && ival_get(&av, p + 1, &hi) &&
                 (!use_mask || ival_get(&mv, p, &live));
            if (!ok) break;
        }
        for (int k = 0; ok && live && k < 2; k++) {
            int64_t x;
            if (!(ok = ival_get(&nv, 2 * e + (uint64_t)k, &x))) break;
            if (x < lo || x >= hi) {
                if (!bad++) {
                    first_e = e;
                    first_p = p;
                    first_x = x;
                    first_lo = lo;
                    first_hi = hi;
                }
            }
        }
    }
    if (bad)
        finding(v, ZB_VERIFY_PROBLEM, ZB_E_CORRUPT, nl->node->path,
                "%" PRIu64 " atom indices outside their sample, first at edge %" PRIu64
                " (sample %" PRIu64 "): %" PRId64 " not in [%" PRId64 ", %" PRId64
                ") (indices are store-global, stored = local + atoms_ptr[p]; an nvalchemi "
                "append stores local ones)",
                bad, first_e, first_p, first_x, first_lo, first_hi);
    ival_free(&nv);
    ival_free(&av);
    ival_free(&ev);
    ival_free(&mv);
}

/* Entries of the fields attribute with no array: a note, not a problem. zb_atomic_add_custom
 * names a field before it writes the array, so an interrupted one leaves such an entry, and
 * both readers ignore it. */
static void
check_fields_named(verifier *v, const char *base, json_object *fields)
{
    if (!fields) return;
    json_object_object_foreach(fields, group, names)
    {
        json_object_object_foreach(names, name, level)
        {
            (void)level;
            char rel[KEY_CAP], key[KEY_CAP];
            join(rel, sizeof rel, group, name);
            join(key, sizeof key, base, rel);
            if (!find_array(v, key))
                finding(v, ZB_VERIFY_NOTE, ZB_OK, key,
                        "the fields attribute names it, but there is no such array (an "
                        "interrupted add_custom leaves this; readers ignore the entry)");
        }
    }
}

static void
check_atomic(verifier *v, const zb__tree_node *g)
{
    const char *base = g->path;
    uint64_t n;
    json_object *ns = zb__json_get(g->attrs, "num_samples");
    if (!ns || zb__json_u64(ns, "num_samples", &n) != ZB_OK) {
        zb_clear_error();
        finding(v, ZB_VERIFY_PROBLEM, ZB_E_METADATA, shown(base),
                "the num_samples attribute is missing or not a non-negative integer");
        return;
    }
    json_object *fields = zb__json_get(g->attrs, "fields");
    zb_status st = zb__atomistic_check_fields_attr(shown(base), fields);
    if (st != ZB_OK) {
        failed(v, st, shown(base), NULL);
        fields = NULL;
    }
    varr *sm = child_array(v, base, "meta/samples_mask");
    char key[KEY_CAP];
    if (!sm) {
        join(key, sizeof key, base, "meta/samples_mask");
        finding(v, ZB_VERIFY_PROBLEM, ZB_E_CORRUPT, key,
                "missing: AtomicData stores hold meta/samples_mask (nvalchemi's reader and "
                "zbatch refuse the store)");
    } else if (sm->a && sm->a->meta.ndim == 1 && rows_of(sm) > n) {
        /* nvalchemi counts the mask, never num_samples; so does zbatch's reader (layouts.c) */
        finding(v, ZB_VERIFY_NOTE, ZB_OK, sm->node->path,
                "%" PRIu64 " samples, num_samples says %" PRIu64 ": nvalchemi and zbatch read "
                "the %" PRIu64 " (an append interrupted after extending samples_mask, or a "
                "stale num_samples); zb_atomic_recover or the next append rolls num_samples "
                "forward",
                rows_of(sm), n, rows_of(sm));
        n = rows_of(sm);
    } else {
        check_rows_needed(v, sm, n, "num_samples");
    }
    int64_t n_atoms = 0, n_edges = 0;
    bool atoms_ok = atomic_pointer(v, base, "meta/atoms_ptr", n, &n_atoms);
    bool edges_ok = atomic_pointer(v, base, "meta/edges_ptr", n, &n_edges);
    varr *am = child_array(v, base, "meta/atoms_mask"),
         *em = child_array(v, base, "meta/edges_mask");
    if (am && atoms_ok) check_rows_needed(v, am, (uint64_t)n_atoms, "atoms_ptr[N]");
    if (em && edges_ok) check_rows_needed(v, em, (uint64_t)n_edges, "edges_ptr[N]");

    static const char *const groups[] = {"core", "custom"};
    varr *nl = NULL;
    for (int gi = 0; gi < 2; gi++) {
        char gpath[KEY_CAP];
        join(gpath, sizeof gpath, base, groups[gi]);
        for (size_t i = 0; i < v->narrays; i++) {
            varr *va = &v->arrays[i];
            const char *name = child_name(va->node, gpath);
            if (!name) continue;
            const char *lv = zb__atomistic_array_level(fields, groups[gi], name);
            if (!strcmp(lv, "atom")) {
                if (atoms_ok) check_rows_needed(v, va, (uint64_t)n_atoms, "atoms_ptr[N]");
            } else if (!strcmp(lv, "edge")) {
                if (edges_ok) check_rows_needed(v, va, (uint64_t)n_edges, "edges_ptr[N]");
                if (gi == 0 && !strcmp(name, "neighbor_list")) nl = va;
            } else if (!strcmp(lv, "system")) {
                check_rows_needed(v, va, n, "num_samples");
            } else {
                finding(v, ZB_VERIFY_PROBLEM, ZB_E_METADATA, va->node->path,
                        "the fields attribute gives level '%s' (not atom, edge or system)", lv);
            }
        }
    }
    if (nl && atoms_ok && edges_ok && n > 0 && !v->r->metadata_only)
        check_edge_index(v, base, nl, n, (uint64_t)n_edges);
    varr *pos = child_array(v, base, "core/positions"),
         *num = child_array(v, base, "core/atomic_numbers");
    if ((!pos || pos->a) && (!num || num->a)) { /* an array that did not open is reported */
        st = zb__atomistic_check_required(shown(base), fields, pos ? &pos->a->meta : NULL,
                                          num ? &num->a->meta : NULL);
        if (st != ZB_OK) failed(v, st, shown(base), NULL);
    }
    check_fields_named(v, base, fields);
}

/* ---- the run -------------------------------------------------------------------------- */

/* The metadata document a tree-loading failure names ("a/zarr.json: malformed JSON ..."), so
 * the problem carries its key; `fallback` when the message names none. */
static const char *
doc_of_message(char *buf, size_t cap, const char *fallback)
{
    static const char *const docs[] = {"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata"};
    const char *m = zb_last_error(), *end = strstr(m, ": ");
    if (!end || (size_t)(end - m) >= cap) return fallback;
    size_t n = (size_t)(end - m);
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
        size_t d = strlen(docs[i]);
        if (n >= d && !memcmp(m + n - d, docs[i], d) && (n == d || m[n - d - 1] == '/')) {
            memcpy(buf, m, n);
            buf[n] = '\0';
            return buf;
        }
    }
    return fallback;
}

/* A dataset group (anndata or atomic) in which verify found nothing wrong must open as the
 * reader opens it: where the reader has a rule verify does not (an element it refuses or a
 * column it cannot read), the reader's refusal is the problem verify reports, so a store
 * verify calls clean is one the reader opens. Only while nothing else is wrong: the reader
 * would repeat the first problem already listed. */
static void
check_reader_opens(verifier *v, const zb__tree_node *g)
{
    if (v->r->n_problems != 0 || v->fatal != ZB_OK) return;
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    /* the node documents, as verify reads them (the snapshot is compared with them on its
     * own); on a store that cannot list, the snapshot, as the tree was loaded */
    o.use_consolidated = !v->listed;
    zb_dataset *ds = NULL;
    zb_status st = zb_dataset_open(v->store, g->path, &o, &ds);
    if (st != ZB_OK)
        finding(v, ZB_VERIFY_PROBLEM, st, shown(g->path), "the reader refuses this dataset: %s",
                zb_last_error());
    zb_dataset_close(ds);
}

/* A generic dataset (a `zbatch` attribute, docs/FORMATS-zbatch.md) has no rules of verify's own:
 * the reader's are its rules. It must open, and every sample must read: the reader checks each
 * sample's pointers against its fields and its index values against their segment as it
 * delivers them, so the samples are read in blocks and the first refusal is the problem
 * reported. Bounded: past GENERIC_READ_MAX samples a note says they were not read. */
#define GENERIC_READ_MAX (UINT64_C(1) << 24)
#define GENERIC_BLOCK 4096

static void
check_reader_reads(verifier *v, const zb__tree_node *g)
{
    if (v->r->n_problems != 0 || v->fatal != ZB_OK) return;
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    o.use_consolidated = !v->listed;
    zb_dataset *ds = NULL;
    uint64_t n = 0;
    zb_status st = zb_dataset_open(v->store, g->path, &o, &ds);
    if (st == ZB_OK) st = zb_dataset_len(ds, &n);
    if (st != ZB_OK) {
        finding(v, ZB_VERIFY_PROBLEM, st, shown(g->path), "the reader refuses this dataset: %s",
                zb_last_error());
    } else if (v->r->metadata_only) {
        /* nothing read: the values are not checked */
    } else if (n > GENERIC_READ_MAX) {
        finding(v, ZB_VERIFY_NOTE, ZB_OK, shown(g->path),
                "%" PRIu64 " samples: their values were not read through (verify reads a "
                "generic dataset's samples up to %" PRIu64 ")",
                n, GENERIC_READ_MAX);
    } else {
        uint64_t ids[GENERIC_BLOCK];
        for (uint64_t first = 0; first < n && st == ZB_OK; first += GENERIC_BLOCK) {
            size_t k = n - first < GENERIC_BLOCK ? (size_t)(n - first) : GENERIC_BLOCK;
            for (size_t i = 0; i < k; i++) ids[i] = first + i;
            zb_batch *b = NULL;
            st = zb_dataset_read_many(ds, ids, k, &b);
            zb_batch_free(b);
        }
        if (st == ZB_E_NOMEM)
            v->fatal = st;
        else if (st != ZB_OK)
            finding(v, ZB_VERIFY_PROBLEM, st, shown(g->path), "the reader refuses %s",
                    zb_last_error());
    }
    zb_dataset_close(ds);
}

static void
check_layouts(verifier *v)
{
    for (size_t i = 0; i < v->tree->n && v->fatal == ZB_OK; i++) {
        const zb__tree_node *g = &v->tree->nodes[i];
        if (g->is_array) continue;
        const char *et = attr_str(g->attrs, "encoding-type");
        if (et && !strcmp(et, "csr_matrix")) check_sparse(v, g, true);
        if (et && !strcmp(et, "csc_matrix")) check_sparse(v, g, false);
        if (et && !strcmp(et, "dataframe")) check_dataframe(v, g);
        if (et && !strcmp(et, "anndata")) check_anndata(v, g);
        if (is_atomic_group(v, g)) check_atomic(v, g);
    }
    /* after every rule of verify's own, in every group (a dataset's elements come after it) */
    for (size_t i = 0; i < v->tree->n && v->fatal == ZB_OK; i++) {
        const zb__tree_node *g = &v->tree->nodes[i];
        if (g->is_array) continue;
        const char *et = attr_str(g->attrs, "encoding-type");
        /* the reader takes any group with meta/atoms_ptr as atomic, core group or not; a
         * collection is opened whole (its datasets must agree on their fields) */
        if ((et && (!strcmp(et, "anndata") || !strcmp(et, "annbatch-preshuffled") ||
                    !strcmp(et, "zbatch-collection"))) ||
            is_atomic_group(v, g) || child_array(v, g->path, "meta/atoms_ptr"))
            check_reader_opens(v, g);
        else if (!et && zb__json_get(g->attrs, "zbatch"))
            check_reader_reads(v, g);
    }
}

zb_status
zb_verify(zb_store *store, const char *path, zb_verify_report *report)
{
    if (!report) return zb__err(ZB_E_INVALID, "zb_verify: null report");
    zb_verify_report_free(report);
    if (!store) return zb__err(ZB_E_INVALID, "zb_verify: null store");
    char root[KEY_CAP];
    ZB_TRY(zb_key_normalize(path ? path : "", root, sizeof root));
    verifier v = {.store = store,
                  .r = report,
                  .cap =
                      report->max_problems ? report->max_problems : ZB_VERIFY_MAX_PROBLEMS_DEFAULT};
    zb_status st = zb_ctx_new(&v.ctx);
    if (st != ZB_OK) return st;

    if (check_marker(&v, root)) {
        report->incomplete = true;
        goto done;
    }
    /* The node documents themselves, not the consolidated snapshot: both are checked, and the
     * documents are what a reader that ignores the snapshot uses. */
    st = zb__tree_load(store, root, false, &v.tree);
    bool listed = st != ZB_E_UNSUPPORTED;
    if (!listed) { /* a store that cannot list (http): the consolidated snapshot is the tree */
        zb_clear_error();
        st = zb__tree_load(store, root, true, &v.tree);
    }
    if (st != ZB_OK) {
        char key[KEY_CAP];
        failed(&v, st, doc_of_message(key, sizeof key, shown(root)), NULL);
        goto done;
    }
    v.listed = listed;
    if (listed) check_consolidated(&v, root);
    if (v.fatal == ZB_OK) open_arrays(&v);
    /* a marker below the root: one dataset of a collection being written */
    for (size_t i = 1; i < v.tree->n && v.fatal == ZB_OK; i++)
        if (!v.tree->nodes[i].is_array) check_marker(&v, v.tree->nodes[i].path);
    if (!report->metadata_only)
        for (size_t i = 0; i < v.narrays && v.fatal == ZB_OK; i++)
            if (v.arrays[i].a) check_chunks(&v, &v.arrays[i]);
    if (v.fatal == ZB_OK) check_layouts(&v);

done:
    for (size_t i = 0; i < v.narrays; i++) zb_array_close(v.arrays[i].a);
    free(v.arrays);
    zb__tree_free(v.tree);
    zb__buf_free(&v.enc);
    zb__buf_free(&v.unit);
    zb_ctx_free(v.ctx);
    if (v.fatal != ZB_OK) return zb__err(v.fatal, "verify: out of memory");
    return ZB_OK;
}

void
zb_verify_report_free(zb_verify_report *report)
{
    if (!report) return;
    for (size_t i = 0; i < report->n_kept; i++) {
        free(report->problems[i].key);
        free(report->problems[i].message);
    }
    free(report->problems);
    size_t max = report->max_problems;
    bool meta = report->metadata_only;
    memset(report, 0, sizeof *report);
    report->max_problems = max;
    report->metadata_only = meta;
}
