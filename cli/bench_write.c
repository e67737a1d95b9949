/* zbatch bench --write: writes synthetic stores with the synth generators (zb__cli_synth_cells,
 * zb__cli_synth_atoms, called with a constructed argv) for every codec x chunk x shard setting
 * and reports write throughput, bytes on disk, compression ratio and file count.
 *
 * The time is the whole synth run, generation included (the generators are the synth command's
 * own and are not callable apart from it); the uncompressed bytes are the logical bytes of
 * every fixed-size array of the written store (zb_info_json), string arrays left out. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_common.h"
#include "bench_decode.h"
#include "cli.h"
#include "util/json.h"
#include "zbatch.h"

#define MAX_SETTINGS 32

static void
usage(FILE *f)
{
    fprintf(f,
            "usage: zbatch bench --write --kind cells|atoms --n N [options]\n"
            "\n"
            "Writes one synthetic store (zbatch synth) per codec x chunk x shard setting and\n"
            "reports write throughput (MB/s of uncompressed array data, samples/s; generation\n"
            "included), bytes on disk, compression ratio and file count. Prints a table and\n"
            "writes one JSON record to the results directory\n"
            "(bench-<UTC time>-write-<kind>.json).\n"
            "\n"
            "  --kind cells|atoms   the synth generator\n"
            "  --n N                cells or structures per store\n"
            "  --codec C            e.g. zstd:3, blosc:lz4:5:shuffle, none; repeatable (default:\n"
            "                       the library's)\n"
            "  --chunk-nnz K        cells: elements per chunk of X/data, X/indices; repeatable\n"
            "  --shard-nnz K        cells: elements per shard (0 = none); repeatable\n"
            "  --genes G            cells: columns of X (synth's default)\n"
            "  --format v2|v3       cells: Zarr format (v3)\n"
            "  --seed S             generator seed (0)\n"
            "  --threads T          generation and compression threads (1)\n"
            "  -o, --out DIR        keep the stores in DIR (default: a temporary directory,\n"
            "                       removed afterwards)\n"
            "  --results DIR        where the JSON record goes (results)\n"
            "  --json               print only the JSON record\n"
            "  -h, --help           this text\n");
}

typedef struct wopts {
    const char *kind;
    uint64_t n, genes, seed, threads;
    bool have_n, have_genes;
    const char *format;
    const char *codecs[MAX_SETTINGS];
    size_t ncodecs;
    uint64_t chunks[MAX_SETTINGS], shards[MAX_SETTINGS];
    size_t nchunks, nshards;
    const char *out, *results;
    bool json;
} wopts;

/* The options that take a value. */
static const char *const VALUE_FLAGS[] = {
    "--kind", "--n",       "--codec", "--chunk-nnz", "--shard-nnz", "--genes", "--format",
    "--seed", "--threads", "-o",      "--out",       "--results",   NULL};

static int
add_u64(const char *flag, const char *v, uint64_t lo, uint64_t *list, size_t *n)
{
    if (*n == MAX_SETTINGS) {
        fprintf(stderr, "zbatch bench: at most %d %s\n", MAX_SETTINGS, flag);
        return -1;
    }
    return zb__bench_parse_u64(flag, v, lo, (uint64_t)1 << 40, &list[(*n)++]);
}

/* Returns 0 to go on, else the exit code (-1 for --help). */
static int
parse_args(int argc, char **argv, wopts *o)
{
    memset(o, 0, sizeof *o);
    o->threads = 1;
    o->results = "results";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return -1;
        }
        if (!strcmp(a, "--write")) continue;
        if (!strcmp(a, "--json")) {
            o->json = true;
            continue;
        }
        if (a[0] != '-') {
            fprintf(stderr, "zbatch bench --write: unexpected argument '%s'\n", a);
            return 2;
        }
        char flag[64];
        const char *v = NULL;
        if (zb__bench_flag_value(argc, argv, &i, VALUE_FLAGS, flag, sizeof flag, &v) != 0) return 2;
        int bad = 0;
        if (!strcmp(flag, "--kind")) {
            if (strcmp(v, "cells") && strcmp(v, "atoms")) {
                fprintf(stderr, "zbatch bench --write: --kind: '%s' is not cells or atoms\n", v);
                bad = 1;
            }
            o->kind = v;
        } else if (!strcmp(flag, "--n")) {
            bad = zb__bench_parse_u64(flag, v, 1, (uint64_t)1 << 40, &o->n);
            o->have_n = true;
        } else if (!strcmp(flag, "--codec")) {
            if (o->ncodecs == MAX_SETTINGS) {
                fprintf(stderr, "zbatch bench: at most %d --codec\n", MAX_SETTINGS);
                bad = 1;
            } else {
                o->codecs[o->ncodecs++] = v;
            }
        } else if (!strcmp(flag, "--chunk-nnz")) {
            bad = add_u64(flag, v, 1, o->chunks, &o->nchunks);
        } else if (!strcmp(flag, "--shard-nnz")) {
            bad = add_u64(flag, v, 0, o->shards, &o->nshards);
        } else if (!strcmp(flag, "--genes")) {
            bad = zb__bench_parse_u64(flag, v, 1, INT32_MAX, &o->genes);
            o->have_genes = true;
        } else if (!strcmp(flag, "--format")) {
            if (strcmp(v, "v2") && strcmp(v, "v3")) {
                fprintf(stderr, "zbatch bench --write: --format: '%s' is not v2 or v3\n", v);
                bad = 1;
            }
            o->format = v;
        } else if (!strcmp(flag, "--seed")) {
            bad = zb__bench_parse_u64(flag, v, 0, UINT64_MAX, &o->seed);
        } else if (!strcmp(flag, "--threads")) {
            bad = zb__bench_parse_u64(flag, v, 1, 64, &o->threads);
        } else if (!strcmp(flag, "-o") || !strcmp(flag, "--out")) {
            o->out = v;
        } else if (!strcmp(flag, "--results")) {
            o->results = v;
        }
        if (bad) return 2;
    }
    if (!o->kind || !o->have_n) {
        fprintf(stderr, "zbatch bench --write: --kind and --n are required\n");
        return 2;
    }
    bool cells = !strcmp(o->kind, "cells");
    if (!cells && (o->nchunks || o->nshards || o->have_genes || o->format)) {
        fprintf(stderr, "zbatch bench --write: --chunk-nnz, --shard-nnz, --genes and --format "
                        "apply to --kind cells\n");
        return 2;
    }
    for (size_t s = 0; s < o->nshards; s++) {
        if (!o->shards[s]) continue;
        if (o->format && !strcmp(o->format, "v2")) {
            fprintf(stderr, "zbatch bench --write: --shard-nnz needs --format v3\n");
            return 2;
        }
        for (size_t c = 0; c < o->nchunks; c++)
            if (o->shards[s] % o->chunks[c]) {
                fprintf(stderr,
                        "zbatch bench --write: --shard-nnz %" PRIu64 " is not a multiple "
                        "of --chunk-nnz %" PRIu64 "\n",
                        o->shards[s], o->chunks[c]);
                return 2;
            }
    }
    if (!*o->results || (o->out && !*o->out)) {
        fprintf(stderr, "zbatch bench --write: --results and --out need a directory\n");
        return 2;
    }
    return 0;
}

/* ---- one store ---------------------------------------------------------------------------- */

/* nftw has no user pointer: the walk's totals live here (the CLI is single-threaded). */
static uint64_t walk_files, walk_bytes;

static int
walk_add(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)path;
    (void)ftw;
    if (type == FTW_F) {
        walk_files++;
        walk_bytes += (uint64_t)st->st_size;
    }
    return 0;
}

static int
walk_remove(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)type;
    (void)ftw;
    return remove(path);
}

/* Runs synth with its stdout (one summary line) silenced, so --json prints only the record. */
static int
run_synth(int argc, char **argv, bool cells)
{
    fflush(stdout);
    int saved = dup(STDOUT_FILENO), nul = open("/dev/null", O_WRONLY);
    if (saved >= 0 && nul >= 0) dup2(nul, STDOUT_FILENO);
    if (nul >= 0) close(nul);
    int rc = cells ? zb__cli_synth_cells(argc, argv) : zb__cli_synth_atoms(argc, argv);
    fflush(stdout);
    if (saved >= 0) {
        dup2(saved, STDOUT_FILENO);
        close(saved);
    }
    return rc;
}

static uint64_t
json_u64(json_object *v)
{
    if (!v || !json_object_is_type(v, json_type_int)) return 0;
    return zb__json_is_big_uint(v) ? json_object_get_uint64(v) : (uint64_t)json_object_get_int64(v);
}

/* Sums the logical and stored bytes of the store's arrays. */
static zb_status
array_bytes(const char *path, uint64_t *logical, uint64_t *stored_fixed, uint64_t *stored_all)
{
    *logical = *stored_fixed = *stored_all = 0;
    zb_store *store = NULL;
    char *text = NULL;
    json_object *doc = NULL;
    zb_status st = zb__cli_store_open(path, &store);
    if (st == ZB_OK) st = zb_info_json(store, "", &text);
    if (st == ZB_OK) st = zb__json_parse(text, strlen(text), "info", &doc);
    json_object *nodes = st == ZB_OK ? zb__json_get(doc, "nodes") : NULL;
    size_t nn =
        nodes && json_object_is_type(nodes, json_type_array) ? json_object_array_length(nodes) : 0;
    for (size_t i = 0; i < nn; i++) {
        json_object *node = json_object_array_get_idx(nodes, i);
        const char *type = json_object_get_string(zb__json_get(node, "type"));
        if (!type || strcmp(type, "array")) continue;
        json_object *lb = zb__json_get(node, "logical_bytes");
        uint64_t sb = json_u64(zb__json_get(node, "stored_bytes"));
        *stored_all += sb;
        if (lb && json_object_is_type(lb, json_type_int)) {
            *logical += json_u64(lb);
            *stored_fixed += sb;
        }
    }
    json_object_put(doc);
    free(text);
    zb_store_close(store);
    return st;
}

typedef struct setting {
    const char *codec;     /* NULL: the library's default */
    uint64_t chunk, shard; /* 0: synth's default / none */
} setting;

/* A file-name-safe rendering of a setting. */
static void
store_name(const char *kind, const setting *s, char *out, size_t cap)
{
    char codec[128];
    snprintf(codec, sizeof codec, "%s", s->codec ? s->codec : "default");
    for (char *p = codec; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '-'))
            *p = '_';
    char chunk[32] = "default", shard[32] = "none";
    if (s->chunk) snprintf(chunk, sizeof chunk, "%" PRIu64, s->chunk);
    if (s->shard) snprintf(shard, sizeof shard, "%" PRIu64, s->shard);
    if (!strcmp(kind, "cells"))
        snprintf(out, cap, "%s-%s-c%s-s%s.zarr", kind, codec, chunk, shard);
    else
        snprintf(out, cap, "%s-%s.zarr", kind, codec);
}

/* Writes one store and adds its figures to `runs`. Returns 0 or the exit code. */
static int
write_one(const wopts *o, const char *dir, const setting *s, json_object *runs, bool keep)
{
    bool cells = !strcmp(o->kind, "cells");
    char name[256], path[4400], nbuf[32], seed[32], threads[32], genes[32], chunk[32], shard[32];
    store_name(o->kind, s, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat sb;
    if (stat(path, &sb) == 0) {
        fprintf(stderr, "zbatch bench --write: %s exists; remove it or choose another --out\n",
                path);
        return 1;
    }
    snprintf(nbuf, sizeof nbuf, "%" PRIu64, o->n);
    snprintf(seed, sizeof seed, "%" PRIu64, o->seed);
    snprintf(threads, sizeof threads, "%" PRIu64, o->threads);
    char *av[32];
    int ac = 0;
    av[ac++] = "synth";
    av[ac++] = "--kind";
    av[ac++] = cells ? "cells" : "atoms";
    av[ac++] = "--n";
    av[ac++] = nbuf;
    av[ac++] = "-o";
    av[ac++] = path;
    av[ac++] = "--seed";
    av[ac++] = seed;
    av[ac++] = "--threads";
    av[ac++] = threads;
    if (s->codec) {
        av[ac++] = "--codec";
        av[ac++] = (char *)s->codec;
    }
    if (cells && o->have_genes) {
        snprintf(genes, sizeof genes, "%" PRIu64, o->genes);
        av[ac++] = "--genes";
        av[ac++] = genes;
    }
    if (cells && o->format) {
        av[ac++] = "--format";
        av[ac++] = (char *)o->format;
    }
    if (s->chunk) {
        snprintf(chunk, sizeof chunk, "%" PRIu64, s->chunk);
        av[ac++] = "--chunk-nnz";
        av[ac++] = chunk;
    }
    if (cells) { /* always explicit: 0 means unsharded, and synth's default is sharded */
        snprintf(shard, sizeof shard, "%" PRIu64, s->shard);
        av[ac++] = "--shard-nnz";
        av[ac++] = shard;
    }
    av[ac] = NULL;

    double t0 = zb__bench_now();
    int rc = run_synth(ac, av, cells);
    double secs = zb__bench_now() - t0;
    if (rc) {
        fprintf(stderr, "zbatch bench --write: writing %s failed\n", path);
        return rc;
    }
    walk_files = walk_bytes = 0;
    if (nftw(path, walk_add, 32, FTW_PHYS) != 0) {
        fprintf(stderr, "zbatch bench --write: cannot walk %s: %s\n", path, strerror(errno));
        return 1;
    }
    uint64_t logical = 0, stored_fixed = 0, stored_all = 0;
    zb_status st = array_bytes(path, &logical, &stored_fixed, &stored_all);
    if (st != ZB_OK) {
        fprintf(stderr, "zbatch bench --write: %s: %s: %s\n", path, zb_strerror(st),
                zb_last_error());
        return 1;
    }
    json_object *r = json_object_new_object();
    zb__bench_put_str(r, "codec", s->codec);
    zb__bench_put(r, "chunk_nnz", s->chunk ? json_object_new_uint64(s->chunk) : NULL);
    zb__bench_put(r, "shard_nnz", s->shard ? json_object_new_uint64(s->shard) : NULL);
    zb__bench_put_str(r, "path", keep ? path : NULL);
    zb__bench_put_str(r, "name", name);
    zb__bench_put_u64(r, "samples", o->n);
    zb__bench_put_double(r, "seconds", secs);
    zb__bench_put_u64(r, "uncompressed_bytes", logical);
    zb__bench_put_u64(r, "stored_bytes", stored_fixed);
    zb__bench_put_u64(r, "array_stored_bytes", stored_all);
    zb__bench_put_u64(r, "bytes_on_disk", walk_bytes);
    zb__bench_put_u64(r, "files", walk_files);
    zb__bench_put_double(r, "compression_ratio",
                         stored_fixed ? (double)logical / (double)stored_fixed : NAN);
    zb__bench_put_double(r, "write_mb_s", secs > 0 ? (double)logical / 1e6 / secs : NAN);
    zb__bench_put_double(r, "samples_per_s", secs > 0 ? (double)o->n / secs : NAN);
    json_object_array_add(runs, r);
    if (!keep) nftw(path, walk_remove, 32, FTW_DEPTH | FTW_PHYS);
    return 0;
}

static json_object *
params_json(const wopts *o, bool keep)
{
    json_object *p = json_object_new_object();
    zb__bench_put_str(p, "kind", o->kind);
    zb__bench_put_u64(p, "n", o->n);
    json_object *c = json_object_new_array();
    for (size_t i = 0; i < o->ncodecs; i++)
        json_object_array_add(c, json_object_new_string(o->codecs[i]));
    zb__bench_put(p, "codecs", c);
    json_object *ch = json_object_new_array(), *sh = json_object_new_array();
    for (size_t i = 0; i < o->nchunks; i++)
        json_object_array_add(ch, json_object_new_uint64(o->chunks[i]));
    for (size_t i = 0; i < o->nshards; i++)
        json_object_array_add(sh, json_object_new_uint64(o->shards[i]));
    zb__bench_put(p, "chunk_nnz", ch);
    zb__bench_put(p, "shard_nnz", sh);
    zb__bench_put(p, "genes", o->have_genes ? json_object_new_uint64(o->genes) : NULL);
    zb__bench_put_str(p, "format", o->format);
    zb__bench_put_u64(p, "seed", o->seed);
    zb__bench_put_u64(p, "threads", o->threads);
    zb__bench_put_str(p, "out", keep ? o->out : NULL);
    zb__bench_put_str(p, "results", o->results);
    return p;
}

static void
print_table(const wopts *o, json_object *runs, const char *file)
{
    printf("zbatch bench --write: %s, %" PRIu64 " samples per store, %" PRIu64 " thread(s)\n\n",
           o->kind, o->n, o->threads);
    printf("  %-24s %9s %9s %8s %9s %11s %11s %7s %6s\n", "codec", "chunk", "shard", "seconds",
           "MB/s", "samples/s", "on disk", "ratio", "files");
    size_t n = json_object_array_length(runs);
    for (size_t i = 0; i < n; i++) {
        json_object *r = json_object_array_get_idx(runs, i);
        json_object *codec = zb__json_get(r, "codec"), *ch = zb__json_get(r, "chunk_nnz"),
                    *sh = zb__json_get(r, "shard_nnz");
        char disk[32];
        zb__bench_human_bytes((double)json_u64(zb__json_get(r, "bytes_on_disk")), disk,
                              sizeof disk);
        printf("  %-24s %9s %9s %8.2f %9.1f %11.0f %11s %7.2f %6" PRIu64 "\n",
               codec ? json_object_get_string(codec) : "(default)",
               ch ? json_object_get_string(ch) : "default", sh ? json_object_get_string(sh) : "-",
               json_object_get_double(zb__json_get(r, "seconds")),
               json_object_get_double(zb__json_get(r, "write_mb_s")),
               json_object_get_double(zb__json_get(r, "samples_per_s")), disk,
               json_object_get_double(zb__json_get(r, "compression_ratio")),
               json_u64(zb__json_get(r, "files")));
    }
    printf("\n  record: %s\n", file);
}

int
zb__bench_write_main(int argc, char **argv)
{
    wopts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    bool keep = o.out != NULL;
    char dir[4096];
    if (keep) {
        if (zb__bench_make_dirs(o.out) != 0) {
            fprintf(stderr, "zbatch bench --write: cannot create %s: %s\n", o.out, strerror(errno));
            return 1;
        }
        snprintf(dir, sizeof dir, "%s", o.out);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/zbatch-bench-write-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(dir)) {
            fprintf(stderr, "zbatch bench --write: cannot create a temporary directory: %s\n",
                    strerror(errno));
            return 1;
        }
    }
    char stamp[32], suffix[32], file[4200];
    json_object *rec = zb__bench_record_new("write", stamp, sizeof stamp);
    json_object *runs = json_object_new_array();
    size_t nc = o.ncodecs ? o.ncodecs : 1, nk = o.nchunks ? o.nchunks : 1,
           ns = o.nshards ? o.nshards : 1;
    for (size_t c = 0; c < nc && !rc; c++)
        for (size_t k = 0; k < nk && !rc; k++)
            for (size_t s = 0; s < ns && !rc; s++) {
                setting st = {o.ncodecs ? o.codecs[c] : NULL, o.nchunks ? o.chunks[k] : 0,
                              o.nshards ? o.shards[s] : 0};
                rc = write_one(&o, dir, &st, runs, keep);
            }
    if (!keep) rmdir(dir);
    if (rc) {
        json_object_put(runs);
        json_object_put(rec);
        return rc;
    }
    zb__bench_put(rec, "parameters", params_json(&o, keep));
    zb__bench_put(rec, "runs", runs);
    snprintf(suffix, sizeof suffix, "write-%s", o.kind);
    if (zb__bench_record_write(rec, o.results, stamp, suffix, file, sizeof file) != 0) {
        json_object_put(rec);
        return 1;
    }
    if (o.json)
        printf("%s\n", json_object_to_json_string_ext(rec, JSON_C_TO_STRING_PRETTY |
                                                               JSON_C_TO_STRING_NOSLASHESCAPE));
    else
        print_table(&o, runs, file);
    json_object_put(rec);
    return 0;
}
