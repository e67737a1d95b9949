/* zbatch_atomic.h — part of the public C API (included by zbatch.h): the atomic layout writer.
 * Conventions, status codes and thread-safety rules are those of zbatch.h. */
#ifndef ZBATCH_ATOMIC_H
#define ZBATCH_ATOMIC_H

#include "zbatch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Writing nvalchemi AtomicData stores (shared FORMATS.md §8).
 *
 * A dataset of N structures ("samples") lives in a Zarr v3 group at `path` of a store:
 *
 *   <path>/zarr.json      group; attributes {"num_samples": N,
 *                                            "fields": {"core": {name: level}, "custom": {...}}}
 *   <path>/meta/atoms_ptr     int64 [N+1]  0, then the running total of atoms per sample
 *   <path>/meta/edges_ptr     int64 [N+1]  0, then the running total of edges per sample
 *   <path>/meta/samples_mask  bool  [N]    false = soft-deleted
 *   <path>/meta/atoms_mask    bool  [V]    false = the atom belongs to a deleted sample
 *   <path>/meta/edges_mask    bool  [E]
 *   <path>/core/<name>        one array per field: [V, ...] (atom level), [E, ...] (edge
 *                             level) or [N, ...] (system level)
 *   <path>/custom/<name>      the same, for fields outside nvalchemi's AtomicData
 *
 * Every array uses the default chunk keys (c/0/0) and is chunked along axis 0 only. Sample p
 * owns rows [atoms_ptr[p], atoms_ptr[p+1]) of every atom-level array, rows [edges_ptr[p],
 * edges_ptr[p+1]) of every edge-level array and row p of every system-level array. nvalchemi-
 * toolkit 0.2.0's AtomicDataZarrReader reads these stores, and zbatch's writer appends to,
 * deletes from and defragments stores that nvalchemi's AtomicDataZarrWriter wrote.
 *
 * The edge index. `core/neighbor_list` ([E, 2], any integer type) is given to the writer with
 * per-sample LOCAL 0-based atom indices and stored in nvalchemi's store-global convention,
 * stored = local + atoms_ptr[p] (FORMATS.md §8.3), on the first write and on every append
 * alike (nvalchemi's own append forgets the offset, FORMATS.md §8.5). No other field is
 * offset; `neighbor_matrix` in particular is stored as given.
 *
 * Differences from nvalchemi's writer, on purpose:
 * - An append extends EVERY array, core and custom: the appended data must name exactly the
 *   store's fields, or the append fails (ZB_E_INVALID naming the first field that is missing or
 *   unknown) before anything is written. nvalchemi skips fields missing from the data, drops new
 *   ones and never extends custom arrays, which misaligns the store (FORMATS.md §8.5, item 3).
 * - Delete only clears the masks. nvalchemi also overwrites the deleted rows with zeros; zbatch
 *   leaves the data in place (a delete costs a rewrite of the mask chunks, not of every array),
 *   so deleted samples keep their values until zb_atomic_defragment drops them. Both layouts
 *   read the same through either reader, which never returns a deleted sample.
 * - Defragment re-offsets neighbor_list by the atoms removed before each sample (nvalchemi's
 *   does not) and swaps the new store in by renames instead of wiping the old one first.
 *
 * Crash safety and the commit point
 * ---------------------------------
 * Every object is put atomically (temporary key + rename), and a chunk rewritten during an
 * append keeps the rows it held, so a reader that follows a document never sees a torn object.
 * - A new store: the marker `<path>/.zbatch-incomplete` (ZB_INCOMPLETE_MARKER) is put first;
 *   chunks stream out as rows arrive; commit writes each array's metadata after its chunks, then
 *   the group documents, then the root zarr.json, and then erases the marker. Until the root
 *   zarr.json exists neither zarr-python (hence nvalchemi) nor zbatch opens the store; zbatch
 *   refuses a store whose marker is still present with ZB_E_INCOMPLETE.
 * - An append: full chunks are put as rows arrive (past every array's committed shape, or
 *   rewriting a partial last chunk with its old rows unchanged); at commit all data arrays
 *   (core, custom, then atoms_mask, edges_mask) commit first, each its last chunk then its
 *   metadata; then atoms_ptr, edges_ptr, then samples_mask, and last the root attributes
 *   (num_samples). Arrays left longer than the committed samples need by an interrupted append
 *   are ignored by both readers.
 * - nvalchemi's AtomicDataZarrReader never reads num_samples: it takes the sample count from
 *   the LENGTH of meta/samples_mask (its logical samples are the true entries of the whole
 *   mask) and the rows of each sample from atoms_ptr / edges_ptr. zbatch's reader counts the
 *   same way (a num_samples ahead of the mask is corruption; behind it, a note in verify), so
 *   for readers the samples_mask put is the commit point. Because samples_mask is extended
 *   after every other array, both read exactly the committed samples after an append
 *   interrupted at any point before that one metadata put, and all of the appended ones,
 *   whole, between it and the root put (two consecutive small puts).
 * - Recovery (zb_atomic_recover, run automatically by open_append, delete, add_custom and
 *   defragment): if samples_mask is longer than num_samples and every array is long enough for
 *   its length, the interrupted append had written everything but the root, and the root is
 *   rolled forward to it (nvalchemi's view wins); otherwise every array longer than num_samples
 *   needs is cut back to what it needs (its metadata shape is rewritten; stale chunks past the
 *   shape stay as unreferenced objects until the next append overwrites them).
 * - Defragment writes the new store under `<path>.zbatch-new` (a new store, crash-safe as above),
 *   renames `<path>` to `<path>.zbatch-old`, renames `<path>.zbatch-new` to `<path>`, and removes
 *   `<path>.zbatch-old`. After a crash at any point a complete store exists under one of these
 *   names, and zb_atomic_recover applies this rule: if `<path>` is a complete store it wins (a
 *   leftover `.zbatch-new` and `.zbatch-old` are removed); if `<path>` is absent, a complete
 *   `.zbatch-new` is renamed to `<path>`, else a complete `.zbatch-old` is. Only in the moment
 *   between the two renames is `<path>` itself absent (readers opening it then fail with "not
 *   found" and may retry). The swap is atomic only on backends whose rename moves a whole
 *   prefix in one step (the file backend: one rename(2) per name); on others (memory) each key
 *   is renamed in turn.
 * - Caveat: removing a tree erases its objects and then tries to erase its directories; the
 *   file backend's erase does not remove directories yet, so an emptied directory tree stays
 *   under `<path>.zbatch-old` (the next defragment then moves the old store aside to
 *   `<path>.zbatch-old.1`, `.2`, ...; recovery knows these names). The Python AtomicWriter
 *   removes such empty trees.
 *
 * Thread-safety: a zb_atomic_writer is driven by one thread at a time (each of its arrays may
 * run compression threads, see num_threads). Only one writer, delete, add_custom or defragment
 * may work on a dataset at a time (there is no lock: the caller serialises them). Readers may
 * read concurrently and see the last committed state.
 * ------------------------------------------------------------------------------------------- */

/* Which segment a field's rows follow. */
typedef enum zb_atomic_level {
    ZB_ATOMIC_ATOM = 0,  /* one row per atom: [V, ...] */
    ZB_ATOMIC_EDGE = 1,  /* one row per edge: [E, ...] */
    ZB_ATOMIC_SYSTEM = 2 /* one row per sample: [N, ...] */
} zb_atomic_level;

/* "atom", "edge" or "system" (the strings of the `fields` attribute); "?" otherwise. */
ZB_API const char *zb_atomic_level_name(zb_atomic_level level);

/* A shard_rows value that turns sharding off explicitly (0 means "inherit"). */
#define ZB_ATOMIC_NO_SHARDS UINT64_MAX

/* The storage a data array (core/ or custom/) gets when neither chunk_rows nor shard_rows is
 * set anywhere in its chain: inner chunks of about ZB_ATOMIC_DEFAULT_CHUNK_BYTES of rows, in
 * shards of ZB_ATOMIC_DEFAULT_SHARD_CHUNKS inner chunks (32 MiB of rows). A structure's edges
 * (~4,000 of them, 64 KiB of neighbor_list) then span two or three inner chunks, so a random
 * structure decodes about 1.5x what it delivers, where 1 MiB chunks decode 16x (4x on a store
 * of 2,000 structures, whose windows touch every chunk); the shards keep the file count that
 * of 32 MiB objects. Measured in docs/PERFORMANCE.md ("What moved the numbers" 26). */
#define ZB_ATOMIC_DEFAULT_CHUNK_BYTES ((uint64_t)32 << 10)
#define ZB_ATOMIC_DEFAULT_SHARD_CHUNKS 1024

/* Storage of one array: like nvalchemi's ZarrArrayConfig. A zero/NULL member inherits. At the
 * bottom of the chain: the codec "blosc:lz4:5:shuffle"; for data arrays with neither rows set,
 * the default inner chunks and shards above; otherwise (meta arrays, a chunk_rows without a
 * shard_rows, ZB_ATOMIC_NO_SHARDS) chunks of about 1 MiB of rows, unsharded, and with only
 * shard_rows set, inner chunks of about 1 MiB lowered to a divisor of it. */
typedef struct zb_atomic_array_config {
    const char *codec;   /* codec string ("Writing arrays" in zbatch.h), e.g. "blosc:lz4:5:shuffle";
                            NULL = inherit */
    uint64_t chunk_rows; /* rows per chunk (the inner chunk when sharded) along axis 0;
                            0 = inherit */
    uint64_t shard_rows; /* rows per shard (a multiple of chunk_rows); 0 = inherit;
                            ZB_ATOMIC_NO_SHARDS = none even if the group shards */
} zb_atomic_array_config;

/* A per-array override: `name` is "positions" (that array in any group) or "core/positions"
 * (one group only; it wins over the bare name). Like nvalchemi's field_overrides, except that
 * each member left zero/NULL falls back to the group's value instead of zarr's default. */
typedef struct zb_atomic_override {
    const char *name;
    zb_atomic_array_config config;
} zb_atomic_override;

/* Write configuration: like nvalchemi's ZarrWriteConfig. Precedence per member: the override,
 * then the group (`meta` for the pointer and mask arrays, `core`, `custom`), then the array
 * writer's defaults. Only new arrays use it: an append keeps each existing array's codec and
 * chunking (num_threads applies everywhere). The writer copies what it needs; the caller's
 * strings need not outlive the call that takes the config. */
typedef struct zb_atomic_write_config {
    zb_atomic_array_config meta;
    zb_atomic_array_config core;
    zb_atomic_array_config custom;
    const zb_atomic_override *overrides; /* [n_overrides], may be NULL */
    size_t n_overrides;
    int num_threads; /* compression threads per array; 0 or 1 = the calling thread */
} zb_atomic_write_config;

#define ZB_ATOMIC_WRITE_CONFIG_DEFAULT                                                             \
    {                                                                                              \
        {NULL, 0, 0}, {NULL, 0, 0}, {NULL, 0, 0}, NULL, 0, 1                                       \
    }

/* The rows of one field for a block of samples. */
typedef struct zb_atomic_field {
    const char *group; /* "core" or "custom"; NULL = "core" */
    const char *name;  /* the array's name: non-empty, no '/', not starting with '.' or "__" */
    zb_atomic_level level;
    zb_dtype dtype;        /* any fixed-size type (not ZB_DT_STRING); bool bytes are 0 or 1 */
    int ndim;              /* dimensions of one row: 0 (a scalar per row) .. ZB_MAX_DIMS-1 */
    const uint64_t *shape; /* [ndim] the row shape (e.g. {3} for positions, {3, 3} for cell);
                               may be NULL when ndim is 0 */
    const void *data;      /* rows * prod(shape) elements, C order, native byte order; rows is
                               the block's atoms, edges or samples by level. Borrowed for the
                               duration of the call. */
} zb_atomic_field;

typedef struct zb_atomic_writer zb_atomic_writer;

/* Starts a new dataset at `path` of `store` ("" = the store root; defragment needs a non-empty
 * path). The marker is put here and the pointer and mask arrays are opened; the fields are fixed
 * by the first zb_atomic_writer_add. `cfg` may be NULL (= ZB_ATOMIC_WRITE_CONFIG_DEFAULT) and is
 * copied. A `path` that holds the debris of a crashed new write (its marker and no root
 * zarr.json) is cleared first. The store must outlive the writer.
 * Errors: ZB_E_INVALID for a bad argument or configuration (a codec string that does not parse,
 * a shard that is not a multiple of its chunk), when `path` already holds a group, an array or
 * other keys, or when an interrupted defragment left the dataset under `<path>.zbatch-new` /
 * `<path>.zbatch-old` (run zb_atomic_recover); the store's errors. On failure *out is NULL. */
ZB_API zb_status zb_atomic_writer_open(zb_store *store, const char *path,
                                       const zb_atomic_write_config *cfg, zb_atomic_writer **out);

/* Opens an existing dataset (written by zbatch or by nvalchemi's AtomicDataZarrWriter) to
 * append samples to it. Runs zb_atomic_recover first, then opens every array for appending:
 * the fields are the store's core and custom arrays, with the levels of its `fields` attribute
 * (core arrays missing from it fall back to nvalchemi's key sets, FORMATS.md §8.2, then "atom";
 * custom arrays to "system"). Existing arrays keep their codec and chunking; cfg (may be NULL)
 * only gives num_threads. Nothing is written unless recovery has something to repair.
 * Errors: ZB_E_NOTFOUND if `path` holds no dataset; ZB_E_INCOMPLETE for an uncommitted new
 * store; ZB_E_CORRUPT naming the array when the store breaks the §8.2 invariants (an array
 * shorter than the committed samples need, e.g. one nvalchemi's append did not extend; pointers
 * that do not start at 0 or decrease); ZB_E_UNSUPPORTED for an array that cannot be appended to
 * (chunked along another axis, a string array). */
ZB_API zb_status zb_atomic_writer_open_append(zb_store *store, const char *path,
                                              const zb_atomic_write_config *cfg,
                                              zb_atomic_writer **out);

/* Adds `n_samples` samples: atoms_per_sample[n_samples] and edges_per_sample[n_samples] (NULL =
 * no edges) give their sizes, and fields[n_fields] their rows (see zb_atomic_field). The first
 * add to a new store fixes the field set; every later add, and every add to an opened store,
 * must give exactly that set: the same names, groups, levels, dtypes and row shapes.
 * core/neighbor_list (edge level, integer type, row shape {2}) holds local indices, each in
 * [0, atoms of its sample); they are stored offset by the sample's first atom (see above).
 * Everything is validated before any row is passed on, so a failing add writes nothing and
 * leaves the writer as it was. Rows are buffered per chunk; full chunks are compressed and put
 * at once (they are not visible until commit).
 * Every floating-point value must be finite (NaN and infinities are refused, naming the sample
 * of the block, the field and the row); core/positions must be atom level, floating point, with
 * rows of shape {3}, and core/atomic_numbers atom level, an integer type, one value per atom.
 * Errors: ZB_E_INVALID for a negative count, NULL data with rows to give, a field missing from
 * `fields` or not in the store (the message names it), a mismatched level, dtype or row shape,
 * a duplicate field, a bad name, a non-finite value, a malformed positions / atomic_numbers, or
 * a neighbor_list index outside its sample (the message names the sample and the edge); ZB_E_OVERFLOW when totals or stored indices overflow; the array
 * writer's and store's errors (after which the writer is unusable: close it). */
ZB_API zb_status zb_atomic_writer_add(zb_atomic_writer *w, uint64_t n_samples,
                                      const int64_t *atoms_per_sample,
                                      const int64_t *edges_per_sample, size_t n_fields,
                                      const zb_atomic_field *fields);

/* Commits everything added so far, in the order described above (the root zarr.json with
 * num_samples last; a new store's marker is erased after it). The writer may take more samples
 * and commit again; each later commit is an append with the same crash safety.
 * Errors: the array writer's and store's errors; a failed commit leaves the last committed state
 * readable. */
ZB_API zb_status zb_atomic_writer_commit(zb_atomic_writer *w);

/* Samples in the dataset: committed plus added since the last commit (deleted ones included). */
ZB_API uint64_t zb_atomic_writer_num_samples(const zb_atomic_writer *w);

/* Frees the writer. Samples added since the last commit are discarded: an opened store keeps
 * its last committed state (chunks already put past it are unreferenced); a new store that was
 * never committed keeps its marker and is refused by readers (zb_atomic_writer_open or
 * zb_atomic_recover clears it). NULL is a no-op. */
ZB_API void zb_atomic_writer_close(zb_atomic_writer *w);

/* Soft-deletes samples by LOGICAL index: logical index i is the i-th sample whose samples_mask
 * entry is true (what readers number 0..len-1; nvalchemi's writer deletes by physical index,
 * which is the same only while nothing is deleted). All indices refer to the state before the
 * call; duplicates are allowed. Clears samples_mask for each sample and atoms_mask / edges_mask
 * for its rows, rewriting only the mask chunks (or shards) that change; the data is NOT zero-
 * filled (unlike nvalchemi). Order: atoms_mask and edges_mask first, samples_mask last; each
 * chunk put is atomic, so a crash leaves some of the samples deleted and the rest untouched,
 * never a sample half-deleted as readers see it (readers use samples_mask alone).
 * Reads samples_mask and the two pointer arrays whole (17 bytes per sample).
 * Errors: ZB_E_RANGE (before anything is written) for an index >= the number of live samples;
 * the errors of zb_atomic_writer_open_append. */
ZB_API zb_status zb_atomic_delete(zb_store *store, const char *path, const uint64_t *logical_ids,
                                  size_t n);

/* Rewrites the dataset with only its live samples (the committed ones whose samples_mask is
 * true), neighbor_list re-offset for the new atom positions, all masks true and num_samples the
 * live count; other root attributes and the `fields` attribute are kept, and every array stays
 * (with 0 rows if nothing is live). `cfg` NULL keeps each array's codec, chunk and shard rows;
 * otherwise `cfg` configures the new store. Samples are copied in blocks, so memory does not
 * grow with the dataset. The swap and its recovery rule are described above. `path` must not be
 * "" (the swap renames it). Errors: ZB_E_INVALID for path ""; ZB_E_CORRUPT (naming the array and
 * the sample) for a stored neighbor_list index outside its sample, as nvalchemi appends leave
 * them; the errors of zb_atomic_writer_open_append and of the writer. */
ZB_API zb_status zb_atomic_defragment(zb_store *store, const char *path,
                                      const zb_atomic_write_config *cfg);

/* Adds the custom field `field` (group NULL or "custom") to an existing dataset. `n_rows` is the
 * number of rows of field->data; it must cover every committed sample exactly (num_samples rows
 * for a system field, atoms_ptr[N] for an atom field, edges_ptr[N] for an edge field). The
 * `fields` attribute names it first, then the array is written (its metadata last), so a crash
 * never leaves an array whose level is unknown. `cfg` (may be NULL) configures the new array
 * (`custom` group and overrides).
 * Errors: ZB_E_INVALID for the wrong number of rows for its level (the message gives both), a
 * name that exists in core/ or custom/, a bad name or group; the errors of
 * zb_atomic_writer_open_append. */
ZB_API zb_status zb_atomic_add_custom(zb_store *store, const char *path,
                                      const zb_atomic_write_config *cfg,
                                      const zb_atomic_field *field, uint64_t n_rows);

/* What zb_atomic_check found. */
typedef struct zb_atomic_summary {
    uint64_t num_samples;  /* physical samples (root num_samples), deleted ones included */
    uint64_t num_live;     /* samples_mask true among them */
    uint64_t num_atoms;    /* atoms_ptr[num_samples] */
    uint64_t num_edges;    /* edges_ptr[num_samples] */
    uint64_t num_fields;   /* arrays in core/ and custom/ */
    bool uncommitted_tail; /* some array is longer than the committed samples need (an
                               interrupted append; zb_atomic_recover cuts it back) */
} zb_atomic_summary;

/* Checks the dataset at `path` against the invariants of FORMATS.md §8.2, reading the pointer
 * arrays, samples_mask and neighbor_list whole (in blocks) but no other data. Bounded by
 * num_samples: atoms_ptr and edges_ptr hold at least N+1 entries, start at 0 and never
 * decrease over [0, N]; samples_mask holds at least N entries; each atom-, edge- and system-level
 * array (and atoms_mask / edges_mask when present) holds at least atoms_ptr[N], edges_ptr[N] or N
 * rows; every stored neighbor_list index minus atoms_ptr[p] lies in [0, atoms of p) (this
 * catches the appends of FORMATS.md §8.5). Longer arrays are an uncommitted tail, not an error.
 * Writes nothing. `out` may be NULL.
 * Errors: ZB_E_CORRUPT naming the array (and the sample, for an index) that breaks them;
 * ZB_E_METADATA for a missing or malformed num_samples / fields attribute; ZB_E_INCOMPLETE for
 * an uncommitted new store (marker present, no root zarr.json); ZB_E_NOTFOUND when `path` holds
 * no dataset (e.g. in the middle of a defragment swap: run zb_atomic_recover). */
ZB_API zb_status zb_atomic_check(zb_store *store, const char *path, zb_atomic_summary *out);

/* Repairs what a crash left behind, following the rules above: an interrupted defragment (the
 * `.zbatch-new` / `.zbatch-old*` siblings; `.zbatch-old.<k>` is used when a backend kept an
 * emptied directory under the plain name), an interrupted append (roll the root forward, or cut
 * tails back), a marker left after the root zarr.json of a new store was written (erased). Does
 * nothing on a healthy dataset. A new store that never committed cannot be recovered: it is left
 * as it is (zb_atomic_writer_open clears it).
 * Errors: ZB_E_INCOMPLETE for an uncommitted new store; ZB_E_NOTFOUND if no dataset is found
 * under any of the names; the store's errors. */
ZB_API zb_status zb_atomic_recover(zb_store *store, const char *path);

#ifdef __cplusplus
}
#endif
#endif
