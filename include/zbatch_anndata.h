/* zbatch_anndata.h — part of the public C API (included by zbatch.h): the anndata layout writer.
 * Conventions, status codes and thread-safety rules are those of zbatch.h. */
#ifndef ZBATCH_ANNDATA_H
#define ZBATCH_ANNDATA_H

#include "zbatch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Writing AnnData stores.
 *
 * A zb_anndata_writer writes one AnnData object into a Zarr group (v3 or v2) exactly as
 * anndata 0.12 lays it out (shared FORMATS.md §6), so `anndata.read_zarr` opens it:
 *
 *   <path>/            group {"encoding-type": "anndata", "encoding-version": "0.1.0"}
 *     X                CSR: group {"encoding-type": "csr_matrix", "encoding-version": "0.1.0",
 *                      "shape": [n_obs, n_vars]} with data [nnz] (X's dtype), indices [nnz]
 *                      (int32 column ids), indptr [n_obs+1] (int64);
 *                      dense: array [n_obs, n_vars] {"encoding-type": "array", ...}
 *     obs/, var/       dataframes {"_index": "_index", "column-order": [...], ...}: `_index`
 *                      (string-array of row names), then one child per column: a numeric or
 *                      bool array, a string-array, or a categorical group (codes + categories)
 *     layers/ obsm/ obsp/ varm/ varp/ uns/   empty dict groups
 *
 * plus consolidated metadata (v2 `.zmetadata`, v3 inline in the root zarr.json), as anndata
 * writes it.
 *
 * X is streamed: rows arrive in any number of append calls and are compressed and written as
 * chunks fill, so memory stays bounded by a few chunks whatever n_obs is. n_obs is the number of
 * rows appended when the writer commits. obs and var columns are streamed too: the first call
 * naming a column creates it, later calls with the same name append to it; a column given whole
 * is one call.
 *
 * Crash safety. Opening writes a marker object `<path>/.zbatch-incomplete` (a short JSON naming
 * the writer) before anything else. Commit writes every array (each array's metadata after its
 * chunks), then the group documents, then the root group document (the commit point), and then
 * erases the marker. A store whose marker is still present was not committed; readers refuse it
 * with ZB_E_INCOMPLETE.
 *
 * Errors. A call refused for its arguments (ZB_E_INVALID, ZB_E_TYPE, ZB_E_NOTFOUND,
 * ZB_E_OVERFLOW) changes nothing: the writer stays usable. A call that fails while writing (a
 * store or codec error, out of memory inside an array writer) leaves the writer unusable: every
 * later call returns that status, and the store stays incomplete; close it.
 *
 * Thread-safety: a writer is driven by one thread at a time (it may start its own compression
 * threads, see num_threads). Distinct writers on distinct paths may run concurrently.
 * ------------------------------------------------------------------------------------------- */

/* The key of the marker object, relative to the store path the writer was opened at. */
#define ZB_INCOMPLETE_MARKER ".zbatch-incomplete"

/* How X is stored. */
typedef enum zb_anndata_x_kind {
    ZB_ANNDATA_X_CSR = 0,  /* scipy.sparse CSR: X/data, X/indices, X/indptr */
    ZB_ANNDATA_X_DENSE = 1 /* one 2-d array X [n_obs, n_vars] */
} zb_anndata_x_kind;

/* Which dataframe a column belongs to. */
typedef enum zb_anndata_axis {
    ZB_ANNDATA_OBS = 0, /* one value per row of X (n_obs) */
    ZB_ANNDATA_VAR = 1  /* one value per column of X (n_vars) */
} zb_anndata_axis;

/* Elements per chunk (the inner chunk when sharded) of a CSR X's data and indices when the
 * options leave it 0: 4,096 (16 KiB of float32, ~2.8 cells of a Tahoe-like matrix), measured
 * in docs/PERFORMANCE.md "Codec defaults". */
#define ZB_ANNDATA_DEFAULT_X_CHUNK 4096

typedef struct zb_anndata_write_opts {
    int zarr_format;       /* 3 (default) or 2 */
    const char *codec;     /* codec string of every array (see "Writing arrays" in zbatch.h);
                              NULL = "blosc:lz4:5:shuffle" */
    uint64_t x_chunk;      /* CSR: elements per chunk of X/data and X/indices (0 =
                              ZB_ANNDATA_DEFAULT_X_CHUNK);
                              dense: rows per chunk of X (0 = about 1 MiB of rows) */
    uint64_t x_shard;      /* v3 only: CSR elements, or dense rows, per shard of X; a multiple
                              of x_chunk; 0 = not sharded */
    uint64_t column_chunk; /* rows per chunk of X/indptr and of every obs/var array, one
                              count for all so columns share chunking (0 = 65536); var
                              arrays and categories never get chunks longer than they are */
    int num_threads;       /* compression threads per X array (0 or 1 = the calling thread) */
    bool consolidate;      /* write consolidated metadata (default true, as anndata does) */
} zb_anndata_write_opts;

#define ZB_ANNDATA_WRITE_OPTS_DEFAULT                                                              \
    {                                                                                              \
        3, NULL, 0, 0, 0, 1, true                                                                  \
    }

typedef struct zb_anndata_writer zb_anndata_writer;

/* Starts an AnnData store at `path` of `store` ("" = the store root) with `n_vars` columns.
 * `x_dtype` is the dtype of X/data (CSR) or of X (dense): any fixed-size type (ZB_DT_FLOAT32 is
 * usual), not ZB_DT_STRING. `opts` may be NULL (= ZB_ANNDATA_WRITE_OPTS_DEFAULT). The marker is
 * written here. The store must outlive the writer; `path` and `opts` are copied.
 * Errors: ZB_E_INVALID for a bad argument or option (a codec string that does not parse, a
 * shard that is not a multiple of the chunk, sharding with zarr_format 2, n_vars above
 * INT32_MAX for CSR), or when `path` already holds a group or an array; the store's errors for
 * the marker's put. */
zb_status zb_anndata_writer_open(zb_store *store, const char *path, uint64_t n_vars,
                                 zb_anndata_x_kind x_kind, zb_dtype x_dtype,
                                 const zb_anndata_write_opts *opts, zb_anndata_writer **out);

/* Appends `nrows` rows to a CSR X. indptr[0..nrows] are the row boundaries of this block; they
 * may start anywhere (a slice of a larger indptr), and the block holds
 * k = indptr[nrows] - indptr[0] elements: indices[0..k) and data[0..k) (x_dtype, native byte
 * order) are the elements of row 0, then row 1, ... (so a caller slicing a big CSR passes
 * &indices[indptr[0]]). The writer rebases indptr onto the elements written so far. Column ids
 * need not be sorted within a row (anndata does not require it). Nothing of the block is written
 * unless all of it is valid.
 * Errors: ZB_E_TYPE if X is dense; ZB_E_INVALID for a decreasing or negative indptr, or a column
 * id outside [0, n_vars) (the message names the row and element); ZB_E_OVERFLOW past 2^63
 * elements; the array writer's errors. */
zb_status zb_anndata_writer_append_csr(zb_anndata_writer *w, uint64_t nrows, const int64_t *indptr,
                                       const int32_t *indices, const void *data);

/* Appends `nrows` rows of a dense X: nrows * n_vars elements of x_dtype, C order, native byte
 * order. Errors: ZB_E_TYPE if X is CSR; the array writer's errors. */
zb_status zb_anndata_writer_append_dense(zb_anndata_writer *w, uint64_t nrows, const void *rows);

/* Rows of X appended so far (n_obs once committed). */
uint64_t zb_anndata_writer_rows(const zb_anndata_writer *w);

/* Stored elements of a CSR X appended so far (0 for dense). */
uint64_t zb_anndata_writer_nnz(const zb_anndata_writer *w);

/* Appends `n` row names to obs (obs_names) or var (var_names): name i is
 * data[offsets[i] .. offsets[i+1]) in UTF-8 (offsets has n+1 entries and may start anywhere).
 * An axis whose names were never given gets anndata's default, the row numbers "0", "1", ...
 * Errors: ZB_E_INVALID for decreasing offsets, or names beyond n_vars on the var axis. */
zb_status zb_anndata_writer_append_names(zb_anndata_writer *w, zb_anndata_axis axis,
                                         const char *data, const uint64_t *offsets, uint64_t n);

/* Appends `n` values of `dtype` (any fixed-size type, bool included; native byte order) to the
 * numeric column `name` of `axis`, creating it on the first call. Bool values must be 0 or 1.
 * Column names must be non-empty, contain no '/', not be "_index" and not start with "__".
 * Errors: ZB_E_INVALID for a bad name, a bool byte other than 0/1, or values beyond n_vars on
 * the var axis; ZB_E_TYPE if `name` exists with another dtype or kind. */
zb_status zb_anndata_writer_append_column(zb_anndata_writer *w, zb_anndata_axis axis,
                                          const char *name, zb_dtype dtype, const void *values,
                                          uint64_t n);

/* Appends `n` strings (layout as in zb_anndata_writer_append_names) to the string column `name`
 * (a string-array, as anndata stores a non-categorical str column), creating it on the first
 * call. Errors as for zb_anndata_writer_append_column. */
zb_status zb_anndata_writer_append_string_column(zb_anndata_writer *w, zb_anndata_axis axis,
                                                 const char *name, const char *data,
                                                 const uint64_t *offsets, uint64_t n);

/* Creates the categorical column `name` with `n_categories` categories (strings, layout as in
 * zb_anndata_writer_append_names; they must be distinct) and `ordered`. Its codes are appended
 * with zb_anndata_writer_append_codes. The codes are stored in the smallest signed type that
 * pandas gives them (int8 below 127 categories, int16 below 32767, else int32).
 * Errors: ZB_E_INVALID for a bad name, an existing column of that name, duplicate categories,
 * or more than INT32_MAX - 1 categories. */
zb_status zb_anndata_writer_define_categorical(zb_anndata_writer *w, zb_anndata_axis axis,
                                               const char *name, const char *categories,
                                               const uint64_t *offsets, uint64_t n_categories,
                                               bool ordered);

/* Appends `n` codes of the categorical column `name`: signed integers of `codes_dtype`
 * (ZB_DT_INT8/16/32/64) indexing its categories, -1 meaning missing. They are converted to the
 * column's stored type. Errors: ZB_E_INVALID for a code outside [-1, n_categories) (the message
 * names its position) or values beyond n_vars on the var axis; ZB_E_TYPE if `name` is not a
 * categorical column or codes_dtype is not a signed integer type; ZB_E_NOTFOUND if no column
 * `name` was defined. */
zb_status zb_anndata_writer_append_codes(zb_anndata_writer *w, zb_anndata_axis axis,
                                         const char *name, zb_dtype codes_dtype, const void *codes,
                                         uint64_t n);

/* Writes everything that is still pending (the commit point is the root group document) and
 * erases the marker. Every obs column and obs_names must then hold n_obs values and every var
 * column and var_names n_vars values (ZB_E_INVALID naming the column otherwise; nothing is
 * committed and the writer stays usable, so the missing values can still be appended). After a
 * successful commit the writer accepts nothing more (ZB_E_INVALID); close it. */
zb_status zb_anndata_writer_commit(zb_anndata_writer *w);

/* Frees the writer. Without a successful commit the store is left incomplete: its marker stays
 * and readers refuse it. NULL is a no-op. */
void zb_anndata_writer_close(zb_anndata_writer *w);

#ifdef __cplusplus
}
#endif
#endif
