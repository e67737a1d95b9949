/* zbatch synth --kind atoms: an nvalchemi AtomicData store (shared FORMATS.md §8) of periodic
 * structures with neighbour lists, reproducible by seed.
 *
 * Every structure draws from its own generator, seeded from (seed, structure index), so the
 * store depends only on the seed and the options, never on the block size. Structures are
 * generated and written block by block: memory is bounded by one block whatever --n is.
 *
 * The model, per structure:
 * - n atoms uniform in [10, 200]; a number density uniform in [0.05, 0.10] atoms/Å^3 (organic
 *   crystals to metals), so the cell volume is n / density;
 * - the cell: half orthorhombic, half general (angles uniform in [75°, 105°]), edge ratios
 *   within ±20%, scaled to the volume; pbc true on every axis;
 * - positions: n distinct sites of an m×m×m fractional grid (m = ceil(cbrt(n))), each jittered
 *   by up to ±15% of the grid spacing, so no two atoms sit closer than about half a spacing;
 * - atomic numbers from {H, C, N, O, S} with weights 35/35/10/15/5 %;
 * - forces: normal, sd 1 eV/Å per component; energy: the sum of per-element reference energies
 *   plus normal noise (sd 0.05 eV per atom);
 * - neighbour list: every ordered pair (i, j, image S) with 0 < |r_j + S·cell − r_i| ≤ cutoff,
 *   images over every lattice translation that can reach the cutoff (ceil(cutoff / height) per
 *   axis); neighbor_list holds local indices (the writer stores them store-global), shifts the
 *   Cartesian image vectors S·cell, as nvalchemi's AtomicData defines them.
 * Floats are float32, atomic_numbers and neighbor_list int64, pbc bool.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "prng.h"
#include "zbatch.h"

#define MIN_ATOMS 10
#define MAX_ATOMS 200
#define BLOCK_STRUCTS 64
#define DEFAULT_CUTOFF 5.0
#define PI 3.14159265358979323846

/* ---------------------------------------------------------------------------------------------
 * The generator: splitmix64 seeds xoshiro256** (the pairing their authors recommend). Written by
 * hand because the output must be the same on every platform and C library.
 * ------------------------------------------------------------------------------------------- */

/* The generator of structure `i`: one stream per (seed, structure). */
static void
rng_seed(rng *r, uint64_t seed, uint64_t i)
{
    uint64_t x = seed ^ (i * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull);
    for (int k = 0; k < 4; k++) r->s[k] = splitmix64(&x);
}

/* Uniform in [0, 1) with 53 bits. */
static double
rng_unit(rng *r)
{
    return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

static double
rng_uniform(rng *r, double lo, double hi)
{
    return lo + (hi - lo) * rng_unit(r);
}

/* Uniform integer in [0, n) (Lemire's multiply; the bias at n <= 2^16 is below 2^-48). */
static uint64_t
rng_below(rng *r, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)rng_next(r) * n) >> 64);
}

/* Standard normal (Box-Muller; one value per call keeps the stream simple). */
static double
rng_normal(rng *r)
{
    double u = rng_unit(r), v = rng_unit(r);
    return sqrt(-2.0 * log(1.0 - u)) * cos(2.0 * PI * v);
}

/* ---------------------------------------------------------------------------------------------
 * One structure
 * ------------------------------------------------------------------------------------------- */
static const int elements[5] = {1, 6, 7, 8, 16};
static const double element_weight[5] = {0.35, 0.35, 0.10, 0.15, 0.05};
/* per-atom reference energies (eV), roughly PBE isolated-atom-in-molecule values */
static const double element_energy[5] = {-3.4, -9.2, -8.3, -4.9, -4.1};

typedef struct structure {
    int n;
    double cell[3][3]; /* rows are the lattice vectors */
    double pos[MAX_ATOMS][3];
    int64_t z[MAX_ATOMS];
    float forces[MAX_ATOMS][3];
    double energy;
} structure;

static void
make_cell(rng *r, double volume, double cell[3][3])
{
    double ratio[3], ang[3] = {PI / 2, PI / 2, PI / 2};
    for (int k = 0; k < 3; k++) ratio[k] = exp(rng_uniform(r, log(0.8), log(1.25)));
    bool general = rng_unit(r) < 0.5;
    double ca, cb, cg, sg, factor;
    for (;;) {
        if (general)
            for (int k = 0; k < 3; k++) ang[k] = rng_uniform(r, 75.0, 105.0) * PI / 180.0;
        ca = cos(ang[0]), cb = cos(ang[1]), cg = cos(ang[2]), sg = sin(ang[2]);
        factor = 1 - ca * ca - cb * cb - cg * cg + 2 * ca * cb * cg;
        if (factor > 0.5) break; /* keep cells far from flat */
    }
    /* volume = a b c sqrt(factor) with a:b:c = ratio */
    double scale = cbrt(volume / (ratio[0] * ratio[1] * ratio[2] * sqrt(factor)));
    double a = ratio[0] * scale, b = ratio[1] * scale, c = ratio[2] * scale;
    double cy = (ca - cb * cg) / sg;
    double m[3][3] = {
        {a, 0, 0}, {b * cg, b * sg, 0}, {c * cb, c * cy, c * sqrt(1 - cb * cb - cy * cy)}};
    memcpy(cell, m, sizeof m);
}

static void
make_structure(uint64_t seed, uint64_t index, structure *s)
{
    rng r;
    rng_seed(&r, seed, index);
    s->n = MIN_ATOMS + (int)rng_below(&r, MAX_ATOMS - MIN_ATOMS + 1);
    double density = rng_uniform(&r, 0.05, 0.10);
    make_cell(&r, s->n / density, s->cell);
    int m = (int)ceil(cbrt((double)s->n) - 1e-9);
    int sites[MAX_ATOMS * 4]; /* m^3 <= 216 for n <= 200 */
    int nsites = m * m * m;
    for (int i = 0; i < nsites; i++) sites[i] = i;
    s->energy = 0;
    for (int i = 0; i < s->n; i++) {
        /* a partial Fisher-Yates shuffle picks n distinct sites */
        int j = i + (int)rng_below(&r, (uint64_t)(nsites - i));
        int t = sites[i];
        sites[i] = sites[j];
        sites[j] = t;
        int g[3] = {sites[i] % m, (sites[i] / m) % m, sites[i] / (m * m)};
        double f[3];
        for (int d = 0; d < 3; d++) {
            f[d] = ((double)g[d] + 0.5 + rng_uniform(&r, -0.15, 0.15)) / m;
            f[d] -= floor(f[d]);
        }
        for (int d = 0; d < 3; d++)
            s->pos[i][d] = f[0] * s->cell[0][d] + f[1] * s->cell[1][d] + f[2] * s->cell[2][d];
        double u = rng_unit(&r), acc = 0;
        int e = 4;
        for (int k = 0; k < 5; k++) {
            acc += element_weight[k];
            if (u < acc) {
                e = k;
                break;
            }
        }
        s->z[i] = elements[e];
        s->energy += element_energy[e] + 0.05 * rng_normal(&r);
        for (int d = 0; d < 3; d++) s->forces[i][d] = (float)rng_normal(&r);
    }
}

static void
cross(const double *a, const double *b, double *out)
{
    out[0] = a[1] * b[2] - a[2] * b[1];
    out[1] = a[2] * b[0] - a[0] * b[2];
    out[2] = a[0] * b[1] - a[1] * b[0];
}

static double
norm3(const double *a)
{
    return sqrt(a[0] * a[0] + a[1] * a[1] + a[2] * a[2]);
}

/* A growable block of edges. */
typedef struct edges {
    int64_t *nl;   /* [cap][2] */
    float *shifts; /* [cap][3] */
    size_t n, cap;
} edges;

static int
edges_push(edges *e, int64_t i, int64_t j, const double *shift)
{
    if (e->n == e->cap) {
        size_t cap = e->cap ? 2 * e->cap : 1 << 16;
        int64_t *nl = realloc(e->nl, cap * 2 * sizeof *nl);
        if (!nl) return -1;
        e->nl = nl;
        float *sh = realloc(e->shifts, cap * 3 * sizeof *sh);
        if (!sh) return -1;
        e->shifts = sh;
        e->cap = cap;
    }
    e->nl[2 * e->n] = i;
    e->nl[2 * e->n + 1] = j;
    for (int d = 0; d < 3; d++) e->shifts[3 * e->n + (size_t)d] = (float)shift[d];
    e->n++;
    return 0;
}

/* Appends the structure's edges; returns their number, or -1 when out of memory. */
static int64_t
neighbours(const structure *s, double cutoff, edges *e)
{
    double vol, h[3], c12[3], c20[3], c01[3];
    cross(s->cell[1], s->cell[2], c12);
    cross(s->cell[2], s->cell[0], c20);
    cross(s->cell[0], s->cell[1], c01);
    vol = fabs(s->cell[0][0] * c12[0] + s->cell[0][1] * c12[1] + s->cell[0][2] * c12[2]);
    /* the height of the cell over each face: images beyond ceil(cutoff / h) cannot reach */
    h[0] = vol / norm3(c12);
    h[1] = vol / norm3(c20);
    h[2] = vol / norm3(c01);
    int k[3];
    for (int d = 0; d < 3; d++) k[d] = (int)ceil(cutoff / h[d]);
    double rc2 = cutoff * cutoff;
    size_t before = e->n;
    for (int i = 0; i < s->n; i++)
        for (int a = -k[0]; a <= k[0]; a++)
            for (int b = -k[1]; b <= k[1]; b++)
                for (int c = -k[2]; c <= k[2]; c++) {
                    double t[3];
                    for (int d = 0; d < 3; d++)
                        t[d] = a * s->cell[0][d] + b * s->cell[1][d] + c * s->cell[2][d];
                    for (int j = 0; j < s->n; j++) {
                        if (i == j && a == 0 && b == 0 && c == 0) continue;
                        double dx = s->pos[j][0] + t[0] - s->pos[i][0];
                        double dy = s->pos[j][1] + t[1] - s->pos[i][1];
                        double dz = s->pos[j][2] + t[2] - s->pos[i][2];
                        if (dx * dx + dy * dy + dz * dz <= rc2 && edges_push(e, i, j, t) < 0)
                            return -1;
                    }
                }
    return (int64_t)(e->n - before);
}

/* ---------------------------------------------------------------------------------------------
 * The command
 * ------------------------------------------------------------------------------------------- */
typedef struct opts {
    uint64_t n;
    const char *out;
    uint64_t seed;
    const char *codec;
    double cutoff;
    int threads;
    bool have_n;
} opts;

static void
usage(FILE *f)
{
    fprintf(f,
            "usage: zbatch synth --kind atoms --n N -o PATH [options]\n"
            "  nvalchemi AtomicData structures: %d-%d atoms in a periodic cell at a realistic\n"
            "  density, forces, energy, cell, pbc and cutoff neighbour lists (Zarr v3)\n"
            "  --n N            structures\n"
            "  -o, --out PATH   output directory (must not hold a store)\n"
            "  --seed S         random seed (default 0)\n"
            "  --codec CODEC    e.g. zstd:3, blosc:lz4:5:shuffle, none (default: the library's)\n"
            "  --cutoff R       neighbour cutoff in Å (default %.1f)\n"
            "  --threads T      compression threads per array (default 1)\n"
            "  -h, --help       this text\n",
            MIN_ATOMS, MAX_ATOMS, DEFAULT_CUTOFF);
}

static int
parse_u64(const char *flag, const char *v, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (!*v || *end || errno || v[0] == '-') {
        fprintf(stderr, "zbatch synth: %s: '%s' is not a non-negative integer\n", flag, v);
        return 2;
    }
    *out = x;
    return 0;
}

/* Returns 0 to go on, else the exit code (-1 for --help). */
static int
parse_args(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    o->cutoff = DEFAULT_CUTOFF;
    o->threads = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return -1;
        }
        const char *eq = strncmp(a, "--", 2) ? NULL : strchr(a, '=');
        char flag[64];
        const char *val;
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
        int rc = 0;
        if (!strcmp(flag, "--kind")) {
            if (strcmp(val, "atoms") != 0) return 2;
        } else if (!strcmp(flag, "--n")) {
            rc = parse_u64(flag, val, &o->n);
            o->have_n = true;
        } else if (!strcmp(flag, "-o") || !strcmp(flag, "--out")) {
            o->out = val;
        } else if (!strcmp(flag, "--seed")) {
            rc = parse_u64(flag, val, &o->seed);
        } else if (!strcmp(flag, "--codec")) {
            o->codec = val;
        } else if (!strcmp(flag, "--format")) {
            if (strcmp(val, "v3") != 0) {
                fprintf(stderr,
                        "zbatch synth --kind atoms: AtomicData stores are Zarr v3 "
                        "(--format %s)\n",
                        val);
                return 2;
            }
        } else if (!strcmp(flag, "--cutoff")) {
            char *end;
            o->cutoff = strtod(val, &end);
            if (!*val || *end || !(o->cutoff > 0) || o->cutoff > 20) {
                fprintf(stderr, "zbatch synth: --cutoff: '%s' is not a distance in (0, 20] Å\n",
                        val);
                return 2;
            }
        } else if (!strcmp(flag, "--threads")) {
            uint64_t t;
            rc = parse_u64(flag, val, &t);
            if (!rc && (t < 1 || t > 256)) {
                fprintf(stderr, "zbatch synth: --threads must be 1..256\n");
                rc = 2;
            }
            o->threads = (int)t;
        } else {
            fprintf(stderr, "zbatch synth --kind atoms: unknown option '%s'\n", flag);
            return 2;
        }
        if (rc) return rc;
    }
    if (!o->have_n || !o->out) {
        fprintf(stderr, "zbatch synth --kind atoms: --n and -o are required\n");
        usage(stderr);
        return 2;
    }
    return 0;
}

/* Splits PATH into the directory opened as the store and the dataset's name inside it (so the
 * dataset is not the store root, and can later be defragmented). */
static int
split_out(const char *out, char *dir, size_t dcap, char *name, size_t ncap)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", out);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
    char *slash = strrchr(buf, '/');
    if (!slash) {
        snprintf(dir, dcap, ".");
        snprintf(name, ncap, "%s", buf);
    } else {
        snprintf(name, ncap, "%s", slash + 1);
        *slash = '\0';
        snprintf(dir, dcap, "%s", slash == buf ? "/" : buf);
    }
    if (!name[0] || !strcmp(name, ".") || !strcmp(name, "..")) return -1;
    /* mkdir -p of the parent */
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *q = p + 1; *q; q++) {
        if (*q != '/') continue;
        *q = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) return -1;
        *q = '/';
    }
    if (mkdir(p, 0777) != 0 && errno != EEXIST) return -1;
    return 0;
}

/* Generates and adds structures [first, first + count). */
static zb_status
add_block(zb_atomic_writer *w, const opts *o, uint64_t first, uint64_t count, structure *ss,
          edges *e, uint64_t *n_atoms, uint64_t *n_edges)
{
    static float pos[BLOCK_STRUCTS * MAX_ATOMS * 3], forces[BLOCK_STRUCTS * MAX_ATOMS * 3];
    static int64_t z[BLOCK_STRUCTS * MAX_ATOMS];
    static float energy[BLOCK_STRUCTS], cell[BLOCK_STRUCTS * 9];
    static uint8_t pbc[BLOCK_STRUCTS * 3];
    int64_t na[BLOCK_STRUCTS], ne[BLOCK_STRUCTS];
    e->n = 0;
    size_t v = 0;
    for (uint64_t k = 0; k < count; k++) {
        structure *s = &ss[k];
        make_structure(o->seed, first + k, s);
        na[k] = s->n;
        ne[k] = neighbours(s, o->cutoff, e);
        if (ne[k] < 0) return ZB_E_NOMEM;
        for (int i = 0; i < s->n; i++, v++) {
            for (int d = 0; d < 3; d++) {
                pos[3 * v + (size_t)d] = (float)s->pos[i][d];
                forces[3 * v + (size_t)d] = s->forces[i][d];
            }
            z[v] = s->z[i];
        }
        energy[k] = (float)s->energy;
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++) cell[9 * k + (uint64_t)(3 * a + b)] = (float)s->cell[a][b];
        for (int d = 0; d < 3; d++) pbc[3 * k + (uint64_t)d] = 1;
    }
    static const uint64_t s3[1] = {3}, s33[2] = {3, 3}, s2[1] = {2}, s1[1] = {1};
    const zb_atomic_field fields[] = {
        {"core", "positions", ZB_ATOMIC_ATOM, ZB_DT_FLOAT32, 1, s3, pos},
        {"core", "atomic_numbers", ZB_ATOMIC_ATOM, ZB_DT_INT64, 0, NULL, z},
        {"core", "forces", ZB_ATOMIC_ATOM, ZB_DT_FLOAT32, 1, s3, forces},
        {"core", "energy", ZB_ATOMIC_SYSTEM, ZB_DT_FLOAT32, 1, s1, energy},
        {"core", "cell", ZB_ATOMIC_SYSTEM, ZB_DT_FLOAT32, 2, s33, cell},
        {"core", "pbc", ZB_ATOMIC_SYSTEM, ZB_DT_BOOL, 1, s3, pbc},
        {"core", "neighbor_list", ZB_ATOMIC_EDGE, ZB_DT_INT64, 1, s2, e->nl},
        {"core", "shifts", ZB_ATOMIC_EDGE, ZB_DT_FLOAT32, 1, s3, e->shifts},
    };
    *n_atoms += v;
    *n_edges += e->n;
    return zb_atomic_writer_add(w, count, na, ne, sizeof fields / sizeof fields[0], fields);
}

int
zb__cli_synth_atoms(int argc, char **argv)
{
    opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc == -1) return 0;
    if (rc) return rc;
    char dir[4096], name[1024];
    if (split_out(o.out, dir, sizeof dir, name, sizeof name) != 0) {
        fprintf(stderr, "zbatch synth: -o %s: cannot use this path (%s)\n", o.out,
                errno ? strerror(errno) : "no name");
        return 1;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    zb_atomic_write_config cfg = ZB_ATOMIC_WRITE_CONFIG_DEFAULT;
    cfg.meta.codec = cfg.core.codec = cfg.custom.codec = o.codec;
    cfg.num_threads = o.threads;
    zb_store *store = NULL;
    zb_atomic_writer *w = NULL;
    structure *ss = malloc(BLOCK_STRUCTS * sizeof *ss);
    edges e = {0};
    uint64_t n_atoms = 0, n_edges = 0;
    zb_status st = ss ? ZB_OK : ZB_E_NOMEM;
    if (st == ZB_OK) st = zb_store_open_file(dir, &store);
    if (st == ZB_OK) st = zb_atomic_writer_open(store, name, &cfg, &w);
    for (uint64_t first = 0; st == ZB_OK && first < o.n; first += BLOCK_STRUCTS) {
        uint64_t count = o.n - first < BLOCK_STRUCTS ? o.n - first : BLOCK_STRUCTS;
        st = add_block(w, &o, first, count, ss, &e, &n_atoms, &n_edges);
    }
    if (st == ZB_OK && o.n == 0) st = add_block(w, &o, 0, 0, ss, &e, &n_atoms, &n_edges);
    if (st == ZB_OK) st = zb_atomic_writer_commit(w);
    zb_atomic_writer_close(w);
    zb_store_close(store);
    free(ss);
    free(e.nl);
    free(e.shifts);
    if (st != ZB_OK) {
        fprintf(stderr, "zbatch synth: %s: %s\n", zb_strerror(st), zb_last_error());
        return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("synth atoms: %" PRIu64 " structures, %" PRIu64 " atoms, %" PRIu64
           " edges (cutoff %.2f Å, seed %" PRIu64 ") -> %s in %.2f s\n",
           o.n, n_atoms, n_edges, o.cutoff, o.seed, o.out, secs);
    return 0;
}
