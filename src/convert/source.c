/* The backend-neutral half of a conversion source (source.h): opening by what the path holds,
 * the matrix cache, and the reusable row and column blocks. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert/source.h"
#include "util/buf.h"
#include "util/status.h"

zb_status
zb__csr_block_reserve(zb__csr_block *b, uint64_t n_rows, uint64_t nnz, zb_dtype dtype)
{
    size_t item = zb_dtype_size(dtype);
    uint64_t data_bytes;
    if (n_rows >= ZB_BUF_MAX / 8 || nnz >= ZB_BUF_MAX / 4 || !zb__mul_u64(nnz, item, &data_bytes) ||
        data_bytes > ZB_BUF_MAX)
        return zb__err(ZB_E_OVERFLOW, "a block of %llu rows and %llu elements is too large",
                       (unsigned long long)n_rows, (unsigned long long)nnz);
    if (n_rows + 1 > b->cap_rows) {
        int64_t *p = realloc(b->indptr, (size_t)(n_rows + 1) * sizeof *p);
        if (!p) return zb__err(ZB_E_NOMEM, "a block of %llu rows", (unsigned long long)n_rows);
        b->indptr = p;
        b->cap_rows = n_rows + 1;
    }
    if (nnz > b->cap_nnz || !b->indices) {
        uint32_t *p = realloc(b->indices, (size_t)(nnz ? nnz : 1) * sizeof *p);
        if (!p) return zb__err(ZB_E_NOMEM, "a block of %llu elements", (unsigned long long)nnz);
        b->indices = p;
        b->cap_nnz = nnz ? nnz : 1;
    }
    if (data_bytes > b->cap_data_bytes || !b->data) {
        void *p = realloc(b->data, data_bytes ? (size_t)data_bytes : 1);
        if (!p) return zb__err(ZB_E_NOMEM, "a block of %llu elements", (unsigned long long)nnz);
        b->data = p;
        b->cap_data_bytes = data_bytes ? (size_t)data_bytes : 1;
    }
    b->dtype = dtype;
    return ZB_OK;
}

void
zb__csr_block_free(zb__csr_block *b)
{
    if (!b) return;
    free(b->indptr);
    free(b->indices);
    free(b->data);
    memset(b, 0, sizeof *b);
}

void
zb__col_block_free(zb__col_block *b)
{
    if (!b) return;
    free(b->values);
    free(b->mask);
    zb_strings_free(&b->strings);
    memset(b, 0, sizeof *b);
}

void
zb__col_info_free(zb__col_info *ci)
{
    free((char *)ci->name);
    if (ci->categories) {
        zb_strings_free((zb_strings *)ci->categories);
        free((zb_strings *)ci->categories);
    }
    free((void *)ci->category_values);
    memset(ci, 0, sizeof *ci);
}

void
zb__src_common_free(zb__src_common *c)
{
    free(c->path);
    for (size_t i = 0; i < c->n_columns; i++) zb__col_info_free(&c->columns[i]);
    free(c->columns);
    for (size_t i = 0; i < c->n_skipped; i++) free(c->skipped[i]);
    free(c->skipped);
    memset(c, 0, sizeof *c);
}

zb_status
zb__src_skip_column(zb__src_common *c, const char *name)
{
    const char *why = zb_last_error();
    size_t len = strlen(name) + strlen(why) + 2;
    char *entry = malloc(len), **list = realloc(c->skipped, (c->n_skipped + 1) * sizeof *list);
    if (list) c->skipped = list;
    if (!entry || !list) {
        free(entry);
        return zb__err(ZB_E_NOMEM, "%s: obs column %s", c->path, name);
    }
    snprintf(entry, len, "%s\t%s", name, why);
    c->skipped[c->n_skipped++] = entry;
    zb_clear_error();
    return ZB_OK;
}

const char *
zb__src_skipped_reason(const zb__src_common *c, const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; i < c->n_skipped; i++)
        if (!strncmp(c->skipped[i], name, n) && c->skipped[i][n] == '\t')
            return c->skipped[i] + n + 1;
    return NULL;
}

/* HDF5 files hold this signature at offset 0, or after a user block at 512, 1024, 2048, ...
 * (the HDF5 file format's superblock search; h5py writes one when asked, userblock_size). */
static bool
is_hdf5(const char *path)
{
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool yes = false;
    for (off_t at = 0; !yes; at = at ? 2 * at : 512) {
        unsigned char head[8];
        if (pread(fd, head, 8, at) != 8) break;
        yes = !memcmp(head, sig, 8);
    }
    close(fd);
    return yes;
}

zb_status
zb__src_open(const char *path, zb__src **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb__src_open: NULL out");
    *out = NULL;
    if (!path || !*path) return zb__err(ZB_E_INVALID, "zb__src_open: empty path");
    struct stat sb;
    if (stat(path, &sb) != 0)
        return zb__err(errno == ENOENT ? ZB_E_NOTFOUND : ZB_E_IO, "%s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) return zb__src_open_zarr(path, out);
    if (S_ISREG(sb.st_mode) && is_hdf5(path)) return zb__src_open_h5ad(path, out);
    return zb__err(ZB_E_UNSUPPORTED,
                   "%s: neither an .h5ad file (no HDF5 signature) nor a Zarr store directory",
                   path);
}

void
zb__src_close(zb__src *src)
{
    if (!src) return;
    zb__src_matrix *m = src->matrices;
    while (m) {
        zb__src_matrix *next = m->next;
        zb__src_matrix_close(m);
        m = next;
    }
    src->matrices = NULL;
    src->methods->close(src);
}

zb_status
zb__src_find_column(const zb__src *src, const char *name, size_t *index)
{
    for (size_t i = 0; i < src->c.n_columns; i++) {
        if (!strcmp(src->c.columns[i].name, name)) {
            *index = i;
            return ZB_OK;
        }
    }
    return zb__err(ZB_E_NOTFOUND, "%s: no obs column '%s'", src->c.path, name);
}

zb_status
zb__src_matrix_get(zb__src *src, const char *key, zb__src_matrix **out)
{
    *out = NULL;
    for (zb__src_matrix *m = src->matrices; m; m = m->next) {
        if (!strcmp(m->key, key)) {
            *out = m;
            return ZB_OK;
        }
    }
    zb__src_matrix *m = NULL;
    ZB_TRY(src->methods->matrix_open(src, key, &m));
    m->next = src->matrices;
    src->matrices = m;
    *out = m;
    return ZB_OK;
}

const zb__src_matrix_info *
zb__src_matrix_info_of(const zb__src_matrix *m)
{
    return &m->info;
}

zb_status
zb__src_pread(int fd, const char *path, void *dst, uint64_t len, uint64_t off)
{
    unsigned char *p = dst;
    while (len) {
        ssize_t r =
            pread(fd, p, len > ((uint64_t)1 << 30) ? (size_t)1 << 30 : (size_t)len, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return zb__err(ZB_E_IO, "%s: read at %" PRIu64 ": %s", path, off, strerror(errno));
        if (r == 0)
            return zb__err(ZB_E_TRUNCATED, "%s: ends before byte %" PRIu64, path, off + len);
        p += r;
        off += (uint64_t)r;
        len -= (uint64_t)r;
    }
    return ZB_OK;
}

zb_status
zb__src_map_open(int fd, const char *path, uint64_t limit, zb__src_map *out)
{
    out->base = NULL;
    out->len = 0;
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return zb__err(ZB_E_IO, "%s: cannot stat it: %s", path, strerror(errno));
    if (sb.st_size <= 0 || (uint64_t)sb.st_size > limit) return ZB_OK;
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return zb__err(ZB_E_IO, "%s: cannot map it (%lld bytes): %s", path, (long long)sb.st_size,
                       strerror(errno));
    out->base = p;
    out->len = (uint64_t)sb.st_size;
    return ZB_OK;
}

void
zb__src_map_close(zb__src_map *m)
{
    if (m->base) munmap((void *)m->base, (size_t)m->len);
    m->base = NULL;
    m->len = 0;
}

/* The bytes [at, at + len) of the mapping, or ZB_E_TRUNCATED when the file ends first. */
static zb_status
map_range(const zb__src_map *m, const char *path, uint64_t at, uint64_t len,
          const unsigned char **out)
{
    if (at > m->len || len > m->len - at)
        return zb__err(ZB_E_TRUNCATED, "%s: ends before byte %" PRIu64, path, at + len);
    *out = m->base + at;
    return ZB_OK;
}

/* Elements [first, first + n) of raw array a into dst, extent by extent: from the mapping m,
 * or (m NULL) read from fd. */
static zb_status
raw_copy(int fd, const zb__src_map *m, const char *path, const zb__src_raw_array *a, size_t item,
         uint64_t first, uint64_t n, unsigned char *dst)
{
    while (n) {
        uint64_t run, at = zb__src_raw_at(a, item, first, &run);
        if (run > n) run = n;
        if (m) {
            const unsigned char *src = NULL;
            ZB_TRY(map_range(m, path, at, run * item, &src));
            memcpy(dst, src, (size_t)(run * item));
        } else {
            ZB_TRY(zb__src_pread(fd, path, dst, run * item, at));
        }
        dst += run * item;
        first += run;
        n -= run;
    }
    return ZB_OK;
}

zb_status
zb__src_raw_read(int fd, const char *path, const zb__src_raw_array *a, size_t item, uint64_t first,
                 uint64_t n, void *dst)
{
    return raw_copy(fd, NULL, path, a, item, first, n, dst);
}

zb_status
zb__src_raw_view(const zb__src_map *m, const char *path, const zb__src_raw_array *a, size_t item,
                 uint64_t first, uint64_t n, zb__buf *spill, const uint8_t **out)
{
    static const uint64_t none = 0;
    if (n == 0) { /* an empty row may start at the array's end, past the chunk table */
        *out = (const uint8_t *)&none;
        return ZB_OK;
    }
    uint64_t run, at = zb__src_raw_at(a, item, first, &run);
    if (run >= n) return map_range(m, path, at, n * item, out);
    /* the elements straddle chunks: gathered into spill, one copy as pread would make */
    ZB_TRY(zb__buf_reserve(spill, (size_t)(n * item)));
    *out = spill->data;
    return raw_copy(-1, m, path, a, item, first, n, spill->data);
}

bool
zb__src_matrix_raw(zb__src_matrix *m, zb__src_raw *out)
{
    if (m->info.layout != ZB_SRC_CSR || m->info.dtype == ZB_DT_BOOL || !m->methods->raw)
        return false;
    /* element-aligned offsets (zb__src_raw); a backend with chunks checks its table itself */
    return m->methods->raw(m, out) && out->indices.at % 4 == 0 &&
           out->data.at % zb_dtype_size(m->info.dtype) == 0;
}

zb_status
zb__src_matrix_indptr(zb__src_matrix *m, uint64_t start, uint64_t stop, int64_t *out)
{
    uint64_t limit = m->info.layout == ZB_SRC_CSC ? m->info.n_cols : m->info.n_rows;
    if (start > stop || stop > limit)
        return zb__err(ZB_E_RANGE, "%s: %s: pointers [%llu, %llu] of %llu", m->path, m->key,
                       (unsigned long long)start, (unsigned long long)stop,
                       (unsigned long long)limit);
    if (m->info.layout == ZB_SRC_DENSE) {
        for (uint64_t i = start; i <= stop; i++) out[i - start] = (int64_t)(i * m->info.n_cols);
        return ZB_OK;
    }
    return m->methods->indptr(m, start, stop, out);
}

/* Every backend's block is checked here, once: pointers from 0 to nnz without a decrease,
 * every index inside the other dimension. Storage is hostile (STYLE.md habit 6); a bad block
 * never reaches the converter. */
static zb_status
check_block(const zb__src_matrix *m, uint64_t start, const zb__csr_block *b)
{
    bool csc = m->info.layout == ZB_SRC_CSC;
    const char *unit = csc ? "column" : "row";
    uint64_t bound = csc ? m->info.n_rows : m->info.n_cols;
    if (b->indptr[0] != 0 || (uint64_t)b->indptr[b->n_rows] != b->nnz)
        return zb__err(ZB_E_CORRUPT,
                       "%s: %s: the block of %ss from %llu holds %llu elements "
                       "but its pointers span [%lld, %lld]",
                       m->path, m->key, unit, (unsigned long long)start, (unsigned long long)b->nnz,
                       (long long)b->indptr[0], (long long)b->indptr[b->n_rows]);
    for (uint64_t r = 0; r < b->n_rows; r++) {
        int64_t lo = b->indptr[r], hi = b->indptr[r + 1];
        if (hi < lo)
            return zb__err(ZB_E_CORRUPT, "%s: %s/indptr decreases at %s %llu (%lld after %lld)",
                           m->path, m->key, unit, (unsigned long long)(start + r), (long long)hi,
                           (long long)lo);
        for (int64_t e = lo; e < hi; e++)
            if (b->indices[e] >= bound)
                return zb__err(ZB_E_CORRUPT,
                               "%s: %s/indices: %s %llu, element %lld: index %u is outside "
                               "[0, %llu)",
                               m->path, m->key, unit, (unsigned long long)(start + r), (long long)e,
                               b->indices[e], (unsigned long long)bound);
    }
    return ZB_OK;
}

zb_status
zb__src_matrix_read(zb__src_matrix *m, uint64_t start, uint64_t stop, zb__csr_block *out)
{
    uint64_t limit = m->info.layout == ZB_SRC_CSC ? m->info.n_cols : m->info.n_rows;
    if (start > stop || stop > limit)
        return zb__err(ZB_E_RANGE, "%s: %s: rows [%llu, %llu) of %llu", m->path, m->key,
                       (unsigned long long)start, (unsigned long long)stop,
                       (unsigned long long)limit);
    ZB_TRY(m->methods->read(m, start, stop, out));
    if (out->n_rows != stop - start)
        return zb__err(ZB_E_CORRUPT, "%s: %s: asked for %llu rows from %llu, got %llu", m->path,
                       m->key, (unsigned long long)(stop - start), (unsigned long long)start,
                       (unsigned long long)out->n_rows);
    return check_block(m, start, out);
}

zb_status
zb__src_matrix_var_names(zb__src_matrix *m, zb_strings *out)
{
    return m->methods->var_names(m, out);
}

void
zb__src_matrix_close(zb__src_matrix *m)
{
    if (!m) return;
    m->methods->close(m);
}

/* ---- for backends ------------------------------------------------------------------------------ */

/* The shortest "%.{p}e"/"%.{p}g" precision whose text reads back as `v` in its own type. */
static int
shortest_digits(double v, bool single)
{
    char tmp[64];
    for (int p = 1; p < 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, v);
        double back = strtod(tmp, NULL);
        if (single ? (float)back == (float)v : back == v) return p;
    }
    return 17;
}

/* Python's repr of a float from its shortest digits: fixed notation for decimal exponents in
 * [-4, 16) with at least one digit after the point, else d.ddde+XX. */
static size_t
float_text(double v, bool single, char *buf, size_t cap)
{
    if (isnan(v)) return (size_t)snprintf(buf, cap, "nan");
    if (isinf(v)) return (size_t)snprintf(buf, cap, "%s", v < 0 ? "-inf" : "inf");
    int p = shortest_digits(v, single);
    char sci[64];
    snprintf(sci, sizeof sci, "%.*e", p - 1, v);
    char *e = strchr(sci, 'e');
    int exp10 = atoi(e + 1);
    if (exp10 < -4 || exp10 >= 16) {
        /* mantissa digits, then e, sign and at least two exponent digits */
        *e = '\0';
        return (size_t)snprintf(buf, cap, "%se%c%02d", sci, exp10 < 0 ? '-' : '+', abs(exp10));
    }
    int decimals = p - 1 - exp10;
    if (decimals < 1) decimals = 1;
    return (size_t)snprintf(buf, cap, "%.*f", decimals, v);
}

size_t
zb__src_category_text(zb_dtype dtype, const void *value, char *buf, size_t cap)
{
    const unsigned char *p = value;
    switch (dtype) {
    case ZB_DT_BOOL:
        return (size_t)snprintf(buf, cap, "%s", *p ? "True" : "False");
    case ZB_DT_INT8:
        return (size_t)snprintf(buf, cap, "%d", *(const int8_t *)p);
    case ZB_DT_INT16: {
        int16_t v;
        memcpy(&v, p, 2);
        return (size_t)snprintf(buf, cap, "%d", v);
    }
    case ZB_DT_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        return (size_t)snprintf(buf, cap, "%d", v);
    }
    case ZB_DT_INT64: {
        int64_t v;
        memcpy(&v, p, 8);
        return (size_t)snprintf(buf, cap, "%lld", (long long)v);
    }
    case ZB_DT_UINT8:
        return (size_t)snprintf(buf, cap, "%u", *p);
    case ZB_DT_UINT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return (size_t)snprintf(buf, cap, "%u", v);
    }
    case ZB_DT_UINT32: {
        uint32_t v;
        memcpy(&v, p, 4);
        return (size_t)snprintf(buf, cap, "%u", v);
    }
    case ZB_DT_UINT64: {
        uint64_t v;
        memcpy(&v, p, 8);
        return (size_t)snprintf(buf, cap, "%llu", (unsigned long long)v);
    }
    case ZB_DT_FLOAT32: {
        float v;
        memcpy(&v, p, 4);
        return float_text(v, true, buf, cap);
    }
    case ZB_DT_FLOAT64: {
        double v;
        memcpy(&v, p, 8);
        return float_text(v, false, buf, cap);
    }
    default:
        return (size_t)snprintf(buf, cap, "?");
    }
}

zb_status
zb__src_set_numeric_categories(zb__col_info *c, zb_dtype dtype, const void *values, uint64_t n)
{
    size_t item = zb_dtype_size(dtype);
    zb_strings *s = calloc(1, sizeof *s);
    void *copy = malloc(n ? (size_t)n * item : 1);
    if (s) s->offsets = malloc((size_t)(n + 1) * sizeof *s->offsets);
    if (s) s->data = malloc((size_t)n * 40 + 1);
    if (!s || !copy || !s->offsets || !s->data) {
        if (s) zb_strings_free(s);
        free(s);
        free(copy);
        return zb__err(ZB_E_NOMEM, "%s: %llu categories", c->name, (unsigned long long)n);
    }
    memcpy(copy, values, (size_t)n * item);
    uint64_t at = 0;
    s->offsets[0] = 0;
    for (uint64_t i = 0; i < n; i++) {
        at += zb__src_category_text(dtype, (const char *)values + i * item, s->data + at, 40);
        s->offsets[i + 1] = at;
    }
    s->n = n;
    c->categories = s;
    c->category_values = copy;
    c->dtype = dtype;
    return ZB_OK;
}

zb_status
zb__col_block_reserve(zb__col_block *b, uint64_t n, size_t value_bytes, bool mask)
{
    uint64_t bytes;
    if (!zb__mul_u64(n, value_bytes, &bytes) || bytes > ZB_BUF_MAX || n > ZB_BUF_MAX)
        return zb__err(ZB_E_OVERFLOW, "a column block of %llu values", (unsigned long long)n);
    if (value_bytes && bytes > b->cap_values_bytes) {
        void *p = realloc(b->values, (size_t)bytes);
        if (!p) return zb__err(ZB_E_NOMEM, "a column block of %llu values", (unsigned long long)n);
        b->values = p;
        b->cap_values_bytes = (size_t)bytes;
    }
    if (mask && (n > b->cap_mask || !b->mask)) {
        uint8_t *p = realloc(b->mask, n ? (size_t)n : 1);
        if (!p) return zb__err(ZB_E_NOMEM, "a column mask of %llu values", (unsigned long long)n);
        b->mask = p;
        b->cap_mask = n ? (size_t)n : 1;
    }
    b->n = n;
    return ZB_OK;
}

/* True when the element at p (of `item` bytes, `dtype`) is zero: integers and bools by their
 * bytes, floats by value (so -0.0 is zero and NaN is not). */
static bool
is_zero(const unsigned char *p, zb_dtype dtype, size_t item)
{
    switch (dtype) {
    case ZB_DT_FLOAT32: {
        float v;
        memcpy(&v, p, 4);
        return v == 0.0f;
    }
    case ZB_DT_FLOAT64: {
        double v;
        memcpy(&v, p, 8);
        return v == 0.0;
    }
    case ZB_DT_FLOAT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return (v & 0x7fff) == 0;
    }
    default:
        for (size_t i = 0; i < item; i++)
            if (p[i]) return false;
        return true;
    }
}

zb_status
zb__csr_from_dense(const void *rows, uint64_t n_rows, uint64_t n_cols, zb_dtype dtype,
                   zb__csr_block *out)
{
    size_t item = zb_dtype_size(dtype);
    const unsigned char *src = rows;
    uint64_t nnz = 0, total;
    if (!zb__mul_u64(n_rows, n_cols, &total))
        return zb__err(ZB_E_OVERFLOW, "a dense block of %llu x %llu", (unsigned long long)n_rows,
                       (unsigned long long)n_cols);
    for (uint64_t i = 0; i < total; i++)
        if (!is_zero(src + i * item, dtype, item)) nnz++;
    ZB_TRY(zb__csr_block_reserve(out, n_rows, nnz, dtype));
    uint64_t k = 0;
    out->indptr[0] = 0;
    for (uint64_t r = 0; r < n_rows; r++) {
        const unsigned char *row = src + r * n_cols * item;
        for (uint64_t c = 0; c < n_cols; c++) {
            if (is_zero(row + c * item, dtype, item)) continue;
            out->indices[k] = (uint32_t)c;
            memcpy((unsigned char *)out->data + k * item, row + c * item, item);
            k++;
        }
        out->indptr[r + 1] = (int64_t)k;
    }
    out->n_rows = n_rows;
    out->nnz = nnz;
    return ZB_OK;
}
