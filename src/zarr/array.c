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

/* zarr-python's coalescing defaults: merge ranges closer than 1 MiB, up to 16 MiB a read. */
#define MERGE_GAP ((uint64_t)1 << 20)
#define MERGE_MAX ((uint64_t)16 << 20)

enum { SCR_ENC = 0, SCR_A = 1, SCR_B = 2, SCR_OUT = 3 };

/* ------------------------------------------------------------------------------------------- */
/* Open                                                                                         */
/* ------------------------------------------------------------------------------------------- */

zb_status
zb_array_open_meta(zb_store *store, const char *path, zb_array_meta *meta, zb_array **out)
{
    zb_status st = ZB_OK;
    zb_array *a = NULL;
    *out = NULL;
    a = calloc(1, sizeof *a);
    if (!a) {
        st = zb_err(ZB_E_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    a->path = strdup(path);
    if (!a->path) {
        st = zb_err(ZB_E_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    a->store = store;
    a->meta = *meta;
    memset(meta, 0, sizeof *meta);

    const zb_array_meta *m = &a->meta;
    uint64_t total = 1, unit = 1;
    a->row_elems = 1;
    for (int d = 0; d < m->ndim; d++) {
        a->inner[d] = m->chain.ab == ZB_AB_SHARDING ? m->chain.shard->inner[d] : m->chunks[d];
        if (a->inner[d] == 0 || m->chunks[d] == 0 || m->chunks[d] % a->inner[d]) {
            st = zb_err(ZB_E_METADATA, "%s: chunk shape does not divide evenly", path);
            goto fail;
        }
        if (!zb_mul_u64(total, m->shape[d], &total) || !zb_mul_u64(unit, a->inner[d], &unit)) {
            st = zb_err(ZB_E_OVERFLOW, "%s: element count overflows", path);
            goto fail;
        }
        if (d > 0) a->row_elems *= m->shape[d];
    }
    uint64_t bytes;
    if (!zb_mul_u64(total, m->itemsize ? m->itemsize : 1, &bytes)) {
        st = zb_err(ZB_E_OVERFLOW, "%s: the array's byte size overflows 64 bits", path);
        goto fail;
    }
    /* a policy limit, not an overflow: one decoded chunk must fit a buffer of ZB_BUF_MAX */
    if (!zb_mul_u64(unit, m->itemsize ? m->itemsize : 16, &bytes) || bytes > ZB_BUF_MAX) {
        st = zb_err(ZB_E_OVERFLOW, "%s: a chunk of %llu elements is over the %llu GiB limit on "
                    "one decoded chunk", path, (unsigned long long)unit,
                    (unsigned long long)(ZB_BUF_MAX >> 30));
        goto fail;
    }
    if (m->chain.ab == ZB_AB_SHARDING && m->chain.has_transpose) {
        /* the shard would hold the permuted array; inner-chunk addressing assumes it does not */
        st = zb_err(ZB_E_UNSUPPORTED, "%s: transpose before sharding_indexed", path);
        goto fail;
    }
    if (m->chain.ab == ZB_AB_SHARDING) {
        uint64_t n = 1;
        for (int d = 0; d < m->ndim; d++) n *= m->chunks[d] / a->inner[d];
        if (n > ZB_SHARD_MAX_ENTRIES) {
            st = zb_err(ZB_E_UNSUPPORTED, "%s: %llu inner chunks per shard (limit 2^30)", path,
                        (unsigned long long)n);
            goto fail;
        }
    }
    a->total_elems = total;
    *out = a;
    return ZB_OK;
fail:
    zb_meta_free(meta);
    zb_array_close(a);
    return st;
}

void
zb_array_close(zb_array *array)
{
    if (!array) return;
    zb_meta_free(&array->meta);
    free(array->path);
    free(array);
}

static zb_status
join_key(char *buf, size_t cap, const char *path, const char *name)
{
    int n = snprintf(buf, cap, "%s%s%s", path, path[0] ? "/" : "", name);
    if (n < 0 || (size_t)n >= cap) return zb_err(ZB_E_INVALID, "%s: path too long", path);
    return ZB_OK;
}

zb_status
zb_array_open(zb_store *store, const char *path, zb_array **out)
{
    if (!out) return zb_err(ZB_E_INVALID, "zb_array_open: null out");
    *out = NULL;
    if (!store || !path) return zb_err(ZB_E_INVALID, "zb_array_open: null argument");
    char norm[4096], key[4200];
    ZB_TRY(zb_key_normalize(path, norm, sizeof norm));

    zb_array_meta meta;
    memset(&meta, 0, sizeof meta);
    uint8_t *doc = NULL, *attrs = NULL;
    uint64_t doc_len = 0, attrs_len = 0;

    ZB_TRY(join_key(key, sizeof key, norm, "zarr.json"));
    zb_status st = zb_store_read_all(store, key, &doc, &doc_len);
    if (st == ZB_OK) {
        st = zb_meta_parse_v3((const char *)doc, (size_t)doc_len, norm, &meta);
        free(doc);
        if (st != ZB_OK) return st;
        return zb_array_open_meta(store, norm, &meta, out);
    }
    if (st != ZB_E_NOTFOUND) return st;

    ZB_TRY(join_key(key, sizeof key, norm, ".zarray"));
    st = zb_store_read_all(store, key, &doc, &doc_len);
    if (st == ZB_E_NOTFOUND)
        return zb_err(ZB_E_NOTFOUND, "'%s': no array here (neither zarr.json nor .zarray)",
                      norm);
    if (st != ZB_OK) return st;
    ZB_TRY(join_key(key, sizeof key, norm, ".zattrs"));
    st = zb_store_read_all(store, key, &attrs, &attrs_len);
    if (st != ZB_OK && st != ZB_E_NOTFOUND) {
        free(doc);
        return st;
    }
    st = zb_meta_parse_v2((const char *)doc, (size_t)doc_len, (const char *)attrs,
                          (size_t)attrs_len, norm, &meta);
    free(doc);
    free(attrs);
    if (st != ZB_OK) return st;
    return zb_array_open_meta(store, norm, &meta, out);
}

zb_status
zb_array_open_json(zb_store *store, const char *path, int zarr_format, const char *json,
                   const char *attrs_json, zb_array **out)
{
    if (!out) return zb_err(ZB_E_INVALID, "zb_array_open_json: null out");
    *out = NULL;
    if (!store || !path || !json) return zb_err(ZB_E_INVALID, "zb_array_open_json: null argument");
    char norm[4096];
    ZB_TRY(zb_key_normalize(path, norm, sizeof norm));
    zb_array_meta meta;
    memset(&meta, 0, sizeof meta);
    if (zarr_format == 3) {
        ZB_TRY(zb_meta_parse_v3(json, strlen(json), norm, &meta));
    } else if (zarr_format == 2) {
        ZB_TRY(zb_meta_parse_v2(json, strlen(json), attrs_json,
                                attrs_json ? strlen(attrs_json) : 0, norm, &meta));
    } else {
        return zb_err(ZB_E_INVALID, "%s: zarr_format %d", norm, zarr_format);
    }
    return zb_array_open_meta(store, norm, &meta, out);
}

zb_status
zb_array_get_info(const zb_array *array, zb_array_info *info)
{
    if (!array || !info) return zb_err(ZB_E_INVALID, "zb_array_get_info: null argument");
    const zb_array_meta *m = &array->meta;
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
typedef struct str_span {
    uint64_t off, len;
} str_span;

typedef struct read_req {
    const zb_array *a;
    zb_ctx *ctx;
    uint64_t start, stop; /* rows along axis 0 */
    uint8_t *dst;         /* fixed-size output, (stop-start) * row_elems * itemsize bytes */
    str_span *spans;      /* string output: one span per output element */
    zb_buf blob;          /* string bytes */
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

/* Strides (in elements) of each logical axis inside a decoded unit buffer: C order of the
 * unit, or of its transposed form when the chain has a transpose. */
static void
unit_strides(const zb_array *a, uint64_t *s)
{
    int nd = a->meta.ndim;
    const zb_chain *c = a->meta.chain.ab == ZB_AB_SHARDING ? a->meta.chain.shard->inner_chain
                                                           : &a->meta.chain;
    uint64_t stride = 1;
    if (c->has_transpose) {
        /* encoded axis i holds logical axis perm[i] */
        for (int i = nd - 1; i >= 0; i--) {
            s[c->perm[i]] = stride;
            stride *= a->inner[c->perm[i]];
        }
    } else {
        for (int d = nd - 1; d >= 0; d--) {
            s[d] = stride;
            stride *= a->inner[d];
        }
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
        v->st = zb_buf_append(&r->blob, v->base + it->off, (size_t)it->len);
    }
}

static void
fill_box(read_req *r, const uint64_t *g)
{
    unit_box b;
    uint64_t us[ZB_MAX_DIMS];
    unit_box_of(r, g, &b);
    unit_strides(r->a, us);
    for_each_run(r, &b, us, NULL, fill_run);
    r->ctx->stats.chunks_filled++;
}

static void
swap_bytes(uint8_t *p, uint64_t n, size_t isz)
{
    for (uint64_t i = 0; i < n; i++, p += isz)
        for (size_t k = 0; k < isz / 2; k++) {
            uint8_t t = p[k];
            p[k] = p[isz - 1 - k];
            p[isz - 1 - k] = t;
        }
}

/* Runs the bytes->bytes codecs of `c` in reverse over enc. The final stage writes into `final`
 * (capacity final_cap) with `final_expected` bytes (SIZE_MAX: as declared by the frame); the
 * result pointer and length come back in *res / *res_len. Intermediate stages use scratch. */
static zb_status
run_bb(const zb_chain *c, zb_ctx *ctx, const uint8_t *enc, size_t enc_len, uint8_t *final,
       size_t final_cap, size_t final_expected, const char *key, const uint8_t **res,
       size_t *res_len)
{
    const uint8_t *cur = enc;
    size_t cur_len = enc_len;
    int pingpong = SCR_A;
    for (int k = c->nbb - 1; k >= 0; k--) {
        const zb_codec *codec = &c->bb[k];
        uint8_t *dst;
        size_t cap, expected, got = 0;
        if (k == 0 && final) {
            dst = final;
            cap = final_cap;
            expected = final_expected;
        } else {
            size_t want = 0;
            zb_status st = zb_codec_decoded_size(codec, cur, cur_len, &want, key);
            if (st == ZB_E_UNSUPPORTED) {
                want = SIZE_MAX; /* the frame does not say: grow and retry below */
            } else if (st != ZB_OK) {
                return st;
            }
            if (k == 0 && final_expected != SIZE_MAX) want = final_expected;
            size_t guess = want != SIZE_MAX ? want : (cur_len < 65536 ? 262144 : cur_len * 4);
            zb_status dst_st = ZB_OK;
            for (int attempt = 0;; attempt++) {
                zb_buf *sb = &ctx->scratch[pingpong];
                ZB_TRY(zb_buf_reserve(sb, guess ? guess : 1));
                dst_st = zb_codec_decode(codec, ctx, cur, cur_len, sb->data, sb->cap,
                                         want != SIZE_MAX ? want : SIZE_MAX, &got, key);
                if (dst_st == ZB_OK || want != SIZE_MAX || attempt >= 5) break;
                guess *= 4;
            }
            if (dst_st != ZB_OK) return dst_st;
            cur = ctx->scratch[pingpong].data;
            cur_len = got;
            pingpong = pingpong == SCR_A ? SCR_B : SCR_A;
            continue;
        }
        ZB_TRY(zb_codec_decode(codec, ctx, cur, cur_len, dst, cap, expected, &got, key));
        cur = dst;
        cur_len = got;
    }
    *res = cur;
    *res_len = cur_len;
    return ZB_OK;
}

static uint64_t
load_u32le(const uint8_t *p)
{
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24;
}

/* Parses a vlen-utf8 buffer (FORMATS.md §1.6) of exactly n items into spans (scratch). */
static zb_status
parse_vlen(zb_ctx *ctx, const uint8_t *p, size_t len, uint64_t n, const char *key,
           const str_span **items)
{
    if (len < 4) return zb_err(ZB_E_TRUNCATED, "%s: vlen-utf8 buffer of %zu bytes", key, len);
    uint64_t count = load_u32le(p);
    if (count != n)
        return zb_err(ZB_E_CORRUPT, "%s: vlen-utf8 holds %llu items, the chunk has %llu", key,
                      (unsigned long long)count, (unsigned long long)n);
    zb_buf *sb = &ctx->scratch[SCR_B];
    uint64_t need;
    if (!zb_mul_u64(n, sizeof(str_span), &need)) return zb_err(ZB_E_OVERFLOW, "%s", key);
    ZB_TRY(zb_buf_reserve(sb, (size_t)need ? (size_t)need : 1));
    str_span *out = (str_span *)(void *)sb->data;
    size_t pos = 4;
    for (uint64_t i = 0; i < n; i++) {
        if (len - pos < 4)
            return zb_err(ZB_E_TRUNCATED, "%s: vlen-utf8 length of item %llu at offset %zu is "
                          "cut off", key, (unsigned long long)i, pos);
        uint64_t l = load_u32le(p + pos);
        pos += 4;
        if (l > len - pos)
            return zb_err(ZB_E_TRUNCATED, "%s: vlen-utf8 item %llu at offset %zu claims %llu "
                          "bytes, %zu remain", key, (unsigned long long)i, pos,
                          (unsigned long long)l, len - pos);
        out[i] = (str_span){pos, l};
        pos += (size_t)l;
    }
    *items = out;
    return ZB_OK;
}

/* Runs a fixed-size unit's codecs into target (exactly unit_elems * isz bytes), undoes the byte
 * order and counts it. The one decode step shared by row reads and the coalesced reader. */
static zb_status
decode_fixed(const zb_chain *c, zb_ctx *ctx, const uint8_t *enc, size_t enc_len, uint8_t *target,
             uint64_t unit_elems, size_t isz, const char *key)
{
    size_t unit_bytes = (size_t)(unit_elems * isz);
    const uint8_t *res = enc;
    size_t res_len = enc_len;
    if (c->nbb > 0)
        ZB_TRY(run_bb(c, ctx, enc, enc_len, target, unit_bytes, unit_bytes, key, &res, &res_len));
    if (res_len != unit_bytes)
        return zb_err(res_len < unit_bytes ? ZB_E_TRUNCATED : ZB_E_CORRUPT,
                      "%s: chunk holds %zu bytes, expected %zu", key, res_len, unit_bytes);
    if (res != target) memcpy(target, res, unit_bytes);
    if (c->big_endian && isz > 1) swap_bytes(target, unit_elems, isz);
    ctx->stats.chunks_decoded++;
    ctx->stats.bytes_decoded += unit_bytes;
    return ZB_OK;
}

/* Decodes one unit at grid coordinates g from its encoded bytes and delivers it. */
static zb_status
deliver_unit(read_req *r, const uint64_t *g, const uint8_t *enc, size_t enc_len, const char *key)
{
    const zb_array *a = r->a;
    const zb_array_meta *m = &a->meta;
    const zb_chain *c = m->chain.ab == ZB_AB_SHARDING ? m->chain.shard->inner_chain : &m->chain;
    zb_ctx *ctx = r->ctx;
    uint64_t unit_elems = 1;
    for (int d = 0; d < m->ndim; d++) unit_elems *= a->inner[d];
    unit_box b;
    uint64_t us[ZB_MAX_DIMS];
    unit_box_of(r, g, &b);
    unit_strides(a, us);

    if (c->ab == ZB_AB_VLEN_UTF8) {
        const uint8_t *res;
        size_t res_len;
        ZB_TRY(run_bb(c, ctx, enc, enc_len, NULL, 0, SIZE_MAX, key, &res, &res_len));
        if (res == ctx->scratch[SCR_B].data) {
            /* parse_vlen needs SCR_B for its table: move the bytes aside first */
            ZB_TRY(zb_buf_reserve(&ctx->scratch[SCR_OUT], res_len ? res_len : 1));
            memcpy(ctx->scratch[SCR_OUT].data, res, res_len);
            res = ctx->scratch[SCR_OUT].data;
        }
        vlen_unit v = {res, NULL, ZB_OK};
        ZB_TRY(parse_vlen(ctx, res, res_len, unit_elems, key, &v.items));
        ctx->stats.chunks_decoded++;
        ctx->stats.bytes_decoded += res_len;
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
        ZB_TRY(zb_buf_reserve(&ctx->scratch[SCR_OUT], unit_bytes ? unit_bytes : 1));
        target = ctx->scratch[SCR_OUT].data;
    }
    ZB_TRY(decode_fixed(c, ctx, enc, enc_len, target, unit_elems, isz, key));
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

static zb_status
read_plain(read_req *r, uint64_t u0, uint64_t u1)
{
    const zb_array *a = r->a;
    const zb_array_meta *m = &a->meta;
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
            ZB_TRY(zb_meta_chunk_key(m, a->path, g, key, sizeof key));
            uint64_t size = 0;
            zb_status st = zb_store_size(a->store, key, &size);
            if (st == ZB_E_NOTFOUND) {
                zb_clear_error();
                fill_box(r, g);
                continue;
            }
            if (st != ZB_OK) return st;
            uint8_t *enc;
            ZB_TRY(zb_buf_for_read(&r->ctx->scratch[SCR_ENC], 0, (size_t)size, &enc));
            uint64_t got = 0;
            ZB_TRY(zb_store_get(a->store, key, 0, size, enc, &got));
            r->ctx->stats.range_reads++;
            r->ctx->stats.bytes_fetched += got;
            ZB_TRY(deliver_unit(r, g, enc, (size_t)got, key));
        } while (nd > 1 && next_coord(g, lo, hi, nd));
    }
    return ZB_OK;
}

typedef struct want_entry {
    uint64_t off, len;
    uint64_t g[ZB_MAX_DIMS];
} want_entry;

static int
cmp_offset(const void *x, const void *y)
{
    const want_entry *a = x, *b = y;
    return a->off < b->off ? -1 : a->off > b->off;
}

/* Reads the units of one shard (shard grid coordinates s) that the request needs. */
static zb_status
read_shard(read_req *r, const uint64_t *s, uint64_t u0, uint64_t u1)
{
    const zb_array *a = r->a;
    const zb_array_meta *m = &a->meta;
    const zb_shard_spec *spec = m->chain.shard;
    int nd = m->ndim;
    zb_ctx *ctx = r->ctx;
    uint64_t cps[ZB_MAX_DIMS], n = 1, grid[ZB_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        cps[d] = m->chunks[d] / a->inner[d];
        n *= cps[d];
        grid[d] = (m->shape[d] + a->inner[d] - 1) / a->inner[d];
    }
    char key[4600];
    ZB_TRY(zb_meta_chunk_key(m, a->path, s, key, sizeof key));

    /* The units of this shard inside the request, in C order of local coordinates. */
    uint64_t lo[ZB_MAX_DIMS] = {0}, hi[ZB_MAX_DIMS] = {0};
    for (int d = 0; d < nd; d++) {
        lo[d] = s[d] * cps[d];
        hi[d] = lo[d] + cps[d];
        if (hi[d] > grid[d]) hi[d] = grid[d];
    }
    if (lo[0] < u0) lo[0] = u0;
    if (hi[0] > u1 + 1) hi[0] = u1 + 1;
    for (int d = 0; d < nd; d++)
        if (lo[d] >= hi[d]) return ZB_OK;

    uint64_t shard_size = 0;
    zb_status st = zb_store_size(a->store, key, &shard_size);
    want_entry *want = NULL;
    uint64_t *entries = NULL;
    uint8_t *raw = NULL;
    const uint8_t *mem = NULL; /* the decoded shard, when codecs follow sharding_indexed */
    zb_buf whole = {0};
    size_t nwant = 0;
    uint64_t got = 0;
    if (st == ZB_E_NOTFOUND) {
        /* a missing shard reads as fill */
        zb_clear_error();
        uint64_t g[ZB_MAX_DIMS];
        memcpy(g, lo, sizeof(uint64_t) * (size_t)nd);
        for (g[0] = lo[0]; g[0] < hi[0]; g[0]++) {
            for (int d = 1; d < nd; d++) g[d] = lo[d];
            do fill_box(r, g);
            while (nd > 1 && next_coord(g, lo, hi, nd));
        }
        return ZB_OK;
    }
    if (st != ZB_OK) return st;

    if (m->chain.nbb > 0) {
        /* Whole-shard codecs: fetch and decode the shard, then address it in memory. */
        zb_buf enc0 = {0};
        uint8_t *enc = NULL;
        st = zb_buf_for_read(&enc0, 0, (size_t)shard_size, &enc);
        if (st == ZB_OK) st = zb_store_get(a->store, key, 0, shard_size, enc, &got);
        if (st == ZB_OK) {
            ctx->stats.range_reads++;
            ctx->stats.bytes_fetched += got;
            const uint8_t *res;
            size_t res_len;
            st = run_bb(&m->chain, ctx, enc, (size_t)got, NULL, 0, SIZE_MAX, key, &res,
                        &res_len);
            if (st == ZB_OK) st = zb_buf_append(&whole, res, res_len);
        }
        zb_buf_free(&enc0);
        if (st != ZB_OK) goto done;
        mem = whole.data;
        shard_size = whole.len;
    }

    uint64_t idx_bytes = zb_shard_index_nbytes(spec, n);
    if (shard_size < idx_bytes) {
        st = zb_err(ZB_E_TRUNCATED, "%s: shard of %llu bytes is shorter than its %llu-byte "
                    "index", key, (unsigned long long)shard_size,
                    (unsigned long long)idx_bytes);
        goto done;
    }
    raw = malloc((size_t)idx_bytes);
    entries = malloc((size_t)(2 * n * sizeof(uint64_t)));
    size_t cap_want = 1;
    for (int d = 0; d < nd; d++) cap_want *= (size_t)(hi[d] - lo[d]);
    want = malloc(cap_want * sizeof *want);
    if (!raw || !entries || !want) {
        st = zb_err(ZB_E_NOMEM, "%s: out of memory for the shard index", key);
        goto done;
    }
    uint64_t ioff = spec->index_at_start ? 0 : shard_size - idx_bytes;
    if (mem) {
        memcpy(raw, mem + ioff, (size_t)idx_bytes);
        got = idx_bytes;
    } else {
        st = zb_store_get(a->store, key, ioff, idx_bytes, raw, &got);
        if (st != ZB_OK) goto done;
        ctx->stats.range_reads++;
        ctx->stats.bytes_fetched += got;
    }
    if (got != idx_bytes) {
        st = zb_err(ZB_E_TRUNCATED, "%s: read %llu of the %llu index bytes", key,
                    (unsigned long long)got, (unsigned long long)idx_bytes);
        goto done;
    }
    st = zb_shard_index_decode(spec, n, raw, (size_t)got, shard_size, key, entries);
    if (st != ZB_OK) goto done;

    uint64_t g[ZB_MAX_DIMS];
    for (g[0] = lo[0]; g[0] < hi[0]; g[0]++) {
        for (int d = 1; d < nd; d++) g[d] = lo[d];
        do {
            uint64_t j = 0;
            for (int d = 0; d < nd; d++) j = j * cps[d] + (g[d] - s[d] * cps[d]);
            if (entries[2 * j] == ZB_SHARD_EMPTY) {
                fill_box(r, g);
                continue;
            }
            want[nwant].off = entries[2 * j];
            want[nwant].len = entries[2 * j + 1];
            memcpy(want[nwant].g, g, sizeof g);
            nwant++;
        } while (nd > 1 && next_coord(g, lo, hi, nd));
    }
    qsort(want, nwant, sizeof *want, cmp_offset);

    /* Coalesce neighbours into merged range reads, then decode each unit from its slice. */
    for (size_t i = 0; i < nwant;) {
        uint64_t mstart = want[i].off, mend = want[i].off + want[i].len;
        size_t k = i + 1;
        while (k < nwant) {
            uint64_t e = want[k].off + want[k].len;
            uint64_t ne = e > mend ? e : mend;
            if (want[k].off > mend + MERGE_GAP || ne - mstart > MERGE_MAX) break;
            mend = ne;
            k++;
        }
        const uint8_t *base;
        if (mem) {
            base = mem + mstart;
        } else {
            uint8_t *enc;
            st = zb_buf_for_read(&ctx->scratch[SCR_ENC], mstart, (size_t)(mend - mstart), &enc);
            if (st != ZB_OK) goto done;
            st = zb_store_get(a->store, key, mstart, mend - mstart, enc, &got);
            if (st != ZB_OK) goto done;
            ctx->stats.range_reads++;
            ctx->stats.bytes_fetched += got;
            if (got != mend - mstart) {
                st = zb_err(ZB_E_TRUNCATED, "%s: read %llu of %llu bytes at offset %llu", key,
                            (unsigned long long)got, (unsigned long long)(mend - mstart),
                            (unsigned long long)mstart);
                goto done;
            }
            base = enc;
        }
        for (; i < k; i++) {
            st = deliver_unit(r, want[i].g, base + (want[i].off - mstart),
                              (size_t)want[i].len, key);
            if (st != ZB_OK) {
                zb_err_context(st, "%s: inner chunk at [%llu, %llu)", key,
                               (unsigned long long)want[i].off,
                               (unsigned long long)(want[i].off + want[i].len));
                goto done;
            }
        }
    }
done:
    free(raw);
    free(entries);
    free(want);
    zb_buf_free(&whole);
    return st;
}

static zb_status
read_sharded(read_req *r, uint64_t u0, uint64_t u1)
{
    const zb_array *a = r->a;
    const zb_array_meta *m = &a->meta;
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
    ZB_TRY(zb_meta_chunk_key(&a->meta, a->path, g, key, sizeof key));
    if (a->meta.chain.ab == ZB_AB_SHARDING)
        return zb_err(ZB_E_UNSUPPORTED, "%s: a sharded 0-d array", key);
    uint64_t size = 0;
    zb_status st = zb_store_size(a->store, key, &size);
    if (st == ZB_E_NOTFOUND) {
        zb_clear_error();
        fill_box(r, g);
        return ZB_OK;
    }
    if (st != ZB_OK) return st;
    uint8_t *enc;
    ZB_TRY(zb_buf_for_read(&r->ctx->scratch[SCR_ENC], 0, (size_t)size, &enc));
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
        return zb_err(ZB_E_RANGE, "%s: rows [%llu, %llu) outside [0, %llu)", a->path,
                      (unsigned long long)start, (unsigned long long)stop,
                      (unsigned long long)rows);
    return ZB_OK;
}

zb_status
zb_array_read_rows(const zb_array *array, uint64_t start, uint64_t stop, void *dst,
                   size_t dst_size, zb_ctx *ctx)
{
    if (!array || (!dst && dst_size)) return zb_err(ZB_E_INVALID, "zb_array_read_rows: null");
    if (array->meta.dtype == ZB_DT_STRING)
        return zb_err(ZB_E_TYPE, "%s: a string array; use zb_array_read_strings", array->path);
    ZB_TRY(check_range(array, start, stop));
    uint64_t need = (stop - start) * array->row_elems * array->meta.itemsize;
    if (dst_size < need)
        return zb_err(ZB_E_INVALID, "%s: destination holds %zu bytes, rows need %llu",
                      array->path, dst_size, (unsigned long long)need);
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
    if (!array || !out) return zb_err(ZB_E_INVALID, "zb_array_read_strings: null argument");
    memset(out, 0, sizeof *out);
    if (array->meta.dtype != ZB_DT_STRING)
        return zb_err(ZB_E_TYPE, "%s: not a string array", array->path);
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
        st = zb_err(ZB_E_NOMEM, "%s: out of memory for %llu strings", array->path,
                    (unsigned long long)n);
        goto done;
    }
    st = read_rows(&r);
    if (st != ZB_OK) goto done;
    for (uint64_t i = 0; i < n; i++) offsets[i + 1] = offsets[i] + r.spans[i].len;
    data = malloc(offsets[n] ? (size_t)offsets[n] : 1);
    if (!data) {
        st = zb_err(ZB_E_NOMEM, "%s: out of memory for string bytes", array->path);
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
    zb_buf_free(&r.blob);
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

/* ------------------------------------------------------------------------------------------- */
/* Unit-level access for the coalesced reader                                                   */
/* ------------------------------------------------------------------------------------------- */

uint64_t
zb_array_unit_bytes(const zb_array *a)
{
    uint64_t n = a->meta.itemsize;
    for (int d = 0; d < a->meta.ndim; d++) n *= a->inner[d];
    return n;
}

bool
zb_array_whole_shard(const zb_array *a)
{
    return a->meta.chain.ab == ZB_AB_SHARDING && a->meta.chain.nbb > 0;
}

zb_status
zb_array_unit_object(const zb_array *a, const uint64_t *g, char *key, size_t cap, uint64_t *shard,
                     uint64_t *entry)
{
    const zb_array_meta *m = &a->meta;
    if (m->chain.ab != ZB_AB_SHARDING) {
        if (entry) *entry = 0;
        if (shard) memcpy(shard, g, sizeof(uint64_t) * (size_t)m->ndim);
        return zb_meta_chunk_key(m, a->path, g, key, cap);
    }
    uint64_t s[ZB_MAX_DIMS], j = 0;
    for (int d = 0; d < m->ndim; d++) {
        uint64_t cps = m->chunks[d] / a->inner[d];
        s[d] = g[d] / cps;
        j = j * cps + g[d] % cps;
    }
    if (shard) memcpy(shard, s, sizeof(uint64_t) * (size_t)m->ndim);
    if (entry) *entry = j;
    return key ? zb_meta_chunk_key(m, a->path, s, key, cap) : ZB_OK;
}

zb_status
zb_array_shard_index(const zb_array *a, zb_ctx *ctx, const uint64_t *shard, uint64_t **entries,
                     uint64_t *n_out, bool *missing)
{
    const zb_array_meta *m = &a->meta;
    *entries = NULL;
    *missing = false;
    uint64_t n = 1;
    for (int d = 0; d < m->ndim; d++) n *= m->chunks[d] / a->inner[d];
    *n_out = n;
    char key[4600];
    ZB_TRY(zb_meta_chunk_key(m, a->path, shard, key, sizeof key));
    uint64_t size = 0;
    zb_status st = zb_store_size(a->store, key, &size);
    if (st == ZB_E_NOTFOUND) {
        zb_clear_error();
        *missing = true;
        return ZB_OK;
    }
    if (st != ZB_OK) return st;
    const zb_shard_spec *spec = m->chain.shard;
    uint64_t idx_bytes = zb_shard_index_nbytes(spec, n);
    if (size < idx_bytes)
        return zb_err(ZB_E_TRUNCATED, "%s: shard of %llu bytes is shorter than its %llu-byte "
                      "index", key, (unsigned long long)size, (unsigned long long)idx_bytes);
    uint8_t *raw = malloc((size_t)idx_bytes);
    uint64_t *e = malloc((size_t)(2 * n * sizeof(uint64_t)));
    if (!raw || !e) {
        free(raw);
        free(e);
        return zb_err(ZB_E_NOMEM, "%s: out of memory for the shard index", key);
    }
    uint64_t got = 0;
    st = zb_store_get(a->store, key, spec->index_at_start ? 0 : size - idx_bytes, idx_bytes, raw,
                      &got);
    if (st == ZB_OK) {
        ctx->stats.range_reads++;
        ctx->stats.bytes_fetched += got;
        if (got != idx_bytes)
            st = zb_err(ZB_E_TRUNCATED, "%s: read %llu of the %llu index bytes", key,
                        (unsigned long long)got, (unsigned long long)idx_bytes);
    }
    if (st == ZB_OK) st = zb_shard_index_decode(spec, n, raw, (size_t)got, size, key, e);
    free(raw);
    if (st != ZB_OK) {
        free(e);
        return st;
    }
    *entries = e;
    return ZB_OK;
}

zb_status
zb_array_decode_unit(const zb_array *a, zb_ctx *ctx, const uint8_t *enc, size_t enc_len,
                     uint8_t *dst, const char *key)
{
    const zb_array_meta *m = &a->meta;
    const zb_chain *c = m->chain.ab == ZB_AB_SHARDING ? m->chain.shard->inner_chain : &m->chain;
    if (c->ab != ZB_AB_BYTES)
        return zb_err(ZB_E_TYPE, "%s: not a fixed-size array", key);
    size_t isz = m->itemsize;
    uint64_t elems = 1;
    for (int d = 0; d < m->ndim; d++) elems *= a->inner[d];
    size_t unit_bytes = (size_t)(elems * isz);
    uint8_t *target = dst;
    if (c->has_transpose) {
        ZB_TRY(zb_buf_reserve(&ctx->scratch[SCR_OUT], unit_bytes ? unit_bytes : 1));
        target = ctx->scratch[SCR_OUT].data;
    }
    ZB_TRY(decode_fixed(c, ctx, enc, enc_len, target, elems, isz, key));
    if (c->has_transpose) {
        /* gather into logical C order */
        uint64_t us[ZB_MAX_DIMS], idx[ZB_MAX_DIMS] = {0};
        unit_strides(a, us);
        for (uint64_t i = 0; i < elems; i++) {
            uint64_t src = 0;
            for (int d = 0; d < m->ndim; d++) src += idx[d] * us[d];
            memcpy(dst + i * isz, target + src * isz, isz);
            for (int d = m->ndim - 1; d >= 0; d--) {
                if (++idx[d] < a->inner[d]) break;
                idx[d] = 0;
            }
        }
    }
    return ZB_OK;
}

bool
zb_array_unit_raw(const zb_array *a)
{
    const zb_array_meta *m = &a->meta;
    const zb_chain *c = m->chain.ab == ZB_AB_SHARDING ? m->chain.shard->inner_chain : &m->chain;
    if (m->chain.ab == ZB_AB_SHARDING && (m->chain.nbb > 0 || m->chain.has_transpose))
        return false;
    return c->ab == ZB_AB_BYTES && c->nbb == 0 && !c->has_transpose &&
           (!c->big_endian || m->itemsize == 1);
}

void
zb_array_fill_unit(const zb_array *a, uint8_t *dst)
{
    size_t isz = a->meta.itemsize;
    uint64_t elems = 1;
    for (int d = 0; d < a->meta.ndim; d++) elems *= a->inner[d];
    bool zero = true;
    for (size_t k = 0; k < isz; k++) zero = zero && a->meta.fill[k] == 0;
    if (zero) {
        memset(dst, 0, (size_t)(elems * isz));
        return;
    }
    for (uint64_t i = 0; i < elems; i++) memcpy(dst + i * isz, a->meta.fill, isz);
}
