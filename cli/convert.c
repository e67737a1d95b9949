/* zbatch convert — two jobs:
 *
 *   zbatch convert INPUT... -o OUTPUT [options]
 *       AnnData inputs (.h5ad files, anndata Zarr stores) into a pre-shuffled, sharded
 *       collection (zbatch_convert.h), with a progress display; restartable.
 *   zbatch convert SRC DST [--codec ...] [--format ...] [--chunk-bytes N]
 *       re-encode one Zarr store (format, codec, chunk size), groups and attributes kept.
 *
 * `--from ase` (structures ASE reads, into an atomic store), `--from lmdb` (fairchem-style
 * LMDBs, into an atomic store) and `--scheduler ADDRESS` (the tasks on a Dask cluster) are the
 * Python package's: the command runs `python -m zbatch
 * convert ...` with the same arguments. */
#include <errno.h>
#include <json-c/json.h>
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "zbatch.h"

static void
usage(FILE *f)
{
    fprintf(
        f,
        "usage: zbatch convert INPUT... -o OUTPUT [options]\n"
        "       zbatch convert SRC DST [--codec CODEC] [--format v2|v3] [--chunk-bytes N]\n"
        "                              [--threads T]\n"
        "       zbatch convert --from ase FILE... -o OUTPUT --cutoff R [options]\n"
        "       zbatch convert --from lmdb LMDB... -o OUTPUT [--cutoff R] [options]\n"
        "\n"
        "AnnData inputs (.h5ad files or anndata Zarr stores) into a pre-shuffled collection\n"
        "of sharded AnnData datasets (annbatch's layout): every cell at a uniformly random\n"
        "place, genes aligned by name, categories merged, memory bounded, restartable (run\n"
        "the same command again after a crash).\n"
        "\n"
        "  -o, --output DIR      the collection to write (a new or empty directory, or an\n"
        "                        s3://bucket/prefix URL; credentials from the AWS_*\n"
        "                        variables, see docs/REMOTE.md)\n"
        "  --work-dir DIR        local directory for the plan and scratch files (default:\n"
        "                        OUTPUT/.zbatch-convert; for s3:// outputs\n"
        "                        $TMPDIR/zbatch-convert-HASH of the URL, so a rerun resumes)\n"
        "  --dataset-size CELLS  cells per dataset (default %" PRIu64 ")\n"
        "  --var-join outer|inner  genes of any input (default) or of every input\n"
        "  --genes FILE          the output's genes, one per line, in that order\n"
        "  --obs COLUMNS         obs columns to keep, comma-separated (default: every\n"
        "                        column all inputs have; \"\" for none)\n"
        "  --x KEY               the input matrix that becomes X: X (default), raw/X,\n"
        "                        layers/NAME\n"
        "  --layers NAMES        input layers to carry along, comma-separated\n"
        "  --memory SIZE         memory for data in flight, e.g. 4G, 512M (default 4G)\n"
        "  --seed S              of the cells' positions (default 0)\n"
        "  --no-shuffle          keep the inputs' order\n"
        "  --format v2|v3        Zarr format of the output (default v3; annbatch reads v3)\n"
        "  --codec CODEC         none, zstd:L, lz4, gzip:L, zlib:L, blosc:CNAME:CLEVEL:SHUFFLE\n"
        "                        (default blosc:lz4:5:shuffle; uint8/uint16 X/data and\n"
        "                        X/indices: blosc:lz4:5:noshuffle)\n"
        "  --chunk N             elements per chunk of X/data and X/indices (default %d)\n"
        "  --shard N             elements per shard (default 1,024 chunks; 0 = unsharded)\n"
        "  --threads T           threads (default: every CPU)\n"
        "  --data-dtype D        X/data and the layers' data: auto (default: uint8 when\n"
        "                        every value is an integer in [0, 255], uint16 in [0, 65535],\n"
        "                        else the inputs' type), keep, uint8, uint16 (refused when a\n"
        "                        value does not fit exactly) or float32\n"
        "  --index-dtype D       X/indices: auto (default: uint8/uint16 up to 65,535 genes,\n"
        "                        else int32), narrow (anndata's smallest unsigned type) or\n"
        "                        int32\n"
        "  --quiet               no progress display\n"
        "  --limit               measure this machine's limit for these inputs instead (the\n"
        "                        inputs read alone, the output's X compressed alone) and\n"
        "                        print it as one JSON line\n"
        "  --scheduler ADDRESS   run the tasks on a Dask cluster (needs the Python package)\n"
        "  --from ase            structures ASE reads, with neighbour lists from --cutoff\n"
        "                        (needs the Python package; see its --help)\n"
        "  --from lmdb           fairchem-style LMDBs (pickled dicts or PyG Data), edges\n"
        "                        kept, --cutoff for entries without them (Python package)\n",
        ZB_CONVERT_DEFAULT_DATASET_SIZE, ZB_ANNDATA_DEFAULT_X_CHUNK);
}

/* ---- the Python package's jobs ----------------------------------------------------------------- */

static bool
executable(const char *path)
{
    return access(path, X_OK) == 0;
}

/* Runs `python -m zbatch ARGV...` (argv[0] is the subcommand: convert, repair): ZBATCH_PYTHON,
 * else a python beside this program (an installed package's scripts directory), else the
 * checkout's .venv, else python3. */
int
zb__cli_python(int argc, char **argv)
{
    char python[PATH_MAX + 32] = "";
    const char *env = getenv("ZBATCH_PYTHON");
    if (env && *env) {
        snprintf(python, sizeof python, "%s", env);
    } else {
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n > 0) {
            self[n] = '\0';
            char *slash = strrchr(self, '/');
            if (slash) *slash = '\0';
            static const char *const near[] = {"python3", "python", "../.venv/bin/python"};
            for (size_t i = 0; i < 3 && !python[0]; i++) {
                char cand[PATH_MAX + 32];
                snprintf(cand, sizeof cand, "%s/%s", self, near[i]);
                if (executable(cand)) snprintf(python, sizeof python, "%s", cand);
            }
        }
        if (!python[0]) snprintf(python, sizeof python, "python3");
    }
    char **args = calloc((size_t)argc + 4, sizeof *args);
    if (!args) return 1;
    args[0] = python;
    args[1] = "-m";
    args[2] = "zbatch";
    for (int i = 0; i < argc; i++) args[3 + i] = argv[i];
    execvp(python, args);
    fprintf(stderr,
            "zbatch %s: this job runs in the zbatch Python package, and %s could not be "
            "started (%s); set ZBATCH_PYTHON to a Python that has zbatch installed\n",
            argv[0], python, strerror(errno));
    free(args);
    return 1;
}

/* ---- argument parsing -------------------------------------------------------------------------- */

static int
parse_u64(const char *flag, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') {
        fprintf(stderr, "zbatch convert: %s needs a non-negative integer, not '%s'\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* 4G, 4GB, 4GiB, 512M, 64K, 1T, or bytes; binary units. */
static int
parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    uint64_t mult = 1;
    if (*end == 'K' || *end == 'k') mult = (uint64_t)1 << 10;
    if (*end == 'M' || *end == 'm') mult = (uint64_t)1 << 20;
    if (*end == 'G' || *end == 'g') mult = (uint64_t)1 << 30;
    if (*end == 'T' || *end == 't') mult = (uint64_t)1 << 40;
    if (mult > 1) end++;
    if (mult > 1 && *end == 'i') end++; /* GiB: the units are binary either way */
    if ((*end == 'B' || *end == 'b') && end[1] == '\0') end++;
    if (errno || end == s || *end || v <= 0 || v * (double)mult > 1.8e19) {
        fprintf(stderr, "zbatch convert: --memory needs a size such as 4G or 512M, not '%s'\n", s);
        return -1;
    }
    *out = (uint64_t)(v * (double)mult);
    return 0;
}

/* Splits "a,b,c" into a NULL-free list (the string is modified). "" gives an empty list. */
static const char **
split_list(char *s, size_t *n)
{
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    const char **out = calloc(cap, sizeof *out);
    *n = 0;
    if (!out) return NULL;
    if (!*s) return out;
    for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ",")) out[(*n)++] = tok;
    return out;
}

/* ---- progress ---------------------------------------------------------------------------------- */

typedef struct progress_state {
    bool tty, quiet;
    struct timespec start, phase_start, last;
    int phase;
} progress_state;

static double
seconds_between(struct timespec a, struct timespec b)
{
    return (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
}

static void
show_progress(void *ctx, const zb_convert_progress *p)
{
    static const char *const names[] = {"prepare", "scatter", "gather"};
    progress_state *s = ctx;
    if (s->quiet) return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if ((int)p->phase != s->phase) {
        if (s->tty && s->phase >= 0) fputc('\n', stderr);
        s->phase = (int)p->phase;
        s->phase_start = now;
        s->last.tv_sec = 0;
    }
    bool done = p->tasks_done == p->tasks_total;
    /* a terminal gets a line redrawn in place; a log gets a line every 10 s and at the end */
    if (!s->tty && !done && s->last.tv_sec && seconds_between(s->last, now) < 10) return;
    if (s->tty && !done && s->last.tv_sec && seconds_between(s->last, now) < 0.2) return;
    s->last = now;
    double t = seconds_between(s->phase_start, now);
    double frac = p->bytes_total   ? (double)p->bytes_done / (double)p->bytes_total
                  : p->tasks_total ? (double)p->tasks_done / (double)p->tasks_total
                                   : 1;
    double rate = t > 0 ? (double)p->cells_done / t : 0,
           mbs = t > 0 ? (double)p->bytes_done / t / 1e6 : 0;
    double eta = frac > 0 && frac < 1 ? t / frac - t : 0;
    fprintf(stderr,
            "%s%-7s %5.1f%%  %" PRIu64 "/%" PRIu64 " tasks  %.0f cells/s  %.0f MB/s  %s%.0f s%s",
            s->tty ? "\r" : "", names[p->phase], 100 * frac, p->tasks_done, p->tasks_total, rate,
            mbs, done ? "took " : "ETA ", done ? t : eta, s->tty ? "\033[K" : "\n");
    fflush(stderr);
}

/* ---- the two jobs ------------------------------------------------------------------------------ */

static int
convert_store(const char *src, const char *dst, const zb_copy_opts *o)
{
    struct stat sb;
    bool remote = strstr(dst, "://") != NULL; /* s3://: objects need no directory */
    if (!remote && stat(dst, &sb) == 0) {
        fprintf(stderr, "zbatch convert: %s exists; give a new path\n", dst);
        return 1;
    }
    if (!remote && mkdir(dst, 0777) != 0) {
        fprintf(stderr, "zbatch convert: cannot create %s: %s\n", dst, strerror(errno));
        return 1;
    }
    zb_store *in = NULL, *out = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    zb_status st = zb__cli_store_open(src, &in);
    if (st == ZB_OK) st = zb__cli_store_open(dst, &out);
    if (st == ZB_OK) st = zb_store_copy(in, "", out, "", o);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    zb_store_close(in);
    zb_store_close(out);
    if (st != ZB_OK) {
        fprintf(stderr, "zbatch convert: %s: %s\n", zb_strerror(st), zb_last_error());
        return 1;
    }
    printf("converted %s -> %s in %.2f s\n", src, dst, seconds_between(t0, t1));
    return 0;
}

/* The stored types the manifest records and the codecs the writer gave them ("stored X/data
 * uint8 (blosc:lz4:5:noshuffle), X/indices uint16 (blosc:lz4:5:noshuffle)"). */
static void
print_dtypes(const char *output, const char *codec)
{
    zb_store *store = NULL;
    uint8_t *text = NULL;
    uint64_t len = 0;
    if (zb__cli_store_open(output, &store) == ZB_OK)
        zb_store_read_all(store, "zbatch-manifest.json", &text, &len);
    zb_store_close(store);
    json_object *m = text ? json_tokener_parse((const char *)text) : NULL, *dt = NULL;
    free(text);
    if (m && json_object_object_get_ex(m, "dtypes", &dt) &&
        json_object_is_type(dt, json_type_object)) {
        const char *sep = "stored ";
        json_object_object_foreach(dt, key, val)
        {
            const char *name = json_object_get_string(val);
            zb_dtype dt_of = 0;
            while (dt_of < ZB_DT_COUNT_ && strcmp(zb_dtype_name(dt_of), name)) dt_of++;
            printf("%s%s %s (%s)", sep, key, name, zb_anndata_csr_codec(codec, dt_of));
            sep = ", ";
        }
        printf("\n");
    }
    json_object_put(m);
}

/* A switch from the environment: off when unset, "" or "0", on otherwise. */
static bool
env_flag(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0");
}

static int
convert_collection(const char *const *inputs, size_t n, const char *output, zb_convert_opts *o,
                   bool quiet, bool limit)
{
    /* switches for comparisons (docs/CONVERT.md); the library reads no environment variable */
    o->scratch_path = env_flag("ZBATCH_CONVERT_SCRATCH");
    o->buffered_output = env_flag("ZBATCH_CONVERT_BUFFERED");
    if (limit) {
        zb_convert_limit l;
        zb_status st = zb_convert_measure_limit(inputs, n, output, o, &l);
        if (st != ZB_OK) {
            fprintf(stderr, "zbatch convert: %s: %s\n", zb_strerror(st), zb_last_error());
            return 1;
        }
        printf("{\"read_s\": %.6f, \"compress_s\": %.6f, \"cells\": %" PRIu64
               ", \"input_bytes\": %" PRIu64 ", \"output_bytes\": %" PRIu64 "}\n",
               l.read_s, l.compress_s, l.cells, l.input_bytes, l.output_bytes);
        return 0;
    }
    /* Fixed allocator thresholds: buffers of 1 MiB and more mapped, and heap tops above 4 MiB
     * returned. With glibc's adaptive ones each of the conversion's threads' arenas kept up to
     * tens of MiB of freed memory (152 MiB peak at --memory 64M; 88 MiB with these); the big
     * buffers are reused by the tasks, so mapping them costs nothing measurable here. */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    mallopt(M_TRIM_THRESHOLD, 4 << 20);
    progress_state ps = {.tty = isatty(2), .quiet = quiet, .phase = -1};
    clock_gettime(CLOCK_MONOTONIC, &ps.start);
    o->progress = show_progress;
    o->progress_ctx = &ps;
    zb_remote_opts remote;
    char work[PATH_MAX + 64];
    bool is_remote = strstr(output, "://") && strncmp(output, "file://", 7);
    bool s3 = !strncmp(output, "s3://", 5);
    zb_status rs = s3 ? zb__cli_remote_opts(&remote) : ZB_OK;
    if (rs != ZB_OK) {
        fprintf(stderr, "zbatch convert: %s: %s\n", zb_strerror(rs), zb_last_error());
        return 1;
    }
    o->remote = s3 ? &remote : NULL;
    rs = zb__cli_mmap_bytes(&o->input_mmap_bytes); /* the one switch, as for the stores */
    if (rs != ZB_OK) {
        fprintf(stderr, "zbatch convert: %s: %s\n", zb_strerror(rs), zb_last_error());
        return 1;
    }
    if (!o->work_dir && is_remote) {
        const char *tmp = getenv("TMPDIR");
        zb_status ws = zb_convert_default_work_dir(output, tmp, work, sizeof work);
        if (ws != ZB_OK) {
            fprintf(stderr, "zbatch convert: %s: %s\n", zb_strerror(ws), zb_last_error());
            return 1;
        }
        o->work_dir = work;
    }
    zb_status st = zb_convert_run(inputs, n, output, o);
    struct timespec end;
    clock_gettime(CLOCK_MONOTONIC, &end);
    if (ps.tty && ps.phase >= 0 && !quiet) fputc('\n', stderr);
    if (st != ZB_OK) {
        fprintf(stderr, "zbatch convert: %s: %s\n", zb_strerror(st), zb_last_error());
        return 1;
    }
    printf("converted %zu input%s into %s in %.2f s\n", n, n == 1 ? "" : "s", output,
           seconds_between(ps.start, end));
    print_dtypes(output, o->codec);
    return 0;
}

int
zb__cli_convert(int argc, char **argv)
{
    zb_copy_opts co = ZB_COPY_OPTS_DEFAULT;
    zb_convert_opts o = ZB_CONVERT_OPTS_DEFAULT;
    const char **pos = calloc((size_t)argc + 1, sizeof *pos);
    const char **obs = NULL, **layers = NULL;
    size_t npos = 0;
    const char *output = NULL;
    bool quiet = false, limit = false, collection_flag = false;
    int rc = 2;
    if (!pos) return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--from") || !strcmp(a, "--scheduler")) {
            free(pos);
            return zb__cli_python(argc, argv);
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            rc = 0;
            goto done;
        } else if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && has) {
            output = argv[++i];
        } else if (!strcmp(a, "--work-dir") && has) {
            collection_flag = true;
            o.work_dir = argv[++i];
        } else if (!strcmp(a, "--codec") && has) {
            co.codec = o.codec = argv[++i];
        } else if (!strcmp(a, "--format") && has) {
            const char *f = argv[++i];
            if (strcmp(f, "v2") && strcmp(f, "v3") && strcmp(f, "2") && strcmp(f, "3")) {
                fprintf(stderr, "zbatch convert: --format is v2 or v3, not '%s'\n", f);
                goto done;
            }
            co.zarr_format = o.zarr_format = strchr(f, '2') ? 2 : 3;
        } else if (!strcmp(a, "--chunk-bytes") && has) {
            if (parse_u64(a, argv[++i], &co.chunk_bytes) || co.chunk_bytes == 0) goto done;
        } else if (!strcmp(a, "--threads") && has) {
            uint64_t t;
            if (parse_u64(a, argv[++i], &t) || t > 256) {
                fprintf(stderr, "zbatch convert: --threads is 0 to 256\n");
                goto done;
            }
            co.num_threads = o.num_threads = (int)t;
        } else if (!strcmp(a, "--dataset-size") && has) {
            collection_flag = true;
            if (parse_u64(a, argv[++i], &o.dataset_size) || o.dataset_size == 0) goto done;
        } else if (!strcmp(a, "--var-join") && has) {
            collection_flag = true;
            const char *j = argv[++i];
            if (strcmp(j, "outer") && strcmp(j, "inner")) {
                fprintf(stderr, "zbatch convert: --var-join is outer or inner, not '%s'\n", j);
                goto done;
            }
            o.var_join = !strcmp(j, "inner") ? ZB_VAR_INNER : ZB_VAR_OUTER;
        } else if (!strcmp(a, "--genes") && has) {
            collection_flag = true;
            o.genes = argv[++i];
        } else if (!strcmp(a, "--obs") && has) {
            collection_flag = true;
            free(obs);
            obs = split_list(argv[++i], &o.n_obs);
            if (!obs) goto done;
            o.obs = obs;
        } else if (!strcmp(a, "--x") && has) {
            collection_flag = true;
            o.x_key = argv[++i];
        } else if (!strcmp(a, "--layers") && has) {
            collection_flag = true;
            free(layers);
            layers = split_list(argv[++i], &o.n_layers);
            if (!layers) goto done;
            o.layers = layers;
        } else if (!strcmp(a, "--memory") && has) {
            collection_flag = true;
            if (parse_size(argv[++i], &o.memory_bytes)) goto done;
        } else if (!strcmp(a, "--seed") && has) {
            collection_flag = true;
            if (parse_u64(a, argv[++i], &o.seed)) goto done;
        } else if (!strcmp(a, "--no-shuffle")) {
            collection_flag = true;
            o.shuffle = false;
        } else if (!strcmp(a, "--chunk") && has) {
            collection_flag = true;
            if (parse_u64(a, argv[++i], &o.x_chunk) || o.x_chunk == 0) goto done;
        } else if (!strcmp(a, "--shard") && has) {
            collection_flag = true;
            if (parse_u64(a, argv[++i], &o.x_shard)) goto done;
            if (o.x_shard == 0) o.x_shard = UINT64_MAX;
        } else if (!strcmp(a, "--data-dtype") && has) {
            collection_flag = true;
            static const char *const names[] = {"auto", "keep", "uint8", "uint16", "float32"};
            const char *v = argv[++i];
            int found = -1;
            for (int k = 0; k < 5; k++)
                if (!strcmp(v, names[k])) found = k;
            if (found < 0) {
                fprintf(stderr,
                        "zbatch convert: --data-dtype is auto, keep, uint8, uint16 or "
                        "float32, not '%s'\n",
                        v);
                goto done;
            }
            o.data_dtype = (zb_convert_data_dtype)found;
        } else if (!strcmp(a, "--index-dtype") && has) {
            collection_flag = true;
            const char *v = argv[++i];
            if (!strcmp(v, "auto"))
                o.index_dtype = ZB_CONVERT_INDEX_AUTO;
            else if (!strcmp(v, "narrow"))
                o.index_dtype = ZB_CONVERT_INDEX_NARROW;
            else if (!strcmp(v, "int32"))
                o.index_dtype = ZB_CONVERT_INDEX_INT32;
            else {
                fprintf(stderr,
                        "zbatch convert: --index-dtype is auto, narrow or int32, not "
                        "'%s'\n",
                        v);
                goto done;
            }
        } else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
            quiet = true;
        } else if (!strcmp(a, "--limit")) {
            limit = true;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "zbatch convert: unknown option '%s' (or it needs a value)\n", a);
            usage(stderr);
            goto done;
        } else {
            pos[npos++] = a;
        }
    }
    if (output) {
        if (npos == 0) {
            fprintf(stderr, "zbatch convert: no INPUT given\n");
            usage(stderr);
            goto done;
        }
        rc = convert_collection(pos, npos, output, &o, quiet, limit);
    } else if (npos == 2 && !collection_flag && !limit) {
        rc = convert_store(pos[0], pos[1], &co);
    } else {
        fprintf(stderr, "zbatch convert: give INPUT... -o OUTPUT (a collection), or SRC DST (a "
                        "re-encoded store)\n");
        usage(stderr);
    }
done:
    free(pos);
    free(obs);
    free(layers);
    return rc;
}
