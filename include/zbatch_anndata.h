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
 *                      (column ids: int32, or the narrow unsigned type of
 *                      zb_anndata_write_opts.narrow_indices), indptr [n_obs+1] (int64);
 *                      dense: array [n_obs, n_vars] {"encoding-type": "array", ...}
 *     obs/, var/       dataframes {"_index": "_index", "column-order": [...], ...}: `_index`
 *                      (string-array of row names), then one child per column: a numeric or
 *                      bool array, a string-array, a categorical group (codes + categories,
 *                      string or numeric), or a nullable group (values + mask)
 *     layers/          dict group; layers/NAME: CSR groups shaped like X's, [n_obs, n_vars]
 *     obsm/ obsp/ varm/ varp/ uns/   empty dict groups
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
 * Determinism. The bytes of every object depend only on the options and on the data written:
 * the same rows, columns and layers give byte-identical stores whatever num_threads is, however
 * the rows were split into append calls, and in whatever order the calls for different
 * columns and layers came. Nothing records a time, a process or a thread, compression threads
 * never decide where bytes go (chunks and shard inner chunks are placed by their index, see
 * "Writing arrays" in zbatch.h), and the consolidated metadata lists nodes in a sorted order.
 * (Within one dataframe the column-order attribute follows the order in which columns were
 * first named, as anndata's does.) A converter restarted after a crash can therefore write the
 * same store again and compare it object by object with one written before.
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
                              NULL = the defaults: "blosc:lz4:5:noshuffle" for a CSR matrix's
                              data and indices of 1- or 2-byte integers (uint8 counts,
                              uint16 gene ids: zb_anndata_csr_codec), "blosc:lz4:5:shuffle"
                              for every other array */
    uint64_t x_chunk;      /* CSR: elements per chunk of X/data and X/indices, and of each
                              layer's (0 = ZB_ANNDATA_DEFAULT_X_CHUNK);
                              dense: rows per chunk of X (0 = about 1 MiB of rows) */
    uint64_t x_shard;      /* v3 only: CSR elements, or dense rows, per shard of X (and of a
                              CSR X's layers); a multiple of x_chunk; 0 = not sharded */
    uint64_t column_chunk; /* rows per chunk of X/indptr, of each layer's indptr and of every
                              obs/var array, one count for all so columns share chunking
                              (0 = 65536); var arrays and categories never get chunks longer
                              than they are */
    int num_threads;       /* compression threads per X or layer array (0 or 1 = the calling
                              thread) */
    bool consolidate;      /* write consolidated metadata (default true, as anndata does) */
    bool narrow_indices;   /* store the indices of X and of every layer in the smallest
                              unsigned type holding n_vars, as anndata's setting
                              write_csr_csc_indices_with_min_possible_dtype does (0.12.19:
                              uint8 up to 255 columns, uint16 up to 65,535, else uint32);
                              default false: int32, as anndata writes by default. Either way
                              column ids are passed to the append calls as int32. */
} zb_anndata_write_opts;

#define ZB_ANNDATA_WRITE_OPTS_DEFAULT                                                              \
    {                                                                                              \
        3, NULL, 0, 0, 0, 1, true, false                                                           \
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
ZB_API zb_status zb_anndata_writer_open(zb_store *store, const char *path, uint64_t n_vars,
                                        zb_anndata_x_kind x_kind, zb_dtype x_dtype,
                                        const zb_anndata_write_opts *opts, zb_anndata_writer **out);

/* Appends `nrows` rows to a CSR X. indptr[0..nrows] are the row boundaries of this block; they
 * may start anywhere (a slice of a larger indptr), and the block holds
 * k = indptr[nrows] - indptr[0] elements: indices[0..k) and data[0..k) (x_dtype, native byte
 * order) are the elements of row 0, then row 1, ... (so a caller slicing a big CSR passes
 * &indices[indptr[0]]). The writer rebases indptr onto the elements written so far and stores
 * the column ids in the index type (int32, or narrower with narrow_indices). Column ids need
 * not be sorted within a row (anndata does not require it). Nothing of the block is written
 * unless all of it is valid.
 * Errors: ZB_E_TYPE if X is dense; ZB_E_INVALID for a decreasing or negative indptr, or a column
 * id outside [0, n_vars) (the message names the row and element); ZB_E_OVERFLOW past 2^63
 * elements; the array writer's errors. */
ZB_API zb_status zb_anndata_writer_append_csr(zb_anndata_writer *w, uint64_t nrows,
                                              const int64_t *indptr, const int32_t *indices,
                                              const void *data);

/* Appends `nrows` rows of a dense X: nrows * n_vars elements of x_dtype, C order, native byte
 * order. Errors: ZB_E_TYPE if X is CSR; the array writer's errors. */
ZB_API zb_status zb_anndata_writer_append_dense(zb_anndata_writer *w, uint64_t nrows,
                                                const void *rows);

/* Rows of X appended so far (n_obs once committed). */
ZB_API uint64_t zb_anndata_writer_rows(const zb_anndata_writer *w);

/* Stored elements of a CSR X appended so far (0 for dense). */
ZB_API uint64_t zb_anndata_writer_nnz(const zb_anndata_writer *w);

/* The codec string a CSR matrix's (X's or a layer's) data or indices array of element type
 * `dtype` is written with, given the writer's codec option `codec`: `codec` itself when not
 * NULL, else "blosc:lz4:5:noshuffle" for 1- and 2-byte integers (int8, uint8, int16, uint16:
 * byte shuffle makes their LZ4 decode about twice as slow for ~20% fewer bytes, measured in
 * docs/PERFORMANCE.md "Codec defaults") and "blosc:lz4:5:shuffle" for every other dtype. What
 * the writers (zbatch synth, zbatch convert, zbatch.write_anndata) report as their choice. */
ZB_API const char *zb_anndata_csr_codec(const char *codec, zb_dtype dtype);

/* The dtype the column ids of X and the layers are stored in (int32, or the narrow type of
 * zb_anndata_write_opts.narrow_indices); int32 for a NULL writer. */
ZB_API zb_dtype zb_anndata_writer_index_dtype(const zb_anndata_writer *w);

/* Appends `n` row names to obs (obs_names) or var (var_names): name i is
 * data[offsets[i] .. offsets[i+1]) in UTF-8 (offsets has n+1 entries and may start anywhere).
 * An axis whose names were never given gets anndata's default, the row numbers "0", "1", ...
 * Errors: ZB_E_INVALID for decreasing offsets, a name that is not valid UTF-8 (checked before
 * any is written), or names beyond n_vars on the var axis. */
ZB_API zb_status zb_anndata_writer_append_names(zb_anndata_writer *w, zb_anndata_axis axis,
                                                const char *data, const uint64_t *offsets,
                                                uint64_t n);

/* Appends `n` values of `dtype` (any fixed-size type, bool included; native byte order) to the
 * numeric column `name` of `axis`, creating it on the first call. Bool values must be 0 or 1.
 * Column names must be non-empty, contain no '/', not be "_index" and not start with "__".
 * Errors: ZB_E_INVALID for a bad name, a bool byte other than 0/1, or values beyond n_vars on
 * the var axis; ZB_E_TYPE if `name` exists with another dtype or kind. */
ZB_API zb_status zb_anndata_writer_append_column(zb_anndata_writer *w, zb_anndata_axis axis,
                                                 const char *name, zb_dtype dtype,
                                                 const void *values, uint64_t n);

/* Appends `n` strings (layout as in zb_anndata_writer_append_names) to the string column `name`
 * (a string-array, as anndata stores a non-categorical str column), creating it on the first
 * call. Errors as for zb_anndata_writer_append_column, plus ZB_E_INVALID for a string that is
 * not valid UTF-8 (checked before any is written, so the writer stays usable). */
ZB_API zb_status zb_anndata_writer_append_string_column(zb_anndata_writer *w, zb_anndata_axis axis,
                                                        const char *name, const char *data,
                                                        const uint64_t *offsets, uint64_t n);

/* Creates the categorical column `name` with `n_categories` categories (strings, layout as in
 * zb_anndata_writer_append_names; they must be distinct) and `ordered`. Its codes are appended
 * with zb_anndata_writer_append_codes. The codes are stored in the smallest signed type that
 * pandas gives them (int8 below 127 categories, int16 below 32767, else int32).
 * Errors: ZB_E_INVALID for a bad name, an existing column of that name, duplicate categories,
 * a category that is not valid UTF-8, or more than INT32_MAX - 1 categories. */
ZB_API zb_status zb_anndata_writer_define_categorical(zb_anndata_writer *w, zb_anndata_axis axis,
                                                      const char *name, const char *categories,
                                                      const uint64_t *offsets,
                                                      uint64_t n_categories, bool ordered);

/* Appends `n` codes of the categorical column `name`: signed integers of `codes_dtype`
 * (ZB_DT_INT8/16/32/64) indexing its categories, -1 meaning missing. They are converted to the
 * column's stored type. Errors: ZB_E_INVALID for a code outside [-1, n_categories) (the message
 * names its position) or values beyond n_vars on the var axis; ZB_E_TYPE if `name` is not a
 * categorical column or codes_dtype is not a signed integer type; ZB_E_NOTFOUND if no column
 * `name` was defined. */
ZB_API zb_status zb_anndata_writer_append_codes(zb_anndata_writer *w, zb_anndata_axis axis,
                                                const char *name, zb_dtype codes_dtype,
                                                const void *codes, uint64_t n);

/* Appends `nrows` rows to the CSR layer `name` (layers/NAME), creating it on the first call
 * (a call with nrows 0 creates it empty). The block is laid out as in
 * zb_anndata_writer_append_csr, with data of `dtype` (any fixed-size type; every call for a
 * layer passes the same one); column ids lie in [0, n_vars) of X. Layers are streamed like X
 * and independently of it: at commit every layer must hold n_obs rows. They are stored with X's
 * codec, index type and num_threads, and with a CSR X's x_chunk and x_shard; beside a dense X
 * (whose x_chunk and x_shard count rows) a layer is chunked by ZB_ANNDATA_DEFAULT_X_CHUNK
 * elements and not sharded.
 * Layer names follow the column-name rules (non-empty, no '/', not "." or "..", no "__"
 * prefix, at most 1024 bytes). Nothing of the block is written unless all of it is valid (a
 * refused first call creates no layer).
 * Errors: ZB_E_INVALID for a bad name, a non-fixed-size dtype, n_vars above INT32_MAX, or the
 * block errors of append_csr (message prefixed "layers/NAME"); ZB_E_TYPE if the layer exists
 * with another dtype; ZB_E_OVERFLOW past 2^63 elements; the array writer's errors. */
ZB_API zb_status zb_anndata_writer_append_layer_csr(zb_anndata_writer *w, const char *name,
                                                    zb_dtype dtype, uint64_t nrows,
                                                    const int64_t *indptr, const int32_t *indices,
                                                    const void *data);

/* Appends `n` values of a nullable column `name` of `axis` (pandas' Int8..Int64, UInt8..UInt64
 * or boolean dtype), creating it on the first call. `dtype` is an integer type (stored as
 * {"encoding-type": "nullable-integer", "encoding-version": "0.1.0"}) or ZB_DT_BOOL
 * ("nullable-boolean"); the group holds `values` (array of dtype) and `mask` (bool array),
 * as anndata 0.12 writes them. mask[i] = 1 marks value i as missing (pd.NA), 0 as present;
 * `n_mask` is the number of mask bytes the caller holds and must equal n, or mask is NULL with
 * n_mask 0 when no value of the block is missing. A missing value is stored as 0 (false), as
 * anndata stores it, whatever values[i] holds there (so the store depends only on the data).
 * Present bool values must be 0 or 1. Names follow zb_anndata_writer_append_column.
 * Errors: ZB_E_INVALID for a bad name, a mask whose length is not n (or NULL with n_mask > 0),
 * a mask byte other than 0/1, a present bool other than 0/1, or values beyond n_vars on the var
 * axis; ZB_E_TYPE for a float or string dtype (anndata 0.12 has no nullable-float encoding; a
 * float column carries NaN instead), or if `name` exists as another kind or dtype. */
ZB_API zb_status zb_anndata_writer_append_nullable_column(zb_anndata_writer *w,
                                                          zb_anndata_axis axis, const char *name,
                                                          zb_dtype dtype, const void *values,
                                                          uint64_t n, const uint8_t *mask,
                                                          uint64_t n_mask);

/* Appends `n` strings (layout as in zb_anndata_writer_append_names) with their mask to the
 * nullable string column `name` (pandas' string dtype with NA), creating it on the first call:
 * a group {"encoding-type": "nullable-string-array", "encoding-version": "0.1.0"} with
 * `values` (string-array) and `mask` (bool array). The mask is as in
 * zb_anndata_writer_append_nullable_column; a missing string is stored as "" (anndata's
 * na_value), and the bytes the caller has there are neither read nor checked (its offsets
 * still must not decrease). Errors as for zb_anndata_writer_append_nullable_column, plus
 * ZB_E_INVALID for a present string that is not valid UTF-8. */
ZB_API zb_status zb_anndata_writer_append_nullable_string_column(
    zb_anndata_writer *w, zb_anndata_axis axis, const char *name, const char *data,
    const uint64_t *offsets, uint64_t n, const uint8_t *mask, uint64_t n_mask);

/* Creates the categorical column `name` whose categories are `n_categories` numbers of `dtype`
 * (native byte order): integers of any width, ZB_DT_BOOL (0 or 1), ZB_DT_FLOAT32 or
 * ZB_DT_FLOAT64, e.g. leiden cluster ids as int64. The categories are stored as an array of
 * that dtype ({"encoding-type": "array", "encoding-version": "0.2.0"}), as anndata stores
 * `categories.to_numpy()`, so anndata reads the column back as a categorical of that dtype.
 * Codes, their stored type and `ordered` are as for zb_anndata_writer_define_categorical.
 * The categories must be distinct by value, as pandas requires: -0.0 equals 0.0. NaN is not
 * a category (pandas refuses null categories): a missing value is code -1.
 * Errors: ZB_E_INVALID for a bad name, an existing column of that name, a duplicate (the
 * message names the value), a NaN (naming its position), a bool other than 0/1, or more than
 * INT32_MAX - 1 categories; ZB_E_TYPE for ZB_DT_FLOAT16 (pandas has no float16 index) or
 * ZB_DT_STRING (use zb_anndata_writer_define_categorical). */
ZB_API zb_status zb_anndata_writer_define_categorical_values(zb_anndata_writer *w,
                                                             zb_anndata_axis axis, const char *name,
                                                             zb_dtype dtype, const void *categories,
                                                             uint64_t n_categories, bool ordered);

/* Writes everything that is still pending (the commit point is the root group document) and
 * erases the marker. Every obs column and obs_names must then hold n_obs values, every layer
 * n_obs rows, and every var column and var_names n_vars values (ZB_E_INVALID naming the column
 * or layer otherwise; nothing is committed and the writer stays usable, so the missing values
 * can still be appended). After a
 * successful commit the writer accepts nothing more (ZB_E_INVALID); close it. */
ZB_API zb_status zb_anndata_writer_commit(zb_anndata_writer *w);

/* Frees the writer. Without a successful commit the store is left incomplete: its marker stays
 * and readers refuse it. NULL is a no-op. */
ZB_API void zb_anndata_writer_close(zb_anndata_writer *w);

#ifdef __cplusplus
}
#endif
#endif
