/* libhdf5 under one lock, for the .h5ad source (h5ad_io.h): the lock, errors, files and
 * attributes. Datasets are opened in h5ad_dataset.c and read in h5ad_read.c.
 *
 * Why a lock of our own: a libhdf5 built without --enable-threadsafe must never be entered by two
 * threads, and one built with it (Debian's is) takes a global lock inside every API call anyway,
 * so serialising costs nothing there. The lock is recursive so the open path can hold it while it
 * calls the readers below, which take it themselves.
 *
 * libhdf5 prints its error stack to stderr by default; the printing is turned off (per thread in
 * a thread-safe build, where error stacks are per thread) the first time a thread takes the lock,
 * and every failure is turned into a zbatch detail message by zb__h5_fail. */
#include "convert/h5ad_io.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"
#include "util/status.h"

/* The file's chunk cache, used only by H5Dread (the direct path never touches it): large enough
 * that a chunk shared by two consecutive row blocks is decoded once. */
#define CHUNK_CACHE_BYTES ((size_t)16 << 20)

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t lock;
static bool threadsafe;
static _Thread_local bool errors_silenced;

static void
init_once(void)
{
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&lock, &attr);
    pthread_mutexattr_destroy(&attr);
    H5open();
    hbool_t ts = 0;
    threadsafe = H5is_library_threadsafe(&ts) >= 0 && ts;
}

void
zb__h5_lock(void)
{
    pthread_once(&once, init_once);
    pthread_mutex_lock(&lock);
    if (!errors_silenced) {
        H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
        errors_silenced = true;
    }
}

void
zb__h5_unlock(void)
{
    pthread_mutex_unlock(&lock);
}

bool
zb__h5_library_threadsafe(void)
{
    pthread_once(&once, init_once);
    return threadsafe;
}

/* ---- errors ---------------------------------------------------------------------------------- */

typedef struct err_walk {
    bool have, io, truncated, not_hdf5;
    char desc[256];
    char minor[128];
} err_walk;

/* H5E_WALK_UPWARD visits the innermost error (where it started) first, as n = 0. */
static herr_t
walk_error(unsigned n, const H5E_error2_t *e, void *ctx)
{
    err_walk *w = ctx;
    if (e->min_num == H5E_TRUNCATED) w->truncated = true;
    if (e->min_num == H5E_NOTHDF5) w->not_hdf5 = true;
    if (n == 0) {
        w->have = true;
        w->io = e->maj_num == H5E_IO;
        snprintf(w->desc, sizeof w->desc, "%s", e->desc ? e->desc : "");
        if (H5Eget_msg(e->min_num, NULL, w->minor, sizeof w->minor) < 0) w->minor[0] = '\0';
    }
    return 0;
}

zb_status
zb__h5_fail(zb_status fallback, const char *path, const char *key, const char *what)
{
    err_walk w = {0};
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk_error, &w);
    H5Eclear2(H5E_DEFAULT);
    zb_status st = w.not_hdf5    ? ZB_E_UNSUPPORTED
                   : w.truncated ? ZB_E_CORRUPT
                   : w.io        ? ZB_E_IO
                                 : fallback;
    if (!w.have) return zb__err(st, "%s: %s: %s (libhdf5 gave no detail)", path, key, what);
    return zb__err(st, "%s: %s: %s (libhdf5: %s%s%s)", path, key, what, w.desc,
                   w.minor[0] ? ": " : "", w.minor);
}

/* ---- objects and attributes ------------------------------------------------------------------ */

herr_t
zb__h5_reclaim(hid_t type, hid_t space, void *buf)
{
#if H5_VERSION_GE(1, 12, 0)
    return H5Treclaim(type, space, H5P_DEFAULT, buf);
#else
    return H5Dvlen_reclaim(type, space, H5P_DEFAULT, buf);
#endif
}

size_t
zb__h5_fixed_len(const char *s, size_t size, bool space_padded)
{
    size_t n = space_padded ? size : strnlen(s, size);
    while (space_padded && n > 0 && s[n - 1] == ' ') n--;
    return n;
}

bool
zb__h5_exists(hid_t loc, const char *name)
{
    /* H5Lexists fails (instead of saying no) when a link on the way is missing: test each. */
    char buf[1024];
    size_t len = strlen(name);
    if (len == 0 || len >= sizeof buf) return false;
    memcpy(buf, name, len + 1);
    for (size_t i = 0; i <= len; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char c = buf[i];
        buf[i] = '\0';
        bool yes = H5Lexists(loc, buf, H5P_DEFAULT) > 0;
        buf[i] = c;
        if (!yes) {
            H5Eclear2(H5E_DEFAULT);
            return false;
        }
    }
    return true;
}

bool
zb__h5_attr_exists(hid_t obj, const char *name)
{
    bool yes = H5Aexists(obj, name) > 0;
    H5Eclear2(H5E_DEFAULT);
    return yes;
}

/* An open attribute with its type and the number of its elements. */
typedef struct attr {
    hid_t id, type, space;
    H5T_class_t cls;
    hssize_t n;
} attr;

static void
attr_close(attr *a)
{
    if (a->space >= 0) H5Sclose(a->space);
    if (a->type >= 0) H5Tclose(a->type);
    if (a->id >= 0) H5Aclose(a->id);
}

static zb_status
attr_open(hid_t obj, const char *name, const char *path, const char *key, attr *a)
{
    a->id = a->type = a->space = H5I_INVALID_HID;
    if (!zb__h5_attr_exists(obj, name))
        return zb__err(ZB_E_NOTFOUND, "%s: %s has no attribute '%s'", path, key, name);
    a->id = H5Aopen(obj, name, H5P_DEFAULT);
    if (a->id >= 0) a->type = H5Aget_type(a->id);
    if (a->id >= 0) a->space = H5Aget_space(a->id);
    if (a->id < 0 || a->type < 0 || a->space < 0) {
        attr_close(a);
        char what[128];
        snprintf(what, sizeof what, "reading its attribute '%s'", name);
        return zb__h5_fail(ZB_E_CORRUPT, path, key, what);
    }
    a->cls = H5Tget_class(a->type);
    a->n = H5Sget_simple_extent_npoints(a->space);
    return ZB_OK;
}

/* The elements of a string attribute as new NUL-terminated strings. */
static zb_status
attr_read_texts(attr *a, const char *name, const char *path, const char *key, char **out)
{
    size_t n = (size_t)a->n;
    bool vlen = H5Tis_variable_str(a->type) > 0;
    size_t size = vlen ? sizeof(char *) : H5Tget_size(a->type);
    hid_t mem = vlen ? H5Tcopy(H5T_C_S1) : H5Tcopy(a->type);
    void *raw = calloc(n ? n : 1, size ? size : 1);
    zb_status st = ZB_OK;
    if (mem < 0 || !raw ||
        (vlen &&
         (H5Tset_size(mem, H5T_VARIABLE) < 0 || H5Tset_cset(mem, H5Tget_cset(a->type)) < 0)) ||
        H5Aread(a->id, mem, raw) < 0) {
        char what[128];
        snprintf(what, sizeof what, "reading its attribute '%s'", name);
        st = raw ? zb__h5_fail(ZB_E_CORRUPT, path, key, what)
                 : zb__err(ZB_E_NOMEM, "%s: %s: attribute '%s'", path, key, name);
        vlen = false; /* nothing to reclaim */
    }
    bool padded = !vlen && H5Tget_strpad(a->type) == H5T_STR_SPACEPAD;
    for (size_t i = 0; st == ZB_OK && i < n; i++) {
        const char *s = vlen ? ((char **)raw)[i] : (const char *)raw + i * size;
        size_t len = vlen ? (s ? strlen(s) : 0) : zb__h5_fixed_len(s, size, padded);
        if (!(out[i] = malloc(len + 1))) {
            st = zb__err(ZB_E_NOMEM, "%s: %s: attribute '%s'", path, key, name);
            break;
        }
        if (len) memcpy(out[i], s, len);
        out[i][len] = '\0';
    }
    if (vlen) zb__h5_reclaim(mem, a->space, raw);
    if (mem >= 0) H5Tclose(mem);
    free(raw);
    return st;
}

zb_status
zb__h5_attr_text(hid_t obj, const char *name, const char *path, const char *key, char **out)
{
    *out = NULL;
    attr a;
    ZB_TRY(attr_open(obj, name, path, key, &a));
    zb_status st = ZB_OK;
    if (a.cls != H5T_STRING || a.n != 1)
        st = zb__err(ZB_E_UNSUPPORTED, "%s: %s: attribute '%s' is not one string", path, key, name);
    else
        st = attr_read_texts(&a, name, path, key, out);
    attr_close(&a);
    return st;
}

zb_status
zb__h5_attr_texts(hid_t obj, const char *name, const char *path, const char *key, char ***out,
                  size_t *n)
{
    *out = NULL;
    *n = 0;
    attr a;
    ZB_TRY(attr_open(obj, name, path, key, &a));
    zb_status st = ZB_OK;
    /* h5py writes an empty list as an empty float64 array */
    if (a.n == 0) goto done;
    if (a.cls != H5T_STRING || a.n < 0) {
        st = zb__err(ZB_E_UNSUPPORTED, "%s: %s: attribute '%s' is not a list of strings", path, key,
                     name);
        goto done;
    }
    *out = calloc((size_t)a.n, sizeof **out);
    if (!*out) {
        st = zb__err(ZB_E_NOMEM, "%s: %s: attribute '%s'", path, key, name);
        goto done;
    }
    st = attr_read_texts(&a, name, path, key, *out);
    *n = (size_t)a.n;
    if (st != ZB_OK) {
        for (size_t i = 0; i < *n; i++) free((*out)[i]);
        free(*out);
        *out = NULL;
        *n = 0;
    }
done:
    attr_close(&a);
    return st;
}

zb_status
zb__h5_attr_u64s(hid_t obj, const char *name, const char *path, const char *key, uint64_t *out,
                 size_t n)
{
    attr a;
    ZB_TRY(attr_open(obj, name, path, key, &a));
    zb_status st = ZB_OK;
    int64_t v[8];
    if (a.cls != H5T_INTEGER || a.n != (hssize_t)n || n > 8) {
        st =
            zb__err(ZB_E_CORRUPT, "%s: %s: attribute '%s' is not %zu integers", path, key, name, n);
    } else if (H5Aread(a.id, H5T_NATIVE_INT64, v) < 0) {
        st = zb__h5_fail(ZB_E_CORRUPT, path, key, "reading an integer attribute");
    } else {
        for (size_t i = 0; i < n && st == ZB_OK; i++) {
            if (v[i] < 0)
                st = zb__err(ZB_E_CORRUPT, "%s: %s: attribute '%s' holds %lld", path, key, name,
                             (long long)v[i]);
            out[i] = (uint64_t)v[i];
        }
    }
    attr_close(&a);
    return st;
}

zb_status
zb__h5_attr_bool(hid_t obj, const char *name, const char *path, const char *key, bool *out)
{
    attr a;
    ZB_TRY(attr_open(obj, name, path, key, &a));
    zb_status st = ZB_OK;
    uint8_t raw[8] = {0};
    size_t size = H5Tget_size(a.type);
    /* read in the attribute's own type (libhdf5 converts no enum to an integer): any non-zero
     * byte is true, whatever the byte order */
    if ((a.cls != H5T_ENUM && a.cls != H5T_INTEGER) || a.n != 1 || size > sizeof raw)
        st = zb__err(ZB_E_CORRUPT, "%s: %s: attribute '%s' is not a bool", path, key, name);
    else if (H5Aread(a.id, a.type, raw) < 0)
        st = zb__h5_fail(ZB_E_CORRUPT, path, key, "reading a bool attribute");
    *out = false;
    for (size_t i = 0; st == ZB_OK && i < size; i++)
        if (raw[i]) *out = true;
    attr_close(&a);
    return st;
}

zb_status
zb__h5_attr_deref(hid_t obj, const char *name, hid_t base, const char *path, const char *key,
                  hid_t *out)
{
    *out = H5I_INVALID_HID;
    attr a;
    ZB_TRY(attr_open(obj, name, path, key, &a));
    zb_status st = ZB_OK;
    char *target = NULL;
    if (a.cls == H5T_REFERENCE && a.n == 1 && H5Tequal(a.type, H5T_STD_REF_OBJ) > 0) {
        hobj_ref_t ref;
        if (H5Aread(a.id, H5T_STD_REF_OBJ, &ref) < 0 ||
            (*out = H5Rdereference2(obj, H5P_DEFAULT, H5R_OBJECT, &ref)) < 0)
            st = zb__h5_fail(ZB_E_CORRUPT, path, key, "following its 'categories' reference");
    } else if (a.cls == H5T_STRING && a.n == 1) {
        st = attr_read_texts(&a, name, path, key, &target);
        if (st == ZB_OK && !zb__h5_exists(base, target))
            st = zb__err(ZB_E_CORRUPT, "%s: %s: attribute '%s' names '%s', which does not exist",
                         path, key, name, target);
        if (st == ZB_OK && (*out = H5Oopen(base, target, H5P_DEFAULT)) < 0)
            st = zb__h5_fail(ZB_E_CORRUPT, path, key, "opening what its attribute names");
    } else {
        st = zb__err(ZB_E_UNSUPPORTED, "%s: %s: attribute '%s' is neither a reference nor a path",
                     path, key, name);
    }
    free(target);
    attr_close(&a);
    return st;
}

/* ---- files ----------------------------------------------------------------------------------- */

zb_status
zb__h5_file_open(const char *path, hid_t *out)
{
    *out = H5I_INVALID_HID;
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0) return zb__h5_fail(ZB_E_NOMEM, path, "/", "making a file access list");
    H5Pset_cache(fapl, 0, 4099, CHUNK_CACHE_BYTES, 0.75);
#if H5_VERSION_GE(1, 10, 7)
    /* keep libhdf5's file locks, but do not fail on file systems without them (NFS, Lustre) */
    H5Pset_file_locking(fapl, true, true);
#endif
    *out = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    zb_status st = *out < 0 ? zb__h5_fail(ZB_E_CORRUPT, path, "/", "opening the file") : ZB_OK;
    H5Pclose(fapl);
    return st;
}
