/* Datasets of the .h5ad source (h5ad_io.h): HDF5 types mapped to zbatch dtypes, the chunk layout
 * and filter pipeline that decide how h5ad_read.c reads them, and strings (variable-length, or
 * fixed-length without their padding), read by libhdf5 under the lock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/h5ad_io.h"
#include "util/buf.h"
#include "util/status.h"

/* ---- types ----------------------------------------------------------------------------------- */

static const char *
class_name(H5T_class_t c)
{
    switch (c) {
    case H5T_TIME:
        return "time";
    case H5T_BITFIELD:
        return "bitfield";
    case H5T_OPAQUE:
        return "opaque";
    case H5T_COMPOUND:
        return "compound";
    case H5T_REFERENCE:
        return "reference";
    case H5T_VLEN:
        return "variable-length sequence";
    case H5T_ARRAY:
        return "array";
    default:
        return "unknown";
    }
}

/* h5py stores numpy's bool as a 1-byte enum {FALSE: 0, TRUE: 1}. */
static bool
is_bool_enum(hid_t t)
{
    if (H5Tget_size(t) != 1 || H5Tget_nmembers(t) != 2) return false;
    int8_t v0 = -1, v1 = -1;
    hid_t super = H5Tget_super(t);
    bool ok = super >= 0 && H5Tget_class(super) == H5T_INTEGER &&
              H5Tget_member_value(t, 0, &v0) >= 0 && H5Tget_member_value(t, 1, &v1) >= 0;
    if (super >= 0) H5Tclose(super);
    return ok && ((v0 == 0 && v1 == 1) || (v0 == 1 && v1 == 0));
}

/* IEEE half, single and double precision, by their bit fields. */
static bool
is_ieee_float(hid_t t, size_t size)
{
    size_t spos, epos, esize, mpos, msize;
    if (H5Tget_fields(t, &spos, &epos, &esize, &mpos, &msize) < 0) return false;
    switch (size) {
    case 2:
        return spos == 15 && epos == 10 && esize == 5 && mpos == 0 && msize == 10;
    case 4:
        return spos == 31 && epos == 23 && esize == 8 && mpos == 0 && msize == 23;
    case 8:
        return spos == 63 && epos == 52 && esize == 11 && mpos == 0 && msize == 52;
    default:
        return false;
    }
}

/* The zbatch dtype of an HDF5 file type; ZB_E_UNSUPPORTED naming what it is otherwise. */
static zb_status
type_dtype(hid_t t, const char *path, const char *key, zb_dtype *out)
{
    /* [unsigned][log2 of the size] */
    static const zb_dtype ints[2][4] = {{ZB_DT_INT8, ZB_DT_INT16, ZB_DT_INT32, ZB_DT_INT64},
                                        {ZB_DT_UINT8, ZB_DT_UINT16, ZB_DT_UINT32, ZB_DT_UINT64}};
    H5T_class_t c = H5Tget_class(t);
    size_t size = H5Tget_size(t);
    switch (c) {
    case H5T_INTEGER:
        if (size == 1 || size == 2 || size == 4 || size == 8) {
            int log2 = size == 1 ? 0 : size == 2 ? 1 : size == 4 ? 2 : 3;
            *out = ints[H5Tget_sign(t) == H5T_SGN_NONE][log2];
            return ZB_OK;
        }
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s: %zu-byte integers are not supported", path, key,
                       size);
    case H5T_FLOAT:
        if (!is_ieee_float(t, size))
            return zb__err(ZB_E_UNSUPPORTED, "%s: %s: a %zu-byte non-IEEE float type", path, key,
                           size);
        *out = size == 2 ? ZB_DT_FLOAT16 : size == 4 ? ZB_DT_FLOAT32 : ZB_DT_FLOAT64;
        return ZB_OK;
    case H5T_ENUM:
        if (!is_bool_enum(t))
            return zb__err(ZB_E_UNSUPPORTED, "%s: %s: an enum type other than h5py's bool", path,
                           key);
        *out = ZB_DT_BOOL;
        return ZB_OK;
    case H5T_STRING:
        *out = ZB_DT_STRING;
        return ZB_OK;
    default:
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s: elements of HDF5 %s type are not supported", path,
                       key, class_name(c));
    }
}

/* ---- datasets -------------------------------------------------------------------------------- */

static void
ds_reset(zb__h5_ds *d)
{
    memset(d, 0, sizeof *d);
    d->id = H5I_INVALID_HID;
    d->memtype = H5I_INVALID_HID;
}

/* Reads the chunk layout and filter pipeline; sets d->direct when there are filters and every
 * one is one the direct path decodes. An unfiltered chunked dataset goes through H5Dread, which
 * reads each chunk's nominal size: H5Dread_chunk reads as many bytes as the chunk index records,
 * and libhdf5 1.10's H5Dget_chunk_storage_size reports the nominal size for an unfiltered chunk
 * whatever the index says, so a damaged index would have it write past the chunk's buffer. */
static zb_status
read_layout(zb__h5_ds *d)
{
    hid_t dcpl = H5Dget_create_plist(d->id);
    if (dcpl < 0) return zb__h5_fail(ZB_E_CORRUPT, d->path, d->key, "reading its creation list");
    zb_status st = ZB_OK;
    if (H5Pget_layout(dcpl) != H5D_CHUNKED || d->dtype == ZB_DT_STRING) goto done;
    hsize_t cdims[2] = {1, 1};
    if (H5Pget_chunk(dcpl, 2, cdims) != d->rank) {
        st = zb__h5_fail(ZB_E_CORRUPT, d->path, d->key, "reading its chunk shape");
        goto done;
    }
    d->chunk[0] = cdims[0];
    d->chunk[1] = d->rank == 2 ? cdims[1] : 1;
    uint64_t elems, bytes;
    if (!d->chunk[0] || !d->chunk[1] || !zb__mul_u64(d->chunk[0], d->chunk[1], &elems) ||
        !zb__mul_u64(elems, d->item, &bytes) || bytes > ZB_BUF_MAX) {
        st = zb__err(ZB_E_CORRUPT, "%s: %s: chunk shape %llu x %llu is invalid", d->path, d->key,
                     (unsigned long long)d->chunk[0], (unsigned long long)d->chunk[1]);
        goto done;
    }
    int nf = H5Pget_nfilters(dcpl);
    bool direct = nf >= 1 && nf <= 4;
    d->shuffle_item = d->item;
    for (int i = 0; direct && i < nf; i++) {
        unsigned flags = 0, config = 0, cd[8] = {0};
        size_t n_cd = 8;
        H5Z_filter_t f = H5Pget_filter2(dcpl, (unsigned)i, &flags, &n_cd, cd, 0, NULL, &config);
        if (f == H5Z_FILTER_SHUFFLE && n_cd >= 1 && cd[0]) d->shuffle_item = cd[0];
        direct = f == H5Z_FILTER_DEFLATE || f == H5Z_FILTER_SHUFFLE;
        d->filters[i] = (int)f;
    }
    d->n_filters = direct ? nf : 0;
    d->direct = direct;
done:
    H5Pclose(dcpl);
    return st;
}

/* The memory type H5Dread converts to: the file's own numbers, in native byte order. */
static zb_status
numeric_memtype(zb__h5_ds *d, hid_t ftype)
{
    d->memtype = H5Tcopy(ftype);
    if (d->memtype < 0) return zb__h5_fail(ZB_E_CORRUPT, d->path, d->key, "copying its type");
    H5T_order_t native = H5Tget_order(H5T_NATIVE_INT);
    if (d->item > 1 && d->dtype != ZB_DT_BOOL) {
        d->swap = H5Tget_order(ftype) != native;
        if (H5Tset_order(d->memtype, native) < 0)
            return zb__h5_fail(ZB_E_CORRUPT, d->path, d->key, "setting its byte order");
    }
    return ZB_OK;
}

static zb_status
string_memtype(zb__h5_ds *d, hid_t ftype)
{
    if (d->rank != 1)
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s: a %d-d string array", d->path, d->key, d->rank);
    d->vlen = H5Tis_variable_str(ftype) > 0;
    if (d->vlen) {
        d->memtype = H5Tcopy(H5T_C_S1);
        if (d->memtype < 0 || H5Tset_size(d->memtype, H5T_VARIABLE) < 0 ||
            H5Tset_cset(d->memtype, H5Tget_cset(ftype)) < 0)
            return zb__h5_fail(ZB_E_CORRUPT, d->path, d->key, "making its string type");
        return ZB_OK;
    }
    d->fixed_size = H5Tget_size(ftype);
    d->space_padded = H5Tget_strpad(ftype) == H5T_STR_SPACEPAD;
    d->memtype = H5Tcopy(ftype);
    if (d->memtype < 0 || d->fixed_size == 0)
        return zb__h5_fail(ZB_E_CORRUPT, d->path, d->key, "reading its string type");
    return ZB_OK;
}

/* Shape and types of the dataset in d->id. */
static zb_status
describe(zb__h5_ds *d)
{
    hid_t space = H5Dget_space(d->id), ftype = H5Dget_type(d->id);
    zb_status st = ZB_OK;
    if (space < 0 || ftype < 0) {
        st = zb__h5_fail(ZB_E_CORRUPT, d->path, d->key, "reading its shape and type");
        goto done;
    }
    d->rank = H5Sget_simple_extent_ndims(space);
    if (d->rank < 1 || d->rank > 2) {
        st = zb__err(ZB_E_UNSUPPORTED, "%s: %s: %d-d arrays are not supported here", d->path,
                     d->key, d->rank);
        goto done;
    }
    hsize_t dims[2] = {0, 1};
    H5Sget_simple_extent_dims(space, dims, NULL);
    d->dims[0] = dims[0];
    d->dims[1] = d->rank == 2 ? dims[1] : 1;
    st = type_dtype(ftype, d->path, d->key, &d->dtype);
    if (st != ZB_OK) goto done;
    if (d->dtype == ZB_DT_STRING) {
        st = string_memtype(d, ftype);
    } else {
        d->item = zb_dtype_size(d->dtype);
        st = numeric_memtype(d, ftype);
    }
    if (st == ZB_OK) st = read_layout(d);
done:
    if (space >= 0) H5Sclose(space);
    if (ftype >= 0) H5Tclose(ftype);
    return st;
}

zb_status
zb__h5_ds_from_id(hid_t id, const char *path, const char *key, zb__h5_ds *out)
{
    ds_reset(out);
    out->id = id;
    out->path = path;
    out->key = strdup(key);
    if (!out->key) {
        zb__h5_ds_close(out);
        return zb__err(ZB_E_NOMEM, "%s: %s", path, key);
    }
    zb_status st = describe(out);
    if (st != ZB_OK) zb__h5_ds_close(out);
    return st;
}

zb_status
zb__h5_ds_open(hid_t loc, const char *name, const char *path, const char *key, zb__h5_ds *out)
{
    ds_reset(out);
    if (!zb__h5_exists(loc, name)) return zb__err(ZB_E_NOTFOUND, "%s: no %s", path, key);
    hid_t id = H5Oopen(loc, name, H5P_DEFAULT);
    if (id < 0) return zb__h5_fail(ZB_E_CORRUPT, path, key, "opening it");
    if (H5Iget_type(id) != H5I_DATASET) {
        H5Oclose(id);
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s is a group (or a type), not an array", path, key);
    }
    return zb__h5_ds_from_id(id, path, key, out);
}

zb_status
zb__h5_part_open(hid_t g, const char *gkey, const char *name, const char *path, zb__h5_ds *out)
{
    char key[1024];
    ds_reset(out);
    if (snprintf(key, sizeof key, "%s/%s", gkey, name) >= (int)sizeof key)
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s/%s: the name is too long", path, gkey, name);
    zb_status st = zb__h5_ds_open(g, name, path, key, out);
    if (st == ZB_E_NOTFOUND) return zb__err(ZB_E_CORRUPT, "%s: %s is missing", path, key);
    if (st == ZB_OK && out->rank != 1) {
        st = zb__err(ZB_E_UNSUPPORTED, "%s: %s is %d-d where a 1-d array was expected", path, key,
                     out->rank);
        zb__h5_ds_close(out);
    }
    return st;
}

void
zb__h5_ds_close(zb__h5_ds *d)
{
    if (!d) return;
    zb__h5_lock();
    /* libhdf5 ids are positive: 0 is a zeroed struct that never held one */
    if (d->memtype > 0) H5Tclose(d->memtype);
    if (d->id > 0) H5Oclose(d->id);
    zb__h5_unlock();
    free(d->key);
    ds_reset(d);
}

/* ---- reading strings ------------------------------------------------------------------------- */

/* Under the lock: the n strings of `raw` (vlen: char *[n]; fixed: n * fixed_size bytes) into
 * out. */
static zb_status
gather_strings(const zb__h5_ds *d, const void *raw, uint64_t n, zb_strings *out)
{
    char *const *ptrs = raw;
    const char *fixed = raw;
    uint64_t total = 0;
    out->offsets = malloc((size_t)(n + 1) * sizeof *out->offsets);
    if (!out->offsets)
        return zb__err(ZB_E_NOMEM, "%s: %s: %llu strings", d->path, d->key, (unsigned long long)n);
    out->offsets[0] = 0;
    for (uint64_t i = 0; i < n; i++) {
        total += d->vlen
                     ? (ptrs[i] ? strlen(ptrs[i]) : 0)
                     : zb__h5_fixed_len(fixed + i * d->fixed_size, d->fixed_size, d->space_padded);
        out->offsets[i + 1] = total;
    }
    if (total > ZB_BUF_MAX || !(out->data = malloc(total ? (size_t)total : 1))) {
        zb_strings_free(out);
        return zb__err(ZB_E_NOMEM, "%s: %s: %llu bytes of strings", d->path, d->key,
                       (unsigned long long)total);
    }
    for (uint64_t i = 0; i < n; i++) {
        const char *s = d->vlen ? ptrs[i] : fixed + i * d->fixed_size;
        size_t len = (size_t)(out->offsets[i + 1] - out->offsets[i]);
        if (len) memcpy(out->data + out->offsets[i], s, len);
    }
    out->n = n;
    return ZB_OK;
}

zb_status
zb__h5_ds_read_strings(const zb__h5_ds *d, uint64_t start, uint64_t stop, zb_strings *out)
{
    memset(out, 0, sizeof *out);
    if (d->dtype != ZB_DT_STRING)
        return zb__err(ZB_E_TYPE, "%s: %s holds numbers, not strings", d->path, d->key);
    if (start > stop || stop > d->dims[0])
        return zb__err(ZB_E_RANGE, "%s: %s: rows [%llu, %llu) of %llu", d->path, d->key,
                       (unsigned long long)start, (unsigned long long)stop,
                       (unsigned long long)d->dims[0]);
    uint64_t n = stop - start, bytes;
    size_t each = d->vlen ? sizeof(char *) : d->fixed_size;
    if (!zb__mul_u64(n, each, &bytes) || bytes > ZB_BUF_MAX)
        return zb__err(ZB_E_OVERFLOW, "%s: %s: %llu strings", d->path, d->key,
                       (unsigned long long)n);
    if (n == 0) {
        out->offsets = calloc(1, sizeof *out->offsets);
        return out->offsets ? ZB_OK : zb__err(ZB_E_NOMEM, "%s: %s", d->path, d->key);
    }
    void *raw = calloc(1, (size_t)bytes);
    if (!raw)
        return zb__err(ZB_E_NOMEM, "%s: %s: %llu strings", d->path, d->key, (unsigned long long)n);
    hsize_t hstart = start, count = n;
    zb__h5_lock();
    hid_t fspace = H5Dget_space(d->id), mspace = H5Screate_simple(1, &count, NULL);
    zb_status st = ZB_OK;
    bool read = false;
    if (fspace < 0 || mspace < 0 ||
        H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &hstart, NULL, &count, NULL) < 0 ||
        H5Dread(d->id, d->memtype, mspace, fspace, H5P_DEFAULT, raw) < 0) {
        char what[96];
        snprintf(what, sizeof what, "reading strings [%llu, %llu)", (unsigned long long)start,
                 (unsigned long long)stop);
        st = zb__h5_fail(ZB_E_CORRUPT, d->path, d->key, what);
    } else {
        read = true;
        st = gather_strings(d, raw, n, out);
    }
    if (read && d->vlen) zb__h5_reclaim(d->memtype, mspace, raw);
    if (fspace >= 0) H5Sclose(fspace);
    if (mspace >= 0) H5Sclose(mspace);
    zb__h5_unlock();
    free(raw);
    return st;
}
