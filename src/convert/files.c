/* Files of a conversion's work directory: whole-file writes that appear complete or not at
 * all, directory creation and removal, and the fingerprints (size, newest mtime, CRC-64) that
 * identify inputs and outputs. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <isa-l/crc64.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "convert/convert_int.h"
#include "util/buf.h"
#include "util/status.h"

uint64_t
cv_crc64(uint64_t crc, const void *data, size_t len)
{
    /* ISA-L's reflected ECMA-182 CRC-64 with its inversions is CRC-64/XZ, and chains */
    return crc64_ecma_refl(crc, data, len);
}

bool
cv_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

zb_status
cv_mkdirs(const char *path)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n >= sizeof buf) return zb__err(ZB_E_INVALID, "%.64s...: path too long", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return zb__err(ZB_E_IO, "%s: cannot create the directory: %s", buf, strerror(errno));
        buf[i] = c;
    }
    return ZB_OK;
}

static zb_status
write_all(int fd, const char *path, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len > ((size_t)1 << 30) ? (size_t)1 << 30 : len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return zb__err(ZB_E_IO, "%s: write: %s", path, strerror(errno));
        p += w;
        len -= (size_t)w;
    }
    return ZB_OK;
}

zb_status
cv_write_file(const char *path, const void *const *bufs, const size_t *lens, size_t n)
{
    char tmp[4200];
    int len = snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
    if (len < 0 || (size_t)len >= sizeof tmp)
        return zb__err(ZB_E_INVALID, "%.64s...: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return zb__err(ZB_E_IO, "%s: %s", tmp, strerror(errno));
    zb_status st = ZB_OK;
    for (size_t i = 0; i < n && st == ZB_OK; i++) st = write_all(fd, path, bufs[i], lens[i]);
    if (st == ZB_OK && fsync(fd) != 0) st = zb__err(ZB_E_IO, "%s: fsync: %s", tmp, strerror(errno));
    if (close(fd) != 0 && st == ZB_OK) st = zb__err(ZB_E_IO, "%s: close: %s", tmp, strerror(errno));
    if (st == ZB_OK && rename(tmp, path) != 0)
        st = zb__err(ZB_E_IO, "%s: rename: %s", path, strerror(errno));
    if (st != ZB_OK) unlink(tmp);
    return st;
}

zb_status
cv_read_file(const char *path, char **text, size_t *len)
{
    *text = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return zb__err(errno == ENOENT ? ZB_E_NOTFOUND : ZB_E_IO, "%s: %s", path, strerror(errno));
    zb_status st = ZB_OK;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) st = zb__err(ZB_E_IO, "%s: cannot size it", path);
    if (st == ZB_OK && !(buf = malloc((size_t)n + 1))) st = zb__err(ZB_E_NOMEM, "%s", path);
    if (st == ZB_OK && fread(buf, 1, (size_t)n, f) != (size_t)n)
        st = zb__err(ZB_E_IO, "%s: short read", path);
    fclose(f);
    if (st != ZB_OK) {
        free(buf);
        return st;
    }
    buf[n] = '\0';
    *text = buf;
    if (len) *len = (size_t)n;
    return ZB_OK;
}

zb_status
cv_remove_tree(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return errno == ENOENT ? ZB_OK : zb__err(ZB_E_IO, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) {
        if (unlink(path) != 0 && errno != ENOENT)
            return zb__err(ZB_E_IO, "%s: cannot remove it: %s", path, strerror(errno));
        return ZB_OK;
    }
    DIR *d = opendir(path);
    if (!d) return zb__err(ZB_E_IO, "%s: %s", path, strerror(errno));
    zb_status st = ZB_OK;
    struct dirent *e;
    while (st == ZB_OK && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char child[4096];
        int n = snprintf(child, sizeof child, "%s/%s", path, e->d_name);
        if (n < 0 || (size_t)n >= sizeof child) {
            st = zb__err(ZB_E_INVALID, "%s: path too long", path);
            break;
        }
        st = cv_remove_tree(child);
    }
    closedir(d);
    if (st == ZB_OK && rmdir(path) != 0 && errno != ENOENT)
        st = zb__err(ZB_E_IO, "%s: cannot remove it: %s", path, strerror(errno));
    return st;
}

/* ---- fingerprints ---------------------------------------------------------------------------- */

/* Reads up to `want` bytes (fewer only at the end of the file) into buf. */
static zb_status
read_full(int fd, const char *path, unsigned char *buf, size_t want, size_t *got)
{
    *got = 0;
    while (*got < want) {
        ssize_t r = read(fd, buf + *got, want - *got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return zb__err(ZB_E_IO, "%s: read: %s", path, strerror(errno));
        if (r == 0) break;
        *got += (size_t)r;
    }
    return ZB_OK;
}

zb_status
cv_file_crc(const char *path, const cv_fold *folds, size_t n, uint64_t *crc)
{
    *crc = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return zb__err(ZB_E_IO, "%s: %s", path, strerror(errno));
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    /* reads small enough that the CRC and the fold find the bytes in the cache, each placed
     * congruent to its file offset (zb__buf_for_read: the kernel's copy is fastest so) */
    enum { BLOCK = 256 << 10 };
    zb__buf buf = {0};
    zb_status st = ZB_OK;
    uint64_t c = 0, pos = 0;
    size_t x = 0; /* the fold being read or the next one */
    for (;;) {
        /* a read ends where a fold starts or ends, so a fold's reads hold whole elements (its
         * offset is the first one's; BLOCK is a multiple of every element size) */
        bool inside = x < n && pos >= folds[x].at;
        uint64_t want = BLOCK;
        if (x < n) {
            uint64_t edge = inside ? folds[x].at + folds[x].len : folds[x].at;
            if (edge - pos < want) want = edge - pos;
        }
        uint8_t *dst;
        size_t got;
        st = zb__buf_for_read(&buf, pos, (size_t)want, &dst);
        if (st == ZB_OK) st = read_full(fd, path, dst, (size_t)want, &got);
        if (st != ZB_OK || got == 0) break;
        c = cv_crc64(c, dst, got);
        if (inside) {
            size_t item = zb_dtype_size(folds[x].dtype);
            cv_stats_add(folds[x].stats, dst, folds[x].dtype, got / item);
        }
        pos += got;
        if (inside && pos == folds[x].at + folds[x].len) x++;
    }
    if (st == ZB_OK && x < n)
        st = zb__err(ZB_E_TRUNCATED, "%s: ends at byte %" PRIu64 ", inside values at %" PRIu64,
                     path, pos, folds[x].at);
    zb__buf_free(&buf);
    close(fd);
    *crc = c;
    return st;
}

static int
cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Lists the entries of `dir`, sorted (free each and the array). */
static zb_status
sorted_entries(const char *dir, char ***names, size_t *n)
{
    *names = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return zb__err(ZB_E_IO, "%s: %s", dir, strerror(errno));
    size_t cap = 0;
    zb_status st = ZB_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            char **p = realloc(*names, cap * sizeof *p);
            if (!p) {
                st = zb__err(ZB_E_NOMEM, "%s: listing", dir);
                break;
            }
            *names = p;
        }
        if (!((*names)[*n] = strdup(e->d_name))) {
            st = zb__err(ZB_E_NOMEM, "%s: listing", dir);
            break;
        }
        (*n)++;
    }
    closedir(d);
    if (st == ZB_OK && *n) qsort(*names, *n, sizeof **names, cmp_names);
    return st;
}

/* Adds the files below dir/rel to the running fingerprint. */
static zb_status
walk(const char *root, const char *rel, uint64_t *size, int64_t *mtime, uint64_t *crc, bool read)
{
    char dir[4096];
    int len = snprintf(dir, sizeof dir, "%s%s%s", root, rel[0] ? "/" : "", rel);
    if (len < 0 || (size_t)len >= sizeof dir)
        return zb__err(ZB_E_INVALID, "%s: path too long", root);
    char **names;
    size_t n;
    ZB_TRY(sorted_entries(dir, &names, &n));
    zb_status st = ZB_OK;
    for (size_t i = 0; i < n && st == ZB_OK; i++) {
        char crel[4096], full[8200];
        snprintf(crel, sizeof crel, "%s%s%s", rel, rel[0] ? "/" : "", names[i]);
        snprintf(full, sizeof full, "%s/%s", root, crel);
        struct stat sb;
        if (stat(full, &sb) != 0) {
            st = zb__err(ZB_E_IO, "%s: %s", full, strerror(errno));
            break;
        }
        if (S_ISDIR(sb.st_mode)) {
            st = walk(root, crel, size, mtime, crc, read);
            continue;
        }
        int64_t t = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
        if (t > *mtime) *mtime = t;
        *size += (uint64_t)sb.st_size;
        if (!read) continue;
        uint64_t fc;
        st = cv_file_crc(full, NULL, 0, &fc);
        char line[4200];
        int ll = snprintf(line, sizeof line, "%s\t%llu\t%016llx\n", crel,
                          (unsigned long long)sb.st_size, (unsigned long long)fc);
        *crc = cv_crc64(*crc, line, (size_t)ll);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return st;
}

zb_status
cv_fingerprint(const char *path, uint64_t *size, int64_t *mtime_ns, uint64_t *crc)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return zb__err(errno == ENOENT ? ZB_E_NOTFOUND : ZB_E_IO, "%s: %s", path, strerror(errno));
    *size = 0;
    *mtime_ns = 0;
    if (crc) *crc = 0;
    if (!S_ISDIR(sb.st_mode)) {
        *size = (uint64_t)sb.st_size;
        *mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
        return crc ? cv_file_crc(path, NULL, 0, crc) : ZB_OK;
    }
    uint64_t c = 0;
    ZB_TRY(walk(path, "", size, mtime_ns, &c, crc != NULL));
    if (crc) *crc = c;
    return ZB_OK;
}

zb_status
cv_input_unchanged(const cv_input *in)
{
    uint64_t size;
    int64_t mtime;
    ZB_TRY(cv_fingerprint(in->path, &size, &mtime, NULL));
    if (size != in->size || mtime != in->mtime_ns)
        return zb__err(ZB_E_INVALID,
                       "%s changed since the conversion was planned (%s: %" PRIu64
                       " bytes then, %" PRIu64 " now); remove the conversion's work directory "
                       "to start afresh",
                       in->path, size != in->size ? "its size" : "its modification time", in->size,
                       size);
    return ZB_OK;
}
