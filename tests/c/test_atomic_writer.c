/* The atomic layout writer (include/zbatch_atomic.h): layout and values of new stores, the
 * store-global neighbor_list on write and append, all-or-nothing appends, soft delete,
 * add_custom, defragment (re-offset, swap), the §8.2 checks, and crash safety by fault
 * injection (every mutation of an append, a new write and a defragment fails in turn). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "support/testutil.h"
#include "util/json.h"
#include "write/atomistic_int.h"
#include "write/write.h"

/* ------------------------------------------------------------------------------------------- */
/* Synthetic samples: every value is a function of the sample's source id g                     */
/* ------------------------------------------------------------------------------------------- */

static int64_t
n_atoms_of(uint64_t g)
{
    return 2 + (int64_t)(g % 3);
}

static int64_t
n_edges_of(uint64_t g)
{
    return g % 4 == 3 ? 0 : n_atoms_of(g); /* a ring, or no edges at all */
}

static float
pos_of(uint64_t g, int64_t a, int d)
{
    return (float)g * 1000.0f + (float)a * 10.0f + (float)d;
}

/* The fields of samples ids[0..n): buffers owned by the block. */
typedef struct block {
    uint64_t n;
    int64_t atoms[64], edges[64];
    float pos[1024 * 3], forces[1024 * 3], energy[64], cell[64 * 9], shifts[1024 * 3];
    int64_t numbers[1024], nlist[1024 * 2];
    uint8_t pbc[64 * 3];
    float charges[1024];
    zb_atomic_field f[10];
    size_t nf;
} block;

static const uint64_t SHAPE3[1] = {3}, SHAPE33[2] = {3, 3}, SHAPE2[1] = {2}, SHAPE1[1] = {1};

static void
block_make(block *b, const uint64_t *ids, uint64_t n, bool with_forces, bool with_charges)
{
    memset(b, 0, sizeof *b);
    b->n = n;
    uint64_t v = 0, e = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t g = ids[i];
        b->atoms[i] = n_atoms_of(g);
        b->edges[i] = n_edges_of(g);
        for (int64_t a = 0; a < b->atoms[i]; a++, v++) {
            for (int d = 0; d < 3; d++) {
                b->pos[3 * v + (uint64_t)d] = pos_of(g, a, d);
                b->forces[3 * v + (uint64_t)d] = -pos_of(g, a, d);
            }
            b->numbers[v] = 1 + (int64_t)((g + (uint64_t)a) % 8);
            b->charges[v] = (float)g + 0.5f * (float)a;
        }
        for (int64_t k = 0; k < b->edges[i]; k++, e++) {
            b->nlist[2 * e] = k;
            b->nlist[2 * e + 1] = (k + 1) % b->atoms[i];
            for (int d = 0; d < 3; d++)
                b->shifts[3 * e + (uint64_t)d] = (float)g + 0.25f * (float)k + (float)d;
        }
        b->energy[i] = -(float)g - 0.5f;
        for (int k = 0; k < 9; k++) b->cell[9 * i + (uint64_t)k] = k % 4 == 0 ? (float)g + 1 : 0;
        for (int d = 0; d < 3; d++) b->pbc[3 * i + (uint64_t)d] = (uint8_t)(d < 2 || g % 2);
    }
    zb_atomic_field *f = b->f;
    size_t k = 0;
    f[k++] =
        (zb_atomic_field){"core", "positions", ZB_ATOMIC_ATOM, ZB_DT_FLOAT32, 1, SHAPE3, b->pos};
    f[k++] =
        (zb_atomic_field){NULL, "atomic_numbers", ZB_ATOMIC_ATOM, ZB_DT_INT64, 0, NULL, b->numbers};
    if (with_forces)
        f[k++] = (zb_atomic_field){"core", "forces", ZB_ATOMIC_ATOM, ZB_DT_FLOAT32,
                                   1,      SHAPE3,   b->forces};
    f[k++] =
        (zb_atomic_field){"core", "energy", ZB_ATOMIC_SYSTEM, ZB_DT_FLOAT32, 1, SHAPE1, b->energy};
    f[k++] =
        (zb_atomic_field){"core", "cell", ZB_ATOMIC_SYSTEM, ZB_DT_FLOAT32, 2, SHAPE33, b->cell};
    f[k++] = (zb_atomic_field){"core", "pbc", ZB_ATOMIC_SYSTEM, ZB_DT_BOOL, 1, SHAPE3, b->pbc};
    f[k++] = (zb_atomic_field){"core", "neighbor_list", ZB_ATOMIC_EDGE, ZB_DT_INT64,
                               1,      SHAPE2,          b->nlist};
    f[k++] =
        (zb_atomic_field){"core", "shifts", ZB_ATOMIC_EDGE, ZB_DT_FLOAT32, 1, SHAPE3, b->shifts};
    if (with_charges)
        f[k++] = (zb_atomic_field){"custom", "charges", ZB_ATOMIC_ATOM, ZB_DT_FLOAT32,
                                   0,        NULL,      b->charges};
    b->nf = k;
}

static void
add_ids(zb_atomic_writer *w, uint64_t first, uint64_t n, bool with_charges)
{
    uint64_t ids[64];
    for (uint64_t i = 0; i < n; i++) ids[i] = first + i;
    block *b = malloc(sizeof *b);
    block_make(b, ids, n, true, with_charges);
    ZB_ASSERT_OK(zb_atomic_writer_add(w, n, b->atoms, b->edges, b->nf, b->f));
    free(b);
}

static void
write_store(zb_store *s, const char *path, uint64_t first, uint64_t n)
{
    zb_atomic_writer *w = NULL;
    ZB_ASSERT_OK(zb_atomic_writer_open(s, path, NULL, &w));
    add_ids(w, first, n, false);
    ZB_ASSERT_OK(zb_atomic_writer_commit(w));
    zb_atomic_writer_close(w);
}

static void
append_store(zb_store *s, const char *path, uint64_t first, uint64_t n)
{
    zb_atomic_writer *w = NULL;
    ZB_ASSERT_OK(zb_atomic_writer_open_append(s, path, NULL, &w));
    add_ids(w, first, n, false);
    ZB_ASSERT_OK(zb_atomic_writer_commit(w));
    zb_atomic_writer_close(w);
}

/* ------------------------------------------------------------------------------------------- */
/* Reading back                                                                                 */
/* ------------------------------------------------------------------------------------------- */

static void *
read_all_rows(zb_store *s, const char *path, const char *arr, uint64_t *rows)
{
    char key[512];
    snprintf(key, sizeof key, "%s%s%s", path, path[0] ? "/" : "", arr);
    zb_array *a = NULL;
    ZB_ASSERT_OK(zb_array_open(s, key, &a));
    zb_array_info info;
    ZB_ASSERT_OK(zb_array_get_info(a, &info));
    size_t bytes = (size_t)(info.shape[0] * zb_array_row_elems(a) * info.itemsize);
    void *buf = malloc(bytes + 1);
    ZB_ASSERT_OK(zb_array_read_rows(a, 0, info.shape[0], buf, bytes, NULL));
    *rows = info.shape[0];
    zb_array_close(a);
    return buf;
}

static json_object *
root_attrs(zb_store *s, const char *path)
{
    char key[512];
    snprintf(key, sizeof key, "%s%szarr.json", path, path[0] ? "/" : "");
    uint8_t *text = NULL;
    uint64_t len = 0;
    ZB_ASSERT_OK(zb_store_read_all(s, key, &text, &len));
    json_object *doc = NULL;
    ZB_ASSERT_OK(zb__json_parse((const char *)text, (size_t)len, key, &doc));
    free(text);
    json_object *a = json_object_get(zb__json_get(doc, "attributes"));
    json_object_put(doc);
    return a;
}

static int64_t
num_samples_attr(zb_store *s, const char *path)
{
    json_object *a = root_attrs(s, path);
    int64_t n = json_object_get_int64(zb__json_get(a, "num_samples"));
    json_object_put(a);
    return n;
}

/* Checks every live sample against the source ids expected, in order: the values of each
 * field, and the stored neighbor_list = local + atoms_ptr[p] (FORMATS.md §8.3). */
static void
verify_samples(zb_store *s, const char *path, const uint64_t *expect, uint64_t n_expect)
{
    zb_atomic_summary sum;
    ZB_ASSERT_OK(zb_atomic_check(s, path, &sum));
    assert_int_equal(sum.num_live, n_expect);
    uint64_t rows;
    int64_t *ap = read_all_rows(s, path, "meta/atoms_ptr", &rows);
    int64_t *ep = read_all_rows(s, path, "meta/edges_ptr", &rows);
    uint8_t *mask = read_all_rows(s, path, "meta/samples_mask", &rows);
    float *pos = read_all_rows(s, path, "core/positions", &rows);
    int64_t *num = read_all_rows(s, path, "core/atomic_numbers", &rows);
    float *en = read_all_rows(s, path, "core/energy", &rows);
    float *cell = read_all_rows(s, path, "core/cell", &rows);
    uint8_t *pbc = read_all_rows(s, path, "core/pbc", &rows);
    int64_t *nl = read_all_rows(s, path, "core/neighbor_list", &rows);
    float *sh = read_all_rows(s, path, "core/shifts", &rows);
    uint64_t live = 0;
    for (uint64_t p = 0; p < sum.num_samples; p++) {
        if (!mask[p]) continue;
        assert_true(live < n_expect);
        uint64_t g = expect[live++];
        assert_int_equal(ap[p + 1] - ap[p], n_atoms_of(g));
        assert_int_equal(ep[p + 1] - ep[p], n_edges_of(g));
        for (int64_t a = 0; a < n_atoms_of(g); a++) {
            uint64_t r = (uint64_t)(ap[p] + a);
            for (int d = 0; d < 3; d++) assert_true(pos[3 * r + (uint64_t)d] == pos_of(g, a, d));
            assert_int_equal(num[r], 1 + (int64_t)((g + (uint64_t)a) % 8));
        }
        assert_true(en[p] == -(float)g - 0.5f);
        assert_true(cell[9 * p] == (float)g + 1 && cell[9 * p + 1] == 0);
        assert_int_equal(pbc[3 * p + 2], g % 2);
        for (int64_t k = 0; k < n_edges_of(g); k++) {
            uint64_t r = (uint64_t)(ep[p] + k);
            assert_int_equal(nl[2 * r], k + ap[p]);
            assert_int_equal(nl[2 * r + 1], (k + 1) % n_atoms_of(g) + ap[p]);
            assert_true(sh[3 * r + 1] == (float)g + 0.25f * (float)k + 1.0f);
        }
    }
    assert_int_equal(live, n_expect);
    free(ap), free(ep), free(mask), free(pos), free(num), free(en), free(cell), free(pbc);
    free(nl), free(sh);
}

/* ------------------------------------------------------------------------------------------- */
/* Store snapshots (memory stores): every key and its bytes                                     */
/* ------------------------------------------------------------------------------------------- */

typedef struct snap {
    size_t n;
    char *keys[4096];
    uint8_t *data[4096];
    uint64_t len[4096];
} snap;

typedef struct walk_arg {
    zb_store *s;
    snap *sn;
    const char *prefix;
} walk_arg;

static void snap_walk(zb_store *s, snap *sn, const char *prefix);

static int
snap_cb(void *ctx, const char *name, bool is_dir)
{
    walk_arg *w = ctx;
    char key[1024];
    snprintf(key, sizeof key, "%s%s%s", w->prefix, w->prefix[0] ? "/" : "", name);
    if (is_dir) {
        snap_walk(w->s, w->sn, key);
        return 0;
    }
    assert_true(w->sn->n < 4096);
    w->sn->keys[w->sn->n] = strdup(key);
    ZB_ASSERT_OK(zb_store_read_all(w->s, key, &w->sn->data[w->sn->n], &w->sn->len[w->sn->n]));
    w->sn->n++;
    return 0;
}

static void
snap_walk(zb_store *s, snap *sn, const char *prefix)
{
    walk_arg w = {s, sn, prefix};
    ZB_ASSERT_OK(zb_store_list(s, prefix, snap_cb, &w));
}

static snap *
snap_take(zb_store *s)
{
    snap *sn = calloc(1, sizeof *sn);
    snap_walk(s, sn, "");
    return sn;
}

static const uint8_t *
snap_find(const snap *sn, const char *key, uint64_t *len)
{
    for (size_t i = 0; i < sn->n; i++)
        if (!strcmp(sn->keys[i], key)) {
            *len = sn->len[i];
            return sn->data[i];
        }
    return NULL;
}

static void
snap_assert_equal(const snap *a, const snap *b)
{
    assert_int_equal(a->n, b->n);
    for (size_t i = 0; i < a->n; i++) {
        uint64_t len = 0;
        const uint8_t *d = snap_find(b, a->keys[i], &len);
        if (!d) fail_msg("key %s vanished", a->keys[i]);
        assert_int_equal(len, a->len[i]);
        assert_memory_equal(d, a->data[i], len);
    }
}

static void
snap_free(snap *sn)
{
    for (size_t i = 0; i < sn->n; i++) {
        free(sn->keys[i]);
        free(sn->data[i]);
    }
    free(sn);
}

static void
snap_put_all(zb_store *s, const snap *sn)
{
    for (size_t i = 0; i < sn->n; i++)
        ZB_ASSERT_OK(zb_store_put(s, sn->keys[i], sn->data[i], sn->len[i]));
}

/* A memory store holding a copy of `sn`. */
static zb_store *
snap_restore(const snap *sn)
{
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    snap_put_all(s, sn);
    return s;
}

/* ------------------------------------------------------------------------------------------- */
/* A store that "crashes": its fail_at-th mutation (put, erase, rename) and every later one    */
/* fail, as if the process had died there; reads keep working                                  */
/* ------------------------------------------------------------------------------------------- */

typedef struct crash_store {
    zb_store *base;
    int count, fail_at;
} crash_store;

static bool
crash_now(crash_store *c)
{
    return ++c->count >= c->fail_at;
}

static zb_status
c_get(void *self, const char *key, uint64_t off, uint64_t len, void *dst, uint64_t *nread)
{
    return zb_store_get(((crash_store *)self)->base, key, off, len, dst, nread);
}
static zb_status
c_size(void *self, const char *key, uint64_t *size)
{
    return zb_store_size(((crash_store *)self)->base, key, size);
}
static zb_status
c_list(void *self, const char *prefix, zb_list_fn fn, void *ctx)
{
    return zb_store_list(((crash_store *)self)->base, prefix, fn, ctx);
}
static zb_status
c_put(void *self, const char *key, const void *data, uint64_t length)
{
    crash_store *c = self;
    if (crash_now(c)) return ZB_E_IO;
    return zb_store_put(c->base, key, data, length);
}
static zb_status
c_erase(void *self, const char *key)
{
    crash_store *c = self;
    if (crash_now(c)) return ZB_E_IO;
    return zb_store_erase(c->base, key);
}
static zb_status
c_rename(void *self, const char *from, const char *to)
{
    crash_store *c = self;
    if (crash_now(c)) return ZB_E_IO;
    return zb_store_rename(c->base, from, to);
}
static void
c_close(void *self)
{
    free(self);
}

static const zb_store_methods crash_methods = {.scheme = "crash",
                                               .get = c_get,
                                               .size = c_size,
                                               .list = c_list,
                                               .put = c_put,
                                               .erase = c_erase,
                                               .rename = c_rename,
                                               .close = c_close};

static zb_store *
crash_wrap(zb_store *base, int fail_at)
{
    crash_store *c = calloc(1, sizeof *c);
    c->base = base;
    c->fail_at = fail_at;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_new(&crash_methods, c, &s));
    return s;
}

/* ------------------------------------------------------------------------------------------- */
/* Tests                                                                                        */
/* ------------------------------------------------------------------------------------------- */

static void
test_write_layout(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zb_atomic_writer *w = NULL;
    ZB_ASSERT_OK(zb_atomic_writer_open(s, "ds", NULL, &w));
    assert_true(zb__at_has_key(s, "ds/" ZB_INCOMPLETE_MARKER));
    add_ids(w, 0, 3, true);
    add_ids(w, 3, 2, true);
    assert_int_equal(zb_atomic_writer_num_samples(w), 5);
    /* nothing is a store before commit */
    zb_atomic_summary sum;
    ZB_ASSERT_ERR(zb_atomic_check(s, "ds", &sum), ZB_E_INCOMPLETE, "never committed");
    ZB_ASSERT_OK(zb_atomic_writer_commit(w));
    zb_atomic_writer_close(w);
    assert_false(zb__at_has_key(s, "ds/" ZB_INCOMPLETE_MARKER));

    json_object *a = root_attrs(s, "ds");
    assert_int_equal(json_object_get_int64(zb__json_get(a, "num_samples")), 5);
    json_object *core = zb__json_get(zb__json_get(a, "fields"), "core");
    assert_string_equal(json_object_get_string(zb__json_get(core, "positions")), "atom");
    assert_string_equal(json_object_get_string(zb__json_get(core, "neighbor_list")), "edge");
    assert_string_equal(json_object_get_string(zb__json_get(core, "energy")), "system");
    json_object *custom = zb__json_get(zb__json_get(a, "fields"), "custom");
    assert_string_equal(json_object_get_string(zb__json_get(custom, "charges")), "atom");
    json_object_put(a);

    uint64_t rows;
    int64_t *ap = read_all_rows(s, "ds", "meta/atoms_ptr", &rows);
    assert_int_equal(rows, 6);
    int64_t want_ap[6] = {0, 2, 5, 9, 11, 14};
    assert_memory_equal(ap, want_ap, sizeof want_ap);
    free(ap);
    int64_t *ep = read_all_rows(s, "ds", "meta/edges_ptr", &rows);
    int64_t want_ep[6] = {0, 2, 5, 9, 9, 12};
    assert_memory_equal(ep, want_ep, sizeof want_ep);
    free(ep);
    float *en = read_all_rows(s, "ds", "core/energy", &rows);
    assert_int_equal(rows, 5);
    free(en);
    zb_array *arr = NULL;
    ZB_ASSERT_OK(zb_array_open(s, "ds/core/cell", &arr));
    zb_array_info info;
    zb_array_get_info(arr, &info);
    assert_int_equal(info.ndim, 3);
    assert_int_equal(info.shape[0], 5);
    assert_int_equal(info.shape[2], 3);
    assert_int_equal(info.zarr_format, 3);
    zb_array_close(arr);
    uint8_t *am = read_all_rows(s, "ds", "meta/atoms_mask", &rows);
    assert_int_equal(rows, 14);
    for (uint64_t i = 0; i < rows; i++) assert_int_equal(am[i], 1);
    free(am);

    ZB_ASSERT_OK(zb_atomic_check(s, "ds", &sum));
    assert_int_equal(sum.num_samples, 5);
    assert_int_equal(sum.num_live, 5);
    assert_int_equal(sum.num_atoms, 14);
    assert_int_equal(sum.num_edges, 12);
    assert_int_equal(sum.num_fields, 9);
    assert_false(sum.uncommitted_tail);
    uint64_t ids[5] = {0, 1, 2, 3, 4};
    verify_samples(s, "ds", ids, 5);
    zb_store_close(s);
}

/* Compression threads and tiny chunks and shards: many objects in flight, same values. */
static void
test_threads_and_shards(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zb_atomic_write_config cfg = ZB_ATOMIC_WRITE_CONFIG_DEFAULT;
    cfg.num_threads = 4;
    cfg.core.chunk_rows = 3;
    cfg.core.shard_rows = 12;
    cfg.meta.chunk_rows = 5;
    zb_atomic_override ov[1] = {
        {"neighbor_list", {"blosc:zstd:3:bitshuffle", 7, ZB_ATOMIC_NO_SHARDS}}};
    cfg.overrides = ov;
    cfg.n_overrides = 1;
    zb_atomic_writer *w = NULL;
    ZB_ASSERT_OK(zb_atomic_writer_open(s, "t", &cfg, &w));
    for (uint64_t first = 0; first < 60; first += 20) add_ids(w, first, 20, false);
    ZB_ASSERT_OK(zb_atomic_writer_commit(w));
    zb_atomic_writer_close(w);
    zb_array *a = NULL;
    zb_array_info info;
    ZB_ASSERT_OK(zb_array_open(s, "t/core/neighbor_list", &a));
    zb_array_get_info(a, &info);
    assert_null(info.shard_shape);
    assert_int_equal(info.chunk_shape[0], 7);
    assert_non_null(strstr(info.codecs, "blosc"));
    zb_array_close(a);
    ZB_ASSERT_OK(zb_array_open(s, "t/core/positions", &a));
    zb_array_get_info(a, &info);
    assert_int_equal(info.shard_shape[0], 12);
    assert_int_equal(info.chunk_shape[0], 3);
    zb_array_close(a);
    zb_atomic_writer *w2 = NULL;
    ZB_ASSERT_OK(zb_atomic_writer_open_append(s, "t", &cfg, &w2));
    add_ids(w2, 60, 20, false);
    ZB_ASSERT_OK(zb_atomic_writer_commit(w2));
    zb_atomic_writer_close(w2);
    uint64_t ids[80];
    for (uint64_t i = 0; i < 80; i++) ids[i] = i;
    verify_samples(s, "t", ids, 80);
    zb_store_close(s);
}

/* Chunk and shard rows of array `path`, (0 shard rows when unsharded). */
static void
storage_of(zb_store *s, const char *path, uint64_t *chunk, uint64_t *shard)
{
    zb_array *a = NULL;
    zb_array_info info;
    ZB_ASSERT_OK(zb_array_open(s, path, &a));
    zb_array_get_info(a, &info);
    *chunk = info.chunk_shape[0];
    *shard = info.shard_shape ? info.shard_shape[0] : 0;
    zb_array_close(a);
}

/* The bottom of the storage chain: data arrays configured nowhere get inner chunks of about
 * ZB_ATOMIC_DEFAULT_CHUNK_BYTES in shards of ZB_ATOMIC_DEFAULT_SHARD_CHUNKS; meta arrays,
 * arrays with chunk_rows but no shard_rows, and ZB_ATOMIC_NO_SHARDS stay unsharded with
 * ~1 MiB chunks; shard_rows alone gets an automatic inner chunk dividing it. The values read
 * back are the samples written in every case. */
static void
test_default_storage(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zb_atomic_write_config cfg = ZB_ATOMIC_WRITE_CONFIG_DEFAULT;
    zb_atomic_override ov[3] = {{"forces", {NULL, 100, 0}},
                                {"energy", {NULL, 0, ZB_ATOMIC_NO_SHARDS}},
                                {"cell", {NULL, 0, 4096}}};
    cfg.overrides = ov;
    cfg.n_overrides = 3;
    zb_atomic_writer *w = NULL;
    ZB_ASSERT_OK(zb_atomic_writer_open(s, "d", &cfg, &w));
    add_ids(w, 0, 40, true);
    ZB_ASSERT_OK(zb_atomic_writer_commit(w));
    zb_atomic_writer_close(w);
    uint64_t chunk, shard;
    /* positions: float32 x 3 = 12-byte rows; neighbor_list: int64 x 2 = 16 bytes */
    storage_of(s, "d/core/positions", &chunk, &shard);
    assert_int_equal(chunk, 32768 / 12);
    assert_int_equal(shard, (32768 / 12) * 1024);
    storage_of(s, "d/core/neighbor_list", &chunk, &shard);
    assert_int_equal(chunk, 2048);
    assert_int_equal(shard, 2048 * 1024);
    storage_of(s, "d/custom/charges", &chunk, &shard);
    assert_int_equal(chunk, 32768 / 4);
    assert_int_equal(shard, 8192 * 1024);
    storage_of(s, "d/meta/atoms_ptr", &chunk, &shard);
    assert_int_equal(chunk, (1 << 20) / 8);
    assert_int_equal(shard, 0);
    storage_of(s, "d/core/forces", &chunk, &shard);
    assert_int_equal(chunk, 100);
    assert_int_equal(shard, 0);
    storage_of(s, "d/core/energy", &chunk, &shard);
    assert_int_equal(chunk, (1 << 20) / 4);
    assert_int_equal(shard, 0);
    storage_of(s, "d/core/cell", &chunk, &shard); /* 36-byte rows: 29,127 lowered to 4,096 */
    assert_int_equal(chunk, 4096);
    assert_int_equal(shard, 4096);
    uint64_t ids[40];
    for (uint64_t i = 0; i < 40; i++) ids[i] = i;
    verify_samples(s, "d", ids, 40);
    zb_store_close(s);
}

static void
test_append_offsets_and_all_or_nothing(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    write_store(s, "", 0, 3);
    append_store(s, "", 3, 4);
    append_store(s, "", 7, 1);
    uint64_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    verify_samples(s, "", ids, 8);
    assert_int_equal(num_samples_attr(s, ""), 8);

    /* a field missing, a field unknown, a bad index: each refused before anything is written */
    snap *before = snap_take(s);
    zb_atomic_writer *w = NULL;
    ZB_ASSERT_OK(zb_atomic_writer_open_append(s, "", NULL, &w));
    block *b = malloc(sizeof *b);
    uint64_t more[2] = {8, 9};
    block_make(b, more, 2, false, false);
    ZB_ASSERT_ERR(zb_atomic_writer_add(w, 2, b->atoms, b->edges, b->nf, b->f), ZB_E_INVALID,
                  "core/forces is missing");
    block_make(b, more, 2, true, true);
    ZB_ASSERT_ERR(zb_atomic_writer_add(w, 2, b->atoms, b->edges, b->nf, b->f), ZB_E_INVALID,
                  "custom/charges is not in the store");
    block_make(b, more, 2, true, false);
    b->nlist[3] = 99;
    ZB_ASSERT_ERR(zb_atomic_writer_add(w, 2, b->atoms, b->edges, b->nf, b->f), ZB_E_INVALID,
                  "local index 99");
    b->nlist[3] = 0;
    b->f[0].dtype = ZB_DT_FLOAT64;
    ZB_ASSERT_ERR(zb_atomic_writer_add(w, 2, b->atoms, b->edges, b->nf, b->f), ZB_E_INVALID,
                  "dtype float64");
    /* non-finite values, named by sample and field; the required fields' shapes and types
     * (sample 8 has 4 atoms: its rows 0..3, sample 9's from 4) */
    b->f[0].dtype = ZB_DT_FLOAT32;
    b->pos[3 * 5 + 1] = NAN;
    ZB_ASSERT_ERR(zb_atomic_writer_add(w, 2, b->atoms, b->edges, b->nf, b->f), ZB_E_INVALID,
                  "sample 1 of this block: field core/positions: a non-finite value (NaN or "
                  "infinity) in row 5 of the block's atom rows");
    b->pos[3 * 5 + 1] = 0;
    b->energy[0] = -INFINITY;
    ZB_ASSERT_ERR(zb_atomic_writer_add(w, 2, b->atoms, b->edges, b->nf, b->f), ZB_E_INVALID,
                  "sample 0 of this block: field core/energy: a non-finite value");
    b->energy[0] = 0;
    b->f[0].shape = SHAPE2;
    ZB_ASSERT_ERR(zb_atomic_writer_add(w, 2, b->atoms, b->edges, b->nf, b->f), ZB_E_INVALID,
                  "core/positions must be atom level, floating point, with rows of shape (3)");
    b->f[0].shape = SHAPE3;
    b->f[1].dtype = ZB_DT_FLOAT64;
    ZB_ASSERT_ERR(zb_atomic_writer_add(w, 2, b->atoms, b->edges, b->nf, b->f), ZB_E_INVALID,
                  "core/atomic_numbers must be atom level, an integer type");
    b->f[1].dtype = ZB_DT_INT64;
    zb_atomic_writer_close(w);
    snap *after = snap_take(s);
    snap_assert_equal(before, after);
    snap_free(after);

    /* the writer stays usable after a refused add */
    ZB_ASSERT_OK(zb_atomic_writer_open_append(s, "", NULL, &w));
    b->pbc[0] = 2;
    b->f[0].dtype = ZB_DT_FLOAT32;
    ZB_ASSERT_ERR(zb_atomic_writer_add(w, 2, b->atoms, b->edges, b->nf, b->f), ZB_E_INVALID,
                  "bool element");
    block_make(b, more, 2, true, false);
    ZB_ASSERT_OK(zb_atomic_writer_add(w, 2, b->atoms, b->edges, b->nf, b->f));
    ZB_ASSERT_OK(zb_atomic_writer_commit(w));
    zb_atomic_writer_close(w);
    uint64_t ids10[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    verify_samples(s, "", ids10, 10);
    free(b);
    snap_free(before);
    zb_store_close(s);
}

static void
test_open_errors(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zb_atomic_writer *w = NULL;
    ZB_ASSERT_ERR(zb_atomic_writer_open_append(s, "nothing", NULL, &w), ZB_E_NOTFOUND, "nothing");
    assert_null(w);
    write_store(s, "ds", 0, 2);
    ZB_ASSERT_ERR(zb_atomic_writer_open(s, "ds", NULL, &w), ZB_E_INVALID, "already exists");
    zb_atomic_write_config cfg = ZB_ATOMIC_WRITE_CONFIG_DEFAULT;
    cfg.core.codec = "zstd:99";
    ZB_ASSERT_ERR(zb_atomic_writer_open(s, "x", &cfg, &w), ZB_E_INVALID, "core");
    cfg.core.codec = NULL;
    cfg.core.chunk_rows = 3;
    cfg.core.shard_rows = 8;
    ZB_ASSERT_ERR(zb_atomic_writer_open(s, "x", &cfg, &w), ZB_E_INVALID, "multiple");
    assert_false(zb__at_has_keys_below(s, "x"));

    /* a new store that never committed: refused, then cleared by a new open */
    ZB_ASSERT_OK(zb_atomic_writer_open(s, "crashed", NULL, &w));
    add_ids(w, 0, 2, false);
    zb_atomic_writer_close(w);
    ZB_ASSERT_ERR(zb_atomic_writer_open_append(s, "crashed", NULL, &w), ZB_E_INCOMPLETE,
                  "never committed");
    ZB_ASSERT_ERR(zb_atomic_recover(s, "crashed"), ZB_E_INCOMPLETE, NULL);
    write_store(s, "crashed", 5, 1);
    uint64_t id5 = 5;
    verify_samples(s, "crashed", &id5, 1);
    zb_store_close(s);
}

static void
test_delete_and_defragment(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("atomic_defrag");
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_file(dir, &s));
    zb_atomic_write_config cfg = ZB_ATOMIC_WRITE_CONFIG_DEFAULT;
    cfg.meta.chunk_rows = 4; /* several mask chunks, so deletes rewrite only some */
    cfg.core.chunk_rows = 5;
    zb_atomic_writer *w = NULL;
    ZB_ASSERT_OK(zb_atomic_writer_open(s, "ds.zarr", &cfg, &w));
    add_ids(w, 0, 12, false);
    ZB_ASSERT_OK(zb_atomic_writer_commit(w));
    zb_atomic_writer_close(w);

    uint64_t del1[3] = {1, 5, 1}; /* logical, duplicates allowed */
    ZB_ASSERT_OK(zb_atomic_delete(s, "ds.zarr", del1, 3));
    uint64_t del2[1] = {1}; /* now physical 2 */
    ZB_ASSERT_OK(zb_atomic_delete(s, "ds.zarr", del2, 1));
    uint64_t bad = 9; /* 9 live samples remain: 0..8 */
    ZB_ASSERT_ERR(zb_atomic_delete(s, "ds.zarr", &bad, 1), ZB_E_RANGE, "9 live");
    uint64_t live_ids[9] = {0, 3, 4, 6, 7, 8, 9, 10, 11};
    verify_samples(s, "ds.zarr", live_ids, 9);
    /* soft delete keeps the data (unlike nvalchemi), and clears atoms_mask for its rows */
    uint64_t rows;
    float *pos = read_all_rows(s, "ds.zarr", "core/positions", &rows);
    assert_true(pos[3 * 2] == pos_of(1, 0, 0));
    free(pos);
    uint8_t *am = read_all_rows(s, "ds.zarr", "meta/atoms_mask", &rows);
    int64_t *ap = read_all_rows(s, "ds.zarr", "meta/atoms_ptr", &rows);
    for (int64_t r = 0; r < ap[12]; r++) {
        int dead = (r >= ap[1] && r < ap[3]) || (r >= ap[5] && r < ap[6]);
        assert_int_equal(am[r], !dead);
    }
    free(am);
    free(ap);
    assert_int_equal(num_samples_attr(s, "ds.zarr"), 12);

    ZB_ASSERT_OK(zb_atomic_defragment(s, "ds.zarr", NULL));
    verify_samples(s, "ds.zarr", live_ids, 9);
    assert_int_equal(num_samples_attr(s, "ds.zarr"), 9);
    assert_false(zb__at_has_keys_below(s, "ds.zarr.zbatch-new"));
    assert_false(zb__at_has_keys_below(s, "ds.zarr.zbatch-old"));
    /* NULL config keeps each array's chunking */
    zb_array *arr = NULL;
    ZB_ASSERT_OK(zb_array_open(s, "ds.zarr/core/positions", &arr));
    zb_array_info info;
    zb_array_get_info(arr, &info);
    assert_int_equal(info.chunk_shape[0], 5);
    zb_array_close(arr);

    /* again (the first swap's emptied directories must not get in the way), with a config */
    uint64_t del3[2] = {0, 8};
    ZB_ASSERT_OK(zb_atomic_delete(s, "ds.zarr", del3, 2));
    cfg.core.codec = "blosc:lz4:5:shuffle";
    cfg.core.chunk_rows = 4;
    cfg.core.shard_rows = 8;
    ZB_ASSERT_OK(zb_atomic_defragment(s, "ds.zarr", &cfg));
    uint64_t live2[7] = {3, 4, 6, 7, 8, 9, 10};
    verify_samples(s, "ds.zarr", live2, 7);
    ZB_ASSERT_OK(zb_array_open(s, "ds.zarr/core/positions", &arr));
    zb_array_get_info(arr, &info);
    assert_non_null(info.shard_shape);
    assert_int_equal(info.shard_shape[0], 8);
    assert_non_null(strstr(info.codecs, "blosc"));
    zb_array_close(arr);
    /* appends after a defragment keep the offsets right */
    append_store(s, "ds.zarr", 20, 2);
    uint64_t live3[9] = {3, 4, 6, 7, 8, 9, 10, 20, 21};
    verify_samples(s, "ds.zarr", live3, 9);

    /* everything deleted: an empty store with every array */
    uint64_t all[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    ZB_ASSERT_OK(zb_atomic_delete(s, "ds.zarr", all, 9));
    ZB_ASSERT_OK(zb_atomic_defragment(s, "ds.zarr", NULL));
    zb_atomic_summary sum;
    ZB_ASSERT_OK(zb_atomic_check(s, "ds.zarr", &sum));
    assert_int_equal(sum.num_samples, 0);
    assert_int_equal(sum.num_fields, 8);
    append_store(s, "ds.zarr", 30, 1);
    uint64_t id30 = 30;
    verify_samples(s, "ds.zarr", &id30, 1);
    ZB_ASSERT_ERR(zb_atomic_defragment(s, "", NULL), ZB_E_INVALID, "store root");
    zb_store_close(s);
}

/* The reader's checks at open (metadata only): the required arrays, samples_mask, and the
 * sample count read from the mask as nvalchemi reads it. */
static void
test_reader_checks_at_open(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    write_store(s, "ds", 0, 4);
    zb_dataset *ds = NULL;
    uint64_t n = 0;
    ZB_ASSERT_OK(zb_dataset_open(s, "ds", NULL, &ds));
    ZB_ASSERT_OK(zb_dataset_len(ds, &n));
    assert_int_equal(n, 4);
    zb_dataset_close(ds);

    /* num_samples behind the mask: both readers count the mask's 4 samples */
    json_object *attrs = root_attrs(s, "ds");
    json_object_object_add(attrs, "num_samples", json_object_new_int(1));
    ZB_ASSERT_OK(zb__write_group(s, "ds", 3, json_object_to_json_string(attrs)));
    ZB_ASSERT_OK(zb_dataset_open(s, "ds", NULL, &ds));
    ZB_ASSERT_OK(zb_dataset_len(ds, &n));
    assert_int_equal(n, 4);
    zb_dataset_close(ds);
    /* ahead of it: refused */
    json_object_object_add(attrs, "num_samples", json_object_new_int(6));
    ZB_ASSERT_OK(zb__write_group(s, "ds", 3, json_object_to_json_string(attrs)));
    ZB_ASSERT_ERR(zb_dataset_open(s, "ds", NULL, &ds), ZB_E_CORRUPT,
                  "num_samples is 6, meta/samples_mask holds 4");
    assert_null(ds);
    json_object_object_add(attrs, "num_samples", json_object_new_int(4));
    ZB_ASSERT_OK(zb__write_group(s, "ds", 3, json_object_to_json_string(attrs)));
    json_object_put(attrs);

    ZB_ASSERT_OK(zb_store_erase(s, "ds/core/atomic_numbers/zarr.json"));
    ZB_ASSERT_ERR(zb_dataset_open(s, "ds", NULL, &ds), ZB_E_CORRUPT,
                  "core/atomic_numbers is missing: every AtomicData store holds "
                  "core/atomic_numbers ([atoms] integers)");
    assert_null(ds);
    ZB_ASSERT_OK(zb_store_erase(s, "ds/meta/samples_mask/zarr.json"));
    ZB_ASSERT_ERR(zb_dataset_open(s, "ds", NULL, &ds), ZB_E_CORRUPT,
                  "meta/samples_mask is missing");
    zb_store_close(s);
}

static void
test_add_custom(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    write_store(s, "ds", 0, 3); /* 2 + 3 + 4 = 9 atoms */
    float q[9];
    for (int i = 0; i < 9; i++) q[i] = (float)i * 0.5f;
    zb_atomic_field f = {"custom", "charges", ZB_ATOMIC_ATOM, ZB_DT_FLOAT32, 0, NULL, q};
    ZB_ASSERT_ERR(zb_atomic_add_custom(s, "ds", NULL, &f, 8), ZB_E_INVALID, "needs 9");
    f.level = ZB_ATOMIC_SYSTEM;
    ZB_ASSERT_ERR(zb_atomic_add_custom(s, "ds", NULL, &f, 9), ZB_E_INVALID, "needs 3");
    f.level = ZB_ATOMIC_ATOM;
    f.name = "positions";
    ZB_ASSERT_ERR(zb_atomic_add_custom(s, "ds", NULL, &f, 9), ZB_E_INVALID, "already exists");
    f.name = "charges";
    q[6] = NAN;
    ZB_ASSERT_ERR(zb_atomic_add_custom(s, "ds", NULL, &f, 9), ZB_E_INVALID,
                  "custom field 'charges': a non-finite value (NaN or infinity) in row 6");
    q[6] = 3.0f;
    ZB_ASSERT_OK(zb_atomic_add_custom(s, "ds", NULL, &f, 9));
    uint64_t rows;
    float *got = read_all_rows(s, "ds", "custom/charges", &rows);
    assert_int_equal(rows, 9);
    assert_memory_equal(got, q, sizeof q);
    free(got);
    json_object *a = root_attrs(s, "ds");
    json_object *custom = zb__json_get(zb__json_get(a, "fields"), "custom");
    assert_string_equal(json_object_get_string(zb__json_get(custom, "charges")), "atom");
    json_object_put(a);
    /* appends must now extend it too */
    zb_atomic_writer *w = NULL;
    ZB_ASSERT_OK(zb_atomic_writer_open_append(s, "ds", NULL, &w));
    block *b = malloc(sizeof *b);
    uint64_t more[1] = {3};
    block_make(b, more, 1, true, false);
    ZB_ASSERT_ERR(zb_atomic_writer_add(w, 1, b->atoms, b->edges, b->nf, b->f), ZB_E_INVALID,
                  "custom/charges is missing");
    block_make(b, more, 1, true, true);
    ZB_ASSERT_OK(zb_atomic_writer_add(w, 1, b->atoms, b->edges, b->nf, b->f));
    ZB_ASSERT_OK(zb_atomic_writer_commit(w));
    zb_atomic_writer_close(w);
    got = read_all_rows(s, "ds", "custom/charges", &rows);
    assert_int_equal(rows, 9 + 2);
    assert_true(got[10] == 3.5f);
    free(got);
    free(b);
    uint64_t ids[4] = {0, 1, 2, 3};
    verify_samples(s, "ds", ids, 4);
    zb_store_close(s);
}

static void
test_check_catches_nvalchemi_hazards(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    write_store(s, "ds", 0, 3);
    /* an array not extended (FORMATS.md §8.5, item 3) */
    ZB_ASSERT_OK(zb__at_truncate_array(s, "ds/core/shifts", 4));
    ZB_ASSERT_ERR(zb_atomic_check(s, "ds", NULL), ZB_E_CORRUPT, "ds/core/shifts: 4 rows");
    zb_atomic_writer *w = NULL;
    ZB_ASSERT_ERR(zb_atomic_writer_open_append(s, "ds", NULL, &w), ZB_E_CORRUPT, "core/shifts");
    zb_store_close(s);

    /* a neighbor_list appended without the atom offset (item 1): sample 1 holds local indices */
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    write_store(s, "ds", 0, 3);
    uint64_t rows;
    int64_t *nl = read_all_rows(s, "ds", "core/neighbor_list", &rows);
    int64_t *ap = read_all_rows(s, "ds", "meta/atoms_ptr", &rows);
    int64_t *ep = read_all_rows(s, "ds", "meta/edges_ptr", &rows);
    for (int64_t r = 2 * ep[1]; r < 2 * ep[2]; r++) nl[r] -= ap[1];
    ZB_ASSERT_OK(zb__at_remove_tree(s, "ds/core/neighbor_list"));
    zb_array_writer *aw = NULL;
    zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    ZB_ASSERT_OK(zb_array_writer_open(s, "ds/core/neighbor_list", ZB_DT_INT64, 2, SHAPE2, &o, &aw));
    ZB_ASSERT_OK(zb_array_writer_append(aw, nl, (uint64_t)ep[3]));
    ZB_ASSERT_OK(zb_array_writer_commit(aw));
    zb_array_writer_close(aw);
    ZB_ASSERT_ERR(zb_atomic_check(s, "ds", NULL), ZB_E_CORRUPT, "sample 1, edge 0");
    ZB_ASSERT_ERR(zb_atomic_defragment(s, "ds", NULL), ZB_E_CORRUPT, "sample 1");
    assert_false(zb__at_has_keys_below(s, "ds.zbatch-new/core"));
    free(nl), free(ap), free(ep);

    /* pointers that decrease */
    zb__at_truncate_array(s, "ds/meta/atoms_ptr", 4);
    int64_t bad[4] = {0, 5, 3, 9};
    ZB_ASSERT_OK(zb__at_remove_tree(s, "ds/meta/atoms_ptr"));
    ZB_ASSERT_OK(zb_array_writer_open(s, "ds/meta/atoms_ptr", ZB_DT_INT64, 1, NULL, &o, &aw));
    ZB_ASSERT_OK(zb_array_writer_append(aw, bad, 4));
    ZB_ASSERT_OK(zb_array_writer_commit(aw));
    zb_array_writer_close(aw);
    ZB_ASSERT_ERR(zb_atomic_check(s, "ds", NULL), ZB_E_CORRUPT, "atoms_ptr: decreases at sample 2");
    zb_store_close(s);
}

/* The windows of an interrupted append, set up by hand: restoring some documents of the state
 * before an append is what a crash between two puts leaves (chunks keep their old rows). */
static void
test_interrupted_append_windows(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    write_store(s, "ds", 0, 3);
    snap *before = snap_take(s);
    append_store(s, "ds", 3, 2);
    snap *after = snap_take(s);
    uint64_t len = 0;
    const uint8_t *old_root = snap_find(before, "ds/zarr.json", &len);
    uint64_t old_root_len = len;
    const uint8_t *old_mask = snap_find(before, "ds/meta/samples_mask/zarr.json", &len);
    uint64_t old_mask_len = len;

    /* crash between the samples_mask put and the root put: rolled forward */
    zb_store *t = snap_restore(after);
    ZB_ASSERT_OK(zb_store_put(t, "ds/zarr.json", old_root, old_root_len));
    zb_atomic_summary sum;
    ZB_ASSERT_OK(zb_atomic_check(t, "ds", &sum));
    assert_int_equal(sum.num_samples, 3);
    assert_true(sum.uncommitted_tail);
    ZB_ASSERT_OK(zb_atomic_recover(t, "ds"));
    uint64_t ids5[5] = {0, 1, 2, 3, 4};
    verify_samples(t, "ds", ids5, 5);
    zb_store_close(t);

    /* crash before the samples_mask put: cut back, then appending continues at 3 */
    t = snap_restore(after);
    ZB_ASSERT_OK(zb_store_put(t, "ds/zarr.json", old_root, old_root_len));
    ZB_ASSERT_OK(zb_store_put(t, "ds/meta/samples_mask/zarr.json", old_mask, old_mask_len));
    ZB_ASSERT_OK(zb_atomic_check(t, "ds", &sum));
    assert_int_equal(sum.num_samples, 3);
    assert_true(sum.uncommitted_tail);
    append_store(t, "ds", 10, 2);
    ZB_ASSERT_OK(zb_atomic_check(t, "ds", &sum));
    assert_false(sum.uncommitted_tail);
    uint64_t ids_b[5] = {0, 1, 2, 10, 11};
    verify_samples(t, "ds", ids_b, 5);
    zb_store_close(t);
    snap_free(before);
    snap_free(after);
    zb_store_close(s);
}

/* Every mutation of an append fails in turn: the store always checks clean with the old or the
 * new samples, and the samples_mask length (nvalchemi's count) is the old count until the append
 * has written every other array. After recovery, appending again gives the right store. */
static void
test_crash_during_append(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    zb_atomic_write_config cfg = ZB_ATOMIC_WRITE_CONFIG_DEFAULT;
    cfg.core.chunk_rows = 4;
    cfg.meta.chunk_rows = 2;
    zb_atomic_writer *w = NULL;
    ZB_ASSERT_OK(zb_atomic_writer_open(s, "ds", &cfg, &w));
    add_ids(w, 0, 3, false);
    ZB_ASSERT_OK(zb_atomic_writer_commit(w));
    zb_atomic_writer_close(w);
    snap *base = snap_take(s);
    zb_store_close(s);
    uint64_t ids_old[3] = {0, 1, 2}, ids_new[6] = {0, 1, 2, 3, 4, 5};
    int crashes = 0, forward = 0;
    for (int fail_at = 1; fail_at < 400; fail_at++) {
        zb_store *t = snap_restore(base);
        zb_store *c = crash_wrap(t, fail_at);
        zb_atomic_writer *aw = NULL;
        zb_status st = zb_atomic_writer_open_append(c, "ds", NULL, &aw);
        if (st == ZB_OK) {
            uint64_t ids[3] = {3, 4, 5};
            block *b = malloc(sizeof *b);
            block_make(b, ids, 3, true, false);
            st = zb_atomic_writer_add(aw, 3, b->atoms, b->edges, b->nf, b->f);
            free(b);
        }
        if (st == ZB_OK) st = zb_atomic_writer_commit(aw);
        zb_atomic_writer_close(aw);
        zb_store_close(c);
        zb_clear_error();
        ZB_ASSERT_OK(zb_atomic_check(t, "ds", NULL));
        uint64_t rows;
        free(read_all_rows(t, "ds", "meta/samples_mask", &rows));
        if (st == ZB_OK) {
            verify_samples(t, "ds", ids_new, 6);
            zb_store_close(t);
            break;
        }
        crashes++;
        /* zbatch's view is num_samples; nvalchemi's (the mask's length) is old or new */
        int64_t ns = num_samples_attr(t, "ds");
        assert_true(ns == 3);
        assert_true(rows == 3 || rows == 6);
        ZB_ASSERT_OK(zb_atomic_recover(t, "ds"));
        zb_atomic_summary sum;
        ZB_ASSERT_OK(zb_atomic_check(t, "ds", &sum));
        assert_false(sum.uncommitted_tail);
        if (rows == 6) {
            forward++;
            verify_samples(t, "ds", ids_new, 6);
        } else {
            verify_samples(t, "ds", ids_old, 3);
            append_store(t, "ds", 3, 3);
            verify_samples(t, "ds", ids_new, 6);
        }
        zb_store_close(t);
    }
    assert_true(crashes > 10);
    assert_int_equal(forward, 1); /* only the crash between the last two puts rolls forward */
    snap_free(base);
}

/* Every mutation of a new write fails in turn: the path is never a complete store with wrong
 * contents (incomplete or absent), and a new open clears what is left. */
static void
test_crash_during_new_write(void **state)
{
    (void)state;
    int crashes = 0;
    for (int fail_at = 1; fail_at < 400; fail_at++) {
        zb_store *t = NULL;
        ZB_ASSERT_OK(zb_store_open_memory(&t));
        zb_store *c = crash_wrap(t, fail_at);
        zb_atomic_writer *w = NULL;
        zb_status st = zb_atomic_writer_open(c, "ds", NULL, &w);
        if (st == ZB_OK) {
            uint64_t ids[4] = {0, 1, 2, 3};
            block *b = malloc(sizeof *b);
            block_make(b, ids, 4, true, false);
            st = zb_atomic_writer_add(w, 4, b->atoms, b->edges, b->nf, b->f);
            free(b);
        }
        if (st == ZB_OK) st = zb_atomic_writer_commit(w);
        zb_atomic_writer_close(w);
        zb_store_close(c);
        uint64_t ids[4] = {0, 1, 2, 3};
        if (st == ZB_OK) {
            verify_samples(t, "ds", ids, 4);
            zb_store_close(t);
            break;
        }
        crashes++;
        zb_status cs = zb_atomic_check(t, "ds", NULL);
        if (cs == ZB_OK) {
            /* only the marker's erase failed: complete, and recovery drops the marker */
            assert_true(zb__at_has_key(t, "ds/" ZB_INCOMPLETE_MARKER));
            ZB_ASSERT_OK(zb_atomic_recover(t, "ds"));
            assert_false(zb__at_has_key(t, "ds/" ZB_INCOMPLETE_MARKER));
            verify_samples(t, "ds", ids, 4);
        } else {
            assert_true(cs == ZB_E_INCOMPLETE || cs == ZB_E_NOTFOUND);
            write_store(t, "ds", 0, 4);
            verify_samples(t, "ds", ids, 4);
        }
        zb_store_close(t);
    }
    assert_true(crashes > 10);
}

/* Every mutation of a defragment fails in turn, on the file backend (whose rename moves a
 * directory in one step, what the swap relies on): after recovery the dataset holds either the
 * old physical samples or the compacted ones, the live samples are the same, and the siblings
 * hold nothing. */
static void
test_crash_during_defragment(void **state)
{
    (void)state;
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_memory(&s));
    write_store(s, "ds", 0, 6);
    uint64_t del[2] = {1, 3};
    ZB_ASSERT_OK(zb_atomic_delete(s, "ds", del, 2));
    snap *base = snap_take(s);
    zb_store_close(s);
    uint64_t live[4] = {0, 2, 4, 5};
    int crashes = 0, kept_old = 0, got_new = 0, parked = 0;
    for (int fail_at = 1; fail_at < 600; fail_at++) {
        zb_store *t = NULL;
        ZB_ASSERT_OK(zb_store_open_file(zbt_tempdir("atomic_defrag_crash"), &t));
        snap_put_all(t, base);
        zb_store *c = crash_wrap(t, fail_at);
        zb_status st = zb_atomic_defragment(c, "ds", NULL);
        zb_store_close(c);
        zb_clear_error();
        if (st == ZB_OK) {
            verify_samples(t, "ds", live, 4);
            assert_int_equal(num_samples_attr(t, "ds"), 4);
            zb_store_close(t);
            break;
        }
        crashes++;
        if (!zb__at_has_keys_below(t, "ds")) {
            /* between the two renames: a new store here would lose the real one */
            zb_atomic_writer *w = NULL;
            ZB_ASSERT_ERR(zb_atomic_writer_open(t, "ds", NULL, &w), ZB_E_INVALID,
                          "zb_atomic_recover");
            parked++;
        }
        ZB_ASSERT_OK(zb_atomic_recover(t, "ds"));
        verify_samples(t, "ds", live, 4);
        int64_t n = num_samples_attr(t, "ds");
        assert_true(n == 6 || n == 4);
        kept_old += n == 6;
        got_new += n == 4;
        assert_false(zb__at_has_keys_below(t, "ds.zbatch-new"));
        assert_false(zb__at_has_keys_below(t, "ds.zbatch-old"));
        zb_store_close(t);
    }
    assert_true(crashes > 10);
    assert_true(kept_old > 0 && got_new > 0);
    assert_int_equal(parked, 1); /* exactly one crash point lies between the two renames */
    snap_free(base);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_layout),
        cmocka_unit_test(test_threads_and_shards),
        cmocka_unit_test(test_default_storage),
        cmocka_unit_test(test_append_offsets_and_all_or_nothing),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_delete_and_defragment),
        cmocka_unit_test(test_add_custom),
        cmocka_unit_test(test_reader_checks_at_open),
        cmocka_unit_test(test_check_catches_nvalchemi_hazards),
        cmocka_unit_test(test_interrupted_append_windows),
        cmocka_unit_test(test_crash_during_append),
        cmocka_unit_test(test_crash_during_new_write),
        cmocka_unit_test(test_crash_during_defragment),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
