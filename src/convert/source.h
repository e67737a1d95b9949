/* One input of a conversion, seen the same way whatever it is stored in: an AnnData file
 * (.h5ad, read with libhdf5) or an AnnData Zarr store (v2 or v3, what anndata 0.8-0.12 and
 * zarr-python 2/3 write). The converter asks a source for its matrices (X, raw/X, layers/NAME)
 * by row block, for its obs columns by row block, and for its obs and var names; it never
 * looks at the storage behind them.
 *
 * A source is a methods table (zb__src_methods) plus the shared facts every backend fills at
 * open (n_obs, the obs columns with their categories). Backends: src_h5ad.c, src_zarr.c;
 * csr_file.c serves a matrix transposed out of core from CSC (transpose.c) as a CSR matrix.
 *
 * Thread-safety: every read function may be called from several threads at once on the same
 * source and matrix (scatter tasks read different row slices of one input concurrently); a
 * backend serialises what its library needs serialised (libhdf5) internally. Open, close and
 * zb__src_matrix_get are called by one thread.
 */
#ifndef ZB_CONVERT_SOURCE_H
#define ZB_CONVERT_SOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zbatch.h"

typedef struct zb__src zb__src;
typedef struct zb__src_matrix zb__src_matrix;

/* ---- row blocks ------------------------------------------------------------------------------ */

/* A block of rows in CSR form, owned by the caller and reused across reads: a read grows the
 * buffers as needed and sets n_rows/nnz. Row r holds indices[indptr[r] .. indptr[r+1]) and the
 * same range of data. indptr[0] is 0. Column ids keep the order they have in storage. */
typedef struct zb__csr_block {
    uint64_t n_rows;
    uint64_t nnz;
    int64_t *indptr;   /* [n_rows + 1] */
    uint32_t *indices; /* [nnz] column ids, each < the matrix's n_cols */
    void *data;        /* [nnz] elements of `dtype`, native byte order */
    zb_dtype dtype;    /* the matrix's stored dtype (a read never converts values) */
    /* capacities (elements), managed by zb__csr_block_reserve */
    uint64_t cap_rows, cap_nnz;
    size_t cap_data_bytes;
} zb__csr_block;

/* Grows b to hold n_rows rows and nnz elements of `dtype` (contents of indptr/indices/data up
 * to their old sizes kept). ZB_E_NOMEM / ZB_E_OVERFLOW. */
zb_status zb__csr_block_reserve(zb__csr_block *b, uint64_t n_rows, uint64_t nnz, zb_dtype dtype);
void zb__csr_block_free(zb__csr_block *b);

/* ---- matrices -------------------------------------------------------------------------------- */

typedef enum zb__src_layout {
    ZB_SRC_CSR = 0,  /* csr_matrix: rows are cells */
    ZB_SRC_CSC = 1,  /* csc_matrix: stored by column (gene); read by column block */
    ZB_SRC_DENSE = 2 /* a 2-d array [n_obs, n_vars] */
} zb__src_layout;

typedef struct zb__src_matrix_info {
    zb__src_layout layout;
    zb_dtype dtype;  /* of data (CSR/CSC) or of the dense array; never ZB_DT_STRING */
    uint64_t n_rows; /* n_obs */
    uint64_t n_cols; /* n_vars of this matrix (raw/X may have its own var) */
    uint64_t nnz;    /* stored elements (CSR/CSC); n_rows * n_cols for dense */
} zb__src_matrix_info;

/* The matrix at `key` ("X", "raw/X", "layers/NAME") of `src`, opened on first use and kept by
 * the source (the pointer lives as long as the source; do not free it). ZB_E_NOTFOUND (naming
 * the file and key) when there is none; ZB_E_UNSUPPORTED for an encoding that is not a matrix
 * (naming it). */
zb_status zb__src_matrix_get(zb__src *src, const char *key, zb__src_matrix **out);

const zb__src_matrix_info *zb__src_matrix_info_of(const zb__src_matrix *m);

/* indptr[start .. stop] of a CSR (rows) or CSC (columns) matrix as stored (not rebased), as
 * int64 into out[0 .. stop-start]; stop <= n_rows (CSR) or n_cols (CSC). For a dense matrix:
 * out[i] = (start + i) * n_cols (every element counts as stored). Checked: monotone, within
 * [0, nnz] (ZB_E_CORRUPT naming the file, key and position). */
zb_status zb__src_matrix_indptr(zb__src_matrix *m, uint64_t start, uint64_t stop, int64_t *out);

/* Rows [start, stop) of a CSR or dense matrix, or columns [start, stop) of a CSC matrix (then
 * out->indices are row ids and out->n_rows counts columns), into `out`. A dense matrix is
 * returned in CSR form with its zeros dropped (values equal to 0, -0.0 included; NaN kept).
 * Checked: indptr as in zb__src_matrix_indptr, every index < the other dimension (ZB_E_CORRUPT
 * naming file, key, row and element). */
zb_status zb__src_matrix_read(zb__src_matrix *m, uint64_t start, uint64_t stop, zb__csr_block *out);

/* Where a CSR matrix's elements lie in a file, for readers that fetch rows themselves with
 * pread (the conversion's direct gather). An array (indices: uint32 or int32 ids; data: elements
 * of info.dtype), uncompressed and in native byte order, is either one extent (chunk == 0:
 * element e at at + e * item) or chunks of `chunk` elements, each an extent (element e at
 * chunk_at[e / chunk] + (e % chunk) * item; the last chunk stored whole). Every offset is a
 * multiple of the element size. indptr comes from zb__src_matrix_indptr (checked there); ids
 * read this way are not checked: the reader checks them against n_cols. */
typedef struct zb__src_raw_array {
    uint64_t at;
    uint64_t chunk;
    const uint64_t *chunk_at; /* lives with the matrix */
} zb__src_raw_array;

typedef struct zb__src_raw {
    const char *path;
    int fd; /* the file, open for pread (owned by the matrix: no new descriptor per reader) */
    zb__src_raw_array indices, data;
} zb__src_raw;

/* True, with *out filled, when m is a CSR matrix stored that way (an .h5ad CSR matrix whose
 * data and indices are unfiltered datasets of native numbers, contiguous or chunked with every
 * chunk written, 32-bit ids and non-bool data; a CSR file of csr_file.c); false otherwise
 * (compressed datasets, a Zarr store, CSC, dense), and then rows are read through
 * zb__src_matrix_read. */
bool zb__src_matrix_raw(zb__src_matrix *m, zb__src_raw *out);

/* The byte offset of element e of a raw array of `item`-byte elements, and how many elements
 * from e on lie in one extent there (UINT64_MAX for a contiguous array). */
static inline uint64_t
zb__src_raw_at(const zb__src_raw_array *a, size_t item, uint64_t e, uint64_t *run)
{
    if (!a->chunk) {
        *run = UINT64_MAX;
        return a->at + e * item;
    }
    *run = a->chunk - e % a->chunk;
    return a->chunk_at[e / a->chunk] + (e % a->chunk) * item;
}

/* Reads exactly `len` bytes of fd (the file `path`, for messages) at `off`: ZB_E_IO naming the
 * file and offset, ZB_E_TRUNCATED when it ends first. */
zb_status zb__src_pread(int fd, const char *path, void *dst, uint64_t len, uint64_t off);
/* Elements [first, first + n) of a raw array (zb__src_raw) of `item`-byte elements, from the file
 * `path` open as fd, into dst: one pread per extent they cross. */
zb_status zb__src_raw_read(int fd, const char *path, const zb__src_raw_array *a, size_t item,
                           uint64_t first, uint64_t n, void *dst);

/* A read-only mapping of a whole file, for readers that take rows straight from it (the
 * conversion's direct gather: no system call and no copy per row). A file truncated in place
 * while it is mapped raises SIGBUS in the reader, as with any mmap reader: callers check that
 * the file is the one they planned for before mapping it, and offer pread instead
 * (docs/CONVERT.md, "Reading the inputs"). */
struct zb__buf;

typedef struct zb__src_map {
    const unsigned char *base; /* NULL: not mapped */
    uint64_t len;
} zb__src_map;

/* Maps the file open as fd (named `path` in messages), its whole current size, when that is at
 * most `limit` bytes (else out->base stays NULL: not mapped): ZB_E_IO naming the file when
 * fstat or mmap fails. */
zb_status zb__src_map_open(int fd, const char *path, uint64_t limit, zb__src_map *out);
void zb__src_map_close(zb__src_map *m);

/* Elements [first, first + n) of a raw array of `item`-byte elements from a mapping of its file:
 * *out points into the mapping when they lie in one extent (the usual case), else they are
 * copied into `spill` and *out points there. ZB_E_TRUNCATED naming the file and offset when
 * they lie past the mapping's end (what zb__src_raw_read says of a file that ends first). */
zb_status zb__src_raw_view(const zb__src_map *m, const char *path, const zb__src_raw_array *a,
                           size_t item, uint64_t first, uint64_t n, struct zb__buf *spill,
                           const uint8_t **out);

/* The names of the matrix's columns: var/_index (raw/var/_index for raw/X), n_cols strings. */
zb_status zb__src_matrix_var_names(zb__src_matrix *m, zb_strings *out);

/* ---- obs columns ----------------------------------------------------------------------------- */

typedef enum zb__col_kind {
    ZB_COL_NUMERIC = 0,     /* numeric or bool array */
    ZB_COL_CATEGORICAL = 1, /* codes (-1 = missing) into a table of categories */
    ZB_COL_STRING = 2,      /* string-array */
    ZB_COL_NULLABLE = 3     /* nullable-integer / nullable-boolean / nullable-string-array:
                               values + mask (1 = missing) */
} zb__col_kind;

typedef struct zb__col_info {
    const char *name;
    zb__col_kind kind;
    /* NUMERIC / NULLABLE: the value dtype (ZB_DT_STRING for a nullable-string-array).
     * CATEGORICAL: the dtype of the categories as stored (ZB_DT_STRING, or a numeric/bool type
     * for e.g. integer cluster labels). STRING: ZB_DT_STRING. */
    zb_dtype dtype;
    /* CATEGORICAL: the categories in stored order, as text; a numeric category is written the
     * way Python's str() writes that numpy scalar (42, -3, 0.5, 1e-05, nan, True/False), so
     * equal values across inputs give equal text. NULL otherwise. Lives with the source. */
    const zb_strings *categories;
    /* CATEGORICAL with non-string categories (dtype != ZB_DT_STRING): the same categories as
     * categories->n values of `dtype`, native byte order, so a writer can keep their type
     * (integer leiden clusters stay integers). NULL for string categories. Lives with the
     * source. */
    const void *category_values;
    bool ordered; /* CATEGORICAL: the `ordered` attribute */
} zb__col_info;

/* Values of rows [start, stop) of one obs column, owned by the caller and reused across reads
 * (zb__col_block_free releases it). */
typedef struct zb__col_block {
    uint64_t n;
    /* NUMERIC / NULLABLE (non-string): n values of the column's dtype (bool as 0/1 bytes);
     * CATEGORICAL: n int32 codes, each in [-1, n_categories) (checked: ZB_E_CORRUPT naming
     * file, column and row otherwise). NULL for string kinds. */
    void *values;
    /* NULLABLE: n bytes, 1 = missing (the value under a mask is unspecified). NULL otherwise. */
    uint8_t *mask;
    /* STRING and nullable-string-array: n strings (a missing one is empty). */
    zb_strings strings;
    size_t cap_values_bytes, cap_mask; /* managed by the backends */
    uint64_t cap_strings, cap_string_bytes;
} zb__col_block;

void zb__col_block_free(zb__col_block *b);

/* ---- the source ------------------------------------------------------------------------------ */

/* What every backend fills at open and the converter reads directly. */
typedef struct zb__src_common {
    char *path;         /* as given to zb__src_open */
    const char *format; /* "h5ad" or "zarr" */
    uint64_t n_obs;
    size_t n_columns;      /* obs columns in column-order (the index excluded) */
    zb__col_info *columns; /* [n_columns] */
    /* obs columns left out because their encoding cannot be read (an awkward-array, a 2-d
     * array...): "name\treason" each, in column-order. A conversion keeps the other columns
     * and refuses to be asked for these by name. */
    char **skipped;
    size_t n_skipped;
} zb__src_common;

typedef struct zb__src_methods {
    zb_status (*matrix_open)(zb__src *src, const char *key, zb__src_matrix **out);
    zb_status (*read_column)(zb__src *src, size_t column, uint64_t start, uint64_t stop,
                             zb__col_block *out);
    /* obs names (obs/_index, or the dataframe's `_index` attribute's child), rows [start, stop) */
    zb_status (*read_obs_names)(zb__src *src, uint64_t start, uint64_t stop, zb_strings *out);
    void (*close)(zb__src *src);
} zb__src_methods;

/* A matrix backend (each source's matrices, and csr_file.c's). */
typedef struct zb__src_matrix_methods {
    zb_status (*indptr)(zb__src_matrix *m, uint64_t start, uint64_t stop, int64_t *out);
    zb_status (*read)(zb__src_matrix *m, uint64_t start, uint64_t stop, zb__csr_block *out);
    zb_status (*var_names)(zb__src_matrix *m, zb_strings *out);
    void (*close)(zb__src_matrix *m);
    /* optional: where a CSR matrix's indices and data lie in a file (zb__src_matrix_raw) */
    bool (*raw)(zb__src_matrix *m, zb__src_raw *out);
} zb__src_matrix_methods;

struct zb__src_matrix {
    const zb__src_matrix_methods *methods;
    zb__src_matrix_info info;
    char *key;            /* "X", "raw/X", ... (for messages) */
    const char *path;     /* the source's path (for messages) */
    zb__src_matrix *next; /* the source's list of opened matrices */
};

struct zb__src {
    const zb__src_methods *methods;
    zb__src_common c;
    zb__src_matrix *matrices; /* opened so far (closed with the source) */
};

/* Opens `path`: a file holding the HDF5 signature (at 0 or after a user block) is read as
 * .h5ad; a directory as an anndata Zarr store (root attribute encoding-type "anndata").
 * ZB_E_NOTFOUND for a missing path; ZB_E_UNSUPPORTED (naming the path and what it found) for
 * anything else. */
zb_status zb__src_open(const char *path, zb__src **out);
zb_status zb__src_open_h5ad(const char *path, zb__src **out);
zb_status zb__src_open_zarr(const char *path, zb__src **out);

/* Closes the source and every matrix it opened. NULL is a no-op. */
void zb__src_close(zb__src *src);

/* Index of the obs column `name`, or ZB_E_NOTFOUND. */
zb_status zb__src_find_column(const zb__src *src, const char *name, size_t *index);

static inline zb_status
zb__src_read_column(zb__src *src, size_t column, uint64_t start, uint64_t stop, zb__col_block *out)
{
    return src->methods->read_column(src, column, start, stop, out);
}

static inline zb_status
zb__src_read_obs_names(zb__src *src, uint64_t start, uint64_t stop, zb_strings *out)
{
    return src->methods->read_obs_names(src, start, stop, out);
}

/* ---- for backends ----------------------------------------------------------------------------- */

/* Frees what zb__src_common holds (path, columns, their names and categories). */
void zb__src_common_free(zb__src_common *c);

/* Frees a column's name and categories and zeroes it. */
void zb__col_info_free(zb__col_info *ci);

/* Records obs column `name` as left out, with this thread's detail message as the reason, and
 * clears the error. ZB_E_NOMEM. */
zb_status zb__src_skip_column(zb__src_common *c, const char *name);

/* The reason column `name` was left out, or NULL when it was not. */
const char *zb__src_skipped_reason(const zb__src_common *c, const char *name);

/* The text of one numeric or bool category value (zb__col_info.categories): integers in decimal,
 * bools as "True"/"False", floats as the shortest decimal that reads back to the same value of
 * their type (Python's repr rules: "0.5", "100.0", "1e-05", "1e+16", "nan", "inf", "-inf").
 * Writes at most `cap` bytes including the NUL; returns the length. */
size_t zb__src_category_text(zb_dtype dtype, const void *value, char *buf, size_t cap);

/* Fills c->categories (a new zb_strings) with the text of `n` category values of `dtype` and
 * keeps a copy of the values in c->category_values. ZB_E_NOMEM. */
zb_status zb__src_set_numeric_categories(zb__col_info *c, zb_dtype dtype, const void *values,
                                         uint64_t n);

/* Grows the column block for `n` rows: values of `value_bytes` bytes each (0 = none), a mask
 * when `mask` is set. Contents are not kept. ZB_E_NOMEM / ZB_E_OVERFLOW. */
zb_status zb__col_block_reserve(zb__col_block *b, uint64_t n, size_t value_bytes, bool mask);

/* Turns `n_rows` dense rows of `n_cols` elements of `dtype` (C order, native byte order) into
 * CSR in `out`, dropping elements equal to zero (-0.0 included; NaN is kept). */
zb_status zb__csr_from_dense(const void *rows, uint64_t n_rows, uint64_t n_cols, zb_dtype dtype,
                             zb__csr_block *out);

/* ---- CSC transposed out of core -------------------------------------------------------------- */

/* Writes the CSC matrix `m` as CSR into the file `path` (a scratch file: a small header, then
 * indptr, indices, data), holding at most about `memory_bytes` of it in memory at once,
 * whatever its size, with `num_threads` threads. The file appears complete or not at all
 * (written under a temporary name, then renamed). Each row's column ids come out ascending;
 * values are copied bit for bit. Errors: ZB_E_INVALID when m is not CSC; the source's own
 * error when a read fails; ZB_E_CORRUPT when its blocks disagree with its column pointers;
 * ZB_E_IO naming the file (a full disk included). */
zb_status zb__csc_transpose(zb__src_matrix *m, const char *path, uint64_t memory_bytes,
                            int num_threads);

/* Opens a file written by zb__csc_transpose as a CSR matrix (key and path name it in messages;
 * var names come from `names_of`, the CSC matrix it was made from). Close with
 * zb__src_matrix_close. A foreign, damaged or truncated file: ZB_E_CORRUPT naming it. Reads
 * may run on several threads at once. */
zb_status zb__csr_file_open(const char *path, zb__src_matrix *names_of, zb__src_matrix **out);
void zb__src_matrix_close(zb__src_matrix *m);

#endif
