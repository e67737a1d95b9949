/* zbatch_verify.h — part of the public C API (included by zbatch.h): checking a store.
 * Conventions, status codes and thread-safety rules are those of zbatch.h. */
#ifndef ZBATCH_VERIFY_H
#define ZBATCH_VERIFY_H

#include "zbatch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Verifying stores (what `zbatch verify` runs).
 *
 * zb_verify reads a whole store (or the group or array at a path inside it) and lists what is
 * wrong with it, instead of stopping at the first error as the readers do:
 *
 * - The write marker: `<path>/.zbatch-incomplete` (ZB_INCOMPLETE_MARKER, put by the layout
 *   writers until their commit) means a write was never committed. That is the one problem
 *   reported and nothing else is checked: the rest of such a store is half-written by design.
 *   A marker inside the store (a nested group, e.g. one dataset of a collection) is reported
 *   for that group, and the rest is still checked.
 * - Metadata: every node document parses (the tree as listed in the store, never only the
 *   consolidated snapshot) and every array's metadata is valid. When consolidated metadata is
 *   present, it must parse and agree with the node documents (the same nodes, and for each
 *   array the same shape, chunks and dtype; for each node the same attributes): readers use
 *   the snapshot, so a stale one misleads them.
 * - Chunks: every chunk of every array is read and decoded (for a sharded array, every shard
 *   index is read and validated and every non-empty inner chunk decoded), one unit at a time,
 *   so memory stays bounded by one chunk whatever the array's size. A problem names the chunk
 *   or shard key (and the inner chunk's entry and byte range). Missing chunks and empty shard
 *   entries are not problems: they read as the fill value (shared FORMATS.md §1.5, §4.2).
 * - anndata (FORMATS.md §6), for every group whose encoding-type is csr_matrix or csc_matrix,
 *   anywhere in the store (so also layers, obsp and each dataset of a collection): indptr has
 *   shape[major]+1 entries, starts at 0, never decreases and ends at the length of data and of
 *   indices; every index lies in [0, shape[minor]). For every dataframe: each column (array,
 *   categorical codes, nullable values and mask) is as long as the index, and categorical codes
 *   lie in [-1, number of categories). For every anndata group: X, layers, obsm, varm, obsp and
 *   varp agree with the lengths of obs and var.
 * - nvalchemi AtomicData (FORMATS.md §8.2, §8.3), for every group with meta/atoms_ptr, a core
 *   group and a `fields` attribute: num_samples N is present; atoms_ptr and edges_ptr hold N+1
 *   entries, start at 0 and never decrease (V = atoms_ptr[N], E = edges_ptr[N]); samples_mask
 *   holds N entries, atoms_mask V and edges_mask E; each atom-, edge- and system-level array of
 *   core/ and custom/ has V, E or N rows; every neighbor_list index of sample p lies in
 *   [atoms_ptr[p], atoms_ptr[p+1]) (store-global indices, §8.3). An array LONGER than N needs is
 *   a note, not a problem: an append interrupted before its commit point (the root num_samples)
 *   leaves such tails by design (include/zbatch_atomic.h), the rows of the committed samples are
 *   intact, and zb_atomic_recover (or the next append) cuts the tails back.
 *
 * Layout checks read pointer, index and mask arrays block by block (never a whole array) and
 * skip an array whose chunks failed to decode (its chunk problems are already listed).
 * Arrays zbatch cannot read (an unsupported dtype or codec, as in some anndata `uns` entries)
 * are noted and skipped, not reported as problems.
 * ------------------------------------------------------------------------------------------- */

/* Problems kept in a report unless the caller asks for another number. */
#define ZB_VERIFY_MAX_PROBLEMS_DEFAULT 100

typedef enum zb_verify_severity {
    ZB_VERIFY_PROBLEM = 0, /* the store is wrong: a reader fails or returns wrong data */
    ZB_VERIFY_NOTE = 1     /* worth knowing, not wrong (an uncommitted tail, an unchecked array) */
} zb_verify_severity;

/* One finding. The strings are owned by the report (freed by zb_verify_report_free). */
typedef struct zb_verify_problem {
    zb_verify_severity severity;
    zb_status status; /* the kind: ZB_E_CORRUPT, ZB_E_CHECKSUM, ZB_E_TRUNCATED, ZB_E_METADATA,
                         ZB_E_INCOMPLETE, ZB_E_SHARD_RANGE, ... */
    char *key;        /* the store key it is about: a chunk or shard key ("X/data/c/3"), a
                         metadata document ("X/indptr/zarr.json"), or a node path ("X") */
    char *message;    /* what is wrong, in one line (no trailing newline) */
} zb_verify_problem;

/* What zb_verify found. The caller sets the two options (or starts from
 * ZB_VERIFY_REPORT_INIT); zb_verify fills in the rest, discarding what the report held. */
typedef struct zb_verify_report {
    /* ---- options, set by the caller ---- */
    size_t max_problems; /* findings (problems and notes) kept in `problems`; counting goes on
                            past it. 0 = ZB_VERIFY_MAX_PROBLEMS_DEFAULT */
    bool metadata_only;  /* check metadata and array lengths only: decode no chunk, read no
                            pointer or index values */
    /* ---- results, filled by zb_verify ---- */
    bool incomplete;     /* the marker is at `path`: nothing else was checked */
    uint64_t n_problems; /* problems found (ZB_VERIFY_PROBLEM), kept or not */
    uint64_t n_notes;    /* notes found (ZB_VERIFY_NOTE), kept or not */
    uint64_t n_arrays;   /* arrays whose metadata was checked */
    uint64_t n_chunks;   /* chunks and shard inner chunks read and decoded (or failing to) */
    uint64_t n_missing;  /* chunks, shards and empty shard entries that read as fill */
    size_t n_kept;       /* entries of `problems`, in the order found */
    zb_verify_problem *problems;
} zb_verify_report;

#define ZB_VERIFY_REPORT_INIT                                                                      \
    {                                                                                              \
        ZB_VERIFY_MAX_PROBLEMS_DEFAULT, false, false, 0, 0, 0, 0, 0, 0, NULL                       \
    }

/* Verifies the group or array at `path` of `store` ("" = the store root) and everything below
 * it, as described above, filling `report`.
 *
 * Returns ZB_OK when the check ran to the end, whatever it found: the verdict is in the report
 * (clean when n_problems is 0). A store that cannot be read at all (no node at `path`, a
 * malformed root document) is a problem in the report, not an error. Errors: ZB_E_INVALID for
 * a NULL store or report or a bad path; ZB_E_NOMEM. On an error the report holds what was
 * found before it, and must still be freed.
 *
 * Memory is bounded by the largest chunk (or shard, for arrays with codecs on whole shards)
 * plus fixed-size blocks of pointer values, never by an array's length; work by the chunks
 * stored (found by listing the array's keys; the declared grid is walked only on a store that
 * cannot list), never by the declared shape. A dataset group with no problem found is opened
 * as zb_dataset_open opens it, and a refusal is a problem. The store is only
 * read. Thread-safety: one report per call; concurrent calls on one store are fine (stores are
 * thread-safe), but a store being written meanwhile may be reported inconsistent. */
ZB_API zb_status zb_verify(zb_store *store, const char *path, zb_verify_report *report);

/* Frees the findings of a report and zeroes its results (the options are kept, so it can be
 * passed to zb_verify again). NULL is a no-op. */
ZB_API void zb_verify_report_free(zb_verify_report *report);

#ifdef __cplusplus
}
#endif
#endif
