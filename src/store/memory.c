/* The memory backend: keys and bytes in a table guarded by a mutex. Meant for tests, fixtures
 * built in memory, and small scratch stores; lookups are linear. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "util/status.h"

typedef struct mem_entry {
    char *key;
    uint8_t *data;
    uint64_t len;
} mem_entry;

typedef struct mem_store {
    pthread_mutex_t mu;
    mem_entry *entries;
    size_t n, cap;
} mem_store;

static mem_entry *
find(mem_store *ms, const char *key)
{
    for (size_t i = 0; i < ms->n; i++)
        if (!strcmp(ms->entries[i].key, key)) return &ms->entries[i];
    return NULL;
}

static zb_status
mem_get(void *self, const char *key, uint64_t offset, uint64_t length, void *dst, uint64_t *nread)
{
    mem_store *ms = self;
    zb_status st = ZB_OK;
    pthread_mutex_lock(&ms->mu);
    mem_entry *e = find(ms, key);
    if (!e) {
        st = zb__err(ZB_E_NOTFOUND, "memory:%s: not found", key);
    } else {
        uint64_t n = offset >= e->len ? 0 : e->len - offset;
        if (n > length) n = length;
        if (n) memcpy(dst, e->data + offset, (size_t)n);
        *nread = n;
    }
    pthread_mutex_unlock(&ms->mu);
    return st;
}

static zb_status
mem_size(void *self, const char *key, uint64_t *size)
{
    mem_store *ms = self;
    zb_status st = ZB_OK;
    pthread_mutex_lock(&ms->mu);
    mem_entry *e = find(ms, key);
    if (!e)
        st = zb__err(ZB_E_NOTFOUND, "memory:%s: not found", key);
    else
        *size = e->len;
    pthread_mutex_unlock(&ms->mu);
    return st;
}

/* Lists the distinct first segments below `prefix`. Names are collected first and reported
 * after the lock is released, so the callback may call back into the store. */
static zb_status
mem_list(void *self, const char *prefix, zb_list_fn fn, void *ctx)
{
    mem_store *ms = self;
    size_t plen = strlen(prefix);
    char **names = NULL;
    bool *dirs = NULL;
    size_t nn = 0;
    zb_status st = ZB_OK;
    pthread_mutex_lock(&ms->mu);
    names = calloc(ms->n ? ms->n : 1, sizeof *names);
    dirs = calloc(ms->n ? ms->n : 1, sizeof *dirs);
    if (!names || !dirs) {
        st = zb__err(ZB_E_NOMEM, "memory list: out of memory");
        goto unlock;
    }
    for (size_t i = 0; i < ms->n; i++) {
        const char *k = ms->entries[i].key;
        if (plen) {
            if (strncmp(k, prefix, plen) || k[plen] != '/') continue;
            k += plen + 1;
        }
        const char *slash = strchr(k, '/');
        size_t len = slash ? (size_t)(slash - k) : strlen(k);
        size_t j;
        for (j = 0; j < nn; j++)
            if (strlen(names[j]) == len && !strncmp(names[j], k, len)) break;
        if (j < nn) {
            dirs[j] = dirs[j] || slash;
            continue;
        }
        names[nn] = strndup(k, len);
        if (!names[nn]) {
            st = zb__err(ZB_E_NOMEM, "memory list: out of memory");
            goto unlock;
        }
        dirs[nn++] = slash != NULL;
    }
unlock:
    pthread_mutex_unlock(&ms->mu);
    bool stopped = false;
    for (size_t j = 0; j < nn; j++) {
        if (st == ZB_OK && !stopped) stopped = fn(ctx, names[j], dirs[j]) != 0;
        free(names[j]);
    }
    free(names);
    free(dirs);
    return st;
}

static zb_status
mem_put(void *self, const char *key, const void *data, uint64_t length)
{
    mem_store *ms = self;
    uint8_t *copy = malloc(length ? (size_t)length : 1);
    if (!copy) return zb__err(ZB_E_NOMEM, "memory:%s: out of memory", key);
    if (length) memcpy(copy, data, (size_t)length);
    zb_status st = ZB_OK;
    pthread_mutex_lock(&ms->mu);
    mem_entry *e = find(ms, key);
    if (e) {
        free(e->data);
        e->data = copy;
        e->len = length;
        goto unlock;
    }
    if (ms->n == ms->cap) {
        size_t cap = ms->cap ? ms->cap * 2 : 16;
        mem_entry *ne = realloc(ms->entries, cap * sizeof *ne);
        if (!ne) {
            free(copy);
            st = zb__err(ZB_E_NOMEM, "memory:%s: out of memory", key);
            goto unlock;
        }
        ms->entries = ne;
        ms->cap = cap;
    }
    char *k = strdup(key);
    if (!k) {
        free(copy);
        st = zb__err(ZB_E_NOMEM, "memory:%s: out of memory", key);
        goto unlock;
    }
    ms->entries[ms->n++] = (mem_entry){k, copy, length};
unlock:
    pthread_mutex_unlock(&ms->mu);
    return st;
}

static zb_status
mem_erase(void *self, const char *key)
{
    mem_store *ms = self;
    pthread_mutex_lock(&ms->mu);
    mem_entry *e = find(ms, key);
    if (e) {
        free(e->key);
        free(e->data);
        *e = ms->entries[--ms->n];
    }
    pthread_mutex_unlock(&ms->mu);
    return ZB_OK;
}

static zb_status
mem_rename(void *self, const char *from, const char *to)
{
    mem_store *ms = self;
    zb_status st = ZB_OK;
    char *k = strdup(to);
    if (!k) return zb__err(ZB_E_NOMEM, "memory:%s: out of memory", to);
    pthread_mutex_lock(&ms->mu);
    mem_entry *e = find(ms, from);
    if (!e) {
        free(k);
        st = zb__err(ZB_E_NOTFOUND, "memory:%s: not found", from);
        goto unlock;
    }
    mem_entry *old = find(ms, to);
    if (old && old != e) {
        free(old->key);
        free(old->data);
        *old = ms->entries[--ms->n];
        if (e == &ms->entries[ms->n]) e = old; /* the moved entry was `from` */
    }
    free(e->key);
    e->key = k;
unlock:
    pthread_mutex_unlock(&ms->mu);
    return st;
}

static void
mem_close(void *self)
{
    mem_store *ms = self;
    if (!ms) return;
    for (size_t i = 0; i < ms->n; i++) {
        free(ms->entries[i].key);
        free(ms->entries[i].data);
    }
    free(ms->entries);
    pthread_mutex_destroy(&ms->mu);
    free(ms);
}

static const zb_store_methods memory_methods = {
    .scheme = "memory",
    .get = mem_get,
    .size = mem_size,
    .list = mem_list,
    .put = mem_put,
    .erase = mem_erase,
    .rename = mem_rename,
    .close = mem_close,
};

zb_status
zb_store_open_memory(zb_store **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_store_open_memory: null out");
    *out = NULL;
    mem_store *ms = calloc(1, sizeof *ms);
    if (!ms) return zb__err(ZB_E_NOMEM, "zb_store_open_memory: out of memory");
    pthread_mutex_init(&ms->mu, NULL);
    zb_status st = zb_store_new(&memory_methods, ms, out);
    if (st != ZB_OK) mem_close(ms);
    return st;
}
