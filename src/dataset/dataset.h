/* Datasets (internal view): fields, segments, layouts, masks, collections. */
#ifndef ZB_DATASET_DATASET_H
#define ZB_DATASET_DATASET_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "util/pool.h"
#include "zarr/array.h"
#include "zbatch.h"

#define ZB_MAX_FIELDS 256
#define ZB_MAX_SEGMENTS 8

/* A pointer array ptr[N+1], read lazily chunk by chunk and kept as int64. */
typedef struct zb_segment {
    char name[32];
    zb_array *ptr;
    uint64_t chunk_rows; /* rows per cached block (the array's read unit along axis 0) */
    uint64_t nblocks;
    int64_t **blocks;    /* [nblocks], NULL until loaded; guarded by mu */
    pthread_mutex_t mu;
} zb_segment;

/* One field of one child: the array behind it. */
typedef struct zb_field {
    char *name;
    zb_field_kind kind;
    zb_dtype dtype;
    size_t itemsize;
    int ndim;                         /* of one row */
    uint64_t row_shape[ZB_MAX_DIMS];
    uint64_t row_elems;
    int seg;                          /* segment index (ragged/index), else -1 */
    int target;                       /* index: target segment, else -1 */
    bool categorical;
    bool global_index;                /* index values are store-global (nvalchemi): subtract ptr */
    zb_array *arr;                    /* the values */
    char *cats_path;                  /* categorical: the categories array path */
    zb_strings cats;                  /* loaded on first request */
    bool cats_loaded;
} zb_field;

/* A soft-delete mask: logical i is the i-th true (FORMATS.md §8.2). Loaded on first use. */
typedef struct zb_mask {
    zb_array *arr;        /* NULL: no mask, logical == physical */
    bool loaded;
    uint8_t *bits;        /* [nphys] 0/1 */
    uint64_t *rank;       /* [nblocks+1] trues before each block of MASK_BLOCK samples */
    uint64_t nlogical;
    uint64_t n;           /* entries used: the committed samples */
    pthread_mutex_t mu;
} zb_mask;

typedef struct zb_cache zb_cache;
typedef struct zb_arena_pool zb_arena_pool;

/* Reused batch memory (reader.c): a pool of blocks shared by a dataset and its batches. */
zb_status zb_arena_pool_new(zb_arena_pool **out);
void zb_arena_pool_unref(zb_arena_pool *p);

/* read_many's plan memory kept between requests (reader.c); freed by zb_dataset_close. */
typedef struct zb_plan_mem zb_plan_mem;
void zb_plan_mem_release_all(zb_dataset *ds);

struct zb_dataset {
    zb_store *store;
    char *path;
    char layout[24];
    zb_dataset_opts opts;
    uint64_t nphys;          /* physical samples */
    uint64_t n_vars;
    zb_mask mask;
    size_t nfields;
    zb_field fields[ZB_MAX_FIELDS];
    size_t nsegs;
    zb_segment segs[ZB_MAX_SEGMENTS];
    /* collections: children and their cumulative logical sizes */
    size_t nchildren;
    zb_dataset **children;
    uint64_t *child_start;   /* [nchildren+1] */
    /* shared by every read */
    zb_pool *pool;
    pthread_mutex_t pool_mu; /* one read_many at a time drives the pool */
    zb_cache *cache;
    zb_cache *index_cache;   /* decoded shard indexes, always on (bounded) */
    zb_arena_pool *arenas;   /* batch memory, reused across reads */
    pthread_mutex_t plan_mu;
    struct zb_plan_mem *plan_free; /* read_many's plan memory, reused across reads (reader.c) */
    size_t plan_nfree;
    bool is_child;
    bool borrowed;           /* children belong to the caller (zb_dataset_concat) */
};

/* Layout builders (layouts.c). Each fills fields/segments of ds from the tree. */
struct zb_tree;
zb_status zb_layout_anndata(zb_dataset *ds, const struct zb_tree *tree, const char *base);
zb_status zb_layout_atomic(zb_dataset *ds, const struct zb_tree *tree, const char *base);
zb_status zb_layout_generic(zb_dataset *ds, const struct zb_tree *tree, const char *base);

/* The level ("atom", "edge", "system" or the attribute's own word) of array `name` in group
 * `group` ("core" or "custom") of an atomic store whose root `fields` attribute is `fields`
 * (may be NULL), per FORMATS.md §8.1-8.2. The reader and `zbatch verify` share it. */
struct json_object;
const char *zb_atomic_array_level(struct json_object *fields, const char *group, const char *name);

/* Segment access: ptr[i] for i in [0, N]; thread-safe. */
zb_status zb_segment_get(zb_segment *seg, zb_ctx *ctx, uint64_t i, int64_t *value);

/* Logical -> physical through the mask (thread-safe, loads the mask on first use). */
zb_status zb_mask_load(zb_dataset *ds);
uint64_t zb_mask_select(const zb_mask *m, uint64_t logical);

/* Decoded-chunk cache (cache.c): keys are (array pointer, unit index). */
zb_status zb_cache_new(size_t max_bytes, zb_cache **out);
void zb_cache_free(zb_cache *c);
/* Copies the cached unit into dst (dst_len bytes) and returns true on a hit. */
bool zb_cache_get(zb_cache *c, const void *arr, uint64_t unit, void *dst, size_t dst_len);
/* Bytes [off, off + len) of an entry of whole_len bytes (a hit needs that length). */
bool zb_cache_get_part(zb_cache *c, const void *arr, uint64_t unit, size_t whole_len, size_t off,
                       void *dst, size_t len);
bool zb_cache_contains(zb_cache *c, const void *arr, uint64_t unit);
void zb_cache_put(zb_cache *c, const void *arr, uint64_t unit, const void *src, size_t len);

#endif
