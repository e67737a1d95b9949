/* zbatch-bench-h5ad-read: how fast the .h5ad source (src/convert/src_h5ad.c) hands out the rows
 * of a matrix, as the converter reads them: row blocks taken in turn by T threads sharing one
 * source.
 *
 *   bench_h5ad_read FILE [--threads T] [--block ROWS] [--key KEY] [--rounds R]
 *
 * Reports the decoded bytes (data + uint32 indices + int64 pointers of every row) per second of
 * the best of R rounds (after an untimed one; each thread keeps its block), as one JSON line.
 * bench/h5ad_read.py writes the test file and sets the figures next to h5py reading the same rows.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "convert/h5ad_io.h"
#include "convert/source.h"
#include "zbatch.h"

typedef struct job {
    zb__src_matrix *m;
    uint64_t rows, block;
    atomic_uint_fast64_t next;
    atomic_uint_fast64_t bytes;
    atomic_int failed;
} job;

static double
now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One thread's share: its block is kept across rounds, as the converter keeps its own. */
typedef struct seat {
    job *j;
    zb__csr_block b;
} seat;

static void *
worker(void *arg)
{
    job *j = ((seat *)arg)->j;
    zb__csr_block *b = &((seat *)arg)->b;
    size_t item = zb_dtype_size(zb__src_matrix_info_of(j->m)->dtype);
    for (;;) {
        uint64_t start = atomic_fetch_add(&j->next, j->block);
        if (start >= j->rows) break;
        uint64_t stop = start + j->block < j->rows ? start + j->block : j->rows;
        zb_status st = zb__src_matrix_read(j->m, start, stop, b);
        if (st != ZB_OK) {
            fprintf(stderr, "rows [%llu, %llu): %s: %s\n", (unsigned long long)start,
                    (unsigned long long)stop, zb_status_name(st), zb_last_error());
            atomic_store(&j->failed, 1);
            break;
        }
        atomic_fetch_add(&j->bytes, b->nnz * (item + 4) + (b->n_rows + 1) * 8);
    }
    return NULL;
}

int
main(int argc, char **argv)
{
    const char *path = NULL, *key = "X";
    int threads = 1, rounds = 3;
    uint64_t block = 4096;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--block") && i + 1 < argc)
            block = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--key") && i + 1 < argc)
            key = argv[++i];
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else
            path = argv[i];
    }
    if (!path || threads < 1 || threads > 256 || block == 0 || rounds < 1) {
        fprintf(stderr, "usage: bench_h5ad_read FILE [--threads T] [--block ROWS] [--key KEY] "
                        "[--rounds R]\n");
        return 2;
    }
    zb__src *src = NULL;
    zb__src_matrix *m = NULL;
    zb_status st = zb__src_open(path, &src);
    if (st == ZB_OK) st = zb__src_matrix_get(src, key, &m);
    if (st != ZB_OK) {
        fprintf(stderr, "%s: %s\n", zb_status_name(st), zb_last_error());
        zb__src_close(src);
        return 1;
    }
    const zb__src_matrix_info *info = zb__src_matrix_info_of(m);
    double best = 0;
    uint64_t bytes = 0;
    seat seats[256] = {{0}};
    bool failed = false;
    for (int r = 0; r <= rounds && !failed; r++) { /* round 0 warms up, untimed */
        job j = {.m = m,
                 .rows = info->layout == ZB_SRC_CSC ? info->n_cols : info->n_rows,
                 .block = block};
        pthread_t tid[256];
        double t0 = now();
        for (int t = 0; t < threads; t++) {
            seats[t].j = &j;
            pthread_create(&tid[t], NULL, worker, &seats[t]);
        }
        for (int t = 0; t < threads; t++) pthread_join(tid[t], NULL);
        double dt = now() - t0;
        failed = atomic_load(&j.failed);
        if (r > 0 && (best == 0 || dt < best)) best = dt;
        bytes = atomic_load(&j.bytes);
    }
    for (int t = 0; t < threads; t++) zb__csr_block_free(&seats[t].b);
    if (failed) {
        zb__src_close(src);
        return 1;
    }
    printf("{\"file\": \"%s\", \"key\": \"%s\", \"threads\": %d, \"block_rows\": %llu, "
           "\"rows\": %llu, \"nnz\": %llu, \"bytes\": %llu, \"seconds\": %.4f, "
           "\"MB_per_s\": %.1f, \"libhdf5_threadsafe\": %s}\n",
           path, key, threads, (unsigned long long)block, (unsigned long long)info->n_rows,
           (unsigned long long)info->nnz, (unsigned long long)bytes, best,
           (double)bytes / best / 1e6, zb__h5_library_threadsafe() ? "true" : "false");
    zb__src_close(src);
    return 0;
}
