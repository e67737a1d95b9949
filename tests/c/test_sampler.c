/* Samplers (DESIGN.md §4): coverage, epochs, distributed splits, exact resume across world
 * sizes, the size-aware guarantee and replacement, multi-dataset policies and shares, block
 * windows, weighted frequencies, and O(1) memory of the random order. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "sampler/sampler_int.h"
#include "support/testutil.h"
#include "zbatch_sampler.h"

/* ---- helpers ------------------------------------------------------------------------------- */

/* A list of batches. */
typedef struct run {
    uint64_t *ids;
    size_t nids, cap;
    size_t *off; /* [nb + 1] */
    size_t nb, bcap;
} run;

static void
run_push(run *r, const uint64_t *ids, size_t n)
{
    if (r->nids + n > r->cap) {
        r->cap = (r->nids + n) * 2 + 64;
        r->ids = realloc(r->ids, r->cap * sizeof *r->ids);
        assert_non_null(r->ids);
    }
    if (r->nb + 2 > r->bcap) {
        r->bcap = r->bcap * 2 + 16;
        r->off = realloc(r->off, r->bcap * sizeof *r->off);
        assert_non_null(r->off);
    }
    if (r->nb == 0) r->off[0] = 0;
    memcpy(r->ids + r->nids, ids, n * sizeof *ids);
    r->nids += n;
    r->off[++r->nb] = r->nids;
}

static void
run_free(run *r)
{
    free(r->ids);
    free(r->off);
    memset(r, 0, sizeof *r);
}

static size_t
run_len(const run *r, size_t b)
{
    return r->off[b + 1] - r->off[b];
}

static const uint64_t *
run_at(const run *r, size_t b)
{
    return r->ids + r->off[b];
}

/* Takes up to `steps` batches (SIZE_MAX: to the end of the epoch); returns how many. */
static size_t
take(zb_sampler *s, run *r, size_t steps)
{
    size_t cap = zb_sampler_max_batch(s), got = 0;
    uint64_t *buf = malloc((cap ? cap : 1) * sizeof *buf);
    assert_non_null(buf);
    while (got < steps) {
        size_t n = 9999;
        ZB_ASSERT_OK(zb_sampler_next(s, buf, cap, &n));
        if (n == 0) break;
        assert_true(n <= cap);
        run_push(r, buf, n);
        got++;
    }
    free(buf);
    return got;
}

static bool
same_batch(const run *a, size_t i, const run *b, size_t j)
{
    return run_len(a, i) == run_len(b, j) &&
           memcmp(run_at(a, i), run_at(b, j), run_len(a, i) * sizeof(uint64_t)) == 0;
}

static uint64_t
rng_next(uint64_t *x)
{
    *x += 0x9e3779b97f4a7c15ULL;
    uint64_t z = *x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double
rng_unit(uint64_t *x)
{
    return ((double)(rng_next(x) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double
rng_normal(uint64_t *x)
{
    double u = rng_unit(x), v = rng_unit(x);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* ---- one factory for every kind ------------------------------------------------------------ */

enum {
    K_SEQ,
    K_RANDOM,
    K_BLOCK,
    K_WEIGHTED,
    K_SIZE,
    K_MULTI,
    K_MULTI_REPL,
    K_MULTI_SAMPLE,
    K_COUNT
};
static const char *const kind_name[K_COUNT] = {"sequential",        "random",      "block",
                                               "weighted",          "size-aware",  "multi",
                                               "multi-replacement", "multi-sample"};

typedef struct cfg {
    int kind;
    uint64_t n, batch;
    bool drop_last;
    uint64_t seed;
    /* block */
    uint64_t block_size, bpw;
    /* weighted */
    const double *weights;
    /* size-aware */
    const uint64_t *atoms, *edges;
    uint64_t max_atoms, max_edges, window;
    /* multi */
    size_t nchild;
    const uint64_t *child_sizes;
    const double *ratios;
    zb_epoch_policy policy;
} cfg;

static zb_status
make(const cfg *c, uint32_t rank, uint32_t world, zb_sampler_uneven u, zb_sampler **out)
{
    zb_sampler_opts base = ZB_SAMPLER_OPTS_DEFAULT;
    base.n = c->n;
    base.batch_size = c->batch;
    base.drop_last = c->drop_last;
    base.seed = c->seed;
    base.rank = rank;
    base.world_size = world;
    base.pad_or_drop = u;
    switch (c->kind) {
    case K_SEQ:
        return zb_sampler_new_sequential(&base, out);
    case K_RANDOM:
        return zb_sampler_new_random(&base, out);
    case K_BLOCK: {
        zb_block_sampler_opts o = ZB_BLOCK_SAMPLER_OPTS_DEFAULT;
        o.base = base;
        o.block_size = c->block_size;
        o.blocks_per_window = c->bpw;
        return zb_sampler_new_block(&o, out);
    }
    case K_WEIGHTED: {
        zb_weighted_sampler_opts o = ZB_WEIGHTED_SAMPLER_OPTS_DEFAULT;
        o.base = base;
        o.weights = c->weights;
        return zb_sampler_new_weighted(&o, out);
    }
    case K_SIZE: {
        zb_size_sampler_opts o = ZB_SIZE_SAMPLER_OPTS_DEFAULT;
        o.base = base;
        o.num_atoms = c->atoms;
        o.max_atoms = c->max_atoms;
        o.num_edges = c->edges;
        o.max_edges = c->max_edges;
        o.window_size = c->window;
        return zb_sampler_new_size_aware(&o, out);
    }
    default: {
        zb_multi_sampler_opts o = ZB_MULTI_SAMPLER_OPTS_DEFAULT;
        o.base = base;
        o.num_children = c->nchild;
        o.child_sizes = c->child_sizes;
        o.ratios = c->ratios;
        o.epoch_policy = c->policy;
        o.replacement = c->kind == K_MULTI_REPL;
        o.mode = c->kind == K_MULTI_SAMPLE ? ZB_MULTI_SAMPLE : ZB_MULTI_BATCH;
        return zb_sampler_new_multi(&o, out);
    }
    }
}

/* The uninterrupted single-rank epoch. */
static void
reference(const cfg *c, uint64_t epoch, run *ref)
{
    zb_sampler *s = NULL;
    ZB_ASSERT_OK(make(c, 0, 1, ZB_SAMPLER_PAD, &s));
    ZB_ASSERT_OK(zb_sampler_set_epoch(s, epoch));
    take(s, ref, SIZE_MAX);
    assert_int_equal(ref->nb, zb_sampler_epoch_batches(s));
    assert_int_equal(ref->nb, zb_sampler_num_batches(s));
    zb_sampler_free(s);
}

/* Steps `world` ranks in lockstep for `steps` steps (SIZE_MAX: to the end), appending their
 * batches to `global` in global order (step-major, rank-minor). Returns the steps taken. */
static size_t
lockstep(zb_sampler **ranks, uint32_t world, run *global, size_t steps)
{
    size_t t = 0;
    for (; t < steps; t++) {
        size_t got = 0;
        for (uint32_t r = 0; r < world; r++) got += take(ranks[r], global, 1);
        if (got == 0) break;
        assert_int_equal(got, world); /* equal batch counts: all ranks end together */
    }
    return t;
}

/* Checks the distributed split of one epoch against the reference for world sizes 1..5, pad
 * and drop: rank r's k-th batch is global batch k W + r, padded from the epoch start. */
static void
check_split(const cfg *c)
{
    run ref = {0};
    reference(c, 3, &ref);
    const size_t G = ref.nb;
    for (uint32_t world = 1; world <= 5; world++) {
        for (int u = 0; u < 2; u++) {
            zb_sampler *ranks[5] = {0};
            for (uint32_t r = 0; r < world; r++) {
                ZB_ASSERT_OK(make(c, r, world, (zb_sampler_uneven)u, &ranks[r]));
                ZB_ASSERT_OK(zb_sampler_set_epoch(ranks[r], 3));
            }
            run global = {0};
            size_t steps = lockstep(ranks, world, &global, SIZE_MAX);
            size_t want = u == ZB_SAMPLER_DROP ? G / world : (G + world - 1) / world;
            if (steps != want)
                fail_msg("%s W=%u %s: %zu steps, want %zu", kind_name[c->kind], world,
                         u ? "drop" : "pad", steps, want);
            assert_int_equal(zb_sampler_num_batches(ranks[0]), want);
            for (size_t j = 0; j < global.nb; j++) {
                size_t src = j < G ? j : (j - G) % G;
                if (!same_batch(&global, j, &ref, src))
                    fail_msg("%s W=%u %s: global batch %zu differs from the reference",
                             kind_name[c->kind], world, u ? "drop" : "pad", j);
            }
            for (uint32_t r = 0; r < world; r++) zb_sampler_free(ranks[r]);
            run_free(&global);
        }
    }
    run_free(&ref);
}

/* Every id of [0, n) exactly once in the batches of `r`. */
static void
check_exactly_once(const run *r, uint64_t n)
{
    assert_int_equal(r->nids, n);
    uint8_t *seen = calloc(n ? n : 1, 1);
    assert_non_null(seen);
    for (size_t i = 0; i < r->nids; i++) {
        assert_true(r->ids[i] < n);
        if (seen[r->ids[i]]) fail_msg("id %llu twice", (unsigned long long)r->ids[i]);
        seen[r->ids[i]] = 1;
    }
    free(seen);
}

/* No id of [0, n) twice in the batches of `r`. */
static void
check_at_most_once(const run *r, uint64_t n)
{
    uint8_t *seen = calloc(n ? n : 1, 1);
    assert_non_null(seen);
    for (size_t i = 0; i < r->nids; i++) {
        assert_true(r->ids[i] < n);
        if (seen[r->ids[i]]) fail_msg("id %llu twice", (unsigned long long)r->ids[i]);
        seen[r->ids[i]] = 1;
    }
    free(seen);
}

/* Per-rank view: disjoint and complete without padding (drop with W | G), complete with
 * duplicates only from the pad. */
static void
check_ranks_cover(const cfg *c, uint32_t world)
{
    run ref = {0};
    reference(c, 0, &ref);
    const size_t G = ref.nb;
    uint32_t *count = calloc(c->n, sizeof *count);
    assert_non_null(count);
    size_t nb0 = 0, total = 0;
    for (uint32_t r = 0; r < world; r++) {
        zb_sampler *s = NULL;
        ZB_ASSERT_OK(make(c, r, world, ZB_SAMPLER_PAD, &s));
        run mine = {0};
        take(s, &mine, SIZE_MAX);
        if (r == 0) nb0 = mine.nb;
        assert_int_equal(mine.nb, nb0); /* equal batch counts */
        for (size_t i = 0; i < mine.nids; i++) count[mine.ids[i]]++;
        total += mine.nids;
        run_free(&mine);
        zb_sampler_free(s);
    }
    assert_int_equal(nb0, (G + world - 1) / world);
    /* union complete */
    size_t dups = 0;
    for (uint64_t i = 0; i < c->n; i++) {
        if (count[i] == 0)
            fail_msg("%s W=%u: id %llu missing", kind_name[c->kind], world, (unsigned long long)i);
        dups += count[i] - 1;
    }
    /* duplicates are exactly the pad: the first nb0*W - G global batches again */
    size_t pad = nb0 * world - G, pad_ids = 0;
    for (size_t j = 0; j < pad; j++) pad_ids += run_len(&ref, j % G);
    assert_int_equal(dups, pad_ids);
    assert_int_equal(total, c->n + pad_ids);
    free(count);
    run_free(&ref);
}

/* Stops after k steps on w1 ranks, restores on w2 ranks in new samplers, and checks that the
 * concatenated global output equals the uninterrupted run. */
static void
check_resume(const cfg *c, uint32_t w1, uint32_t w2, size_t k)
{
    run ref = {0};
    reference(c, 5, &ref);
    const size_t G = ref.nb;
    zb_sampler *a[8] = {0}, *b[8] = {0};
    run global = {0};
    for (uint32_t r = 0; r < w1; r++) {
        ZB_ASSERT_OK(make(c, r, w1, ZB_SAMPLER_PAD, &a[r]));
        ZB_ASSERT_OK(zb_sampler_set_epoch(a[r], 5));
    }
    assert_int_equal(lockstep(a, w1, &global, k), k);
    zb_sampler_state st, st_r;
    zb_sampler_get_state(a[0], &st);
    assert_true(st.position == k * w1 && st.epoch == 5 && st.seed == c->seed);
    for (uint32_t r = 1; r < w1; r++) {
        zb_sampler_get_state(a[r], &st_r);
        assert_true(st_r.position == st.position); /* every rank saves the same state */
    }
    for (uint32_t r = 0; r < w1; r++) zb_sampler_free(a[r]);
    for (uint32_t r = 0; r < w2; r++) {
        cfg c2 = *c;
        c2.seed = c->seed + 1000; /* the restored state brings the seed back */
        ZB_ASSERT_OK(make(&c2, r, w2, ZB_SAMPLER_PAD, &b[r]));
        ZB_ASSERT_OK(zb_sampler_restore(b[r], &st));
    }
    lockstep(b, w2, &global, SIZE_MAX);
    if (global.nb < G)
        fail_msg("%s resume %u->%u: %zu global batches, want >= %zu", kind_name[c->kind], w1, w2,
                 global.nb, G);
    for (size_t j = 0; j < global.nb; j++) {
        size_t src = j < G ? j : (j - G) % G;
        if (!same_batch(&global, j, &ref, src))
            fail_msg("%s resume %u->%u after %zu: global batch %zu differs", kind_name[c->kind], w1,
                     w2, k, j);
    }
    /* only the pad of the second world size exceeds the epoch */
    assert_true(global.nb - G < w2);
    zb_sampler_get_state(b[0], &st);
    assert_true(st.position == global.nb);
    for (uint32_t r = 0; r < w2; r++) zb_sampler_free(b[r]);
    run_free(&global);
    run_free(&ref);
}

/* Skewed sizes shared by several tests. */
static uint64_t g_atoms[6000], g_edges[6000];
static double g_weights[3000];
static const uint64_t g_children[3] = {130, 470, 77};

static void
fill_sizes(void)
{
    uint64_t x = 42;
    for (size_t i = 0; i < 6000; i++) {
        /* lognormal atoms, heavy-tailed (Pareto) edges */
        double a = exp(3.0 + 0.9 * rng_normal(&x));
        g_atoms[i] = (uint64_t)a + 1;
        if (g_atoms[i] > 900) g_atoms[i] = 900;
        double pareto = 8.0 / pow(rng_unit(&x), 1.0 / 1.3);
        g_edges[i] = (uint64_t)pareto;
        if (g_edges[i] > 20000) g_edges[i] = 20000;
    }
    for (size_t i = 0; i < 3000; i++) g_weights[i] = 0.5 + (double)(i % 7);
}

static cfg
cfg_for(int kind)
{
    cfg c = {
        .kind = kind, .n = 1003, .batch = 16, .seed = 7, .block_size = 10, .bpw = 4, .window = 300};
    if (kind == K_WEIGHTED) c.weights = g_weights;
    if (kind == K_SIZE) {
        c.n = 3000;
        c.batch = 24;
        c.atoms = g_atoms;
        c.edges = g_edges;
        c.max_atoms = 1000;
        c.max_edges = 25000;
    }
    if (kind == K_MULTI || kind == K_MULTI_REPL || kind == K_MULTI_SAMPLE) {
        c.nchild = 3;
        c.child_sizes = g_children;
        c.n = 130 + 470 + 77;
    }
    return c;
}

/* ---- tests ----------------------------------------------------------------------------------- */

static void
test_perm_is_bijection(void **state)
{
    (void)state;
    const uint64_t sizes[] = {1, 2, 3, 4, 5, 17, 64, 1000, 4097, 65537};
    for (size_t t = 0; t < sizeof sizes / sizeof *sizes; t++) {
        uint64_t n = sizes[t];
        zb__perm p;
        zb__perm_init(&p, n, 0x1234 + t);
        uint8_t *seen = calloc(n, 1);
        size_t fixed = 0;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t y = zb__perm_apply(&p, i);
            assert_true(y < n);
            assert_false(seen[y]);
            seen[y] = 1;
            assert_true(zb__perm_invert(&p, y) == i);
            fixed += y == i;
        }
        if (n >= 1000) assert_true(fixed < 20); /* ~1 expected for a random permutation */
        free(seen);
    }
}

/* The run form gives exactly the images of one call per position, from any start and for any
 * length (the four-wide passes, the cycle walk of the lanes that leave [0, n), the tail). */
static void
test_perm_run_equals_single_applications(void **state)
{
    (void)state;
    const uint64_t sizes[] = {1, 2, 3, 5, 16, 17, 1000, 4096, 4097};
    for (size_t t = 0; t < sizeof sizes / sizeof *sizes; t++) {
        uint64_t n = sizes[t];
        zb__perm p;
        zb__perm_init(&p, n, 0x99 + t);
        uint64_t *out = malloc(n * sizeof *out);
        const uint64_t starts[] = {0, 1, n / 3, n - 1};
        for (size_t k = 0; k < 4; k++) {
            uint64_t x0 = starts[k], len = n - x0;
            zb__perm_apply_run(&p, x0, (size_t)len, out);
            for (uint64_t i = 0; i < len; i++) assert_true(out[i] == zb__perm_apply(&p, x0 + i));
        }
        free(out);
    }
}

static void
test_sequential_batches(void **state)
{
    (void)state;
    cfg c = {.kind = K_SEQ, .n = 10, .batch = 3};
    run r = {0};
    reference(&c, 0, &r);
    assert_int_equal(r.nb, 4);
    const uint64_t want[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    assert_int_equal(r.nids, 10);
    assert_memory_equal(r.ids, want, sizeof want);
    assert_int_equal(run_len(&r, 3), 1);
    run_free(&r);
    c.drop_last = true;
    reference(&c, 0, &r);
    assert_int_equal(r.nb, 3);
    assert_int_equal(r.nids, 9);
    run_free(&r);
}

static void
test_cover_exactly_once(void **state)
{
    (void)state;
    const int kinds[] = {K_SEQ, K_RANDOM, K_BLOCK, K_SIZE, K_MULTI_SAMPLE};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        cfg c = cfg_for(kinds[i]);
        for (uint64_t e = 0; e < 3; e++) {
            run r = {0};
            reference(&c, e, &r);
            check_exactly_once(&r, c.n);
            run_free(&r);
        }
        for (uint32_t w = 2; w <= 4; w++) check_ranks_cover(&c, w);
    }
}

static void
test_drop_is_disjoint(void **state)
{
    (void)state;
    const int kinds[] = {K_RANDOM, K_BLOCK, K_SIZE};
    for (size_t i = 0; i < 3; i++) {
        cfg c = cfg_for(kinds[i]);
        uint8_t *seen = calloc(c.n, 1);
        size_t nb0 = SIZE_MAX;
        for (uint32_t r = 0; r < 3; r++) {
            zb_sampler *s = NULL;
            ZB_ASSERT_OK(make(&c, r, 3, ZB_SAMPLER_DROP, &s));
            run mine = {0};
            take(s, &mine, SIZE_MAX);
            if (nb0 == SIZE_MAX) nb0 = mine.nb;
            assert_int_equal(mine.nb, nb0);
            assert_int_equal(mine.nb, zb_sampler_epoch_batches(s) / 3);
            for (size_t k = 0; k < mine.nids; k++) {
                assert_false(seen[mine.ids[k]]);
                seen[mine.ids[k]] = 1;
            }
            run_free(&mine);
            zb_sampler_free(s);
        }
        free(seen);
    }
}

static void
test_split_matches_global_order(void **state)
{
    (void)state;
    for (int k = 0; k < K_COUNT; k++) {
        cfg c = cfg_for(k);
        check_split(&c);
    }
}

static void
test_epochs_and_seeds(void **state)
{
    (void)state;
    const int kinds[] = {K_RANDOM, K_BLOCK,      K_WEIGHTED,    K_SIZE,
                         K_MULTI,  K_MULTI_REPL, K_MULTI_SAMPLE};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        cfg c = cfg_for(kinds[i]);
        run e0 = {0}, e0b = {0}, e1 = {0}, s1 = {0};
        reference(&c, 0, &e0);
        reference(&c, 0, &e0b);
        reference(&c, 1, &e1);
        cfg c2 = c;
        c2.seed = 8;
        reference(&c2, 0, &s1);
        /* same (seed, epoch): identical; another epoch or seed: a different order */
        assert_int_equal(e0.nids, e0b.nids);
        assert_memory_equal(e0.ids, e0b.ids, e0.nids * sizeof(uint64_t));
        size_t diff1 = 0, diff2 = 0;
        for (size_t j = 0; j < e0.nids && j < e1.nids; j++) diff1 += e0.ids[j] != e1.ids[j];
        for (size_t j = 0; j < e0.nids && j < s1.nids; j++) diff2 += e0.ids[j] != s1.ids[j];
        if (diff1 < e0.nids / 2 || diff2 < e0.nids / 2)
            fail_msg("%s: epochs differ at %zu, seeds at %zu of %zu positions", kind_name[kinds[i]],
                     diff1, diff2, e0.nids);
        run_free(&e0);
        run_free(&e0b);
        run_free(&e1);
        run_free(&s1);
    }
}

static void
test_set_epoch_rewinds(void **state)
{
    (void)state;
    cfg c = cfg_for(K_BLOCK);
    zb_sampler *s = NULL;
    ZB_ASSERT_OK(make(&c, 1, 2, ZB_SAMPLER_PAD, &s));
    ZB_ASSERT_OK(zb_sampler_set_epoch(s, 4));
    run a = {0}, b = {0};
    take(s, &a, 3);
    ZB_ASSERT_OK(zb_sampler_set_epoch(s, 4));
    assert_int_equal(zb_sampler_remaining(s), zb_sampler_num_batches(s));
    take(s, &b, 3);
    assert_true(a.nb == 3 && b.nb == 3 && same_batch(&a, 2, &b, 2) && same_batch(&a, 0, &b, 0));
    zb_sampler_state st;
    zb_sampler_get_state(s, &st);
    assert_true(st.epoch == 4 && st.position == 6);
    run_free(&a);
    run_free(&b);
    zb_sampler_free(s);
}

static void
test_resume_across_world_sizes(void **state)
{
    (void)state;
    for (int k = 0; k < K_COUNT; k++) {
        cfg c = cfg_for(k);
        check_resume(&c, 4, 3, 3);
        check_resume(&c, 4, 4, 5);
        check_resume(&c, 1, 5, 7);
        check_resume(&c, 3, 2, 1);
        check_resume(&c, 2, 1, 0);
    }
}

static void
test_resume_past_the_end(void **state)
{
    (void)state;
    cfg c = cfg_for(K_RANDOM);
    zb_sampler *s = NULL;
    ZB_ASSERT_OK(make(&c, 0, 2, ZB_SAMPLER_PAD, &s));
    zb_sampler_state st = {.seed = 7, .epoch = 2, .position = 1000};
    ZB_ASSERT_OK(zb_sampler_restore(s, &st));
    assert_int_equal(zb_sampler_remaining(s), 0);
    uint64_t buf[16];
    size_t n = 5;
    ZB_ASSERT_OK(zb_sampler_next(s, buf, 16, &n));
    assert_int_equal(n, 0);
    ZB_ASSERT_ERR(zb_sampler_next(s, buf, 15, &n), ZB_E_INVALID, "cap");
    ZB_ASSERT_ERR(zb_sampler_restore(s, NULL), ZB_E_INVALID, NULL);
    zb_sampler_free(s);
    zb_sampler_free(NULL);
}

static void
test_bad_options(void **state)
{
    (void)state;
    zb_sampler *s = (zb_sampler *)1;
    zb_sampler_opts o = ZB_SAMPLER_OPTS_DEFAULT;
    o.n = 10;
    o.rank = 2;
    o.world_size = 2;
    ZB_ASSERT_ERR(zb_sampler_new_random(&o, &s), ZB_E_INVALID, "rank 2");
    assert_null(s);
    o.rank = 0;
    o.batch_size = 0;
    ZB_ASSERT_ERR(zb_sampler_new_sequential(&o, &s), ZB_E_INVALID, "batch_size");
    zb_block_sampler_opts bo = ZB_BLOCK_SAMPLER_OPTS_DEFAULT;
    bo.base.n = 10;
    bo.block_size = 0;
    ZB_ASSERT_ERR(zb_sampler_new_block(&bo, &s), ZB_E_INVALID, "block_size");
    double w[3] = {1, -2, 3};
    zb_weighted_sampler_opts wo = ZB_WEIGHTED_SAMPLER_OPTS_DEFAULT;
    wo.base.n = 3;
    wo.weights = w;
    ZB_ASSERT_ERR(zb_sampler_new_weighted(&wo, &s), ZB_E_INVALID, "sample 1");
    w[1] = NAN;
    ZB_ASSERT_ERR(zb_sampler_new_weighted(&wo, &s), ZB_E_INVALID, "sample 1");
    w[0] = w[1] = w[2] = 0;
    ZB_ASSERT_ERR(zb_sampler_new_weighted(&wo, &s), ZB_E_INVALID, "sum");
    uint64_t sizes[2] = {3, 4}, cnt[2] = {3, 2};
    zb_multi_sampler_opts mo = ZB_MULTI_SAMPLER_OPTS_DEFAULT;
    mo.base.batch_size = 4;
    mo.num_children = 2;
    mo.child_sizes = sizes;
    mo.counts = cnt;
    ZB_ASSERT_ERR(zb_sampler_new_multi(&mo, &s), ZB_E_INVALID, "sum to 5");
    sizes[1] = 0;
    cnt[1] = 1;
    ZB_ASSERT_ERR(zb_sampler_new_multi(&mo, &s), ZB_E_INVALID, "child 1");
    assert_null(s);
}

/* ---- size-aware ---------------------------------------------------------------------------- */

static void
check_limits(const run *r, const uint64_t *atoms, uint64_t max_atoms, const uint64_t *edges,
             uint64_t max_edges, size_t max_batch)
{
    for (size_t b = 0; b < r->nb; b++) {
        uint64_t sa = 0, se = 0;
        const uint64_t *ids = run_at(r, b);
        assert_true(run_len(r, b) >= 1 && run_len(r, b) <= max_batch);
        for (size_t i = 0; i < run_len(r, b); i++) {
            sa += atoms[ids[i]];
            se += edges ? edges[ids[i]] : 0;
        }
        if (sa > max_atoms || (edges && se > max_edges))
            fail_msg("batch %zu: %llu atoms (max %llu), %llu edges (max %llu)", b,
                     (unsigned long long)sa, (unsigned long long)max_atoms, (unsigned long long)se,
                     (unsigned long long)max_edges);
    }
}

static void
test_size_aware_never_exceeds(void **state)
{
    (void)state;
    /* a range of limits over lognormal atoms and Pareto edges, 6000 samples, several epochs,
     * windows and world sizes */
    const uint64_t amax[] = {900, 1500, 5000, 20000, 2000, 900};
    const uint64_t emax[] = {20000, 30000, 100000, 400000, 50000, 1000000};
    const uint64_t bmax[] = {4, 32, 128, 7, 1000, 500};
    const uint64_t win[] = {1, 500, 8192, 999, 2000, 8192};
    for (size_t t = 0; t < 6; t++) {
        zb_size_sampler_opts o = ZB_SIZE_SAMPLER_OPTS_DEFAULT;
        o.base.n = 6000;
        o.base.batch_size = bmax[t];
        o.base.seed = t;
        o.num_atoms = g_atoms;
        o.max_atoms = amax[t];
        o.num_edges = g_edges;
        o.max_edges = emax[t];
        o.window_size = win[t];
        uint64_t total_atoms = 0, total_edges = 0;
        for (size_t i = 0; i < 6000; i++) {
            total_atoms += g_atoms[i];
            total_edges += g_edges[i];
        }
        for (uint64_t e = 0; e < 2; e++) {
            zb_sampler *s = NULL;
            ZB_ASSERT_OK(zb_sampler_new_size_aware(&o, &s));
            ZB_ASSERT_OK(zb_sampler_set_epoch(s, e));
            run r = {0};
            take(s, &r, SIZE_MAX);
            check_limits(&r, g_atoms, amax[t], g_edges, emax[t], bmax[t]);
            check_exactly_once(&r, 6000);
            if (t >= 4) {
                /* the atoms limit binds here: the fullest batch comes within 2% of it */
                uint64_t fullest = 0;
                for (size_t b = 0; b < r.nb; b++) {
                    uint64_t sa = 0;
                    for (size_t i = 0; i < run_len(&r, b); i++) sa += g_atoms[run_at(&r, b)[i]];
                    if (sa > fullest) fullest = sa;
                }
                assert_true(fullest >= amax[t] - amax[t] / 50);
            }
            /* packing quality: within 5% (plus one batch per window) of the lower bound
             * max(sum atoms / max_atoms, sum edges / max_edges, n / max_batch_size) */
            uint64_t lb = total_atoms / amax[t];
            if (total_edges / emax[t] > lb) lb = total_edges / emax[t];
            if (6000 / bmax[t] > lb) lb = 6000 / bmax[t];
            if (win[t] > 1 && (double)r.nb > 1.05 * (double)lb + 6000.0 / (double)win[t] + 1)
                fail_msg("limits %zu: %zu batches for a lower bound of %llu", t, r.nb,
                         (unsigned long long)lb);
            run_free(&r);
            zb_sampler_free(s);
        }
    }
}

/* Chunk-aware packing (block_size): every window is whole blocks of consecutive ids (the short
 * block last), its batches mix several of them, the limits hold, every id comes once, and the
 * block order changes with the epoch. */
static void
test_size_aware_blocks(void **state)
{
    (void)state;
    enum { NS = 1003, K = 10, WIN = 40 }; /* window_size 35 rounds up to 4 blocks */
    zb_size_sampler_opts o = ZB_SIZE_SAMPLER_OPTS_DEFAULT;
    o.base.n = NS;
    o.base.batch_size = 16;
    o.num_atoms = g_atoms;
    o.max_atoms = 1500;
    o.window_size = 35;
    o.block_size = K;
    o.base.seed = 3;
    for (uint64_t e = 0; e < 2; e++) {
        zb_sampler *s = NULL;
        ZB_ASSERT_OK(zb_sampler_new_size_aware(&o, &s));
        ZB_ASSERT_OK(zb_sampler_set_epoch(s, e));
        run r = {0};
        take(s, &r, SIZE_MAX);
        check_limits(&r, g_atoms, 1500, NULL, 0, 16);
        check_exactly_once(&r, NS);
        /* batches never cross a window: the running count meets every multiple of WIN, and
         * each window holds whole blocks (the last: the short block alone) */
        size_t seen = 0, mixed = 0, w0 = 0;
        for (size_t b = 0; b < r.nb; b++) {
            uint64_t lo = UINT64_MAX, hi = 0;
            for (size_t i = 0; i < run_len(&r, b); i++) {
                uint64_t blk = run_at(&r, b)[i] / K;
                lo = blk < lo ? blk : lo;
                hi = blk > hi ? blk : hi;
            }
            mixed += hi > lo;
            seen += run_len(&r, b);
            assert_true(seen / WIN == (seen - run_len(&r, b)) / WIN || seen % WIN == 0);
            if (seen % WIN != 0 && seen != NS) continue;
            size_t count[NS / K + 1] = {0};
            for (size_t i = w0; i < seen; i++) count[r.ids[i] / K]++;
            size_t blocks = 0;
            for (size_t k = 0; k <= NS / K; k++) {
                if (!count[k]) continue;
                blocks++;
                assert_int_equal(count[k], k == NS / K ? NS % K : K);
            }
            assert_int_equal(blocks, (seen - w0 + K - 1) / K);
            if (count[NS / K]) assert_int_equal(seen, NS); /* the short block, last */
            w0 = seen;
        }
        assert_int_equal(seen, NS);
        assert_true(mixed * 2 > r.nb); /* most batches hold samples of two blocks or more */
        run_free(&r);
        zb_sampler_free(s);
    }
    /* another epoch, another block order */
    zb_sampler *a = NULL, *b = NULL;
    ZB_ASSERT_OK(zb_sampler_new_size_aware(&o, &a));
    ZB_ASSERT_OK(zb_sampler_new_size_aware(&o, &b));
    ZB_ASSERT_OK(zb_sampler_set_epoch(b, 1));
    run ra = {0}, rb = {0};
    take(a, &ra, SIZE_MAX);
    take(b, &rb, SIZE_MAX);
    size_t same = 0;
    for (size_t i = 0; i + K <= NS; i += K) same += ra.ids[i] / K == rb.ids[i] / K;
    assert_true(same < NS / K / 4);
    run_free(&ra);
    run_free(&rb);
    zb_sampler_free(a);
    zb_sampler_free(b);
}

static void
test_size_aware_over_limit_fails(void **state)
{
    (void)state;
    uint64_t atoms[5] = {3, 4, 51, 2, 1}, edges[5] = {1, 1, 1, 1, 99};
    zb_size_sampler_opts o = ZB_SIZE_SAMPLER_OPTS_DEFAULT;
    o.base.n = 5;
    o.base.batch_size = 4;
    o.num_atoms = atoms;
    o.max_atoms = 50;
    zb_sampler *s = (zb_sampler *)1;
    ZB_ASSERT_ERR(zb_sampler_new_size_aware(&o, &s), ZB_E_INVALID, "sample 2 has 51 atoms");
    assert_true(zbt_mentions("max_atoms = 50"));
    assert_null(s);
    atoms[2] = 50;
    o.num_edges = edges;
    o.max_edges = 98;
    ZB_ASSERT_ERR(zb_sampler_new_size_aware(&o, &s), ZB_E_INVALID, "sample 4 has 99 edges");
    o.max_edges = 99;
    ZB_ASSERT_OK(zb_sampler_new_size_aware(&o, &s));
    zb_sampler_free(s);
    o.num_edges = NULL;
    ZB_ASSERT_ERR(zb_sampler_new_size_aware(&o, &s), ZB_E_INVALID, "NULL");
}

static void
test_size_aware_replacement(void **state)
{
    (void)state;
    const size_t n = 2000;
    zb_size_sampler_opts o = ZB_SIZE_SAMPLER_OPTS_DEFAULT;
    o.base.n = n;
    o.base.batch_size = 16;
    o.base.rank = 1;
    o.base.world_size = 2;
    o.num_atoms = g_atoms;
    o.max_atoms = 1200;
    o.num_edges = g_edges;
    o.max_edges = 40000;
    o.window_size = 512;
    zb_sampler *s = NULL;
    ZB_ASSERT_OK(zb_sampler_new_size_aware(&o, &s));
    /* what this rank would see without replacements */
    run plain = {0};
    take(s, &plain, SIZE_MAX);
    uint8_t *mine = calloc(n, 1), *used = calloc(n, 1);
    for (size_t i = 0; i < plain.nids; i++) mine[plain.ids[i]] = 1;
    ZB_ASSERT_OK(zb_sampler_set_epoch(s, 0));
    run got = {0};
    take(s, &got, 5);
    for (size_t i = 0; i < got.nids; i++) used[got.ids[i]] = 1;
    uint64_t rng = 9;
    size_t nrepl = 0;
    for (int k = 0; k < 200; k++) {
        uint64_t ra = 5 + rng_next(&rng) % 120, re = 10 + rng_next(&rng) % 400, id = 0;
        bool found = false;
        ZB_ASSERT_OK(zb_sampler_request_replacement(s, ra, re, &id, &found));
        if (!found) {
            /* nothing unused of this rank fits: brute force agrees */
            for (size_t i = 0; i < n; i++)
                if (mine[i] && !used[i]) assert_false(g_atoms[i] <= ra && g_edges[i] <= re);
            continue;
        }
        assert_true(id < n && mine[id] && !used[id]);
        assert_true(g_atoms[id] <= ra && g_edges[id] <= re);
        /* it is the best fit: no unused fitting sample has more atoms */
        for (size_t i = 0; i < n; i++)
            if (mine[i] && !used[i] && g_atoms[i] <= ra && g_edges[i] <= re)
                assert_true(g_atoms[i] <= g_atoms[id]);
        used[id] = 1;
        nrepl++;
    }
    assert_true(nrepl > 50);
    /* the rest of the epoch never yields a replacement or a repeat */
    run rest = {0};
    take(s, &rest, SIZE_MAX);
    for (size_t i = 0; i < rest.nids; i++) {
        assert_false(used[rest.ids[i]]);
        used[rest.ids[i]] = 1;
    }
    check_limits(&rest, g_atoms, 1200, g_edges, 40000, 16);
    /* together: exactly this rank's samples */
    for (size_t i = 0; i < n; i++) assert_int_equal(used[i], mine[i]);
    /* drained: nothing left */
    uint64_t id;
    bool found = true;
    ZB_ASSERT_OK(zb_sampler_request_replacement(s, 100000, 1000000, &id, &found));
    assert_false(found);
    /* another kind refuses */
    zb_sampler *r = NULL;
    zb_sampler_opts ro = ZB_SAMPLER_OPTS_DEFAULT;
    ro.n = 10;
    ZB_ASSERT_OK(zb_sampler_new_random(&ro, &r));
    ZB_ASSERT_ERR(zb_sampler_request_replacement(r, 1, 1, &id, &found), ZB_E_TYPE, "random");
    zb_sampler_free(r);
    free(mine);
    free(used);
    run_free(&plain);
    run_free(&got);
    run_free(&rest);
    zb_sampler_free(s);
}

/* ---- multi-dataset --------------------------------------------------------------------------- */

static zb_sampler *
multi(const uint64_t *sizes, size_t k, uint64_t batch, const double *ratios, bool balanced,
      zb_epoch_policy policy, bool replacement, bool drop_last)
{
    zb_multi_sampler_opts o = ZB_MULTI_SAMPLER_OPTS_DEFAULT;
    o.base.batch_size = batch;
    o.base.drop_last = drop_last;
    o.base.seed = 3;
    o.num_children = k;
    o.child_sizes = sizes;
    o.ratios = ratios;
    o.balanced = balanced;
    o.epoch_policy = policy;
    o.replacement = replacement;
    zb_sampler *s = NULL;
    ZB_ASSERT_OK(zb_sampler_new_multi(&o, &s));
    return s;
}

/* nvalchemi's MultiDatasetBatchSampler epoch lengths (the Python tests check the same grid
 * against nvalchemi itself): m_i = ceil(n_i / c_i) with replacement, floor without. */
static void
test_multi_policies(void **state)
{
    (void)state;
    const uint64_t sizes[2] = {100, 300};
    struct {
        zb_epoch_policy p;
        bool repl;
        uint64_t batches;
    } cases[] = {
        {ZB_EPOCH_DATASET_SIZE, true, 40}, /* ceil(400 / 10) */
        {ZB_EPOCH_MIN_SIZE, true, 20},     /* min(100 / 5, 300 / 5) */
        {ZB_EPOCH_MAX_SIZE, true, 60},
        {ZB_EPOCH_DATASET_SIZE, false, 20}, /* without replacement: min_size */
        {ZB_EPOCH_MIN_SIZE, false, 20},
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        zb_sampler *s = multi(sizes, 2, 10, NULL, true, cases[t].p, cases[t].repl, false);
        uint64_t cnt[2];
        assert_int_equal(zb_sampler_child_counts(s, cnt, 2), 2);
        assert_true(cnt[0] == 5 && cnt[1] == 5);
        run r = {0};
        take(s, &r, SIZE_MAX);
        assert_int_equal(r.nb, cases[t].batches);
        assert_int_equal(r.nids, cases[t].batches * 10); /* every batch full: 5 + 5 */
        for (size_t b = 0; b < r.nb; b++) {
            size_t c0 = 0;
            assert_int_equal(run_len(&r, b), 10);
            for (size_t i = 0; i < run_len(&r, b); i++) c0 += run_at(&r, b)[i] < 100;
            assert_int_equal(c0, 5);
        }
        if (!cases[t].repl) check_at_most_once(&r, 400);
        run_free(&r);
        zb_sampler_free(s);
    }
    /* proportional 2.46 / 7.54 -> 2 / 8; with replacement ceil(407 / 10) full batches */
    const uint64_t odd[2] = {100, 307};
    zb_sampler *s = multi(odd, 2, 10, NULL, false, ZB_EPOCH_DATASET_SIZE, true, false);
    run r = {0};
    take(s, &r, SIZE_MAX);
    assert_int_equal(r.nb, 41);
    assert_int_equal(run_len(&r, 40), 10);
    uint64_t cnt[2];
    zb_sampler_child_counts(s, cnt, 2);
    assert_true(cnt[0] == 2 && cnt[1] == 8);
    run_free(&r);
    zb_sampler_free(s);
    /* without replacement: min(100 / 2, 307 / 8) = 38 */
    s = multi(odd, 2, 10, NULL, false, ZB_EPOCH_DATASET_SIZE, false, false);
    assert_int_equal(zb_sampler_epoch_batches(s), 38);
    zb_sampler_free(s);
    /* min_size with unequal shares: ceil(100 / 3) = 34 */
    const double rat[2] = {0.3, 0.7};
    s = multi(sizes, 2, 10, rat, false, ZB_EPOCH_MIN_SIZE, true, false);
    zb_sampler_child_counts(s, cnt, 2);
    assert_true(cnt[0] == 3 && cnt[1] == 7);
    assert_int_equal(zb_sampler_epoch_batches(s), 34);
    zb_sampler_free(s);
}

/* nvalchemi's refusals: max_size that would oversample without replacement, more batches than
 * the children hold, an epoch of 0 batches, a rate on an empty child. */
static void
test_multi_errors(void **state)
{
    (void)state;
    const uint64_t sizes[2] = {100, 300}, tiny[2] = {3, 300}, empty[2] = {100, 0};
    zb_multi_sampler_opts o = ZB_MULTI_SAMPLER_OPTS_DEFAULT;
    o.base.batch_size = 10;
    o.num_children = 2;
    o.child_sizes = sizes;
    o.balanced = true;
    o.replacement = false;
    o.epoch_policy = ZB_EPOCH_MAX_SIZE;
    zb_sampler *s = NULL;
    ZB_ASSERT_ERR(zb_sampler_new_multi(&o, &s), ZB_E_INVALID, "max_size needs replacement");
    o.epoch_policy = ZB_EPOCH_MIN_SIZE;
    o.num_batches = 21;
    ZB_ASSERT_ERR(zb_sampler_new_multi(&o, &s), ZB_E_INVALID, "at most 20 complete batches");
    o.num_batches = 0;
    o.child_sizes = tiny;
    ZB_ASSERT_ERR(zb_sampler_new_multi(&o, &s), ZB_E_INVALID, "0 batches");
    o.replacement = true; /* with replacement a small child is drawn again */
    ZB_ASSERT_OK(zb_sampler_new_multi(&o, &s));
    assert_int_equal(zb_sampler_epoch_batches(s), 1); /* min(ceil(3 / 5), ceil(300 / 5)) */
    zb_sampler_free(s);
    s = NULL;
    o.child_sizes = empty;
    ZB_ASSERT_ERR(zb_sampler_new_multi(&o, &s), ZB_E_INVALID, "child 1 has a positive rate");
    o.balanced = false;
    o.mode = ZB_MULTI_SAMPLE;
    o.child_sizes = sizes;
    o.replacement = false;
    const double half[2] = {1, 1}; /* 200 of child 0's 100 */
    o.ratios = half;
    ZB_ASSERT_ERR(zb_sampler_new_multi(&o, &s), ZB_E_INVALID, "child 0 cannot give 200");
    assert_null(s);
}

/* MultiDatasetSampler: S ids per epoch, exactly S_i of child i (largest remainder) without
 * replacement or shuffle, each id once without replacement; without shuffle nvalchemi's order
 * (child 0's share, then child 1's, local ids 0, 1, ... cycled). */
static void
test_multi_per_sample(void **state)
{
    (void)state;
    const uint64_t sizes[3] = {50, 0, 40};
    const double rat[3] = {2, 0, 1};
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        for (int repl = 0; repl < 2; repl++) {
            zb_multi_sampler_opts o = ZB_MULTI_SAMPLER_OPTS_DEFAULT;
            o.base.batch_size = 8;
            o.base.seed = 5;
            o.mode = ZB_MULTI_SAMPLE;
            o.num_children = 3;
            o.child_sizes = sizes;
            o.ratios = rat;
            o.num_samples = repl ? 120 : 60; /* 80 + 40 with replacement, 40 + 20 without */
            o.replacement = repl;
            o.shuffle = shuffle;
            zb_sampler *s = NULL;
            ZB_ASSERT_OK(zb_sampler_new_multi(&o, &s));
            run r = {0};
            take(s, &r, SIZE_MAX);
            assert_int_equal(r.nids, o.num_samples);
            assert_int_equal(r.nb, (o.num_samples + 7) / 8);
            size_t c0 = 0;
            for (size_t i = 0; i < r.nids; i++) {
                assert_true(r.ids[i] < 90);
                c0 += r.ids[i] < 50;
                if (!shuffle) { /* nvalchemi's order */
                    uint64_t want =
                        i < 2 * o.num_samples / 3 ? i % 50 : 50 + (i - 2 * o.num_samples / 3) % 40;
                    assert_int_equal(r.ids[i], want);
                }
            }
            if (!(shuffle && repl)) assert_int_equal(c0, 2 * o.num_samples / 3);
            if (!repl) check_at_most_once(&r, 90);
            run_free(&r);
            zb_sampler_free(s);
        }
    }
}

static void
test_multi_shares(void **state)
{
    (void)state;
    const uint64_t sizes[2] = {5000, 2000};
    const double rat[2] = {0.7, 0.3};
    for (int repl = 0; repl < 2; repl++) {
        zb_sampler *s = multi(sizes, 2, 64, rat, false, ZB_EPOCH_DATASET_SIZE, repl, false);
        run r = {0};
        take(s, &r, SIZE_MAX);
        size_t c0 = 0;
        for (size_t i = 0; i < r.nids; i++) c0 += r.ids[i] < 5000;
        double share = (double)c0 / (double)r.nids;
        double sigma = sqrt(0.7 * 0.3 / (double)r.nids);
        if (fabs(share - 0.7) > 3 * sigma)
            fail_msg("share of child 0: %.4f, want 0.7 +- %.4f", share, 3 * sigma);
        /* ids stay inside their children */
        for (size_t i = 0; i < r.nids; i++) assert_true(r.ids[i] < 7000);
        if (repl) {
            /* draws are uniform inside child 1: chi-square over 20 bins of 100 ids */
            double bins[20] = {0}, m = 0;
            for (size_t i = 0; i < r.nids; i++)
                if (r.ids[i] >= 5000) {
                    bins[(r.ids[i] - 5000) / 100]++;
                    m++;
                }
            double chi = 0;
            for (int b = 0; b < 20; b++) chi += pow(bins[b] - m / 20, 2) / (m / 20);
            assert_true(chi < 45.3); /* 19 dof, p = 0.001 */
        }
        run_free(&r);
        zb_sampler_free(s);
    }
}

/* ---- block --------------------------------------------------------------------------------- */

static void
test_block_windows(void **state)
{
    (void)state;
    /* 1007 rows: 100 blocks of 10 and one of 7; windows of 4 blocks */
    const uint64_t n = 1007, bs = 10, bpw = 4, nblocks = 101;
    for (uint64_t e = 0; e < 4; e++) {
        cfg c = {.kind = K_BLOCK, .n = n, .batch = 32, .seed = 11, .block_size = bs, .bpw = bpw};
        run r = {0};
        reference(&c, e, &r);
        check_exactly_once(&r, n);
        uint32_t have[101] = {0};
        uint64_t in_window[4] = {0};
        size_t nwin_blocks = 0, windows = 0, same_adjacent = 0, pairs = 0;
        size_t first_block_of_window[32], ascending = 0;
        size_t start = 0;
        for (size_t i = 0; i < r.nids; i++) {
            uint64_t b = r.ids[i] / bs;
            if (have[b] == 0) {
                /* a new block: the window must not hold more than bpw */
                if (nwin_blocks == bpw)
                    fail_msg("window %zu spans > %llu blocks", windows, (unsigned long long)bpw);
                in_window[nwin_blocks++] = b;
            }
            have[b]++;
            if (i > start) {
                pairs++;
                same_adjacent += r.ids[i] / bs == r.ids[i - 1] / bs;
            }
            /* the window closes when it holds bpw whole blocks (or the stream ends) */
            bool whole = true;
            for (size_t k = 0; k < nwin_blocks; k++) {
                uint64_t len = in_window[k] == nblocks - 1 ? n - (nblocks - 1) * bs : bs;
                if (have[in_window[k]] != len) whole = false;
            }
            if (whole && (nwin_blocks == bpw || i + 1 == r.nids)) {
                /* rows inside the window are not in block order */
                bool sorted = true;
                for (size_t k = start + 1; k <= i; k++) sorted &= r.ids[k] > r.ids[k - 1];
                assert_false(sorted);
                if (windows < 32) first_block_of_window[windows] = in_window[0];
                windows++;
                nwin_blocks = 0;
                start = i + 1;
            }
        }
        assert_int_equal(nwin_blocks, 0); /* the stream ended on a window boundary */
        assert_int_equal(windows, (nblocks + bpw - 1) / bpw);
        /* shuffled rows: adjacent rows share a block ~ 9/39 of the time, not ~ 36/39 */
        double frac = (double)same_adjacent / (double)pairs;
        if (frac > 0.4) fail_msg("adjacent rows share a block %.2f of the time", frac);
        /* shuffled blocks: the windows' blocks are not in ascending order */
        for (size_t w = 1; w < 26; w++)
            ascending += first_block_of_window[w] > first_block_of_window[w - 1];
        assert_true(ascending < 22);
        run_free(&r);
    }
}

static void
test_block_peer_mapping_shapes(void **state)
{
    (void)state;
    /* one block per window and block_size 1 degenerate to a random permutation; a single
     * window of all blocks shuffles everything; both cover exactly once */
    const uint64_t bss[] = {1, 7, 1000, 3};
    const uint64_t bpws[] = {1, 1, 1, 10000};
    for (size_t t = 0; t < 4; t++) {
        cfg c = {.kind = K_BLOCK,
                 .n = 997,
                 .batch = 10,
                 .seed = 2,
                 .block_size = bss[t],
                 .bpw = bpws[t]};
        run r = {0};
        reference(&c, 1, &r);
        check_exactly_once(&r, 997);
        if (bss[t] == 7 && bpws[t] == 1) {
            /* a window is one block: every run of 7 (the short block aside) is one block */
            size_t i = 0;
            while (i < r.nids) {
                uint64_t b = r.ids[i] / 7, len = b == 142 ? 997 - 142 * 7 : 7;
                for (size_t k = 0; k < len; k++) assert_true(r.ids[i + k] / 7 == b);
                i += len;
            }
        }
        run_free(&r);
    }
}

/* ---- weighted ------------------------------------------------------------------------------ */

static void
test_weighted_frequencies(void **state)
{
    (void)state;
    const size_t n = 20, draws = 200000;
    double w[20];
    for (size_t i = 0; i < n; i++) w[i] = (double)(i + 1);
    w[7] = 0; /* never drawn */
    double total = 0;
    for (size_t i = 0; i < n; i++) total += w[i];
    for (int block = 0; block < 2; block++) {
        zb_weighted_sampler_opts o = ZB_WEIGHTED_SAMPLER_OPTS_DEFAULT;
        o.base.n = n;
        o.base.batch_size = 1000;
        o.base.seed = 5;
        o.weights = w;
        o.num_samples = draws;
        o.block_size = block ? 4 : 0;
        o.block_draws = block ? 8 : 0;
        zb_sampler *s = NULL;
        ZB_ASSERT_OK(zb_sampler_new_weighted(&o, &s));
        assert_int_equal(zb_sampler_num_batches(s), 200);
        run r = {0};
        take(s, &r, SIZE_MAX);
        assert_int_equal(r.nids, draws);
        double cnt[20] = {0};
        for (size_t i = 0; i < r.nids; i++) cnt[r.ids[i]]++;
        assert_true(cnt[7] == 0);
        double chi = 0;
        for (size_t i = 0; i < n; i++) {
            if (w[i] == 0) continue;
            double e = (double)draws * w[i] / total;
            chi += (cnt[i] - e) * (cnt[i] - e) / e;
        }
        if (chi > 43.8) fail_msg("block %d: chi-square %.1f over 18 dof", block, chi); /* p=.001 */
        if (block) {
            /* runs of 8 consecutive draws come from one block of 4 rows */
            for (size_t i = 0; i < r.nids; i++) assert_true(r.ids[i] / 4 == r.ids[i - i % 8] / 4);
        }
        run_free(&r);
        zb_sampler_free(s);
    }
}

static void
test_weighted_class_balanced(void **state)
{
    (void)state;
    /* classes of 900, 90 and 10 samples, and 50 without a class (-1) */
    static int64_t codes[1050];
    for (size_t i = 0; i < 1050; i++) codes[i] = i < 900 ? 0 : i < 990 ? 1 : i < 1000 ? 2 : -1;
    const double cw[3] = {2, 1, 1};
    for (int variant = 0; variant < 3; variant++) {
        zb_weighted_sampler_opts o = ZB_WEIGHTED_SAMPLER_OPTS_DEFAULT;
        o.base.n = 1050;
        o.base.batch_size = 256;
        o.base.seed = 17;
        o.class_codes = codes;
        o.num_samples = 30000;
        if (variant == 1) {
            o.class_weights = cw;
            o.num_class_weights = 3;
        }
        if (variant == 2) o.block_size = 50;
        zb_sampler *s = NULL;
        ZB_ASSERT_OK(zb_sampler_new_weighted(&o, &s));
        run r = {0};
        take(s, &r, SIZE_MAX);
        double cls[3] = {0};
        for (size_t i = 0; i < r.nids; i++) {
            assert_true(codes[r.ids[i]] >= 0);
            cls[codes[r.ids[i]]]++;
        }
        const double want[3][3] = {
            {1. / 3, 1. / 3, 1. / 3}, {.5, .25, .25}, {1. / 3, 1. / 3, 1. / 3}};
        for (int c = 0; c < 3; c++) {
            /* with block locality the 50 draws of a run share a block: the spread is that of
             * 600 runs of 50, not of 30000 independent draws */
            double p = want[variant][c], e = 30000 * p;
            double sd = variant == 2 ? 50 * sqrt(600 * p * (1 - p)) : sqrt(30000 * p * (1 - p));
            if (fabs(cls[c] - e) > 5 * sd)
                fail_msg("variant %d class %d: %.0f draws, want %.0f +- %.0f", variant, c, cls[c],
                         e, 5 * sd);
        }
        run_free(&r);
        zb_sampler_free(s);
    }
    codes[3] = (int64_t)1 << 40;
    zb_weighted_sampler_opts o = ZB_WEIGHTED_SAMPLER_OPTS_DEFAULT;
    o.base.n = 1050;
    o.class_codes = codes;
    zb_sampler *s = NULL;
    ZB_ASSERT_ERR(zb_sampler_new_weighted(&o, &s), ZB_E_INVALID, "sample 3");
    codes[3] = 0;
    o.class_weights = cw;
    o.num_class_weights = 2;
    ZB_ASSERT_ERR(zb_sampler_new_weighted(&o, &s), ZB_E_INVALID, "class_weights");
}

/* ---- random at scale ----------------------------------------------------------------------- */

static int
u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static long
max_rss_kb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

static void
test_random_huge_n(void **state)
{
    (void)state;
    const uint64_t n = 1000000000000ULL; /* 10^12: an id array would be 8 TB */
    long rss0 = max_rss_kb();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    zb_sampler_opts o = ZB_SAMPLER_OPTS_DEFAULT;
    o.n = n;
    o.batch_size = 4096;
    o.seed = 99;
    o.world_size = 8;
    o.rank = 5;
    zb_sampler *s = NULL;
    ZB_ASSERT_OK(zb_sampler_new_random(&o, &s));
    ZB_ASSERT_OK(zb_sampler_set_epoch(s, 12345));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    assert_true(ms < 50);
    assert_true(zb_sampler_num_batches(s) == (n / 4096 + 1 + 7) / 8);
    run r = {0};
    take(s, &r, 8);
    assert_int_equal(r.nids, 8 * 4096);
    /* valid, distinct, spread over the whole range */
    uint64_t *sorted = malloc(r.nids * sizeof *sorted);
    memcpy(sorted, r.ids, r.nids * sizeof *sorted);
    size_t high = 0;
    for (size_t i = 0; i < r.nids; i++) {
        assert_true(sorted[i] < n);
        high += sorted[i] >= n / 2;
    }
    qsort(sorted, r.nids, sizeof *sorted, u64_cmp);
    for (size_t i = 1; i < r.nids; i++) assert_true(sorted[i] != sorted[i - 1]);
    free(sorted);
    /* half of the ids in the upper half of [0, n), within 5 sigma */
    double sd = sqrt((double)r.nids * 0.25);
    assert_true(fabs((double)high - (double)r.nids / 2) < 5 * sd);
    run_free(&r);
    zb_sampler_free(s);
    assert_true(max_rss_kb() - rss0 < 64 * 1024);
}

int
main(void)
{
    fill_sizes();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_perm_is_bijection),
        cmocka_unit_test(test_perm_run_equals_single_applications),
        cmocka_unit_test(test_sequential_batches),
        cmocka_unit_test(test_cover_exactly_once),
        cmocka_unit_test(test_drop_is_disjoint),
        cmocka_unit_test(test_split_matches_global_order),
        cmocka_unit_test(test_epochs_and_seeds),
        cmocka_unit_test(test_set_epoch_rewinds),
        cmocka_unit_test(test_resume_across_world_sizes),
        cmocka_unit_test(test_resume_past_the_end),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_size_aware_never_exceeds),
        cmocka_unit_test(test_size_aware_blocks),
        cmocka_unit_test(test_size_aware_over_limit_fails),
        cmocka_unit_test(test_size_aware_replacement),
        cmocka_unit_test(test_multi_policies),
        cmocka_unit_test(test_multi_errors),
        cmocka_unit_test(test_multi_per_sample),
        cmocka_unit_test(test_multi_shares),
        cmocka_unit_test(test_block_windows),
        cmocka_unit_test(test_block_peer_mapping_shapes),
        cmocka_unit_test(test_weighted_frequencies),
        cmocka_unit_test(test_weighted_class_balanced),
        cmocka_unit_test(test_random_huge_n),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
