/* Validation on the read path and on_invalid (validate.h).
 *
 * Every check runs on what one request delivers, as it is planned or lands, never as a pass
 * over the store at open: here, the request's memory and its pointers against their values,
 * before anything is allocated. The values themselves (CSR column ids, categorical codes, edge
 * indices) are checked by the tasks as each copy lands, in the copy or conversion that touches
 * them anyway (rows.c; docs/PERFORMANCE.md has the measured cost). Skipping
 * (ZB_ON_INVALID_SKIP) costs nothing until a request fails: then the request is halved until
 * the bad samples are found, and the rest read again. */
#include "validate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/read_int.h"
#include "util/status.h"

zb_status
zb__request_bytes_add(const zb_dataset *ds, const char *field, uint64_t rows, uint64_t row_elems,
                      size_t itemsize, size_t *need)
{
    uint64_t cap =
        ds->opts.max_request_bytes ? ds->opts.max_request_bytes : ZB_MAX_REQUEST_BYTES_DEFAULT;
    uint64_t bytes, total;
    bool ok = zb__mul_u64(rows, row_elems, &bytes) && zb__mul_u64(bytes, itemsize, &bytes) &&
              zb__add_u64(bytes, 63, &bytes);
    bytes &= ~(uint64_t)63;
    if (!ok || !zb__add_u64(*need, bytes, &total) || total > cap || total > SIZE_MAX - 64)
        return zb__err(ZB_E_INVALID,
                       "%s: a request of %llu rows of %s needs more than the "
                       "%llu-byte cap on one request's memory (zb_dataset_opts.max_request_bytes)",
                       zb_dataset_name(ds), (unsigned long long)rows, field,
                       (unsigned long long)cap);
    *need = (size_t)total;
    return ZB_OK;
}

zb_status
zb__validate_segment(const zb_dataset *ds, size_t s, size_t n, const uint64_t *ids,
                     const uint32_t *child, const uint64_t *phys, const int64_t *start,
                     const int64_t *ptr)
{
    for (size_t i = 0; i < n; i++) {
        const zb_dataset *ch = child_of(ds, child[i]);
        uint64_t len = (uint64_t)(ptr[i + 1] - ptr[i]), end = (uint64_t)start[i] + len;
        for (size_t f = 0; f < ch->nfields; f++) {
            const zb__field *fd = &ch->fields[f];
            if (fd->seg != (int)s || !fd->arr) continue;
            uint64_t rows = zb__array_units(fd->arr)->shape[0];
            if (end >= (uint64_t)start[i] && end <= rows) continue;
            return zb__err(ZB_E_CORRUPT,
                           "%s: sample %llu (row %llu): %s: pointers give rows "
                           "[%lld, %lld + %llu), past the %llu rows of field %s (%s)",
                           zb_dataset_name(ch), (unsigned long long)ids[i],
                           (unsigned long long)phys[i], ch->segs[s].ptr->path, (long long)start[i],
                           (long long)start[i], (unsigned long long)len, (unsigned long long)rows,
                           fd->name, zb__array_units(fd->arr)->path);
        }
    }
    return ZB_OK;
}

/* ---- on_invalid = skip -------------------------------------------------------------------- */

/* Marks in bad[] the samples of ids[0..n) that make a read fail with ZB_E_CORRUPT, knowing
 * that reading all n fails: halves are read until the failing ones are single samples. */
static zb_status
find_bad(zb_dataset *ds, const uint64_t *ids, size_t n, uint8_t *bad)
{
    if (n == 1) {
        bad[0] = 1;
        return ZB_OK;
    }
    size_t h = n / 2;
    for (int part = 0; part < 2; part++) {
        const uint64_t *pi = part ? ids + h : ids;
        size_t pn = part ? n - h : h;
        zb_batch *b = NULL;
        zb_status st = zb__reader_read_batches(ds, NULL, pi, pn, NULL, 0, &b);
        zb_batch_free(b);
        if (st == ZB_E_CORRUPT) st = find_bad(ds, pi, pn, part ? bad + h : bad);
        if (st != ZB_OK) return st;
    }
    return ZB_OK;
}

zb_status
zb__dataset_read_window(zb_dataset *ds, zb__arena_pool *pool, const uint64_t *ids, size_t n,
                        size_t *sizes, size_t nbatches, zb_batch **out)
{
    zb_status st = zb__reader_read_batches(ds, pool, ids, n, sizes, nbatches, out);
    if (st != ZB_E_CORRUPT || ds->opts.on_invalid != ZB_ON_INVALID_SKIP || n == 0) return st;
    uint8_t *bad = calloc(n, 1);
    uint64_t *keep = malloc(n * sizeof *keep);
    if (!bad || !keep) {
        st = zb__err(ZB_E_NOMEM, "read_many: out of memory to skip invalid samples");
        goto out;
    }
    st = find_bad(ds, ids, n, bad);
    if (st != ZB_OK) goto out;
    size_t m = 0, k = 0, left = nbatches ? sizes[0] : n;
    for (size_t i = 0; i < n; i++) {
        while (nbatches && left == 0) left = sizes[++k]; /* the batch sample i belongs to */
        left--;
        if (bad[i]) {
            if (nbatches) sizes[k]--;
            continue;
        }
        keep[m++] = ids[i];
    }
    zb_clear_error();
    st = zb__reader_read_batches(ds, pool, keep, m, sizes, nbatches, out);
    if (st == ZB_OK) zb__batch_count_skipped(*out, n - m);
out:
    free(bad);
    free(keep);
    return st;
}

zb_status
zb__dataset_read_batches(zb_dataset *ds, const uint64_t *ids, size_t n, const size_t *sizes,
                         size_t nbatches, zb_batch **out)
{
    if (!ds || ds->opts.on_invalid != ZB_ON_INVALID_SKIP || (nbatches && !sizes))
        return zb__reader_read_batches(ds, NULL, ids, n, sizes, nbatches, out);
    size_t *own = malloc((nbatches + 1) * sizeof *own);
    if (!own) {
        if (out) *out = NULL;
        return zb__err(ZB_E_NOMEM, "read_many: out of memory");
    }
    if (nbatches) memcpy(own, sizes, nbatches * sizeof *own);
    zb_status st = zb__dataset_read_window(ds, NULL, ids, n, nbatches ? own : NULL, nbatches, out);
    free(own);
    return st;
}
