/* bench_src_zarr: decoded MB/s of the anndata Zarr conversion source (src/convert/src_zarr.c)
 * reading every row of a matrix in row blocks, on 1, 2, ... threads sharing one source.
 *
 *   bench_src_zarr STORE [--key X] [--threads 1,2] [--block ROWS] [--rounds R]
 *
 * Threads take the next block of ROWS rows (default 1024) from a shared counter and read it
 * with zb__src_matrix_read into their own reused zb__csr_block, as the converter's scatter tasks
 * do. One untimed pass warms the page cache; each thread count then keeps its best of R rounds
 * (default 3). "Decoded" counts the bytes of the matrix's arrays in their stored dtypes (data +
 * indices + indptr; a dense matrix's elements), the same figure bench/src_zarr.py gives
 * zarr-python. The CPU seconds (user + system, all threads) of the best round come with it: on a
 * shared machine they say what the work costs when the wall clock cannot. Prints one JSON line
 * per thread count. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "convert/source.h"
#include "zarr/array.h"

typedef struct job {
    zb__src_matrix *m;
    uint64_t rows, block;
    atomic_uint_fast64_t next;
    atomic_uint_fast64_t nnz;
    atomic_int failed;
} job;

static double
now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double
cpu_seconds(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec * 1e-6 +
           (double)u.ru_stime.tv_sec + (double)u.ru_stime.tv_usec * 1e-6;
}

static void *
reader(void *arg)
{
    job *j = arg;
    zb__csr_block b = {0};
    for (;;) {
        uint64_t i = atomic_fetch_add(&j->next, 1);
        uint64_t start = i * j->block;
        if (start >= j->rows || atomic_load(&j->failed)) break;
        uint64_t stop = start + j->block < j->rows ? start + j->block : j->rows;
        if (zb__src_matrix_read(j->m, start, stop, &b) != ZB_OK) {
            if (!atomic_exchange(&j->failed, 1)) fprintf(stderr, "read: %s\n", zb_last_error());
            break;
        }
        atomic_fetch_add(&j->nnz, b.nnz);
    }
    zb__csr_block_free(&b);
    return NULL;
}

/* One pass over every row on `threads` threads; seconds (and CPU seconds in *cpu), or a negative
 * number on failure. */
static double
pass(zb__src_matrix *m, uint64_t block, int threads, uint64_t *nnz, double *cpu)
{
    job j = {.m = m, .rows = zb__src_matrix_info_of(m)->n_rows, .block = block};
    atomic_init(&j.next, 0);
    atomic_init(&j.nnz, 0);
    atomic_init(&j.failed, 0);
    pthread_t t[64];
    double t0 = now(), c0 = cpu_seconds();
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, reader, &j);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    double dt = now() - t0;
    *cpu = cpu_seconds() - c0;
    *nnz = atomic_load(&j.nnz);
    return atomic_load(&j.failed) ? -1 : dt;
}

/* Bytes of the matrix's arrays in their stored dtypes. */
static double
decoded_bytes(const zb__src_matrix *m, uint64_t nnz, const char *path, const char *key)
{
    const zb__src_matrix_info *info = zb__src_matrix_info_of(m);
    if (info->layout == ZB_SRC_DENSE) return (double)info->nnz * (double)zb_dtype_size(info->dtype);
    double bytes = (double)nnz * (double)zb_dtype_size(info->dtype);
    static const char *const parts[] = {"indices", "indptr"};
    zb_store *s = NULL;
    if (zb_store_open_file(path, &s) != ZB_OK) return -1;
    for (int p = 0; p < 2; p++) {
        char at[4096];
        zb_array *a = NULL;
        snprintf(at, sizeof at, "%s/%s", key, parts[p]);
        if (zb_array_open(s, at, &a) != ZB_OK) {
            zb_store_close(s);
            return -1;
        }
        bytes += (double)a->meta.shape[0] * (double)a->meta.itemsize;
        zb_array_close(a);
    }
    zb_store_close(s);
    return bytes;
}

int
main(int argc, char **argv)
{
    const char *path = NULL, *key = "X", *threads_arg = "1,2";
    uint64_t block = 1024;
    int rounds = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--key") && i + 1 < argc)
            key = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads_arg = argv[++i];
        else if (!strcmp(argv[i], "--block") && i + 1 < argc)
            block = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!path && argv[i][0] != '-')
            path = argv[i];
        else {
            fprintf(stderr, "usage: bench_src_zarr STORE [--key X] [--threads 1,2] "
                            "[--block ROWS] [--rounds R]\n");
            return 2;
        }
    }
    if (!path || !block || rounds < 1) {
        fprintf(stderr, "usage: bench_src_zarr STORE [--key X] [--threads 1,2] [--block ROWS] "
                        "[--rounds R]\n");
        return 2;
    }
    zb__src *src = NULL;
    zb__src_matrix *m = NULL;
    if (zb__src_open(path, &src) != ZB_OK || zb__src_matrix_get(src, key, &m) != ZB_OK) {
        fprintf(stderr, "%s\n", zb_last_error());
        zb__src_close(src);
        return 1;
    }
    uint64_t nnz = 0;
    double cpu = 0, best_cpu = 0;
    if (pass(m, block, 2, &nnz, &cpu) < 0) return 1; /* warm the page cache */
    double bytes = decoded_bytes(m, nnz, path, key);
    const zb__src_matrix_info *info = zb__src_matrix_info_of(m);
    char list[256];
    snprintf(list, sizeof list, "%s", threads_arg);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int threads = atoi(tok);
        if (threads < 1 || threads > 64) continue;
        double best = 1e300;
        for (int r = 0; r < rounds; r++) {
            double dt = pass(m, block, threads, &nnz, &cpu);
            if (dt < 0) return 1;
            if (dt < best) {
                best = dt;
                best_cpu = cpu;
            }
        }
        printf(
            "{\"reader\": \"zbatch-src\", \"key\": \"%s\", \"threads\": %d, \"block_rows\": %llu, "
            "\"rows\": %llu, \"nnz\": %llu, \"decoded_mb\": %.1f, \"seconds\": %.4f, "
            "\"mb_per_s\": %.1f, \"cpu_seconds\": %.4f}\n",
            key, threads, (unsigned long long)block, (unsigned long long)info->n_rows,
            (unsigned long long)nnz, bytes / 1e6, best, bytes / 1e6 / best, best_cpu);
        fflush(stdout);
    }
    zb__src_close(src);
    return 0;
}
