/* The sequential sampler: ids 0..n-1 in order. */
#include <stdlib.h>

#include "sampler/sampler_int.h"
#include "util/status.h"

static zb_status
sequential_batch(zb_sampler *s, uint64_t g, uint64_t *ids, size_t *n)
{
    uint64_t start = g * s->batch_size;
    uint64_t stop = s->n - start < s->batch_size ? s->n : start + s->batch_size;
    for (uint64_t i = start; i < stop; i++) ids[i - start] = i;
    *n = (size_t)(stop - start);
    return ZB_OK;
}

static const zb__sampler_ops sequential_ops = {
    .name = "sequential",
    .batch = sequential_batch,
};

zb_status
zb_sampler_new_sequential(const zb_sampler_opts *opts, zb_sampler **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "sequential sampler: NULL out");
    *out = NULL;
    ZB_TRY(zb__sampler_check_stream("sequential", opts));
    return zb__sampler_create(opts, &sequential_ops, NULL,
                              zb__sampler_batches_for(opts->n, opts->batch_size, opts->drop_last),
                              (size_t)opts->batch_size, out);
}
