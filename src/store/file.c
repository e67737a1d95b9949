/* The file backend: a directory on a local file system.
 *
 * Reads open a fresh descriptor per call relative to the root's descriptor (openat) and use
 * pread, so any number of threads may read at once. Keys arrive normalised by the store layer,
 * which has already refused "." and ".." segments and made absolute keys relative, so a key
 * cannot name anything outside the root lexically. Symbolic links could: every open resolves
 * the key with openat2(RESOLVE_BENEATH), which refuses a path that leaves the root, unless the
 * store allows links outside (zb_store_opts). Only regular files are data: a key is opened
 * with O_NONBLOCK (a FIFO without a writer would otherwise block the open forever) and its type
 * checked before a byte is read. Writes go to a temporary name beside the target and are
 * renamed over it, so a reader never sees a half-written object.
 *
 * Views (zb_store_view) map whole data files read-only and keep the mappings for the store's
 * life, up to a budget of mapped bytes (zb_store_opts.mmap_bytes, default 1 GiB; beyond it views
 * are declined and callers use pread). A mapping is revalidated (device, inode, size, mtime)
 * when it was last checked more than a second ago, and dropped when the file was replaced;
 * this store's own put/erase/rename drop the mappings of the keys they touch.
 *
 * Direct I/O (zb_store_opts.direct_io): a large object's whole 4096-byte blocks are written
 * with O_DIRECT, set on the temporary file's descriptor with fcntl (so the open path, with its
 * link checks, stays the one above) and cleared for the last partial block, which is written
 * buffered: padding that block and truncating the file instead would make the file system read
 * the block back to zero its tail. 4096 bytes of alignment (buffer, offset, length) suit devices
 * of 512- and 4096-byte sectors; a file system that wants more, or none at all, refuses with
 * EINVAL, and the store then writes buffered from then on. Data that is not 4096-aligned in
 * memory goes through a bounce buffer taken from a free list the store keeps (one per put in
 * flight, freed at close): fresh pages for every object would cost what direct I/O saves. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/openat2.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"
#include "util/status.h"

typedef struct fmap {
    struct fmap *next; /* hash chain */
    char *key;
    const uint8_t *base; /* NULL for an empty file */
    uint64_t size;
    dev_t dev;
    ino_t ino;
    struct timespec mtime;
    double checked; /* monotonic seconds of the last validation */
    int refs;       /* views handed out and not yet released */
    bool dead;      /* out of the table: unmapped at the last release */
} fmap;

#define FMAP_BUCKETS 1024
#define FMAP_RECHECK_S 1.0
#define FMAP_POPULATE_MAX ((off_t)64 << 20)
#define DIRECT_BOUNCE ((size_t)4 << 20) /* bytes per bounce buffer: one write each */

typedef struct file_store {
    int rootfd;
    char *root;
    char *real_root;          /* realpath of root: where links that stay inside must land */
    bool allow_links_outside; /* zb_store_opts.allow_links_outside */
    pthread_mutex_t mu;       /* guards the map table and the bounce buffers */
    fmap *maps[FMAP_BUCKETS];
    uint64_t mapped, map_budget; /* bytes mapped, and the most that may be */
    _Atomic bool direct;         /* zb_store_opts.direct_io, until the file system refuses it */
    uint8_t *bounce;             /* free bounce buffers, each holding the next's address (mu) */
} file_store;

static double
mono_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static size_t
fmap_bucket(const char *key)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *k = key; *k; k++) h = (h ^ (uint8_t)*k) * 1099511628211ull;
    return (size_t)(h % FMAP_BUCKETS);
}

static void
fmap_free(fmap *m)
{
    if (m->base) munmap((void *)m->base, (size_t)m->size);
    free(m->key);
    free(m);
}

/* Takes the mapping of `key` out of the table (caller holds mu); it is unmapped now, or at its
 * last release when views of it are still out. */
static void
fmap_drop(file_store *fs, const char *key)
{
    fmap **pp = &fs->maps[fmap_bucket(key)];
    while (*pp && strcmp((*pp)->key, key) != 0) pp = &(*pp)->next;
    fmap *m = *pp;
    if (!m) return;
    *pp = m->next;
    fs->mapped -= m->size;
    m->dead = true;
    if (m->refs == 0) fmap_free(m);
}

static void
fmap_forget(file_store *fs, const char *key)
{
    pthread_mutex_lock(&fs->mu);
    fmap_drop(fs, key);
    pthread_mutex_unlock(&fs->mu);
}

static bool
same_file(const fmap *m, const struct stat *sb)
{
    return m->dev == sb->st_dev && m->ino == sb->st_ino && m->size == (uint64_t)sb->st_size &&
           m->mtime.tv_sec == sb->st_mtim.tv_sec && m->mtime.tv_nsec == sb->st_mtim.tv_nsec;
}

static zb_status
errno_status(int e, const char *root, const char *key, const char *what)
{
    if (e == ENOENT || e == ENOTDIR || e == EISDIR)
        return zb__err(ZB_E_NOTFOUND, "%s/%s: not found", root, key);
    if (e == ENOMEM) return zb__err(ZB_E_NOMEM, "%s/%s: %s: out of memory", root, key, what);
    return zb__err(ZB_E_IO, "%s/%s: %s: %s", root, key, what, strerror(e));
}

/* True when ROOT/key (its parent directory when `parent`) resolves to a path inside the root.
 * The slow check, for what RESOLVE_BENEATH refuses wholesale: an absolute link that still lands
 * inside the root, and kernels without openat2. Of a path that does not resolve (a missing key,
 * a dangling link) the longest prefix that does is checked: the open that follows reports the
 * rest missing. */
static bool
resolves_inside(const file_store *fs, const char *key, bool parent)
{
    char path[4200];
    int n = snprintf(path, sizeof path, "%s/%s", fs->root, key);
    if (n < 0 || (size_t)n >= sizeof path) return false;
    size_t floor = strlen(fs->root);
    char *real = NULL;
    for (bool strip = parent;; strip = true) {
        char *slash = strip ? strrchr(path, '/') : NULL;
        if (slash && (size_t)(slash - path) >= floor) *slash = '\0';
        real = realpath(path, NULL);
        if (real || (errno != ENOENT && errno != ENOTDIR)) break;
        if (strlen(path) <= floor) return true; /* the root itself is gone */
    }
    if (!real) return false;
    size_t r = strlen(fs->real_root);
    bool inside = strncmp(real, fs->real_root, r) == 0 &&
                  (real[r] == '\0' || real[r] == '/' || (r == 1 && fs->real_root[0] == '/'));
    free(real);
    return inside;
}

/* openat relative to the root that fails with EXDEV when the path leaves the root through a
 * symbolic link (unless the store allows that). */
static int
open_beneath(const file_store *fs, const char *key, int flags, mode_t mode)
{
    if (fs->allow_links_outside) return openat(fs->rootfd, key, flags, mode);
    struct open_how how = {.flags = (uint64_t)flags,
                           .mode = (flags & O_CREAT) ? mode : 0,
                           .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS};
    long fd = syscall(SYS_openat2, fs->rootfd, key, &how, sizeof how);
    if (fd >= 0 || (errno != EXDEV && errno != ENOSYS)) return (int)fd;
    if (!resolves_inside(fs, key, (flags & O_CREAT) != 0)) {
        errno = EXDEV;
        return -1;
    }
    return openat(fs->rootfd, key, flags, mode);
}

static zb_status
outside_root(const file_store *fs, const char *key)
{
    return zb__err(ZB_E_BADKEY,
                   "%s/%s: a symbolic link leads outside the store root (open the store with "
                   "allow_links_outside to follow it)",
                   fs->root, key);
}

static const char *
file_kind(mode_t mode)
{
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    return "not a file";
}

static zb_status
not_regular(const file_store *fs, const char *key, mode_t mode)
{
    return zb__err(ZB_E_CORRUPT, "%s/%s: not a regular file (%s); only regular files are data",
                   fs->root, key, file_kind(mode));
}

/* Opens `key` for reading and stats it: a regular file inside the root, else an error (a
 * directory is a missing object, as it always was; a FIFO, socket or device is corrupt). */
static zb_status
open_object(const file_store *fs, const char *key, int *fd_out, struct stat *sb)
{
    *fd_out = -1;
    int fd = open_beneath(fs, key, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, 0);
    if (fd < 0) {
        int e = errno;
        if (e == EXDEV) return outside_root(fs, key);
        /* a socket cannot be opened (ENXIO): say what is there */
        if (e != ENOENT && e != ENOTDIR && fstatat(fs->rootfd, key, sb, 0) == 0 &&
            !S_ISREG(sb->st_mode) && !S_ISDIR(sb->st_mode))
            return not_regular(fs, key, sb->st_mode);
        return errno_status(e, fs->root, key, "open");
    }
    zb_status st = ZB_OK;
    if (fstat(fd, sb) != 0)
        st = errno_status(errno, fs->root, key, "stat");
    else if (S_ISDIR(sb->st_mode))
        st = zb__err(ZB_E_NOTFOUND, "%s/%s: not found (a directory)", fs->root, key);
    else if (!S_ISREG(sb->st_mode))
        st = not_regular(fs, key, sb->st_mode);
    if (st != ZB_OK) {
        close(fd);
        return st;
    }
    *fd_out = fd;
    return ZB_OK;
}

/* Sets O_DIRECT on `fd` when the store uses direct I/O; true when it is set. A file system
 * that refuses it (EINVAL) turns direct I/O off for the store. */
static bool
direct_on(file_store *fs, int fd)
{
    if (!atomic_load(&fs->direct)) return false;
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0 && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0) return true;
    if (errno == EINVAL) atomic_store(&fs->direct, false);
    return false;
}

/* Clears O_DIRECT on `fd`; 0 or an errno. */
static int
direct_off(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_DIRECT) != 0) return errno;
    return 0;
}

static zb_status
file_get(void *self, const char *key, uint64_t offset, uint64_t length, void *dst, uint64_t *nread)
{
    file_store *fs = self;
    *nread = 0;
    if (!key[0]) return zb__err(ZB_E_NOTFOUND, "%s: the root is not an object", fs->root);
    int fd;
    struct stat sb;
    ZB_TRY(open_object(fs, key, &fd, &sb));
    uint8_t *p = dst;
    bool direct = length >= ZB_STORE_DIRECT_MIN_BYTES && offset % ZB_STORE_DIRECT_ALIGN == 0 &&
                  length % ZB_STORE_DIRECT_ALIGN == 0 &&
                  (uintptr_t)p % ZB_STORE_DIRECT_ALIGN == 0 && direct_on(fs, fd);
    uint64_t done = 0;
    zb_status st = ZB_OK;
    while (done < length) {
        size_t want = length - done > ((size_t)1 << 30) ? (size_t)1 << 30 : (size_t)(length - done);
        ssize_t n = pread(fd, p + done, want, (off_t)(offset + done));
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EINVAL && direct) { /* the file system wants other alignment */
                atomic_store(&fs->direct, false);
                direct = false;
                if ((errno = direct_off(fd)) == 0) continue;
            }
            st = errno_status(errno, fs->root, key, "read");
            break;
        }
        if (n == 0) break; /* end of file: a short read */
        done += (uint64_t)n;
        if ((size_t)n < want) break; /* a regular file reads short only at its end */
    }
    close(fd);
    *nread = done;
    return st;
}

static zb_status
file_view(void *self, const char *key, uint64_t offset, uint64_t length, const uint8_t **data,
          uint64_t *nread, void **token)
{
    file_store *fs = self;
    if (!key[0]) return zb__err(ZB_E_NOTFOUND, "%s: the root is not an object", fs->root);
    if (fs->map_budget == 0) return zb__err(ZB_E_UNSUPPORTED, "%s: views are off", fs->root);
    zb_status st = ZB_OK;
    pthread_mutex_lock(&fs->mu);
    fmap *m = fs->maps[fmap_bucket(key)];
    while (m && strcmp(m->key, key) != 0) m = m->next;
    double now = mono_now();
    if (m && now - m->checked > FMAP_RECHECK_S) {
        struct stat sb;
        if (fstatat(fs->rootfd, key, &sb, 0) == 0 && same_file(m, &sb)) {
            m->checked = now;
        } else {
            fmap_drop(fs, key);
            m = NULL;
        }
    }
    if (!m) {
        int fd;
        struct stat sb;
        st = open_object(fs, key, &fd, &sb);
        if (st != ZB_OK) {
            /* reported below */
        } else if ((uint64_t)sb.st_size > fs->map_budget - fs->mapped) {
            st = zb__err(ZB_E_UNSUPPORTED, "%s/%s: the mapping budget is spent", fs->root, key);
        } else {
            m = calloc(1, sizeof *m);
            void *base = NULL;
            if (m && sb.st_size > 0) {
                /* small files are populated at once: one call instead of a page fault per
                 * 64 KiB touched (random rows touch a new page per sample) */
                int flags = MAP_SHARED | (sb.st_size <= FMAP_POPULATE_MAX ? MAP_POPULATE : 0);
                base = mmap(NULL, (size_t)sb.st_size, PROT_READ, flags, fd, 0);
                if (base == MAP_FAILED) {
                    /* no mapping (a file system without mmap, address space): use get */
                    st = zb__err(ZB_E_UNSUPPORTED, "%s/%s: mmap: %s", fs->root, key,
                                 strerror(errno));
                    base = NULL;
                }
            }
            if (m && st == ZB_OK) m->key = strdup(key);
            if (!m || (st == ZB_OK && !m->key)) {
                if (base) munmap(base, (size_t)sb.st_size);
                st = zb__err(ZB_E_NOMEM, "%s/%s: out of memory", fs->root, key);
            }
            if (st == ZB_OK) {
                m->base = base;
                m->size = (uint64_t)sb.st_size;
                m->dev = sb.st_dev;
                m->ino = sb.st_ino;
                m->mtime = sb.st_mtim;
                m->checked = now;
                size_t h = fmap_bucket(key);
                m->next = fs->maps[h];
                fs->maps[h] = m;
                fs->mapped += m->size;
            } else if (m) {
                free(m->key);
                free(m);
                m = NULL;
            }
        }
        if (fd >= 0) close(fd);
    }
    if (m) m->refs++;
    pthread_mutex_unlock(&fs->mu);
    if (st != ZB_OK) return st;
    uint64_t n = offset >= m->size ? 0 : m->size - offset;
    *data = m->base ? m->base + (offset < m->size ? offset : m->size) : NULL;
    *nread = n < length ? n : length;
    *token = m;
    return ZB_OK;
}

static void
file_release(void *self, void *token)
{
    file_store *fs = self;
    fmap *m = token;
    pthread_mutex_lock(&fs->mu);
    if (--m->refs == 0 && m->dead) fmap_free(m);
    pthread_mutex_unlock(&fs->mu);
}

static zb_status
file_size(void *self, const char *key, uint64_t *size)
{
    file_store *fs = self;
    struct stat sb;
    int fd;
    if (!key[0]) return zb__err(ZB_E_NOTFOUND, "%s: the root is not an object", fs->root);
    ZB_TRY(open_object(fs, key, &fd, &sb));
    close(fd);
    *size = (uint64_t)sb.st_size;
    return ZB_OK;
}

static zb_status
file_list(void *self, const char *prefix, zb_list_fn fn, void *ctx)
{
    file_store *fs = self;
    int dfd = open_beneath(fs, prefix[0] ? prefix : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (dfd < 0 && errno == EXDEV) return outside_root(fs, prefix);
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
        if (mkdirat(fs->rootfd, path, 0777) != 0) {
            if (errno != EEXIST) return errno_status(errno, fs->root, path, "mkdir");
            /* an existing parent may be a link out of the root: nothing is made beneath it */
            int dfd = open_beneath(fs, path, O_PATH | O_DIRECTORY | O_CLOEXEC, 0);
            if (dfd < 0 && errno == EXDEV) return outside_root(fs, key);
            if (dfd >= 0) close(dfd);
        }
        *p = '/';
    }
    return ZB_OK;
}

/* Refuses a key whose parent directory lies outside the root (erase and rename would act
 * there). */
static zb_status
check_parent(file_store *fs, const char *key)
{
    const char *slash = strrchr(key, '/');
    if (!slash || fs->allow_links_outside) return ZB_OK;
    char path[4096];
    snprintf(path, sizeof path, "%.*s", (int)(slash - key), key);
    int dfd = open_beneath(fs, path, O_PATH | O_DIRECTORY | O_CLOEXEC, 0);
    if (dfd < 0 && errno == EXDEV) return outside_root(fs, key);
    if (dfd >= 0) close(dfd);
    return ZB_OK;
}

/* pwrite of all `n` bytes at `at`; 0 or an errno. */
static int
write_at(int fd, const uint8_t *p, uint64_t n, uint64_t at)
{
    while (n > 0) {
        size_t want = n > ((size_t)1 << 30) ? (size_t)1 << 30 : (size_t)n;
        ssize_t k = pwrite(fd, p, want, (off_t)at);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return errno;
        if (k == 0) return EIO;
        p += k;
        n -= (uint64_t)k;
        at += (uint64_t)k;
    }
    return 0;
}

/* The first free bounce buffer, taken off the list, or NULL (mu held, or the store closing). */
static uint8_t *
bounce_pop(file_store *fs)
{
    uint8_t *b = fs->bounce;
    if (b) memcpy(&fs->bounce, b, sizeof fs->bounce);
    return b;
}

static uint8_t *
bounce_take(file_store *fs)
{
    pthread_mutex_lock(&fs->mu);
    uint8_t *b = bounce_pop(fs);
    pthread_mutex_unlock(&fs->mu);
    return b ? b : aligned_alloc(ZB_STORE_DIRECT_ALIGN, DIRECT_BOUNCE);
}

static void
bounce_give(file_store *fs, uint8_t *b)
{
    pthread_mutex_lock(&fs->mu);
    memcpy(b, &fs->bounce, sizeof fs->bounce);
    fs->bounce = b;
    pthread_mutex_unlock(&fs->mu);
}

/* Writes the object's whole blocks directly (fd has O_DIRECT) and the rest buffered; 0 or an
 * errno (EINVAL: the file system refused the direct writes). */
static int
write_direct(file_store *fs, int fd, const uint8_t *data, uint64_t length)
{
    uint64_t blocks = length - length % ZB_STORE_DIRECT_ALIGN;
    int e = 0;
    if ((uintptr_t)data % ZB_STORE_DIRECT_ALIGN == 0) {
        e = write_at(fd, data, blocks, 0);
    } else {
        uint8_t *b = bounce_take(fs);
        if (!b) return ENOMEM;
        for (uint64_t off = 0; off < blocks && !e; off += DIRECT_BOUNCE) {
            size_t n = blocks - off < DIRECT_BOUNCE ? (size_t)(blocks - off) : DIRECT_BOUNCE;
            memcpy(b, data + off, n);
            e = write_at(fd, b, n, off);
        }
        bounce_give(fs, b);
    }
    if (e || blocks == length) return e;
    if ((e = direct_off(fd)) != 0) return e;
    return write_at(fd, data + blocks, length - blocks, blocks);
}

/* Writes the object into the new file `fd`: directly where the store may, else (and where the
 * file system refuses direct writes) buffered. 0 or an errno. */
static int
write_object(file_store *fs, int fd, const uint8_t *data, uint64_t length)
{
    if (length >= ZB_STORE_DIRECT_MIN_BYTES && direct_on(fs, fd)) {
        int e = write_direct(fs, fd, data, length);
        if (e != EINVAL) return e;
        /* refused at the first write (or needing other alignment): start again buffered */
        atomic_store(&fs->direct, false);
        if ((e = direct_off(fd)) != 0) return e;
        if (ftruncate(fd, 0) != 0) return errno;
    }
    return write_at(fd, data, length, 0);
}

static zb_status
file_put(void *self, const char *key, const void *data, uint64_t length)
{
    file_store *fs = self;
    fmap_forget(fs, key);
    ZB_TRY(make_parents(fs, key));
    static _Atomic unsigned long counter;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.zbtmp.%ld.%lu", key, (long)getpid(), ++counter);
    int fd = open_beneath(fs, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0 && errno == EXDEV) return outside_root(fs, key);
    if (fd < 0) return errno_status(errno, fs->root, tmp, "create");
    int e = write_object(fs, fd, data, length);
    if (e) {
        close(fd);
        unlinkat(fs->rootfd, tmp, 0);
        return errno_status(e, fs->root, key, "write");
    }
    if (close(fd) != 0) {
        e = errno;
        unlinkat(fs->rootfd, tmp, 0);
        return errno_status(e, fs->root, key, "close");
    }
    if (renameat(fs->rootfd, tmp, fs->rootfd, key) != 0) {
        e = errno;
        unlinkat(fs->rootfd, tmp, 0);
        return errno_status(e, fs->root, key, "rename");
    }
    fmap_forget(fs, key); /* a view taken while this put ran saw the old file */
    return ZB_OK;
}

static zb_status
file_erase(void *self, const char *key)
{
    file_store *fs = self;
    ZB_TRY(check_parent(fs, key));
    fmap_forget(fs, key);
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
    ZB_TRY(check_parent(fs, from));
    ZB_TRY(make_parents(fs, to));
    if (renameat(fs->rootfd, from, fs->rootfd, to) != 0)
        return errno_status(errno, fs->root, from, "rename");
    fmap_forget(fs, from);
    fmap_forget(fs, to);
    return ZB_OK;
}

static void
file_close(void *self)
{
    file_store *fs = self;
    if (!fs) return;
    /* views still out at close are the caller's bug; their mappings go with the store */
    for (size_t h = 0; h < FMAP_BUCKETS; h++)
        for (fmap *m = fs->maps[h], *n; m; m = n) {
            n = m->next;
            fmap_free(m);
        }
    for (uint8_t *b; (b = bounce_pop(fs));) free(b);
    pthread_mutex_destroy(&fs->mu);
    close(fs->rootfd);
    free(fs->root);
    free(fs->real_root);
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
    .view = file_view,
    .release = file_release,
};

zb_status
zb_store_open_file(const char *root, zb_store **out)
{
    return zb_store_open_file_opts(root, NULL, out);
}

zb_status
zb_store_open_file_opts(const char *root, const zb_store_opts *opts, zb_store **out)
{
    static const zb_store_opts defaults = ZB_STORE_OPTS_DEFAULT;
    if (!opts) opts = &defaults;
    if (!out) return zb__err(ZB_E_INVALID, "zb_store_open_file: null out");
    *out = NULL;
    if (!root || !*root) return zb__err(ZB_E_INVALID, "zb_store_open_file: empty path");
    int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT) return zb__err(ZB_E_NOTFOUND, "%s: no such directory", root);
        if (e == ENOTDIR) return zb__err(ZB_E_NOTFOUND, "%s: not a directory", root);
        return zb__err(ZB_E_IO, "%s: %s", root, strerror(e));
    }
    file_store *fs = calloc(1, sizeof *fs);
    char *r = strdup(root);
    char *real = realpath(root, NULL);
    if (!fs || !r || !real) {
        free(fs);
        free(r);
        free(real);
        close(fd);
        return zb__err(ZB_E_NOMEM, "zb_store_open_file: out of memory");
    }
    size_t n = strlen(r);
    while (n > 1 && r[n - 1] == '/') r[--n] = '\0';
    fs->rootfd = fd;
    fs->root = r;
    fs->real_root = real;
    fs->allow_links_outside = opts->allow_links_outside;
    pthread_mutex_init(&fs->mu, NULL);
    fs->map_budget = opts->mmap_bytes;
    atomic_store(&fs->direct, opts->direct_io);
    zb_status st = zb_store_new(&file_methods, fs, out);
    if (st != ZB_OK)
        file_close(fs);
    else
        (*out)->name = fs->root;
    return st;
}
