/* libhdf5 for the .h5ad source (src_h5ad.c, h5ad_matrix.c): one process-wide lock around every
 * libhdf5 call, libhdf5's errors turned into zbatch messages, datasets read by row range, strings
 * and attributes. Internal to src/convert.
 *
 * Locking: every function here that is not marked "under the lock" takes the lock itself, and
 * only around its libhdf5 calls; the lock is recursive, so they may also be called with it held
 * (the open path holds it throughout). Functions "under the lock" expect the caller to hold it.
 */
#ifndef ZB_CONVERT_H5AD_IO_H
#define ZB_CONVERT_H5AD_IO_H

#include <hdf5.h>
#include <stdbool.h>
#include <stdint.h>

#include "zbatch.h"

void zb__h5_lock(void);
void zb__h5_unlock(void);

/* What H5is_library_threadsafe said (Debian's serial libhdf5 1.10.8 says yes: it is built with
 * --enable-threadsafe, one global lock inside the library). zbatch serialises its libhdf5 calls
 * either way; this is for benchmarks and diagnostics. */
bool zb__h5_library_threadsafe(void);

/* Under the lock: opens `path` read-only (what libhdf5 says when it cannot: ZB_E_UNSUPPORTED for
 * a file that is not HDF5, ZB_E_CORRUPT for a truncated one, ZB_E_IO). */
zb_status zb__h5_file_open(const char *path, hid_t *out);

/* Under the lock: records "path: key: what (libhdf5: <the innermost error of its stack>)" as this
 * thread's detail message, clears libhdf5's error stack and returns the status: ZB_E_IO when the
 * innermost error is an I/O error, ZB_E_CORRUPT when the file is truncated, ZB_E_UNSUPPORTED
 * when it is not HDF5, `fallback` otherwise. */
zb_status zb__h5_fail(zb_status fallback, const char *path, const char *key, const char *what);

/* ---- datasets -------------------------------------------------------------------------------- */

/* An open dataset of rank 1 or 2, of numbers, bools or strings. */
typedef struct zb__h5_ds {
    hid_t id;
    const char *path; /* the file (for messages; borrowed, lives with the source) */
    char *key;        /* "X/indices" (for messages; owned) */
    zb_dtype dtype;   /* ZB_DT_STRING for strings; h5py's bool enum is ZB_DT_BOOL */
    size_t item;      /* bytes per element in memory (0 for strings) */
    int rank;
    uint64_t dims[2]; /* dims[1] = 1 for rank 1 */
    hid_t memtype;    /* what H5Dread converts to: the file type in native byte order */
    bool swap;        /* stored big-endian: the direct path swaps bytes itself */
    /* the direct path: chunked with one or more filters, all among {shuffle, deflate}, so chunks
     * are read raw under the lock and decoded outside it */
    bool direct;
    uint64_t chunk[2];   /* chunk shape (chunk[1] = 1 for rank 1) */
    int n_filters;       /* the pipeline, in write order */
    int filters[4];      /* H5Z_FILTER_SHUFFLE / H5Z_FILTER_DEFLATE */
    size_t shuffle_item; /* the shuffle filter's element size */
    /* every chunk must be stored: a chunk the index does not find is an error, not the fill
     * value (a sparse matrix's data, indices and indptr, which anndata writes whole; a damaged
     * chunk index makes libhdf5 1.10 answer "not allocated") */
    bool whole;
    /* strings */
    bool vlen; /* variable-length (else fixed-length of `fixed_size` bytes) */
    size_t fixed_size;
    bool space_padded; /* fixed-length, H5T_STR_SPACEPAD */
} zb__h5_ds;

/* Under the lock: opens the dataset `name` under `loc` (`key` names it in messages). ZB_E_NOTFOUND
 * when absent; ZB_E_UNSUPPORTED for a rank above 2 or a type that is not a number, h5py's bool or
 * a string (naming it). On failure *out holds nothing to close. */
zb_status zb__h5_ds_open(hid_t loc, const char *name, const char *path, const char *key,
                         zb__h5_ds *out);
/* Opens the dataset behind an already open object id (taking it over: closed on failure). */
zb_status zb__h5_ds_from_id(hid_t id, const char *path, const char *key, zb__h5_ds *out);
void zb__h5_ds_close(zb__h5_ds *d);

/* Under the lock: table[c] = the file offset of chunk c of the 1-d dataset d, for c < n, found
 * through libhdf5's chunk lookup rather than its walk of the whole index (h5ad_chunks.c says
 * how). 1 when the dataset has no filters and every chunk is stored at its full size (chunk[0] * item bytes) at an
 * offset that is a multiple of item; 0 when one is not (or is not allocated); -1 when the table
 * could not be made this way (the caller then asks libhdf5 chunk by chunk). */
int zb__h5_chunk_table(const zb__h5_ds *d, uint64_t n, uint64_t *table);

/* Under the lock: chunk c of the chunked 1-d dataset d as libhdf5 1.10 reports it
 * (H5Dget_chunk_info_by_coord: a walk of the chunk index from its start, so n^2 / 2 steps for
 * a whole table); true when it is allocated, unfiltered and of its full size, *addr then its
 * address (relative to a user block, where there is one). */
bool zb__h5_chunk_addr(const zb__h5_ds *d, uint64_t c, uint64_t *addr);

/* Under the lock: the 1-d dataset `name` of the group g (named `gkey`), a part of an element
 * (codes, values, indptr...): absent is ZB_E_CORRUPT, another rank ZB_E_UNSUPPORTED. Messages
 * name it "gkey/name". */
zb_status zb__h5_part_open(hid_t g, const char *gkey, const char *name, const char *path,
                           zb__h5_ds *out);

/* Rows [start, stop) (elements of a rank-1 dataset), every column, C order, native byte order,
 * into dst ((stop - start) * dims[1] * item bytes). Not for strings. Safe from several threads at
 * once: deflate chunks are inflated outside the lock. */
zb_status zb__h5_ds_read(const zb__h5_ds *d, uint64_t start, uint64_t stop, void *dst);

/* Elements [start, stop) of a rank-1 string dataset into a new *out (overwritten, not freed; free
 * with zb_strings_free). Fixed-length strings lose their padding. */
zb_status zb__h5_ds_read_strings(const zb__h5_ds *d, uint64_t start, uint64_t stop,
                                 zb_strings *out);

/* Under the lock: frees what libhdf5 allocated for the variable-length strings in buf (read with
 * `type` over `space`); H5Dvlen_reclaim before libhdf5 1.12, H5Treclaim since. */
herr_t zb__h5_reclaim(hid_t type, hid_t space, void *buf);

/* The length of a fixed-length string of `size` bytes without its padding (NUL or spaces). */
size_t zb__h5_fixed_len(const char *s, size_t size, bool space_padded);

/* ---- objects and attributes (under the lock) ------------------------------------------------- */

/* True when `name` (a relative path, "a/b/c") exists under loc, every link on the way included. */
bool zb__h5_exists(hid_t loc, const char *name);

bool zb__h5_attr_exists(hid_t obj, const char *name);

/* The text of a string attribute (a scalar, or an array of one) into a new NUL-terminated *out
 * (free with free()). ZB_E_NOTFOUND when absent; ZB_E_UNSUPPORTED (naming path, key and the
 * attribute) when not a string. */
zb_status zb__h5_attr_text(hid_t obj, const char *name, const char *path, const char *key,
                           char **out);

/* The texts of a 1-d string attribute (a scalar string counts as one; an empty array of any type
 * as none) into a new array of *n new strings (free each, then the array). */
zb_status zb__h5_attr_texts(hid_t obj, const char *name, const char *path, const char *key,
                            char ***out, size_t *n);

/* `n` non-negative integers of an integer attribute of exactly n elements. */
zb_status zb__h5_attr_u64s(hid_t obj, const char *name, const char *path, const char *key,
                           uint64_t *out, size_t n);

/* A bool attribute (h5py's bool enum, or any integer): non-zero is true. */
zb_status zb__h5_attr_bool(hid_t obj, const char *name, const char *path, const char *key,
                           bool *out);

/* Opens the object an attribute points at: an HDF5 object reference, or a string naming a path
 * relative to `base` (anndata 0.7 wrote references; its Zarr form wrote paths). */
zb_status zb__h5_attr_deref(hid_t obj, const char *name, hid_t base, const char *path,
                            const char *key, hid_t *out);

#endif
