/* The matrices of an .h5ad source (h5ad.h): X, raw/X and layers/NAME as anndata writes them.
 *
 * - A sparse matrix is a group with datasets data, indices and indptr: encoding-type csr_matrix
 *   or csc_matrix with a `shape` attribute (anndata >= 0.7), or, before 0.7, the h5sparse form
 *   (attributes h5sparse_format "csr"/"csc" and h5sparse_shape), which anndata still reads.
 *   indices and indptr may be of any integer type (int32 and int64 from scipy; the smallest
 *   unsigned type with anndata's write_csr_csc_indices_with_min_possible_dtype).
 * - A dense matrix is a 2-d dataset [n_obs, n_vars], returned as CSR with its zeros dropped.
 *
 * A block of rows reads indptr[start .. stop] and then only elements [indptr[start],
 * indptr[stop]) of data and indices, so a read costs what it returns. Every indptr value handed
 * out is checked (0 <= v <= nnz, never decreasing) and every index is checked to fit; the
 * bounds of indices against the other dimension are checked once for all backends in
 * zb__src_matrix_read. */
#include <stdlib.h>
#include <string.h>

#include "convert/h5ad.h"
#include "convert/h5ad_io.h"
#include "util/buf.h"
#include "util/intload.h"
#include "util/status.h"

typedef struct h5ad_matrix {
    zb__src_matrix base;
    hid_t file;                      /* the source's (borrowed) */
    const char *var_frame;           /* whose index names the columns: "var" or "raw/var" */
    zb__h5_ds data, indices, indptr; /* sparse */
    zb__h5_ds dense;
    bool raw; /* data and indices lie unfiltered in the file, here (zb__src_matrix_raw): */
    zb__src_raw_array raw_indices, raw_data;
    uint64_t *chunk_at[2]; /* their chunk tables, when chunked */
    int fd;                /* libhdf5's descriptor of the file, for pread (-1 unless raw) */
    bool raw_known;        /* raw was found out (raw_ready, under the lock) */
} h5ad_matrix;

static bool raw_ready(h5ad_matrix *m);

static bool
is_integer(zb_dtype t)
{
    return t >= ZB_DT_INT8 && t <= ZB_DT_UINT64;
}

/* Elements [start, stop) of an integer dataset as int64 (a uint64 above INT64_MAX is corrupt). */
static zb_status
ints_read(const zb__h5_ds *d, uint64_t start, uint64_t stop, int64_t *out)
{
    uint64_t n = stop - start;
    if (d->dtype == ZB_DT_INT64) return zb__h5_ds_read(d, start, stop, out);
    /* narrower values are widened in place, from the last one backwards */
    ZB_TRY(zb__h5_ds_read(d, start, stop, out));
    const uint8_t *raw = (const uint8_t *)out;
    for (uint64_t i = n; i-- > 0;) {
        int64_t v;
        if (!zb__load_int(raw + i * d->item, d->dtype, &v))
            return zb__err(ZB_E_CORRUPT, "%s: %s: element %llu holds a value beyond int64", d->path,
                           d->key, (unsigned long long)(start + i));
        out[i] = v;
    }
    return ZB_OK;
}

/* True when one of the n int32 values at p is negative (the common int32 indices are checked
 * this way, in a loop the compiler vectorises, before any slower look for the culprit). */
static bool
any_negative(const void *p, uint64_t n)
{
    const int32_t *v = p;
    int32_t acc = 0;
    for (uint64_t i = 0; i < n; i++) acc |= v[i];
    return acc < 0;
}

/* Elements [lo, hi) of data or indices, as stored: with pread when they lie unfiltered in the
 * file (raw_ready: no lock, one copy out of the page cache), else through libhdf5. */
static zb_status
elems_read(const h5ad_matrix *m, const zb__h5_ds *d, uint64_t lo, uint64_t hi, void *dst)
{
    if (!m->raw) return zb__h5_ds_read(d, lo, hi, dst);
    const zb__src_raw_array *a = d == &m->data ? &m->raw_data : &m->raw_indices;
    return zb__src_raw_read(m->fd, m->base.path, a, d->item, lo, hi - lo, dst);
}

/* Elements [lo, hi) of indices as uint32 ids; a value that does not fit (negative, or too large
 * for any matrix zbatch reads) is corrupt, named by its element. */
static zb_status
indices_read(const h5ad_matrix *m, uint64_t lo, uint64_t hi, uint32_t *out)
{
    const zb__h5_ds *d = &m->indices;
    uint64_t n = hi - lo;
    void *raw = d->item == sizeof *out ? (void *)out : malloc(n ? (size_t)(n * d->item) : 1);
    if (!raw)
        return zb__err(ZB_E_NOMEM, "%s: %s: %llu indices", d->path, d->key, (unsigned long long)n);
    zb_status st = elems_read(m, d, lo, hi, raw);
    if (st == ZB_OK && d->dtype == ZB_DT_UINT32) return ZB_OK; /* read as they are */
    if (st == ZB_OK && d->dtype == ZB_DT_INT32 && !any_negative(raw, n)) return ZB_OK;
    for (uint64_t i = 0; st == ZB_OK && i < n; i++) {
        int64_t v;
        bool ok = zb__load_int((const uint8_t *)raw + i * d->item, d->dtype, &v);
        if (!ok || v < 0 || v > UINT32_MAX) {
            uint64_t bound =
                m->base.info.layout == ZB_SRC_CSC ? m->base.info.n_rows : m->base.info.n_cols;
            st = zb__err(ZB_E_CORRUPT, "%s: %s: element %llu: index %lld is outside [0, %llu)",
                         d->path, d->key, (unsigned long long)(lo + i), (long long)v,
                         (unsigned long long)bound);
            break;
        }
        out[i] = (uint32_t)v;
    }
    if (raw != out) free(raw);
    return st;
}

/* ---- methods --------------------------------------------------------------------------------- */

static zb_status
m_indptr(zb__src_matrix *base, uint64_t start, uint64_t stop, int64_t *out)
{
    h5ad_matrix *m = (h5ad_matrix *)base;
    const zb__h5_ds *d = &m->indptr;
    ZB_TRY(ints_read(d, start, stop + 1, out));
    int64_t nnz = (int64_t)base->info.nnz;
    for (uint64_t i = 0; i <= stop - start; i++) {
        if (out[i] < 0 || out[i] > nnz)
            return zb__err(ZB_E_CORRUPT, "%s: %s: position %llu holds %lld, outside [0, %lld]",
                           d->path, d->key, (unsigned long long)(start + i), (long long)out[i],
                           (long long)nnz);
        if (i > 0 && out[i] < out[i - 1])
            return zb__err(ZB_E_CORRUPT, "%s: %s decreases at position %llu (%lld after %lld)",
                           d->path, d->key, (unsigned long long)(start + i), (long long)out[i],
                           (long long)out[i - 1]);
    }
    return ZB_OK;
}

static zb_status
sparse_read(h5ad_matrix *m, uint64_t start, uint64_t stop, zb__csr_block *out)
{
    uint64_t n = stop - start;
    zb_dtype dtype = m->base.info.dtype;
    ZB_TRY(zb__csr_block_reserve(out, n, 0, dtype));
    raw_ready(m); /* elems_read's choice */
    ZB_TRY(m_indptr(&m->base, start, stop, out->indptr));
    int64_t lo = out->indptr[0], hi = out->indptr[n];
    uint64_t nnz = (uint64_t)(hi - lo);
    ZB_TRY(zb__csr_block_reserve(out, n, nnz, dtype));
    for (uint64_t r = 0; r <= n; r++) out->indptr[r] -= lo;
    ZB_TRY(elems_read(m, &m->data, (uint64_t)lo, (uint64_t)hi, out->data));
    uint8_t *flags = out->data;
    for (uint64_t i = 0; dtype == ZB_DT_BOOL && i < nnz; i++) flags[i] = flags[i] != 0;
    ZB_TRY(indices_read(m, (uint64_t)lo, (uint64_t)hi, out->indices));
    out->n_rows = n;
    out->nnz = nnz;
    return ZB_OK;
}

static zb_status
dense_read(h5ad_matrix *m, uint64_t start, uint64_t stop, zb__csr_block *out)
{
    const zb__h5_ds *d = &m->dense;
    uint64_t n = stop - start, elems, bytes;
    if (!zb__mul_u64(n, d->dims[1], &elems) || !zb__mul_u64(elems, d->item, &bytes) ||
        bytes > ZB_BUF_MAX)
        return zb__err(ZB_E_OVERFLOW, "%s: %s: %llu dense rows", d->path, d->key,
                       (unsigned long long)n);
    void *rows = malloc(bytes ? (size_t)bytes : 1);
    if (!rows)
        return zb__err(ZB_E_NOMEM, "%s: %s: %llu dense rows", d->path, d->key,
                       (unsigned long long)n);
    zb_status st = zb__h5_ds_read(d, start, stop, rows);
    if (st == ZB_OK) st = zb__csr_from_dense(rows, n, d->dims[1], d->dtype, out);
    free(rows);
    return st;
}

static zb_status
m_read(zb__src_matrix *base, uint64_t start, uint64_t stop, zb__csr_block *out)
{
    h5ad_matrix *m = (h5ad_matrix *)base;
    if (base->info.layout == ZB_SRC_DENSE) return dense_read(m, start, stop, out);
    return sparse_read(m, start, stop, out);
}

static zb_status
m_var_names(zb__src_matrix *base, zb_strings *out)
{
    h5ad_matrix *m = (h5ad_matrix *)base;
    return zb__h5ad_frame_names(m->file, base->path, m->var_frame, base->info.n_cols, out);
}

static void
m_close(zb__src_matrix *base)
{
    h5ad_matrix *m = (h5ad_matrix *)base;
    zb__h5_ds_close(&m->data);
    zb__h5_ds_close(&m->indices);
    zb__h5_ds_close(&m->indptr);
    zb__h5_ds_close(&m->dense);
    free(m->chunk_at[0]);
    free(m->chunk_at[1]);
    free(base->key);
    free(m);
}

static bool
m_raw(zb__src_matrix *base, zb__src_raw *out)
{
    h5ad_matrix *m = (h5ad_matrix *)base;
    if (!raw_ready(m)) return false;
    *out = (zb__src_raw){base->path, m->fd, m->raw_indices, m->raw_data};
    return true;
}

static const zb__src_matrix_methods h5ad_matrix_methods = {
    .raw = m_raw,
    .indptr = m_indptr,
    .read = m_read,
    .var_names = m_var_names,
    .close = m_close,
};

/* ---- opening (under the lock) ---------------------------------------------------------------- */

/* The layout and shape of a sparse group, from encoding-type + shape or the h5sparse attrs. */
static zb_status
sparse_kind(hid_t g, const char *path, const char *key, zb__src_layout *layout, uint64_t shape[2])
{
    bool modern = zb__h5_attr_exists(g, "encoding-type");
    if (!modern && !zb__h5_attr_exists(g, "h5sparse_format"))
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s is a group without an encoding-type", path, key);
    char *enc = NULL;
    ZB_TRY(zb__h5_attr_text(g, modern ? "encoding-type" : "h5sparse_format", path, key, &enc));
    zb_status st = ZB_OK;
    if (!strcmp(enc, modern ? "csr_matrix" : "csr"))
        *layout = ZB_SRC_CSR;
    else if (!strcmp(enc, modern ? "csc_matrix" : "csc"))
        *layout = ZB_SRC_CSC;
    else
        st = zb__err(ZB_E_UNSUPPORTED, "%s: %s: %s '%s' is not a matrix", path, key,
                     modern ? "encoding-type" : "h5sparse_format", enc);
    free(enc);
    if (st == ZB_OK)
        st = zb__h5_attr_u64s(g, modern ? "shape" : "h5sparse_shape", path, key, shape, 2);
    return st;
}

/* Most chunks a raw table holds: 8 bytes each. */
#define RAW_MAX_CHUNKS ((uint64_t)1 << 22)
/* Most chunks a table holds when libhdf5 must be asked chunk by chunk: libhdf5 1.10 finds each
 * chunk's address by walking its chunk index from the start (n^2 / 2 steps for a table); only
 * when zb__h5_chunk_table cannot make it. Beyond that rows go through libhdf5. */
#define SLOW_MAX_CHUNKS ((uint64_t)1 << 14)

/* Under the lock: raw_array's table asked of libhdf5 chunk by chunk; 1 when every chunk is as
 * required, 0 otherwise (zb__h5_chunk_table's answers). */
static int
slow_table(const zb__h5_ds *d, uint64_t n, uint64_t *table)
{
    for (uint64_t c = 0; c < n; c++)
        if (!zb__h5_chunk_addr(d, c, &table[c]) || table[c] % d->item != 0) return 0;
    return 1;
}

/* Under the lock: where the elements of a 1-d dataset lie when it is stored unfiltered in the
 * file itself in native byte order, every offset a multiple of the element size: one extent
 * (H5Dget_offset), or a table of its chunks' offsets (zb__h5_chunk_table, else
 * H5Dget_chunk_info_by_coord; every chunk written). False otherwise (*table then NULL). */
static bool
raw_array(const zb__h5_ds *d, zb__src_raw_array *out, uint64_t **table)
{
    *table = NULL;
    memset(out, 0, sizeof *out);
    if (d->swap || d->rank != 1 || d->n_filters) return false;
    hid_t plist = H5Dget_create_plist(d->id);
    if (plist < 0) {
        H5Eclear2(H5E_DEFAULT);
        return false;
    }
    H5D_layout_t layout = H5Pget_layout(plist);
    bool ok = H5Pget_nfilters(plist) == 0 && H5Pget_external_count(plist) == 0;
    H5Pclose(plist);
    if (ok && layout == H5D_CONTIGUOUS) {
        haddr_t addr = H5Dget_offset(d->id);
        H5Eclear2(H5E_DEFAULT);
        out->at = (uint64_t)addr;
        return addr != HADDR_UNDEF && out->at % d->item == 0;
    }
    if (!ok || layout != H5D_CHUNKED || !d->chunk[0]) return false;
    uint64_t n = (d->dims[0] + d->chunk[0] - 1) / d->chunk[0];
    if (n > RAW_MAX_CHUNKS || !(*table = malloc((size_t)(n ? n : 1) * 8))) return false;
    int made = zb__h5_chunk_table(d, n, *table);
    if (made < 0) made = n <= SLOW_MAX_CHUNKS ? slow_table(d, n, *table) : 0;
    ok = made == 1;
    H5Eclear2(H5E_DEFAULT);
    if (!ok) {
        free(*table);
        *table = NULL;
        return false;
    }
    out->chunk = d->chunk[0];
    out->chunk_at = *table;
    return true;
}

/* Under the lock: whether reading d's first elements and its last through the raw description
 * gives what libhdf5 gives (a guard against an address libhdf5 reports other than the file
 * offset, such as one relative to a user block). */
static bool
raw_agrees(const h5ad_matrix *m, const zb__h5_ds *d, const zb__src_raw_array *a)
{
    uint64_t n = d->dims[0], k = n < 64 ? n : 64;
    unsigned char mine[64 * 8], theirs[64 * 8];
    if (d->item > 8) return false;
    for (int end = 0; end < 2 && n; end++) {
        uint64_t first = end ? n - 1 : 0, count = end ? 1 : k;
        if (zb__src_raw_read(m->fd, m->base.path, a, d->item, first, count, mine) != ZB_OK ||
            zb__h5_ds_read(d, first, first + count, theirs) != ZB_OK ||
            memcmp(mine, theirs, (size_t)(count * d->item)))
            return false;
    }
    return true;
}

/* Whether rows can be read from the file directly (zb__src_matrix_raw), found out on first use
 * under the lock: libhdf5 1.10 walks the whole chunk index for each chunk's address, so only
 * the matrices that are read pay for their tables. Thread-safe. */
static bool
raw_ready(h5ad_matrix *m)
{
    zb__h5_lock();
    if (!m->raw_known) {
        const zb__h5_ds *x = &m->indices;
        m->raw = m->base.info.layout == ZB_SRC_CSR && m->base.info.dtype != ZB_DT_BOOL &&
                 (x->dtype == ZB_DT_INT32 || x->dtype == ZB_DT_UINT32) &&
                 raw_array(&m->data, &m->raw_data, &m->chunk_at[0]) &&
                 raw_array(x, &m->raw_indices, &m->chunk_at[1]);
        /* libhdf5's own descriptor (its default sec2 driver): pread moves no file offset, so
         * its reads and these do not disturb each other, and no descriptor is added per input */
        int *fdp = NULL;
        hid_t fapl = m->raw ? H5Fget_access_plist(m->file) : H5I_INVALID_HID;
        bool sec2 = fapl >= 0 && H5Pget_driver(fapl) == H5FD_SEC2; /* its handle is an int fd */
        if (fapl >= 0) H5Pclose(fapl);
        if (m->raw && (!sec2 || H5Fget_vfd_handle(m->file, H5P_DEFAULT, (void **)&fdp) < 0 ||
                       !fdp || *fdp < 0)) {
            H5Eclear2(H5E_DEFAULT);
            m->raw = false;
        }
        if (m->raw) m->fd = *fdp;
        if (m->raw &&
            (!raw_agrees(m, &m->data, &m->raw_data) || !raw_agrees(m, x, &m->raw_indices)))
            m->raw = false;
        m->raw_known = true;
    }
    bool raw = m->raw;
    zb__h5_unlock();
    return raw;
}

static zb_status
sparse_open(h5ad_matrix *m, hid_t g)
{
    const char *path = m->base.path, *key = m->base.key;
    zb__src_layout layout = ZB_SRC_CSR;
    uint64_t shape[2];
    ZB_TRY(sparse_kind(g, path, key, &layout, shape));
    ZB_TRY(zb__h5_part_open(g, key, "data", path, &m->data));
    ZB_TRY(zb__h5_part_open(g, key, "indices", path, &m->indices));
    ZB_TRY(zb__h5_part_open(g, key, "indptr", path, &m->indptr));
    m->data.whole = m->indices.whole = m->indptr.whole = true;
    if (m->data.dtype == ZB_DT_STRING)
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s: string data", path, m->data.key);
    if (!is_integer(m->indices.dtype) || !is_integer(m->indptr.dtype))
        return zb__err(ZB_E_CORRUPT, "%s: %s: indices of %s and indptr of %s, not integers", path,
                       key, zb_dtype_name(m->indices.dtype), zb_dtype_name(m->indptr.dtype));
    uint64_t major = layout == ZB_SRC_CSC ? shape[1] : shape[0];
    uint64_t minor = layout == ZB_SRC_CSC ? shape[0] : shape[1];
    uint64_t nnz = m->data.dims[0];
    if (m->indptr.dims[0] != major + 1)
        return zb__err(ZB_E_CORRUPT, "%s: %s holds %llu pointers for %llu %s", path, m->indptr.key,
                       (unsigned long long)m->indptr.dims[0], (unsigned long long)major,
                       layout == ZB_SRC_CSC ? "columns" : "rows");
    if (m->indices.dims[0] != nnz)
        return zb__err(ZB_E_CORRUPT, "%s: %s: %llu indices but %llu data elements", path, key,
                       (unsigned long long)m->indices.dims[0], (unsigned long long)nnz);
    if (minor > UINT32_MAX)
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s: %llu %s do not fit 32-bit indices", path, key,
                       (unsigned long long)minor, layout == ZB_SRC_CSC ? "rows" : "columns");
    m->base.info = (zb__src_matrix_info){layout, m->data.dtype, shape[0], shape[1], nnz};
    /* FORMATS.md §6: indptr starts at 0 and ends at len(data) */
    int64_t ends[2];
    ZB_TRY(ints_read(&m->indptr, 0, 1, &ends[0]));
    ZB_TRY(ints_read(&m->indptr, major, major + 1, &ends[1]));
    if (ends[0] != 0 || ends[1] != (int64_t)nnz)
        return zb__err(ZB_E_CORRUPT,
                       "%s: %s runs from %lld to %lld, not from 0 to %llu (the "
                       "length of data)",
                       path, m->indptr.key, (long long)ends[0], (long long)ends[1],
                       (unsigned long long)nnz);
    return ZB_OK;
}

/* Takes obj over. */
static zb_status
dense_open(h5ad_matrix *m, hid_t obj)
{
    const char *path = m->base.path, *key = m->base.key;
    zb_status st = ZB_OK;
    if (zb__h5_attr_exists(obj, "encoding-type")) {
        char *enc = NULL;
        st = zb__h5_attr_text(obj, "encoding-type", path, key, &enc);
        if (st == ZB_OK && strcmp(enc, "array"))
            st = zb__err(ZB_E_UNSUPPORTED, "%s: %s: encoding-type '%s' is not a matrix", path, key,
                         enc);
        free(enc);
    }
    if (st != ZB_OK) {
        H5Oclose(obj);
        return st;
    }
    ZB_TRY(zb__h5_ds_from_id(obj, path, key, &m->dense));
    const zb__h5_ds *d = &m->dense;
    if (d->rank != 2 || d->dtype == ZB_DT_STRING)
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s is a %d-d array of %s, not a matrix", path, key,
                       d->rank, zb_dtype_name(d->dtype));
    uint64_t nnz;
    if (d->dims[1] > UINT32_MAX || !zb__mul_u64(d->dims[0], d->dims[1], &nnz))
        return zb__err(ZB_E_UNSUPPORTED, "%s: %s: %llu columns do not fit 32-bit indices", path,
                       key, (unsigned long long)d->dims[1]);
    m->base.info = (zb__src_matrix_info){ZB_SRC_DENSE, d->dtype, d->dims[0], d->dims[1], nnz};
    return ZB_OK;
}

/* The dataframe naming a matrix's columns, or NULL for a key that is not a matrix's. */
static const char *
var_frame_of(const char *key)
{
    if (!strcmp(key, "X")) return "var";
    if (!strcmp(key, "raw/X")) return "raw/var";
    if (!strncmp(key, "layers/", 7) && key[7] && !strchr(key + 7, '/')) return "var";
    return NULL;
}

static zb_status
open_locked(h5ad_matrix *m, uint64_t n_obs)
{
    const char *path = m->base.path, *key = m->base.key;
    if (!zb__h5_exists(m->file, key)) return zb__err(ZB_E_NOTFOUND, "%s: no matrix %s", path, key);
    hid_t obj = H5Oopen(m->file, key, H5P_DEFAULT);
    if (obj < 0) return zb__h5_fail(ZB_E_CORRUPT, path, key, "opening it");
    zb_status st;
    if (H5Iget_type(obj) == H5I_GROUP) {
        st = sparse_open(m, obj);
        H5Oclose(obj);
    } else {
        st = dense_open(m, obj);
    }
    if (st == ZB_OK && m->base.info.n_rows != n_obs)
        st = zb__err(ZB_E_CORRUPT, "%s: %s has %llu rows but obs has %llu", path, key,
                     (unsigned long long)m->base.info.n_rows, (unsigned long long)n_obs);
    return st;
}

zb_status
zb__h5ad_matrix_open(hid_t file, const char *path, uint64_t n_obs, const char *key,
                     zb__src_matrix **out)
{
    *out = NULL;
    const char *var_frame = var_frame_of(key);
    if (!var_frame)
        return zb__err(ZB_E_INVALID, "%s: '%s' is not a matrix key (X, raw/X or layers/NAME)", path,
                       key);
    h5ad_matrix *m = calloc(1, sizeof *m);
    if (!m || !(m->base.key = strdup(key))) {
        free(m);
        return zb__err(ZB_E_NOMEM, "%s: %s", path, key);
    }
    m->base.methods = &h5ad_matrix_methods;
    m->base.path = path;
    m->fd = -1;
    m->file = file;
    m->var_frame = var_frame;
    zb__h5_lock();
    zb_status st = open_locked(m, n_obs);
    zb__h5_unlock();
    if (st != ZB_OK) {
        m_close(&m->base);
        return st;
    }
    *out = &m->base;
    return ZB_OK;
}
