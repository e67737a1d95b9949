/* The random sampler: a full permutation of 0..n-1 per epoch in O(1) memory, as a keyed
 * Feistel bijection (sampler_int.h) instead of an n-sized shuffled array. */
#include <stdlib.h>

#include "sampler/sampler_int.h"
#include "util/status.h"

typedef struct random_impl {
    zb__perm perm;
} random_impl;

static zb_status
random_plan(zb_sampler *s)
{
    random_impl *r = s->impl;
    zb__perm_init(&r->perm, s->n, zb__stream_key(s->seed, s->epoch, ZB_TAG_RANDOM, 0, 0));
    return ZB_OK;
}

static zb_status
random_batch(zb_sampler *s, uint64_t g, uint64_t *ids, size_t *n)
{
    random_impl *r = s->impl;
    uint64_t start = g * s->batch_size;
    uint64_t stop = s->n - start < s->batch_size ? s->n : start + s->batch_size;
    zb__perm_apply_run(&r->perm, start, (size_t)(stop - start), ids);
    *n = (size_t)(stop - start);
    return ZB_OK;
}

static const zb__sampler_ops random_ops = {
    .name = "random",
    .plan_epoch = random_plan,
    .batch = random_batch,
    .destroy = free,
};

zb_status
zb_sampler_new_random(const zb_sampler_opts *opts, zb_sampler **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "random sampler: NULL out");
    *out = NULL;
    ZB_TRY(zb__sampler_check_stream("random", opts));
    random_impl *r = calloc(1, sizeof *r);
    if (!r) return zb__err(ZB_E_NOMEM, "random sampler");
    return zb__sampler_create(opts, &random_ops, r,
                              zb__sampler_batches_for(opts->n, opts->batch_size, opts->drop_last),
                              (size_t)opts->batch_size, out);
}
