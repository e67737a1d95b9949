/* Numbers out of a dataset by row range (h5ad_io.h: zb__h5_ds_read).
 *
 * Why chunks are decoded here: the converter reads terabytes from several threads. libhdf5 would
 * inflate every chunk inside its lock, one thread at a time; for a chunked dataset whose filters
 * are deflate and shuffle only (what h5py writes for compression="gzip"), the raw chunk is read
 * under the lock (H5Dread_chunk: a copy from the page cache) and inflated with libdeflate outside
 * it, so threads inflate side by side. Any other filter (lzf, szip, fletcher32, ...), and no
 * filter at all, goes through H5Dread (an unfiltered chunk has nothing to decode, and H5Dread
 * reads its nominal size where H5Dread_chunk would trust the index: h5ad_dataset.c).
 *
 * A chunk that covers whole rows of the destination, all of them wanted, is decoded in place;
 * others are decoded into a scratch buffer and their part copied out. A chunk never written
 * reads as the fill value (through H5Dread), or is an error where every chunk must be stored
 * (zb__h5_ds.whole). */
#include <libdeflate.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/h5ad_io.h"
#include "util/buf.h"
#include "util/status.h"

/* ---- reading numbers ------------------------------------------------------------------------- */

/* Under the lock: H5Dread of the box rows [a, b) x columns [k0, k1) into dst, which holds rows
 * [start, stop) x every column. */
static zb_status
read_box(const zb__h5_ds *d, uint64_t start, uint64_t stop, uint64_t a, uint64_t b, uint64_t k0,
         uint64_t k1, void *dst)
{
    hsize_t fstart[2] = {a, k0}, count[2] = {b - a, k1 - k0};
    hsize_t mdims[2] = {stop - start, d->dims[1]}, mstart[2] = {a - start, k0};
    hid_t fspace = H5Dget_space(d->id), mspace = H5Screate_simple(d->rank, mdims, NULL);
    zb_status st = ZB_OK;
    if (fspace < 0 || mspace < 0 ||
        H5Sselect_hyperslab(fspace, H5S_SELECT_SET, fstart, NULL, count, NULL) < 0 ||
        H5Sselect_hyperslab(mspace, H5S_SELECT_SET, mstart, NULL, count, NULL) < 0 ||
        H5Dread(d->id, d->memtype, mspace, fspace, H5P_DEFAULT, dst) < 0) {
        char what[96];
        snprintf(what, sizeof what, "reading rows [%llu, %llu)", (unsigned long long)a,
                 (unsigned long long)b);
        st = zb__h5_fail(ZB_E_CORRUPT, d->path, d->key, what);
    }
    if (fspace >= 0) H5Sclose(fspace);
    if (mspace >= 0) H5Sclose(mspace);
    return st;
}

/* HDF5's shuffle filter stores byte j of every element together; it leaves data of fewer than
 * two elements, and the bytes after the last whole element, as they are. */
static void
unshuffle(const uint8_t *in, uint8_t *out, size_t nbytes, size_t item)
{
    size_t n = item ? nbytes / item : 0;
    if (item < 2 || n < 2) {
        memcpy(out, in, nbytes);
        return;
    }
    for (size_t j = 0; j < item; j++) {
        const uint8_t *src = in + j * n;
        for (size_t i = 0; i < n; i++) out[i * item + j] = src[i];
    }
    memcpy(out + n * item, in + n * item, nbytes - n * item);
}

static void
swap_bytes(uint8_t *p, size_t n, size_t item)
{
    for (size_t i = 0; i < n; i++, p += item)
        for (size_t a = 0, b = item - 1; a < b; a++, b--) {
            uint8_t t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

/* One reader's scratch for the direct path. */
typedef struct chunk_io {
    struct libdeflate_decompressor *inflater;
    zb__buf packed;   /* the chunk as stored */
    zb__buf stage[2]; /* intermediate results of the filter pipeline */
    zb__buf plain;    /* the decoded chunk, when it does not land in dst directly */
} chunk_io;

static void
chunk_io_free(chunk_io *io)
{
    libdeflate_free_decompressor(io->inflater);
    zb__buf_free(&io->packed);
    zb__buf_free(&io->stage[0]);
    zb__buf_free(&io->stage[1]);
    zb__buf_free(&io->plain);
}

/* "the chunk at element 14" (1-d) or "the chunk at row 14, column 0" (2-d), for messages. */
static const char *
chunk_where(const zb__h5_ds *d, const hsize_t *off, char *buf, size_t cap)
{
    if (d->rank == 1)
        snprintf(buf, cap, "the chunk at element %llu", (unsigned long long)off[0]);
    else
        snprintf(buf, cap, "the chunk at row %llu, column %llu", (unsigned long long)off[0],
                 (unsigned long long)off[1]);
    return buf;
}

static zb_status
not_stored(const zb__h5_ds *d, const hsize_t *off)
{
    char where[96];
    return zb__err(ZB_E_CORRUPT,
                   "%s: %s: %s is not stored (a damaged chunk index, or a file written in part)",
                   d->path, d->key, chunk_where(d, off, where, sizeof where));
}

/* Under the lock: for a dataset whose chunks must all be stored (d->whole), that each chunk
 * rows [a, b) x columns [k0, k1) touch is in the chunk index. */
static zb_status
chunks_stored(const zb__h5_ds *d, uint64_t a, uint64_t b, uint64_t k0, uint64_t k1)
{
    if (!d->whole || !d->chunk[0] || a == b || k0 == k1) return ZB_OK;
    for (uint64_t r = a - a % d->chunk[0]; r < b; r += d->chunk[0])
        for (uint64_t k = k0 - k0 % d->chunk[1]; k < k1; k += d->chunk[1]) {
            hsize_t off[2] = {r, k}, stored = 0;
            if (H5Dget_chunk_storage_size(d->id, off, &stored) < 0 || stored == 0) {
                H5Eclear2(H5E_DEFAULT);
                return not_stored(d, off);
            }
        }
    return ZB_OK;
}

/* Runs the filter pipeline backwards over the stored chunk (`n` bytes at `in`, `mask` the filters
 * that were skipped when it was written) into `out` (chunk_bytes). */
static zb_status
decode_chunk(const zb__h5_ds *d, chunk_io *io, const uint8_t *in, size_t n, uint32_t mask,
             uint8_t *out, size_t chunk_bytes, const hsize_t *off)
{
    int last = -1; /* the first active filter in write order is the last one undone */
    for (int i = 0; i < d->n_filters; i++)
        if (!(mask & (1u << i))) {
            last = i;
            break;
        }
    const uint8_t *cur = in;
    size_t cur_n = n;
    int flip = 0;
    char where[96];
    for (int i = d->n_filters - 1; i >= 0; i--) {
        if (mask & (1u << i)) continue;
        uint8_t *to = out;
        if (i != last) {
            ZB_TRY(zb__buf_reserve(&io->stage[flip], chunk_bytes));
            to = io->stage[flip].data;
            flip ^= 1;
        }
        if (d->filters[i] == H5Z_FILTER_DEFLATE) {
            if (!io->inflater && !(io->inflater = libdeflate_alloc_decompressor()))
                return zb__err(ZB_E_NOMEM, "%s: %s: a libdeflate decompressor", d->path, d->key);
            size_t got = 0;
            enum libdeflate_result r =
                libdeflate_zlib_decompress(io->inflater, cur, cur_n, to, chunk_bytes, &got);
            if (r != LIBDEFLATE_SUCCESS || got != chunk_bytes)
                return zb__err(ZB_E_CORRUPT,
                               "%s: %s: %s (%zu bytes stored) does not inflate to its %zu "
                               "bytes%s",
                               d->path, d->key, chunk_where(d, off, where, sizeof where), n,
                               chunk_bytes, r == LIBDEFLATE_SUCCESS ? "" : " (bad deflate data)");
        } else {
            if (cur_n != chunk_bytes) break; /* reported below */
            unshuffle(cur, to, chunk_bytes, d->shuffle_item);
        }
        cur = to;
        cur_n = chunk_bytes;
    }
    if (cur_n != chunk_bytes)
        return zb__err(ZB_E_CORRUPT, "%s: %s: %s holds %zu bytes, not %zu", d->path, d->key,
                       chunk_where(d, off, where, sizeof where), cur_n, chunk_bytes);
    if (cur != out) memcpy(out, cur, chunk_bytes);
    if (d->swap) swap_bytes(out, chunk_bytes / d->item, d->item);
    return ZB_OK;
}

/* Reads the chunk at `off` raw under the lock and decodes it outside into `out`; *allocated is
 * false (out untouched) for a chunk never written, which reads as the fill value. */
static zb_status
chunk_get(const zb__h5_ds *d, chunk_io *io, const hsize_t *off, uint8_t *out, size_t chunk_bytes,
          bool *allocated)
{
    hsize_t stored = 0;
    uint32_t mask = 0;
    zb_status st = ZB_OK;
    uint8_t *in = NULL;
    zb__h5_lock();
    if (H5Dget_chunk_storage_size(d->id, off, &stored) < 0) {
        /* libhdf5 1.10 fails here for a chunk never written (its index has no entry); H5Dread
         * then serves it as the fill value, or reports the real trouble */
        H5Eclear2(H5E_DEFAULT);
        stored = 0;
    } else if (stored > 2 * (hsize_t)chunk_bytes + 4096) {
        char where[96];
        st = zb__err(ZB_E_CORRUPT, "%s: %s: %s claims %llu bytes for %zu", d->path, d->key,
                     chunk_where(d, off, where, sizeof where), (unsigned long long)stored,
                     chunk_bytes);
    } else if (stored > 0) {
        /* a filtered chunk's storage size is the one its index records, the bytes H5Dread_chunk
         * reads (direct datasets are filtered: read_layout) */
        st = zb__buf_reserve(&io->packed, (size_t)stored);
        in = io->packed.data;
        if (st == ZB_OK && H5Dread_chunk(d->id, H5P_DEFAULT, off, &mask, in) < 0)
            st = zb__h5_fail(ZB_E_CORRUPT, d->path, d->key, "reading a chunk");
    }
    zb__h5_unlock();
    *allocated = stored > 0;
    if (st != ZB_OK || !in) return st;
    return decode_chunk(d, io, in, (size_t)stored, mask, out, chunk_bytes, off);
}

/* Copies rows [a, b) x columns [k0, k1) of a decoded chunk whose corner is (r0, k0) into dst
 * (rows [start, ...) x every column). */
static void
copy_box(const zb__h5_ds *d, const uint8_t *chunk, uint64_t r0, uint64_t a, uint64_t b, uint64_t k0,
         uint64_t k1, uint64_t start, uint8_t *dst)
{
    size_t item = d->item, width = (size_t)(k1 - k0) * item;
    size_t chunk_row = (size_t)d->chunk[1] * item, dst_row = (size_t)d->dims[1] * item;
    for (uint64_t r = a; r < b; r++)
        memcpy(dst + (size_t)(r - start) * dst_row + (size_t)k0 * item,
               chunk + (size_t)(r - r0) * chunk_row, width);
}

static zb_status
read_direct(const zb__h5_ds *d, uint64_t start, uint64_t stop, uint8_t *dst)
{
    const uint64_t c0 = d->chunk[0], c1 = d->chunk[1], cols = d->dims[1];
    const size_t chunk_bytes = (size_t)(c0 * c1) * d->item;
    chunk_io io = {0};
    zb_status st = ZB_OK;
    for (uint64_t r0 = start - start % c0; st == ZB_OK && r0 < stop; r0 += c0) {
        uint64_t a = r0 > start ? r0 : start, b = r0 + c0 < stop ? r0 + c0 : stop;
        for (uint64_t k0 = 0; st == ZB_OK && k0 < cols; k0 += c1) {
            uint64_t k1 = k0 + c1 < cols ? k0 + c1 : cols;
            /* a chunk that covers whole rows of dst, all of them wanted, is decoded in place */
            bool whole = a == r0 && b == r0 + c0 && c1 == cols;
            uint8_t *to = whole ? dst + (size_t)((a - start) * cols) * d->item : NULL;
            if (!whole) {
                st = zb__buf_reserve(&io.plain, chunk_bytes);
                to = io.plain.data;
            }
            hsize_t off[2] = {r0, k0};
            bool allocated = true;
            if (st == ZB_OK) st = chunk_get(d, &io, off, to, chunk_bytes, &allocated);
            if (st == ZB_OK && !allocated && d->whole) {
                st = not_stored(d, off);
            } else if (st == ZB_OK && !allocated) {
                zb__h5_lock();
                st = read_box(d, start, stop, a, b, k0, k1, dst);
                zb__h5_unlock();
            } else if (st == ZB_OK && !whole) {
                copy_box(d, to, r0, a, b, k0, k1, start, dst);
            }
        }
    }
    chunk_io_free(&io);
    return st;
}

zb_status
zb__h5_ds_read(const zb__h5_ds *d, uint64_t start, uint64_t stop, void *dst)
{
    if (d->dtype == ZB_DT_STRING)
        return zb__err(ZB_E_TYPE, "%s: %s holds strings, not numbers", d->path, d->key);
    if (start > stop || stop > d->dims[0])
        return zb__err(ZB_E_RANGE, "%s: %s: rows [%llu, %llu) of %llu", d->path, d->key,
                       (unsigned long long)start, (unsigned long long)stop,
                       (unsigned long long)d->dims[0]);
    if (start == stop || d->dims[1] == 0) return ZB_OK;
    if (d->direct) return read_direct(d, start, stop, dst);
    zb__h5_lock();
    zb_status st = chunks_stored(d, start, stop, 0, d->dims[1]);
    if (st == ZB_OK) st = read_box(d, start, stop, start, stop, 0, d->dims[1], dst);
    zb__h5_unlock();
    return st;
}
