/* The backend-neutral half of a conversion source (source.h): opening by what the path holds,
 * the matrix cache, and the reusable row and column blocks. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "convert/source.h"
#include "util/buf.h"
#include "util/status.h"

zb_status
zb_csr_block_reserve(zb_csr_block *b, uint64_t n_rows, uint64_t nnz, zb_dtype dtype)
{
    size_t item = zb_dtype_size(dtype);
    uint64_t data_bytes;
    if (n_rows >= ZB_BUF_MAX / 8 || nnz >= ZB_BUF_MAX / 4 || !zb_mul_u64(nnz, item, &data_bytes) ||
        data_bytes > ZB_BUF_MAX)
        return zb_err(ZB_E_OVERFLOW, "a block of %llu rows and %llu elements is too large",
                      (unsigned long long)n_rows, (unsigned long long)nnz);
    if (n_rows + 1 > b->cap_rows) {
        int64_t *p = realloc(b->indptr, (size_t)(n_rows + 1) * sizeof *p);
        if (!p) return zb_err(ZB_E_NOMEM, "a block of %llu rows", (unsigned long long)n_rows);
        b->indptr = p;
        b->cap_rows = n_rows + 1;
    }
    if (nnz > b->cap_nnz || !b->indices) {
        uint32_t *p = realloc(b->indices, (size_t)(nnz ? nnz : 1) * sizeof *p);
        if (!p) return zb_err(ZB_E_NOMEM, "a block of %llu elements", (unsigned long long)nnz);
        b->indices = p;
        b->cap_nnz = nnz ? nnz : 1;
    }
    if (data_bytes > b->cap_data_bytes || !b->data) {
        void *p = realloc(b->data, data_bytes ? (size_t)data_bytes : 1);
        if (!p) return zb_err(ZB_E_NOMEM, "a block of %llu elements", (unsigned long long)nnz);
        b->data = p;
        b->cap_data_bytes = data_bytes ? (size_t)data_bytes : 1;
    }
    b->dtype = dtype;
    return ZB_OK;
}

void
zb_csr_block_free(zb_csr_block *b)
{
    if (!b) return;
    free(b->indptr);
    free(b->indices);
    free(b->data);
    memset(b, 0, sizeof *b);
}

void
zb_col_block_free(zb_col_block *b)
{
    if (!b) return;
    free(b->values);
    free(b->mask);
    zb_strings_free(&b->strings);
    memset(b, 0, sizeof *b);
}

void
zb_src_common_free(zb_src_common *c)
{
    free(c->path);
    for (size_t i = 0; i < c->n_columns; i++) {
        free((char *)c->columns[i].name);
        if (c->columns[i].categories) {
            zb_strings_free((zb_strings *)c->columns[i].categories);
            free((zb_strings *)c->columns[i].categories);
        }
    }
    free(c->columns);
    memset(c, 0, sizeof *c);
}

/* HDF5 files start with this signature (at offset 0 for every file anndata writes; a user
 * block would move it to 512, 1024, ..., which h5py never writes by default). */
static bool
is_hdf5(const char *path)
{
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    unsigned char head[8];
    bool yes = fread(head, 1, 8, f) == 8 && !memcmp(head, sig, 8);
    fclose(f);
    return yes;
}

zb_status
zb_src_open(const char *path, zb_src **out)
{
    if (!out) return zb_err(ZB_E_INVALID, "zb_src_open: NULL out");
    *out = NULL;
    if (!path || !*path) return zb_err(ZB_E_INVALID, "zb_src_open: empty path");
    struct stat sb;
    if (stat(path, &sb) != 0)
        return zb_err(errno == ENOENT ? ZB_E_NOTFOUND : ZB_E_IO, "%s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) return zb_src_open_zarr(path, out);
    if (S_ISREG(sb.st_mode) && is_hdf5(path)) return zb_src_open_h5ad(path, out);
    return zb_err(ZB_E_UNSUPPORTED,
                  "%s: neither an .h5ad file (no HDF5 signature) nor a Zarr store directory", path);
}

void
zb_src_close(zb_src *src)
{
    if (!src) return;
    zb_src_matrix *m = src->matrices;
    while (m) {
        zb_src_matrix *next = m->next;
        zb_src_matrix_close(m);
        m = next;
    }
    src->matrices = NULL;
    src->methods->close(src);
}

zb_status
zb_src_find_column(const zb_src *src, const char *name, size_t *index)
{
    for (size_t i = 0; i < src->c.n_columns; i++) {
        if (!strcmp(src->c.columns[i].name, name)) {
            *index = i;
            return ZB_OK;
        }
    }
    return zb_err(ZB_E_NOTFOUND, "%s: no obs column '%s'", src->c.path, name);
}

zb_status
zb_src_matrix_get(zb_src *src, const char *key, zb_src_matrix **out)
{
    *out = NULL;
    for (zb_src_matrix *m = src->matrices; m; m = m->next) {
        if (!strcmp(m->key, key)) {
            *out = m;
            return ZB_OK;
        }
    }
    zb_src_matrix *m = NULL;
    ZB_TRY(src->methods->matrix_open(src, key, &m));
    m->next = src->matrices;
    src->matrices = m;
    *out = m;
    return ZB_OK;
}

const zb_src_matrix_info *
zb_src_matrix_info_of(const zb_src_matrix *m)
{
    return &m->info;
}

zb_status
zb_src_matrix_indptr(zb_src_matrix *m, uint64_t start, uint64_t stop, int64_t *out)
{
    uint64_t limit = m->info.layout == ZB_SRC_CSC ? m->info.n_cols : m->info.n_rows;
    if (start > stop || stop > limit)
        return zb_err(ZB_E_RANGE, "%s: %s: pointers [%llu, %llu] of %llu", m->path, m->key,
                      (unsigned long long)start, (unsigned long long)stop,
                      (unsigned long long)limit);
    if (m->info.layout == ZB_SRC_DENSE) {
        for (uint64_t i = start; i <= stop; i++)
            out[i - start] = (int64_t)(i * m->info.n_cols);
        return ZB_OK;
    }
    return m->methods->indptr(m, start, stop, out);
}

zb_status
zb_src_matrix_read(zb_src_matrix *m, uint64_t start, uint64_t stop, zb_csr_block *out)
{
    uint64_t limit = m->info.layout == ZB_SRC_CSC ? m->info.n_cols : m->info.n_rows;
    if (start > stop || stop > limit)
        return zb_err(ZB_E_RANGE, "%s: %s: rows [%llu, %llu) of %llu", m->path, m->key,
                      (unsigned long long)start, (unsigned long long)stop,
                      (unsigned long long)limit);
    return m->methods->read(m, start, stop, out);
}

zb_status
zb_src_matrix_var_names(zb_src_matrix *m, zb_strings *out)
{
    return m->methods->var_names(m, out);
}

void
zb_src_matrix_close(zb_src_matrix *m)
{
    if (!m) return;
    m->methods->close(m);
}
