/* The multi-dataset sampler: fixed per-batch composition over concatenated children
 * (nvalchemi's MultiDatasetBatchSampler), with per-child streams that are keyed permutation
 * cycles (without replacement) or independent draws (with replacement). Batch g reads
 * positions [g c_i, (g+1) c_i) of child i's stream, so any batch is computed directly. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampler/sampler_int.h"
#include "util/status.h"

typedef struct multi_impl {
    size_t k;
    uint64_t *size, *off, *count; /* per child: length, global offset, samples per batch */
    bool replacement, shuffle;
    uint64_t total; /* S: samples per epoch */
} multi_impl;

static void
multi_destroy(void *p)
{
    multi_impl *m = p;
    if (!m) return;
    free(m->size);
    free(m->off);
    free(m->count);
    free(m);
}

static zb_status
multi_batch(zb_sampler *s, uint64_t g, uint64_t *ids, size_t *n)
{
    multi_impl *m = s->impl;
    size_t pos = 0;
    for (size_t i = 0; i < m->k; i++) {
        uint64_t c = m->count[i], len = m->size[i];
        if (c == 0) continue;
        uint64_t q0 = g * c;
        if (m->replacement && m->shuffle) {
            uint64_t key = zb_stream_key(s->seed, s->epoch, ZB_TAG_CHILDRAW, i, 0);
            for (uint64_t q = q0; q < q0 + c; q++)
                ids[pos++] = m->off[i] + zb_bounded(zb_hash2(key, q), len);
        } else if (m->shuffle) {
            zb_perm perm;
            uint64_t cycle = UINT64_MAX;
            for (uint64_t q = q0; q < q0 + c; q++) {
                if (q / len != cycle) { /* the child ran out: a fresh permutation */
                    cycle = q / len;
                    zb_perm_init(&perm, len,
                                 zb_stream_key(s->seed, s->epoch, ZB_TAG_CHILD, i, cycle));
                }
                ids[pos++] = m->off[i] + zb_perm_apply(&perm, q % len);
            }
        } else {
            for (uint64_t q = q0; q < q0 + c; q++) ids[pos++] = m->off[i] + q % len;
        }
    }
    if (m->shuffle) {
        /* Fisher-Yates over the batch, keyed by (seed, epoch, g) */
        uint64_t x = zb_stream_key(s->seed, s->epoch, ZB_TAG_BATCH, g, 0);
        for (size_t i = pos; i > 1; i--) {
            size_t j = (size_t)zb_bounded(zb_splitmix64(&x), i);
            uint64_t t = ids[i - 1];
            ids[i - 1] = ids[j];
            ids[j] = t;
        }
    }
    /* the epoch's last batch keeps the first S - (G-1) B ids */
    uint64_t start = g * s->batch_size;
    if (m->total - start < pos) pos = (size_t)(m->total - start);
    *n = pos;
    return ZB_OK;
}

static const zb_sampler_ops multi_ops = {
    .name = "multi-dataset",
    .batch = multi_batch,
    .destroy = multi_destroy,
};

/* Largest-remainder apportionment of b slots to rates r[0..k) (ties to the lower index). */
static zb_status
apportion(const double *r, size_t k, uint64_t b, uint64_t *count)
{
    double sum = 0;
    for (size_t i = 0; i < k; i++) {
        if (!isfinite(r[i]) || r[i] < 0)
            return zb_err(ZB_E_INVALID,
                          "multi-dataset sampler: child %zu has ratio %g (must "
                          "be finite and >= 0)",
                          i, r[i]);
        sum += r[i];
    }
    if (!(sum > 0) || !isfinite(sum))
        return zb_err(ZB_E_INVALID,
                      "multi-dataset sampler: the ratios sum to %g (must be a "
                      "positive finite number)",
                      sum);
    uint64_t given = 0;
    for (size_t i = 0; i < k; i++) {
        double raw = r[i] / sum * (double)b;
        count[i] = (uint64_t)floor(raw);
        if (count[i] > b) count[i] = b;
        given += count[i];
    }
    while (given > b) { /* rounding above b: take from the largest */
        size_t big = 0;
        for (size_t i = 1; i < k; i++)
            if (count[i] > count[big]) big = i;
        count[big]--;
        given--;
    }
    /* hand out the rest by decreasing fractional part (each child gets at most one) */
    while (given < b) {
        size_t best = 0;
        double best_frac = -1;
        for (size_t i = 0; i < k; i++) {
            if (r[i] <= 0) continue;
            double frac = r[i] / sum * (double)b - (double)count[i];
            if (frac > best_frac || best_frac < -0.5) {
                best_frac = frac;
                best = i;
            }
        }
        count[best]++;
        given++;
    }
    return ZB_OK;
}

/* ceil(len * b / c) with overflow checking. */
static zb_status
share_len(uint64_t len, uint64_t b, uint64_t c, uint64_t *out)
{
    unsigned __int128 v = (unsigned __int128)len * b;
    v = v / c + (v % c != 0);
    if (v > UINT64_MAX) return zb_err(ZB_E_OVERFLOW, "multi-dataset sampler: epoch length");
    *out = (uint64_t)v;
    return ZB_OK;
}

static zb_status
epoch_total(const zb_multi_sampler_opts *o, const multi_impl *m, uint64_t *total)
{
    const uint64_t b = o->base.batch_size;
    if (o->num_samples) {
        *total = o->num_samples;
        return ZB_OK;
    }
    if (o->epoch_policy == ZB_EPOCH_DATASET_SIZE) {
        uint64_t t = 0;
        for (size_t i = 0; i < m->k; i++)
            if (__builtin_add_overflow(t, m->size[i], &t))
                return zb_err(ZB_E_OVERFLOW, "multi-dataset sampler: sum of child sizes");
        *total = t;
        return ZB_OK;
    }
    if (o->epoch_policy != ZB_EPOCH_MIN_SIZE && o->epoch_policy != ZB_EPOCH_MAX_SIZE)
        return zb_err(ZB_E_INVALID,
                      "multi-dataset sampler: epoch_policy %d is not one of "
                      "DATASET_SIZE, MIN_SIZE, MAX_SIZE",
                      (int)o->epoch_policy);
    bool first = true;
    for (size_t i = 0; i < m->k; i++) {
        if (m->count[i] == 0) continue;
        uint64_t v = 0;
        ZB_TRY(share_len(m->size[i], b, m->count[i], &v));
        if (first || (o->epoch_policy == ZB_EPOCH_MIN_SIZE ? v < *total : v > *total)) *total = v;
        first = false;
    }
    return ZB_OK;
}

zb_status
zb_sampler_new_multi(const zb_multi_sampler_opts *o, zb_sampler **out)
{
    if (!out) return zb_err(ZB_E_INVALID, "multi-dataset sampler: NULL out");
    *out = NULL;
    if (!o) return zb_err(ZB_E_INVALID, "multi-dataset sampler: NULL options");
    ZB_TRY(zb_sampler_check_stream("multi-dataset", &o->base));
    const size_t k = o->num_children;
    const uint64_t b = o->base.batch_size;
    if (k < 1 || !o->child_sizes)
        return zb_err(ZB_E_INVALID, "multi-dataset sampler: needs at least one child size");
    if (k > SIZE_MAX / 64) return zb_err(ZB_E_OVERFLOW, "multi-dataset sampler: %zu children", k);
    if ((o->counts != NULL) + (o->ratios != NULL) + (o->balanced != 0) > 1)
        return zb_err(ZB_E_INVALID, "multi-dataset sampler: give at most one of counts, "
                                    "ratios and balanced");
    zb_status st = ZB_OK;
    double *rates = NULL;
    multi_impl *m = calloc(1, sizeof *m);
    if (!m) return zb_err(ZB_E_NOMEM, "multi-dataset sampler");
    m->k = k;
    m->replacement = o->replacement;
    m->shuffle = o->shuffle;
    m->size = malloc(k * sizeof *m->size);
    m->off = malloc(k * sizeof *m->off);
    m->count = malloc(k * sizeof *m->count);
    rates = malloc(k * sizeof *rates);
    if (!m->size || !m->off || !m->count || !rates) {
        st = zb_err(ZB_E_NOMEM, "multi-dataset sampler: %zu children", k);
        goto fail;
    }
    uint64_t total_len = 0;
    for (size_t i = 0; i < k; i++) {
        m->size[i] = o->child_sizes[i];
        m->off[i] = total_len;
        if (__builtin_add_overflow(total_len, m->size[i], &total_len)) {
            st = zb_err(ZB_E_OVERFLOW, "multi-dataset sampler: sum of child sizes");
            goto fail;
        }
    }
    if (o->counts) {
        uint64_t sum = 0;
        for (size_t i = 0; i < k; i++) {
            m->count[i] = o->counts[i];
            if (__builtin_add_overflow(sum, o->counts[i], &sum)) sum = UINT64_MAX;
        }
        if (sum != b) {
            st = zb_err(ZB_E_INVALID,
                        "multi-dataset sampler: counts sum to %llu, not "
                        "batch_size %llu",
                        (unsigned long long)sum, (unsigned long long)b);
            goto fail;
        }
    } else {
        for (size_t i = 0; i < k; i++)
            rates[i] = o->ratios     ? o->ratios[i]
                       : o->balanced ? (m->size[i] > 0 ? 1.0 : 0.0)
                                     : (double)m->size[i];
        if ((st = apportion(rates, k, b, m->count)) != ZB_OK) goto fail;
    }
    for (size_t i = 0; i < k; i++)
        if (m->count[i] > 0 && m->size[i] == 0) {
            st = zb_err(ZB_E_INVALID,
                        "multi-dataset sampler: child %zu contributes %llu "
                        "samples per batch but has no samples",
                        i, (unsigned long long)m->count[i]);
            goto fail;
        }
    if ((st = epoch_total(o, m, &m->total)) != ZB_OK) goto fail;
    free(rates);
    zb_sampler_opts base = o->base;
    base.n = total_len;
    return zb_sampler_create(&base, &multi_ops, m,
                             zb_sampler_batches_for(m->total, b, base.drop_last), (size_t)b, out);
fail:
    free(rates);
    multi_destroy(m);
    return st;
}

size_t
zb_sampler_child_counts(const zb_sampler *s, uint64_t *counts, size_t cap)
{
    if (!s || s->ops != &multi_ops) return 0;
    const multi_impl *m = s->impl;
    for (size_t i = 0; i < m->k && i < cap; i++) counts[i] = m->count[i];
    return m->k;
}
