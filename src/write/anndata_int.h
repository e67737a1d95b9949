/* Internals shared by the anndata layout writer's files: anndata.c (open, close, commit, groups
 * and consolidated metadata), anndata_matrix.c (X and layers) and anndata_frame.c (obs and var
 * columns). Format facts: shared FORMATS.md §6. */
#ifndef ZB_WRITE_ANNDATA_INT_H
#define ZB_WRITE_ANNDATA_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zbatch.h"

/* Elements converted per step when indptr, indices, codes or masked values are rebased,
 * narrowed or cleared (bounds the scratch buffer). */
#define ZB_AD_STEP 65536
/* Default rows per chunk of X/indptr and of every obs/var array: one row count for all columns
 * of a dataframe, which FORMATS.md §6 recommends (columns should share chunking). */
#define ZB_AD_DEFAULT_COLUMN_CHUNK 65536
/* Room for a key relative to the writer's path ("obs/NAME/categories", "layers/NAME/indptr"):
 * names are at most 1024 bytes (zb__ad_check_name). */
#define ZB_AD_REL_CAP 1100
#define ZB_AD_KEY_CAP 4200

typedef enum zb__ad_col_kind {
    ZB_AD_COL_NUMERIC,
    ZB_AD_COL_STRING,
    ZB_AD_COL_CATEGORICAL,
    ZB_AD_COL_NULLABLE /* values + mask; dtype ZB_DT_STRING for a nullable-string-array */
} zb__ad_col_kind;

typedef struct zb__ad_column {
    char *name;
    zb__ad_col_kind kind;
    zb_dtype dtype;         /* numeric and nullable: the values; categorical: the stored codes */
    zb_array_writer *array; /* values, strings or codes */
    zb_array_writer *mask;  /* nullable only */
    uint64_t n;             /* values appended */
    uint64_t n_categories;  /* categorical only */
    bool ordered;
} zb__ad_column;

typedef struct zb__ad_frame {
    const char *name;       /* "obs" or "var" */
    zb_array_writer *index; /* _index, created by the first append_names (or at commit) */
    uint64_t n_index;
    zb__ad_column *cols;
    size_t ncols, cap;
} zb__ad_frame;

/* A CSR matrix being written: X, or one layer. */
typedef struct zb__ad_csr {
    char *name;     /* a layer's name; NULL for X */
    zb_dtype dtype; /* of data */
    zb_array_writer *data, *indices, *indptr;
    uint64_t rows, nnz;
} zb__ad_csr;

/* A node written below the root, for consolidated metadata. */
typedef struct zb__ad_node {
    char *rel; /* relative to the writer's path */
    bool is_array;
} zb__ad_node;

struct zb_anndata_writer {
    zb_store *store;
    char path[4096]; /* normalised; "" = store root */
    int zarr_format;
    char *codec; /* copied option, NULL = the array writer's default */
    uint64_t x_chunk, x_shard, column_chunk;
    int num_threads;
    bool consolidate;
    zb_dtype index_dtype; /* of X/indices and every layer's indices */

    uint64_t n_vars;
    zb_anndata_x_kind x_kind;
    zb_dtype x_dtype;
    zb_array_writer *dense; /* a dense X */
    zb__ad_csr x;           /* a CSR X */
    uint64_t rows;          /* rows of X, either kind */

    zb__ad_csr *layers;
    size_t nlayers, cap_layers;

    zb__ad_frame frames[2];
    zb__ad_node *nodes;
    size_t nnodes, cap_nodes;

    int64_t *scratch; /* ZB_AD_STEP elements (8 bytes each) */
    zb_status failed; /* non-OK once an array write failed: the writer is unusable */
    bool committed;
};

/* ---- helpers (anndata.c) -------------------------------------------------------------------- */

/* ZB_OK if `w` takes calls: not NULL, not committed, not broken. `fn` names the caller. */
zb_status zb__ad_usable(const zb_anndata_writer *w, const char *fn);

/* Marks the writer unusable after a failed array write; returns st unchanged. */
static inline zb_status
zb__ad_broken(zb_anndata_writer *w, zb_status st)
{
    if (st != ZB_OK) w->failed = st;
    return st;
}

static inline zb__ad_frame *
zb__ad_frame_of(zb_anndata_writer *w, zb_anndata_axis axis)
{
    return &w->frames[axis == ZB_ANNDATA_VAR ? 1 : 0];
}

/* The store key of `rel` below the writer's path. */
zb_status zb__ad_key_of(const zb_anndata_writer *w, char *buf, size_t cap, const char *rel);

/* Records a node for the consolidated metadata. */
zb_status zb__ad_add_node(zb_anndata_writer *w, const char *rel, bool is_array);

/* {"encoding-type": type, "encoding-version": version} into buf. */
void zb__ad_encoding_attrs(char *buf, size_t cap, const char *type, const char *version);

/* Opens an array writer at `rel` with the writer's format and the codec string `codec` (NULL =
 * the array writer's default), and records the node. */
zb_status zb__ad_open_array(zb_anndata_writer *w, const char *rel, const char *codec,
                            zb_dtype dtype, int ndim, const uint64_t *row_shape,
                            uint64_t chunk_rows, uint64_t shard_rows, int threads,
                            const char *attrs_json, zb_array_writer **out);

/* Writes the group at `rel` with attributes `attrs` and records it. */
zb_status zb__ad_write_group(zb_anndata_writer *w, const char *rel, const char *attrs);

/* Rows per chunk of the obs/var arrays of `axis` (X/indptr uses the obs value). */
uint64_t zb__ad_column_chunk(const zb_anndata_writer *w, zb_anndata_axis axis);

/* Element names that become keys (columns, layers): non-empty, no '/', not "." or "..", no
 * reserved "__" prefix, at most 1024 bytes. `where` prefixes messages ("obs", "layers"). */
zb_status zb__ad_check_name(const char *where, const char *name);

/* Strings data[offsets[i] .. offsets[i+1]) for i < n, skipping those whose mask byte is 1
 * (mask may be NULL): offsets non-decreasing, data non-NULL when needed, each string valid
 * UTF-8 of at most 2^32-1 bytes, as the array writer requires; checked up front so that a
 * call is refused before anything is written. `what` names the element in messages. */
zb_status zb__ad_check_strings(const char *what, const char *data, const uint64_t *offsets,
                               uint64_t n, const uint8_t *mask);

/* ---- X and layers (anndata_matrix.c) -------------------------------------------------------- */

/* Opens X's arrays (called once by zb_anndata_writer_open). */
zb_status zb__ad_open_x(zb_anndata_writer *w);
/* Every layer holds n_obs rows (ZB_E_INVALID naming the first that does not). */
zb_status zb__ad_check_layers(const zb_anndata_writer *w);
/* Commits X's and every layer's arrays. */
zb_status zb__ad_commit_matrices(zb_anndata_writer *w);
/* Writes the X and layers/NAME csr_matrix groups. */
zb_status zb__ad_write_matrix_groups(zb_anndata_writer *w);
/* Frees X's and every layer's writers. */
void zb__ad_free_matrices(zb_anndata_writer *w);

/* ---- obs and var (anndata_frame.c) ---------------------------------------------------------- */

/* Every column and the names of both frames hold n_obs / n_vars values. */
zb_status zb__ad_check_frames(const zb_anndata_writer *w);
/* anndata's default row names "0", "1", ... for a frame written without names. */
zb_status zb__ad_write_default_names(zb_anndata_writer *w);
/* Commits every array of both frames. */
zb_status zb__ad_commit_frames(zb_anndata_writer *w);
/* Writes the categorical and nullable column groups, then both dataframe groups. */
zb_status zb__ad_write_frame_groups(zb_anndata_writer *w);
void zb__ad_free_frame(zb__ad_frame *f);

#endif
