/* The read unit (unit.h): geometry, locating a unit through the shard index, the one merging
 * rule, fetching (views, reads), and the codec chain run over one unit into named workspaces.
 * Format facts: shared FORMATS.md §1.5 (edge and missing chunks), §3.4 (chains), §4 (sharding). */
#include "zarr/unit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "util/status.h"
#include "zarr/array.h"
#include "zarr/codec.h"
#include "zarr/codecs/codecs.h"
#include "zarr/shard.h"

/* ---- decode ---------------------------------------------------------------------------- */

/* Strides (in elements) of each logical axis inside a decoded unit buffer: C order of the
 * unit, or of its transposed form when the chain has a transpose. */
void
zb__unit_strides(const zb_array *a, uint64_t *s)
{
    int nd = a->meta.ndim;
    const zb__chain *c =
        a->meta.chain.ab == ZB_AB_SHARDING ? a->meta.chain.shard->inner_chain : &a->meta.chain;
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
 * result pointer and length come back in *res / *res_len. Intermediate stages use the
 * ctx->ws.stage workspaces. */
static zb_status
run_bb(const zb__chain *c, zb_ctx *ctx, const uint8_t *enc, size_t enc_len, uint8_t *final,
       size_t final_cap, size_t final_expected, const char *key, const uint8_t **res,
       size_t *res_len)
{
    const uint8_t *cur = enc;
    size_t cur_len = enc_len;
    int pingpong = 0;
    for (int k = c->nbb - 1; k >= 0; k--) {
        const zb__codec *codec = &c->bb[k];
        uint8_t *dst;
        size_t cap, expected, got = 0;
        if (k == 0 && final) {
            dst = final;
            cap = final_cap;
            expected = final_expected;
        } else {
            size_t want = 0;
            zb_status st = zb__codec_decoded_size(codec, cur, cur_len, &want, key);
            if (st == ZB_E_UNSUPPORTED) {
                want = SIZE_MAX; /* the frame does not say: grow and retry below */
            } else if (st != ZB_OK) {
                return st;
            }
            if (k == 0 && final_expected != SIZE_MAX) want = final_expected;
            /* a frame that does not say its size: grow 4x per try, up to what it can hold */
            size_t most = zb__codec_max_decoded(cur_len);
            size_t guess = want != SIZE_MAX ? want : (cur_len < 65536 ? 262144 : cur_len * 4);
            if (guess > most) guess = most;
            zb_status dst_st = ZB_OK;
            for (int attempt = 0;; attempt++) {
                zb__buf *sb = &ctx->ws.stage[pingpong];
                ZB_TRY(zb__buf_reserve(sb, guess ? guess : 1));
                dst_st = zb__codec_decode(codec, ctx, cur, cur_len, sb->data, sb->cap,
                                          want != SIZE_MAX ? want : SIZE_MAX, &got, key);
                if (dst_st == ZB_OK || want != SIZE_MAX || attempt >= 5 || guess == most) break;
                guess = guess > most / 4 ? most : guess * 4;
            }
            if (dst_st != ZB_OK) return dst_st;
            cur = ctx->ws.stage[pingpong].data;
            cur_len = got;
            pingpong ^= 1;
            continue;
        }
        ZB_TRY(zb__codec_decode(codec, ctx, cur, cur_len, dst, cap, expected, &got, key));
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

/* Parses a vlen-utf8 buffer (FORMATS.md §1.6) of exactly n items into spans (ctx->ws.items). */
static zb_status
parse_vlen(zb_ctx *ctx, const uint8_t *p, size_t len, uint64_t n, const char *key,
           const zb__str_span **items)
{
    if (len < 4) return zb__err(ZB_E_TRUNCATED, "%s: vlen-utf8 buffer of %zu bytes", key, len);
    uint64_t count = load_u32le(p);
    if (count != n)
        return zb__err(ZB_E_CORRUPT, "%s: vlen-utf8 holds %llu items, the chunk has %llu", key,
                       (unsigned long long)count, (unsigned long long)n);
    zb__buf *sb = &ctx->ws.items;
    uint64_t need;
    if (!zb__mul_u64(n, sizeof(zb__str_span), &need)) return zb__err(ZB_E_OVERFLOW, "%s", key);
    ZB_TRY(zb__buf_reserve(sb, (size_t)need ? (size_t)need : 1));
    zb__str_span *out = (zb__str_span *)(void *)sb->data;
    size_t pos = 4;
    for (uint64_t i = 0; i < n; i++) {
        if (len - pos < 4)
            return zb__err(ZB_E_TRUNCATED,
                           "%s: vlen-utf8 length of item %llu at offset %zu is "
                           "cut off",
                           key, (unsigned long long)i, pos);
        uint64_t l = load_u32le(p + pos);
        pos += 4;
        if (l > len - pos)
            return zb__err(ZB_E_TRUNCATED,
                           "%s: vlen-utf8 item %llu at offset %zu claims %llu "
                           "bytes, %zu remain",
                           key, (unsigned long long)i, pos, (unsigned long long)l, len - pos);
        out[i] = (zb__str_span){pos, l};
        pos += (size_t)l;
    }
    *items = out;
    return ZB_OK;
}

/* Runs a fixed-size unit's codecs into target (exactly unit_elems * isz bytes), undoes the byte
 * order and counts it. The one decode step shared by row reads and the coalesced reader. */
static zb_status
decode_fixed(const zb__chain *c, zb_ctx *ctx, const uint8_t *enc, size_t enc_len, uint8_t *target,
             uint64_t unit_elems, size_t isz, const char *key)
{
    size_t unit_bytes = (size_t)(unit_elems * isz);
    const uint8_t *res = enc;
    size_t res_len = enc_len;
    if (c->nbb > 0)
        ZB_TRY(run_bb(c, ctx, enc, enc_len, target, unit_bytes, unit_bytes, key, &res, &res_len));
    if (res_len != unit_bytes)
        return zb__err(res_len < unit_bytes ? ZB_E_TRUNCATED : ZB_E_CORRUPT,
                       "%s: chunk holds %zu bytes, expected %zu", key, res_len, unit_bytes);
    if (res != target) memcpy(target, res, unit_bytes);
    if (c->big_endian && isz > 1) swap_bytes(target, unit_elems, isz);
    ctx->stats.chunks_decoded++;
    ctx->stats.bytes_decoded += unit_bytes;
    return ZB_OK;
}

uint64_t
zb__array_unit_bytes(const zb_array *a)
{
    uint64_t n = a->meta.itemsize;
    for (int d = 0; d < a->meta.ndim; d++) n *= a->inner[d];
    return n;
}

bool
zb__array_whole_shard(const zb_array *a)
{
    return a->meta.chain.ab == ZB_AB_SHARDING && a->meta.chain.nbb > 0;
}

zb_status
zb__array_unit_object(const zb_array *a, const uint64_t *g, char *key, size_t cap, uint64_t *shard,
                      uint64_t *entry)
{
    const zb__array_meta *m = &a->meta;
    if (m->chain.ab != ZB_AB_SHARDING) {
        if (entry) *entry = 0;
        if (shard) memcpy(shard, g, sizeof(uint64_t) * (size_t)m->ndim);
        return zb__meta_chunk_key(m, a->path, g, key, cap);
    }
    uint64_t s[ZB_MAX_DIMS], j = 0;
    for (int d = 0; d < m->ndim; d++) {
        uint64_t cps = m->chunks[d] / a->inner[d];
        s[d] = g[d] / cps;
        j = j * cps + g[d] % cps;
    }
    if (shard) memcpy(shard, s, sizeof(uint64_t) * (size_t)m->ndim);
    if (entry) *entry = j;
    return key ? zb__meta_chunk_key(m, a->path, s, key, cap) : ZB_OK;
}

/* The index of the shard `key` (n entries) from `raw`, the last `got` bytes of a shard of
 * `size` bytes (index at the end), into a new array of 2n words. */
static zb_status
index_decode(const zb_array *a, const char *key, uint64_t n, const uint8_t *raw, uint64_t got,
             uint64_t size, uint64_t **entries)
{
    const zb__shard_spec *spec = a->meta.chain.shard;
    uint64_t idx_bytes = zb__shard_index_nbytes(spec, n);
    *entries = NULL;
    if (size < idx_bytes)
        return zb__err(ZB_E_TRUNCATED,
                       "%s: shard of %llu bytes is shorter than its %llu-byte "
                       "index",
                       key, (unsigned long long)size, (unsigned long long)idx_bytes);
    if (got != idx_bytes)
        return zb__err(ZB_E_TRUNCATED, "%s: read %llu of the %llu index bytes", key,
                       (unsigned long long)got, (unsigned long long)idx_bytes);
    uint64_t *e = malloc((size_t)(2 * n * sizeof(uint64_t)));
    if (!e) return zb__err(ZB_E_NOMEM, "%s: out of memory for the shard index", key);
    zb_status st = zb__shard_index_decode(spec, n, raw, (size_t)got, size, key, e);
    if (st != ZB_OK) {
        free(e);
        return st;
    }
    *entries = e;
    return ZB_OK;
}

zb_status
zb__array_shard_index(const zb_array *a, zb_ctx *ctx, const uint64_t *shard, uint64_t **entries,
                      uint64_t *n_out, bool *missing)
{
    const zb__array_meta *m = &a->meta;
    *entries = NULL;
    *missing = false;
    uint64_t n = 1;
    for (int d = 0; d < m->ndim; d++) n *= m->chunks[d] / a->inner[d];
    *n_out = n;
    char key[4600];
    ZB_TRY(zb__meta_chunk_key(m, a->path, shard, key, sizeof key));
    const zb__shard_spec *spec = m->chain.shard;
    uint64_t idx_bytes = zb__shard_index_nbytes(spec, n), size = 0;
    uint8_t *raw = malloc((size_t)idx_bytes + 1);
    if (!raw) return zb__err(ZB_E_NOMEM, "%s: out of memory for the shard index", key);
    /* An index at the end is the shard's last bytes: one suffix read, which also tells the
     * shard's size (one request over HTTP); an index at the start needs the size first. */
    zb_range rg = {.key = key, .offset = ZB_RANGE_SUFFIX, .length = idx_bytes, .dst = raw};
    zb_status st = ZB_OK;
    if (spec->index_at_start) {
        st = zb_store_size(a->store, key, &size);
        if (st == ZB_OK && size >= idx_bytes)
            st = zb_store_get(a->store, key, 0, idx_bytes, raw, &rg.nread);
    } else {
        st = zb_store_get_ranges(a->store, &rg, 1, NULL, NULL);
        size = rg.offset + rg.nread;
    }
    if (st == ZB_E_NOTFOUND) {
        zb_clear_error();
        free(raw);
        *missing = true;
        return ZB_OK;
    }
    if (st == ZB_OK) {
        ctx->stats.range_reads++;
        ctx->stats.bytes_fetched += rg.nread;
        st = index_decode(a, key, n, raw, rg.nread, size, entries);
    }
    free(raw);
    return st;
}

zb_status
zb__array_decode_unit(const zb_array *a, zb_ctx *ctx, const uint8_t *enc, size_t enc_len,
                      uint8_t *dst, const char *key)
{
    const zb__array_meta *m = &a->meta;
    const zb__chain *c = m->chain.ab == ZB_AB_SHARDING ? m->chain.shard->inner_chain : &m->chain;
    if (c->ab != ZB_AB_BYTES) return zb__err(ZB_E_TYPE, "%s: not a fixed-size array", key);
    size_t isz = m->itemsize;
    uint64_t elems = 1;
    for (int d = 0; d < m->ndim; d++) elems *= a->inner[d];
    size_t unit_bytes = (size_t)(elems * isz);
    uint8_t *target = dst;
    if (c->has_transpose) {
        ZB_TRY(zb__buf_reserve(&ctx->ws.decoded, unit_bytes ? unit_bytes : 1));
        target = ctx->ws.decoded.data;
    }
    ZB_TRY(decode_fixed(c, ctx, enc, enc_len, target, elems, isz, key));
    if (c->has_transpose) {
        /* gather into logical C order */
        uint64_t us[ZB_MAX_DIMS], idx[ZB_MAX_DIMS] = {0};
        zb__unit_strides(a, us);
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

/* The unit's chain when its `bytes` codec yields the unit's bytes as they are (native order, no
 * transpose, nothing around the inner chunks of a shard), whatever bytes->bytes codecs follow;
 * else NULL. */
static const zb__chain *
native_bytes_chain(const zb_array *a)
{
    const zb__array_meta *m = &a->meta;
    const zb__chain *c = m->chain.ab == ZB_AB_SHARDING ? m->chain.shard->inner_chain : &m->chain;
    if (m->chain.ab == ZB_AB_SHARDING && (m->chain.nbb > 0 || m->chain.has_transpose)) return NULL;
    bool native = c->ab == ZB_AB_BYTES && !c->has_transpose && (!c->big_endian || m->itemsize == 1);
    return native ? c : NULL;
}

bool
zb__array_unit_raw(const zb_array *a)
{
    const zb__chain *c = native_bytes_chain(a);
    return c && c->nbb == 0;
}

zb_status
zb__array_unit_plain(const zb_array *a, zb_ctx *ctx, const uint8_t *enc, size_t enc_len,
                     const char *key, const uint8_t **plain)
{
    const zb__chain *c = native_bytes_chain(a);
    *plain = NULL;
    if (!c || c->nbb != 1 || c->bb[0].id != ZB_CODEC_BLOSC) return ZB_OK;
    size_t unit_bytes = (size_t)zb__array_unit_bytes(a);
    ZB_TRY(zb__blosc_plain(enc, enc_len, unit_bytes, plain, key));
    if (*plain) { /* counted as decode_fixed counts a decoded unit */
        ctx->stats.chunks_decoded++;
        ctx->stats.bytes_decoded += unit_bytes;
    }
    return ZB_OK;
}

void
zb__array_fill_unit(const zb_array *a, uint8_t *dst)
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

static const zb__chain *
unit_chain(const zb_array *a)
{
    return a->meta.chain.ab == ZB_AB_SHARDING ? a->meta.chain.shard->inner_chain : &a->meta.chain;
}

zb_status
zb__unit_decode_stored(const zb_array *a, zb_ctx *ctx, const uint8_t *enc, size_t enc_len,
                       uint8_t *target, const char *key)
{
    const zb__chain *c = unit_chain(a);
    if (c->ab != ZB_AB_BYTES) return zb__err(ZB_E_TYPE, "%s: not a fixed-size array", key);
    const zb__unit_geom *u = &a->units;
    return decode_fixed(c, ctx, enc, enc_len, target, u->unit_bytes / a->meta.itemsize,
                        a->meta.itemsize, key);
}

zb_status
zb__unit_decode_strings(const zb_array *a, zb_ctx *ctx, const uint8_t *enc, size_t enc_len,
                        uint64_t n, const char *key, const uint8_t **base,
                        const zb__str_span **items)
{
    const uint8_t *res;
    size_t res_len;
    ZB_TRY(run_bb(unit_chain(a), ctx, enc, enc_len, NULL, 0, SIZE_MAX, key, &res, &res_len));
    ZB_TRY(parse_vlen(ctx, res, res_len, n, key, items));
    ctx->stats.chunks_decoded++;
    ctx->stats.bytes_decoded += res_len;
    *base = res;
    return ZB_OK;
}

zb_status
zb__unit_decode_shard(const zb_array *a, zb_ctx *ctx, const uint8_t *enc, size_t enc_len,
                      const char *key, const uint8_t **res, size_t *res_len)
{
    return run_bb(&a->meta.chain, ctx, enc, enc_len, NULL, 0, SIZE_MAX, key, res, res_len);
}

/* ---- geometry ------------------------------------------------------------------------------ */

void
zb__unit_geom_init(zb_array *a)
{
    const zb__array_meta *m = &a->meta;
    zb__unit_geom *u = &a->units;
    memset(u, 0, sizeof *u);
    u->path = a->path;
    u->store = a->store;
    u->dtype = m->dtype;
    u->itemsize = m->itemsize;
    u->ndim = m->ndim;
    u->row_elems = a->row_elems;
    u->unit_bytes = m->itemsize;
    u->shard_units = 1;
    u->spans_rows = true;
    for (int d = 0; d < m->ndim; d++) {
        u->shape[d] = m->shape[d];
        u->inner[d] = a->inner[d];
        u->grid[d] = (m->shape[d] + a->inner[d] - 1) / a->inner[d];
        u->per_shard[d] = m->chunks[d] / a->inner[d];
        u->shard_grid[d] = (m->shape[d] + m->chunks[d] - 1) / m->chunks[d];
        u->shard_units *= u->per_shard[d];
        u->unit_bytes *= a->inner[d];
        if (d > 0 && a->inner[d] != m->shape[d]) u->spans_rows = false;
    }
    u->kind = ZB_UNITS_PLAIN;
    if (m->chain.ab == ZB_AB_SHARDING) {
        u->kind = ZB_UNITS_SHARD;
        if (m->chain.nbb > 0) u->kind = ZB_UNITS_ROWS;
        for (int d = 1; d < m->ndim; d++)
            if (m->chunks[d] < m->shape[d]) u->kind = ZB_UNITS_ROWS;
    }
    u->raw = zb__array_unit_raw(a);
    u->raw_rows = u->raw && u->spans_rows;
}

const zb__unit_geom *
zb__array_units(const zb_array *a)
{
    return &a->units;
}

uint64_t
zb__unit_linear(const zb__unit_geom *u, const uint64_t *g)
{
    uint64_t lin = 0;
    for (int d = 0; d < u->ndim; d++) lin = lin * u->grid[d] + g[d];
    return lin;
}

uint64_t
zb__unit_row_units(const zb__unit_geom *u)
{
    uint64_t n = 1;
    for (int d = 1; d < u->ndim; d++) n *= u->grid[d];
    return n;
}

void
zb__unit_coords(const zb__unit_geom *u, uint64_t g0, uint64_t other, uint64_t *g)
{
    memset(g, 0, sizeof(uint64_t) * ZB_MAX_DIMS);
    g[0] = g0;
    for (int d = u->ndim - 1; d >= 1; d--) {
        g[d] = other % u->grid[d];
        other /= u->grid[d];
    }
}

/* ---- merge --------------------------------------------------------------------------------- */

size_t
zb__merge_next(const void *spans, size_t size, size_t i, size_t n, zb__merge_rule r,
               uint64_t *start, uint64_t *end)
{
    const uint8_t *p = spans;
    const zb__span *s = (const zb__span *)(const void *)(p + i * size);
    *start = s->off;
    *end = s->off + s->len;
    size_t k = i + 1;
    for (; k < n; k++) {
        s = (const zb__span *)(const void *)(p + k * size);
        if (!zb__merge_joins(r, *start, end, s->off, s->len)) break;
    }
    return k;
}

/* ---- fetch --------------------------------------------------------------------------------- */

bool
zb__unit_lists_ranges(const zb_array *a)
{
    return zb__store_lists_ranges(a->store);
}

static zb_status
truncated(const char *key, uint64_t got, uint64_t want, uint64_t off)
{
    return zb__err(ZB_E_TRUNCATED, "%s: holds %llu of the %llu bytes at offset %llu", key,
                   (unsigned long long)got, (unsigned long long)want, (unsigned long long)off);
}

/* A view of bytes [off, off + len) of `key` (len UINT64_MAX: to the end): ZB_OK with *data set
 * (release *tok), ZB_E_UNSUPPORTED (cleared) when the store offers no view of it. */
static zb_status
fetch_view(const zb_array *a, const char *key, uint64_t off, uint64_t len, const uint8_t **data,
           uint64_t *got, void **tok, zb_read_stats *rs)
{
    zb_status st = zb_store_view(a->store, key, off, len, data, got, tok);
    if (st == ZB_E_UNSUPPORTED) {
        zb_clear_error();
        return st;
    }
    if (st == ZB_OK && rs) {
        rs->range_reads++;
        rs->bytes_fetched += *got;
    }
    return st;
}

zb_status
zb__unit_read(const zb_array *a, const char *key, uint64_t off, uint64_t len, zb__buf *buf,
              const uint8_t **data, zb_read_stats *rs)
{
    uint8_t *to = NULL;
    uint64_t got = 0;
    ZB_TRY(zb__buf_for_read(buf, off, (size_t)len, &to));
    ZB_TRY(zb_store_get(a->store, key, off, len, to, &got));
    if (rs) {
        rs->range_reads++;
        rs->bytes_fetched += got;
    }
    if (got != len) return truncated(key, got, len, off);
    *data = to;
    return ZB_OK;
}

zb_status
zb__unit_fetch(const zb_array *a, const char *key, uint64_t off, uint64_t len, zb__buf *buf,
               const uint8_t **data, void **tok, zb_read_stats *rs)
{
    *tok = NULL;
    uint64_t got = 0;
    zb_status st = fetch_view(a, key, off, len, data, &got, tok, rs);
    if (st == ZB_E_UNSUPPORTED) return zb__unit_read(a, key, off, len, buf, data, rs);
    if (st != ZB_OK) return st;
    if (got != len) {
        zb_store_release(a->store, *tok);
        *tok = NULL;
        return truncated(key, got, len, off);
    }
    return ZB_OK;
}

uint64_t
zb__unit_fetch_bound(const zb_array *a)
{
    uint64_t unit = a->units.unit_bytes;
    return unit + unit / 64 + 4096;
}

zb_status
zb__unit_fetch_whole(const zb_array *a, const char *key, zb__buf *buf, const uint8_t **data,
                     size_t *len, bool *missing, void **tok, zb_read_stats *rs)
{
    *missing = false;
    *tok = NULL;
    uint64_t vgot = 0;
    zb_status vs = fetch_view(a, key, 0, UINT64_MAX, data, &vgot, tok, rs);
    if (vs == ZB_OK) {
        *len = (size_t)vgot;
        return ZB_OK;
    }
    if (vs == ZB_E_NOTFOUND) {
        zb_clear_error();
        *missing = true;
        return ZB_OK;
    }
    if (vs != ZB_E_UNSUPPORTED) return vs;
    /* One read of up to a bound no codec's output exceeds, so a chunk costs one get instead of
     * a size query and a get; an object that fills the bound (never seen from real codecs) is
     * read again whole. */
    uint64_t guess = zb__unit_fetch_bound(a);
    uint8_t *dst;
    ZB_TRY(zb__buf_for_read(buf, 0, (size_t)guess, &dst));
    uint64_t got = 0;
    zb_status st = zb_store_get(a->store, key, 0, guess, dst, &got);
    if (st == ZB_E_NOTFOUND) {
        zb_clear_error();
        *missing = true;
        return ZB_OK;
    }
    if (st != ZB_OK) return st;
    if (rs) rs->range_reads++;
    if (got == guess) {
        uint64_t size = 0;
        ZB_TRY(zb_store_size(a->store, key, &size));
        ZB_TRY(zb__buf_for_read(buf, 0, (size_t)size, &dst));
        ZB_TRY(zb_store_get(a->store, key, 0, size, dst, &got));
        if (rs) rs->range_reads++;
    }
    if (rs) rs->bytes_fetched += got;
    *data = dst;
    *len = (size_t)got;
    return ZB_OK;
}

/* ---- locate -------------------------------------------------------------------------------- */

/* The index cache's key of the shard holding unit g: an address inside the array that no unit
 * cache entry uses, and the shard's number; its grid coordinates in s. */
static zb_status
index_slot(const zb_array *a, const uint64_t *g, uint64_t *s, const void **owner, uint64_t *slin)
{
    const zb__unit_geom *u = &a->units;
    ZB_TRY(zb__array_unit_object(a, g, NULL, 0, s, NULL));
    *slin = 0;
    for (int d = 0; d < u->ndim; d++) *slin = *slin * u->shard_grid[d] + s[d];
    *owner = (const uint8_t *)a + 1;
    return ZB_OK;
}

/* A missing shard's index: every entry empty. */
static uint64_t *
empty_index(uint64_t n)
{
    uint64_t *e = malloc((size_t)(2 * n * sizeof(uint64_t)) + 1);
    for (uint64_t i = 0; e && i < 2 * n; i++) e[i] = ZB_SHARD_EMPTY;
    return e;
}

zb_status
zb__unit_index_prefetch(zb__cache *cache, const zb_array *const *arrays, const uint64_t *rows,
                        size_t n, zb_read_stats *rs)
{
    typedef struct {
        const zb_array *a;
        const void *owner;
        uint64_t slin;
        char key[4600]; /* a chunk key's bound (zb__meta_chunk_key) */
        uint8_t *raw;
    } slot;
    size_t k_max = 0; /* the sharded ones: a slot holds a key of 4.6 KB */
    for (size_t i = 0; i < n; i++)
        k_max +=
            arrays[i]->units.kind == ZB_UNITS_SHARD && !arrays[i]->meta.chain.shard->index_at_start;
    if (!k_max) return ZB_OK;
    slot *sl = calloc(k_max, sizeof *sl);
    zb_range *rg = calloc(k_max, sizeof *rg);
    zb_status st = sl && rg ? ZB_OK : zb__err(ZB_E_NOMEM, "shard indexes: out of memory");
    size_t m = 0;
    for (size_t i = 0; i < n && st == ZB_OK; i++) {
        const zb_array *a = arrays[i];
        if (a->units.kind != ZB_UNITS_SHARD || a->meta.chain.shard->index_at_start) continue;
        uint64_t g[ZB_MAX_DIMS] = {rows[i]}, s[ZB_MAX_DIMS], slin;
        const void *owner;
        st = index_slot(a, g, s, &owner, &slin);
        bool seen = st != ZB_OK || zb__cache_contains(cache, owner, slin);
        for (size_t j = 0; j < m && !seen; j++) seen = sl[j].owner == owner && sl[j].slin == slin;
        if (seen) continue;
        sl[m] = (slot){.a = a, .owner = owner, .slin = slin};
        st = zb__meta_chunk_key(&a->meta, a->path, s, sl[m].key, sizeof sl[m].key);
        uint64_t idx = zb__shard_index_nbytes(a->meta.chain.shard, a->units.shard_units);
        if (st == ZB_OK && !(sl[m].raw = malloc((size_t)idx + 1)))
            st = zb__err(ZB_E_NOMEM, "%s: out of memory for the shard index", sl[m].key);
        rg[m] = (zb_range){
            .key = sl[m].key, .offset = ZB_RANGE_SUFFIX, .length = idx, .dst = sl[m].raw};
        m++;
    }
    /* one list read per store: every index in flight at once */
    for (size_t i = 0; i < m && st == ZB_OK; i++) {
        zb_store *store = sl[i].a->store;
        size_t k = i;
        while (k < m && sl[k].a->store == store) k++;
        (void)zb_store_get_ranges(store, rg + i, k - i, NULL, NULL);
        zb_clear_error(); /* a failed index is read again, and reported, where it is used */
        i = k - 1;
    }
    for (size_t i = 0; i < m && st == ZB_OK; i++) {
        const zb_array *a = sl[i].a;
        uint64_t nu = a->units.shard_units, *e = NULL;
        if (rg[i].status == ZB_E_NOTFOUND) {
            e = empty_index(nu);
        } else if (rg[i].status == ZB_OK) {
            if (rs) {
                rs->range_reads++;
                rs->bytes_fetched += rg[i].nread;
            }
            if (index_decode(a, sl[i].key, nu, sl[i].raw, rg[i].nread, rg[i].offset + rg[i].nread,
                             &e) != ZB_OK)
                zb_clear_error();
        }
        if (e) zb__cache_put(cache, sl[i].owner, sl[i].slin, e, (size_t)(2 * nu * sizeof *e));
        free(e);
    }
    for (size_t i = 0; sl && i < m; i++) free(sl[i].raw);
    free(sl);
    free(rg);
    return st;
}

zb_status
zb__unit_shard_entries(const zb_array *a, zb_ctx *ctx, zb__cache *cache, const uint64_t *g,
                       uint64_t lo, uint64_t k, uint64_t *entries, zb_read_stats *rs)
{
    const zb__unit_geom *u = &a->units;
    uint64_t n = u->shard_units;
    size_t ibytes = (size_t)(2 * n * sizeof(uint64_t)), off = (size_t)(2 * lo * sizeof(uint64_t));
    size_t part = (size_t)(2 * k * sizeof(uint64_t));
    uint64_t s[ZB_MAX_DIMS], slin = 0;
    const void *owner;
    ZB_TRY(index_slot(a, g, s, &owner, &slin));
    if (cache && zb__cache_get_part(cache, owner, slin, ibytes, off, entries, part)) return ZB_OK;
    uint64_t *fresh = NULL, nn = 0;
    bool missing = false;
    uint64_t r0 = ctx->stats.range_reads, b0 = ctx->stats.bytes_fetched;
    zb_status st = zb__array_shard_index(a, ctx, s, &fresh, &nn, &missing);
    if (rs) {
        rs->range_reads += ctx->stats.range_reads - r0;
        rs->bytes_fetched += ctx->stats.bytes_fetched - b0;
    }
    if (st != ZB_OK) return st;
    if (missing && !(fresh = empty_index(n)))
        return zb__err(ZB_E_NOMEM, "%s: out of memory for a shard index", a->path);
    memcpy(entries, (const uint8_t *)fresh + off, part);
    if (cache) zb__cache_put(cache, owner, slin, fresh, ibytes);
    free(fresh);
    return ZB_OK;
}

const uint8_t *
zb__array_fill(const zb_array *a)
{
    return a->meta.fill;
}

zb_status
zb__unit_locate(const zb_array *a, zb_ctx *ctx, zb__cache *cache, const uint64_t *g, char *key,
                size_t cap, uint64_t *off, uint64_t *len, bool *missing, zb_read_stats *rs)
{
    *off = *len = 0;
    *missing = false;
    uint64_t entry = 0;
    ZB_TRY(zb__array_unit_object(a, g, key, cap, NULL, &entry));
    if (a->meta.chain.ab == ZB_AB_SHARDING) {
        uint64_t e[2];
        ZB_TRY(zb__unit_shard_entries(a, ctx, cache, g, entry, 1, e, rs));
        *missing = e[0] == ZB_SHARD_EMPTY;
        if (!*missing) {
            *off = e[0];
            *len = e[1];
        }
        return ZB_OK;
    }
    zb_status st = zb_store_size(a->store, key, len);
    if (st == ZB_E_NOTFOUND) {
        zb_clear_error();
        *missing = true;
        return ZB_OK;
    }
    return st;
}
