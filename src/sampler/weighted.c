/* The weighted sampler: independent draws with replacement, from per-sample weights (alias
 * table), from class codes (alias over classes + per-class index lists), optionally in runs
 * drawn from one block for read locality. Draw p depends only on (seed, epoch, p). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampler/sampler_int.h"
#include "util/status.h"

/* Codes at or above this are refused: the class tables are O(classes). */
#define MAX_CLASSES ((uint64_t)1 << 31)

enum { MODE_SAMPLE, MODE_CLASS, MODE_BLOCK };

typedef struct weighted_impl {
    int mode;
    uint64_t num_samples;
    zb__alias table;     /* over samples (SAMPLE), classes (CLASS) or blocks (BLOCK) */
    uint64_t *class_off; /* CLASS: [classes + 1] offsets into members */
    uint64_t *members;   /* CLASS: sample ids grouped by class, ascending inside a class */
    double *row_prob;    /* BLOCK: [n] per-block alias tables, side by side */
    uint64_t *row_alias; /* BLOCK: [n] local indices inside the block */
    uint64_t bs, draws;  /* BLOCK: block size, draws per run */
} weighted_impl;

static void
weighted_destroy(void *p)
{
    weighted_impl *w = p;
    if (!w) return;
    zb__alias_free(&w->table);
    free(w->class_off);
    free(w->members);
    free(w->row_prob);
    free(w->row_alias);
    free(w);
}

static zb_status
weighted_batch(zb_sampler *s, uint64_t g, uint64_t *ids, size_t *n)
{
    weighted_impl *w = s->impl;
    uint64_t k_draw = zb__stream_key(s->seed, s->epoch, ZB_TAG_DRAW, 0, 0);
    uint64_t k_coin = zb__stream_key(s->seed, s->epoch, ZB_TAG_COIN, 0, 0);
    uint64_t k_run = zb__stream_key(s->seed, s->epoch, ZB_TAG_RUN, 0, 0);
    uint64_t k_runcoin = zb__stream_key(s->seed, s->epoch, ZB_TAG_RUN, 1, 0);
    uint64_t start = g * s->batch_size;
    uint64_t stop = w->num_samples - start < s->batch_size ? w->num_samples : start + s->batch_size;
    for (uint64_t p = start; p < stop; p++) {
        uint64_t u1 = zb__hash2(k_draw, p), u2 = zb__hash2(k_coin, p), id;
        if (w->mode == MODE_SAMPLE) {
            id = zb__alias_draw(w->table.prob, w->table.alias, w->table.k, u1, u2);
        } else if (w->mode == MODE_CLASS) {
            uint64_t c = zb__alias_draw(w->table.prob, w->table.alias, w->table.k, u1, u2);
            uint64_t lo = w->class_off[c], cnt = w->class_off[c + 1] - lo;
            id = w->members[lo + zb__bounded(zb__hash2(k_run, p), cnt)];
        } else {
            uint64_t run = p / w->draws;
            uint64_t b = zb__alias_draw(w->table.prob, w->table.alias, w->table.k,
                                        zb__hash2(k_run, run), zb__hash2(k_runcoin, run));
            uint64_t lo = b * w->bs, len = s->n - lo < w->bs ? s->n - lo : w->bs;
            id = lo + zb__alias_draw(w->row_prob + lo, w->row_alias + lo, len, u1, u2);
        }
        ids[p - start] = id;
    }
    *n = (size_t)(stop - start);
    return ZB_OK;
}

static const zb__sampler_ops weighted_ops = {
    .name = "weighted",
    .batch = weighted_batch,
    .destroy = weighted_destroy,
};

/* Checks per-sample weights; names the first bad one. */
static zb_status
check_weights(const double *wt, uint64_t n, const char *what)
{
    double total = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (!isfinite(wt[i]) || wt[i] < 0)
            return zb__err(ZB_E_INVALID,
                           "weighted sampler: %s %llu has weight %g (must be "
                           "finite and >= 0)",
                           what, (unsigned long long)i, wt[i]);
        total += wt[i];
    }
    if (!(total > 0) || !isfinite(total))
        return zb__err(ZB_E_INVALID,
                       "weighted sampler: the %s weights sum to %g (must be a "
                       "positive finite number)",
                       what, total);
    return ZB_OK;
}

/* Class tables: counts, offsets, members, and the alias table over class weights. Also
 * returns the per-class weight array (classes entries, caller frees) when `cw_out` is set. */
static zb_status
build_classes(weighted_impl *w, const zb_weighted_sampler_opts *o, double **cw_out)
{
    const uint64_t n = o->base.n;
    uint64_t classes = 0;
    zb_status st = ZB_OK;
    double *cw = NULL;
    for (uint64_t i = 0; i < n; i++) {
        int64_t c = o->class_codes[i];
        if (c < 0) continue;
        if ((uint64_t)c >= MAX_CLASSES)
            return zb__err(ZB_E_INVALID,
                           "weighted sampler: sample %llu has class code %lld "
                           "(at most %llu classes)",
                           (unsigned long long)i, (long long)c, (unsigned long long)MAX_CLASSES);
        if ((uint64_t)c + 1 > classes) classes = (uint64_t)c + 1;
    }
    if (classes == 0)
        return zb__err(ZB_E_INVALID, "weighted sampler: no sample has a class code >= 0");
    if (o->class_weights && o->num_class_weights < classes)
        return zb__err(ZB_E_INVALID,
                       "weighted sampler: %zu class_weights for class codes up "
                       "to %llu",
                       o->num_class_weights, (unsigned long long)(classes - 1));
    w->class_off = calloc(classes + 1, sizeof *w->class_off);
    cw = malloc(classes * sizeof *cw);
    if (!w->class_off || !cw) {
        st = zb__err(ZB_E_NOMEM, "weighted sampler: class tables for %llu classes",
                     (unsigned long long)classes);
        goto done;
    }
    for (uint64_t i = 0; i < n; i++)
        if (o->class_codes[i] >= 0) w->class_off[o->class_codes[i] + 1]++;
    for (uint64_t c = 0; c < classes; c++) {
        double cwt = o->class_weights ? o->class_weights[c] : 1.0;
        if (!isfinite(cwt) || cwt < 0) {
            st = zb__err(ZB_E_INVALID,
                         "weighted sampler: class %llu has weight %g (must be "
                         "finite and >= 0)",
                         (unsigned long long)c, cwt);
            goto done;
        }
        cw[c] = w->class_off[c + 1] ? cwt : 0.0; /* an empty class is never drawn */
        w->class_off[c + 1] += w->class_off[c];
    }
    if ((st = check_weights(cw, classes, "class")) != ZB_OK) goto done;
    uint64_t m = w->class_off[classes];
    w->members = malloc((m ? m : 1) * sizeof *w->members);
    uint64_t *fill = malloc(classes * sizeof *fill);
    if (!w->members || !fill) {
        free(fill);
        st = zb__err(ZB_E_NOMEM, "weighted sampler: class index lists of %llu samples",
                     (unsigned long long)m);
        goto done;
    }
    memcpy(fill, w->class_off, classes * sizeof *fill);
    for (uint64_t i = 0; i < n; i++)
        if (o->class_codes[i] >= 0) w->members[fill[o->class_codes[i]]++] = i;
    free(fill);
    if ((st = zb__alias_build(&w->table, cw, classes)) != ZB_OK) goto done;
done:
    if (st == ZB_OK && cw_out)
        *cw_out = cw;
    else
        free(cw);
    return st;
}

/* Block locality: per-block alias tables over the rows and one over the blocks. */
static zb_status
build_blocks(weighted_impl *w, uint64_t n, const double *wt)
{
    zb_status st = ZB_OK;
    uint64_t nblocks = n / w->bs + (n % w->bs != 0);
    double *bw = malloc(nblocks * sizeof *bw);
    uint64_t *scratch = malloc((size_t)(w->bs < n ? w->bs : n) * sizeof *scratch);
    w->row_prob = malloc(n * sizeof *w->row_prob);
    w->row_alias = malloc(n * sizeof *w->row_alias);
    if (!bw || !scratch || !w->row_prob || !w->row_alias) {
        st = zb__err(ZB_E_NOMEM, "weighted sampler: block tables for %llu samples",
                     (unsigned long long)n);
        goto done;
    }
    for (uint64_t b = 0; b < nblocks; b++) {
        uint64_t lo = b * w->bs, len = n - lo < w->bs ? n - lo : w->bs;
        double sum = 0;
        for (uint64_t i = 0; i < len; i++) sum += wt[lo + i];
        bw[b] = sum;
        zb__alias_build_into(w->row_prob + lo, w->row_alias + lo, scratch, wt + lo, len);
    }
    st = zb__alias_build(&w->table, bw, nblocks);
done:
    free(bw);
    free(scratch);
    return st;
}

zb_status
zb_sampler_new_weighted(const zb_weighted_sampler_opts *o, zb_sampler **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "weighted sampler: NULL out");
    *out = NULL;
    if (!o) return zb__err(ZB_E_INVALID, "weighted sampler: NULL options");
    ZB_TRY(zb__sampler_check_stream("weighted", &o->base));
    const uint64_t n = o->base.n;
    if (!o->weights == !o->class_codes)
        return zb__err(ZB_E_INVALID, "weighted sampler: give exactly one of weights and "
                                     "class_codes");
    if (n == 0) return zb__err(ZB_E_INVALID, "weighted sampler: n must be >= 1");
    if (n > SIZE_MAX / 16)
        return zb__err(ZB_E_OVERFLOW, "weighted sampler: n %llu is too large",
                       (unsigned long long)n);
    weighted_impl *w = calloc(1, sizeof *w);
    double *per_sample = NULL, *cw = NULL;
    zb_status st = ZB_OK;
    if (!w) return zb__err(ZB_E_NOMEM, "weighted sampler");
    w->num_samples = o->num_samples ? o->num_samples : n;
    w->bs = o->block_size;
    w->draws = o->block_draws ? o->block_draws : o->block_size;
    if (o->weights && (st = check_weights(o->weights, n, "sample")) != ZB_OK) goto fail;
    if (o->block_size == 0) {
        if (o->weights) {
            w->mode = MODE_SAMPLE;
            st = zb__alias_build(&w->table, o->weights, n);
        } else {
            w->mode = MODE_CLASS;
            st = build_classes(w, o, NULL);
        }
        if (st != ZB_OK) goto fail;
    } else {
        w->mode = MODE_BLOCK;
        const double *wt = o->weights;
        if (!wt) {
            /* class-balanced with locality: sample i gets class_weight / count(class) */
            if ((st = build_classes(w, o, &cw)) != ZB_OK) goto fail;
            zb__alias_free(&w->table);
            per_sample = malloc(n * sizeof *per_sample);
            if (!per_sample) {
                st = zb__err(ZB_E_NOMEM, "weighted sampler: weights of %llu samples",
                             (unsigned long long)n);
                goto fail;
            }
            for (uint64_t i = 0; i < n; i++) {
                int64_t c = o->class_codes[i];
                per_sample[i] =
                    c < 0 ? 0.0 : cw[c] / (double)(w->class_off[c + 1] - w->class_off[c]);
            }
            free(w->class_off);
            free(w->members);
            w->class_off = NULL;
            w->members = NULL;
            wt = per_sample;
        }
        if ((st = build_blocks(w, n, wt)) != ZB_OK) goto fail;
    }
    free(per_sample);
    free(cw);
    return zb__sampler_create(
        &o->base, &weighted_ops, w,
        zb__sampler_batches_for(w->num_samples, o->base.batch_size, o->base.drop_last),
        (size_t)o->base.batch_size, out);
fail:
    free(per_sample);
    free(cw);
    weighted_destroy(w);
    return st;
}
