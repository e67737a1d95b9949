/* Fault injection (SQLite's and curl's habit): every store read, every store write and every
 * allocation of the open, read and write paths is failed in turn, one per run, and so are short
 * reads and flipped bytes. Each run must end in a status (never a crash, never a leak: the ASan
 * tier checks both), a failed read must say so rather than deliver other data, and the store on
 * disk must stay what it was: after each failed append the dataset reopens with exactly the
 * samples of its last commit, compared with the values written (the oracle).
 *
 * Store faults come from a wrapping backend (zb_store_new over a file store). Allocation faults
 * come from link-time wrapping (CMake links this test with -Wl,--wrap=malloc,... so every call
 * from libzbatch's objects goes through the hooks below; libraries called by zbatch, such as
 * json-c and the codecs, allocate unhooked). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/testutil.h"
#include "util/status.h"

/* ---- allocation faults ------------------------------------------------------------------- */

static atomic_long alloc_seen;    /* hooked allocations since arming */
static atomic_long alloc_fail_at; /* 1-based; 0 = off */
static atomic_long alloc_failed;

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);

static bool
alloc_fails(void)
{
    long at = atomic_load(&alloc_fail_at);
    if (at == 0) return false;
    if (atomic_fetch_add(&alloc_seen, 1) + 1 != at) return false;
    atomic_fetch_add(&alloc_failed, 1);
    return true;
}

void *
__wrap_malloc(size_t n)
{
    return alloc_fails() ? NULL : __real_malloc(n);
}

void *
__wrap_calloc(size_t n, size_t size)
{
    return alloc_fails() ? NULL : __real_calloc(n, size);
}

void *
__wrap_realloc(void *p, size_t n)
{
    return alloc_fails() ? NULL : __real_realloc(p, n);
}

char *
__wrap_strdup(const char *s)
{
    return alloc_fails() ? NULL : __real_strdup(s);
}

char *
__wrap_strndup(const char *s, size_t n)
{
    return alloc_fails() ? NULL : __real_strndup(s, n);
}

static void
alloc_arm(long at)
{
    atomic_store(&alloc_seen, 0);
    atomic_store(&alloc_failed, 0);
    atomic_store(&alloc_fail_at, at);
}

/* Disarms; true when the armed failure happened. */
static bool
alloc_disarm(void)
{
    atomic_store(&alloc_fail_at, 0);
    return atomic_load(&alloc_failed) > 0;
}

/* ---- store faults: a backend wrapping another store ---------------------------------------- */

typedef enum fault_kind { FAULT_NONE, FAULT_FAIL, FAULT_SHORT, FAULT_FLIP } fault_kind;

typedef struct fault_store {
    zb_store *inner;
    fault_kind read_fault; /* what the read_at-th read (get, size, list) suffers */
    long read_at;          /* 1-based; 0 = none */
    long write_at;         /* the write_at-th put/erase/rename fails (0 = none) */
    atomic_long reads, writes;
    atomic_long injected;
} fault_store;

static bool
is_metadata(const char *key)
{
    const char *base = strrchr(key, '/');
    base = base ? base + 1 : key;
    return base[0] == '.' || !strcmp(base, "zarr.json");
}

static zb_status
f_get(void *self, const char *key, uint64_t offset, uint64_t length, void *dst, uint64_t *nread)
{
    fault_store *f = self;
    long n = atomic_fetch_add(&f->reads, 1) + 1;
    bool hit = n == f->read_at;
    if (hit && f->read_fault == FAULT_FAIL) {
        atomic_fetch_add(&f->injected, 1);
        *nread = 0;
        return zb__err(ZB_E_IO, "%s: injected read fault", key);
    }
    zb_status st = zb_store_get(f->inner, key, offset, length, dst, nread);
    if (st != ZB_OK || !hit || *nread == 0) return st;
    if (f->read_fault == FAULT_SHORT) {
        atomic_fetch_add(&f->injected, 1);
        *nread /= 2; /* a backend that stops early without saying why */
    } else if (f->read_fault == FAULT_FLIP && !is_metadata(key)) {
        /* metadata has no checksum (a flipped digit is another valid document); chunk bytes do */
        atomic_fetch_add(&f->injected, 1);
        ((uint8_t *)dst)[*nread / 2] ^= 0x5A;
    }
    return ZB_OK;
}

static zb_status
f_size(void *self, const char *key, uint64_t *size)
{
    fault_store *f = self;
    long n = atomic_fetch_add(&f->reads, 1) + 1;
    if (n == f->read_at && f->read_fault == FAULT_FAIL) {
        atomic_fetch_add(&f->injected, 1);
        return zb__err(ZB_E_IO, "%s: injected size fault", key);
    }
    return zb_store_size(f->inner, key, size);
}

static zb_status
f_list(void *self, const char *prefix, zb_list_fn fn, void *ctx)
{
    fault_store *f = self;
    long n = atomic_fetch_add(&f->reads, 1) + 1;
    if (n == f->read_at && f->read_fault == FAULT_FAIL) {
        atomic_fetch_add(&f->injected, 1);
        return zb__err(ZB_E_IO, "%s: injected list fault", prefix);
    }
    return zb_store_list(f->inner, prefix, fn, ctx);
}

static bool
write_fails(fault_store *f)
{
    long n = atomic_fetch_add(&f->writes, 1) + 1;
    if (n != f->write_at) return false;
    atomic_fetch_add(&f->injected, 1);
    return true;
}

static zb_status
f_put(void *self, const char *key, const void *data, uint64_t length)
{
    fault_store *f = self;
    if (write_fails(f)) return zb__err(ZB_E_IO, "%s: injected write fault", key);
    return zb_store_put(f->inner, key, data, length);
}

static zb_status
f_erase(void *self, const char *key)
{
    fault_store *f = self;
    if (write_fails(f)) return zb__err(ZB_E_IO, "%s: injected erase fault", key);
    return zb_store_erase(f->inner, key);
}

static zb_status
f_rename(void *self, const char *from, const char *to)
{
    fault_store *f = self;
    if (write_fails(f)) return zb__err(ZB_E_IO, "%s: injected rename fault", from);
    return zb_store_rename(f->inner, from, to);
}

static void
f_close(void *self)
{
    fault_store *f = self;
    zb_store_close(f->inner);
    free(f);
}

static const zb_store_methods fault_methods = {
    .scheme = "fault",
    .get = f_get,
    .size = f_size,
    .list = f_list,
    .put = f_put,
    .erase = f_erase,
    .rename = f_rename,
    .close = f_close,
};

/* A fault store over the directory `dir`; *fs_out lets the test set and read its counters. */
static zb_store *
fault_open(const char *dir, fault_store **fs_out)
{
    fault_store *f = calloc(1, sizeof *f);
    assert_non_null(f);
    ZB_ASSERT_OK(zb_store_open_file(dir, &f->inner));
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_new(&fault_methods, f, &s));
    *fs_out = f;
    return s;
}

/* ---- the dataset and its oracle ------------------------------------------------------------ */

#define BASE_SAMPLES 5
#define MORE_SAMPLES 3
#define MAX_ATOMS 4

static int64_t
atoms_of(uint64_t g)
{
    return 1 + (int64_t)(g % MAX_ATOMS);
}

static float
pos_of(uint64_t g, int64_t a, int d)
{
    return (float)g * 10.0f + (float)a + 0.25f * (float)d;
}

static int64_t
number_of(uint64_t g, int64_t a)
{
    return 1 + (int64_t)((g + (uint64_t)a) % 8);
}

/* Adds samples [first, first + n) to w. */
static zb_status
add_samples(zb_atomic_writer *w, uint64_t first, uint64_t n)
{
    static const uint64_t shape3[1] = {3}, shape1[1] = {1};
    int64_t atoms[8];
    float pos[8 * MAX_ATOMS * 3], energy[8];
    int64_t numbers[8 * MAX_ATOMS];
    size_t v = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t g = first + i;
        atoms[i] = atoms_of(g);
        for (int64_t a = 0; a < atoms[i]; a++, v++) {
            for (int d = 0; d < 3; d++) pos[3 * v + (size_t)d] = pos_of(g, a, d);
            numbers[v] = number_of(g, a);
        }
        energy[i] = -(float)g - 0.5f;
    }
    zb_atomic_field f[3] = {
        {"core", "positions", ZB_ATOMIC_ATOM, ZB_DT_FLOAT32, 1, shape3, pos},
        {"core", "atomic_numbers", ZB_ATOMIC_ATOM, ZB_DT_INT64, 0, NULL, numbers},
        {"core", "energy", ZB_ATOMIC_SYSTEM, ZB_DT_FLOAT32, 1, shape1, energy},
    };
    return zb_atomic_writer_add(w, n, atoms, NULL, 3, f);
}

/* Writes the base dataset (BASE_SAMPLES samples, zstd with frame checksums, small chunks so a
 * read touches several objects) into a fresh directory named `name`. */
static const char *
write_base(const char *name)
{
    const char *dir = zbt_tempdir(name);
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_file(dir, &s));
    zb_atomic_write_config cfg = ZB_ATOMIC_WRITE_CONFIG_DEFAULT;
    cfg.core.codec = cfg.meta.codec = "zstd:1:checksum";
    cfg.core.chunk_rows = 4;
    cfg.core.shard_rows = ZB_ATOMIC_NO_SHARDS;
    cfg.meta.chunk_rows = 4;
    zb_atomic_writer *w = NULL;
    ZB_ASSERT_OK(zb_atomic_writer_open(s, "", &cfg, &w));
    ZB_ASSERT_OK(add_samples(w, 0, BASE_SAMPLES));
    ZB_ASSERT_OK(zb_atomic_writer_commit(w));
    zb_atomic_writer_close(w);
    zb_store_close(s);
    return dir;
}

/* Checks a batch of samples 0..n-1 against the oracle; false at the first difference. */
static bool
batch_matches(const zb_batch *b, uint64_t n)
{
    zb_batch_view pos, num, en;
    if (zb_batch_size(b) != n || zb_batch_find(b, "positions", &pos) != ZB_OK ||
        zb_batch_find(b, "atomic_numbers", &num) != ZB_OK ||
        zb_batch_find(b, "energy", &en) != ZB_OK)
        return false;
    const float *p = pos.data, *e = en.data;
    const int64_t *z = num.data;
    uint64_t v = 0;
    for (uint64_t g = 0; g < n; g++) {
        if (e[g] != -(float)g - 0.5f) return false;
        for (int64_t a = 0; a < atoms_of(g); a++, v++) {
            if (v >= pos.nrows || z[v] != number_of(g, a)) return false;
            for (int d = 0; d < 3; d++)
                if (p[3 * v + (uint64_t)d] != pos_of(g, a, d)) return false;
        }
    }
    return v == pos.nrows && v == num.nrows;
}

/* Opens the dataset in `s` and reads every sample: ZB_OK only when it holds exactly `n`
 * samples equal to the oracle's (*wrong set when it read something else without an error). */
static zb_status
open_and_read(zb_store *s, uint64_t n, bool *wrong)
{
    *wrong = false;
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    zb_dataset *ds = NULL;
    zb_status st = zb_dataset_open(s, "", &o, &ds);
    uint64_t len = 0;
    if (st == ZB_OK) st = zb_dataset_len(ds, &len);
    if (st == ZB_OK && len != n) *wrong = true;
    zb_batch *b = NULL;
    uint64_t ids[BASE_SAMPLES + MORE_SAMPLES];
    for (uint64_t i = 0; i < n; i++) ids[i] = i;
    if (st == ZB_OK && !*wrong) st = zb_dataset_read_many(ds, ids, n, &b);
    if (st == ZB_OK && !*wrong && !batch_matches(b, n)) *wrong = true;
    zb_batch_free(b);
    zb_dataset_close(ds);
    return st;
}

/* ---- the tests ---------------------------------------------------------------------------- */

/* Every read failed in turn, then every read cut short, then every chunk read with a flipped
 * byte: a failed read is ZB_E_IO naming the injected fault (never masked as a missing chunk or
 * fill values); short and flipped reads are an error or the right data, never other data. */
static void
test_read_faults(void **state)
{
    (void)state;
    const char *dir = write_base("faults_read");
    static const fault_kind kinds[] = {FAULT_FAIL, FAULT_SHORT, FAULT_FLIP};
    static const char *const names[] = {"fail", "short", "flip"};
    for (size_t k = 0; k < 3; k++) {
        long injected = 0, errors = 0;
        for (long at = 1;; at++) {
            fault_store *f = NULL;
            zb_store *s = fault_open(dir, &f);
            f->read_fault = kinds[k];
            f->read_at = at;
            bool wrong = false;
            zb_status st = open_and_read(s, BASE_SAMPLES, &wrong);
            bool hit = atomic_load(&f->injected) > 0;
            long reads = atomic_load(&f->reads);
            zb_store_close(s);
            if (wrong) fail_msg("%s read %ld: other data delivered without an error", names[k], at);
            if (hit) injected++;
            if (st != ZB_OK) errors++;
            if (kinds[k] == FAULT_FAIL && hit && st != ZB_E_IO)
                fail_msg("read %ld failed: got %s (%s), expected ZB_E_IO", at, zb_status_name(st),
                         zb_last_error());
            if (kinds[k] == FAULT_FAIL && hit && !zbt_mentions("injected"))
                fail_msg("read %ld: message '%s' hides the fault", at, zb_last_error());
            if (!hit && st != ZB_OK)
                fail_msg("%s %ld: no fault injected, yet %s: %s", names[k], at, zb_status_name(st),
                         zb_last_error());
            if (at > reads) break; /* a run with fewer reads than `at`: every read was tried */
        }
        printf("# read faults (%s): %ld injected, %ld ended in an error, the rest read correctly\n",
               names[k], injected, errors);
        assert_true(injected >= 10);
    }
}

/* Every allocation of open + read_many failed in turn: ZB_E_NOMEM each time (or the right data,
 * when the failed allocation had a fallback), no leak, no crash. */
static void
test_alloc_faults_read(void **state)
{
    (void)state;
    const char *dir = write_base("faults_alloc_read");
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_file(dir, &s));
    long runs = 0, nomem = 0;
    for (long at = 1;; at++) {
        alloc_arm(at);
        bool wrong = false;
        zb_status st = open_and_read(s, BASE_SAMPLES, &wrong);
        bool hit = alloc_disarm();
        if (wrong) fail_msg("allocation %ld failed: other data delivered without an error", at);
        if (!hit) {
            ZB_ASSERT_OK(st);
            break; /* every allocation of the path has been failed once */
        }
        runs++;
        if (st == ZB_E_NOMEM)
            nomem++;
        else if (st != ZB_OK)
            fail_msg("allocation %ld failed: got %s (%s), expected ZB_E_NOMEM", at,
                     zb_status_name(st), zb_last_error());
    }
    zb_store_close(s);
    printf("# allocation faults (open + read_many): %ld injected, %ld ZB_E_NOMEM\n", runs, nomem);
    assert_true(runs >= 50);
}

/* A loader epoch over the dataset in `s` (sequential, batches of 2, its worker thread reading
 * ahead): ZB_OK only when the batches hold exactly the oracle's samples in order. */
static zb_status
load_epoch(zb_store *s, bool *wrong)
{
    *wrong = false;
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    zb_dataset *ds = NULL;
    zb_sampler *smp = NULL;
    zb_loader *ld = NULL;
    zb_sampler_opts so = ZB_SAMPLER_OPTS_DEFAULT;
    so.n = BASE_SAMPLES;
    so.batch_size = 2;
    zb_loader_opts lo = ZB_LOADER_OPTS_DEFAULT;
    zb_status st = zb_dataset_open(s, "", &o, &ds);
    if (st == ZB_OK) st = zb_sampler_new_sequential(&so, &smp);
    if (st == ZB_OK) st = zb_loader_open(ds, smp, &lo, &ld);
    uint64_t seen = 0;
    while (st == ZB_OK) {
        zb_batch *b = NULL;
        st = zb_loader_next(ld, &b);
        if (st != ZB_OK || !b) break;
        const uint64_t *idx = zb_batch_index(b);
        for (size_t i = 0; i < zb_batch_size(b); i++)
            if (idx[i] != seen + i) *wrong = true;
        /* the oracle's check wants samples from 0: compare the first batch whole, the rest by
         * their energies (one per sample) */
        zb_batch_view en;
        if (zb_batch_find(b, "energy", &en) != ZB_OK || en.nrows != zb_batch_size(b)) *wrong = true;
        for (size_t i = 0; !*wrong && i < en.nrows; i++)
            if (((const float *)en.data)[i] != -(float)(seen + i) - 0.5f) *wrong = true;
        if (seen == 0 && !batch_matches(b, zb_batch_size(b))) *wrong = true;
        seen += zb_batch_size(b);
        zb_batch_free(b);
    }
    if (st == ZB_OK && seen != BASE_SAMPLES) *wrong = true;
    zb_loader_close(ld);
    zb_sampler_free(smp);
    zb_dataset_close(ds);
    return st;
}

/* Every allocation and every store read of a loader epoch failed in turn: the error comes out
 * of zb_loader_next (or open) with its status, the loader closes without a leak. */
static void
test_faults_loader(void **state)
{
    (void)state;
    const char *dir = write_base("faults_loader");
    long allocs = 0, reads = 0;
    for (long at = 1;; at++) {
        zb_store *s = NULL;
        ZB_ASSERT_OK(zb_store_open_file(dir, &s));
        alloc_arm(at);
        bool wrong = false;
        zb_status st = load_epoch(s, &wrong);
        bool hit = alloc_disarm();
        zb_store_close(s);
        if (wrong) fail_msg("allocation %ld failed: the loader delivered other data", at);
        if (!hit) {
            ZB_ASSERT_OK(st);
            break;
        }
        allocs++;
        if (st != ZB_E_NOMEM)
            fail_msg("allocation %ld failed: the loader returned %s (%s), expected ZB_E_NOMEM", at,
                     zb_status_name(st), zb_last_error());
    }
    for (long at = 1;; at++) {
        fault_store *f = NULL;
        zb_store *s = fault_open(dir, &f);
        f->read_fault = FAULT_FAIL;
        f->read_at = at;
        bool wrong = false;
        zb_status st = load_epoch(s, &wrong);
        bool hit = atomic_load(&f->injected) > 0;
        zb_store_close(s);
        if (wrong) fail_msg("read %ld failed: the loader delivered other data", at);
        if (!hit) {
            ZB_ASSERT_OK(st);
            break;
        }
        reads++;
        if (st != ZB_E_IO)
            fail_msg("read %ld failed: the loader returned %s (%s), expected ZB_E_IO", at,
                     zb_status_name(st), zb_last_error());
    }
    printf("# loader: %ld allocation faults and %ld read faults injected, each a status\n", allocs,
           reads);
    assert_true(allocs >= 50 && reads >= 10);
}

/* Copies the directory `from` over a fresh `to`. */
static void
copy_tree(const char *from, const char *to)
{
    char cmd[3000];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -a '%s' '%s'", to, from, to);
    if (system(cmd) != 0) fail_msg("%s failed", cmd);
}

/* Appends MORE_SAMPLES samples to a copy of the base dataset through `s`: open_append, add,
 * commit. */
static zb_status
append_more(zb_store *s)
{
    zb_atomic_writer *w = NULL;
    zb_status st = zb_atomic_writer_open_append(s, "", NULL, &w);
    if (st == ZB_OK) st = add_samples(w, BASE_SAMPLES, MORE_SAMPLES);
    if (st == ZB_OK) st = zb_atomic_writer_commit(w);
    zb_atomic_writer_close(w);
    return st;
}

/* After a failed append the dataset on disk reads as it was committed before (5 samples) or,
 * when the failure came after the commit point, with the 3 new samples too: never anything
 * else, and never a store that refuses to open. */
static void
check_after_append(const char *dir, zb_status st, const char *what, long at)
{
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_file(dir, &s));
    bool wrong = false;
    zb_status r = open_and_read(s, BASE_SAMPLES, &wrong);
    if (r != ZB_OK || wrong) {
        zb_status r2 = open_and_read(s, BASE_SAMPLES + MORE_SAMPLES, &wrong);
        if (r2 != ZB_OK || wrong)
            fail_msg("%s %ld (append: %s): the store no longer reads as either commit (%s)", what,
                     at, zb_status_name(st), zb_last_error());
        if (st != ZB_OK && r2 == ZB_OK) {
            /* the failure came after the commit point: fine, the new samples are whole */
        }
    } else if (st == ZB_OK) {
        fail_msg("%s %ld: the append reported success but the store holds the old samples", what,
                 at);
    }
    zb_store_close(s);
}

/* Every store write of an append failed in turn. */
static void
test_write_faults_append(void **state)
{
    (void)state;
    char base[1024], work[1100];
    snprintf(base, sizeof base, "%s", write_base("faults_write_base"));
    snprintf(work, sizeof work, "%s.work", base);
    long injected = 0;
    for (long at = 1;; at++) {
        copy_tree(base, work);
        fault_store *f = NULL;
        zb_store *s = fault_open(work, &f);
        f->write_at = at;
        zb_status st = append_more(s);
        bool hit = atomic_load(&f->injected) > 0;
        zb_store_close(s);
        if (!hit) {
            ZB_ASSERT_OK(st);
            check_after_append(work, st, "write", at);
            break;
        }
        injected++;
        if (st != ZB_E_IO)
            fail_msg("write %ld failed: the append returned %s (%s), expected ZB_E_IO", at,
                     zb_status_name(st), zb_last_error());
        check_after_append(work, st, "write", at);
    }
    printf("# write faults (append): %ld injected, the store intact after each\n", injected);
    assert_true(injected >= 5);
}

/* Every allocation of an append failed in turn (every 1st up to 400, then every 7th). */
static void
test_alloc_faults_append(void **state)
{
    (void)state;
    char base[1024], work[1100];
    snprintf(base, sizeof base, "%s", write_base("faults_alloc_base"));
    snprintf(work, sizeof work, "%s.work", base);
    long injected = 0;
    for (long at = 1;; at += at < 400 ? 1 : 7) {
        copy_tree(base, work);
        zb_store *s = NULL;
        ZB_ASSERT_OK(zb_store_open_file(work, &s));
        alloc_arm(at);
        zb_status st = append_more(s);
        bool hit = alloc_disarm();
        zb_store_close(s);
        if (!hit) {
            ZB_ASSERT_OK(st);
            check_after_append(work, st, "allocation", at);
            break;
        }
        injected++;
        if (st != ZB_E_NOMEM)
            fail_msg("allocation %ld failed: the append returned %s (%s), expected ZB_E_NOMEM", at,
                     zb_status_name(st), zb_last_error());
        check_after_append(work, st, "allocation", at);
    }
    printf("# allocation faults (append): %ld injected, the store intact after each\n", injected);
    assert_true(injected >= 50);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_faults),         cmocka_unit_test(test_alloc_faults_read),
        cmocka_unit_test(test_faults_loader),       cmocka_unit_test(test_write_faults_append),
        cmocka_unit_test(test_alloc_faults_append),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
