/* The scratch CSR file shared by its writer (transpose.c) and its reader (csr_file.c): the
 * layout of its parts (format: csr_file.c's opening comment), and what the transposition
 * reports to tests and benchmarks beyond source.h's interface. */
#ifndef ZB_CONVERT_CSR_FILE_H
#define ZB_CONVERT_CSR_FILE_H

#include <stdbool.h>
#include <stdint.h>

#include "convert/source.h"

#define ZB_CSR_FILE_HEADER_BYTES 64

/* Byte offsets of the parts of a file of n_rows rows and nnz elements of `item` bytes. */
typedef struct zb__csr_file_layout {
    uint64_t indptr;  /* int64 [n_rows + 1] */
    uint64_t indices; /* uint32 [nnz] */
    uint64_t data;    /* item [nnz] */
    uint64_t size;    /* of the whole file */
} zb__csr_file_layout;

/* ZB_E_OVERFLOW when the file would not fit in 2^63 bytes. */
zb_status zb__csr_file_layout_of(uint64_t n_rows, uint64_t nnz, size_t item,
                                 zb__csr_file_layout *out);

/* The header of a file holding an n_rows x n_cols matrix of nnz elements of `dtype`. */
void zb__csr_file_header(uint8_t out[ZB_CSR_FILE_HEADER_BYTES], zb_dtype dtype, uint64_t n_rows,
                         uint64_t n_cols, uint64_t nnz);

/* What one transposition did, for tests and benchmarks. */
typedef struct zb__transpose_stats {
    uint64_t bands;         /* row bands of the first distribution */
    uint64_t bands_split;   /* bands too dense for memory, distributed again into narrower ones */
    uint64_t scratch_bytes; /* written to the scratch file (0 when the triples stayed in memory) */
    uint64_t peak_bytes;    /* most bytes of matrix data held at once (blocks read from the
                               source, band buffers and chunks, band outputs, read buffers) */
    bool in_memory;         /* the distributed triples fitted memory_bytes: no scratch file */
    double seconds[3];      /* wall time of pass 1 (read and distribute), pass 2 (transpose and
                               write the bands), and the commit (fsync and rename) */
} zb__transpose_stats;

/* zb__csc_transpose's parameters, and the size of a band for measuring it. */
typedef struct zb__transpose_opts {
    uint64_t memory_bytes;
    int num_threads;
    uint64_t band_bytes; /* CSR bytes a band of rows aims at; 0 = the default (transpose.c) */
} zb__transpose_opts;

/* zb__csc_transpose with every parameter, filling *stats (which may be NULL). */
zb_status zb__csc_transpose_ex(zb__src_matrix *m, const char *path, const zb__transpose_opts *opts,
                               zb__transpose_stats *stats);

/* For tests (fault injection, SQLite's habit): from now on the write-like call (fallocate,
 * pwrite, fsync) number `nth` (0 = the next) that a transposition makes fails with errno `err`,
 * once; a negative nth turns injection off. Process-wide: set it while no transposition runs. */
void zb__transpose_fail_write(int64_t nth, int err);

#endif
