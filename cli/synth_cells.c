/* zbatch synth --kind cells: a Tahoe-like AnnData store (FORMATS.md §7.3), reproducible by seed.
 *
 * Every cell draws from its own generator, seeded from (seed, cell index), so the store depends
 * only on the seed and the options, never on the block size or the number of threads. Cells are
 * generated and written block by block: memory is bounded by one block whatever --n is.
 *
 * The model, per cell:
 * - nonzeros k ~ lognormal with mean MEAN_NNZ (sigma NNZ_SIGMA), rounded, clipped to [1, genes];
 * - k distinct gene ids drawn uniformly (Floyd's algorithm on a bitmap), stored sorted, as uint16
 *   by default (anndata's narrowest type for up to 65,535 genes; int32 for more, or on request);
 * - counts ~ geometric on {1, 2, ...} with mean 1 / COUNT_P, cut at MAX_COUNT, so stored exactly
 *   as uint8 by default (raw UMI counts are small integers, mostly 1 and 2; issue 19: a narrow
 *   store is half the bytes to decode, and zbatch delivers it as float32), or as float32 or
 *   uint16 on request (--data-dtype);
 * - obs: categorical cell_line (50), drug (380), plate (14), drawn uniformly; n_genes (int32, k);
 *   names cell_<i>; var names gene_<j>.
 */
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "prng.h"
#include "zbatch.h"

#define SHARD_ELEMS ((uint64_t)4 << 20) /* default shard: 4M elements of X/data */
#define MEAN_NNZ 1460.0
#define NNZ_SIGMA 0.55
#define COUNT_P 0.55
#define MAX_COUNT 64 /* geometric tail cut (P(count > 64) is about 1e-22) */
#define BLOCK_CELLS 4096
#define DEFAULT_GENES 62710
#define N_CELL_LINES 50
#define N_DRUGS 380
#define N_PLATES 14

/* ---------------------------------------------------------------------------------------------
 * The generator: splitmix64 expands a 64-bit seed into xoshiro256** state (the pairing their
 * authors recommend). Hand-written because the output must be the same on every platform and
 * C library; rand() is neither portable nor good enough.
 * ------------------------------------------------------------------------------------------- */

/* The generator of cell `i`: independent streams per (seed, cell). */
static void
rng_for_cell(rng *r, uint64_t seed, uint64_t i)
{
    uint64_t x = seed;
    uint64_t k = splitmix64(&x) ^ (i * 0xD1B54A32D192ED03ull);
    for (int j = 0; j < 4; j++) r->s[j] = splitmix64(&k);
}

/* Uniform double in (0, 1]. */
static double
rng_unit(rng *r)
{
    return ((double)(rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

/* Uniform integer in [0, n) (Lemire's multiply-shift; the bias is below 2^-32 for our n). */
static uint32_t
rng_below(rng *r, uint32_t n)
{
    return (uint32_t)(((rng_next(r) >> 32) * (uint64_t)n) >> 32);
}

/* ---------------------------------------------------------------------------------------------
 * The cell model
 * ------------------------------------------------------------------------------------------- */
typedef struct model {
    uint64_t seed;
    uint32_t genes;
    double mu;                /* log-space mean of the lognormal */
    uint64_t tail[MAX_COUNT]; /* tail[m] = P(count > m) * 2^64, for m = 1 .. MAX_COUNT-1 */
} model;

static void
model_init(model *m, uint64_t seed, uint32_t genes)
{
    m->seed = seed;
    m->genes = genes;
    /* E[exp(N(mu, s^2))] = exp(mu + s^2/2) */
    m->mu = log(MEAN_NNZ) - NNZ_SIGMA * NNZ_SIGMA / 2.0;
    double q = 1.0 - COUNT_P;
    for (int k = 0; k < MAX_COUNT; k++) {
        double t = pow(q, k) * 18446744073709551616.0;
        m->tail[k] = t >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)t;
    }
}

/* The cell's nonzero count: the first draws of its generator. */
static uint32_t
cell_nnz(const model *m, rng *r)
{
    /* Box-Muller: one standard normal from two uniforms */
    double u1 = rng_unit(r), u2 = rng_unit(r);
    double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    double k = floor(exp(m->mu + NNZ_SIGMA * z) + 0.5);
    if (!(k >= 1.0)) k = 1.0;
    if (k > (double)m->genes) k = (double)m->genes;
    return (uint32_t)k;
}

/* Fills the k sorted distinct gene ids and counts of a cell whose nnz was just drawn.
 * `bits` is a zeroed bitmap of `genes` bits and is left zeroed. */
static void
cell_fill(const model *m, rng *r, uint32_t k, uint64_t *bits, int32_t *ids, float *counts)
{
    /* Floyd: for j in [genes-k, genes): take t in [0, j]; if taken, take j instead */
    for (uint32_t j = m->genes - k; j < m->genes; j++) {
        uint32_t t = rng_below(r, j + 1);
        if (bits[t >> 6] & (1ull << (t & 63))) t = j;
        bits[t >> 6] |= 1ull << (t & 63);
    }
    uint32_t n = 0;
    for (uint32_t w = 0; n < k; w++) {
        uint64_t word = bits[w];
        bits[w] = 0;
        while (word) {
            ids[n++] = (int32_t)(w * 64u + (uint32_t)__builtin_ctzll(word));
            word &= word - 1;
        }
    }
    for (uint32_t e = 0; e < k; e++) {
        uint64_t u = rng_next(r);
        int c = 1;
        while (c < MAX_COUNT && u < m->tail[c]) c++;
        counts[e] = (float)c;
    }
}

/* ---------------------------------------------------------------------------------------------
 * One block of cells, generated by `threads` workers over disjoint cell ranges
 * ------------------------------------------------------------------------------------------- */
typedef struct block {
    const model *m;
    uint64_t first, n; /* cells [first, first+n) */
    int64_t indptr[BLOCK_CELLS + 1];
    int32_t nnz[BLOCK_CELLS];
    int8_t cell_line[BLOCK_CELLS];
    int16_t drug[BLOCK_CELLS];
    int8_t plate[BLOCK_CELLS];
    int32_t *ids;
    float *counts;
    size_t cap;        /* elements of ids/counts */
    void *stored;      /* the counts in the stored dtype, when it is not float32 */
    size_t stored_cap; /* bytes */
} block;

typedef struct worker {
    block *b;
    uint64_t lo, hi; /* cells of the block, relative */
    uint64_t *bits;
} worker;

static void *
work(void *arg)
{
    worker *wk = arg;
    block *b = wk->b;
    for (uint64_t c = wk->lo; c < wk->hi; c++) {
        rng r;
        rng_for_cell(&r, b->m->seed, b->first + c);
        uint32_t k = cell_nnz(b->m, &r);
        b->cell_line[c] = (int8_t)rng_below(&r, N_CELL_LINES);
        b->drug[c] = (int16_t)rng_below(&r, N_DRUGS);
        b->plate[c] = (int8_t)rng_below(&r, N_PLATES);
        cell_fill(b->m, &r, k, wk->bits, b->ids + b->indptr[c], b->counts + b->indptr[c]);
    }
    return NULL;
}

/* Generates the block's cells: nnz first (serial and cheap), then the rest in parallel. */
static int
block_generate(block *b, int threads, worker *wk)
{
    b->indptr[0] = 0;
    for (uint64_t c = 0; c < b->n; c++) {
        rng r;
        rng_for_cell(&r, b->m->seed, b->first + c);
        b->nnz[c] = (int32_t)cell_nnz(b->m, &r);
        b->indptr[c + 1] = b->indptr[c] + b->nnz[c];
    }
    size_t need = (size_t)b->indptr[b->n];
    if (need > b->cap) {
        size_t cap = need + need / 4;
        int32_t *ids = realloc(b->ids, cap * sizeof *ids);
        if (ids) b->ids = ids;
        float *counts = realloc(b->counts, cap * sizeof *counts);
        if (counts) b->counts = counts;
        if (!ids || !counts) return -1;
        b->cap = cap;
    }
    pthread_t tid[64];
    int started = 0;
    for (int t = 0; t < threads; t++) {
        wk[t].b = b;
        wk[t].lo = b->n * (uint64_t)t / (uint64_t)threads;
        wk[t].hi = b->n * (uint64_t)(t + 1) / (uint64_t)threads;
    }
    for (int t = 1; t < threads; t++)
        if (pthread_create(&tid[t], NULL, work, &wk[t]) == 0)
            started = t;
        else
            break;
    /* threads that failed to start are done here, on the calling thread */
    for (int t = started + 1; t < threads; t++) work(&wk[t]);
    work(&wk[0]);
    for (int t = 1; t <= started; t++) pthread_join(tid[t], NULL);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Strings: names and categories written block by block
 * ------------------------------------------------------------------------------------------- */
typedef struct names {
    char *text;
    uint64_t *offsets;
    size_t cap;
} names;

/* Formats `n` names fmt(first + i) into `nm` (fmt takes one uint64). */
static int
names_make(names *nm, const char *prefix, uint64_t first, uint64_t n)
{
    size_t need = (size_t)n * (strlen(prefix) + 21);
    if (need > nm->cap) {
        char *t = realloc(nm->text, need);
        if (!t) return -1;
        nm->text = t;
        uint64_t *o = realloc(nm->offsets, ((size_t)n + 1) * sizeof *o);
        if (!o) return -1;
        nm->offsets = o;
        nm->cap = need;
    }
    uint64_t pos = 0;
    nm->offsets[0] = 0;
    for (uint64_t i = 0; i < n; i++) {
        pos += (uint64_t)snprintf(nm->text + pos, nm->cap - pos, "%s%" PRIu64, prefix, first + i);
        nm->offsets[i + 1] = pos;
    }
    return 0;
}

/* The block's counts as `dtype` stores them (exactly: they are integers in [1, MAX_COUNT]):
 * b->counts itself for float32, else b->stored; NULL when out of memory. */
static const void *
block_counts(block *b, zb_dtype dtype)
{
    if (dtype == ZB_DT_FLOAT32) return b->counts;
    size_t n = (size_t)b->indptr[b->n], isz = zb_dtype_size(dtype);
    if (n * isz > b->stored_cap) {
        void *p = realloc(b->stored, n * isz + 1);
        if (!p) return NULL;
        b->stored = p;
        b->stored_cap = n * isz + 1;
    }
    for (size_t i = 0; i < n; i++) {
        if (dtype == ZB_DT_UINT8)
            ((uint8_t *)b->stored)[i] = (uint8_t)b->counts[i];
        else
            ((uint16_t *)b->stored)[i] = (uint16_t)b->counts[i];
    }
    return b->stored;
}

/* ---------------------------------------------------------------------------------------------
 * Options
 * ------------------------------------------------------------------------------------------- */
static void
usage(FILE *f)
{
    fprintf(
        f,
        "usage: zbatch synth --kind cells --n N -o PATH [options]\n"
        "\n"
        "Writes a Tahoe-like AnnData store: CSR X (integer counts up to %d, gene ids, int64\n"
        "indptr), lognormal nonzeros per cell (mean %.0f), obs columns cell_line (%d\n"
        "categories), drug (%d), plate (%d) and n_genes. The same seed and options give a\n"
        "byte-identical store. Memory does not grow with N.\n"
        "\n"
        "  --n N            cells (rows of X)\n"
        "  -o, --out PATH   output directory (created; must not hold a store)\n"
        "  --seed S         random seed (default 0)\n"
        "  --format v2|v3   Zarr format (default v3)\n"
        "  --codec CODEC    e.g. zstd:3, blosc:lz4:5:shuffle, none (default: the library's)\n"
        "  --genes G        columns of X (default %d)\n"
        "  --chunk-nnz K    elements per chunk of X/data and X/indices (default: the library's,\n"
        "                   %d)\n"
        "  --shard-nnz K    v3: elements per shard, a multiple of --chunk-nnz; 0 = unsharded\n"
        "                   (default %llu elements: %llu inner chunks of the default size)\n"
        "  --threads T      generation and compression threads (default 1)\n"
        "  --data-dtype D   X/data: uint8 (default: the narrowest type holding every count\n"
        "                   exactly), uint16 or float32 (the wide store of old)\n"
        "  --index-dtype D  X/indices: narrow (default: anndata's smallest unsigned type for\n"
        "                   G genes, uint16 for the default G; int32 past 65,535 genes) or\n"
        "                   int32\n"
        "  -h, --help       this text\n",
        MAX_COUNT, MEAN_NNZ, N_CELL_LINES, N_DRUGS, N_PLATES, DEFAULT_GENES,
        ZB_ANNDATA_DEFAULT_X_CHUNK, (unsigned long long)SHARD_ELEMS,
        (unsigned long long)(SHARD_ELEMS / ZB_ANNDATA_DEFAULT_X_CHUNK));
}

typedef struct opts {
    uint64_t n;
    const char *out;
    uint64_t seed;
    int format;
    const char *codec;
    uint64_t genes, chunk_nnz, shard_nnz, threads;
    zb_dtype data_dtype; /* of X/data */
    int narrow_indices;  /* 1 narrow, 0 int32, -1 by the number of genes */
    bool have_n;
} opts;

static int
parse_u64(const char *flag, const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *s == '-' || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "zbatch synth: %s: '%s' is not an integer in [%" PRIu64 ", %" PRIu64 "]\n",
                flag, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* Returns 0 to go on, else the exit code (-1 for --help). */
static int
parse_args(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    o->format = 3;
    o->genes = DEFAULT_GENES;
    o->threads = 1;
    o->shard_nnz = UINT64_MAX;   /* the Tahoe layout unless told otherwise */
    o->data_dtype = ZB_DT_UINT8; /* counts are integers in [1, MAX_COUNT] */
    o->narrow_indices = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return -1;
        }
        const char *val = NULL;
        char flag[32];
        const char *eq = strncmp(a, "--", 2) ? NULL : strchr(a, '=');
        if (eq) {
            snprintf(flag, sizeof flag, "%.*s", (int)(eq - a), a);
            val = eq + 1;
        } else {
            snprintf(flag, sizeof flag, "%s", a);
            if (i + 1 >= argc) {
                fprintf(stderr, "zbatch synth: %s needs a value\n", a);
                return 2;
            }
            val = argv[++i];
        }
        int bad = 0;
        if (!strcmp(flag, "--kind")) {
            continue; /* the dispatcher routed us here */
        } else if (!strcmp(flag, "--n")) {
            bad = parse_u64(flag, val, 0, (uint64_t)1 << 40, &o->n);
            o->have_n = true;
        } else if (!strcmp(flag, "-o") || !strcmp(flag, "--out")) {
            o->out = val;
        } else if (!strcmp(flag, "--seed")) {
            bad = parse_u64(flag, val, 0, UINT64_MAX, &o->seed);
        } else if (!strcmp(flag, "--format")) {
            if (!strcmp(val, "v2") || !strcmp(val, "2"))
                o->format = 2;
            else if (!strcmp(val, "v3") || !strcmp(val, "3"))
                o->format = 3;
            else {
                fprintf(stderr, "zbatch synth: --format: '%s' is not v2 or v3\n", val);
                bad = 1;
            }
        } else if (!strcmp(flag, "--codec")) {
            o->codec = val;
        } else if (!strcmp(flag, "--genes")) {
            bad = parse_u64(flag, val, 1, INT32_MAX, &o->genes);
        } else if (!strcmp(flag, "--chunk-nnz")) {
            bad = parse_u64(flag, val, 1, (uint64_t)1 << 40, &o->chunk_nnz);
        } else if (!strcmp(flag, "--shard-nnz")) {
            bad = parse_u64(flag, val, 0, (uint64_t)1 << 40, &o->shard_nnz);
        } else if (!strcmp(flag, "--threads")) {
            bad = parse_u64(flag, val, 1, 64, &o->threads);
        } else if (!strcmp(flag, "--data-dtype")) {
            if (!strcmp(val, "uint8"))
                o->data_dtype = ZB_DT_UINT8;
            else if (!strcmp(val, "uint16"))
                o->data_dtype = ZB_DT_UINT16;
            else if (!strcmp(val, "float32"))
                o->data_dtype = ZB_DT_FLOAT32;
            else {
                fprintf(stderr,
                        "zbatch synth: --data-dtype: '%s' is not uint8, uint16 or "
                        "float32\n",
                        val);
                bad = 1;
            }
        } else if (!strcmp(flag, "--index-dtype")) {
            if (!strcmp(val, "narrow"))
                o->narrow_indices = 1;
            else if (!strcmp(val, "int32"))
                o->narrow_indices = 0;
            else {
                fprintf(stderr, "zbatch synth: --index-dtype: '%s' is not narrow or int32\n", val);
                bad = 1;
            }
        } else {
            fprintf(stderr, "zbatch synth --kind cells: unknown option '%s'\n", flag);
            return 2;
        }
        if (bad) return 2;
    }
    if (!o->have_n || !o->out) {
        fprintf(stderr, "zbatch synth --kind cells: --n and -o are required\n");
        usage(stderr);
        return 2;
    }
    return 0;
}

/* mkdir -p */
static int
make_dirs(const char *path)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return -1;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
    return 0;
}

static uint64_t du_total;

static int
du_add(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)path;
    (void)ftw;
    if (type == FTW_F) du_total += (uint64_t)st->st_size;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * The command
 * ------------------------------------------------------------------------------------------- */

/* Categories "<prefix><i>" for i in [0, n), zero-padded to `width`. */
static zb_status
define_categories(zb_anndata_writer *w, const char *name, const char *prefix, int width, uint64_t n)
{
    char text[N_DRUGS * 24];
    uint64_t offs[N_DRUGS + 1];
    offs[0] = 0;
    for (uint64_t i = 0; i < n; i++)
        offs[i + 1] =
            offs[i] + (uint64_t)snprintf(text + offs[i], 24, "%s%0*" PRIu64, prefix, width, i);
    return zb_anndata_writer_define_categorical(w, ZB_ANNDATA_OBS, name, text, offs, n, false);
}

static double
now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int
zb__cli_synth_cells(int argc, char **argv)
{
    opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    if (make_dirs(o.out) != 0) {
        fprintf(stderr, "zbatch synth: cannot create %s: %s\n", o.out, strerror(errno));
        return 1;
    }
    double t0 = now_seconds();
    model m;
    model_init(&m, o.seed, (uint32_t)o.genes);

    zb_store *store = NULL;
    zb_anndata_writer *w = NULL;
    block *b = calloc(1, sizeof *b);
    worker *wk = calloc(o.threads, sizeof *wk);
    names nm = {0};
    zb_status st = b && wk ? ZB_OK : ZB_E_NOMEM;
    for (uint64_t t = 0; st == ZB_OK && t < o.threads; t++) {
        wk[t].bits = calloc((o.genes + 63) / 64, sizeof(uint64_t));
        if (!wk[t].bits) st = ZB_E_NOMEM;
    }
    if (st == ZB_OK) st = zb_store_open_file(o.out, &store);
    if (st == ZB_OK) {
        zb_anndata_write_opts wo = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
        wo.zarr_format = o.format;
        wo.codec = o.codec;
        wo.x_chunk = o.chunk_nnz;
        /* Sharded like Tahoe-100M (FORMATS.md §7.3), with shards of 4M elements (16 MiB of
         * float32) instead of Tahoe's 128M: the array writer holds a whole shard while it
         * fills. A chunk size given on the command line keeps the shard near that size. */
        uint64_t chunk = o.chunk_nnz ? o.chunk_nnz : ZB_ANNDATA_DEFAULT_X_CHUNK;
        uint64_t per = chunk < SHARD_ELEMS ? SHARD_ELEMS / chunk : 1;
        wo.x_shard = o.shard_nnz != UINT64_MAX ? o.shard_nnz : o.format == 3 ? chunk * per : 0;
        wo.num_threads = (int)o.threads;
        wo.narrow_indices = o.narrow_indices < 0 ? o.genes <= UINT16_MAX : o.narrow_indices;
        st = zb_anndata_writer_open(store, "", o.genes, ZB_ANNDATA_X_CSR, o.data_dtype, &wo, &w);
    }
    if (st == ZB_OK) st = define_categories(w, "cell_line", "CVCL_", 4, N_CELL_LINES);
    if (st == ZB_OK) st = define_categories(w, "drug", "drug_", 3, N_DRUGS);
    if (st == ZB_OK) st = define_categories(w, "plate", "plate_", 2, N_PLATES);
    /* created up front so the column exists (and keeps its place) even with --n 0 */
    if (st == ZB_OK)
        st = zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "n_genes", ZB_DT_INT32, NULL, 0);
    if (b) b->m = &m;
    for (uint64_t first = 0; st == ZB_OK && first < o.n; first += BLOCK_CELLS) {
        b->first = first;
        b->n = o.n - first < BLOCK_CELLS ? o.n - first : BLOCK_CELLS;
        if (block_generate(b, (int)o.threads, wk) != 0) {
            st = ZB_E_NOMEM;
            break;
        }
        const void *counts = block_counts(b, o.data_dtype);
        st = counts ? zb_anndata_writer_append_csr(w, b->n, b->indptr, b->ids, counts) : ZB_E_NOMEM;
        if (st == ZB_OK)
            st = zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "cell_line", ZB_DT_INT8,
                                                b->cell_line, b->n);
        if (st == ZB_OK)
            st = zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "drug", ZB_DT_INT16, b->drug,
                                                b->n);
        if (st == ZB_OK)
            st = zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "plate", ZB_DT_INT8, b->plate,
                                                b->n);
        if (st == ZB_OK)
            st = zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "n_genes", ZB_DT_INT32, b->nnz,
                                                 b->n);
        if (st == ZB_OK && names_make(&nm, "cell_", first, b->n) != 0) st = ZB_E_NOMEM;
        if (st == ZB_OK)
            st = zb_anndata_writer_append_names(w, ZB_ANNDATA_OBS, nm.text, nm.offsets, b->n);
    }
    for (uint64_t j = 0; st == ZB_OK && j < o.genes; j += BLOCK_CELLS) {
        uint64_t n = o.genes - j < BLOCK_CELLS ? o.genes - j : BLOCK_CELLS;
        if (names_make(&nm, "gene_", j, n) != 0) st = ZB_E_NOMEM;
        if (st == ZB_OK)
            st = zb_anndata_writer_append_names(w, ZB_ANNDATA_VAR, nm.text, nm.offsets, n);
    }
    uint64_t nnz = zb_anndata_writer_nnz(w);
    zb_dtype index_dtype = zb_anndata_writer_index_dtype(w);
    if (st == ZB_OK) st = zb_anndata_writer_commit(w);

    zb_anndata_writer_close(w);
    zb_store_close(store);
    for (uint64_t t = 0; wk && t < o.threads; t++) free(wk[t].bits);
    free(wk);
    if (b) {
        free(b->ids);
        free(b->counts);
        free(b->stored);
    }
    free(b);
    free(nm.text);
    free(nm.offsets);
    if (st != ZB_OK) {
        fprintf(stderr, "zbatch synth: %s: %s\n", zb_strerror(st),
                st == ZB_E_NOMEM && !*zb_last_error() ? "out of memory" : zb_last_error());
        return 1;
    }
    double secs = now_seconds() - t0;
    du_total = 0;
    nftw(o.out, du_add, 32, FTW_PHYS);
    printf("synth cells: %" PRIu64 " cells x %" PRIu64 " genes, %" PRIu64
           " nonzeros (%.1f per cell), X/data %s (%s), X/indices %s (%s), %" PRIu64
           " bytes, %.2f s -> %s\n",
           o.n, o.genes, nnz, o.n ? (double)nnz / (double)o.n : 0.0, zb_dtype_name(o.data_dtype),
           zb_anndata_csr_codec(o.codec, o.data_dtype), zb_dtype_name(index_dtype),
           zb_anndata_csr_codec(o.codec, index_dtype), du_total, secs, o.out);
    return 0;
}
