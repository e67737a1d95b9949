/* The dataset reader's internals, shared by its files (SQLite's vdbeInt.h habit):
 *
 *   batch.c   the batch object (zb_batch: fields, segments, views) and its memory pool
 *   plan.c    planning: ids -> (child, physical) -> segments -> copies -> tasks; locate; the
 *             re-base plan of index fields; the plan's memory kept between requests
 *   exec.c    execution: tasks on the pool, each serving and fetching its units through the
 *             zarr unit API (src/zarr/unit.h); the list path for stores that read lists
 *   rows.c    landing rows in the batch: box copies, index fields re-based
 *   reader.c  zb__dataset_read_batches: plan -> execute -> finish (strings, gene order)
 *
 * The flow is DESIGN.md §3. Nothing here reaches inside a zb_array: the unit geometry
 * (zb__array_units) and the unit API are the reader's view of the zarr layer. */
#ifndef ZB_DATASET_READ_INT_H
#define ZB_DATASET_READ_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "dataset/batch.h"
#include "dataset/dataset.h"
#include "util/stream.h"
#include "zarr/unit.h"

typedef struct bfield {
    char *name;
    bool owned; /* data is this batch's (else it lies in the parent's buffers) */
    zb_field_kind kind;
    zb_dtype dtype;
    size_t itemsize;
    int ndim;
    uint64_t row_shape[ZB_MAX_DIMS];
    uint64_t row_elems;
    uint64_t nrows;
    uint8_t *data;
    int seg;
    int target;    /* index fields: the segment their values point into, else -1 */
    int64_t *offs; /* strings: byte offsets [B+1] of each sample's string in data, else NULL */
    bool owns_offs;
} bfield;

typedef struct bseg {
    char name[32];
    int64_t *ptr; /* [B+1] */
} bseg;

struct zb_batch {
    size_t B;
    uint64_t *index;
    int32_t *dataset;
    size_t nfields;
    bfield *fields;
    size_t nsegs;
    bseg *segs;
    zb_read_stats stats;
    uint64_t n_vars;
    /* a view (zb_batch_view) borrows index/dataset and non-owned field data from `parent` and
     * holds one of its references; a batch is freed when its last reference goes */
    zb_batch *parent;
    _Atomic int refs;
    zb__arena_pool *arenas; /* where `arena` returns (NULL: malloc'd) */
    void *arena;
    size_t arena_cap;
    /* zb__dataset_read_batches: index fields are re-based to each of these batches,
     * [groups[k], groups[k+1]) for k < ngroups; NULL: to the whole batch */
    size_t *groups;
    size_t ngroups;
};

/* A run of rows of one unit that lands at dst_row of the field's batch buffer. */
typedef struct copy {
    uint32_t field, child;
    uint64_t unit;    /* unit index along axis 0 */
    uint64_t src_row; /* first row inside the unit */
    uint64_t dst_row;
    uint64_t nrows;
} copy;

/* One task: the copies [c0, c1) of one unit row (or of every unit row of one shard row). */
typedef struct task {
    size_t c0, c1;
    zb_status st;
    char *msg; /* the error's message (malloc'd), or NULL */
    zb_read_stats stats;
} task;

typedef struct plan plan;
/* A task as a worker runs it. */
typedef struct exec {
    plan *p;
    task *t;
    zb_ctx *ctx;
} exec;

/* A copy's sort key and its place in the plan (sort_field). */
typedef struct keyed {
    uint64_t key;
    size_t i;
} keyed;

/* How an index field's values become batch rows (rebase_rows): sample i's stored values lie in
 * [lo[i], lo[i] + len[i]) (lo: its first target row in the store when stored store-global, else
 * 0) and become value + shift[i] (its first target row in its batch group, less lo[i]). */
typedef struct rebase {
    bool in_tasks;       /* applied by the tasks as each copy lands; else after them (step 5) */
    const int64_t *rows; /* [n+1] the field's batch pointer (its own segment) */
    int64_t *shift, *lo, *len; /* [n] each; NULL: not an index field */
} rebase;

/* The plan's memory, kept by the dataset between requests (dataset.h plan_free). A window's
 * plan is megabytes (copy records, sort keys, tasks, per-sample arrays) that malloc returns to
 * the kernel when freed and faults in again for the next window: 84,000 page faults in 8 s of a
 * block loader were all in the plan. Each kept set is as large as the largest request it
 * served; PLAN_MEM_KEPT of them at most (one per concurrent caller is what a loader needs), and
 * none larger than PLAN_MEM_MAX_BYTES. */
#define PLAN_MEM_KEPT 4
#define PLAN_MEM_MAX_BYTES ((size_t)256 << 20)
struct zb__plan_mem {
    copy *copies;
    size_t copies_cap;
    keyed *keys;
    size_t keys_cap;
    copy *sorted;
    size_t sorted_cap;
    task *tasks;
    size_t tasks_cap;
    exec *xs;
    size_t xs_cap;
    uint32_t *child;
    size_t child_cap;
    uint64_t *phys;
    size_t phys_cap;
    int64_t *seg_start;
    size_t seg_cap;
    size_t *arena_off;
    size_t off_cap;
    rebase *rb;
    size_t rb_cap;
    int64_t *rb_vals;
    size_t rb_vals_cap;
    uint8_t *fetched; /* the listed path's range bytes (exec.c): reused, not mapped per window */
    size_t fetched_cap;
    zb_ctx *ctx;
    pthread_t owner; /* the thread that used it last */
    zb__plan_mem *next;
};

struct plan {
    zb_dataset *ds;
    zb_batch *b;
    zb__plan_mem *m; /* where copies, tasks and the sort's scratch live between requests */
    copy *copies;
    size_t ncopies, cap;
    task *tasks;
    size_t ntasks, tasks_cap;
    uint64_t work; /* decoded bytes of the units the tasks serve (make_tasks) */
    bool stream;   /* the batch outgrows the cache: long copies into it are streamed (stream.h) */
    size_t n;      /* samples of the request */
    const uint32_t *child;    /* [n] each sample's child */
    const uint64_t *phys;     /* [n] each sample's physical row in its child */
    const int64_t *seg_start; /* [nsegs][n] each sample's first element of each segment */
    zb_ctx *ctx;              /* the planning thread's context (pointer reads, inline tasks) */
    rebase *rb;               /* [nfields], or NULL when there is no index field */
    zb__arena_pool *pool;     /* where the batch's memory comes from (NULL: the dataset's pool) */
    bool checked[ZB_MAX_FIELDS]; /* field f's values are range-checked in some child
                                    (value_bound; set by zb__plan_request) */
};

/* A plan's dataset for child c (the dataset itself when it has no children). */
static inline const zb_dataset *
child_of(const zb_dataset *ds, uint32_t c)
{
    return ds->nchildren ? ds->children[c] : ds;
}

/* The unit geometry of field f of child c. */
static inline const zb__unit_geom *
field_units(const plan *p, uint32_t f, uint32_t c)
{
    return zb__array_units(child_of(p->ds, c)->fields[f].arr);
}

/* Ensures *a holds n elements of `size` bytes (grown by doubling, contents kept). */
static inline bool
grow_array(void **a, size_t *cap, size_t n, size_t size)
{
    if (n <= *cap) return true;
    size_t c = *cap ? *cap : 16;
    while (c < n) {
        if (c > SIZE_MAX / 2 / size) return false;
        c *= 2;
    }
    void *q = realloc(*a, c * size);
    if (!q) return false;
    *a = q;
    *cap = c;
    return true;
}

/* A scratch buffer of at least n bytes whose contents need not survive: grown to n and an
 * eighth (not doubled: a doubled buffer can pass a cap on memory kept between reads, and is
 * then freed and faulted in anew each time), by a new allocation rather than realloc's copy of
 * stale bytes. False (the buffer freed) when that fails. */
static inline bool
grow_scratch(uint8_t **a, size_t *cap, size_t n)
{
    if (n <= *cap) return true;
    free(*a);
    *a = NULL;
    *cap = 0;
    if (n > SIZE_MAX / 9 * 8) return false;
    size_t c = n + n / 8;
    if (!(*a = malloc(c))) return false;
    *cap = c;
    return true;
}

/* ---- landing rows (shared by exec.c and rows.c) ------------------------------------------ */

/* n lines of nb bytes, line r from u + r*us to o + r*os, with a fixed-size move for the common
 * widths (a call into memcpy per short line was most of the copying of small samples and of
 * nvalchemi's column chunks). */
static inline void
copy_lines(uint8_t *o, size_t os, const uint8_t *u, size_t us, uint64_t n, size_t nb)
{
#define ZB_COPY_LINES(W)                                                                           \
    for (uint64_t r = 0; r < n; r++, u += us, o += os) memcpy(o, u, W);                            \
    break
    switch (nb) {
    case 1:
        ZB_COPY_LINES(1);
    case 2:
        ZB_COPY_LINES(2);
    case 4:
        ZB_COPY_LINES(4);
    case 8:
        ZB_COPY_LINES(8);
    case 12:
        ZB_COPY_LINES(12);
    case 16:
        ZB_COPY_LINES(16);
    case 24:
        ZB_COPY_LINES(24);
    case 32:
        ZB_COPY_LINES(32);
    case 48:
        ZB_COPY_LINES(48);
    case 64:
        ZB_COPY_LINES(64);
    default:
        ZB_COPY_LINES(nb);
    }
#undef ZB_COPY_LINES
}

/* Whether the tasks re-base field f's rows as they land. */
static inline bool
rebased_here(const plan *p, uint32_t f)
{
    return p->rb && p->rb[f].in_tasks;
}

/* Whether child c's values of field f are converted as they land (a collection's categorical
 * codes: another width, or through its table, merge.c; narrow stored values widened to the
 * delivered dtype, widen.c), and the table (NULL: none). A converted field loses the paths
 * that land stored bytes in the batch as they are (a unit decoded straight into it, raw rows
 * read into it): its units decode into per-thread scratch and zb__values_convert copies them out
 * while they are hot in cache. */
static inline bool
converted(const plan *p, uint32_t f, uint32_t c, const int64_t **lut, uint64_t *nlut)
{
    *lut = NULL;
    *nlut = 0;
    if (p->ds->maps) *lut = zb__dataset_lut(p->ds, f, c, nlut);
    return *lut || child_of(p->ds, c)->fields[f].dtype != p->b->fields[f].dtype;
}

/* The values child c's field f must hold, [lo, lo + span), checked as its rows land (rows.c):
 * CSR column ids within [0, n_vars) of their matrix, categorical codes within their categories
 * (-1, missing, allowed; codes going through a collection's table are checked by it,
 * zb__codes_convert). `on` false: the field's values are not checked. */
typedef struct vbound {
    bool on;
    int64_t lo;
    uint64_t span;
} vbound;

static inline vbound
field_bound(const zb_dataset *ds, uint32_t f, uint32_t c)
{
    const zb__field *fd = &child_of(ds, c)->fields[f];
    uint64_t nlut;
    if (fd->col_bound && fd->seg >= 0) return (vbound){true, 0, fd->col_bound};
    if (!fd->categorical || fd->kind != ZB_FIELD_PER_SAMPLE || zb__dataset_lut(ds, f, c, &nlut))
        return (vbound){false, 0, 0};
    /* the table was loaded when the request was planned (plan_checks) */
    return (vbound){true, -1, fd->cats.n + 1};
}

/* field_bound for a plan's tasks (looked up once per unit they serve). */
static inline vbound
value_bound(const plan *p, uint32_t f, uint32_t c)
{
    return p->checked[f] ? field_bound(p->ds, f, c) : (vbound){false, 0, 0};
}

/* Bytes of rows of field f into the batch: streamed past the cache when the batch outgrows it,
 * unless the task re-bases them next (they are read again at once; a range check reads the
 * source instead, still in cache). */
static inline void
put_bytes(const plan *p, uint32_t f, uint8_t *dst, const uint8_t *src, size_t n)
{
    if (p->stream && !rebased_here(p, f))
        zb__stream_copy(dst, src, n);
    else
        memcpy(dst, src, n);
}

/* ---- rows.c -------------------------------------------------------------------------------- */

/* Copies rows [src_row, src_row + n) of a decoded unit at unit coordinates g (logical C order,
 * shape u->inner) that covers part of the other axes into batch field bf from dst_row on. */
void zb__rows_copy_box(const zb__unit_geom *u, const bfield *bf, const uint8_t *unit,
                       const uint64_t *g, uint64_t src_row, uint64_t dst_row, uint64_t n);

/* Lands copy c's rows whole from the K units of its unit row of a 2-d field chunked by columns
 * (cols[k]: unit k decoded, w columns of each row, the last cut at the row's end), the columns
 * interleaved in one pass over the rows; an index field the tasks re-base is re-based in the
 * same pass ([N, 2] of int32/int64: nvalchemi's neighbor_list) or right after it, with
 * zb__rows_rebase's checks and errors. */
zb_status zb__rows_zip(const plan *p, const copy *c, const uint8_t *const *cols, size_t K,
                       uint64_t w);

/* Checks the values copy c has just landed in the batch against vb, its field's value_bound,
 * reading them at `vals` (the bytes the copy was made from, of the batch's dtype, hotter in
 * cache than a streamed batch) or, when NULL, in the batch: ZB_E_CORRUPT naming the sample id,
 * the field, the value, its stored row and the chunk holding it when one lies outside. */
zb_status zb__rows_check(const plan *p, const copy *c, vbound vb, const uint8_t *vals);

/* Lands the rows of copy c, stored as `from` at src, converted into the batch
 * (zb__values_convert: widened, or codes through the table lut[0..nlut)), and checks them
 * against vb as zb__rows_check does, in the same pass where the conversion can. `what`: the
 * array, for the conversion's own errors. Inline: it runs once per copy. */
static inline zb_status
rows_convert(const plan *p, const copy *c, vbound vb, const uint8_t *src, zb_dtype from,
             const int64_t *lut, uint64_t nlut, const char *what)
{
    const bfield *bf = &p->b->fields[c->field];
    uint64_t got;
    zb_status st = zb__values_convert(bf->data + c->dst_row * bf->row_elems * bf->itemsize,
                                      bf->dtype, src, from, c->nrows * bf->row_elems, lut, nlut,
                                      what, vb.lo, vb.on ? &got : NULL);
    if (st != ZB_OK || !vb.on || got < vb.span) return st;
    /* out of range, or the conversion could not tell: the values as they landed */
    return zb__rows_check(p, c, vb, NULL);
}

/* Re-bases rows [row0, row0 + nrows) x columns [c0, c1) of index field f, sample by sample:
 * in the tasks, the rows one copy has just written (still in cache); after them (reader.c),
 * every row of a field the tasks do not re-base. A value outside its sample's target rows is
 * ZB_E_CORRUPT naming the sample and field. */
zb_status zb__rows_rebase(const plan *p, uint32_t f, uint64_t row0, uint64_t nrows, uint64_t c0,
                          uint64_t c1);

/* ---- batch.c ------------------------------------------------------------------------------- */

/* A block of at least `need` bytes from the pool (*cap: its size), which takes a reference
 * for the batch; NULL when out of memory (the reference is still taken: drop it with
 * zb__arena_pool_unref). */
void *zb__arena_take(zb__arena_pool *p, size_t need, size_t *cap);

/* Returns a block and drops the batch's reference. */
void zb__arena_give(zb__arena_pool *p, void *blk, size_t cap);

/* ---- plan.c -------------------------------------------------------------------------------- */

/* A kept plan memory of the dataset, or a new empty one (NULL when out of memory). */
zb__plan_mem *zb__plan_mem_take(zb_dataset *ds);

/* Returns a plan memory to the dataset (kept within its bounds, freed otherwise). */
void zb__plan_mem_give(zb_dataset *ds, zb__plan_mem *m);

/* Plans a request of ids[0..n) into p (set up by zb__plan_begin): the batch's index, segments,
 * field buffers, the sorted copies, the tasks and the re-base plan of index fields (to the
 * caller's batches, b->groups, set before). */
zb_status zb__plan_request(plan *p, const uint64_t *ids, uint64_t nlogical);

/* Starts a plan of n samples over ds: a new batch (p->b) and the plan's memory (p->m, kept
 * by ds). On failure p->m may be set: end the plan and free the batch as after a request. */
zb_status zb__plan_begin(plan *p, zb_dataset *ds, size_t n);

/* Hands the plan's memory back to the dataset (the tasks' messages freed). */
void zb__plan_end(plan *p);

/* Logical id -> (child, physical row); ZB_E_RANGE naming the id when id >= nlogical. */
zb_status zb__plan_locate(const zb_dataset *ds, uint64_t id, uint64_t nlogical, uint32_t *child,
                          uint64_t *phys);

/* ---- exec.c -------------------------------------------------------------------------------- */

/* Runs the plan's tasks (on the dataset's pool, or inline when the work is small; through one
 * list read for stores that read lists themselves), adds their statistics to the batch and
 * returns the first task's failure. */
zb_status zb__exec_run(plan *p);

#endif
