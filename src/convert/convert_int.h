/* The conversion's internal state (zbatch_convert.h): the plan every task reads, the scratch
 * file format between scatter and gather, and the helpers the phases share.
 *
 * The plan is one JSON document, OUTPUT/.zbatch-convert/plan.json, written once by
 * zb_convert_plan and read by every process that runs tasks (plan.c). Everything a task needs
 * is derived from it and the inputs, so tasks run anywhere the directory is visible. Per-input
 * gene maps (int32 per input column: output gene or -1) sit beside it in maps/.
 *
 * Work directory (every file appears by rename, so it is complete or absent):
 *   plan.json              the plan; its "args" identify the conversion
 *   maps/i<k>-m<j>.bin      gene map of input k's matrix j
 *   prepare/i<k>.json       done: input k's CRC-64 and size
 *   prepare/i<k>-m<j>.csr   input k's matrix j transposed from CSC (csr_file.c format)
 *   scatter/t<t>.bin        done: task t's cells, one section per output dataset, and what
 *                           its values are (the stored types are chosen from these; scatter.c)
 *   gather/d<d>.json        done: dataset d's cells, nonzeros, files, CRC-64 and stored types
 */
#ifndef ZB_CONVERT_INT_H
#define ZB_CONVERT_INT_H

#include <json-c/json.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "convert/source.h"
#include "zarr/codec.h"
#include "sampler/sampler_int.h"
#include "zbatch.h"

#define CV_WORK_DIR ".zbatch-convert"
#define CV_MANIFEST "zbatch-manifest.json"
#define CV_PLAN_VERSION 1

/* An input matrix (X or a layer) as the plan saw it. */
typedef struct cv_in_matrix {
    zb__src_layout layout;
    zb_dtype dtype;
    uint64_t n_cols, nnz;
    bool monotone; /* the gene map keeps column order (no sort needed after remapping) */
    bool identity; /* the gene map is the identity (the input's genes are the output's) */
} cv_in_matrix;

typedef struct cv_input {
    char *path;
    char *format;     /* "h5ad" or "zarr" */
    uint64_t size;    /* bytes (a directory: of its files) */
    int64_t mtime_ns; /* newest modification time among its files */
    uint64_t n_obs, base;
    cv_in_matrix *mats; /* [cv->n_mats] */
} cv_input;

/* One obs column of the output, and where each input keeps it. */
typedef struct cv_column {
    char *name;
    zb__col_kind kind;     /* of the output */
    zb_dtype dtype;        /* numeric/nullable values; categorical: the categories' dtype */
    zb_strings categories; /* categorical: the output's table (text) */
    void *category_values; /* categorical, non-string: the table as values of dtype */
    bool ordered;
    size_t *src_index;     /* [n_inputs] the column's index in each source */
    int32_t **code_map;    /* categorical: [n_inputs][input categories] -> output code */
    uint64_t *n_src_codes; /* categorical: [n_inputs] input table sizes */
} cv_column;

/* A scatter task: rows [start, stop) of one input. */
typedef struct cv_slice {
    uint32_t input;
    uint64_t start, stop;
    uint64_t bytes; /* estimated bytes of its matrix data and indices */
} cv_slice;

struct zb_convert {
    char *output;          /* the collection: a directory or an s3:// URL */
    char *work;            /* output/.zbatch-convert, or the work_dir option */
    zb_store *out;         /* the output's store (thread-safe; every task writes through it) */
    bool remote;           /* the output is not a local directory (an s3:// URL) */
    json_object *plan_doc; /* the parsed plan (owned) */
    const char *args_text; /* its "args", compact (lives with plan_doc) */

    size_t n_inputs;
    cv_input *inputs;
    size_t n_mats;        /* X, then the layers */
    char **mat_keys;      /* input keys: "X" / "raw/X" / "layers/A", then "layers/B"... */
    char **mat_names;     /* output names: "X", then the layer names */
    zb_dtype *mat_dtypes; /* the inputs' promoted dtypes: of the scratch files' values */
    zb_convert_data_dtype data_choice;   /* the options' data_dtype */
    zb_convert_index_dtype index_choice; /* the options' index_dtype */
    /* the stored types (dtypes.c), found by the first gather from the scatter files */
    bool stored_known;
    zb_dtype *stored_dtypes; /* [n_mats] of each matrix's data */
    bool narrow_indices;
    zb_strings genes;
    size_t n_cols;
    cv_column *cols;

    uint64_t n_cells, dataset_size, n_datasets, input_bytes;
    uint64_t seed;
    bool shuffle;
    zb__perm perm;
    int zarr_format;
    char *codec; /* NULL = default */
    uint64_t x_chunk, x_shard;
    uint64_t memory_bytes;
    uint64_t block_bytes;   /* of the scatter files' blocks */
    bool direct;            /* the plan's "direct": gather reads matrix rows from the inputs */
    uint64_t task_memory;   /* memory one running task may use (0 = memory_bytes) */
    zb_strings input_names; /* the inputs as the command named them (src_path's categories) */
    bool finished;          /* opened on a finished collection: only its manifest is loaded */
    json_object *manifest;  /* (finished) */

    size_t n_slices;
    cv_slice *slices;

    /* run time: sources and gene maps, opened on first use by any thread */
    pthread_mutex_t lock;
    zb__src **srcs;             /* [n_inputs] */
    zb__src_matrix ***matrices; /* [n_inputs][n_mats]: the source's or a transposed file's */
    int32_t ***maps;            /* [n_inputs][n_mats] gene maps */
    uint64_t input_mmap_bytes;  /* zb_convert_set_input_mmap_bytes */
    bool buffered_output;       /* zb_convert_set_buffered_output: cv->out without direct I/O */
    struct cv_mapped *views;    /* [n_inputs * n_mats] mappings for the gather (cv_view) */
    uint64_t mapped_bytes;      /* what views map */
    struct cv_ws *ws_free;      /* workspaces no task holds */
    struct cv_checked *checked; /* objects of the output read back (cv_output_remember), by key */
    size_t n_checked, cap_checked;
};

/* ---- the scatter file (scatter.c) ----------------------------------------------------------
 *
 * A scatter task's cells, sorted by output position, as one file (numbers little-endian):
 *   header    cv_scatter_header (48 bytes)
 *   sections  n_datasets rows of 4 uint64: the section's cells, its blocks, the offset of its
 *             data and the length of its index part
 *   values    n_mats cv_value_stats (16 bytes each): what the task's values of each matrix
 *             are, so the stored types are chosen over the whole input by whoever gathers,
 *             in any process, after a restart too (dtypes.c)
 *   data      per section:
 *     index part: a uint32 compressed length per index array, then the block table (per block
 *                 a uint32 cell count and a uint32 compressed length per array, 0 for index
 *                 arrays), then the index arrays of all its cells, each compressed whole
 *     blocks:     per block, per non-index array in order, the block's elements compressed
 * Index arrays are the cells' rows in the dataset and every array that counts another's
 * elements: a gather task reads them once per section and then knows where every cell's
 * elements lie, so a pass reads and decompresses only the blocks its rows fall in. Blocks hold
 * about block_bytes of consecutive cells, sized by the plan so that every section's straddling
 * block in a pass fits the memory (the plan's "block_bytes"). Pieces are blosc (lz4, byte
 * shuffle at the array's item size): the scratch holds the cells once more, and a third of that
 * on disk and through the page cache costs less than writing it raw (docs/CONVERT.md).
 * The arrays of a section (cv_arrays gives them): the cells' rows in the dataset (uint64), their
 * rows in the input (uint64), obs names (uint32 lengths, bytes), each matrix (uint32 nonzeros,
 * uint32 gene ids, values of the output dtype), each obs column (numeric: values; categorical:
 * int32 output codes; string: uint32 lengths, bytes; nullable: its values or strings, then a
 * uint8 mask).
 * The direct path (the plan's "direct": every input matrix is CSR whose data and indices lie
 * unfiltered in the file, zb__src_matrix_raw) keeps the matrices' elements out of the file: a
 * matrix's arrays are then the cells' kept nonzeros (uint32), their first element in the input
 * (uint64) and their elements there (uint32), and the gather reads each row from its input with
 * pread, applying the gene map as the scatter would (cv_remap_row): the same output bytes. */

#define CV_SCATTER_MAGIC "ZBSCAT\0\4"
#define CV_SCATTER_VERSION 4
#define CV_MAX_ARRAYS 1024
#define CV_MIN_BLOCK_BYTES ((uint64_t)16 << 10)
#define CV_MAX_BLOCK_BYTES ((uint64_t)512 << 10)

typedef struct cv_scatter_header {
    char magic[8];
    uint32_t version, n_arrays;
    uint64_t n_datasets, input, n_cells, block_bytes;
} cv_scatter_header;

/* The codec of the scatter pieces (blosc lz4 level 5, byte shuffle). */
void cv_scratch_codec(zb__codec *codec);

/* One array of a section: `item` bytes per element; one element per cell (count < 0) or as
 * many as the uint32 array `count` says for each cell. */
typedef struct cv_array {
    size_t item;
    int count;
} cv_array;

/* Array indices of the fixed part and of matrix j / column c. */
enum { CV_A_ROW = 0, CV_A_SRC_ROW = 1, CV_A_NAME_LEN = 2, CV_A_NAME = 3, CV_A_FIRST_MATRIX = 4 };

static inline size_t
cv_matrix_array(size_t j)
{
    return CV_A_FIRST_MATRIX + 3 * j; /* nnz, indices, data */
}

/* The arrays of every section of this conversion, into out[CV_MAX_ARRAYS]; col_start[c] gets
 * the first array of column c. Returns the count. */
size_t cv_arrays(const zb_convert *cv, cv_array *out, size_t *col_start);
/* index[a] = whether array a is an index array (the rows, or another array's counts). */
void cv_index_arrays(const cv_array *arrays, size_t n, bool *index);

/* What a scatter task's values of one matrix are. Tasks combine by OR of the flags and the
 * largest max, so the whole input's is the fold of every task's. */
typedef struct cv_value_stats {
    uint64_t flags; /* CV_VALUES_* */
    uint64_t max;   /* the largest value, when none is CV_VALUES_WIDE */
} cv_value_stats;

#define CV_VALUES_ANY 1u  /* the task wrote values of this matrix */
#define CV_VALUES_WIDE 2u /* one is not an integer in [0, 65535] (negative, fractional, NaN, */
                          /* larger, or a bool matrix's): uint8/uint16 cannot hold it */

/* How a row's elements become the output's: input column ids through the gene map (-1 drops
 * one), values from `from` to `to`. */
typedef struct cv_row_map {
    const int32_t *map;
    bool identity, monotone; /* the input's cv_in_matrix flags */
    zb_dtype from, to;
} cv_row_map;

/* One row of m elements (column ids `ids`, values `vals` of rm->from) into out_ids / out_vals
 * (of rm->to): the kept elements in output gene order (sorted when the map reorders them, ties
 * in input order). keys holds 2m entries, raw m values of rm->from (scratch; unused for an
 * identity map). Returns the elements kept. The scatter and the direct gather both place rows
 * through it, so both paths give the same bytes. The ids must be < the map's length. */
uint64_t cv_remap_row(const cv_row_map *rm, const uint32_t *ids, const void *vals, uint64_t m,
                      uint64_t *keys, unsigned char *raw, uint32_t *out_ids, void *out_vals);
/* Sorts keys (gene << 32 | position) by gene, stably; tmp holds n entries. */
void cv_sort_by_gene(uint64_t *keys, uint64_t *tmp, size_t n);

/* ---- the stored types (dtypes.c) ------------------------------------------------------------ */

/* Folds `n` values of `dtype` into s. */
void cv_stats_add(cv_value_stats *s, const void *values, zb_dtype dtype, uint64_t n);
/* Whether values described by s all fit `to` (uint8 or uint16) exactly. */
bool cv_stats_fit(const cv_value_stats *s, zb_dtype to);
/* The index of the first of `n` values of `dtype` that `to` (uint8/uint16) cannot hold
 * exactly; n when all fit. */
uint64_t cv_first_misfit(const void *values, zb_dtype dtype, uint64_t n, zb_dtype to);
/* auto's choice for a matrix of promoted type `promoted` whose values s describes: uint8 or
 * uint16 when every value fits, else `promoted` (a bool matrix and one without values too). */
zb_dtype cv_narrowest(zb_dtype promoted, const cv_value_stats *s);
/* The stored type of matrix j whose values s describes, by the data_dtype option: keep, the
 * explicit type, or auto's cv_narrowest. The conversion (dtypes.c) and its limit (limit.c)
 * both decide through it. */
zb_dtype cv_stored_dtype(const zb_convert *cv, size_t j, const cv_value_stats *s);
/* Whether column ids are stored narrow, by the index_dtype option and the number of genes. */
bool cv_narrow_indices(const zb_convert *cv);
/* The type the explicit data_dtype option asks for (ZB_DT_COUNT_ for auto and keep). */
zb_dtype cv_explicit_dtype(zb_convert_data_dtype choice);
/* cv->stored_dtypes and cv->narrow_indices, from every scatter file's value stats (once per
 * handle; thread-safe). The scatter phase must be finished. */
zb_status cv_stored_types(zb_convert *cv);

/* ---- workspaces (workspace.c) ----------------------------------------------------------------
 *
 * Buffers a task takes from the handle and gives back, so the next task reuses memory already
 * touched (no page faults, no allocator churn). Slots [0, CV_MAX_ARRAYS) hold a scatter task's
 * arrays; the named ones above hold the rest. */

enum {
    CV_WS_ORDER = CV_MAX_ARRAYS,
    CV_WS_POS,
    CV_WS_SECTION,
    CV_WS_KEYS,
    CV_WS_RAW,
    CV_WS_ARENA,
    CV_WS_WHO,
    CV_WS_INDPTR,
    CV_WS_INDICES,
    CV_WS_VALUES,
    CV_WS_OFFSETS,
    CV_WS_TEXT,
    CV_WS_MASK,
    CV_WS_TABLE,
    CV_WS_PACKED,
    CV_WS_CUTS,
    CV_WS_JOBS,
    CV_WS_STARTS0,
    CV_WS_STARTS_N = 64, /* prefix sums of up to 64 count arrays */
    CV_WS_SLOTS = CV_WS_STARTS0 + CV_WS_STARTS_N
};

typedef struct cv_ws {
    struct cv_ws *next;
    void *slot[CV_WS_SLOTS];
    size_t cap[CV_WS_SLOTS];
    zb__csr_block *mats; /* read blocks, capacities kept */
    size_t n_mats;
    zb__col_block *cols;
    size_t n_cols;
    zb_ctx *ctx;   /* codec contexts for the scratch pieces */
    zb__buf piece; /* one compressed piece */
    zb__buf blob;  /* a scatter file's pieces */
} cv_ws;

zb_status cv_ws_take(zb_convert *cv, cv_ws **out);
void cv_ws_give(zb_convert *cv, cv_ws *ws);
/* Slot `slot` holding at least `bytes` (contents kept); *out is its buffer. */
zb_status cv_ws_grow(cv_ws *ws, size_t slot, size_t bytes, void **out);
/* At least n_mats CSR blocks and n_cols column blocks. */
zb_status cv_ws_blocks(cv_ws *ws, size_t n_mats, size_t n_cols);
void cv_ws_free_all(zb_convert *cv);

/* ---- plan.c ------------------------------------------------------------------------------ */

/* The "args" object that identifies a conversion (normalised options and inputs as given). */
zb_status cv_args_json(const char *const *inputs, size_t n, const zb_convert_opts *o,
                       json_object **out);
/* Plans and writes work/plan.json (and maps/); scatter slices sized for `num_threads` tasks
 * at once within o->memory_bytes. On success keep[k] (when keep is not NULL) gets input k's
 * source, still open, for the tasks of the same process (what the plan found out about its
 * matrices, such as their chunk tables, is not found out again). */
zb_status cv_plan_write(const char *const *inputs, size_t n, const zb_convert_opts *o,
                        const char *work, json_object *args, int num_threads, zb__src **keep);
/* The args' names of the data_dtype / index_dtype options ("auto", "keep", "uint8", ...), and
 * back (ZB_E_CORRUPT for a name that is none of them). */
const char *cv_data_choice_name(zb_convert_data_dtype c);
const char *cv_index_choice_name(zb_convert_index_dtype c);
zb_status cv_choices_of(const char *data, const char *index, zb_convert_data_dtype *d,
                        zb_convert_index_dtype *x);
/* Names the first member of two args objects that differs, with both values, into buf. */
void cv_args_difference(json_object *had, json_object *now, char *buf, size_t cap);
/* Loads the plan of cv->work into cv (cv->output and cv->work set). */
zb_status cv_plan_load(zb_convert *cv);

/* The source of input k (opened on first use; thread-safe). */
zb_status cv_source(zb_convert *cv, uint32_t k, zb__src **out);
/* Matrix j of input k: the source's, or the CSR file prepare made of a CSC one. */
zb_status cv_matrix(zb_convert *cv, uint32_t k, size_t j, zb__src_matrix **out);
/* Gene map of input k's matrix j (loaded on first use). */
zb_status cv_gene_map(zb_convert *cv, uint32_t k, size_t j, const int32_t **out);
/* A mapped file and the descriptor it was mapped from (one mapping per file: the matrices of an
 * .h5ad share libhdf5's descriptor). */
typedef struct cv_mapped {
    zb__src_map map;
    int fd;
} cv_mapped;

/* Matrix j of input k (its raw description `raw`, zb__src_matrix_raw) mapped read-only, once per
 * handle; the matrices of one file share one mapping. *out is NULL (read with pread) when the
 * file does not fit what may be mapped: input_mmap_bytes, and half of memory_bytes in all.
 * The caller checks first that the input is the file that was planned (cv_input_unchanged:
 * a file truncated under a mapping is SIGBUS). Thread-safe. */
zb_status cv_view(zb_convert *cv, uint32_t k, size_t j, const zb__src_raw *raw,
                  const zb__src_map **out);
/* Unmaps what cv_view mapped (zb_convert_close). */
void cv_views_free(zb_convert *cv);

/* "work/<rel>" into buf (ZB_E_INVALID when it does not fit). */
zb_status cv_path(const zb_convert *cv, char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Output position of global cell g: its dataset and row there. */
static inline void
cv_position(const zb_convert *cv, uint64_t g, uint64_t *dataset, uint64_t *row)
{
    uint64_t p = cv->shuffle ? zb__perm_apply(&cv->perm, g) : g;
    *dataset = p / cv->dataset_size;
    *row = p % cv->dataset_size;
}

/* Cells of dataset d. */
static inline uint64_t
cv_dataset_cells(const zb_convert *cv, uint64_t d)
{
    uint64_t start = d * cv->dataset_size;
    return cv->n_cells - start < cv->dataset_size ? cv->n_cells - start : cv->dataset_size;
}

/* ---- files (files.c) --------------------------------------------------------------------- */

/* Writes `n` buffers to `path` as one file: a temporary beside it, fsync, rename, so the file
 * is complete or absent. */
zb_status cv_write_file(const char *path, const void *const *bufs, const size_t *lens, size_t n);
/* Reads a whole small file (NUL-terminated; free with free()). */
zb_status cv_read_file(const char *path, char **text, size_t *len);
/* mkdir -p */
zb_status cv_mkdirs(const char *path);
/* Removes a directory tree (rm -rf); a missing one is fine. */
zb_status cv_remove_tree(const char *path);
/* True when `path` exists. */
bool cv_exists(const char *path);
/* Size, newest mtime and CRC-64 (xz) of a file, or of a directory's files in sorted order
 * (each file's relative path, size and CRC-64 combined into one CRC-64). `crc` may be NULL to
 * skip reading the contents. */
zb_status cv_fingerprint(const char *path, uint64_t *size, int64_t *mtime_ns, uint64_t *crc);
/* ZB_E_INVALID naming the input when its size or modification time differ from the plan's. */
zb_status cv_input_unchanged(const cv_input *in);
/* Values a file's CRC-64 pass folds into stats as it reads past them: `len` bytes at `at`,
 * whole elements of `dtype` in native byte order, into *stats. */
typedef struct cv_fold {
    uint64_t at, len;
    zb_dtype dtype;
    cv_value_stats *stats;
} cv_fold;
/* CRC-64 (xz) of a file, folding the values of `n` extents (sorted by offset, not overlapping,
 * none empty) into their stats on the way: one read of every byte for both. ZB_E_TRUNCATED
 * when the file ends before an extent does. */
zb_status cv_file_crc(const char *path, const cv_fold *folds, size_t n, uint64_t *crc);
/* CRC-64 (xz) of `len` bytes, continuing from `crc` (0 to start). */
uint64_t cv_crc64(uint64_t crc, const void *data, size_t len);

/* ---- string tables (strings.c) ----------------------------------------------------------- */

typedef struct cv_strbuf {
    zb_strings s; /* free with zb_strings_free(&b.s) */
    uint64_t cap_n, cap_bytes;
} cv_strbuf;

zb_status cv_strbuf_push(cv_strbuf *b, const char *p, size_t len);
zb_status cv_strbuf_push_from(cv_strbuf *b, const zb_strings *s, uint64_t i);
bool cv_strings_equal(const zb_strings *a, const zb_strings *b);
/* Byte order of a[i] and b[j], a shorter string first on a common prefix. */
int cv_strings_cmp(const zb_strings *a, uint64_t i, const zb_strings *b, uint64_t j);

/* ---- numbers (values.c) ------------------------------------------------------------------- */

/* numpy's np.result_type for two of zbatch's numeric dtypes (bools and integers and floats);
 * ZB_DT_COUNT_ when there is none (a string). */
zb_dtype cv_promote(zb_dtype a, zb_dtype b);
/* Converts `n` values from `from` to `to` (as numpy's astype does for these types). */
void cv_convert_values(void *dst, zb_dtype to, const void *src, zb_dtype from, uint64_t n);

/* ---- digests of what a writer puts (digest.c) ------------------------------------------------

 * A store over `inner` (borrowed: it must outlive the digest's store) that remembers the size
 * and CRC-64 of every object put below `prefix` (renames and erases followed), so a dataset's
 * checksum comes from the bytes written without reading them back. The combined CRC-64 is the
 * one cv_fingerprint computes over the files of root/prefix, and cv_output_fingerprint over the
 * objects below prefix. With `check`, objects of ZB_STORE_DIRECT_MIN_BYTES and more are read
 * back from `inner` on a thread of the digest's own as soon as they are put. */
typedef struct cv_digest cv_digest;
zb_status cv_digest_open(zb_store *inner, const char *prefix, bool check, cv_digest **out,
                         zb_store **store);
/* Files, bytes and combined CRC-64 of the objects now present below the prefix, once every
 * read-back queued has ended; ZB_E_CHECKSUM (naming the object) when one read back other bytes
 * than were put, or the read's error. */
zb_status cv_digest_result(cv_digest *dg, uint64_t *files, uint64_t *bytes, uint64_t *crc);
/* Hands the objects read back equal (after cv_digest_result) to cv_output_remember. */
zb_status cv_digest_remember(cv_digest *dg, zb_convert *cv);
void cv_digest_free(cv_digest *dg);

/* ---- the output (output.c) ------------------------------------------------------------------
 *
 * Everything the conversion writes into its output goes through cv->out, so that an s3://
 * output works as a directory does: the marker, the datasets, the root group, the manifest.
 * S3 has no rename; nothing there needs one: each object is one PUT (or a multipart upload
 * that is aborted on failure), and what makes a dataset or the collection openable is written
 * after what it names (docs/REMOTE.md). */

/* Opens cv->out for cv->output (remote options may be NULL) and sets cv->remote; a local
 * directory that does not exist yet is left closed (cv->out NULL). */
zb_status cv_output_open(zb_convert *cv, const zb_remote_opts *remote);
/* Opens the local directory `dir` as a store written the way the conversion writes its output:
 * with direct I/O (zb_store_opts.direct_io: written once, read back once), unless `buffered`
 * (zb_convert_opts.buffered_output; docs/CONVERT.md). */
zb_status cv_output_open_dir(const char *dir, bool buffered, zb_store **out);
/* Makes a local output's directory and opens its store (a remote one is open already). */
zb_status cv_output_make(zb_convert *cv);
/* Whether the output holds object `key`. */
bool cv_output_has(zb_convert *cv, const char *key);
/* Puts `len` bytes as object `key` of the output (whole or not at all). */
zb_status cv_output_put(zb_convert *cv, const char *key, const void *data, size_t len);
/* Reads object `key` of the output whole (NUL-terminated; free with free()). */
zb_status cv_output_read(zb_convert *cv, const char *key, char **text, size_t *len);
/* Removes everything below `prefix` of the output; a missing prefix is fine. */
zb_status cv_output_remove(zb_convert *cv, const char *prefix);
/* Bytes and combined CRC-64 of the objects below `prefix`, read back from the output, in the
 * order and form of cv_fingerprint; ZB_E_NOTFOUND when there is none. An object this process
 * has already read back (cv_output_remember) and whose size is still the one read is not read
 * again. */
zb_status cv_output_fingerprint(zb_convert *cv, const char *prefix, uint64_t *size, uint64_t *crc);
/* Records that object `key` of the output was read back with `size` bytes and CRC-64 `crc`. */
zb_status cv_output_remember(zb_convert *cv, const char *key, uint64_t size, uint64_t crc);
/* Frees what cv_output_remember recorded. */
void cv_output_forget_all(zb_convert *cv);
/* Size and CRC-64 of object `key` of `store`, read in blocks of `block` bytes into `buf` until
 * one comes back short (no size request first). */
zb_status cv_object_crc(zb_store *store, const char *key, uint8_t *buf, size_t block,
                        uint64_t *size, uint64_t *crc);
/* Path order of a directory walk: component by component, each compared as bytes. */
int cv_cmp_walk(const char *a, const char *b);

/* ---- finish.c --------------------------------------------------------------------------------- */

/* Opens the finished collection in cv->output when its manifest's args are `args`. */
zb_status cv_finished_open(zb_convert *cv, json_object *args);

/* ---- phases ------------------------------------------------------------------------------- */

zb_status cv_prepare_task(zb_convert *cv, size_t k);
/* What input k's prepare task found its matrices' values to be, where it folded them while
 * reading the file for the CRC-64 (prepare.c): have[j] says whether it did for matrix j, and
 * then stats[j] holds them (arrays of n_mats). A prepare file without them (none folded, or
 * written by an older zbatch) gives have[j] false everywhere. */
zb_status cv_prepared_values(const zb_convert *cv, size_t k, cv_value_stats *stats, bool *have);
zb_status cv_scatter_task(zb_convert *cv, size_t t);
zb_status cv_gather_task(zb_convert *cv, size_t d, int num_threads);
/* Bytes of memory one scatter task / one gather holds at most, from the plan. */
uint64_t cv_scatter_task_memory(const zb_convert *cv, size_t t);
uint64_t cv_gather_overhead(const zb_convert *cv);
/* Memory one dataset's writer holds at most: per matrix, for data and indices each, six
 * shards' worth (the shard filling; the one compressing with its compressed pieces and the
 * assembled shard; the array writer's spare job and buffer kept for the next shard); a chunk
 * per obs column; a margin. */
uint64_t cv_writer_bytes(uint64_t x_chunk, uint64_t x_shard, const zb_dtype *mat_dtypes,
                         size_t n_mats, size_t n_cols);
/* Datasets gathered at once: as many as `memory` holds with their writers and a 32 MiB pass
 * each, at most `threads` and the datasets there are. */
uint64_t cv_concurrent_gathers(uint64_t memory, uint64_t writer, uint64_t n_datasets, int threads);

#endif
