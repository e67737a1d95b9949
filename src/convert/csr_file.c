/* The scratch CSR file: what zb__csc_transpose (transpose.c) writes and zb__csr_file_open serves
 * as a CSR zb__src_matrix, so the converter reads a CSC input by row block like any other.
 *
 * Format, version 1. Numbers are in the byte order of the machine that wrote the file (it lives
 * for one conversion on one machine; the byte-order mark refuses it anywhere else):
 *
 *   offset             bytes            field
 *   0                  8                magic "ZBCSR\r\n\x1a" (a text-mode copy or a truncation
 *                                       at the first line ending breaks it, as PNG's does)
 *   8                  4                version, uint32: 1
 *   12                 4                byte-order mark, uint32 0x01020304
 *   16                 16               dtype of data: its Zarr v3 name ("float32"), NUL-padded
 *   32                 8                n_rows, uint64 (<= 2^32: row ids of a CSC block are uint32)
 *   40                 8                n_cols, uint64 (<= 2^32: column ids are uint32)
 *   48                 8                nnz, uint64
 *   56                 8                zero (reserved)
 *   64                 8 (n_rows + 1)   indptr, int64: row r holds elements
 *                                       [indptr[r], indptr[r+1]); indptr[0] = 0, last = nnz
 *   64 + 8 (n_rows+1)  4 nnz            indices, uint32 column ids, ascending within a row
 *   ... + 4 nnz        item nnz         data, elements of dtype, bit for bit as in the source
 *
 * The file is exactly that long. A foreign, truncated or extended file is refused at open
 * (ZB_E_CORRUPT naming it). indptr is checked slice by slice as reads use it (monotone, within
 * [0, nnz]), not at open, so opening costs one header read whatever the size.
 *
 * Reads use pread on one descriptor: any number of threads may read rows at once.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert/csr_file.h"
#include "util/buf.h"
#include "util/status.h"

#define MAGIC "ZBCSR\r\n\x1a"
#define VERSION 1u
#define BYTE_ORDER_MARK 0x01020304u
#define DTYPE_FIELD 16

typedef struct csr_file {
    zb__src_matrix base; /* first: the methods see a zb__src_matrix */
    int fd;
    char *path; /* owned copies behind base.path and base.key */
    char *key;
    zb__src_matrix *names_of; /* borrowed: the CSC matrix the file was made from */
    zb__csr_file_layout lay;
    size_t item;
} csr_file;

zb_status
zb__csr_file_layout_of(uint64_t n_rows, uint64_t nnz, size_t item, zb__csr_file_layout *out)
{
    uint64_t ptr_bytes, idx_bytes, data_bytes, size;
    if (n_rows >= UINT64_MAX / 8 || !zb__mul_u64(n_rows + 1, 8, &ptr_bytes) ||
        !zb__mul_u64(nnz, 4, &idx_bytes) || !zb__mul_u64(nnz, item, &data_bytes) ||
        !zb__add_u64(ZB_CSR_FILE_HEADER_BYTES, ptr_bytes, &size) ||
        !zb__add_u64(size, idx_bytes, &size) || !zb__add_u64(size, data_bytes, &size) ||
        size > (uint64_t)INT64_MAX)
        return zb__err(ZB_E_OVERFLOW, "a CSR file of %llu rows and %llu elements is too large",
                       (unsigned long long)n_rows, (unsigned long long)nnz);
    out->indptr = ZB_CSR_FILE_HEADER_BYTES;
    out->indices = out->indptr + ptr_bytes;
    out->data = out->indices + idx_bytes;
    out->size = size;
    return ZB_OK;
}

void
zb__csr_file_header(uint8_t out[ZB_CSR_FILE_HEADER_BYTES], zb_dtype dtype, uint64_t n_rows,
                    uint64_t n_cols, uint64_t nnz)
{
    uint32_t version = VERSION, bom = BYTE_ORDER_MARK;
    memset(out, 0, ZB_CSR_FILE_HEADER_BYTES);
    memcpy(out, MAGIC, 8);
    memcpy(out + 8, &version, 4);
    memcpy(out + 12, &bom, 4);
    strncpy((char *)out + 16, zb_dtype_name(dtype), DTYPE_FIELD - 1);
    memcpy(out + 32, &n_rows, 8);
    memcpy(out + 40, &n_cols, 8);
    memcpy(out + 48, &nnz, 8);
}

/* Reads exactly n bytes at `offset`; a file that ends first is ZB_E_CORRUPT (it was checked
 * long enough at open, so something cut it since). */
static zb_status
read_at(const csr_file *f, void *dst, size_t n, uint64_t offset)
{
    uint8_t *p = dst;
    while (n > 0) {
        ssize_t got = pread(f->fd, p, n, (off_t)offset);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0)
            return zb__err(ZB_E_IO, "%s: read of %zu bytes at %llu: %s", f->path, n,
                           (unsigned long long)offset, strerror(errno));
        if (got == 0)
            return zb__err(ZB_E_CORRUPT, "%s: the file ends at byte %llu (truncated since open)",
                           f->path, (unsigned long long)offset);
        p += got;
        n -= (size_t)got;
        offset += (uint64_t)got;
    }
    return ZB_OK;
}

/* Checks a slice of indptr starting at row `start`: monotone and within [0, nnz]. */
static zb_status
check_indptr(const csr_file *f, uint64_t start, const int64_t *p, uint64_t n)
{
    int64_t nnz = (int64_t)f->base.info.nnz;
    for (uint64_t i = 0; i < n; i++) {
        if (p[i] < 0 || p[i] > nnz || (i > 0 && p[i] < p[i - 1]))
            return zb__err(ZB_E_CORRUPT, "%s: indptr[%llu] = %lld (previous %lld, nnz %lld)",
                           f->path, (unsigned long long)(start + i), (long long)p[i],
                           (long long)(i > 0 ? p[i - 1] : 0), (long long)nnz);
    }
    return ZB_OK;
}

static zb_status
file_indptr(zb__src_matrix *m, uint64_t start, uint64_t stop, int64_t *out)
{
    csr_file *f = (csr_file *)m;
    uint64_t n = stop - start + 1;
    ZB_TRY(read_at(f, out, (size_t)(n * 8), f->lay.indptr + start * 8));
    return check_indptr(f, start, out, n);
}

static zb_status
file_read(zb__src_matrix *m, uint64_t start, uint64_t stop, zb__csr_block *out)
{
    csr_file *f = (csr_file *)m;
    uint64_t rows = stop - start;
    ZB_TRY(zb__csr_block_reserve(out, rows, 0, m->info.dtype));
    ZB_TRY(file_indptr(m, start, stop, out->indptr));
    int64_t lo = out->indptr[0], hi = out->indptr[rows];
    uint64_t nnz = (uint64_t)(hi - lo);
    ZB_TRY(zb__csr_block_reserve(out, rows, nnz, m->info.dtype));
    ZB_TRY(read_at(f, out->indices, (size_t)nnz * 4, f->lay.indices + (uint64_t)lo * 4));
    ZB_TRY(read_at(f, out->data, (size_t)nnz * f->item, f->lay.data + (uint64_t)lo * f->item));
    for (uint64_t r = 0; r <= rows; r++) out->indptr[r] -= lo;
    out->n_rows = rows;
    out->nnz = nnz;
    return ZB_OK;
}

static zb_status
file_var_names(zb__src_matrix *m, zb_strings *out)
{
    csr_file *f = (csr_file *)m;
    if (!f->names_of)
        return zb__err(ZB_E_NOTFOUND, "%s: no matrix to take var names from", f->path);
    return zb__src_matrix_var_names(f->names_of, out);
}

static void
file_close(zb__src_matrix *m)
{
    csr_file *f = (csr_file *)m;
    if (f->fd >= 0) close(f->fd);
    free(f->path);
    free(f->key);
    free(f);
}

static bool
file_raw(zb__src_matrix *m, zb__src_raw *out)
{
    const csr_file *f = (const csr_file *)m;
    *out = (zb__src_raw){f->path, f->fd, {f->lay.indices, 0, NULL}, {f->lay.data, 0, NULL}};
    return true;
}

static const zb__src_matrix_methods csr_file_methods = {
    .raw = file_raw,
    .indptr = file_indptr,
    .read = file_read,
    .var_names = file_var_names,
    .close = file_close,
};

/* The dtype whose v3 name is the NUL-padded `field`, or ZB_DT_COUNT_. */
static zb_dtype
dtype_named(const char *field)
{
    char name[DTYPE_FIELD + 1];
    memcpy(name, field, DTYPE_FIELD);
    name[DTYPE_FIELD] = '\0';
    for (int d = 0; d < ZB_DT_COUNT_; d++)
        if (d != ZB_DT_STRING && !strcmp(name, zb_dtype_name((zb_dtype)d))) return (zb_dtype)d;
    return ZB_DT_COUNT_;
}

/* Checks the header against the file's size and fills f's info and layout. */
static zb_status
parse_header(csr_file *f, const uint8_t *h, uint64_t file_size)
{
    uint32_t version, bom;
    memcpy(&version, h + 8, 4);
    memcpy(&bom, h + 12, 4);
    if (memcmp(h, MAGIC, 8) != 0)
        return zb__err(ZB_E_CORRUPT, "%s: not a zbatch CSR scratch file (bad magic)", f->path);
    if (bom != BYTE_ORDER_MARK)
        return zb__err(ZB_E_CORRUPT, "%s: written on a machine of the other byte order", f->path);
    if (version != VERSION)
        return zb__err(ZB_E_CORRUPT, "%s: CSR scratch file version %u (this build reads %u)",
                       f->path, version, VERSION);
    zb_dtype dtype = dtype_named((const char *)h + 16);
    if (dtype == ZB_DT_COUNT_)
        return zb__err(ZB_E_CORRUPT, "%s: unknown dtype \"%.16s\" in the header", f->path,
                       (const char *)h + 16);
    zb__src_matrix_info *info = &f->base.info;
    memcpy(&info->n_rows, h + 32, 8);
    memcpy(&info->n_cols, h + 40, 8);
    memcpy(&info->nnz, h + 48, 8);
    info->layout = ZB_SRC_CSR;
    info->dtype = dtype;
    f->item = zb_dtype_size(dtype);
    if (info->n_rows > (uint64_t)UINT32_MAX + 1 || info->n_cols > (uint64_t)UINT32_MAX + 1)
        return zb__err(ZB_E_CORRUPT, "%s: header says %llu x %llu (at most 2^32 each)", f->path,
                       (unsigned long long)info->n_rows, (unsigned long long)info->n_cols);
    zb_status st = zb__csr_file_layout_of(info->n_rows, info->nnz, f->item, &f->lay);
    if (st != ZB_OK || f->lay.size != file_size)
        return zb__err(ZB_E_CORRUPT,
                       "%s: %llu bytes long, but its header (%llu x %llu, %llu elements of %s) "
                       "makes it %llu (truncated or not a CSR scratch file)",
                       f->path, (unsigned long long)file_size, (unsigned long long)info->n_rows,
                       (unsigned long long)info->n_cols, (unsigned long long)info->nnz,
                       zb_dtype_name(dtype), st == ZB_OK ? (unsigned long long)f->lay.size : 0ull);
    return ZB_OK;
}

zb_status
zb__csr_file_open(const char *path, zb__src_matrix *names_of, zb__src_matrix **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb__csr_file_open: NULL out");
    *out = NULL;
    if (!path || !*path) return zb__err(ZB_E_INVALID, "zb__csr_file_open: empty path");
    csr_file *f = calloc(1, sizeof *f);
    if (!f) return zb__err(ZB_E_NOMEM, "%s: out of memory", path);
    f->fd = -1;
    f->path = strdup(path);
    f->key = strdup(names_of ? names_of->key : "X");
    f->names_of = names_of;
    f->base.methods = &csr_file_methods;
    f->base.path = f->path;
    f->base.key = f->key;
    zb_status st;
    if (!f->path || !f->key) {
        st = zb__err(ZB_E_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (f->fd < 0 || fstat(f->fd, &sb) != 0) {
        int e = errno;
        st = zb__err(e == ENOENT ? ZB_E_NOTFOUND : ZB_E_IO, "%s: %s", path, strerror(e));
        goto fail;
    }
    uint8_t h[ZB_CSR_FILE_HEADER_BYTES];
    if ((uint64_t)sb.st_size < sizeof h) {
        st = zb__err(ZB_E_CORRUPT, "%s: %lld bytes, shorter than a CSR scratch file header", path,
                     (long long)sb.st_size);
        goto fail;
    }
    if ((st = read_at(f, h, sizeof h, 0)) != ZB_OK) goto fail;
    if ((st = parse_header(f, h, (uint64_t)sb.st_size)) != ZB_OK) goto fail;
    if (names_of && names_of->info.n_cols != f->base.info.n_cols) {
        st = zb__err(ZB_E_INVALID, "%s: %llu columns, but its var names come from %s: %s with %llu",
                     path, (unsigned long long)f->base.info.n_cols, names_of->path, names_of->key,
                     (unsigned long long)names_of->info.n_cols);
        goto fail;
    }
    *out = &f->base;
    return ZB_OK;
fail:
    file_close(&f->base);
    return st;
}
