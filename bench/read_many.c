/* zbatch-bench-read-many: read_many throughput next to the decode-only limit, measured in one
 * run on the same machine, the same chunks, the same codec and the same threads.
 *
 *   bench_read_many STORE [--batch B] [--batches K] [--threads T] [--block S] [--seed X]
 *
 * For each id pattern (sorted: B consecutive ids from a random start; block: random blocks of S
 * consecutive ids; random: uniform ids) it runs K read_many calls and reports samples/s, GB/s
 * decoded, read amplification, and the decode-only limit: the distinct units those K batches
 * touched, fetched into memory beforehand and decoded in a tight loop on T threads. The ratio
 * (read_many time of the decoded bytes / decode-only time of the same bytes) is the figure of
 * merit (DESIGN.md §6). Both are measured in alternating rounds (--rounds, default 5) and each
 * keeps its best time. Prints one JSON line per pattern. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <malloc.h>
#include <time.h>

#include "dataset/dataset.h"
#include "store/store.h"
#include "util/pool.h"
#include "util/status.h"
#include "zarr/codec.h"
#include "zarr/shard.h"
#include "zbatch.h"

static double
now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t
rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct unit {
    const zb_array *arr;
    uint64_t g0; /* axis-0 unit (the bench covers arrays chunked along axis 0 only) */
    uint8_t *enc;
    size_t enc_len;
    bool missing;
} unit;

typedef struct unit_set {
    unit *u;
    size_t n, cap;
} unit_set;

static int
cmp_unit(const void *x, const void *y)
{
    const unit *a = x, *b = y;
    if (a->arr != b->arr) return a->arr < b->arr ? -1 : 1;
    return a->g0 < b->g0 ? -1 : a->g0 > b->g0;
}

static void
add_unit(unit_set *s, const zb_array *a, uint64_t g0)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 4096;
        s->u = realloc(s->u, s->cap * sizeof *s->u);
    }
    s->u[s->n++] = (unit){a, g0, NULL, 0, false};
}

/* The units a batch touches, computed from the dataset's fields and segments. */
static zb_status
collect_units(zb_dataset *ds, const uint64_t *ids, size_t n, unit_set *s, zb_ctx *ctx)
{
    for (size_t f = 0; f < ds->nfields; f++) {
        const zb__field *fd = &ds->fields[f];
        uint64_t U = fd->arr->inner[0];
        for (size_t i = 0; i < n; i++) {
            uint64_t p = zb__mask_select(&ds->mask, ids[i]);
            uint64_t r0 = p, r1 = p + 1;
            if (fd->seg >= 0) {
                int64_t a0, a1;
                ZB_TRY(zb__segment_get(&ds->segs[fd->seg], ctx, p, &a0));
                ZB_TRY(zb__segment_get(&ds->segs[fd->seg], ctx, p + 1, &a1));
                r0 = (uint64_t)a0;
                r1 = (uint64_t)a1;
            }
            if (r1 > r0)
                for (uint64_t u = r0 / U; u <= (r1 - 1) / U; u++) add_unit(s, fd->arr, u);
        }
    }
    return ZB_OK;
}

static void
dedup(unit_set *s)
{
    qsort(s->u, s->n, sizeof *s->u, cmp_unit);
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++)
        if (k == 0 || cmp_unit(&s->u[k - 1], &s->u[i])) s->u[k++] = s->u[i];
    s->n = k;
}

/* Fetches every unit's encoded bytes into memory (outside the timed loop). */
static zb_status
fetch_units(unit_set *s, zb_ctx *ctx)
{
    char key[4600];
    for (size_t i = 0; i < s->n; i++) {
        unit *u = &s->u[i];
        const zb_array *a = u->arr;
        uint64_t g[ZB_MAX_DIMS] = {0}, entry = 0, shard[ZB_MAX_DIMS];
        g[0] = u->g0;
        ZB_TRY(zb__array_unit_object(a, g, key, sizeof key, shard, &entry));
        uint64_t off = 0, len = 0, size = 0;
        if (a->meta.chain.ab == ZB_AB_SHARDING) {
            uint64_t *e = NULL, nn = 0;
            bool missing = false;
            ZB_TRY(zb__array_shard_index(a, ctx, shard, &e, &nn, &missing));
            if (missing || e[2 * entry] == ZB_SHARD_EMPTY) {
                u->missing = true;
                free(e);
                continue;
            }
            off = e[2 * entry];
            len = e[2 * entry + 1];
            free(e);
        } else {
            zb_status st = zb_store_size(a->store, key, &size);
            if (st == ZB_E_NOTFOUND) {
                u->missing = true;
                continue;
            }
            ZB_TRY(st);
            len = size;
        }
        u->enc = malloc((size_t)len + 1);
        uint64_t got = 0;
        ZB_TRY(zb_store_get(a->store, key, off, len, u->enc, &got));
        u->enc_len = (size_t)got;
    }
    return ZB_OK;
}

typedef struct dec_task {
    unit *u;
    size_t n;
    uint8_t *out; /* per task, reused across its units */
    zb_status st;
} dec_task;

static void
decode_task(void *arg, zb_ctx *ctx)
{
    dec_task *t = arg;
    for (size_t i = 0; i < t->n && t->st == ZB_OK; i++) {
        unit *u = &t->u[i];
        if (u->missing) continue;
        t->st = zb__array_decode_unit(u->arr, ctx, u->enc, u->enc_len, t->out, "bench");
    }
}

/* Decodes every unit once on the pool; returns the seconds it took. */
static double
decode_only(zb__pool *pool, unit_set *s, int threads, uint64_t *bytes)
{
    size_t maxb = 0;
    *bytes = 0;
    for (size_t i = 0; i < s->n; i++) {
        size_t b = (size_t)zb__array_unit_bytes(s->u[i].arr);
        if (b > maxb) maxb = b;
        if (!s->u[i].missing) *bytes += b;
    }
    size_t ntasks = (size_t)threads * 8;
    if (ntasks > s->n) ntasks = s->n ? s->n : 1;
    dec_task *t = calloc(ntasks, sizeof *t);
    size_t per = (s->n + ntasks - 1) / ntasks;
    for (size_t k = 0; k < ntasks; k++) {
        size_t lo = k * per, hi = lo + per > s->n ? s->n : lo + per;
        t[k] = (dec_task){s->u + lo, hi > lo ? hi - lo : 0, malloc(maxb + 1), ZB_OK};
    }
    double t0 = now();
    for (size_t k = 0; k < ntasks; k++) zb__pool_submit(pool, decode_task, &t[k]);
    zb__pool_wait(pool);
    double dt = now() - t0;
    for (size_t k = 0; k < ntasks; k++) {
        if (t[k].st != ZB_OK) fprintf(stderr, "decode-only: %s\n", zb_last_error());
        free(t[k].out);
    }
    free(t);
    return dt;
}

static void
make_ids(const char *pattern, uint64_t *ids, size_t B, uint64_t N, uint64_t block, uint64_t *rs)
{
    if (!strcmp(pattern, "sorted")) {
        uint64_t start = N > B ? rng_next(rs) % (N - B) : 0;
        for (size_t i = 0; i < B; i++) ids[i] = (start + i) % N;
    } else if (!strcmp(pattern, "block")) {
        for (size_t i = 0; i < B;) {
            uint64_t nb = N / block ? N / block : 1;
            uint64_t start = (rng_next(rs) % nb) * block;
            for (uint64_t k = 0; k < block && i < B; k++, i++) ids[i] = (start + k) % N;
        }
    } else {
        for (size_t i = 0; i < B; i++) ids[i] = rng_next(rs) % N;
    }
}

int
main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr,
                "usage: %s STORE [--batch B] [--batches K] [--threads T] [--block S] "
                "[--seed X] [--patterns sorted,block,random]\n",
                argv[0]);
        return 2;
    }
    const char *path = argv[1];
    size_t B = 4096, K = 8;
    int threads = 2, rounds = 5;
    uint64_t block = 64, seed = 0;
    const char *patterns = "sorted,block,random";
    if (getenv("ZB_BENCH_MALLOPT")) {
        mallopt(M_MMAP_THRESHOLD, 1 << 30);
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
    }
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--batch"))
            B = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--batches"))
            K = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--block"))
            block = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--seed"))
            seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--patterns"))
            patterns = argv[i + 1];
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
    }
    zb_store *store = NULL;
    zb_dataset *ds = NULL;
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    o.num_threads = threads;
    if (zb_store_open(path, &store) != ZB_OK || zb_dataset_open(store, "", &o, &ds) != ZB_OK) {
        fprintf(stderr, "bench: %s\n", zb_last_error());
        return 1;
    }
    if (ds->nchildren) {
        fprintf(stderr, "bench: collections are not covered yet; give one dataset\n");
        return 1;
    }
    uint64_t N = 0;
    zb_dataset_len(ds, &N);
    zb__pool *pool = NULL;
    zb__pool_new(threads, &pool);
    zb_ctx *ctx = NULL;
    zb_ctx_new(&ctx);
    char list[256];
    snprintf(list, sizeof list, "%s", patterns);
    for (char *pat = strtok(list, ","); pat; pat = strtok(NULL, ",")) {
        uint64_t rs = seed * 7919 + 1;
        uint64_t *ids = malloc(B * K * sizeof *ids);
        for (size_t k = 0; k < K; k++) make_ids(pat, ids + k * B, B, N, block, &rs);
        /* warm the page cache and the pointer blocks once, untimed */
        for (size_t k = 0; k < K; k++) {
            zb_batch *b = NULL;
            if (zb_dataset_read_many(ds, ids + k * B, B, &b) != ZB_OK) {
                fprintf(stderr, "bench: %s\n", zb_last_error());
                return 1;
            }
            zb_batch_free(b);
        }
        /* The machine is shared: the two measurements alternate for `rounds` rounds and each
         * keeps its best (shortest) time, so a neighbour's burst hits neither systematically. */
        unit_set *sets = calloc(K, sizeof *sets);
        for (size_t k = 0; k < K; k++) {
            if (collect_units(ds, ids + k * B, B, &sets[k], ctx) != ZB_OK) {
                fprintf(stderr, "bench: %s\n", zb_last_error());
                return 1;
            }
            dedup(&sets[k]);
            fetch_units(&sets[k], ctx);
        }
        zb_read_stats tot = {0};
        double t_read = 1e30, t_dec = 1e30;
        uint64_t dec_bytes = 0;
        for (int round = 0; round < rounds; round++) {
            memset(&tot, 0, sizeof tot);
            double t0 = now();
            for (size_t k = 0; k < K; k++) {
                zb_batch *b = NULL;
                zb_dataset_read_many(ds, ids + k * B, B, &b);
                zb_read_stats st;
                zb_batch_stats(b, &st);
                tot.bytes_decoded += st.bytes_decoded;
                tot.bytes_delivered += st.bytes_delivered;
                tot.chunks_decoded += st.chunks_decoded;
                zb_batch_free(b);
            }
            double tr = now() - t0;
            if (tr < t_read) t_read = tr;
            double td = 0;
            dec_bytes = 0;
            for (size_t k = 0; k < K; k++) {
                uint64_t bytes = 0;
                td += decode_only(pool, &sets[k], threads, &bytes);
                dec_bytes += bytes;
            }
            if (td < t_dec) t_dec = td;
        }
        for (size_t k = 0; k < K; k++) {
            for (size_t i = 0; i < sets[k].n; i++) free(sets[k].u[i].enc);
            free(sets[k].u);
        }
        free(sets);
        double samples = (double)(B * K);
        double gbs_read = (double)tot.bytes_decoded / t_read / 1e9;
        double gbs_dec = (double)dec_bytes / t_dec / 1e9;
        printf("{\"pattern\":\"%s\",\"batch\":%zu,\"batches\":%zu,\"threads\":%d,\"block\":%llu,"
               "\"samples_per_s\":%.0f,\"decoded_gb_s\":%.3f,\"amplification\":%.3f,"
               "\"chunks_decoded\":%llu,\"decode_only_gb_s\":%.3f,"
               "\"decode_only_samples_per_s\":%.0f,\"ratio\":%.3f}\n",
               pat, B, K, threads, (unsigned long long)block, samples / t_read, gbs_read,
               tot.bytes_delivered ? (double)tot.bytes_decoded / (double)tot.bytes_delivered : 0,
               (unsigned long long)tot.chunks_decoded, gbs_dec, samples / t_dec,
               t_dec / t_read * ((double)tot.bytes_decoded / (double)(dec_bytes ? dec_bytes : 1)));
        fflush(stdout);
        free(ids);
    }
    zb_ctx_free(ctx);
    zb__pool_free(pool);
    zb_dataset_close(ds);
    zb_store_close(store);
    return 0;
}
