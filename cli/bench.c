/* zbatch bench STORE [options]: runs a configured loader over a store and reports its throughput
 * next to the decode-only limit of the same chunks (DESIGN.md §6) and the decode + write limit
 * (the same decode, the delivered bytes then stored to memory), with read amplification, CPU,
 * memory, page faults, latency and shuffle quality; `zbatch bench --write ...` measures writing
 * synthetic stores instead (bench_write.c).
 *
 * The timed part is the loader alone: zb_loader_next on this thread, batches released at once,
 * the sample ids copied aside. The first window (prefetch_factor batches) is a warm-up, timed
 * only for the time to first batch; the run then stops at the first window boundary after
 * --seconds (or after --epochs). Everything else (read accounting, the decode-only and decode +
 * write loops, shuffle figures) runs after the timed part, from the recorded ids. */
#include <inttypes.h>
#include <json-c/json.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench_common.h"
#include "bench_decode.h"
#include "cli.h"
#include "dataset/dataset.h"
#include "util/status.h"
#include "zarr/array.h"
#include "zbatch.h"

#define MAX_TRANSFORMS 16
#define DEFAULT_OBS_COLUMN "obs/cell_line"
#define MAX_REF_BATCHES 4096
#define DECODE_BUDGET_MIN 0.5 /* seconds of decode-only loop, at least (when windows remain) */
#define DECODE_BUDGET_MAX 5.0
#define DECODE_BUDGET_SHARE 0.25 /* of the timed seconds */

static void
usage(FILE *f)
{
    fprintf(f,
            "usage: zbatch bench STORE [options]\n"
            "       zbatch bench --write --kind cells|atoms --n N [write options]\n"
            "\n"
            "Runs a loader over STORE and reports samples/s, decoded GB/s, read amplification,\n"
            "CPU, peak RSS, page faults per batch, time to first batch, batch latency p50/p99 and\n"
            "shuffle quality, next to the decode-only limit of the same chunks with the same\n"
            "codec and threads, and the decode + write limit (the same decode, then the bytes\n"
            "the loader delivers stored to memory as the reader stores a batch). Prints a\n"
            "table and writes one JSON record to the results directory\n"
            "(bench-<UTC time>-<sampler>.json).\n"
            "\n"
            "  --sampler S          sequential, random, block, weighted or size_aware (block)\n"
            "  --block-size K       block: contiguous rows per block (256); size_aware:\n"
            "                       chunk-aware blocks of K samples (off unless given)\n"
            "  --blocks-per-window K block: blocks shuffled together (16)\n"
            "  --batch B            samples per batch; size_aware: at most (4096)\n"
            "  --prefetch P         batches per window (4)\n"
            "  --depth D            windows in flight (2)\n"
            "  --threads T          decode threads (2)\n"
            "  --cache-mib M        decoded-chunk cache of M MiB (cache_bytes; 0: none)\n"
            "  --x-dtype D          anndata: dtype of the CSR values in batches: 'stored' or\n"
            "                       float32, float64, int32, int64 (default: float32 for\n"
            "                       integers of up to 16 bits, else as stored)\n"
            "  --index-dtype D      anndata: the same for the gene ids: 'stored', int32 or\n"
            "                       int64 (default: int32 for up to 16 bits, else as stored)\n"
            "  --transform X        log1p, normalize_total[:TARGET] (1e4) or densify; repeatable\n"
            "  --seconds S          timed seconds, stopping at a window boundary (10)\n"
            "  --epochs E           time E whole epochs instead (the first window is warm-up)\n"
            "  --seed S             sampler seed (0)\n"
            "  --obs-column NAME    categorical column for the shuffle entropy (obs/cell_line\n"
            "                       when present; 'none' for none)\n"
            "  --max-nnz K, --max-atoms K, --max-edges K\n"
            "                       size_aware limits (default: batch x the mean nnz or atoms)\n"
            "  --window-size K      size_aware: samples packed together (8192)\n"
            "  --num-samples K      weighted: draws per epoch (the dataset length); weights are\n"
            "                       class-balanced over --obs-column, uniform without one\n"
            "  --results DIR        where the JSON record goes (results)\n"
            "  --rounds R           R loader runs, each followed by its decode-only limits,\n"
            "                       one record each, then the medians (1); on a shared machine\n"
            "                       the neighbours then weigh on both sides alike\n"
            "  --no-decode-only     skip the decode-only and decode + write limits\n"
            "  --json               print only the JSON record (with --rounds: an array)\n"
            "  -h, --help           this text ('zbatch bench --write --help' for write mode)\n");
}

typedef struct opts {
    const char *store;
    const char *sampler;
    uint64_t block_size, blocks_per_window;
    uint64_t batch, prefetch, depth, threads;
    uint64_t cache_mib;                /* the dataset's decoded-chunk cache */
    const char *x_dtype, *index_dtype; /* zb_dataset_opts' (NULL: the defaults) */
    zb_transform transforms[MAX_TRANSFORMS];
    const char *transform_names[MAX_TRANSFORMS];
    size_t ntransforms;
    double seconds;
    uint64_t epochs; /* 0: timed by seconds */
    bool have_seconds;
    bool have_block_size; /* size_aware: chunk-aware blocks only when asked */
    uint64_t seed;
    const char *obs_column; /* NULL: the default when present */
    bool obs_explicit;
    uint64_t max_nnz, max_atoms, max_edges, window_size, num_samples;
    const char *results;
    bool decode_only, json;
    uint64_t rounds; /* loader + decode-only measurements in a row */
} opts;

/* The options that take a value. */
static const char *const VALUE_FLAGS[] = {"--sampler",
                                          "--block-size",
                                          "--blocks-per-window",
                                          "--batch",
                                          "--prefetch",
                                          "--depth",
                                          "--threads",
                                          "--transform",
                                          "--seconds",
                                          "--epochs",
                                          "--seed",
                                          "--obs-column",
                                          "--max-nnz",
                                          "--max-atoms",
                                          "--max-edges",
                                          "--window-size",
                                          "--num-samples",
                                          "--results",
                                          "--rounds",
                                          "--cache-mib",
                                          "--x-dtype",
                                          "--index-dtype",
                                          NULL};

#define MAX_ROUNDS 1000

static const char *const SAMPLERS[] = {"sequential", "random", "block", "weighted", "size_aware"};

static int
parse_transform(const char *v, opts *o)
{
    if (o->ntransforms == MAX_TRANSFORMS) {
        fprintf(stderr, "zbatch bench: at most %d --transform\n", MAX_TRANSFORMS);
        return -1;
    }
    zb_transform t;
    memset(&t, 0, sizeof t);
    if (!strcmp(v, "log1p")) {
        t.kind = ZB_TRANSFORM_LOG1P;
    } else if (!strcmp(v, "densify")) {
        t.kind = ZB_TRANSFORM_DENSIFY;
    } else if (!strncmp(v, "normalize_total", 15) && (v[15] == '\0' || v[15] == ':')) {
        t.kind = ZB_TRANSFORM_NORMALIZE_TOTAL;
        t.target_sum = 1e4;
        if (v[15] == ':' && zb__bench_parse_double("--transform normalize_total", v + 16, 1e-300,
                                                   1e300, &t.target_sum) != 0)
            return -1;
    } else {
        fprintf(stderr,
                "zbatch bench: --transform: '%s' is not log1p, normalize_total[:TARGET] "
                "or densify\n",
                v);
        return -1;
    }
    o->transform_names[o->ntransforms] = v;
    o->transforms[o->ntransforms++] = t;
    return 0;
}

/* Returns 0 to go on, else the exit code (-1 for --help). */
static int
parse_args(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    o->sampler = "block";
    o->block_size = 256;
    o->blocks_per_window = 16;
    o->batch = 4096;
    o->prefetch = 4;
    o->depth = 2;
    o->threads = 2;
    o->seconds = 10;
    o->window_size = 8192;
    o->results = "results";
    o->decode_only = true;
    o->rounds = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return -1;
        }
        if (!strcmp(a, "--json")) {
            o->json = true;
            continue;
        }
        if (!strcmp(a, "--no-decode-only")) {
            o->decode_only = false;
            continue;
        }
        if (strncmp(a, "-", 1) != 0) {
            if (o->store) {
                fprintf(stderr, "zbatch bench: one STORE only ('%s' and '%s')\n", o->store, a);
                return 2;
            }
            o->store = a;
            continue;
        }
        char flag[64];
        const char *v = NULL;
        if (zb__bench_flag_value(argc, argv, &i, VALUE_FLAGS, flag, sizeof flag, &v) != 0) return 2;
        int bad = 0;
        if (!strcmp(flag, "--sampler")) {
            o->sampler = NULL;
            for (size_t k = 0; k < sizeof SAMPLERS / sizeof *SAMPLERS; k++)
                if (!strcmp(v, SAMPLERS[k])) o->sampler = SAMPLERS[k];
            if (!strcmp(v, "size-aware")) o->sampler = "size_aware";
            if (!o->sampler) {
                fprintf(stderr,
                        "zbatch bench: --sampler: '%s' is not sequential, random, block, "
                        "weighted or size_aware\n",
                        v);
                bad = 1;
            }
        } else if (!strcmp(flag, "--block-size")) {
            bad = zb__bench_parse_u64(flag, v, 1, UINT64_MAX, &o->block_size);
            o->have_block_size = true;
        } else if (!strcmp(flag, "--blocks-per-window")) {
            bad = zb__bench_parse_u64(flag, v, 1, UINT64_MAX, &o->blocks_per_window);
        } else if (!strcmp(flag, "--batch")) {
            bad = zb__bench_parse_u64(flag, v, 1, (uint64_t)1 << 32, &o->batch);
        } else if (!strcmp(flag, "--prefetch")) {
            bad = zb__bench_parse_u64(flag, v, 1, 1 << 20, &o->prefetch);
        } else if (!strcmp(flag, "--depth")) {
            bad = zb__bench_parse_u64(flag, v, 1, 1 << 10, &o->depth);
        } else if (!strcmp(flag, "--threads")) {
            bad = zb__bench_parse_u64(flag, v, 1, 256, &o->threads);
        } else if (!strcmp(flag, "--cache-mib")) {
            bad = zb__bench_parse_u64(flag, v, 0, (uint64_t)1 << 30, &o->cache_mib);
        } else if (!strcmp(flag, "--x-dtype")) {
            o->x_dtype = v;
        } else if (!strcmp(flag, "--index-dtype")) {
            o->index_dtype = v;
        } else if (!strcmp(flag, "--transform")) {
            bad = parse_transform(v, o);
        } else if (!strcmp(flag, "--seconds")) {
            bad = zb__bench_parse_double(flag, v, 1e-3, 1e7, &o->seconds);
            o->have_seconds = true;
        } else if (!strcmp(flag, "--epochs")) {
            bad = zb__bench_parse_u64(flag, v, 1, 1 << 30, &o->epochs);
        } else if (!strcmp(flag, "--seed")) {
            bad = zb__bench_parse_u64(flag, v, 0, UINT64_MAX, &o->seed);
        } else if (!strcmp(flag, "--obs-column")) {
            o->obs_column = v;
            o->obs_explicit = true;
        } else if (!strcmp(flag, "--max-nnz")) {
            bad = zb__bench_parse_u64(flag, v, 1, UINT64_MAX, &o->max_nnz);
        } else if (!strcmp(flag, "--max-atoms")) {
            bad = zb__bench_parse_u64(flag, v, 1, UINT64_MAX, &o->max_atoms);
        } else if (!strcmp(flag, "--max-edges")) {
            bad = zb__bench_parse_u64(flag, v, 1, UINT64_MAX, &o->max_edges);
        } else if (!strcmp(flag, "--window-size")) {
            bad = zb__bench_parse_u64(flag, v, 1, UINT64_MAX, &o->window_size);
        } else if (!strcmp(flag, "--num-samples")) {
            bad = zb__bench_parse_u64(flag, v, 1, UINT64_MAX, &o->num_samples);
        } else if (!strcmp(flag, "--results")) {
            o->results = v;
        } else if (!strcmp(flag, "--rounds")) {
            bad = zb__bench_parse_u64(flag, v, 1, MAX_ROUNDS, &o->rounds);
        }
        if (bad) return 2;
    }
    if (!o->store) {
        fprintf(stderr, "zbatch bench: give a STORE (or --write); see zbatch bench --help\n");
        return 2;
    }
    if (o->epochs && o->have_seconds) {
        fprintf(stderr, "zbatch bench: --seconds and --epochs exclude each other\n");
        return 2;
    }
    if (!*o->results) {
        fprintf(stderr, "zbatch bench: --results needs a directory\n");
        return 2;
    }
    return 0;
}

/* ---- the timed run -------------------------------------------------------------------------- */

/* What the timed part records: the ids of every timed batch (off[b] .. off[b+1]), the windows
 * (batches win[w] .. win[w+1]), each batch's latency, and the summed batch statistics. */
typedef struct run {
    uint64_t *ids;
    size_t nids, cap_ids;
    size_t *off; /* [nbatches + 1] */
    size_t nbatches, cap_off;
    size_t *win; /* [nwin + 1] */
    size_t nwin, cap_win;
    double *lat; /* [nbatches] */
    zb_read_stats stats;
    double ttfb, wall;
    uint64_t epochs_started;
    uint64_t warmup_batches;
    struct rusage r0, r1;
    uint64_t peak_rss;  /* VmHWM at the end of the timed run */
    uint64_t peak_anon; /* the largest anonymous resident set seen at a window's end, less
                         * the bench's own records (records_bytes) */
} run;

/* Bytes of the per-batch records kept so far (ids, offsets, latencies, windows): the bench's,
 * not the loader's, and growing with the run's length and speed (8 bytes per sample). */
static uint64_t
records_bytes(const run *r)
{
    return (uint64_t)r->nids * sizeof *r->ids +
           (uint64_t)r->nbatches * (sizeof *r->off + sizeof *r->lat) +
           (uint64_t)r->nwin * sizeof *r->win;
}

/* Anonymous resident memory now (resident minus file-backed and shared pages, from
 * /proc/self/statm) less the bench's records: the loader's own memory, without the page-cache
 * pages of mapped store files, which VmHWM counts too. Kept as the largest value seen. */
static void
sample_anon_rss(run *r)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, res = 0, shared = 0;
    if (f && fscanf(f, "%llu %llu %llu", &size, &res, &shared) == 3 && res >= shared) {
        uint64_t b = (uint64_t)(res - shared) * (uint64_t)sysconf(_SC_PAGESIZE);
        uint64_t rec = records_bytes(r);
        b = b > rec ? b - rec : 0;
        if (b > r->peak_anon) r->peak_anon = b;
    }
    if (f) fclose(f);
}

/* This process's peak resident set: VmHWM of /proc/self/status, which counts from exec or from
 * reset_peak_rss(). (The ru_maxrss of getrusage survives exec on Linux, so a bench started by a
 * large parent would report the parent's peak.) Falls back to ru_maxrss without /proc. */
static uint64_t
peak_rss_bytes(const struct rusage *ru)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %llu kB", &kib) == 1) {
            found = true;
            break;
        }
    if (f) fclose(f);
    return found ? (uint64_t)kib * 1024u : (uint64_t)ru->ru_maxrss * 1024u;
}

/* Restarts VmHWM from the present resident set, so that a round's peak leaves out the memory
 * of the rounds before it (their decode-only buffers). Where /proc/self/clear_refs cannot be
 * written the peak keeps counting from exec. */
static void
reset_peak_rss(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return;
    fputs("5", f);
    fclose(f);
}

/* The capacity to grow `cap` to so that it holds `need` elements (doubling from 1024), or 0
 * when it already does. */
static size_t
new_cap(size_t cap, size_t need)
{
    if (need <= cap) return 0;
    size_t c = cap ? cap : 1024;
    while (c < need) c *= 2;
    return c;
}

static bool
record_batch(run *r, const zb_batch *b, double latency)
{
    size_t B = zb_batch_size(b);
    size_t c = new_cap(r->cap_ids, r->nids + B);
    if (c) {
        uint64_t *ids = realloc(r->ids, c * sizeof *ids);
        if (!ids) return false;
        r->ids = ids;
        r->cap_ids = c;
    }
    c = new_cap(r->cap_off, r->nbatches + 2);
    if (c) {
        size_t *off = realloc(r->off, c * sizeof *off);
        if (!off) return false;
        r->off = off;
        double *lat = realloc(r->lat, c * sizeof *lat);
        if (!lat) return false;
        r->lat = lat;
        r->cap_off = c;
    }
    if (B) memcpy(r->ids + r->nids, zb_batch_index(b), B * sizeof *r->ids);
    r->off[r->nbatches] = r->nids;
    r->nids += B;
    r->off[r->nbatches + 1] = r->nids;
    r->lat[r->nbatches] = latency;
    r->nbatches++;
    zb_read_stats s;
    zb_batch_stats(b, &s);
    r->stats.chunks_decoded += s.chunks_decoded;
    r->stats.chunks_cached += s.chunks_cached;
    r->stats.chunks_filled += s.chunks_filled;
    r->stats.bytes_fetched += s.bytes_fetched;
    r->stats.bytes_decoded += s.bytes_decoded;
    r->stats.bytes_delivered += s.bytes_delivered;
    r->stats.range_reads += s.range_reads;
    return true;
}

/* Closes the window that ends at the current batch count (empty windows are not kept). */
static bool
close_window(run *r)
{
    size_t c = new_cap(r->cap_win, r->nwin + 2);
    if (c) {
        size_t *win = realloc(r->win, c * sizeof *win);
        if (!win) return false;
        r->win = win;
        r->cap_win = c;
    }
    if (r->nwin == 0) r->win[0] = 0;
    if (r->win[r->nwin] == r->nbatches) return true;
    r->win[++r->nwin] = r->nbatches;
    return true;
}

static void
run_free(run *r)
{
    free(r->ids);
    free(r->off);
    free(r->win);
    free(r->lat);
}

static int
fail_status(const char *what, zb_status st)
{
    fprintf(stderr, "zbatch bench: %s: %s: %s\n", what, zb_strerror(st), zb_last_error());
    return 1;
}

/* Runs the loader; returns 0 or the exit code. */
static int
timed_run(zb_dataset *ds, zb_sampler *s, const opts *o, run *r)
{
    zb_loader_opts lo = ZB_LOADER_OPTS_DEFAULT;
    lo.prefetch_factor = (size_t)o->prefetch;
    lo.depth = (size_t)o->depth;
    lo.transforms = o->transforms;
    lo.ntransforms = o->ntransforms;
    /* one loader for the whole run: it reads on across epoch ends, as a training loop's does */
    lo.more_epochs = o->epochs ? (size_t)o->epochs - 1 : SIZE_MAX;
    zb_loader *ld = NULL;
    reset_peak_rss();
    double t_open = zb__bench_now();
    zb_status st = zb_loader_open(ds, s, &lo, &ld);
    if (st != ZB_OK) return fail_status("loader", st);
    r->epochs_started = 1;
    bool warm = true, first = true, oom = false;
    double t_start = 0, last = 0;
    uint64_t k = 0, epoch = 0; /* batches of this epoch */
    for (;;) {
        zb_batch *b = NULL;
        st = zb_loader_next(ld, &b);
        double t = zb__bench_now();
        if (st != ZB_OK) {
            zb_loader_close(ld);
            return fail_status("loader", st);
        }
        if (!b) {
            if (k == 0) {
                zb_loader_close(ld);
                fprintf(stderr, "zbatch bench: the sampler yields no batch in epoch %" PRIu64 "\n",
                        epoch);
                return 1;
            }
            if (warm) {
                /* an epoch shorter than one window: the warm-up ends with it */
                warm = false;
                t_start = last = t;
                getrusage(RUSAGE_SELF, &r->r0);
            } else if (!close_window(r)) {
                oom = true;
                break;
            }
            epoch++;
            /* on the clock of the last timed batch, which ends the timed wall: the loader
             * reads on, so this NULL may come a window's read after that batch */
            if (o->epochs ? epoch >= o->epochs : last - t_start >= o->seconds) break;
            r->epochs_started++;
            k = 0;
            continue;
        }
        if (first) {
            r->ttfb = t - t_open;
            first = false;
        }
        k++;
        if (warm) {
            zb_batch_free(b);
            r->warmup_batches++;
            if (k == o->prefetch) {
                warm = false;
                t_start = last = zb__bench_now();
                getrusage(RUSAGE_SELF, &r->r0);
            }
            continue;
        }
        bool ok = record_batch(r, b, t - last);
        zb_batch_free(b);
        last = t;
        if (!ok) {
            oom = true;
            break;
        }
        if (k % o->prefetch == 0) {
            sample_anon_rss(r);
            if (!close_window(r)) {
                oom = true;
                break;
            }
            if (!o->epochs && t - t_start >= o->seconds) break;
        }
    }
    getrusage(RUSAGE_SELF, &r->r1);
    r->peak_rss = peak_rss_bytes(&r->r1);
    r->wall = last - t_start;
    zb_loader_close(ld);
    if (oom) {
        fprintf(stderr, "zbatch bench: out of memory recording the batches\n");
        return 1;
    }
    return 0;
}

/* ---- samplers -------------------------------------------------------------------------------- */

static bool
has_segment(const zb_dataset *ds, const char *name)
{
    const zb_dataset *pr = ds->nchildren ? ds->children[0] : ds;
    for (size_t i = 0; i < pr->nsegs; i++)
        if (!strcmp(pr->segs[i].name, name)) return true;
    return false;
}

/* Per-sample sizes of `segment` and, when *limit is 0, the default limit batch x mean. */
static zb_status
segment_sizes(zb_dataset *ds, const char *segment, uint64_t n, uint64_t batch, uint64_t *limit,
              uint64_t **sizes)
{
    *sizes = malloc((size_t)n * sizeof **sizes + 1);
    if (!*sizes) return zb__err(ZB_E_NOMEM, "bench: out of memory for %s sizes", segment);
    zb_status st = zb_dataset_segment_lengths(ds, segment, *sizes);
    if (st != ZB_OK) return st;
    uint64_t total = 0, maxv = 0;
    for (uint64_t i = 0; i < n; i++) {
        total += (*sizes)[i];
        if ((*sizes)[i] > maxv) maxv = (*sizes)[i];
    }
    if (!*limit) {
        double mean = n ? (double)total / (double)n : 1.0;
        *limit = (uint64_t)ceil(mean * (double)batch);
        if (*limit < maxv) *limit = maxv; /* every sample must fit alone */
    }
    return ZB_OK;
}

/* Builds the sampler. `codes` (may be NULL) are the shuffle column's, for weighted. Returns 0,
 * or the exit code. The size_aware limits used are left in o (defaults filled in). */
static int
make_sampler(zb_dataset *ds, uint64_t n, opts *o, const zb__bench_codes *codes, zb_sampler **out)
{
    zb_sampler_opts base = ZB_SAMPLER_OPTS_DEFAULT;
    base.n = n;
    base.batch_size = o->batch;
    base.seed = o->seed;
    zb_status st = ZB_OK;
    const char *name = o->sampler;
    if (!strcmp(name, "sequential")) {
        st = zb_sampler_new_sequential(&base, out);
    } else if (!strcmp(name, "random")) {
        st = zb_sampler_new_random(&base, out);
    } else if (!strcmp(name, "block")) {
        zb_block_sampler_opts bo = ZB_BLOCK_SAMPLER_OPTS_DEFAULT;
        bo.base = base;
        bo.block_size = o->block_size;
        bo.blocks_per_window = o->blocks_per_window;
        st = zb_sampler_new_block(&bo, out);
    } else if (!strcmp(name, "weighted")) {
        zb_weighted_sampler_opts wo = ZB_WEIGHTED_SAMPLER_OPTS_DEFAULT;
        wo.base = base;
        wo.num_samples = o->num_samples;
        int64_t *cls = NULL;
        double *w = NULL;
        if (codes) {
            cls = malloc((size_t)n * sizeof *cls + 1);
            for (uint64_t i = 0; cls && i < n; i++) cls[i] = codes->code[i];
            wo.class_codes = cls;
        } else {
            w = malloc((size_t)n * sizeof *w + 1);
            for (uint64_t i = 0; w && i < n; i++) w[i] = 1.0;
            wo.weights = w;
        }
        st = (cls || w) ? zb_sampler_new_weighted(&wo, out)
                        : zb__err(ZB_E_NOMEM, "bench: out of memory for the weights");
        free(cls);
        free(w);
    } else {
        zb_size_sampler_opts so = ZB_SIZE_SAMPLER_OPTS_DEFAULT;
        so.base = base;
        so.window_size = o->window_size;
        so.block_size = o->have_block_size ? o->block_size : 0;
        uint64_t *nnz = NULL, *atoms = NULL, *edges = NULL;
        bool any = o->max_nnz || o->max_atoms || o->max_edges;
        if (!any) {
            if (has_segment(ds, "X"))
                st = segment_sizes(ds, "X", n, o->batch, &o->max_nnz, &nnz);
            else if (has_segment(ds, "atoms"))
                st = segment_sizes(ds, "atoms", n, o->batch, &o->max_atoms, &atoms);
            else {
                fprintf(stderr, "zbatch bench: size_aware needs --max-nnz, --max-atoms or "
                                "--max-edges for this store\n");
                return 2;
            }
        } else {
            if (o->max_nnz) st = segment_sizes(ds, "X", n, o->batch, &o->max_nnz, &nnz);
            if (st == ZB_OK && o->max_atoms)
                st = segment_sizes(ds, "atoms", n, o->batch, &o->max_atoms, &atoms);
            if (st == ZB_OK && o->max_edges)
                st = segment_sizes(ds, "edges", n, o->batch, &o->max_edges, &edges);
        }
        so.nnz = nnz;
        so.max_nnz = o->max_nnz;
        so.num_atoms = atoms;
        so.max_atoms = o->max_atoms;
        so.num_edges = edges;
        so.max_edges = o->max_edges;
        if (st == ZB_OK) st = zb_sampler_new_size_aware(&so, out);
        free(nnz);
        free(atoms);
        free(edges);
    }
    if (st != ZB_OK) {
        fprintf(stderr, "zbatch bench: --sampler %s: %s: %s\n", name, zb_strerror(st),
                zb_last_error());
        return st == ZB_E_INVALID ? 2 : 1;
    }
    return 0;
}

/* ---- figures after the run ------------------------------------------------------------------ */

typedef struct figures {
    uint64_t samples, decoded, delivered;
    const char *bytes_source;
    /* decode-only */
    bool dec_done;
    uint64_t dec_windows, dec_units, dec_bytes, dec_encoded, dec_samples, dec_skipped;
    double dec_seconds;
    /* decode + write: the same windows, the delivered bytes then written once */
    uint64_t dw_bytes, dw_written;
    double dw_seconds;
    bool dw_streamed; /* some window was written with streamed stores */
    /* latency */
    double p50, p99, lat_mean;
    zb__bench_shuffle shuffle;
    const char *shuffle_column;
    uint32_t shuffle_codes;
} figures;

static int
cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* Nearest-rank percentile of sorted values. */
static double
percentile(const double *v, size_t n, double p)
{
    if (!n) return NAN;
    size_t k = (size_t)ceil(p * (double)n);
    if (k < 1) k = 1;
    return v[k - 1];
}

/* Read accounting of every timed window and the decode-only loop over them (in order, until
 * its budget is spent). */
static zb_status
measure_reads(zb_dataset *ds, const opts *o, const run *r, figures *fg)
{
    zb_ctx *ctx = NULL;
    zb__bench_decoder *dec = NULL;
    zb__bench_units u = {0};
    ZB_TRY(zb_ctx_new(&ctx));
    zb_status st = ZB_OK;
    if (o->decode_only) st = zb__bench_decoder_new(ds, (int)o->threads, &dec);
    double budget = DECODE_BUDGET_SHARE * r->wall;
    if (budget < DECODE_BUDGET_MIN) budget = DECODE_BUDGET_MIN;
    if (budget > DECODE_BUDGET_MAX) budget = DECODE_BUDGET_MAX;
    uint64_t plan_decoded = 0, plan_delivered = 0;
    for (size_t w = 0; w < r->nwin && st == ZB_OK; w++) {
        size_t i0 = r->off[r->win[w]], i1 = r->off[r->win[w + 1]];
        zb__bench_units_clear(&u);
        st = zb__bench_units_add(ds, r->ids + i0, i1 - i0, ctx, &u);
        bool decode = dec && (fg->dec_seconds < budget || fg->dec_windows == 0);
        if (st == ZB_OK) st = zb__bench_units_resolve(&u, ctx);
        if (st != ZB_OK) break;
        plan_decoded += u.bytes_decoded;
        plan_delivered += u.bytes_delivered;
        if (!decode) continue;
        st = zb__bench_units_fetch(&u);
        zb__bench_decode_result dr, wr;
        /* the first window once untimed each way: codec contexts and scratch warm up */
        if (st == ZB_OK && w == 0) st = zb__bench_decoder_run(dec, &u, false, &dr);
        if (st == ZB_OK && w == 0) st = zb__bench_decoder_run(dec, &u, true, &wr);
        if (st == ZB_OK) st = zb__bench_decoder_run(dec, &u, false, &dr);
        if (st == ZB_OK) st = zb__bench_decoder_run(dec, &u, true, &wr);
        if (st != ZB_OK) break;
        fg->dw_seconds += wr.seconds;
        fg->dw_bytes += wr.bytes_decoded;
        fg->dw_written += wr.bytes_written;
        fg->dw_streamed |= wr.streamed;
        fg->dec_done = true;
        fg->dec_windows++;
        fg->dec_seconds += dr.seconds;
        fg->dec_bytes += dr.bytes_decoded;
        fg->dec_encoded += u.bytes_encoded;
        fg->dec_units += u.ndecoded;
        fg->dec_skipped += u.skipped;
        fg->dec_samples += i1 - i0;
    }
    if (r->stats.bytes_decoded > 0) {
        fg->decoded = r->stats.bytes_decoded;
        fg->delivered = r->stats.bytes_delivered;
        fg->bytes_source = "batch_stats";
    } else {
        /* batch views that carry no read statistics: the same units, counted from the plan */
        fg->decoded = plan_decoded;
        fg->delivered = plan_delivered;
        fg->bytes_source = "plan";
    }
    zb__bench_units_free(&u);
    zb__bench_decoder_free(dec);
    zb_ctx_free(ctx);
#if defined(__GLIBC__)
    malloc_trim(0); /* the fetched units and decode buffers: back to the system before the
                       next round's peak is measured */
#endif
    return st;
}

/* ---- output -------------------------------------------------------------------------------------
 */

static double
tv_seconds(const struct timeval *t)
{
    return (double)t->tv_sec + (double)t->tv_usec * 1e-6;
}

static double
ratio(double a, double b)
{
    return b > 0 ? a / b : NAN;
}

static json_object *
store_json(zb_dataset *ds, const char *path, uint64_t n)
{
    json_object *s = json_object_new_object();
    zb__bench_put_str(s, "path", path);
    zb__bench_put_str(s, "layout", zb_dataset_layout(ds));
    zb__bench_put_u64(s, "n_samples", n);
    zb__bench_put_u64(s, "n_vars", zb_dataset_n_vars(ds));
    zb__bench_put_u64(s, "children", zb_dataset_nchildren(ds));
    json_object *fields = json_object_new_array();
    const zb_dataset *pr = ds->nchildren ? ds->children[0] : ds;
    static const char *const kinds[] = {"per_sample", "ragged", "index"};
    for (size_t i = 0; i < pr->nfields; i++) {
        const zb__field *fd = &pr->fields[i];
        zb_array_info ai;
        json_object *f = json_object_new_object();
        zb__bench_put_str(f, "name", fd->name);
        zb__bench_put_str(f, "kind", kinds[fd->kind]);
        zb__bench_put_str(f, "dtype", zb_dtype_name(fd->dtype));
        zb__bench_put_str(f, "delivered_dtype", zb_dtype_name(fd->out_dtype));
        zb__bench_put_str(f, "array", fd->arr->path);
        if (zb_array_get_info(fd->arr, &ai) == ZB_OK) {
            zb__bench_put_str(f, "codecs", ai.codecs);
            json_object *ch = json_object_new_array();
            for (int d = 0; d < ai.ndim; d++)
                json_object_array_add(ch, json_object_new_uint64(ai.chunk_shape[d]));
            zb__bench_put(f, "chunks", ch);
            if (ai.shard_shape) {
                json_object *sh = json_object_new_array();
                for (int d = 0; d < ai.ndim; d++)
                    json_object_array_add(sh, json_object_new_uint64(ai.shard_shape[d]));
                zb__bench_put(f, "shards", sh);
            } else {
                zb__bench_put(f, "shards", NULL);
            }
        }
        json_object_array_add(fields, f);
    }
    zb__bench_put(s, "fields", fields);
    return s;
}

static json_object *
params_json(const opts *o)
{
    json_object *p = json_object_new_object();
    bool block = !strcmp(o->sampler, "block"), size = !strcmp(o->sampler, "size_aware");
    zb__bench_put_str(p, "store", o->store);
    zb__bench_put_str(p, "sampler", o->sampler);
    zb__bench_put_u64(p, "batch_size", o->batch);
    zb__bench_put_u64(p, "prefetch_factor", o->prefetch);
    zb__bench_put_u64(p, "depth", o->depth);
    zb__bench_put_u64(p, "threads", o->threads);
    zb__bench_put_u64(p, "cache_mib", o->cache_mib);
    zb__bench_put(p, "x_dtype", o->x_dtype ? json_object_new_string(o->x_dtype) : NULL);
    zb__bench_put(p, "index_dtype", o->index_dtype ? json_object_new_string(o->index_dtype) : NULL);
    json_object *t = json_object_new_array();
    for (size_t i = 0; i < o->ntransforms; i++)
        json_object_array_add(t, json_object_new_string(o->transform_names[i]));
    zb__bench_put(p, "transforms", t);
    if (o->epochs) {
        zb__bench_put(p, "seconds", NULL);
        zb__bench_put_u64(p, "epochs", o->epochs);
    } else {
        zb__bench_put_double(p, "seconds", o->seconds);
        zb__bench_put(p, "epochs", NULL);
    }
    zb__bench_put_u64(p, "seed", o->seed);
    zb__bench_put_u64(p, "rounds", o->rounds);
    zb__bench_put_str(p, "obs_column", o->obs_column);
    bool blocks = block || (size && o->have_block_size);
    zb__bench_put(p, "block_size", blocks ? json_object_new_uint64(o->block_size) : NULL);
    zb__bench_put(p, "blocks_per_window",
                  block ? json_object_new_uint64(o->blocks_per_window) : NULL);
    zb__bench_put(p, "max_nnz", size && o->max_nnz ? json_object_new_uint64(o->max_nnz) : NULL);
    zb__bench_put(p, "max_atoms",
                  size && o->max_atoms ? json_object_new_uint64(o->max_atoms) : NULL);
    zb__bench_put(p, "max_edges",
                  size && o->max_edges ? json_object_new_uint64(o->max_edges) : NULL);
    zb__bench_put(p, "window_size", size ? json_object_new_uint64(o->window_size) : NULL);
    zb__bench_put(p, "num_samples",
                  !strcmp(o->sampler, "weighted") && o->num_samples
                      ? json_object_new_uint64(o->num_samples)
                      : NULL);
    zb__bench_put(p, "decode_only", json_object_new_boolean(o->decode_only));
    zb__bench_put_str(p, "results", o->results);
    return p;
}

/* Every figure, in the JSON record's units (seconds, bytes, GB = 1e9 bytes). */
typedef struct derived {
    double samples_per_s, decoded_gb_s, delivered_gb_s, amplification;
    double cpu_s, cpu_util, cpu_core_pct;
    uint64_t peak_rss, peak_anon, records, minflt, majflt;
    double faults_per_batch, major_per_batch;
    double dec_gb_s, dec_samples_per_s, dec_ratio;
    double dw_gb_s, dw_samples_per_s, dw_ratio;
} derived;

static void
derive(const opts *o, const run *r, const figures *fg, derived *d)
{
    d->samples_per_s = ratio((double)fg->samples, r->wall);
    d->decoded_gb_s = ratio((double)fg->decoded, r->wall) / 1e9;
    d->delivered_gb_s = ratio((double)fg->delivered, r->wall) / 1e9;
    d->amplification = ratio((double)fg->decoded, (double)fg->delivered);
    d->cpu_s = tv_seconds(&r->r1.ru_utime) - tv_seconds(&r->r0.ru_utime) +
               tv_seconds(&r->r1.ru_stime) - tv_seconds(&r->r0.ru_stime);
    d->cpu_util = ratio(d->cpu_s, r->wall * (double)o->threads);
    d->cpu_core_pct = 100.0 * ratio(d->cpu_s, r->wall);
    d->peak_rss = r->peak_rss;
    d->peak_anon = r->peak_anon;
    d->records = records_bytes(r);
    d->minflt = (uint64_t)(r->r1.ru_minflt - r->r0.ru_minflt);
    d->majflt = (uint64_t)(r->r1.ru_majflt - r->r0.ru_majflt);
    d->faults_per_batch = ratio((double)d->minflt, (double)r->nbatches);
    d->major_per_batch = ratio((double)d->majflt, (double)r->nbatches);
    d->dec_gb_s = fg->dec_done ? ratio((double)fg->dec_bytes, fg->dec_seconds) / 1e9 : NAN;
    d->dec_samples_per_s = fg->dec_done ? ratio((double)fg->dec_samples, fg->dec_seconds) : NAN;
    /* samples, not bytes: the loader reads only the rows it needs of raw (uncompressed) units,
     * where the decode-only run copies whole units */
    d->dec_ratio = ratio(d->samples_per_s, d->dec_samples_per_s);
    d->dw_gb_s = fg->dec_done ? ratio((double)fg->dw_bytes, fg->dw_seconds) / 1e9 : NAN;
    d->dw_samples_per_s = fg->dec_done ? ratio((double)fg->dec_samples, fg->dw_seconds) : NAN;
    d->dw_ratio = ratio(d->samples_per_s, d->dw_samples_per_s);
}

static json_object *
figures_json(const run *r, const figures *fg, const derived *d)
{
    json_object *f = json_object_new_object();
    zb__bench_put_u64(f, "timed_batches", r->nbatches);
    zb__bench_put_u64(f, "timed_samples", fg->samples);
    zb__bench_put_u64(f, "timed_windows", r->nwin);
    zb__bench_put_double(f, "timed_seconds", r->wall);
    zb__bench_put_u64(f, "warmup_batches", r->warmup_batches);
    zb__bench_put_u64(f, "epochs_started", r->epochs_started);
    zb__bench_put_double(f, "samples_per_s", d->samples_per_s);
    zb__bench_put_u64(f, "bytes_decoded", fg->decoded);
    zb__bench_put_u64(f, "bytes_delivered", fg->delivered);
    zb__bench_put_str(f, "bytes_source", fg->bytes_source);
    zb__bench_put_double(f, "decoded_gb_s", d->decoded_gb_s);
    zb__bench_put_double(f, "delivered_gb_s", d->delivered_gb_s);
    zb__bench_put_double(f, "amplification", d->amplification);
    zb__bench_put_double(f, "cpu_seconds", d->cpu_s);
    zb__bench_put_double(f, "cpu_utilisation", d->cpu_util);
    zb__bench_put_double(f, "cpu_percent_of_one_core", d->cpu_core_pct);
    zb__bench_put_u64(f, "peak_rss_bytes", d->peak_rss);
    zb__bench_put_u64(f, "peak_anon_rss_bytes", d->peak_anon);
    zb__bench_put_u64(f, "bench_records_bytes", d->records);
    zb__bench_put_double(f, "page_faults_per_batch", d->faults_per_batch);
    zb__bench_put_double(f, "major_faults_per_batch", d->major_per_batch);
    zb__bench_put_double(f, "time_to_first_batch_s", r->ttfb);
    zb__bench_put_double(f, "batch_latency_p50_s", fg->p50);
    zb__bench_put_double(f, "batch_latency_p99_s", fg->p99);
    zb__bench_put_double(f, "batch_latency_mean_s", fg->lat_mean);

    json_object *sh = json_object_new_object();
    zb__bench_put_str(sh, "column", fg->shuffle_column);
    zb__bench_put(sh, "codes",
                  fg->shuffle_column ? json_object_new_uint64(fg->shuffle_codes) : NULL);
    zb__bench_put_double(sh, "entropy_bits", fg->shuffle.entropy);
    zb__bench_put_double(sh, "random_entropy_bits", fg->shuffle.random_entropy);
    zb__bench_put_double(sh, "entropy_ratio",
                         ratio(fg->shuffle.entropy, fg->shuffle.random_entropy));
    zb__bench_put_double(sh, "index_gap_score", fg->shuffle.gap_score);
    zb__bench_put_double(sh, "random_index_gap_score", fg->shuffle.random_gap_score);
    zb__bench_put_u64(sh, "random_batches", fg->shuffle.random_batches);
    zb__bench_put(f, "shuffle", sh);

    if (fg->dec_done) {
        json_object *dj = json_object_new_object();
        zb__bench_put_u64(dj, "windows", fg->dec_windows);
        zb__bench_put_u64(dj, "samples", fg->dec_samples);
        zb__bench_put_u64(dj, "units", fg->dec_units);
        zb__bench_put_u64(dj, "units_skipped", fg->dec_skipped);
        zb__bench_put_u64(dj, "bytes_decoded", fg->dec_bytes);
        zb__bench_put_u64(dj, "bytes_encoded", fg->dec_encoded);
        zb__bench_put_double(dj, "seconds", fg->dec_seconds);
        zb__bench_put_double(dj, "gb_s", d->dec_gb_s);
        zb__bench_put_double(dj, "samples_per_s", d->dec_samples_per_s);
        zb__bench_put_double(dj, "ratio", d->dec_ratio);
        zb__bench_put(f, "decode_only", dj);
        json_object *wj = json_object_new_object();
        zb__bench_put_u64(wj, "bytes_decoded", fg->dw_bytes);
        zb__bench_put_u64(wj, "bytes_written", fg->dw_written);
        zb__bench_put_double(wj, "seconds", fg->dw_seconds);
        zb__bench_put_double(wj, "gb_s", d->dw_gb_s);
        zb__bench_put_double(wj, "samples_per_s", d->dw_samples_per_s);
        zb__bench_put_double(wj, "ratio", d->dw_ratio);
        zb__bench_put(wj, "streamed", json_object_new_boolean(fg->dw_streamed));
        zb__bench_put(f, "decode_write", wj);
    } else {
        zb__bench_put(f, "decode_only", NULL);
        zb__bench_put(f, "decode_write", NULL);
    }
    return f;
}

static void
print_table(const opts *o, zb_dataset *ds, uint64_t n, const run *r, const figures *fg,
            const derived *d, const char *file)
{
    char b1[32];
    printf("zbatch bench %s (%s, %" PRIu64 " samples)\n", o->store, zb_dataset_layout(ds), n);
    printf("  sampler %s", o->sampler);
    if (!strcmp(o->sampler, "block"))
        printf(" (block %" PRIu64 ", %" PRIu64 " blocks/window)", o->block_size,
               o->blocks_per_window);
    printf(", batch %" PRIu64 ", prefetch %" PRIu64 ", depth %" PRIu64 ", threads %" PRIu64,
           o->batch, o->prefetch, o->depth, o->threads);
    for (size_t i = 0; i < o->ntransforms; i++)
        printf("%s%s", i ? ", " : ", transforms ", o->transform_names[i]);
    printf("\n  timed %.2f s: %zu batches, %" PRIu64 " samples, %" PRIu64 " epoch(s) started\n\n",
           r->wall, r->nbatches, fg->samples, r->epochs_started);
    printf("  %-24s %12.0f\n", "samples/s", d->samples_per_s);
    printf("  %-24s %12.3f GB/s  (delivered %.3f GB/s)\n", "decoded", d->decoded_gb_s,
           d->delivered_gb_s);
    if (fg->dec_done)
        printf("  %-24s %12.3f GB/s  (%.0f samples/s, %" PRIu64 " windows) -> ratio %.2f\n",
               "decode-only limit", d->dec_gb_s, d->dec_samples_per_s, fg->dec_windows,
               d->dec_ratio);
    if (fg->dec_done)
        printf("  %-24s %12.3f GB/s  (%.0f samples/s, output %s to memory) -> ratio %.2f\n",
               "decode + write limit", d->dw_gb_s, d->dw_samples_per_s,
               fg->dw_streamed ? "streamed" : "copied", d->dw_ratio);
    printf("  %-24s %12.3f  (%s)\n", "read amplification", d->amplification, fg->bytes_source);
    printf("  %-24s %12.2f  (%.0f%% of one core, %.2f s CPU)\n", "CPU utilisation / thread",
           d->cpu_util, d->cpu_core_pct, d->cpu_s);
    zb__bench_human_bytes((double)d->peak_rss, b1, sizeof b1);
    char b2[32];
    zb__bench_human_bytes((double)d->peak_anon, b2, sizeof b2);
    char b3[32];
    zb__bench_human_bytes((double)d->records, b3, sizeof b3);
    printf("  %-24s %12s  (anonymous %s, not counting the bench's %s of batch records; the "
           "rest is mapped store files)\n",
           "peak RSS", b1, b2, b3);
    printf("  %-24s %12.1f  (major %.2f)\n", "page faults / batch", d->faults_per_batch,
           d->major_per_batch);
    printf("  %-24s %12.2f ms\n", "time to first batch", r->ttfb * 1e3);
    printf("  %-24s %12.3f ms  (p99 %.3f ms, mean %.3f ms)\n", "batch latency p50", fg->p50 * 1e3,
           fg->p99 * 1e3, fg->lat_mean * 1e3);
    if (fg->shuffle_column)
        printf("  %-24s %12.3f bits (random %.3f, %.1f%%; %s, %u codes)\n", "shuffle entropy",
               fg->shuffle.entropy, fg->shuffle.random_entropy,
               100.0 * ratio(fg->shuffle.entropy, fg->shuffle.random_entropy), fg->shuffle_column,
               fg->shuffle_codes);
    printf("  %-24s %12.4f  (random %.4f)\n", "index-gap score", fg->shuffle.gap_score,
           fg->shuffle.random_gap_score);
    printf("\n  record: %s\n", file);
}

/* ---- the command ---------------------------------------------------------------------------- */

/* A column the shuffle entropy can use: per-sample integer scalars (categorical codes). */
static bool
codes_field(const zb_dataset *ds, const char *name)
{
    size_t idx;
    zb_field_info fi;
    if (zb_dataset_find_field(ds, name, &idx) != ZB_OK || zb_dataset_field(ds, idx, &fi) != ZB_OK) {
        zb_clear_error();
        return false;
    }
    switch (fi.dtype) {
    case ZB_DT_BOOL:
    case ZB_DT_INT8:
    case ZB_DT_INT16:
    case ZB_DT_INT32:
    case ZB_DT_INT64:
    case ZB_DT_UINT8:
    case ZB_DT_UINT16:
    case ZB_DT_UINT32:
    case ZB_DT_UINT64:
        return fi.kind == ZB_FIELD_PER_SAMPLE && fi.ndim == 0;
    default:
        return false;
    }
}

/* The shuffle column: --obs-column NAME (or obs/NAME), else the default when present. Returns
 * 0 (with field "" when there is none), or 2 when an explicit column does not exist or holds
 * no codes. */
static int
shuffle_field(const zb_dataset *ds, const opts *o, char *field, size_t cap)
{
    size_t idx;
    field[0] = '\0';
    if (!o->obs_explicit) {
        if (codes_field(ds, DEFAULT_OBS_COLUMN)) snprintf(field, cap, "%s", DEFAULT_OBS_COLUMN);
        return 0;
    }
    if (!*o->obs_column || !strcmp(o->obs_column, "none")) return 0;
    char alt[512];
    snprintf(alt, sizeof alt, "obs/%s", o->obs_column);
    const char *name = NULL;
    if (zb_dataset_find_field(ds, o->obs_column, &idx) == ZB_OK)
        name = o->obs_column;
    else if (zb_dataset_find_field(ds, alt, &idx) == ZB_OK)
        name = alt;
    zb_clear_error();
    if (!name) {
        fprintf(stderr, "zbatch bench: --obs-column: the store has no field '%s'\n", o->obs_column);
        return 2;
    }
    if (!codes_field(ds, name)) {
        fprintf(stderr,
                "zbatch bench: --obs-column: %s is not a per-sample integer column "
                "(categorical codes)\n",
                name);
        return 2;
    }
    snprintf(field, cap, "%s", name);
    return 0;
}

/* Reads the shuffle column's codes; 0, or the exit code (2 for a column of the wrong kind). */
static int
read_codes(zb_dataset *ds, const char *field, zb__bench_codes *codes)
{
    zb_status st = zb__bench_codes_read(ds, field, codes);
    if (st == ZB_OK) return 0;
    int rc = fail_status(field, st);
    return st == ZB_E_TYPE ? 2 : rc;
}

static void
print_json(json_object *obj)
{
    printf("%s\n", json_object_to_json_string_ext(obj, JSON_C_TO_STRING_PRETTY |
                                                           JSON_C_TO_STRING_NOSLASHESCAPE));
}

/* Median of n values (sorted in place); NAN when there are none. */
static double
median(double *v, size_t n)
{
    if (n == 0) return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Per round: samples/s, the decode-only limit's samples/s and the ratio, the decode + write
 * limit's samples/s and the ratio. */
enum { FIG_RATE, FIG_DEC, FIG_DEC_RATIO, FIG_DW, FIG_DW_RATIO, NFIG };

/* The medians over --rounds, after every round's table. */
static void
print_rounds(double (*fig)[NFIG], size_t rounds)
{
    double col[NFIG][MAX_ROUNDS];
    size_t m[NFIG] = {0};
    for (size_t k = 0; k < rounds; k++)
        for (int j = 0; j < NFIG; j++)
            if (!isnan(fig[k][j])) col[j][m[j]++] = fig[k][j];
    if (m[FIG_DEC_RATIO] == 0) { /* --no-decode-only */
        printf("\n  %zu rounds: median %.0f samples/s\n", rounds,
               median(col[FIG_RATE], m[FIG_RATE]));
        return;
    }
    printf("\n  %zu rounds, ratio to decode-only per round:", rounds);
    for (size_t k = 0; k < rounds; k++) printf(" %.2f", fig[k][FIG_DEC_RATIO]);
    printf("\n  %zu rounds, ratio to decode + write per round:", rounds);
    for (size_t k = 0; k < rounds; k++) printf(" %.2f", fig[k][FIG_DW_RATIO]);
    printf("\n  median                    %.0f samples/s, decode-only %.0f samples/s, "
           "ratio %.2f; decode + write %.0f samples/s, ratio %.2f\n",
           median(col[FIG_RATE], m[FIG_RATE]), median(col[FIG_DEC], m[FIG_DEC]),
           median(col[FIG_DEC_RATIO], m[FIG_DEC_RATIO]), median(col[FIG_DW], m[FIG_DW]),
           median(col[FIG_DW_RATIO], m[FIG_DW_RATIO]));
}

/* One round: the timed loader run, its decode-only limit, the figures, the record (written,
 * and printed as a table or kept in `all` for --json with rounds). fig: samples/s, the limit's
 * samples/s and their ratio. Returns 0 or the exit code. */
static int
bench_round(zb_dataset *ds, uint64_t n, zb_sampler *sampler, const opts *o, const char *field,
            bool weighted, zb__bench_codes *codes, uint64_t k, json_object *all, double fig[NFIG])
{
    run r;
    memset(&r, 0, sizeof r);
    figures fg;
    memset(&fg, 0, sizeof fg);
    char stamp[32], file[4200];
    json_object *rec = NULL;
    zb_status st;
    int rc;
    rc = timed_run(ds, sampler, o, &r);
    if (rc) goto done;
    /* the codes: read once, after the first timed run (out of its peak RSS) */
    if (o->obs_column && !weighted && !codes->code && (rc = read_codes(ds, field, codes)) != 0)
        goto done;
    fg.samples = r.nids;
    if (r.nbatches == 0) {
        fprintf(stderr, "zbatch bench: no batch was timed (the run ended within its warm-up "
                        "window); use more --epochs or a smaller --prefetch\n");
        rc = 1;
        goto done;
    }

    st = measure_reads(ds, o, &r, &fg);
    if (st != ZB_OK) {
        rc = fail_status("decode-only", st);
        goto done;
    }
    double sum = 0;
    for (size_t i = 0; i < r.nbatches; i++) sum += r.lat[i];
    fg.lat_mean = sum / (double)r.nbatches;
    qsort(r.lat, r.nbatches, sizeof *r.lat, cmp_double);
    fg.p50 = percentile(r.lat, r.nbatches, 0.50);
    fg.p99 = percentile(r.lat, r.nbatches, 0.99);
    fg.shuffle_column = o->obs_column;
    fg.shuffle_codes = codes->ncodes;
    st = zb__bench_shuffle_measure(r.ids, r.off, r.nbatches, n, codes->code ? codes : NULL, o->seed,
                                   MAX_REF_BATCHES, &fg.shuffle);
    if (st != ZB_OK) {
        rc = fail_status("shuffle", st);
        goto done;
    }

    derived d;
    derive(o, &r, &fg, &d);
    rec = zb__bench_record_new("read", stamp, sizeof stamp);
    zb__bench_put(rec, "parameters", params_json(o));
    if (o->rounds > 1) zb__bench_put_u64(rec, "round", k + 1);
    zb__bench_put(rec, "store", store_json(ds, o->store, n));
    zb__bench_put(rec, "figures", figures_json(&r, &fg, &d));
    if (zb__bench_record_write(rec, o->results, stamp, o->sampler, file, sizeof file) != 0) {
        rc = 1;
        goto done;
    }
    fig[FIG_RATE] = d.samples_per_s;
    fig[FIG_DEC] = d.dec_samples_per_s;
    fig[FIG_DEC_RATIO] = fg.dec_done ? d.dec_ratio : NAN;
    fig[FIG_DW] = d.dw_samples_per_s;
    fig[FIG_DW_RATIO] = fg.dec_done ? d.dw_ratio : NAN;
    if (all) {
        json_object_array_add(all, rec);
        rec = NULL;
    } else if (o->json) {
        print_json(rec);
    } else {
        if (o->rounds > 1) printf("\n  round %" PRIu64 " of %" PRIu64 "\n", k + 1, o->rounds);
        print_table(o, ds, n, &r, &fg, &d, file);
    }
    rc = 0;
done:
    json_object_put(rec);
    run_free(&r);
    return rc;
}

int
zb__cli_bench(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--write")) return zb__bench_write_main(argc, argv);
    opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;

    zb_store *store = NULL;
    zb_dataset *ds = NULL;
    zb_sampler *sampler = NULL;
    zb__bench_codes codes = {0};
    json_object *all = NULL; /* --json with --rounds: the records */
    char field[512];
    uint64_t n = 0;

    zb_dataset_opts dopts = ZB_DATASET_OPTS_DEFAULT;
    dopts.num_threads = (int)o.threads;
    dopts.cache_bytes = (size_t)(o.cache_mib << 20);
    dopts.x_dtype = o.x_dtype;
    dopts.index_dtype = o.index_dtype;
    zb_status st = zb__cli_store_open(o.store, &store);
    if (st == ZB_OK) st = zb_dataset_open(store, "", &dopts, &ds);
    if (st == ZB_OK) st = zb_dataset_len(ds, &n);
    if (st != ZB_OK) {
        rc = fail_status(o.store, st);
        goto done;
    }
    if (n == 0) {
        fprintf(stderr, "zbatch bench: %s has no samples\n", o.store);
        rc = 1;
        goto done;
    }
    rc = shuffle_field(ds, &o, field, sizeof field);
    if (rc) goto done;
    o.obs_column = field[0] ? field : NULL;
    /* the codes (4 bytes per sample) are read after the timed run, out of its peak RSS, unless
     * the weighted sampler needs them first */
    bool weighted = !strcmp(o.sampler, "weighted");
    if (o.obs_column && weighted && (rc = read_codes(ds, field, &codes)) != 0) goto done;
    rc = make_sampler(ds, n, &o, codes.code ? &codes : NULL, &sampler);
    if (rc) goto done;

    double(*fig)[NFIG] = calloc(o.rounds, sizeof *fig);
    bool want_all = o.json && o.rounds > 1; /* --json with rounds prints one array */
    all = want_all ? json_object_new_array() : NULL;
    if (!fig || (want_all && !all)) {
        free(fig);
        fprintf(stderr, "zbatch bench: out of memory\n");
        rc = 1;
        goto done;
    }
    for (uint64_t k = 0; k < o.rounds && rc == 0; k++) {
        /* every round reads the same windows: the sampler starts over */
        if (k > 0 && (st = zb_sampler_set_epoch(sampler, 0)) != ZB_OK) {
            rc = fail_status("sampler", st);
            break;
        }
        rc = bench_round(ds, n, sampler, &o, field, weighted, &codes, k, all, fig[k]);
    }
    if (rc == 0 && all)
        print_json(all);
    else if (rc == 0 && o.rounds > 1)
        print_rounds(fig, (size_t)o.rounds);
    free(fig);
done:
    json_object_put(all);
    zb__bench_codes_free(&codes);
    zb_sampler_free(sampler);
    zb_dataset_close(ds);
    zb_store_close(store);
    return rc;
}
