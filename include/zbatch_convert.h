/* zbatch_convert.h — part of the public C API (included by zbatch.h): converting AnnData inputs
 * (.h5ad files, anndata Zarr stores) into a pre-shuffled, sharded collection. Conventions,
 * status codes and thread-safety rules are those of zbatch.h. */
#ifndef ZBATCH_CONVERT_H
#define ZBATCH_CONVERT_H

#include "zbatch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Converting AnnData inputs into a collection.
 *
 * The output is a directory holding a Zarr group with the attributes annbatch gives its
 * pre-shuffled collections ({"encoding-type": "annbatch-preshuffled", "encoding-version":
 * "0.1.0"}) and children dataset_0, dataset_1, ... each a complete AnnData store (anndata
 * layout, zbatch_anndata.h) of `dataset_size` cells (the last one holds the rest), with
 * consolidated metadata for the whole tree. annbatch's DatasetCollection and Loader open it;
 * zbatch opens it as a "collection" dataset.
 *
 * What lands in the output:
 * - every input cell exactly once, at a uniformly random position of the whole collection (a
 *   keyed bijection of [0, N) from `seed`; the same inputs, options and seed always give the
 *   same positions);
 * - X: the chosen input matrix (X, raw/X or a layer) as CSR, its columns aligned by gene name
 *   to one gene list: the inputs' var names joined (outer: every gene of any input; inner:
 *   genes of every input), or an explicit list. When every input has the same var names in
 *   the same order, that order is kept; otherwise an outer join is sorted by name and an inner
 *   join keeps the first input's order (anndata.concat's rules). A gene an input lacks is zero
 *   in its cells. Inputs of different types are promoted as numpy does (np.result_type); the
 *   values are then stored in the narrowest type that holds every one of them exactly (see
 *   `data_dtype`: uint8 for raw counts up to 255, uint16 up to 65,535, else the promoted
 *   type), decided over the whole input so every dataset gets the same types, and column ids
 *   in uint8/uint16 up to 65,535 genes (`index_dtype`). Column ids are ascending within each
 *   row where the input's are.
 * - obs: the chosen columns, each merged into one type across inputs: categoricals get one
 *   category table (an input's table when all agree, else the sorted union) and codes
 *   remapped, so a code means the same in every dataset; numeric columns are promoted as
 *   numpy does, a plain and a nullable integer column give a nullable one. Two columns are
 *   added: `src_path` (categorical: the input path as given, in input order) and `src_row`
 *   (int64: the cell's row in its input). obs names are kept as they are.
 * - var: the gene list as var names.
 * - a manifest, zbatch-manifest.json: the options, the stored types ("dtypes": {"X/data":
 *   "uint8", "X/indices": "uint16", "layers/NAME/data": ...}), each input's size, CRC-64 (xz)
 *   and cell count, and each dataset's cells, nonzeros, files, bytes and CRC-64 over its
 *   files.
 *
 * How it runs: three phases of independent tasks, then a finishing step.
 *   prepare  one task per input: its CRC-64, and a CSC matrix transposed to CSR (scratch file)
 *   scatter  one task per slice of an input's rows: cells read, genes and codes remapped,
 *            written to one scratch file holding one section per output dataset
 *   gather   one task per output dataset: its sections read pass by pass in row order, the
 *            dataset written and committed
 *   finish   the collection's root group with consolidated metadata, the manifest, every
 *            dataset's files checked against it, the scratch directory removed.
 * zb_convert_run drives them on the library's threads; a caller with its own engine (the
 * Python package's Dask path) runs the same tasks anywhere that sees the output directory,
 * in any order within a phase, and gets the same bytes.
 *
 * Memory: about `memory_bytes` at most for the data in flight (input slices, scratch
 * sections, the gather passes and the writers' shards), whatever the input size, plus a
 * constant for the libraries and threads (see docs/CONVERT.md).
 *
 * Restart: the plan, the finished tasks and the work of each phase live in
 * OUTPUT/.zbatch-convert/ (or the `work_dir` option's directory). A conversion killed at any point and started again with the same
 * inputs and options redoes only unfinished tasks and gives a byte-identical result; started
 * with other inputs or options it is refused (ZB_E_INVALID naming what differs). Inputs that
 * changed since the plan (size or modification time) are refused too. Until the finishing
 * step completes the root carries the incomplete marker (ZB_INCOMPLETE_MARKER) and readers
 * refuse the collection.
 *
 * An s3:// output (`remote` gives its credentials): the work directory stays local
 * (`work_dir`); the datasets, the root group with its consolidated metadata and the manifest
 * are objects of the bucket. Each dataset's data objects go in before the metadata that makes
 * it openable, the root zarr.json only after every dataset was read back from the bucket and
 * matched its checksum, then the manifest, and the marker object is erased last, so nothing
 * half-written is ever visible as complete (S3 has no rename and needs none here). A restart
 * with the same work directory skips the datasets its finished tasks record; the finishing
 * step's check against the bytes in the bucket catches any that changed, and rewrites them on
 * the next run. zb_convert_open and the Dask path take local outputs only.
 * ------------------------------------------------------------------------------------------- */

typedef enum zb_var_join {
    ZB_VAR_OUTER = 0, /* every gene of any input */
    ZB_VAR_INNER = 1  /* the genes every input has */
} zb_var_join;

typedef enum zb_convert_phase {
    ZB_CONVERT_PREPARE = 0,
    ZB_CONVERT_SCATTER = 1,
    ZB_CONVERT_GATHER = 2,
    ZB_CONVERT_PHASES_ = 3
} zb_convert_phase;

/* Progress of zb_convert_run, reported after each finished task (from any thread, one call at
 * a time). `bytes_*` count input bytes (the uncompressed size of the matrix data read) for
 * prepare and scatter and output cells' bytes for gather, so rates are comparable across
 * phases. */
typedef struct zb_convert_progress {
    zb_convert_phase phase;
    uint64_t tasks_done, tasks_total; /* of this phase */
    uint64_t cells_done, cells_total; /* of this phase (prepare: cells of finished inputs) */
    uint64_t bytes_done, bytes_total;
} zb_convert_progress;

typedef void (*zb_convert_progress_fn)(void *ctx, const zb_convert_progress *progress);

/* The type X/data and every layer's data are stored in. The choice is made for each matrix
 * over every value the scatter phase writes (genes dropped by the join do not count), so every
 * dataset of the collection gets the same types. */
typedef enum zb_convert_data_dtype {
    ZB_CONVERT_DATA_AUTO = 0,   /* the narrowest exact type: uint8 when every value is an
                                   integer in [0, 255], uint16 in [0, 65,535], else the inputs'
                                   promoted type (a negative, non-integer, NaN or infinite
                                   value, a bool matrix or one without values keeps it) */
    ZB_CONVERT_DATA_KEEP = 1,   /* the inputs' promoted type */
    ZB_CONVERT_DATA_UINT8 = 2,  /* uint8; a value that is not an integer in [0, 255] fails the
                                   scatter task (ZB_E_INVALID naming the input, the row and the
                                   value): nothing is ever stored changed */
    ZB_CONVERT_DATA_UINT16 = 3, /* uint16, checked the same way for [0, 65,535] */
    ZB_CONVERT_DATA_FLOAT32 = 4 /* float32, converted as numpy's astype does (not checked) */
} zb_convert_data_dtype;

/* The type of the column ids of X and the layers. */
typedef enum zb_convert_index_dtype {
    ZB_CONVERT_INDEX_AUTO = 0,  /* narrow (uint8 up to 255 genes, uint16 up to 65,535) as
                                   zb_anndata_write_opts.narrow_indices does; int32 above */
    ZB_CONVERT_INDEX_INT32 = 1, /* int32, as anndata writes by default */
    ZB_CONVERT_INDEX_NARROW = 2 /* anndata's smallest unsigned type, uint32 above 65,535 */
} zb_convert_index_dtype;

/* Cells per output dataset when the options leave it 0: 2,097,152 (2^21), the dataset size of
 * the published Tahoe-100M collection. */
#define ZB_CONVERT_DEFAULT_DATASET_SIZE ((uint64_t)1 << 21)
/* Memory when the options leave it 0: 4 GiB. */
#define ZB_CONVERT_DEFAULT_MEMORY ((uint64_t)4 << 30)
/* Least memory a conversion accepts: 64 MiB. */
#define ZB_CONVERT_MIN_MEMORY ((uint64_t)64 << 20)

typedef struct zb_convert_opts {
    uint64_t dataset_size;  /* cells per output dataset; 0 = ZB_CONVERT_DEFAULT_DATASET_SIZE */
    zb_var_join var_join;   /* how gene lists are joined (ignored with `genes`) */
    const char *genes;      /* path of a text file, one gene name per line: the output's var,
                               in that order; NULL = join the inputs' var names (a conversion
                               is identified by the list's contents, not by the file's path) */
    const char *const *obs; /* obs columns to keep (every input must have them); NULL = every
                               column all inputs have (`n_obs` ignored) */
    size_t n_obs;
    const char *x_key;         /* the input matrix that becomes X: "X" (NULL), "raw/X" or
                               "layers/NAME" */
    const char *const *layers; /* input layers carried as layers/NAME (CSR), aligned like X */
    size_t n_layers;
    uint64_t memory_bytes; /* 0 = ZB_CONVERT_DEFAULT_MEMORY; at least ZB_CONVERT_MIN_MEMORY */
    uint64_t seed;         /* of the cells' positions */
    bool shuffle;          /* false: cells keep input order (input 0's rows, then input 1's) */
    int zarr_format;       /* 3 (default) or 2 (annbatch reads only 3) */
    const char *codec;     /* every array's codec string (zbatch.h); NULL = the writers' default */
    uint64_t x_chunk;      /* elements per (inner) chunk of X/data and X/indices; 0 = the anndata
                               writer's default */
    uint64_t x_shard;      /* elements per shard (v3); 0 = 1,024 chunks; UINT64_MAX = unsharded */
    int num_threads;       /* 0 = every online CPU */
    zb_convert_progress_fn progress; /* may be NULL */
    void *progress_ctx;
    zb_convert_data_dtype data_dtype;   /* of X/data and the layers' data (default AUTO) */
    zb_convert_index_dtype index_dtype; /* of X/indices and the layers' (default AUTO) */
    const char *work_dir;         /* the local work directory (plan, scratch files, finished tasks);
                             NULL = OUTPUT/.zbatch-convert. Needed for an s3:// output, whose
                             scratch stays local: the command and the Python package default to
                             zb_convert_default_work_dir's. A restart must name the same one. */
    const zb_remote_opts *remote; /* credentials, endpoint and tuning of an s3:// output (NULL:
                                     defaults, anonymous); copied when the output is opened */
    /* bytes of the inputs the gather may map read-only and take rows from (whole files, while
     * they fit; at most half of memory_bytes, as mapped pages count in the process's RSS); the
     * other inputs are read with pread. 0 = pread only. Default ZB_STORE_DEFAULT_MMAP_BYTES; the
     * command and the Python package take ZBATCH_MMAP_BYTES. A mapped input truncated in place
     * during the gather raises SIGBUS; one changed before it is an error either way. Not part
     * of the plan: the bytes are the same. */
    uint64_t input_mmap_bytes;
    /* every cell through the scatter's scratch files, even where the gather could take the
     * rows straight from the inputs (the plan records "direct": false; docs/CONVERT.md): for
     * comparisons. Chosen when the conversion is planned and kept in its plan, so a resumed
     * conversion keeps the choice it started with. The same bytes either way. The command and
     * the Python package take ZBATCH_CONVERT_SCRATCH. Default false. */
    bool scratch_path;
    /* the output written (and read back for its checksums) through the page cache, without
     * direct I/O (zb_store_opts.direct_io): for comparisons and for a file system that accepts
     * O_DIRECT but is slow with it. The same bytes either way. Not part of the plan: a caller
     * running tasks itself sets it on each handle with zb_convert_set_buffered_output. The
     * command and the Python package take ZBATCH_CONVERT_BUFFERED. Default false. */
    bool buffered_output;
} zb_convert_opts;

#define ZB_CONVERT_OPTS_DEFAULT                                                                    \
    {                                                                                              \
        0, ZB_VAR_OUTER, NULL, NULL, 0, NULL, NULL, 0, 0, 0, true, 3, NULL, 0, 0, 0, NULL, NULL,   \
            ZB_CONVERT_DATA_AUTO, ZB_CONVERT_INDEX_AUTO, NULL, NULL, ZB_STORE_DEFAULT_MMAP_BYTES,  \
            false, false                                                                           \
    }

typedef struct zb_convert zb_convert;

/* Plans the conversion of `inputs` into the directory `output`, or picks up the one planned
 * there before with the same inputs and options. Reads the inputs' metadata and their pointer
 * arrays (8 bytes per cell), never their values. Errors name the input and what is wrong:
 * ZB_E_NOTFOUND (an input, a matrix, an obs column an input lacks), ZB_E_UNSUPPORTED (an input
 * that is not AnnData), ZB_E_INVALID (duplicate var names in an input, an empty gene list,
 * columns whose types cannot be merged, `output` holding something else, options differing
 * from the conversion in progress, an input changed since it was planned). */
ZB_API zb_status zb_convert_plan(const char *const *inputs, size_t n_inputs, const char *output,
                                 const zb_convert_opts *opts, zb_convert **out);

/* The work directory a conversion into `output` uses when the caller names none and the output
 * is remote: TMPDIR/zbatch-convert-HEX, HEX a hash of the output URL, so that a restart of the
 * same conversion finds the work of the killed run. `tmpdir` is the caller's temporary
 * directory (the library reads no environment variable; NULL = "/tmp"). ZB_E_INVALID when it
 * does not fit `cap` bytes. */
ZB_API zb_status zb_convert_default_work_dir(const char *output, const char *tmpdir, char *buf,
                                             size_t cap);

/* Opens the conversion planned in `output` (by zb_convert_plan, possibly in another process or
 * on another machine sharing the directory), to run its tasks. ZB_E_NOTFOUND when none is. */
ZB_API zb_status zb_convert_open(const char *output, zb_convert **out);

/* Tasks of a phase. */
ZB_API size_t zb_convert_ntasks(const zb_convert *cv, zb_convert_phase phase);

/* True when task `i` of `phase` finished (in this or an earlier run). */
ZB_API bool zb_convert_task_done(const zb_convert *cv, zb_convert_phase phase, size_t i);

/* Runs task `i` of `phase` unless it finished already; the tasks of a phase need the previous
 * phase finished (ZB_E_INVALID otherwise). A task's work appears complete or not at all, so a
 * task killed half-way is simply run again. `num_threads` threads may be used inside it
 * (gather compresses with them). Thread-safety: distinct tasks may run at once on one handle
 * or in several processes; one task must not run twice at the same time. */
ZB_API zb_status zb_convert_run_task(zb_convert *cv, zb_convert_phase phase, size_t i,
                                     int num_threads);

/* The memory one task run through this handle may use from now on (a gather's passes are
 * sized by it); 0 = the plan's memory_bytes. A caller running several tasks at once in one
 * process gives each its share. */
ZB_API void zb_convert_set_task_memory(zb_convert *cv, uint64_t bytes);

/* The bytes of inputs the tasks run through this handle from now on may map (0 = read rows
 * with pread only): the zb_convert_opts field `input_mmap_bytes` for a caller running tasks
 * itself. A handle starts with ZB_STORE_DEFAULT_MMAP_BYTES. */
ZB_API void zb_convert_set_input_mmap_bytes(zb_convert *cv, uint64_t bytes);

/* Whether the tasks run through this handle from now on write the output through the page
 * cache: the zb_convert_opts field `buffered_output` for a caller running tasks itself (a
 * handle from zb_convert_open starts with direct I/O). A local output's store is opened again
 * with the new choice: call it before running tasks, not while one runs on the handle. Errors
 * as zb_store_open_file_opts's (the output's directory gone), the handle left as it was. */
ZB_API zb_status zb_convert_set_buffered_output(zb_convert *cv, bool buffered);

/* Finishes a conversion whose tasks all finished: writes the root group and its consolidated
 * metadata, writes the manifest, verifies every dataset's files against it (ZB_E_CHECKSUM
 * naming the file otherwise), removes the scratch directory and the marker. */
ZB_API zb_status zb_convert_finish(zb_convert *cv);

/* Everything: plan (or resume), the three phases on `num_threads` threads, finish. A
 * collection already finished in `output` with the same inputs and options is verified
 * against its manifest and left as it is. The run holds a lock on the work directory: a
 * second run into the same output at the same time is refused (ZB_E_INVALID). */
ZB_API zb_status zb_convert_run(const char *const *inputs, size_t n_inputs, const char *output,
                                const zb_convert_opts *opts);

/* Facts of a planned conversion. */
typedef struct zb_convert_info {
    uint64_t n_cells; /* of all inputs */
    uint64_t n_genes; /* of the output */
    uint64_t n_datasets;
    uint64_t input_bytes; /* uncompressed bytes of the input matrices' data and indices */
    const char *work_dir; /* lives as long as the handle */
} zb_convert_info;

ZB_API void zb_convert_get_info(const zb_convert *cv, zb_convert_info *info);

ZB_API void zb_convert_close(zb_convert *cv);

/* The conversion's own limit on this machine: the time to read every input cell alone
 * (`read_s`: the scatter's reads on the same threads, nothing written), and an ordered copy
 * that reads every cell again and writes the inputs' X in input order through the anndata
 * writer with the conversion's codec, chunks, shards and threads, into a scratch directory
 * below `output` that is removed afterwards; `compress_s` is the copy's time minus read_s, so
 * read_s + compress_s is what reading and writing take without the shuffle. Nothing of the
 * conversion is written. */
typedef struct zb_convert_limit {
    double read_s, compress_s;
    uint64_t cells;
    uint64_t input_bytes;  /* the plan's estimate of the inputs' uncompressed bytes */
    uint64_t output_bytes; /* uncompressed bytes of the output's X (data and indices) */
} zb_convert_limit;

ZB_API zb_status zb_convert_measure_limit(const char *const *inputs, size_t n_inputs,
                                          const char *output, const zb_convert_opts *opts,
                                          zb_convert_limit *out);

#ifdef __cplusplus
}
#endif
#endif
