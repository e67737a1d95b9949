/* bench_transpose: zb__csc_transpose of a synthetic CSC matrix served from memory.
 *
 *   bench_transpose [--cells N] [--genes G] [--per-cell K] [--dir D] [--rounds R]
 *                   [--memory MIB,...] [--threads T,...] [--band KIB,...] [--per-band-reads]
 *
 * The matrix (float32; defaults 100,000 cells x 30,000 genes, 625 nonzeros per cell on average:
 * 62.5 M elements, 500 MB of indices + data) is CSC, each gene's density drawn from a skewed
 * distribution as in expression data (a few genes in most cells, most in few). Each
 * combination of --memory, --threads and --band runs R times (default 3); a line per run gives
 * MB/s of matrix bytes (indices + data + column pointers) over the wall time, the CPU time
 * of the process, the wall time of each pass and of the commit (fsync + rename), and what the
 * transposition did (bands, bands split, scratch bytes, peak bytes held).
 *
 * --per-band-reads also times the alternative the transposition does not use: one pass over
 * the source to count elements per row, then one read pass of the whole source per band of
 * rows that fits the memory (1 thread, no fsync), so the two can be compared on one machine.
 * The source here is memory (a read pass is a memcpy); a real .h5ad or Zarr input decodes its
 * chunks on every pass, which "source pass" below prices at this machine's memcpy speed. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "convert/csr_file.h"
#include "convert/source.h"
#include "util/status.h"

typedef struct mock {
    zb__src_matrix base;
    int64_t *colptr;
    uint32_t *rows;
    float *vals;
} mock;

static zb_status
mock_indptr(zb__src_matrix *m, uint64_t start, uint64_t stop, int64_t *out)
{
    memcpy(out, ((mock *)m)->colptr + start, (size_t)(stop - start + 1) * 8);
    return ZB_OK;
}

static zb_status
mock_read(zb__src_matrix *m, uint64_t start, uint64_t stop, zb__csr_block *out)
{
    mock *k = (mock *)m;
    int64_t lo = k->colptr[start], nnz = k->colptr[stop] - lo;
    ZB_TRY(zb__csr_block_reserve(out, stop - start, (uint64_t)nnz, ZB_DT_FLOAT32));
    for (uint64_t c = start; c <= stop; c++) out->indptr[c - start] = k->colptr[c] - lo;
    memcpy(out->indices, k->rows + lo, (size_t)nnz * 4);
    memcpy(out->data, k->vals + lo, (size_t)nnz * 4);
    out->n_rows = stop - start;
    out->nnz = (uint64_t)nnz;
    return ZB_OK;
}

static zb_status
mock_names(zb__src_matrix *m, zb_strings *out)
{
    (void)m;
    (void)out;
    return zb__err(ZB_E_UNSUPPORTED, "no names");
}

static void
mock_close(zb__src_matrix *m)
{
    (void)m;
}

static const zb__src_matrix_methods methods = {mock_indptr, mock_read, mock_names, mock_close,
                                               NULL};

static uint64_t
next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double
uniform(uint64_t *s)
{
    return ((double)(next(s) >> 11) + 0.5) / 9007199254740992.0;
}

static double
clock_s(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double
now(void)
{
    return clock_s(CLOCK_MONOTONIC);
}

/* Gene densities u^4 scaled to the mean: skewed like expression data. Rows by gap sampling. */
static void
make(mock *k, uint64_t cells, uint64_t genes, double per_cell)
{
    uint64_t s = 1, cap = (uint64_t)(per_cell * (double)cells * 1.1) + 1024, nnz = 0;
    k->colptr = malloc((genes + 1) * 8);
    k->rows = malloc(cap * 4);
    k->vals = malloc(cap * 4);
    if (!k->colptr || !k->rows || !k->vals) abort();
    double mean = per_cell / (double)genes; /* E[u^4] = 1/5 */
    k->colptr[0] = 0;
    for (uint64_t g = 0; g < genes; g++) {
        double u = uniform(&s), p = fmin(0.95, 5.0 * mean * u * u * u * u);
        double lq = log1p(-p);
        for (double r = floor(log(uniform(&s)) / lq); r < (double)cells;
             r += 1.0 + floor(log(uniform(&s)) / lq)) {
            if (nnz == cap) break;
            k->rows[nnz] = (uint32_t)r;
            k->vals[nnz] = (float)(1 + next(&s) % 50);
            nnz++;
        }
        k->colptr[g + 1] = (int64_t)nnz;
    }
    k->base.methods = &methods;
    k->base.info = (zb__src_matrix_info){ZB_SRC_CSC, ZB_DT_FLOAT32, cells, genes, nnz};
    k->base.key = "X";
    k->base.path = "synthetic";
}

/* The alternative: count rows in one pass, then per band of rows one pass over every column. */
static double
per_band_reads(mock *k, const char *path, uint64_t memory_bytes, uint64_t *passes)
{
    double t0 = now();
    uint64_t n = k->base.info.n_rows, genes = k->base.info.n_cols;
    int64_t *count = calloc(n + 1, 8);
    zb__csr_block b = {0};
    uint64_t step = 4096;
    for (uint64_t c = 0; c < genes; c += step) {
        uint64_t e = c + step < genes ? c + step : genes;
        if (zb__src_matrix_read(&k->base, c, e, &b) != ZB_OK) abort();
        for (uint64_t x = 0; x < b.nnz; x++) count[b.indices[x] + 1]++;
    }
    *passes = 1;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    uint64_t budget = memory_bytes / 2, r0 = 0, at = 0;
    uint32_t *cols = malloc(budget / 8 * 4 + 4);
    float *vals = malloc(budget / 8 * 4 + 4);
    int64_t *ptr = malloc((n + 1) * 8);
    while (r0 < n) {
        uint64_t r1 = r0, band = 0;
        while (r1 < n && (band + (uint64_t)count[r1 + 1]) * 8 + (r1 - r0) * 8 <= budget)
            band += (uint64_t)count[++r1];
        if (r1 == r0) band = (uint64_t)count[++r1];
        ptr[0] = 0;
        for (uint64_t r = r0; r < r1; r++) ptr[r - r0 + 1] = ptr[r - r0] + count[r + 1];
        for (uint64_t c = 0; c < genes; c += step) {
            uint64_t e = c + step < genes ? c + step : genes;
            if (zb__src_matrix_read(&k->base, c, e, &b) != ZB_OK) abort();
            const float *d = b.data;
            for (uint64_t j = 0; j < e - c; j++)
                for (int64_t x = b.indptr[j]; x < b.indptr[j + 1]; x++) {
                    uint32_t r = b.indices[x];
                    if (r < r0 || r >= r1) continue;
                    int64_t p = ptr[r - r0]++;
                    cols[p] = (uint32_t)(c + j);
                    vals[p] = d[x];
                }
        }
        if (pwrite(fd, cols, band * 4, (off_t)(at * 4)) < 0 ||
            pwrite(fd, vals, band * 4, (off_t)(k->base.info.nnz * 4 + at * 4)) < 0)
            abort();
        at += band;
        r0 = r1;
        (*passes)++;
    }
    close(fd);
    unlink(path);
    free(cols);
    free(vals);
    free(ptr);
    free(count);
    zb__csr_block_free(&b);
    return now() - t0;
}

/* Parses "a,b,c" into at most 8 numbers. */
static int
list(const char *s, double *out)
{
    int n = 0;
    for (char *end; n < 8 && *s; s = *end ? end + 1 : end) out[n++] = strtod(s, &end);
    return n;
}

int
main(int argc, char **argv)
{
    uint64_t cells = 100000, genes = 30000;
    double per_cell = 625, mem[8] = {64, 1024}, thr[8] = {1, 2}, band[8] = {0};
    int n_mem = 2, n_thr = 2, n_band = 1, rounds = 3;
    const char *dir = "/tmp";
    int baseline = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--cells"))
            cells = strtoull(v, NULL, 10), i++;
        else if (!strcmp(a, "--genes"))
            genes = strtoull(v, NULL, 10), i++;
        else if (!strcmp(a, "--per-cell"))
            per_cell = atof(v), i++;
        else if (!strcmp(a, "--dir"))
            dir = v, i++;
        else if (!strcmp(a, "--rounds"))
            rounds = atoi(v), i++;
        else if (!strcmp(a, "--memory"))
            n_mem = list(v, mem), i++;
        else if (!strcmp(a, "--threads"))
            n_thr = list(v, thr), i++;
        else if (!strcmp(a, "--band"))
            n_band = list(v, band), i++;
        else if (!strcmp(a, "--per-band-reads"))
            baseline = 1;
        else {
            fprintf(stderr, "unknown argument %s\n", a);
            return 2;
        }
    }
    mock k = {0};
    double t0 = now();
    make(&k, cells, genes, per_cell);
    uint64_t nnz = k.base.info.nnz;
    double mb = (double)(nnz * 8 + (genes + 1) * 8) / 1e6;
    printf("matrix: %llu x %llu, %llu elements, %.0f MB (made in %.1f s)\n",
           (unsigned long long)cells, (unsigned long long)genes, (unsigned long long)nnz, mb,
           now() - t0);
    char path[4096];
    snprintf(path, sizeof path, "%s/bench_transpose.%ld.csr", dir, (long)getpid());
    /* one read pass of the source, for scale */
    zb__csr_block b = {0};
    t0 = now();
    for (uint64_t c = 0; c < genes; c += 4096)
        if (zb__src_matrix_read(&k.base, c, c + 4096 < genes ? c + 4096 : genes, &b) != ZB_OK)
            abort();
    printf("source pass: %.3f s (%.0f MB/s)\n", now() - t0, mb / (now() - t0));
    zb__csr_block_free(&b);
    for (int mi = 0; mi < n_mem; mi++)
        for (int ti = 0; ti < n_thr; ti++)
            for (int bi = 0; bi < n_band; bi++)
                for (int r = 0; r < rounds; r++) {
                    zb__transpose_opts o = {(uint64_t)(mem[mi] * 1048576), (int)thr[ti],
                                            (uint64_t)(band[bi] * 1024)};
                    zb__transpose_stats st;
                    t0 = now();
                    double c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
                    zb_status s = zb__csc_transpose_ex(&k.base, path, &o, &st);
                    double dt = now() - t0, cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
                    if (s != ZB_OK) {
                        fprintf(stderr, "%s: %s\n", zb_status_name(s), zb_last_error());
                        return 1;
                    }
                    printf("memory %5.0f MiB threads %d band %4.0f KiB: %6.3f s %6.0f MB/s "
                           "cpu %.3f s (pass 1 %.3f, pass 2 %.3f, commit %.3f) %s bands %llu "
                           "split %llu scratch %.0f MB peak %.1f MiB\n",
                           mem[mi], (int)thr[ti], band[bi], dt, mb / dt, cpu, st.seconds[0],
                           st.seconds[1], st.seconds[2], st.in_memory ? "memory" : "file  ",
                           (unsigned long long)st.bands, (unsigned long long)st.bands_split,
                           (double)st.scratch_bytes / 1e6, (double)st.peak_bytes / 1048576.0);
                    fflush(stdout);
                    unlink(path);
                }
    for (int mi = 0; baseline && mi < n_mem; mi++) {
        uint64_t passes;
        double c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
        double dt = per_band_reads(&k, path, (uint64_t)(mem[mi] * 1048576), &passes);
        double cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        printf("per-band reads, memory %5.0f MiB, 1 thread: %6.3f s %6.0f MB/s cpu %.3f s, "
               "%llu source passes\n",
               mem[mi], dt, mb / dt, cpu, (unsigned long long)passes);
    }
    free(k.colptr);
    free(k.rows);
    free(k.vals);
    return 0;
}
