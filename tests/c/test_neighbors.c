/* Neighbour lists (include/zbatch_neighbors.h): hand-counted cases (a dimer, a one-atom simple
 * cubic cell whose cutoff spans 2.5 cells, a hexagonal slab), then random structures against a
 * brute-force O(n²·images) reference written here, and the errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/testutil.h"
#include "zbatch_neighbors.h"

/* ---- helpers ------------------------------------------------------------------------------- */

typedef struct pair {
    int64_t i, j, s[3];
} pair;

static int
pair_cmp(const void *pa, const void *pb)
{
    const pair *a = pa, *b = pb;
    int64_t x[5] = {a->i, a->j, a->s[0], a->s[1], a->s[2]};
    int64_t y[5] = {b->i, b->j, b->s[0], b->s[1], b->s[2]};
    for (int k = 0; k < 5; k++)
        if (x[k] != y[k]) return x[k] < y[k] ? -1 : 1;
    return 0;
}

/* The list as sorted pairs (malloc'd). */
static pair *
sorted_pairs(const zb_neighbor_list *nl)
{
    pair *p = malloc((nl->n_pairs ? nl->n_pairs : 1) * sizeof *p);
    assert_non_null(p);
    for (uint64_t e = 0; e < nl->n_pairs; e++) {
        p[e].i = nl->i[e];
        p[e].j = nl->j[e];
        memcpy(p[e].s, nl->cell_shifts + 3 * e, sizeof p[e].s);
    }
    qsort(p, nl->n_pairs, sizeof *p, pair_cmp);
    return p;
}

static bool
has_pair(const zb_neighbor_list *nl, int64_t i, int64_t j, int64_t s0, int64_t s1, int64_t s2)
{
    for (uint64_t e = 0; e < nl->n_pairs; e++)
        if (nl->i[e] == i && nl->j[e] == j && nl->cell_shifts[3 * e] == s0 &&
            nl->cell_shifts[3 * e + 1] == s1 && nl->cell_shifts[3 * e + 2] == s2)
            return true;
    return false;
}

static uint64_t
rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double
uniform(uint64_t *state, double lo, double hi)
{
    return lo + (hi - lo) * (double)(rng_next(state) >> 11) * 0x1.0p-53;
}

/* ---- the reference: every j and every image S that can reach, tried one by one ------------ */

static void
cross(const double *a, const double *b, double *o)
{
    o[0] = a[1] * b[2] - a[2] * b[1];
    o[1] = a[2] * b[0] - a[0] * b[2];
    o[2] = a[0] * b[1] - a[1] * b[0];
}

/* The pairs of a structure by brute force: for each axis, the fractional difference of the two
 * atoms (Cramer's rule) bounds the images that can come within the cutoff; each is tested with
 * |(r_j − r_i) + S·cell| < cutoff. Non-periodic axes take S = 0 only. */
static pair *
brute_force(uint64_t n, const double *pos, const double cell[9], const bool pbc[3], double rc,
            uint64_t *count)
{
    double rec[3][3], vol, h[3];
    const double *a[3] = {cell, cell + 3, cell + 6};
    for (int k = 0; k < 3; k++) cross(a[(k + 1) % 3], a[(k + 2) % 3], rec[k]);
    vol = a[0][0] * rec[0][0] + a[0][1] * rec[0][1] + a[0][2] * rec[0][2];
    for (int k = 0; k < 3; k++)
        h[k] =
            fabs(vol) / sqrt(rec[k][0] * rec[k][0] + rec[k][1] * rec[k][1] + rec[k][2] * rec[k][2]);
    size_t cap = 1024, m = 0;
    pair *out = malloc(cap * sizeof *out);
    assert_non_null(out);
    for (uint64_t i = 0; i < n; i++)
        for (uint64_t j = 0; j < n; j++) {
            double d0[3], lo[3], hi[3];
            for (int c = 0; c < 3; c++) d0[c] = pos[3 * j + c] - pos[3 * i + c];
            for (int k = 0; k < 3; k++) {
                lo[k] = hi[k] = 0;
                if (!pbc[k]) continue;
                double df = (d0[0] * rec[k][0] + d0[1] * rec[k][1] + d0[2] * rec[k][2]) / vol;
                lo[k] = floor(-df - rc / h[k]) - 1;
                hi[k] = ceil(-df + rc / h[k]) + 1;
            }
            for (double s0 = lo[0]; s0 <= hi[0]; s0++)
                for (double s1 = lo[1]; s1 <= hi[1]; s1++)
                    for (double s2 = lo[2]; s2 <= hi[2]; s2++) {
                        if (i == j && s0 == 0 && s1 == 0 && s2 == 0) continue;
                        double d2 = 0;
                        for (int c = 0; c < 3; c++) {
                            double sc = s0 * cell[c] + s1 * cell[3 + c] + s2 * cell[6 + c];
                            double d = (pos[3 * j + c] - pos[3 * i + c]) + sc;
                            d2 += d * d;
                        }
                        if (!(sqrt(d2) < rc)) continue;
                        if (m == cap) {
                            cap *= 2;
                            out = realloc(out, cap * sizeof *out);
                            assert_non_null(out);
                        }
                        out[m++] =
                            (pair){(int64_t)i, (int64_t)j, {(int64_t)s0, (int64_t)s1, (int64_t)s2}};
                    }
        }
    qsort(out, m, sizeof *out, pair_cmp);
    *count = m;
    return out;
}

/* ---- hand-counted cases -------------------------------------------------------------------- */

static void
test_dimer(void **state)
{
    (void)state;
    double pos[6] = {0, 0, 0, 0.6, 0.8, 0}; /* 1.0 apart */
    zb_structure s = {2, pos, NULL, {false, false, false}};
    zb_neighbor_list nl = ZB_NEIGHBOR_LIST_INIT;
    ZB_ASSERT_OK(zb_neighbor_list_build(&s, 1.5, 0, &nl));
    assert_int_equal(nl.n_pairs, 2); /* both directions, S = 0 */
    assert_true(has_pair(&nl, 0, 1, 0, 0, 0));
    assert_true(has_pair(&nl, 1, 0, 0, 0, 0));
    assert_int_equal(nl.i[0], 0);                          /* grouped by i */
    ZB_ASSERT_OK(zb_neighbor_list_build(&s, 1.0, 0, &nl)); /* strict: at exactly 1.0, none */
    assert_int_equal(nl.n_pairs, 0);
    ZB_ASSERT_OK(zb_neighbor_list_build(&s, 1.0000001, 0, &nl));
    assert_int_equal(nl.n_pairs, 2);
    /* a cell given on non-periodic axes is ignored: the same two pairs */
    double cell[9] = {0.5, 0, 0, 0, 0.5, 0, 0, 0, 0.5};
    s.cell = cell;
    ZB_ASSERT_OK(zb_neighbor_list_build(&s, 1.5, 0, &nl));
    assert_int_equal(nl.n_pairs, 2);
    /* one atom alone, and no atoms */
    s.n_atoms = 1;
    ZB_ASSERT_OK(zb_neighbor_list_build(&s, 10, 0, &nl));
    assert_int_equal(nl.n_pairs, 0);
    s.n_atoms = 0;
    s.positions = NULL;
    ZB_ASSERT_OK(zb_neighbor_list_build(&s, 10, 0, &nl));
    assert_int_equal(nl.n_pairs, 0);
    zb_neighbor_list_free(&nl);
    assert_null(nl.i);
    zb_neighbor_list_free(&nl); /* twice, and NULL */
    zb_neighbor_list_free(NULL);
}

/* One atom in a simple cubic cell (a = 1) with a cutoff of 2.5: its own images S with
 * |S|² < 6.25, i.e. |S|² <= 6. Lattice points by |S|²: 1: 6, 2: 12, 3: 8, 4: 6, 5: 24, 6: 24,
 * so 80 pairs (0, 0, S). */
static void
test_simple_cubic_images(void **state)
{
    (void)state;
    static const int shell[7] = {0, 6, 12, 8, 6, 24, 24};
    double cell[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
    double where[3][3] = {{0, 0, 0}, {0.25, 0.5, 0.75}, {3.3, -1.7, 100.2}}; /* last: outside */
    zb_neighbor_list nl = ZB_NEIGHBOR_LIST_INIT;
    for (int w = 0; w < 3; w++) {
        zb_structure s = {1, where[w], cell, {true, true, true}};
        ZB_ASSERT_OK(zb_neighbor_list_build(&s, 2.5, 0, &nl));
        assert_int_equal(nl.n_pairs, 80);
        int per_shell[7] = {0};
        for (uint64_t e = 0; e < nl.n_pairs; e++) {
            const int64_t *S = nl.cell_shifts + 3 * e;
            assert_int_equal(nl.i[e], 0);
            assert_int_equal(nl.j[e], 0);
            int64_t q = S[0] * S[0] + S[1] * S[1] + S[2] * S[2];
            assert_true(q >= 1 && q <= 6);
            per_shell[q]++;
            assert_true(has_pair(&nl, 0, 0, -S[0], -S[1], -S[2])); /* both directions */
        }
        for (int q = 1; q <= 6; q++) assert_int_equal(per_shell[q], shell[q]);
    }
    /* periodic along x only: the images on a line, |S0| <= 2 */
    double pos[3] = {0.1, 0.2, 0.3};
    zb_structure line = {1, pos, cell, {true, false, false}};
    ZB_ASSERT_OK(zb_neighbor_list_build(&line, 2.5, 0, &nl));
    assert_int_equal(nl.n_pairs, 4);
    for (int64_t x = -2; x <= 2; x++)
        if (x) assert_true(has_pair(&nl, 0, 0, x, 0, 0));
    zb_neighbor_list_free(&nl);
}

/* A hexagonal (oblique, 60°) lattice a = 1 periodic in-plane, with a short NON-periodic c: one
 * atom has 6 neighbours at 1 (S = ±(1,0,0), ±(0,1,0), ±(1,-1,0)) and 6 more at √3 (±(1,1,0),
 * ±(2,-1,0), ±(1,-2,0)); none along c however short it is. */
static void
test_hexagonal_slab(void **state)
{
    (void)state;
    double h = sqrt(3.0) / 2;
    double cell[9] = {1, 0, 0, 0.5, h, 0, 0, 0, 0.3};
    double pos[3] = {0.2, 0.1, 5.0};
    zb_structure s = {1, pos, cell, {true, true, false}};
    zb_neighbor_list nl = ZB_NEIGHBOR_LIST_INIT;
    ZB_ASSERT_OK(zb_neighbor_list_build(&s, 1.1, 0, &nl));
    assert_int_equal(nl.n_pairs, 6);
    static const int64_t first[6][3] = {{1, 0, 0},  {-1, 0, 0}, {0, 1, 0},
                                        {0, -1, 0}, {1, -1, 0}, {-1, 1, 0}};
    for (int k = 0; k < 6; k++)
        assert_true(has_pair(&nl, 0, 0, first[k][0], first[k][1], first[k][2]));
    ZB_ASSERT_OK(zb_neighbor_list_build(&s, 1.8, 0, &nl));
    assert_int_equal(nl.n_pairs, 12);
    static const int64_t second[6][3] = {{1, 1, 0},  {-1, -1, 0}, {2, -1, 0},
                                         {-2, 1, 0}, {1, -2, 0},  {-1, 2, 0}};
    for (int k = 0; k < 6; k++)
        assert_true(has_pair(&nl, 0, 0, second[k][0], second[k][1], second[k][2]));
    /* the slab with c = 0 (common for 2D materials) gives the same list */
    cell[8] = 0;
    ZB_ASSERT_OK(zb_neighbor_list_build(&s, 1.8, 0, &nl));
    assert_int_equal(nl.n_pairs, 12);
    zb_neighbor_list_free(&nl);
}

/* ---- random structures against the reference ----------------------------------------------- */

static void
random_cell(uint64_t *rs, double cell[9], double scale)
{
    for (;;) {
        for (int k = 0; k < 3; k++)
            for (int c = 0; c < 3; c++)
                cell[3 * k + c] = (k == c ? scale : 0) + uniform(rs, -0.45, 0.45) * scale;
        double r[3];
        cross(cell + 3, cell + 6, r);
        double vol = fabs(cell[0] * r[0] + cell[1] * r[1] + cell[2] * r[2]);
        if (vol > 0.2 * scale * scale * scale) return; /* not too flat */
    }
}

static void
check_against_reference(uint64_t n, const double *pos, const double cell[9], const bool pbc[3],
                        double rc, zb_neighbor_list *nl, const char *what)
{
    zb_structure s = {n, pos, cell, {pbc[0], pbc[1], pbc[2]}};
    ZB_ASSERT_OK(zb_neighbor_list_build(&s, rc, 0, nl));
    for (uint64_t e = 1; e < nl->n_pairs; e++) assert_true(nl->i[e - 1] <= nl->i[e]);
    uint64_t m;
    pair *want = brute_force(n, pos, cell, pbc, rc, &m);
    pair *got = sorted_pairs(nl);
    if (m != nl->n_pairs)
        fail_msg("%s: %llu pairs, the reference has %llu", what, (unsigned long long)nl->n_pairs,
                 (unsigned long long)m);
    for (uint64_t e = 0; e < m; e++)
        if (pair_cmp(&got[e], &want[e]))
            fail_msg("%s: pair %llu is (%lld,%lld,[%lld,%lld,%lld]), the reference has "
                     "(%lld,%lld,[%lld,%lld,%lld])",
                     what, (unsigned long long)e, (long long)got[e].i, (long long)got[e].j,
                     (long long)got[e].s[0], (long long)got[e].s[1], (long long)got[e].s[2],
                     (long long)want[e].i, (long long)want[e].j, (long long)want[e].s[0],
                     (long long)want[e].s[1], (long long)want[e].s[2]);
    free(want);
    free(got);
}

/* Triclinic cells, every pbc combination, atoms partly outside the cell, cutoffs from a fifth
 * of the cell to three cells; each list equals the brute-force one exactly. */
static void
test_random_against_brute_force(void **state)
{
    (void)state;
    uint64_t rs = 12345;
    zb_neighbor_list nl = ZB_NEIGHBOR_LIST_INIT;
    uint64_t total = 0;
    for (int trial = 0; trial < 240; trial++) {
        uint64_t n = 1 + rng_next(&rs) % 40;
        double scale = uniform(&rs, 2, 9);
        double cell[9];
        random_cell(&rs, cell, scale);
        bool pbc[3] = {(trial & 1) != 0, (trial & 2) != 0, (trial & 4) != 0};
        double *pos = malloc(3 * n * sizeof *pos);
        assert_non_null(pos);
        for (uint64_t i = 0; i < n; i++) {
            double f[3];
            for (int k = 0; k < 3; k++) f[k] = uniform(&rs, trial % 3 ? 0 : -1.5, 1.5);
            for (int c = 0; c < 3; c++)
                pos[3 * i + c] = f[0] * cell[c] + f[1] * cell[3 + c] + f[2] * cell[6 + c];
        }
        double rc = scale * uniform(&rs, 0.2, trial % 5 == 0 ? 3.0 : 1.2);
        char what[96];
        snprintf(what, sizeof what, "trial %d (n %llu, pbc %d%d%d, rc %.3f)", trial,
                 (unsigned long long)n, pbc[0], pbc[1], pbc[2], rc);
        check_against_reference(n, pos, cell, pbc, rc, &nl, what);
        total += nl.n_pairs;
        free(pos);
    }
    assert_true(total > 100000); /* the trials did find pairs, images among them */
    zb_neighbor_list_free(&nl);
}

/* A dense periodic crystal of 500 atoms (many bins per axis) and a sparse molecule cloud spread
 * over 2 km (far more bins than atoms would be needed: capped), against the reference. */
static void
test_many_bins_and_sparse_cloud(void **state)
{
    (void)state;
    uint64_t rs = 99;
    zb_neighbor_list nl = ZB_NEIGHBOR_LIST_INIT;
    uint64_t n = 500;
    double *pos = malloc(3 * n * sizeof *pos);
    assert_non_null(pos);
    double cell[9] = {20, 0, 0, 3, 19, 0, -2, 1, 21};
    for (uint64_t i = 0; i < n; i++)
        for (int c = 0; c < 3; c++) pos[3 * i + c] = uniform(&rs, 0, 20);
    bool all[3] = {true, true, true}, none[3] = {false, false, false};
    check_against_reference(n, pos, cell, all, 3.1, &nl, "dense crystal");
    assert_true(nl.n_pairs > 3000);
    for (uint64_t i = 0; i < n; i++) {
        double base = (double)(i % 7) * 300.0;
        for (int c = 0; c < 3; c++) pos[3 * i + c] = base + uniform(&rs, 0, 6);
    }
    double zero[9] = {0};
    check_against_reference(n, pos, zero, none, 2.0, &nl, "sparse clusters");
    assert_true(nl.n_pairs > 1000);
    free(pos);
    zb_neighbor_list_free(&nl);
}

/* ---- errors -------------------------------------------------------------------------------- */

static void
test_errors(void **state)
{
    (void)state;
    double pos[12] = {0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1};
    double cell[9] = {3, 0, 0, 0, 3, 0, 0, 0, 3};
    zb_structure s = {4, pos, cell, {true, true, true}};
    zb_neighbor_list nl = ZB_NEIGHBOR_LIST_INIT;
    ZB_ASSERT_OK(zb_neighbor_list_build(&s, 1.5, 0, &nl));
    uint64_t good = nl.n_pairs;
    assert_true(good > 0);

    ZB_ASSERT_ERR(zb_neighbor_list_build(&s, 0, 0, &nl), ZB_E_INVALID, "cutoff");
    assert_int_equal(nl.n_pairs, 0);
    ZB_ASSERT_ERR(zb_neighbor_list_build(&s, -1, 0, &nl), ZB_E_INVALID, "cutoff");
    ZB_ASSERT_ERR(zb_neighbor_list_build(&s, NAN, 0, &nl), ZB_E_INVALID, "cutoff");
    ZB_ASSERT_ERR(zb_neighbor_list_build(&s, INFINITY, 0, &nl), ZB_E_INVALID, "cutoff");
    ZB_ASSERT_ERR(zb_neighbor_list_build(NULL, 1, 0, &nl), ZB_E_INVALID, "NULL");
    ZB_ASSERT_ERR(zb_neighbor_list_build(&s, 1, 0, NULL), ZB_E_INVALID, "NULL");

    pos[7] = NAN; /* atom 2 */
    ZB_ASSERT_ERR(zb_neighbor_list_build(&s, 1.5, 0, &nl), ZB_E_INVALID, "atom 2");
    pos[7] = INFINITY;
    ZB_ASSERT_ERR(zb_neighbor_list_build(&s, 1.5, 0, &nl), ZB_E_INVALID, "atom 2");
    pos[7] = 1;

    cell[4] = 0; /* a periodic lattice vector that is zero */
    ZB_ASSERT_ERR(zb_neighbor_list_build(&s, 1.5, 0, &nl), ZB_E_INVALID, "singular");
    s.pbc[1] = false; /* fine once that axis is not periodic */
    ZB_ASSERT_OK(zb_neighbor_list_build(&s, 1.5, 0, &nl));
    s.pbc[1] = true;
    cell[3] = 6; /* b = 2a: parallel */
    ZB_ASSERT_ERR(zb_neighbor_list_build(&s, 1.5, 0, &nl), ZB_E_INVALID, "singular");
    cell[3] = 0;
    cell[4] = 3;
    double flat[9] = {3, 0, 0, 0, 3, 0, 3, 3, 0}; /* c in the plane of a and b */
    s.cell = flat;
    ZB_ASSERT_ERR(zb_neighbor_list_build(&s, 1.5, 0, &nl), ZB_E_INVALID, "singular");
    s.pbc[2] = false; /* a slab: c unused */
    ZB_ASSERT_OK(zb_neighbor_list_build(&s, 1.5, 0, &nl));
    s.pbc[2] = true;
    s.cell = NULL;
    ZB_ASSERT_ERR(zb_neighbor_list_build(&s, 1.5, 0, &nl), ZB_E_INVALID, "cell");
    s.cell = cell;
    cell[2] = NAN;
    ZB_ASSERT_ERR(zb_neighbor_list_build(&s, 1.5, 0, &nl), ZB_E_INVALID, "cell[0][2]");
    cell[2] = 0;
    pos[0] = 1e30; /* 3e29 cells away */
    ZB_ASSERT_ERR(zb_neighbor_list_build(&s, 1.5, 0, &nl), ZB_E_INVALID, "atom 0");
    pos[0] = 0;

    /* a cap on the pairs, also below a reused list's capacity */
    ZB_ASSERT_ERR(zb_neighbor_list_build(&s, 1.5, good - 1, &nl), ZB_E_OVERFLOW, "max_pairs");
    assert_int_equal(nl.n_pairs, 0);
    ZB_ASSERT_OK(zb_neighbor_list_build(&s, 1.5, good, &nl));
    assert_int_equal(nl.n_pairs, good);
    /* a cutoff across too many planes of a tiny cell */
    double tiny[9] = {1e-3, 0, 0, 0, 1e-3, 0, 0, 0, 1e-3};
    s.cell = tiny;
    ZB_ASSERT_ERR(zb_neighbor_list_build(&s, 1000, 0, &nl), ZB_E_OVERFLOW, "lattice planes");
    /* the list still works after the failures */
    s.cell = cell;
    ZB_ASSERT_OK(zb_neighbor_list_build(&s, 1.5, 0, &nl));
    assert_int_equal(nl.n_pairs, good);
    zb_neighbor_list_free(&nl);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dimer),
        cmocka_unit_test(test_simple_cubic_images),
        cmocka_unit_test(test_hexagonal_slab),
        cmocka_unit_test(test_random_against_brute_force),
        cmocka_unit_test(test_many_bins_and_sparse_cloud),
        cmocka_unit_test(test_errors),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
