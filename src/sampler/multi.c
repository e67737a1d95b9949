/* The multi-dataset samplers: several children concatenated behind one id space, with
 * nvalchemi's two semantics (zbatch_sampler.h):
 * - ZB_MULTI_BATCH (MultiDatasetBatchSampler): every batch has c_i samples of child i. Batch g
 *   reads positions [g c_i, (g+1) c_i) of child i's stream: a keyed permutation of the child
 *   (never exhausted: without replacement the epoch is at most floor(n_i / c_i) batches), an
 *   independent draw per position (replacement, shuffle), or 0, 1, ... cycled (no shuffle).
 * - ZB_MULTI_SAMPLE (MultiDatasetSampler): S ids per epoch, each from a child chosen per
 *   sample. With replacement and shuffle every position draws its child (alias table over the
 *   rates) and a local id on its own. Otherwise the epoch holds exactly count_i ids of child i
 *   (largest remainder over S): stream position p maps through a keyed permutation of [0, S)
 *   to x, whose block of [first_i, first_i + count_i) names the child and whose rank in it
 *   the local id (through the child's permutation). Without shuffle both permutations are
 *   the identity, which is nvalchemi's order exactly.
 * Either way any batch is computed directly from (seed, epoch, g), as exact resume needs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampler/sampler_int.h"
#include "util/status.h"
#include "util/search.h"

typedef struct multi_impl {
    size_t k;
    zb_multi_mode mode;
    uint64_t *size, *off; /* per child: length, global offset */
    uint64_t *count;      /* per child: samples per batch (BATCH) or per epoch (SAMPLE) */
    uint64_t *first;      /* SAMPLE: the child's first position in the mixed stream */
    double *rate;         /* SAMPLE: normalised rates, for the alias table */
    zb__perm *perm;       /* [k + 1]: each child's permutation, then the mixing one */
    zb__alias alias;      /* SAMPLE with replacement and shuffle: the child of a draw */
    bool replacement, shuffle;
    uint64_t total; /* SAMPLE: ids per epoch */
} multi_impl;

static void
multi_destroy(void *p)
{
    multi_impl *m = p;
    if (!m) return;
    free(m->size);
    free(m->off);
    free(m->count);
    free(m->first);
    free(m->rate);
    free(m->perm);
    zb__alias_free(&m->alias);
    free(m);
}

static zb_status
multi_plan(zb_sampler *s)
{
    multi_impl *m = s->impl;
    if (!m->shuffle) return ZB_OK;
    for (size_t i = 0; i < m->k; i++)
        if (m->size[i] > 0)
            zb__perm_init(&m->perm[i], m->size[i],
                          zb__stream_key(s->seed, s->epoch, ZB_TAG_CHILD, i, 0));
    if (m->mode == ZB_MULTI_SAMPLE && m->total > 0)
        zb__perm_init(&m->perm[m->k], m->total,
                      zb__stream_key(s->seed, s->epoch, ZB_TAG_MIX, 0, 0));
    return ZB_OK;
}

/* Local id number q of child i's stream (see the file comment). */
static uint64_t
child_draw(const zb_sampler *s, const multi_impl *m, size_t i, uint64_t q)
{
    uint64_t len = m->size[i];
    if (m->replacement && m->shuffle)
        return zb__bounded(zb__hash2(zb__stream_key(s->seed, s->epoch, ZB_TAG_CHILDRAW, i, 0), q),
                           len);
    return m->shuffle ? zb__perm_apply(&m->perm[i], q % len) : q % len;
}

static void
shuffle_batch(const zb_sampler *s, uint64_t g, uint64_t *ids, size_t n)
{
    /* Fisher-Yates keyed by (seed, epoch, g) */
    uint64_t x = zb__stream_key(s->seed, s->epoch, ZB_TAG_BATCH, g, 0);
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)zb__bounded(zb__splitmix64(&x), i);
        uint64_t t = ids[i - 1];
        ids[i - 1] = ids[j];
        ids[j] = t;
    }
}

static zb_status
batch_fixed(zb_sampler *s, uint64_t g, uint64_t *ids, size_t *n)
{
    multi_impl *m = s->impl;
    size_t pos = 0;
    for (size_t i = 0; i < m->k; i++) {
        uint64_t c = m->count[i];
        if (m->shuffle && !m->replacement) { /* g c + c <= n_i: one permutation, read in a run */
            zb__perm_apply_run(&m->perm[i], g * c, (size_t)c, ids + pos);
            for (uint64_t q = 0; q < c; q++) ids[pos + q] += m->off[i];
            pos += (size_t)c;
            continue;
        }
        for (uint64_t q = g * c; q < g * c + c; q++)
            ids[pos++] = m->off[i] + child_draw(s, m, i, q);
    }
    if (m->shuffle) shuffle_batch(s, g, ids, pos);
    *n = pos;
    return ZB_OK;
}

/* The child whose block [first_i, first_i + count_i) holds x. */
static size_t
block_of(const multi_impl *m, uint64_t x)
{
    return zb__last_le(m->first, m->k, x); /* first[k] = total */
}

static zb_status
batch_mixed(zb_sampler *s, uint64_t g, uint64_t *ids, size_t *n)
{
    multi_impl *m = s->impl;
    uint64_t p0 = g * s->batch_size;
    uint64_t p1 = m->total - p0 < s->batch_size ? m->total : p0 + s->batch_size;
    if (m->replacement && m->shuffle) {
        uint64_t key = zb__stream_key(s->seed, s->epoch, ZB_TAG_MIX, 1, 0);
        for (uint64_t p = p0; p < p1; p++) {
            size_t i = (size_t)zb__alias_draw(m->alias.prob, m->alias.alias, m->k,
                                              zb__hash2(key, 2 * p), zb__hash2(key, 2 * p + 1));
            ids[p - p0] = m->off[i] + child_draw(s, m, i, p);
        }
    } else {
        for (uint64_t p = p0; p < p1; p++) {
            uint64_t x = m->shuffle ? zb__perm_apply(&m->perm[m->k], p) : p;
            size_t i = block_of(m, x);
            ids[p - p0] = m->off[i] + child_draw(s, m, i, x - m->first[i]);
        }
    }
    *n = (size_t)(p1 - p0);
    return ZB_OK;
}

static const zb__sampler_ops multi_ops = {
    .name = "multi-dataset",
    .plan_epoch = multi_plan,
    .batch = batch_fixed,
    .destroy = multi_destroy,
};

static const zb__sampler_ops mixed_ops = {
    .name = "multi-dataset (per sample)",
    .plan_epoch = multi_plan,
    .batch = batch_mixed,
    .destroy = multi_destroy,
};

/* Normalised rates: ratios, equal rates (balanced) or the child sizes; nvalchemi's checks. */
static zb_status
normalise_rates(const zb_multi_sampler_opts *o, const multi_impl *m, double *r)
{
    double sum = 0;
    for (size_t i = 0; i < m->k; i++) {
        r[i] = o->ratios ? o->ratios[i] : o->balanced ? 1.0 : (double)m->size[i];
        if (!isfinite(r[i]) || r[i] < 0)
            return zb__err(ZB_E_INVALID,
                           "multi-dataset sampler: child %zu has rate %g (must be finite and "
                           ">= 0)",
                           i, r[i]);
        sum += r[i];
    }
    if (!(sum > 0) || !isfinite(sum))
        return zb__err(ZB_E_INVALID,
                       "multi-dataset sampler: the rates sum to %g (at least one must be "
                       "positive)",
                       sum);
    for (size_t i = 0; i < m->k; i++) {
        if (r[i] > 0 && m->size[i] == 0)
            return zb__err(ZB_E_INVALID,
                           "multi-dataset sampler: child %zu has a positive rate but no samples",
                           i);
        r[i] /= sum;
    }
    return ZB_OK;
}

/* Largest remainder: floor(r_i b) each, then one more to the largest fractional parts (ties
 * to the lower index), as nvalchemi's _counts_from_weights; r is normalised. */
static void
apportion(const double *r, size_t k, uint64_t b, uint64_t *count)
{
    uint64_t given = 0;
    for (size_t i = 0; i < k; i++) {
        double raw = r[i] * (double)b;
        count[i] = raw >= (double)b ? b : (uint64_t)floor(raw);
        given += count[i];
    }
    while (given < b) {
        size_t best = k;
        double best_frac = 0;
        for (size_t i = 0; i < k; i++) {
            double frac = r[i] * (double)b - (double)count[i];
            if (r[i] > 0 && frac >= 0 && (best == k || frac > best_frac)) {
                best_frac = frac;
                best = i;
            }
        }
        if (best == k) break; /* every positive rate already rounded up */
        count[best]++;
        given++;
    }
}

/* ceil(a / b) (up) or floor. */
static uint64_t
div_round(uint64_t a, uint64_t b, bool up)
{
    return a / b + (up && a % b != 0);
}

/* nvalchemi's epoch length (MultiDatasetBatchSampler): from epoch_policy over the children
 * with c_i > 0, with n_i / c_i rounded up (replacement) or down (without), and the checks that
 * an epoch without replacement never runs a child out. */
static zb_status
epoch_batches(const zb_multi_sampler_opts *o, const multi_impl *m, uint64_t *out)
{
    const uint64_t b = o->base.batch_size;
    uint64_t lo = UINT64_MAX, hi = 0, total = 0;
    for (size_t i = 0; i < m->k; i++) {
        total += m->size[i]; /* the sum was overflow-checked */
        if (m->count[i] == 0) continue;
        uint64_t v = div_round(m->size[i], m->count[i], m->replacement);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    uint64_t g = o->num_batches;
    if (g == 0) {
        switch (o->epoch_policy) {
        case ZB_EPOCH_DATASET_SIZE:
            g = m->replacement ? div_round(total, b, true) : lo;
            break;
        case ZB_EPOCH_MIN_SIZE:
            g = lo;
            break;
        case ZB_EPOCH_MAX_SIZE:
            if (!m->replacement && hi > lo)
                return zb__err(ZB_E_INVALID,
                               "multi-dataset sampler: epoch_policy max_size needs "
                               "replacement when smaller children would need oversampling "
                               "(%llu against %llu batches)",
                               (unsigned long long)hi, (unsigned long long)lo);
            g = hi;
            break;
        default:
            return zb__err(ZB_E_INVALID,
                           "multi-dataset sampler: epoch_policy %d is not one of "
                           "DATASET_SIZE, MIN_SIZE, MAX_SIZE",
                           (int)o->epoch_policy);
        }
    }
    if (!m->replacement && g > lo)
        return zb__err(ZB_E_INVALID,
                       "multi-dataset sampler: without replacement the children hold at most "
                       "%llu complete batches, not %llu",
                       (unsigned long long)lo, (unsigned long long)g);
    if (g < 1)
        return zb__err(ZB_E_INVALID, "multi-dataset sampler: the epoch has 0 batches (a child "
                                     "holds fewer samples than one batch takes)");
    if (g > UINT64_MAX / b) /* stream positions g c_i must not wrap */
        return zb__err(ZB_E_OVERFLOW, "multi-dataset sampler: %llu batches of %llu",
                       (unsigned long long)g, (unsigned long long)b);
    *out = g;
    return ZB_OK;
}

/* The fixed per-batch composition c_i (BATCH mode). */
static zb_status
batch_counts(const zb_multi_sampler_opts *o, multi_impl *m, double *rates)
{
    const uint64_t b = o->base.batch_size;
    if (!o->counts) {
        ZB_TRY(normalise_rates(o, m, rates));
        apportion(rates, m->k, b, m->count);
    } else {
        for (size_t i = 0; i < m->k; i++) m->count[i] = o->counts[i];
    }
    uint64_t sum = 0;
    for (size_t i = 0; i < m->k; i++)
        if (__builtin_add_overflow(sum, m->count[i], &sum)) sum = UINT64_MAX;
    if (sum != b)
        return zb__err(ZB_E_INVALID,
                       "multi-dataset sampler: counts sum to %llu, not batch_size %llu",
                       (unsigned long long)sum, (unsigned long long)b);
    for (size_t i = 0; i < m->k; i++)
        if (m->count[i] > 0 && m->size[i] == 0)
            return zb__err(ZB_E_INVALID,
                           "multi-dataset sampler: child %zu contributes %llu samples per "
                           "batch but has no samples",
                           i, (unsigned long long)m->count[i]);
    return ZB_OK;
}

/* The per-epoch counts and the blocks of the mixed stream (SAMPLE mode). */
static zb_status
sample_counts(const zb_multi_sampler_opts *o, multi_impl *m, uint64_t total_len)
{
    m->total = o->num_samples ? o->num_samples : total_len;
    if (m->total == 0) return zb__err(ZB_E_INVALID, "multi-dataset sampler: 0 samples per epoch");
    ZB_TRY(normalise_rates(o, m, m->rate));
    apportion(m->rate, m->k, m->total, m->count);
    m->first[0] = 0;
    for (size_t i = 0; i < m->k; i++) {
        if (!m->replacement && m->count[i] > m->size[i])
            return zb__err(ZB_E_INVALID,
                           "multi-dataset sampler: without replacement child %zu cannot give "
                           "%llu samples (it has %llu)",
                           i, (unsigned long long)m->count[i], (unsigned long long)m->size[i]);
        m->first[i + 1] = m->first[i] + m->count[i];
    }
    if (m->replacement && m->shuffle) return zb__alias_build(&m->alias, m->rate, m->k);
    return ZB_OK;
}

zb_status
zb_sampler_new_multi(const zb_multi_sampler_opts *o, zb_sampler **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "multi-dataset sampler: NULL out");
    *out = NULL;
    if (!o) return zb__err(ZB_E_INVALID, "multi-dataset sampler: NULL options");
    ZB_TRY(zb__sampler_check_stream("multi-dataset", &o->base));
    const size_t k = o->num_children;
    const uint64_t b = o->base.batch_size;
    if (k < 1 || !o->child_sizes)
        return zb__err(ZB_E_INVALID, "multi-dataset sampler: needs at least one child size");
    if (k > SIZE_MAX / 64) return zb__err(ZB_E_OVERFLOW, "multi-dataset sampler: %zu children", k);
    if (o->mode != ZB_MULTI_BATCH && o->mode != ZB_MULTI_SAMPLE)
        return zb__err(ZB_E_INVALID, "multi-dataset sampler: mode %d is not BATCH or SAMPLE",
                       (int)o->mode);
    if ((o->counts != NULL) + (o->ratios != NULL) + (o->balanced != 0) > 1)
        return zb__err(ZB_E_INVALID, "multi-dataset sampler: give at most one of counts, "
                                     "ratios and balanced");
    if (o->mode == ZB_MULTI_SAMPLE && o->counts)
        return zb__err(ZB_E_INVALID, "multi-dataset sampler: counts are per batch (BATCH mode)");
    zb_status st = ZB_OK;
    multi_impl *m = calloc(1, sizeof *m);
    if (!m) return zb__err(ZB_E_NOMEM, "multi-dataset sampler");
    m->k = k;
    m->mode = o->mode;
    m->replacement = o->replacement;
    m->shuffle = o->shuffle;
    m->size = malloc(k * sizeof *m->size);
    m->off = malloc(k * sizeof *m->off);
    m->count = malloc(k * sizeof *m->count);
    m->first = malloc((k + 1) * sizeof *m->first);
    m->rate = malloc(k * sizeof *m->rate);
    m->perm = calloc(k + 1, sizeof *m->perm);
    if (!m->size || !m->off || !m->count || !m->first || !m->rate || !m->perm) {
        st = zb__err(ZB_E_NOMEM, "multi-dataset sampler: %zu children", k);
        goto fail;
    }
    uint64_t total_len = 0;
    for (size_t i = 0; i < k; i++) {
        m->size[i] = o->child_sizes[i];
        m->off[i] = total_len;
        if (__builtin_add_overflow(total_len, m->size[i], &total_len)) {
            st = zb__err(ZB_E_OVERFLOW, "multi-dataset sampler: sum of child sizes");
            goto fail;
        }
    }
    zb_sampler_opts base = o->base;
    base.n = total_len;
    if (o->mode == ZB_MULTI_SAMPLE) {
        if ((st = sample_counts(o, m, total_len)) != ZB_OK) goto fail;
        return zb__sampler_create(&base, &mixed_ops, m,
                                  zb__sampler_batches_for(m->total, b, base.drop_last), (size_t)b,
                                  out);
    }
    uint64_t batches = 0;
    if ((st = batch_counts(o, m, m->rate)) != ZB_OK ||
        (st = epoch_batches(o, m, &batches)) != ZB_OK)
        goto fail;
    return zb__sampler_create(&base, &multi_ops, m, batches, (size_t)b, out);
fail:
    multi_destroy(m);
    return st;
}

size_t
zb_sampler_child_counts(const zb_sampler *s, uint64_t *counts, size_t cap)
{
    if (!s || (s->ops != &multi_ops && s->ops != &mixed_ops)) return 0;
    const multi_impl *m = s->impl;
    for (size_t i = 0; i < m->k && i < cap; i++) counts[i] = m->count[i];
    return m->k;
}
