/* Arrays: open from metadata, and read row ranges along axis 0.
 *
 * The read unit is a chunk, or an inner chunk when the array is sharded. A read walks the units
 * its row range touches; each unit is fetched (one range read, or a share of a coalesced read of
 * a shard), run through the codec chain once, and copied into the caller's buffer. When a unit
 * maps onto one contiguous run of the destination (it spans every axis but the first, is not
 * padded and is not transposed) it is decoded straight into place. Format facts: shared
 * FORMATS.md §1.5 (edge and missing chunks, order), §3.4 (chains), §4 (sharding). */
#include "zarr/array.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "util/status.h"
#include "zarr/codec.h"
#include "zarr/shard.h"

/* ------------------------------------------------------------------------------------------- */
/* Open                                                                                         */
/* ------------------------------------------------------------------------------------------- */

zb_status
zb__array_open_meta(zb_store *store, const char *path, zb__array_meta *meta, zb_array **out)
{
    zb_status st = ZB_OK;
    zb_array *a = NULL;
    *out = NULL;
    a = calloc(1, sizeof *a);
    if (!a) {
        st = zb__err(ZB_E_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    a->path = strdup(path);
    if (!a->path) {
        st = zb__err(ZB_E_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    a->store = store;
    a->meta = *meta;
    memset(meta, 0, sizeof *meta);

    const zb__array_meta *m = &a->meta;
    uint64_t total = 1, unit = 1;
    a->row_elems = 1;
    for (int d = 0; d < m->ndim; d++) {
        a->inner[d] = m->chain.ab == ZB_AB_SHARDING ? m->chain.shard->inner[d] : m->chunks[d];
        if (a->inner[d] == 0 || m->chunks[d] == 0 || m->chunks[d] % a->inner[d]) {
            st = zb__err(ZB_E_METADATA, "%s: chunk shape does not divide evenly", path);
            goto fail;
        }
        if (!zb__mul_u64(total, m->shape[d], &total) || !zb__mul_u64(unit, a->inner[d], &unit)) {
            st = zb__err(ZB_E_OVERFLOW, "%s: element count overflows", path);
            goto fail;
        }
        if (d > 0) a->row_elems *= m->shape[d];
    }
    uint64_t bytes;
    if (!zb__mul_u64(total, m->itemsize ? m->itemsize : 1, &bytes)) {
        st = zb__err(ZB_E_OVERFLOW, "%s: the array's byte size overflows 64 bits", path);
        goto fail;
    }
    /* a policy limit, not an overflow: one decoded chunk must fit a buffer of ZB_BUF_MAX */
    if (!zb__mul_u64(unit, m->itemsize ? m->itemsize : 16, &bytes) || bytes > ZB_BUF_MAX) {
        st = zb__err(ZB_E_OVERFLOW,
                     "%s: a chunk of %llu elements is over the %llu GiB limit on "
                     "one decoded chunk",
                     path, (unsigned long long)unit, (unsigned long long)(ZB_BUF_MAX >> 30));
        goto fail;
    }
    if (m->chain.ab == ZB_AB_SHARDING && m->chain.has_transpose) {
        /* the shard would hold the permuted array; inner-chunk addressing assumes it does not */
        st = zb__err(ZB_E_UNSUPPORTED, "%s: transpose before sharding_indexed", path);
        goto fail;
    }
    if (m->chain.ab == ZB_AB_SHARDING) {
        uint64_t n = 1;
        for (int d = 0; d < m->ndim; d++) n *= m->chunks[d] / a->inner[d];
        if (n > ZB_SHARD_MAX_ENTRIES) {
            st = zb__err(ZB_E_UNSUPPORTED, "%s: %llu inner chunks per shard (limit 2^30)", path,
                         (unsigned long long)n);
            goto fail;
        }
    }
    a->total_elems = total;
    zb__unit_geom_init(a);
    *out = a;
    return ZB_OK;
fail:
    zb__meta_free(meta);
    zb_array_close(a);
    return st;
}

void
zb_array_close(zb_array *array)
{
    if (!array) return;
    zb__meta_free(&array->meta);
    free(array->path);
    free(array);
}

static zb_status
join_key(char *buf, size_t cap, const char *path, const char *name)
{
    int n = snprintf(buf, cap, "%s%s%s", path, path[0] ? "/" : "", name);
    if (n < 0 || (size_t)n >= cap) return zb__err(ZB_E_INVALID, "%s: path too long", path);
    return ZB_OK;
}

zb_status
zb_array_open(zb_store *store, const char *path, zb_array **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_array_open: null out");
    *out = NULL;
    if (!store || !path) return zb__err(ZB_E_INVALID, "zb_array_open: null argument");
    char norm[4096], key[4200];
    ZB_TRY(zb_key_normalize(path, norm, sizeof norm));

    zb__array_meta meta;
    memset(&meta, 0, sizeof meta);
    uint8_t *doc = NULL, *attrs = NULL;
    uint64_t doc_len = 0, attrs_len = 0;

    ZB_TRY(join_key(key, sizeof key, norm, "zarr.json"));
    zb_status st = zb_store_read_all(store, key, &doc, &doc_len);
    if (st == ZB_OK) {
        st = zb__meta_parse_v3((const char *)doc, (size_t)doc_len, norm, &meta);
        free(doc);
        if (st != ZB_OK) return st;
        return zb__array_open_meta(store, norm, &meta, out);
    }
    if (st != ZB_E_NOTFOUND) return st;

    ZB_TRY(join_key(key, sizeof key, norm, ".zarray"));
    st = zb_store_read_all(store, key, &doc, &doc_len);
    if (st == ZB_E_NOTFOUND)
        return zb__err(ZB_E_NOTFOUND, "'%s': no array here (neither zarr.json nor .zarray)", norm);
    if (st != ZB_OK) return st;
    ZB_TRY(join_key(key, sizeof key, norm, ".zattrs"));
    st = zb_store_read_all(store, key, &attrs, &attrs_len);
    if (st != ZB_OK && st != ZB_E_NOTFOUND) {
        free(doc);
        return st;
    }
    st = zb__meta_parse_v2((const char *)doc, (size_t)doc_len, (const char *)attrs,
                           (size_t)attrs_len, norm, &meta);
    free(doc);
    free(attrs);
    if (st != ZB_OK) return st;
    return zb__array_open_meta(store, norm, &meta, out);
}

zb_status
zb_array_open_json(zb_store *store, const char *path, int zarr_format, const char *json,
                   const char *attrs_json, zb_array **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_array_open_json: null out");
    *out = NULL;
    if (!store || !path || !json) return zb__err(ZB_E_INVALID, "zb_array_open_json: null argument");
    char norm[4096];
    ZB_TRY(zb_key_normalize(path, norm, sizeof norm));
    zb__array_meta meta;
    memset(&meta, 0, sizeof meta);
    if (zarr_format == 3) {
        ZB_TRY(zb__meta_parse_v3(json, strlen(json), norm, &meta));
    } else if (zarr_format == 2) {
        ZB_TRY(zb__meta_parse_v2(json, strlen(json), attrs_json,
                                 attrs_json ? strlen(attrs_json) : 0, norm, &meta));
    } else {
        return zb__err(ZB_E_INVALID, "%s: zarr_format %d", norm, zarr_format);
    }
    return zb__array_open_meta(store, norm, &meta, out);
}

zb_status
zb_array_get_info(const zb_array *array, zb_array_info *info)
{
    if (!array || !info) return zb__err(ZB_E_INVALID, "zb_array_get_info: null argument");
    const zb__array_meta *m = &array->meta;
    info->zarr_format = m->zarr_format;
    info->dtype = m->dtype;
    info->itemsize = m->itemsize;
    info->ndim = m->ndim;
    info->shape = m->shape;
    info->chunk_shape = array->inner;
    info->shard_shape = m->chain.ab == ZB_AB_SHARDING ? m->chunks : NULL;
    info->codecs = m->codecs_desc ? m->codecs_desc : "";
    info->attributes_json = m->attrs_json ? m->attrs_json : "{}";
    info->fill_value = m->dtype == ZB_DT_STRING ? NULL : m->fill;
    return ZB_OK;
}

uint64_t
zb_array_row_elems(const zb_array *array)
{
    return array ? array->row_elems : 0;
}

/* ------------------------------------------------------------------------------------------- */
/* One read request                                                                             */
/* ------------------------------------------------------------------------------------------- */

/* A string element gathered during a read: its bytes live in `blob` at `off`. */
typedef zb__str_span str_span;

typedef struct read_req {
    const zb_array *a;
    zb_ctx *ctx;
    uint64_t start, stop; /* rows along axis 0 */
    uint8_t *dst;         /* fixed-size output, (stop-start) * row_elems * itemsize bytes */
    str_span *spans;      /* string output: one span per output element */
    zb__buf blob;         /* string bytes */
    uint64_t ostride[ZB_MAX_DIMS]; /* output C strides, in elements */
} read_req;

/* The element box a unit contributes: unit-local origin and extent, and the output origin. */
typedef struct unit_box {
    uint64_t lo[ZB_MAX_DIMS];  /* first element inside the unit, per axis */
    uint64_t ext[ZB_MAX_DIMS]; /* extent, per axis */
    uint64_t out0;             /* output element index of the box's first element */
} unit_box;

static void
unit_box_of(const read_req *r, const uint64_t *g, unit_box *b)
{
    const zb_array *a = r->a;
    int nd = a->meta.ndim;
    b->out0 = 0;
    for (int d = 0; d < nd; d++) {
        uint64_t u0 = g[d] * a->inner[d];
        uint64_t u1 = u0 + a->inner[d];
        uint64_t lo = d == 0 ? r->start : 0, hi = d == 0 ? r->stop : a->meta.shape[d];
        if (u1 > a->meta.shape[d]) u1 = a->meta.shape[d];
        uint64_t s = u0 > lo ? u0 : lo, e = u1 < hi ? u1 : hi;
        b->lo[d] = s - u0;
        b->ext[d] = e - s;
        b->out0 += (d == 0 ? s - r->start : s) * r->ostride[d];
    }
}

/* Calls fn(req, unit_index, out_index, count, unit_stride) for each run of the box along the
 * last axis. */
typedef void (*run_fn)(read_req *r, const void *unit, uint64_t ui, uint64_t oi, uint64_t n,
                       uint64_t us);

static void
for_each_run(read_req *r, const unit_box *b, const uint64_t *us, const void *unit, run_fn fn)
{
    int nd = r->a->meta.ndim;
    if (nd == 0) {
        fn(r, unit, 0, 0, 1, 1);
        return;
    }
    for (int d = 0; d < nd; d++)
        if (b->ext[d] == 0) return;
    uint64_t idx[ZB_MAX_DIMS] = {0};
    for (;;) {
        uint64_t ui = 0, oi = b->out0;
        for (int d = 0; d < nd; d++) {
            ui += (b->lo[d] + idx[d]) * us[d];
            oi += idx[d] * r->ostride[d];
        }
        fn(r, unit, ui, oi, b->ext[nd - 1], us[nd - 1]);
        int d = nd - 2;
        for (; d >= 0; d--) {
            if (++idx[d] < b->ext[d]) break;
            idx[d] = 0;
        }
        if (d < 0) return;
    }
}

static void
copy_run(read_req *r, const void *unit, uint64_t ui, uint64_t oi, uint64_t n, uint64_t us)
{
    size_t isz = r->a->meta.itemsize;
    const uint8_t *src = (const uint8_t *)unit + ui * isz;
    uint8_t *dst = r->dst + oi * isz;
    if (us == 1) {
        memcpy(dst, src, (size_t)(n * isz));
        return;
    }
    for (uint64_t i = 0; i < n; i++) memcpy(dst + i * isz, src + i * us * isz, isz);
}

static void
fill_run(read_req *r, const void *unit, uint64_t ui, uint64_t oi, uint64_t n, uint64_t us)
{
    (void)unit, (void)ui, (void)us;
    if (r->spans) {
        for (uint64_t i = 0; i < n; i++) r->spans[oi + i] = (str_span){0, 0};
        return;
    }
    size_t isz = r->a->meta.itemsize;
    const uint8_t *fill = r->a->meta.fill;
    uint8_t *dst = r->dst + oi * isz;
    bool zero = true;
    for (size_t k = 0; k < isz; k++) zero = zero && fill[k] == 0;
    if (zero) {
        memset(dst, 0, (size_t)(n * isz));
        return;
    }
    for (uint64_t i = 0; i < n; i++) memcpy(dst + i * isz, fill, isz);
}

/* A decoded vlen-utf8 unit: the item table is parsed into spans relative to the unit buffer,
 * which the string runs then copy into the request's blob. */
typedef struct vlen_unit {
    const uint8_t *base;
    const str_span *items;
    zb_status st;
} vlen_unit;

static void
string_run(read_req *r, const void *unit, uint64_t ui, uint64_t oi, uint64_t n, uint64_t us)
{
    vlen_unit *v = (vlen_unit *)unit;
    for (uint64_t i = 0; i < n && v->st == ZB_OK; i++) {
        const str_span *it = &v->items[ui + i * us];
        r->spans[oi + i] = (str_span){r->blob.len, it->len};
        v->st = zb__buf_append(&r->blob, v->base + it->off, (size_t)it->len);
    }
}

static void
fill_box(read_req *r, const uint64_t *g)
{
    unit_box b;
    uint64_t us[ZB_MAX_DIMS];
    unit_box_of(r, g, &b);
    zb__unit_strides(r->a, us);
    for_each_run(r, &b, us, NULL, fill_run);
    r->ctx->stats.chunks_filled++;
}

/* Decodes one unit at grid coordinates g from its encoded bytes and delivers it. */
static zb_status
deliver_unit(read_req *r, const uint64_t *g, const uint8_t *enc, size_t enc_len, const char *key)
{
    const zb_array *a = r->a;
    const zb__array_meta *m = &a->meta;
    const zb__chain *c = m->chain.ab == ZB_AB_SHARDING ? m->chain.shard->inner_chain : &m->chain;
    zb_ctx *ctx = r->ctx;
    uint64_t unit_elems = 1;
    for (int d = 0; d < m->ndim; d++) unit_elems *= a->inner[d];
    unit_box b;
    uint64_t us[ZB_MAX_DIMS];
    unit_box_of(r, g, &b);
    zb__unit_strides(a, us);

    if (c->ab == ZB_AB_VLEN_UTF8) {
        vlen_unit v = {NULL, NULL, ZB_OK};
        ZB_TRY(zb__unit_decode_strings(a, ctx, enc, enc_len, unit_elems, key, &v.base, &v.items));
        for_each_run(r, &b, us, &v, string_run);
        return v.st;
    }

    size_t isz = m->itemsize;
    size_t unit_bytes = (size_t)(unit_elems * isz);
    /* Straight into the destination when the unit is one contiguous, unpadded run of it. */
    bool direct = !c->has_transpose;
    for (int d = 0; d < m->ndim && direct; d++) {
        if (d == 0)
            direct = b.lo[0] == 0 && b.ext[0] == a->inner[0];
        else
            direct = b.lo[d] == 0 && b.ext[d] == a->inner[d] && a->inner[d] == m->shape[d];
    }
    uint8_t *target;
    if (direct) {
        target = r->dst + b.out0 * isz;
    } else {
        ZB_TRY(zb__buf_reserve(&ctx->ws.decoded, unit_bytes ? unit_bytes : 1));
        target = ctx->ws.decoded.data;
    }
    ZB_TRY(zb__unit_decode_stored(a, ctx, enc, enc_len, target, key));
    if (!direct) for_each_run(r, &b, us, target, copy_run);
    return ZB_OK;
}

/* Odometer over the grid coordinates of axes 1..nd-1 (axis 0 is walked by the caller). */
static bool
next_coord(uint64_t *g, const uint64_t *lo, const uint64_t *hi, int nd)
{
    for (int d = nd - 1; d >= 1; d--) {
        if (++g[d] < hi[d]) return true;
        g[d] = lo[d];
    }
    return false;
}

/* Counts a fetch's reads in the context's statistics. */
static void
count_reads(zb_ctx *ctx, const zb_read_stats *rs)
{
    ctx->stats.range_reads += rs->range_reads;
    ctx->stats.bytes_fetched += rs->bytes_fetched;
}

static zb_status
read_plain(read_req *r, uint64_t u0, uint64_t u1)
{
    const zb_array *a = r->a;
    const zb__array_meta *m = &a->meta;
    int nd = m->ndim;
    uint64_t lo[ZB_MAX_DIMS] = {0}, hi[ZB_MAX_DIMS] = {0}, g[ZB_MAX_DIMS];
    for (int d = 1; d < nd; d++) hi[d] = (m->shape[d] + a->inner[d] - 1) / a->inner[d];
    char key[4600];
    for (uint64_t u = u0; u <= u1; u++) {
        memset(g, 0, sizeof g);
        g[0] = u;
        do {
            for (int d = 1; d < nd; d++)
                if (hi[d] == 0) return ZB_OK; /* an empty axis: nothing to read */
            ZB_TRY(zb__meta_chunk_key(m, a->path, g, key, sizeof key));
            const uint8_t *enc = NULL;
            zb_read_stats rs = {0};
            size_t len = 0;
            bool missing = false;
            zb_status st;
            if (zb__unit_lists_ranges(a)) { /* remote: one GET, no size query (a round trip) */
                void *tok = NULL;
                st = zb__unit_fetch_whole(a, key, &r->ctx->ws.enc, &enc, &len, &missing, &tok, &rs);
                zb_store_release(a->store, tok);
            } else {
                uint64_t size = 0;
                st = zb_store_size(a->store, key, &size);
                if (st == ZB_E_NOTFOUND) {
                    zb_clear_error();
                    st = ZB_OK;
                    missing = true;
                }
                if (st == ZB_OK && !missing)
                    st = zb__unit_read(a, key, 0, size, &r->ctx->ws.enc, &enc, &rs);
                len = (size_t)size;
            }
            count_reads(r->ctx, &rs);
            ZB_TRY(st);
            if (missing) {
                fill_box(r, g);
                continue;
            }
            ZB_TRY(deliver_unit(r, g, enc, len, key));
        } while (nd > 1 && next_coord(g, lo, hi, nd));
    }
    return ZB_OK;
}

/* A unit of one shard that a read needs: its encoded bytes in the shard, its coordinates. */
typedef struct want_entry {
    zb__span at; /* first: zb__merge_next reads the entries as spans */
    uint64_t g[ZB_MAX_DIMS];
} want_entry;

static int
cmp_offset(const void *x, const void *y)
{
    const want_entry *a = x, *b = y;
    return a->at.off < b->at.off ? -1 : a->at.off > b->at.off;
}

/* Decodes the wanted unit w from its encoded bytes and delivers it (errors name the slice). */
static zb_status
deliver_slice(read_req *r, const want_entry *w, const uint8_t *enc, const char *key)
{
    zb_status st = deliver_unit(r, w->g, enc, (size_t)w->at.len, key);
    if (st != ZB_OK)
        zb__err_context(st, "%s: inner chunk at [%llu, %llu)", key, (unsigned long long)w->at.off,
                        (unsigned long long)(w->at.off + w->at.len));
    return st;
}

/* The merged reads of a shard handed to a store that reads lists itself: one
 * zb_store_get_ranges call, each read's units decoded as its bytes arrive. */
typedef struct listed {
    read_req *r;
    const char *key;
    const want_entry *want;
    zb_range *ranges;
    size_t *first; /* [nranges + 1]: the wanted units of range i are [first[i], first[i+1]) */
    zb_status st;  /* the first failure of a decode here, its message in msg */
    char msg[1024];
} listed;

static int
listed_done(void *arg, size_t i)
{
    listed *l = arg;
    const zb_range *rg = &l->ranges[i];
    zb_status st = rg->status;
    if (st == ZB_OK && rg->nread != rg->length)
        st = zb__err(ZB_E_TRUNCATED, "%s: read %llu of %llu bytes at offset %llu", l->key,
                     (unsigned long long)rg->nread, (unsigned long long)rg->length,
                     (unsigned long long)rg->offset);
    else if (st != ZB_OK)
        return 1; /* the store layer reports it */
    l->r->ctx->stats.range_reads++;
    l->r->ctx->stats.bytes_fetched += rg->nread;
    for (size_t k = l->first[i]; k < l->first[i + 1] && st == ZB_OK; k++) {
        const want_entry *w = &l->want[k];
        st = deliver_slice(l->r, w, (const uint8_t *)rg->dst + (w->at.off - rg->offset), l->key);
    }
    if (st == ZB_OK) return 0;
    l->st = st;
    snprintf(l->msg, sizeof l->msg, "%s", zb_last_error());
    return 1;
}

static zb_status
deliver_listed(read_req *r, const char *key, const want_entry *want, size_t nwant)
{
    size_t nr = 0;
    uint64_t total = 0, ms, me;
    for (size_t i = 0; i < nwant; nr++) {
        i = zb__merge_next(want, sizeof *want, i, nwant, ZB_MERGE_UNITS, &ms, &me);
        total += me - ms;
    }
    listed l = {.r = r, .key = key, .want = want};
    l.ranges = calloc(nr + 1, sizeof *l.ranges);
    l.first = calloc(nr + 1, sizeof *l.first);
    zb_status st = zb__buf_reserve(&r->ctx->ws.enc, total ? (size_t)total : 1);
    if (st == ZB_OK && (!l.ranges || !l.first))
        st = zb__err(ZB_E_NOMEM, "%s: out of memory for %zu range reads", key, nr);
    uint64_t at = 0;
    for (size_t i = 0, j = 0; st == ZB_OK && i < nwant; j++) {
        l.first[j] = i;
        i = zb__merge_next(want, sizeof *want, i, nwant, ZB_MERGE_UNITS, &ms, &me);
        l.ranges[j] = (zb_range){
            .key = key, .offset = ms, .length = me - ms, .dst = r->ctx->ws.enc.data + at};
        at += me - ms;
    }
    l.first[nr] = nwant;
    if (st == ZB_OK) st = zb_store_get_ranges(r->a->store, l.ranges, nr, listed_done, &l);
    if (l.st != ZB_OK) st = zb__err(l.st, "%s", l.msg);
    free(l.ranges);
    free(l.first);
    return st;
}

/* Delivers the wanted units (sorted by offset) of the shard `key`: from `mem` (the shard,
 * decoded whole), through one list read for a store that reads lists itself, else with one
 * read per merged read (never a view: a row read sees what was just written through the same
 * store, as the writers' checks need). */
static zb_status
deliver_wanted(read_req *r, const char *key, const want_entry *want, size_t nwant,
               const uint8_t *mem)
{
    if (!mem && zb__unit_lists_ranges(r->a)) return deliver_listed(r, key, want, nwant);
    zb_status st = ZB_OK;
    for (size_t i = 0, k; i < nwant && st == ZB_OK; i = k) {
        uint64_t ms, me;
        k = zb__merge_next(want, sizeof *want, i, nwant, ZB_MERGE_UNITS, &ms, &me);
        const uint8_t *base = mem ? mem + ms : NULL;
        if (!mem) {
            zb_read_stats rs = {0};
            st = zb__unit_read(r->a, key, ms, me - ms, &r->ctx->ws.enc, &base, &rs);
            count_reads(r->ctx, &rs);
        }
        for (size_t j = i; j < k && st == ZB_OK; j++)
            st = deliver_slice(r, &want[j], base + (want[j].at.off - ms), key);
    }
    return st;
}

/* Fills the units [lo, hi) of a shard that does not exist. */
static void
fill_missing_shard(read_req *r, const uint64_t *lo, const uint64_t *hi)
{
    int nd = r->a->meta.ndim;
    uint64_t g[ZB_MAX_DIMS];
    memcpy(g, lo, sizeof(uint64_t) * (size_t)nd);
    for (g[0] = lo[0]; g[0] < hi[0]; g[0]++) {
        for (int d = 1; d < nd; d++) g[d] = lo[d];
        do fill_box(r, g);
        while (nd > 1 && next_coord(g, lo, hi, nd));
    }
}

/* A shard with codecs after sharding_indexed, fetched and decoded whole into *whole. */
static zb_status
decode_whole_shard(read_req *r, const char *key, uint64_t size, zb__buf *whole)
{
    zb__buf enc0 = {0};
    uint8_t *enc = NULL;
    uint64_t got = 0;
    zb_status st = zb__buf_for_read(&enc0, 0, (size_t)size, &enc);
    if (st == ZB_OK) st = zb_store_get(r->a->store, key, 0, size, enc, &got);
    if (st == ZB_OK) {
        r->ctx->stats.range_reads++;
        r->ctx->stats.bytes_fetched += got;
        const uint8_t *res;
        size_t res_len;
        st = zb__unit_decode_shard(r->a, r->ctx, enc, (size_t)got, key, &res, &res_len);
        if (st == ZB_OK) st = zb__buf_append(whole, res, res_len);
    }
    zb__buf_free(&enc0);
    return st;
}

/* The index of a shard of shard_size bytes (in memory at `mem` when decoded whole) into
 * entries (2n words). */
static zb_status
load_index(read_req *r, const char *key, uint64_t shard_size, const uint8_t *mem, uint64_t n,
           uint64_t *entries)
{
    const zb__shard_spec *spec = r->a->meta.chain.shard;
    uint64_t idx_bytes = zb__shard_index_nbytes(spec, n), got = 0;
    if (shard_size < idx_bytes)
        return zb__err(ZB_E_TRUNCATED,
                       "%s: shard of %llu bytes is shorter than its %llu-byte "
                       "index",
                       key, (unsigned long long)shard_size, (unsigned long long)idx_bytes);
    uint8_t *raw = malloc((size_t)idx_bytes + 1);
    if (!raw) return zb__err(ZB_E_NOMEM, "%s: out of memory for the shard index", key);
    uint64_t ioff = spec->index_at_start ? 0 : shard_size - idx_bytes;
    zb_status st = ZB_OK;
    if (mem) {
        memcpy(raw, mem + ioff, (size_t)idx_bytes);
        got = idx_bytes;
    } else {
        st = zb_store_get(r->a->store, key, ioff, idx_bytes, raw, &got);
        if (st == ZB_OK) {
            r->ctx->stats.range_reads++;
            r->ctx->stats.bytes_fetched += got;
        }
    }
    if (st == ZB_OK && got != idx_bytes)
        st = zb__err(ZB_E_TRUNCATED, "%s: read %llu of the %llu index bytes", key,
                     (unsigned long long)got, (unsigned long long)idx_bytes);
    if (st == ZB_OK)
        st = zb__shard_index_decode(spec, n, raw, (size_t)got, shard_size, key, entries);
    free(raw);
    return st;
}

/* Reads the units of one shard (shard grid coordinates s) that the request needs. */
static zb_status
read_shard(read_req *r, const uint64_t *s, uint64_t u0, uint64_t u1)
{
    const zb__unit_geom *u = &r->a->units;
    int nd = u->ndim;
    uint64_t n = u->shard_units;
    char key[4600];
    ZB_TRY(zb__meta_chunk_key(&r->a->meta, r->a->path, s, key, sizeof key));

    /* The units of this shard inside the request, in C order of local coordinates. */
    uint64_t lo[ZB_MAX_DIMS] = {0}, hi[ZB_MAX_DIMS] = {0};
    for (int d = 0; d < nd; d++) {
        lo[d] = s[d] * u->per_shard[d];
        hi[d] = lo[d] + u->per_shard[d];
        if (hi[d] > u->grid[d]) hi[d] = u->grid[d];
    }
    if (lo[0] < u0) lo[0] = u0;
    if (hi[0] > u1 + 1) hi[0] = u1 + 1;
    for (int d = 0; d < nd; d++)
        if (lo[d] >= hi[d]) return ZB_OK;

    uint64_t shard_size = 0;
    zb_status st = zb_store_size(r->a->store, key, &shard_size);
    if (st == ZB_E_NOTFOUND) { /* a missing shard reads as fill */
        zb_clear_error();
        fill_missing_shard(r, lo, hi);
        return ZB_OK;
    }
    if (st != ZB_OK) return st;
    zb__buf whole = {0}; /* the decoded shard, when codecs follow sharding_indexed */
    if (r->a->meta.chain.nbb > 0) {
        ZB_TRY(decode_whole_shard(r, key, shard_size, &whole));
        shard_size = whole.len;
    }
    const uint8_t *mem = whole.data;
    size_t cap_want = 1;
    for (int d = 0; d < nd; d++) cap_want *= (size_t)(hi[d] - lo[d]);
    uint64_t *entries = malloc((size_t)(2 * n * sizeof(uint64_t)));
    want_entry *want = malloc(cap_want * sizeof *want);
    size_t nwant = 0;
    st =
        entries && want ? ZB_OK : zb__err(ZB_E_NOMEM, "%s: out of memory for the shard index", key);
    if (st == ZB_OK) st = load_index(r, key, shard_size, mem, n, entries);
    uint64_t g[ZB_MAX_DIMS];
    for (g[0] = lo[0]; st == ZB_OK && g[0] < hi[0]; g[0]++) {
        for (int d = 1; d < nd; d++) g[d] = lo[d];
        do {
            uint64_t j = 0;
            for (int d = 0; d < nd; d++) j = j * u->per_shard[d] + (g[d] - s[d] * u->per_shard[d]);
            if (entries[2 * j] == ZB_SHARD_EMPTY) {
                fill_box(r, g);
                continue;
            }
            want[nwant].at = (zb__span){entries[2 * j], entries[2 * j + 1]};
            memcpy(want[nwant].g, g, sizeof g);
            nwant++;
        } while (nd > 1 && next_coord(g, lo, hi, nd));
    }
    if (st == ZB_OK) {
        qsort(want, nwant, sizeof *want, cmp_offset);
        st = deliver_wanted(r, key, want, nwant, mem);
    }
    free(entries);
    free(want);
    zb__buf_free(&whole);
    return st;
}

static zb_status
read_sharded(read_req *r, uint64_t u0, uint64_t u1)
{
    const zb_array *a = r->a;
    const zb__array_meta *m = &a->meta;
    int nd = m->ndim;
    uint64_t cps0 = m->chunks[0] / a->inner[0];
    uint64_t lo[ZB_MAX_DIMS] = {0}, hi[ZB_MAX_DIMS] = {0}, s[ZB_MAX_DIMS];
    for (int d = 1; d < nd; d++) {
        hi[d] = (m->shape[d] + m->chunks[d] - 1) / m->chunks[d];
        if (hi[d] == 0) return ZB_OK;
    }
    for (uint64_t s0 = u0 / cps0; s0 <= u1 / cps0; s0++) {
        memset(s, 0, sizeof s);
        s[0] = s0;
        do ZB_TRY(read_shard(r, s, u0, u1));
        while (nd > 1 && next_coord(s, lo, hi, nd));
    }
    return ZB_OK;
}

static zb_status
read_zero_dim(read_req *r)
{
    const zb_array *a = r->a;
    uint64_t g[1] = {0};
    char key[4600];
    ZB_TRY(zb__meta_chunk_key(&a->meta, a->path, g, key, sizeof key));
    if (a->meta.chain.ab == ZB_AB_SHARDING)
        return zb__err(ZB_E_UNSUPPORTED, "%s: a sharded 0-d array", key);
    uint64_t size = 0;
    zb_status st = zb_store_size(a->store, key, &size);
    if (st == ZB_E_NOTFOUND) {
        zb_clear_error();
        fill_box(r, g);
        return ZB_OK;
    }
    if (st != ZB_OK) return st;
    uint8_t *enc;
    ZB_TRY(zb__buf_for_read(&r->ctx->ws.enc, 0, (size_t)size, &enc));
    uint64_t got = 0;
    ZB_TRY(zb_store_get(a->store, key, 0, size, enc, &got));
    r->ctx->stats.range_reads++;
    r->ctx->stats.bytes_fetched += got;
    return deliver_unit(r, g, enc, (size_t)got, key);
}

static zb_status
read_rows(read_req *r)
{
    const zb_array *a = r->a;
    int nd = a->meta.ndim;
    uint64_t stride = 1;
    for (int d = nd - 1; d >= 0; d--) {
        r->ostride[d] = stride;
        stride *= d == 0 ? r->stop - r->start : a->meta.shape[d];
    }
    if (nd == 0) return read_zero_dim(r);
    if (r->stop == r->start || a->row_elems == 0) return ZB_OK;
    uint64_t u0 = r->start / a->inner[0], u1 = (r->stop - 1) / a->inner[0];
    if (a->meta.chain.ab == ZB_AB_SHARDING) return read_sharded(r, u0, u1);
    return read_plain(r, u0, u1);
}

static zb_status
check_range(const zb_array *a, uint64_t start, uint64_t stop)
{
    uint64_t rows = a->meta.ndim == 0 ? 1 : a->meta.shape[0];
    if (start > stop || stop > rows)
        return zb__err(ZB_E_RANGE, "%s: rows [%llu, %llu) outside [0, %llu)", a->path,
                       (unsigned long long)start, (unsigned long long)stop,
                       (unsigned long long)rows);
    return ZB_OK;
}

zb_status
zb_array_read_rows(const zb_array *array, uint64_t start, uint64_t stop, void *dst, size_t dst_size,
                   zb_ctx *ctx)
{
    if (!array || (!dst && dst_size)) return zb__err(ZB_E_INVALID, "zb_array_read_rows: null");
    if (array->meta.dtype == ZB_DT_STRING)
        return zb__err(ZB_E_TYPE, "%s: a string array; use zb_array_read_strings", array->path);
    ZB_TRY(check_range(array, start, stop));
    uint64_t need = (stop - start) * array->row_elems * array->meta.itemsize;
    if (dst_size < need)
        return zb__err(ZB_E_INVALID, "%s: destination holds %zu bytes, rows need %llu", array->path,
                       dst_size, (unsigned long long)need);
    zb_ctx *own = NULL;
    if (!ctx) {
        ZB_TRY(zb_ctx_new(&own));
        ctx = own;
    }
    read_req r = {.a = array, .ctx = ctx, .start = start, .stop = stop, .dst = dst};
    zb_status st = read_rows(&r);
    zb_ctx_free(own);
    return st;
}

zb_status
zb_array_read_strings(const zb_array *array, uint64_t start, uint64_t stop, zb_strings *out,
                      zb_ctx *ctx)
{
    if (!array || !out) return zb__err(ZB_E_INVALID, "zb_array_read_strings: null argument");
    memset(out, 0, sizeof *out);
    if (array->meta.dtype != ZB_DT_STRING)
        return zb__err(ZB_E_TYPE, "%s: not a string array", array->path);
    ZB_TRY(check_range(array, start, stop));
    uint64_t n = array->meta.ndim == 0 ? 1 : (stop - start) * array->row_elems;
    zb_ctx *own = NULL;
    if (!ctx) {
        ZB_TRY(zb_ctx_new(&own));
        ctx = own;
    }
    zb_status st = ZB_OK;
    read_req r = {.a = array, .ctx = ctx, .start = start, .stop = stop};
    r.spans = calloc(n ? (size_t)n : 1, sizeof *r.spans);
    uint64_t *offsets = calloc((size_t)n + 1, sizeof *offsets);
    char *data = NULL;
    if (!r.spans || !offsets) {
        st = zb__err(ZB_E_NOMEM, "%s: out of memory for %llu strings", array->path,
                     (unsigned long long)n);
        goto done;
    }
    st = read_rows(&r);
    if (st != ZB_OK) goto done;
    for (uint64_t i = 0; i < n; i++) offsets[i + 1] = offsets[i] + r.spans[i].len;
    data = malloc(offsets[n] ? (size_t)offsets[n] : 1);
    if (!data) {
        st = zb__err(ZB_E_NOMEM, "%s: out of memory for string bytes", array->path);
        goto done;
    }
    for (uint64_t i = 0; i < n; i++)
        if (r.spans[i].len)
            memcpy(data + offsets[i], r.blob.data + r.spans[i].off, (size_t)r.spans[i].len);
    out->n = n;
    out->offsets = offsets;
    out->data = data;
    offsets = NULL;
    data = NULL;
done:
    free(r.spans);
    zb__buf_free(&r.blob);
    free(offsets);
    free(data);
    zb_ctx_free(own);
    return st;
}

void
zb_strings_free(zb_strings *strings)
{
    if (!strings) return;
    free(strings->offsets);
    free(strings->data);
    memset(strings, 0, sizeof *strings);
}
