/* The file backend: a directory on a local file system.
 *
 * Reads open a fresh descriptor per call relative to the root's descriptor (openat) and use
 * pread, so any number of threads may read at once. Keys arrive normalised by the store layer,
 * which has already refused "." and ".." segments, so a key cannot name anything outside the
 * root lexically. Writes go to a temporary name beside the target and are renamed over it, so a
 * reader never sees a half-written object. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/store.h"
#include "util/status.h"

typedef struct file_store {
    int rootfd;
    char *root;
} file_store;

static zb_status
errno_status(int e, const char *root, const char *key, const char *what)
{
    if (e == ENOENT || e == ENOTDIR || e == EISDIR)
        return zb_err(ZB_E_NOTFOUND, "%s/%s: not found", root, key);
    if (e == ENOMEM) return zb_err(ZB_E_NOMEM, "%s/%s: %s: out of memory", root, key, what);
    return zb_err(ZB_E_IO, "%s/%s: %s: %s", root, key, what, strerror(e));
}

static zb_status
file_get(void *self, const char *key, uint64_t offset, uint64_t length, void *dst, uint64_t *nread)
{
    file_store *fs = self;
    *nread = 0;
    if (!key[0]) return zb_err(ZB_E_NOTFOUND, "%s: the root is not an object", fs->root);
    int fd = openat(fs->rootfd, key, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno_status(errno, fs->root, key, "open");
    uint8_t *p = dst;
    uint64_t done = 0;
    zb_status st = ZB_OK;
    while (done < length) {
        size_t want = length - done > ((size_t)1 << 30) ? (size_t)1 << 30 : (size_t)(length - done);
        ssize_t n = pread(fd, p + done, want, (off_t)(offset + done));
        if (n < 0) {
            if (errno == EINTR) continue;
            st = errno_status(errno, fs->root, key, "read");
            break;
        }
        if (n == 0) break; /* end of file: a short read */
        done += (uint64_t)n;
    }
    close(fd);
    *nread = done;
    return st;
}

static zb_status
file_size(void *self, const char *key, uint64_t *size)
{
    file_store *fs = self;
    struct stat sb;
    if (!key[0]) return zb_err(ZB_E_NOTFOUND, "%s: the root is not an object", fs->root);
    if (fstatat(fs->rootfd, key, &sb, 0) != 0) return errno_status(errno, fs->root, key, "stat");
    if (!S_ISREG(sb.st_mode)) return zb_err(ZB_E_NOTFOUND, "%s/%s: not a file", fs->root, key);
    *size = (uint64_t)sb.st_size;
    return ZB_OK;
}

static zb_status
file_list(void *self, const char *prefix, zb_list_fn fn, void *ctx)
{
    file_store *fs = self;
    int dfd = openat(fs->rootfd, prefix[0] ? prefix : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return errno_status(errno, fs->root, prefix, "opendir");
    DIR *d = fdopendir(dfd);
    if (!d) {
        int e = errno;
        close(dfd);
        return errno_status(e, fs->root, prefix, "opendir");
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        bool is_dir;
        if (de->d_type == DT_DIR) {
            is_dir = true;
        } else if (de->d_type == DT_UNKNOWN || de->d_type == DT_LNK) {
            struct stat sb;
            is_dir = fstatat(dirfd(d), de->d_name, &sb, 0) == 0 && S_ISDIR(sb.st_mode);
        } else {
            is_dir = false;
        }
        if (fn(ctx, de->d_name, is_dir)) break;
    }
    closedir(d);
    return ZB_OK;
}

/* Creates every parent directory of `key` below the root. */
static zb_status
make_parents(file_store *fs, const char *key)
{
    char path[4096];
    snprintf(path, sizeof path, "%s", key);
    for (char *p = path; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdirat(fs->rootfd, path, 0777) != 0 && errno != EEXIST)
            return errno_status(errno, fs->root, path, "mkdir");
        *p = '/';
    }
    return ZB_OK;
}

static zb_status
file_put(void *self, const char *key, const void *data, uint64_t length)
{
    file_store *fs = self;
    ZB_TRY(make_parents(fs, key));
    static _Atomic unsigned long counter;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.zbtmp.%ld.%lu", key, (long)getpid(), ++counter);
    int fd = openat(fs->rootfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return errno_status(errno, fs->root, tmp, "create");
    const uint8_t *p = data;
    uint64_t done = 0;
    while (done < length) {
        size_t want = length - done > ((size_t)1 << 30) ? (size_t)1 << 30 : (size_t)(length - done);
        ssize_t n = write(fd, p + done, want);
        if (n < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            unlinkat(fs->rootfd, tmp, 0);
            return errno_status(e, fs->root, key, "write");
        }
        done += (uint64_t)n;
    }
    if (close(fd) != 0) {
        int e = errno;
        unlinkat(fs->rootfd, tmp, 0);
        return errno_status(e, fs->root, key, "close");
    }
    if (renameat(fs->rootfd, tmp, fs->rootfd, key) != 0) {
        int e = errno;
        unlinkat(fs->rootfd, tmp, 0);
        return errno_status(e, fs->root, key, "rename");
    }
    return ZB_OK;
}

static zb_status
file_erase(void *self, const char *key)
{
    file_store *fs = self;
    if (unlinkat(fs->rootfd, key, 0) == 0 || errno == ENOENT) return ZB_OK;
    /* an empty directory left by erased keys goes too (a non-empty one is an error) */
    if ((errno == EISDIR || errno == EPERM) && unlinkat(fs->rootfd, key, AT_REMOVEDIR) == 0)
        return ZB_OK;
    return errno_status(errno, fs->root, key, "unlink");
}

static zb_status
file_rename(void *self, const char *from, const char *to)
{
    file_store *fs = self;
    ZB_TRY(make_parents(fs, to));
    if (renameat(fs->rootfd, from, fs->rootfd, to) != 0)
        return errno_status(errno, fs->root, from, "rename");
    return ZB_OK;
}

static void
file_close(void *self)
{
    file_store *fs = self;
    if (!fs) return;
    close(fs->rootfd);
    free(fs->root);
    free(fs);
}

static const zb_store_methods file_methods = {
    .scheme = "file",
    .get = file_get,
    .size = file_size,
    .list = file_list,
    .put = file_put,
    .erase = file_erase,
    .rename = file_rename,
    .close = file_close,
};

zb_status
zb_store_open_file(const char *root, zb_store **out)
{
    if (!out) return zb_err(ZB_E_INVALID, "zb_store_open_file: null out");
    *out = NULL;
    if (!root || !*root) return zb_err(ZB_E_INVALID, "zb_store_open_file: empty path");
    int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT) return zb_err(ZB_E_NOTFOUND, "%s: no such directory", root);
        if (e == ENOTDIR) return zb_err(ZB_E_NOTFOUND, "%s: not a directory", root);
        return zb_err(ZB_E_IO, "%s: %s", root, strerror(e));
    }
    file_store *fs = calloc(1, sizeof *fs);
    char *r = strdup(root);
    if (!fs || !r) {
        free(fs);
        free(r);
        close(fd);
        return zb_err(ZB_E_NOMEM, "zb_store_open_file: out of memory");
    }
    size_t n = strlen(r);
    while (n > 1 && r[n - 1] == '/') r[--n] = '\0';
    fs->rootfd = fd;
    fs->root = r;
    zb_status st = zb_store_new(&file_methods, fs, out);
    if (st != ZB_OK) file_close(fs);
    return st;
}
