/* The size-aware sampler: batches bin-packed under max_atoms / max_edges / max_nnz /
 * max_batch_size, as a guarantee; plus nvalchemi-style inflight replacement.
 *
 * An epoch is the permuted sample stream cut into windows of `window` samples; each window is
 * packed on its own (first fit and first-fit decreasing, over the 64 most recently opened
 * batches: the bound keeps packing O(window) per window when limits are small; the packing
 * with fewer batches wins), and its batches are then put in a keyed random order. Planning an epoch
 * packs every window once to count its batches (win_first); a batch is later served by re-packing
 * its window (cached, so consecutive batches cost nothing). Packing depends only on (seed, epoch,
 * window), so every rank and every restore sees the same batches.
 *
 * Chunk-aware (block_size K): the permutation is over blocks of K consecutive ids (the short
 * last block stays last, as in the block sampler, so every window but the last holds whole
 * blocks), and inside a window the samples are permuted again before packing: a window reads
 * few chunks, and its batches still mix its blocks. */
#include <stdlib.h>
#include <string.h>

#include "sampler/sampler_int.h"
#include "util/status.h"
#include "util/search.h"

#define NDIMS 3        /* atoms, edges, nnz */
#define RECENT_BINS 64 /* first-fit looks at this many most recent batches */

static const char *const dim_name[NDIMS] = {"atoms", "edges", "nnz"};

typedef struct pack_item {
    double key; /* largest size / limit over the limited dimensions */
    uint64_t id;
} pack_item;

typedef struct size_impl {
    uint64_t *sizes[NDIMS]; /* copies, NULL when the dimension has no limit */
    uint64_t limit[NDIMS];  /* 0 = no limit */
    uint64_t window;        /* samples per window (<= n) */
    bool shuffle;
    uint64_t block, nfull; /* chunk-aware: ids per block (0: off) and full blocks */
    uint64_t nwin;
    uint64_t *win_first; /* [nwin + 1] first global batch of each window */
    zb__perm order;      /* the epoch's sample order (of full blocks when chunk-aware) */
    /* the packed window `cached_win` */
    bool have_win;
    uint64_t cached_win, nbins;
    uint64_t *win_ids; /* [window] ids grouped by batch */
    uint64_t *bin_off; /* [window + 1] */
    zb__perm bin_perm; /* batch order inside the window */
    /* packing scratch */
    pack_item *items, *sorted;        /* permuted order, decreasing size */
    uint64_t *item_bin, *item_bin_ff; /* batch of each item, per packing */
    uint64_t *bin_count, *bin_sum;    /* bin_sum: [window][NDIMS] */
    /* inflight replacement (built on the first request of an epoch) */
    bool repl_built;
    uint64_t *yielded, *taken; /* bitmaps over n */
    uint64_t *cand;            /* [ncand] this rank's remaining ids, sorted by size */
    uint64_t *parent;          /* [ncand + 1] union-find: nearest live entry at or below */
    uint64_t ncand;
} size_impl;

static void
repl_clear(size_impl *z)
{
    free(z->yielded);
    free(z->taken);
    free(z->cand);
    free(z->parent);
    z->yielded = z->taken = z->cand = z->parent = NULL;
    z->ncand = 0;
    z->repl_built = false;
}

static void
size_destroy(void *p)
{
    size_impl *z = p;
    if (!z) return;
    for (int d = 0; d < NDIMS; d++) free(z->sizes[d]);
    free(z->win_first);
    free(z->win_ids);
    free(z->bin_off);
    free(z->items);
    free(z->sorted);
    free(z->item_bin);
    free(z->item_bin_ff);
    free(z->bin_count);
    free(z->bin_sum);
    repl_clear(z);
    free(z);
}

static int
item_cmp(const void *a, const void *b)
{
    const pack_item *x = a, *y = b;
    if (x->key != y->key) return x->key > y->key ? -1 : 1; /* decreasing size */
    return x->id < y->id ? -1 : x->id > y->id;
}

static bool
fits(const size_impl *z, const uint64_t *sum, uint64_t id)
{
    for (int d = 0; d < NDIMS; d++)
        if (z->limit[d] && sum[d] + z->sizes[d][id] > z->limit[d]) return false;
    return true;
}

/* First fit of items[0..m) over the RECENT_BINS most recently opened batches; writes each
 * item's batch to item_bin and returns the number of batches. */
static uint64_t
first_fit(const zb_sampler *s, size_impl *z, const pack_item *items, uint64_t m, uint64_t *item_bin)
{
    uint64_t nbins = 0;
    for (uint64_t k = 0; k < m; k++) {
        uint64_t id = items[k].id, b = nbins > RECENT_BINS ? nbins - RECENT_BINS : 0;
        for (; b < nbins; b++)
            if (z->bin_count[b] < s->batch_size && fits(z, z->bin_sum + b * NDIMS, id)) break;
        if (b == nbins) {
            z->bin_count[b] = 0;
            memset(z->bin_sum + b * NDIMS, 0, NDIMS * sizeof *z->bin_sum);
            nbins++;
        }
        z->bin_count[b]++;
        for (int d = 0; d < NDIMS; d++)
            if (z->limit[d]) z->bin_sum[b * NDIMS + d] += z->sizes[d][id];
        item_bin[k] = b;
    }
    return nbins;
}

/* The id at position pos of the epoch's stream. */
static uint64_t
stream_id(const size_impl *z, uint64_t pos)
{
    if (!z->shuffle) return pos;
    if (!z->block) return zb__perm_apply(&z->order, pos);
    uint64_t j = pos / z->block;
    if (j >= z->nfull) return pos; /* the short block, last */
    return zb__perm_apply(&z->order, j) * z->block + pos % z->block;
}

/* Packs window w into win_ids / bin_off / nbins and keys its batch order. Two packings are
 * tried and the one with fewer batches kept (ties: the first): first fit in the permuted
 * order, which mixes large and small samples and so wins when max_batch_size binds, and
 * first-fit decreasing, which wins when one size limit binds. */
static void
pack_window(zb_sampler *s, size_impl *z, uint64_t w)
{
    uint64_t lo = w * z->window, m = s->n - lo < z->window ? s->n - lo : z->window;
    zb__perm inside; /* chunk-aware: the window's samples mixed across its blocks */
    bool mix = z->block && z->shuffle && m > 1;
    if (mix) zb__perm_init(&inside, m, zb__stream_key(s->seed, s->epoch, ZB_TAG_PACKWIN, w, 0));
    for (uint64_t k = 0; k < m; k++) {
        uint64_t id = stream_id(z, lo + (mix ? zb__perm_apply(&inside, k) : k));
        double key = 0;
        for (int d = 0; d < NDIMS; d++) {
            if (!z->limit[d]) continue;
            double r = (double)z->sizes[d][id] / (double)z->limit[d];
            if (r > key) key = r;
        }
        z->items[k].key = key;
        z->items[k].id = id;
    }
    uint64_t n_ff = first_fit(s, z, z->items, m, z->item_bin_ff);
    memcpy(z->sorted, z->items, (size_t)m * sizeof *z->items);
    qsort(z->sorted, (size_t)m, sizeof *z->sorted, item_cmp);
    uint64_t n_ffd = first_fit(s, z, z->sorted, m, z->item_bin);
    const pack_item *items = z->sorted;
    const uint64_t *item_bin = z->item_bin;
    uint64_t nbins = n_ffd;
    if (n_ff <= n_ffd) {
        items = z->items;
        item_bin = z->item_bin_ff;
        nbins = n_ff;
    }
    /* group the ids by batch, keeping their packing order inside each */
    memset(z->bin_count, 0, (size_t)nbins * sizeof *z->bin_count);
    for (uint64_t k = 0; k < m; k++) z->bin_count[item_bin[k]]++;
    z->bin_off[0] = 0;
    for (uint64_t b = 0; b < nbins; b++) z->bin_off[b + 1] = z->bin_off[b] + z->bin_count[b];
    for (uint64_t b = 0; b < nbins; b++) z->bin_count[b] = z->bin_off[b];
    for (uint64_t k = 0; k < m; k++) z->win_ids[z->bin_count[item_bin[k]]++] = items[k].id;
    z->nbins = nbins;
    zb__perm_init(&z->bin_perm, nbins, zb__stream_key(s->seed, s->epoch, ZB_TAG_BINS, w, 0));
    z->cached_win = w;
    z->have_win = true;
}

static zb_status
size_plan(zb_sampler *s)
{
    size_impl *z = s->impl;
    uint64_t len = z->block ? z->nfull : s->n;
    if (len) zb__perm_init(&z->order, len, zb__stream_key(s->seed, s->epoch, ZB_TAG_PACK, 0, 0));
    z->win_first[0] = 0;
    for (uint64_t w = 0; w < z->nwin; w++) {
        pack_window(s, z, w);
        z->win_first[w + 1] = z->win_first[w] + z->nbins;
    }
    s->global_batches = z->win_first[z->nwin];
    return ZB_OK;
}

static zb_status
size_batch(zb_sampler *s, uint64_t g, uint64_t *ids, size_t *n)
{
    size_impl *z = s->impl;
    uint64_t w;
    if (z->have_win && g >= z->win_first[z->cached_win] && g < z->win_first[z->cached_win + 1]) {
        w = z->cached_win;
    } else {
        w = zb__last_le(z->win_first, (size_t)z->nwin, g); /* the last window starting <= g */
        pack_window(s, z, w);
    }
    uint64_t t = g - z->win_first[w];
    uint64_t b = z->shuffle ? zb__perm_apply(&z->bin_perm, t) : t;
    uint64_t a = z->bin_off[b], e = z->bin_off[b + 1];
    memcpy(ids, z->win_ids + a, (size_t)(e - a) * sizeof *ids);
    *n = (size_t)(e - a);
    return ZB_OK;
}

#define BIT_GET(m, i) (((m)[(i) >> 6] >> ((i)&63)) & 1)
#define BIT_SET(m, i) ((m)[(i) >> 6] |= 1ULL << ((i)&63))

static size_t
size_filter(zb_sampler *s, uint64_t *ids, size_t n)
{
    size_impl *z = s->impl;
    if (!z->repl_built) return n;
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (BIT_GET(z->taken, ids[i])) continue;
        BIT_SET(z->yielded, ids[i]);
        ids[kept++] = ids[i];
    }
    return kept;
}

static void
size_reset(zb_sampler *s)
{
    repl_clear(s->impl);
}

static const zb__sampler_ops size_ops = {
    .name = "size-aware",
    .plan_epoch = size_plan,
    .batch = size_batch,
    .filter = size_filter,
    .reset = size_reset,
    .destroy = size_destroy,
};

zb_status
zb_sampler_new_size_aware(const zb_size_sampler_opts *o, zb_sampler **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "size-aware sampler: NULL out");
    *out = NULL;
    if (!o) return zb__err(ZB_E_INVALID, "size-aware sampler: NULL options");
    ZB_TRY(zb__sampler_check_stream("size-aware", &o->base));
    const uint64_t n = o->base.n;
    if (o->window_size < 1)
        return zb__err(ZB_E_INVALID, "size-aware sampler: window_size must be >= 1");
    if (n > SIZE_MAX / 64)
        return zb__err(ZB_E_OVERFLOW, "size-aware sampler: n %llu is too large",
                       (unsigned long long)n);
    const uint64_t *arr[NDIMS] = {o->num_atoms, o->num_edges, o->nnz};
    const uint64_t lim[NDIMS] = {o->max_atoms, o->max_edges, o->max_nnz};
    for (int d = 0; d < NDIMS; d++) {
        if (!lim[d]) continue;
        if (!arr[d] && n > 0)
            return zb__err(ZB_E_INVALID,
                           "size-aware sampler: max_%s is set but the %s sizes "
                           "array is NULL",
                           dim_name[d], dim_name[d]);
        for (uint64_t i = 0; i < n; i++)
            if (arr[d][i] > lim[d])
                return zb__err(ZB_E_INVALID,
                               "size-aware sampler: sample %llu has %llu %s, over "
                               "max_%s = %llu; it can never fit in a batch",
                               (unsigned long long)i, (unsigned long long)arr[d][i], dim_name[d],
                               dim_name[d], (unsigned long long)lim[d]);
    }
    size_impl *z = calloc(1, sizeof *z);
    if (!z) return zb__err(ZB_E_NOMEM, "size-aware sampler");
    z->block = o->block_size;
    z->nfull = z->block ? n / z->block : 0;
    uint64_t window = o->window_size < n ? o->window_size : n; /* n <= SIZE_MAX / 64 */
    if (z->block && z->block <= n && window % z->block)
        window += z->block - window % z->block; /* whole blocks per window */
    z->window = window < n ? window : (n ? n : 1);
    z->shuffle = o->shuffle;
    z->nwin = n / z->window + (n % z->window != 0);
    size_t wsz = (size_t)z->window;
    for (int d = 0; d < NDIMS; d++) {
        if (!lim[d] || n == 0) continue;
        z->limit[d] = lim[d];
        z->sizes[d] = malloc((size_t)n * sizeof(uint64_t));
        if (!z->sizes[d]) goto nomem;
        memcpy(z->sizes[d], arr[d], (size_t)n * sizeof(uint64_t));
    }
    z->win_first = malloc(((size_t)z->nwin + 1) * sizeof *z->win_first);
    z->win_ids = malloc(wsz * sizeof *z->win_ids);
    z->bin_off = malloc((wsz + 1) * sizeof *z->bin_off);
    z->items = malloc(wsz * sizeof *z->items);
    z->sorted = malloc(wsz * sizeof *z->sorted);
    z->item_bin = malloc(wsz * sizeof *z->item_bin);
    z->item_bin_ff = malloc(wsz * sizeof *z->item_bin_ff);
    z->bin_count = malloc(wsz * sizeof *z->bin_count);
    z->bin_sum = malloc(wsz * NDIMS * sizeof *z->bin_sum);
    if (!z->win_first || !z->win_ids || !z->bin_off || !z->items || !z->sorted || !z->item_bin ||
        !z->item_bin_ff || !z->bin_count || !z->bin_sum)
        goto nomem;
    /* global_batches is set by size_plan */
    return zb__sampler_create(&o->base, &size_ops, z, 0, (size_t)o->base.batch_size, out);
nomem:
    size_destroy(z);
    return zb__err(ZB_E_NOMEM, "size-aware sampler: tables for %llu samples",
                   (unsigned long long)n);
}

/* ---- inflight replacement -------------------------------------------------------------------- */

typedef struct cand_key {
    uint64_t atoms, edges, id;
} cand_key;

static int
cand_cmp(const void *a, const void *b)
{
    const cand_key *x = a, *y = b;
    if (x->atoms != y->atoms) return x->atoms < y->atoms ? -1 : 1;
    if (x->edges != y->edges) return x->edges < y->edges ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static uint64_t
uf_find(uint64_t *parent, uint64_t i)
{
    uint64_t r = i;
    while (parent[r] != r) r = parent[r];
    while (parent[i] != r) { /* path compression */
        uint64_t next = parent[i];
        parent[i] = r;
        i = next;
    }
    return r;
}

/* Collects this rank's remaining ids and sorts them by (atoms, edges, id). */
static zb_status
repl_build(zb_sampler *s, size_impl *z)
{
    uint64_t left = zb_sampler_remaining(s), words = s->n / 64 + 1;
    size_t cap = (size_t)(left * s->batch_size) + 1;
    cand_key *keys = NULL;
    z->yielded = calloc((size_t)words, sizeof *z->yielded);
    z->taken = calloc((size_t)words, sizeof *z->taken);
    z->cand = malloc(cap * sizeof *z->cand);
    if (!z->yielded || !z->taken || !z->cand) goto nomem;
    for (uint64_t k = 0; k < left; k++) {
        uint64_t g = s->base + s->rank + (s->done + k) * s->world;
        if (g >= s->global_batches) g = (g - s->global_batches) % s->global_batches;
        size_t got = 0;
        (void)size_batch(s, g, z->cand + z->ncand, &got); /* cannot fail */
        z->ncand += got;
    }
    keys = malloc(((size_t)z->ncand + 1) * sizeof *keys);
    z->parent = malloc(((size_t)z->ncand + 1) * sizeof *z->parent);
    if (!keys || !z->parent) goto nomem;
    for (uint64_t i = 0; i < z->ncand; i++) {
        uint64_t c = z->cand[i];
        keys[i].atoms = z->limit[0] ? z->sizes[0][c] : 0;
        keys[i].edges = z->limit[1] ? z->sizes[1][c] : 0;
        keys[i].id = c;
    }
    qsort(keys, (size_t)z->ncand, sizeof *keys, cand_cmp);
    for (uint64_t i = 0; i < z->ncand; i++) z->cand[i] = keys[i].id;
    free(keys);
    /* entry i (1-based) is cand[i-1]; entry 0 is the "nothing left" sentinel */
    for (uint64_t i = 0; i <= z->ncand; i++) z->parent[i] = i;
    z->repl_built = true;
    return ZB_OK;
nomem:
    free(keys);
    repl_clear(z);
    return zb__err(ZB_E_NOMEM, "size-aware sampler: replacement index");
}

zb_status
zb_sampler_request_replacement(zb_sampler *s, uint64_t room_atoms, uint64_t room_edges,
                               uint64_t *id, bool *found)
{
    if (found) *found = false;
    if (!s || !id || !found)
        return zb__err(ZB_E_INVALID, "zb_sampler_request_replacement: NULL argument");
    if (s->ops != &size_ops)
        return zb__err(ZB_E_TYPE,
                       "zb_sampler_request_replacement: a %s sampler is not "
                       "size-aware",
                       s->ops->name);
    size_impl *z = s->impl;
    if (!z->repl_built) ZB_TRY(repl_build(s, z));
    const uint64_t room[2] = {room_atoms, room_edges};
    /* entries 1..hi have a primary size within the room */
    uint64_t hi = z->ncand;
    int primary = z->limit[0] ? 0 : z->limit[1] ? 1 : -1;
    if (primary >= 0) {
        uint64_t lo = 0, up = z->ncand; /* count of entries with size <= room */
        while (lo < up) {
            uint64_t mid = lo + (up - lo) / 2;
            if (z->sizes[primary][z->cand[mid]] <= room[primary])
                lo = mid + 1;
            else
                up = mid;
        }
        hi = lo;
    }
    for (uint64_t i = uf_find(z->parent, hi); i > 0; i = uf_find(z->parent, i - 1)) {
        uint64_t c = z->cand[i - 1];
        if (BIT_GET(z->yielded, c) || BIT_GET(z->taken, c)) {
            z->parent[i] = i - 1; /* used: drop the entry for good */
            continue;
        }
        bool ok = true;
        for (int d = 0; d < 2; d++)
            if (z->limit[d] && z->sizes[d][c] > room[d]) ok = false;
        if (!ok) continue;
        BIT_SET(z->taken, c);
        z->parent[i] = i - 1;
        *id = c;
        *found = true;
        return ZB_OK;
    }
    return ZB_OK;
}
