/* The stored types of a conversion (zbatch_convert.h, issue 19): X/data and the layers' data in
 * the narrowest type that holds every value exactly, column ids narrow up to 65,535 genes.
 *
 * The choice needs every value of the whole input, and every dataset must get the same types
 * (children of one collection join without conversion), so no gather task may decide from its
 * own cells. The scatter phase reads every value anyway: each task folds its values of each
 * matrix into a cv_value_stats and stores it in its scatter file, which appears by rename, so
 * a finished task's stats survive a kill. On the direct path the prepare task folds them
 * instead where that is exact, as it reads the input for its CRC-64 (prepare.c), into its own
 * done file; the choice folds both. The first gather task in a process folds the stats of
 * every scatter file; every process (threads or Dask workers) reads the same files and makes
 * the same choice. The rule is zbatch.write_anndata's (python/zbatch/_write_anndata.py). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convert/convert_int.h"
#include "util/status.h"

/* Integers: one unsigned compare finds negatives (wrapped) and values past 65,535 alike. */
#define FOLD_INT(ctype, widen)                                                                     \
    do {                                                                                           \
        const ctype *p_ = values;                                                                  \
        for (uint64_t i_ = 0; i_ < n; i_++) {                                                      \
            uint64_t v_ = widen(p_[i_]);                                                           \
            wide |= v_ > 65535;                                                                    \
            max = v_ > max ? v_ : max;                                                             \
        }                                                                                          \
    } while (0)
#define AS_UNSIGNED(v) ((uint64_t)(v))
#define AS_SIGNED(v) ((uint64_t)(int64_t)(v))

/* Floats: an integer in [0, 65535] converts to int32 and back unchanged; anything else (NaN,
 * negative, larger, fractional) is clamped first and then differs from what comes back.
 * Branch-free, in int32 and in blocks of a fixed 64 elements, so that the compiler vectorizes
 * it at -O2 (built with -fno-trapping-math, CMakeLists.txt: the compares may not trap); this
 * runs over every value of X (docs/PERFORMANCE.md). */
#define FOLD_FLOAT_ONE(ctype, x)                                                                   \
    do {                                                                                           \
        ctype v_ = (x);                                                                            \
        ctype c_ = v_ >= 0 ? v_ : 0;                                                               \
        int32_t iv_ = (int32_t)(c_ <= 65535 ? c_ : 0);                                             \
        w_ |= (ctype)iv_ != v_;                                                                    \
        m_ = iv_ > m_ ? iv_ : m_;                                                                  \
    } while (0)
#define FOLD_FLOAT(ctype)                                                                          \
    do {                                                                                           \
        const ctype *p_ = values;                                                                  \
        int w_ = 0;                                                                                \
        int32_t m_ = 0;                                                                            \
        uint64_t i_ = 0;                                                                           \
        for (; i_ + 64 <= n; i_ += 64)                                                             \
            for (int k_ = 0; k_ < 64; k_++) FOLD_FLOAT_ONE(ctype, p_[i_ + k_]);                    \
        for (; i_ < n; i_++) FOLD_FLOAT_ONE(ctype, p_[i_]);                                        \
        wide |= (unsigned)w_;                                                                      \
        max = (uint64_t)m_;                                                                        \
    } while (0)

/* float32, the usual X: also built for AVX2 where the CPU has it (docs/PERFORMANCE.md), chosen
 * once at load time (GCC's and Clang's target_clones). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target_clones("avx2", "default")))
#endif
static void
fold_float32(const float *values, uint64_t n, unsigned *wide_out, uint64_t *max_out)
{
    unsigned wide = 0;
    uint64_t max = 0;
    FOLD_FLOAT(float);
    *wide_out = wide;
    *max_out = max;
}

void
cv_stats_add(cv_value_stats *s, const void *values, zb_dtype dtype, uint64_t n)
{
    if (n == 0) return;
    unsigned wide = 0;
    uint64_t max = 0;
    switch (dtype) {
    case ZB_DT_BOOL:
    case ZB_DT_UINT8:
        FOLD_INT(uint8_t, AS_UNSIGNED);
        break;
    case ZB_DT_UINT16:
        FOLD_INT(uint16_t, AS_UNSIGNED);
        break;
    case ZB_DT_UINT32:
        FOLD_INT(uint32_t, AS_UNSIGNED);
        break;
    case ZB_DT_UINT64:
        FOLD_INT(uint64_t, AS_UNSIGNED);
        break;
    case ZB_DT_INT8:
        FOLD_INT(int8_t, AS_SIGNED);
        break;
    case ZB_DT_INT16:
        FOLD_INT(int16_t, AS_SIGNED);
        break;
    case ZB_DT_INT32:
        FOLD_INT(int32_t, AS_SIGNED);
        break;
    case ZB_DT_INT64:
        FOLD_INT(int64_t, AS_SIGNED);
        break;
    case ZB_DT_FLOAT32:
        fold_float32(values, n, &wide, &max);
        break;
    case ZB_DT_FLOAT64:
        FOLD_FLOAT(double);
        break;
    case ZB_DT_FLOAT16: { /* rare: through float64 in steps */
        double buf[256];
        const unsigned char *p = values;
        for (uint64_t i = 0; i < n; i += 256) {
            uint64_t m = n - i < 256 ? n - i : 256;
            cv_convert_values(buf, ZB_DT_FLOAT64, p + i * 2, ZB_DT_FLOAT16, m);
            cv_stats_add(s, buf, ZB_DT_FLOAT64, m);
        }
        return;
    }
    default:
        wide = 1;
        break;
    }
    s->flags |= CV_VALUES_ANY | (wide ? CV_VALUES_WIDE : 0);
    if (max > s->max) s->max = max;
}

static uint64_t
limit_of(zb_dtype to)
{
    return to == ZB_DT_UINT8 ? 255 : 65535;
}

bool
cv_stats_fit(const cv_value_stats *s, zb_dtype to)
{
    return !(s->flags & CV_VALUES_WIDE) && s->max <= limit_of(to);
}

uint64_t
cv_first_misfit(const void *values, zb_dtype dtype, uint64_t n, zb_dtype to)
{
    size_t item = zb_dtype_size(dtype);
    for (uint64_t i = 0; i < n; i++) {
        cv_value_stats s = {0, 0};
        cv_stats_add(&s, (const unsigned char *)values + i * item, dtype, 1);
        if (!cv_stats_fit(&s, to)) return i;
    }
    return n;
}

zb_dtype
cv_explicit_dtype(zb_convert_data_dtype choice)
{
    switch (choice) {
    case ZB_CONVERT_DATA_UINT8:
        return ZB_DT_UINT8;
    case ZB_CONVERT_DATA_UINT16:
        return ZB_DT_UINT16;
    case ZB_CONVERT_DATA_FLOAT32:
        return ZB_DT_FLOAT32;
    default:
        return ZB_DT_COUNT_;
    }
}

/* Folds scatter file t's stats into all[n_mats]. */
static zb_status
fold_task(const zb_convert *cv, size_t t, cv_value_stats *all)
{
    char path[4200];
    ZB_TRY(cv_path(cv, path, sizeof path, "scatter/t%zu.bin", t));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return zb__err(ZB_E_IO, "%s: %s", path, strerror(errno));
    cv_scatter_header h;
    size_t bytes = cv->n_mats * sizeof(cv_value_stats);
    cv_value_stats *s = malloc(bytes + 1);
    zb_status st = s ? ZB_OK : zb__err(ZB_E_NOMEM, "the stored types");
    if (st == ZB_OK && pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h)
        st = zb__err(ZB_E_TRUNCATED, "%s: a short header", path);
    if (st == ZB_OK && (memcmp(h.magic, CV_SCATTER_MAGIC, 8) || h.version != CV_SCATTER_VERSION ||
                        h.n_datasets != cv->n_datasets))
        st = zb__err(ZB_E_CORRUPT, "%s: not a scatter file of this conversion", path);
    off_t at = (off_t)(sizeof h + cv->n_datasets * 4 * 8);
    if (st == ZB_OK && pread(fd, s, bytes, at) != (ssize_t)bytes)
        st = zb__err(ZB_E_TRUNCATED, "%s: no value stats", path);
    for (size_t j = 0; st == ZB_OK && j < cv->n_mats; j++) {
        all[j].flags |= s[j].flags;
        if (s[j].max > all[j].max) all[j].max = s[j].max;
    }
    free(s);
    close(fd);
    return st;
}

/* Folds what input k's prepare task found its values to be (prepare.c) into all[n_mats]. */
static zb_status
fold_prepared(const zb_convert *cv, size_t k, cv_value_stats *all)
{
    cv_value_stats *s = calloc(cv->n_mats, sizeof *s);
    bool *have = calloc(cv->n_mats, sizeof *have);
    zb_status st =
        s && have ? cv_prepared_values(cv, k, s, have) : zb__err(ZB_E_NOMEM, "the stored types");
    for (size_t j = 0; st == ZB_OK && j < cv->n_mats; j++) {
        if (!have[j]) continue;
        all[j].flags |= s[j].flags;
        if (s[j].max > all[j].max) all[j].max = s[j].max;
    }
    free(s);
    free(have);
    return st;
}

/* auto: uint8 or uint16 when every value of the matrix fits, else its promoted type (a bool
 * matrix and one without values too, as zbatch.write_anndata keeps them). */
zb_dtype
cv_narrowest(zb_dtype promoted, const cv_value_stats *s)
{
    if (promoted == ZB_DT_BOOL || !(s->flags & CV_VALUES_ANY)) return promoted;
    if (cv_stats_fit(s, ZB_DT_UINT8)) return ZB_DT_UINT8;
    if (cv_stats_fit(s, ZB_DT_UINT16)) return ZB_DT_UINT16;
    return promoted;
}

zb_dtype
cv_stored_dtype(const zb_convert *cv, size_t j, const cv_value_stats *s)
{
    zb_dtype asked = cv_explicit_dtype(cv->data_choice);
    if (cv->data_choice == ZB_CONVERT_DATA_KEEP) return cv->mat_dtypes[j];
    if (asked != ZB_DT_COUNT_) return asked;
    return cv_narrowest(cv->mat_dtypes[j], s);
}

bool
cv_narrow_indices(const zb_convert *cv)
{
    return cv->index_choice == ZB_CONVERT_INDEX_NARROW ||
           (cv->index_choice == ZB_CONVERT_INDEX_AUTO && cv->genes.n <= UINT16_MAX);
}

static zb_status
choose(zb_convert *cv)
{
    zb_dtype *out = calloc(cv->n_mats, sizeof *out);
    cv_value_stats *all = calloc(cv->n_mats, sizeof *all);
    zb_status st = out && all ? ZB_OK : zb__err(ZB_E_NOMEM, "the stored types");
    bool fold = cv->data_choice == ZB_CONVERT_DATA_AUTO;
    for (size_t t = 0; st == ZB_OK && fold && t < cv->n_slices; t++) st = fold_task(cv, t, all);
    for (size_t k = 0; st == ZB_OK && fold && k < cv->n_inputs; k++) st = fold_prepared(cv, k, all);
    for (size_t j = 0; st == ZB_OK && j < cv->n_mats; j++)
        out[j] = cv_stored_dtype(cv, j, &all[j]); /* explicit: scatter refused misfits */
    free(all);
    if (st != ZB_OK) {
        free(out);
        return st;
    }
    cv->stored_dtypes = out;
    cv->narrow_indices = cv_narrow_indices(cv);
    cv->stored_known = true;
    return ZB_OK;
}

zb_status
cv_stored_types(zb_convert *cv)
{
    pthread_mutex_lock(&cv->lock);
    zb_status st = cv->stored_known ? ZB_OK : choose(cv);
    pthread_mutex_unlock(&cv->lock);
    return st;
}
