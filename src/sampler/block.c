/* The block sampler (annbatch / scDataset style): shuffled blocks of contiguous rows, loaded
 * blocks_per_window at a time, rows shuffled inside each window. Everything is computed per
 * position from two keyed bijections (block order, rows of a window), so memory is O(1) in n
 * (plus the block ids of the current window).
 *
 * Stream layout. Blocks are [b*bs, min((b+1)*bs, n)); only block nblocks-1 may be short. The
 * full blocks are shuffled into slots [0, nfull) (slot j holds block P(j)); a short block always
 * takes the last slot, so every window but the last is exactly bpw*bs rows: window w holds
 * slots [w*bpw, min((w+1)*bpw, nblocks)) and starts at stream row w*bpw*bs. (A short block in a
 * middle slot would shift every later window by its missing rows, and a loader reading bpw*bs
 * rows per window would then straddle two windows and decode their chunks twice.) Inside
 * window w, local row q is mapped through the window's bijection to q', which is then located
 * among the window's blocks. */
#include <stdlib.h>

#include "sampler/sampler_int.h"
#include "util/status.h"

typedef struct block_impl {
    uint64_t bs, bpw;
    uint64_t nblocks, nwin;
    uint64_t short_slot; /* nblocks - 1 with a short block, UINT64_MAX when none */
    zb__perm blocks;     /* slot -> block, over the full blocks */
    bool have_win;       /* win_perm is the bijection of window cached_win */
    uint64_t cached_win;
    zb__perm win_perm;
    uint64_t *win_blocks; /* the blocks of window cached_win (NULL: bpw too large) */
} block_impl;

/* Windows of up to this many blocks keep their block ids (8 bytes each) instead of applying
 * the block bijection once per row (a quarter of a small-sample read's CPU). */
#define WIN_BLOCKS_MAX 65536

static void
block_free(void *impl)
{
    block_impl *b = impl;
    if (b) free(b->win_blocks);
    free(b);
}

static zb_status
block_plan(zb_sampler *s)
{
    block_impl *b = s->impl;
    bool short_block = s->n % b->bs != 0;
    b->nblocks = s->n / b->bs + short_block;
    b->nwin = b->nblocks / b->bpw + (b->nblocks % b->bpw != 0);
    zb__perm_init(&b->blocks, b->nblocks - short_block,
                  zb__stream_key(s->seed, s->epoch, ZB_TAG_BLOCKS, 0, 0));
    b->short_slot = short_block ? b->nblocks - 1 : UINT64_MAX;
    b->have_win = false;
    return ZB_OK;
}

/* First stream row of window w (w <= nwin). */
static uint64_t
window_start(const zb_sampler *s, const block_impl *b, uint64_t w)
{
    return w >= b->nwin ? s->n : w * b->bpw * b->bs;
}

static uint64_t
slot_block(const block_impl *b, uint64_t j)
{
    return j == b->short_slot ? j : zb__perm_apply(&b->blocks, j);
}

/* Makes window w the cached one: its row bijection and its block ids. */
static void
use_window(zb_sampler *s, block_impl *b, uint64_t w, uint64_t m)
{
    if (b->have_win && b->cached_win == w) return;
    uint64_t j0 = w * b->bpw;
    zb__perm_init(&b->win_perm, m, zb__stream_key(s->seed, s->epoch, ZB_TAG_WINDOW, w, 0));
    b->cached_win = w;
    b->have_win = true;
    if (b->win_blocks)
        for (uint64_t t = 0; t < b->bpw && j0 + t < b->nblocks; t++)
            b->win_blocks[t] = slot_block(b, j0 + t);
}

/* Stream rows [start, stop) of the epoch, window by window: each local row q goes through the
 * window's bijection to q', which is row q' % bs of the window's block slot q' / bs. */
static zb_status
block_batch(zb_sampler *s, uint64_t g, uint64_t *ids, size_t *n)
{
    block_impl *b = s->impl;
    uint64_t start = g * s->batch_size;
    uint64_t stop = s->n - start < s->batch_size ? s->n : start + s->batch_size;
    bool pow2 = (b->bs & (b->bs - 1)) == 0;
    int sh = pow2 ? __builtin_ctzll(b->bs) : 0;
    for (uint64_t p = start; p < stop;) {
        uint64_t w = p / (b->bpw * b->bs);
        uint64_t ws = window_start(s, b, w), we = window_start(s, b, w + 1);
        uint64_t e = stop < we ? stop : we, j0 = w * b->bpw;
        use_window(s, b, w, we - ws);
        uint64_t *q = ids + (p - start);
        zb__perm_apply_run(&b->win_perm, p - ws, (size_t)(e - p), q);
        /* the short block, if any, is the last window's last slot: q / bs is the slot either
         * way */
        for (uint64_t k = 0; k < e - p; k++) {
            uint64_t t = pow2 ? q[k] >> sh : q[k] / b->bs;
            uint64_t r = pow2 ? q[k] & (b->bs - 1) : q[k] % b->bs;
            q[k] = (b->win_blocks ? b->win_blocks[t] : slot_block(b, j0 + t)) * b->bs + r;
        }
        p = e;
    }
    *n = (size_t)(stop - start);
    return ZB_OK;
}

static const zb__sampler_ops block_ops = {
    .name = "block",
    .plan_epoch = block_plan,
    .batch = block_batch,
    .destroy = block_free,
};

zb_status
zb_sampler_new_block(const zb_block_sampler_opts *opts, zb_sampler **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "block sampler: NULL out");
    *out = NULL;
    if (!opts) return zb__err(ZB_E_INVALID, "block sampler: NULL options");
    ZB_TRY(zb__sampler_check_stream("block", &opts->base));
    if (opts->block_size < 1)
        return zb__err(ZB_E_INVALID, "block sampler: block_size must be >= 1");
    if (opts->blocks_per_window < 1)
        return zb__err(ZB_E_INVALID, "block sampler: blocks_per_window must be >= 1");
    /* every window start w*bpw*bs (w < nwin) must fit: (nblocks + bpw) * bs bounds them */
    uint64_t nblocks = opts->base.n / opts->block_size + 1, bound;
    if (__builtin_add_overflow(nblocks, opts->blocks_per_window, &bound) ||
        __builtin_mul_overflow(bound, opts->block_size, &bound))
        return zb__err(ZB_E_OVERFLOW,
                       "block sampler: n %llu with block_size %llu x "
                       "blocks_per_window %llu overflows",
                       (unsigned long long)opts->base.n, (unsigned long long)opts->block_size,
                       (unsigned long long)opts->blocks_per_window);
    block_impl *b = calloc(1, sizeof *b);
    if (!b) return zb__err(ZB_E_NOMEM, "block sampler");
    b->bs = opts->block_size;
    b->bpw = opts->blocks_per_window;
    if (b->bpw <= WIN_BLOCKS_MAX) { /* (nblocks + 1 bounds a window's blocks too) */
        uint64_t cap = b->bpw < nblocks ? b->bpw : nblocks;
        b->win_blocks = malloc(cap * sizeof *b->win_blocks);
        if (!b->win_blocks) {
            free(b);
            return zb__err(ZB_E_NOMEM, "block sampler");
        }
    }
    return zb__sampler_create(
        &opts->base, &block_ops, b,
        zb__sampler_batches_for(opts->base.n, opts->base.batch_size, opts->base.drop_last),
        (size_t)opts->base.batch_size, out);
}
