/* The pipelined loader (DESIGN.md §3): a worker thread draws windows of batches from the
 * sampler, reads each window with one coalesced read_many, cuts it into batch views, runs the
 * transforms, and queues the window; the consumer takes batches strictly in order. At most
 * `depth` windows are read ahead (queued or being read), so the loader's own memory is bounded
 * by the options; a window's memory is freed when the consumer has released all its batches
 * (batch views hold a reference to their window's buffers). With more_epochs the workers read
 * on into the next epochs; a window that opens one carries epoch_start, and the consumer
 * reports the epoch end (one NULL) before handing out its batches. With a device stage
 * (device.c) windows are read into its page-locked pool, and with placement DEVICE the
 * worker issues each batch's copies to the device right after its transforms. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/batch.h"
#include "dataset/validate.h"
#include "loader/device.h"
#include "util/status.h"
#include "zbatch_loader.h"

typedef struct window {
    zb_batch *whole; /* the read_many result; released when every view is */
    size_t nbatches;
    zb_batch **views;         /* [nbatches], handed out in order */
    zb_device_batch **dviews; /* [nbatches] with placement DEVICE (views then NULL) */
    zb_sampler_state *after;  /* sampler state after each batch */
    size_t next;              /* next view to hand out */
    zb_status st;             /* a failed window carries only its error */
    char msg[1024];
    bool end;         /* the epoch ended before this window */
    bool epoch_start; /* an epoch ended before this window, which begins the next */
    uint64_t seq;     /* order in which windows were drawn from the sampler */
    struct window *qnext;
} window;

#define MAX_WORKERS 2

struct zb_loader {
    zb_dataset *ds;
    zb_sampler *sampler;
    zb_loader_opts opts;
    zb_transform *transforms;
    size_t max_batch;
    pthread_t workers[MAX_WORKERS];
    int nworkers;
    pthread_mutex_t sample_mu; /* the sampler and the draw counter */
    uint64_t next_draw;        /* seq of the next window drawn */
    size_t epochs_left;        /* epochs still to be read past the current one (more_epochs) */
    uint64_t next_take;        /* seq the consumer takes next */
    bool ended;                /* a worker met the end of the epoch or an error */
    pthread_mutex_t mu;
    pthread_cond_t cv_ready; /* a window was queued */
    pthread_cond_t cv_room;  /* a window slot was freed */
    bool stop;
    size_t live;            /* windows being read or queued, not yet taken by the consumer */
    window *head, *tail;    /* queued windows, in order */
    window *cur;            /* the window batches are being handed out from */
    zb_sampler_state state; /* after the last batch handed out */
    bool finished;
    window oom;             /* the error window used when a window cannot be allocated */
    zb__devq *devq;         /* the device stage (NULL: host memory) */
    zb_placement placement; /* what the loader does, after a fallback */
    char *fallback;         /* why it fell back to host memory, else NULL */
};

static void
window_free(zb_loader *ld, window *w)
{
    if (!w || w == &ld->oom) return;
    for (size_t i = w->next; i < w->nbatches; i++) {
        zb_batch_free(w->views[i]);
        zb_device_batch_release(w->dviews ? w->dviews[i] : NULL);
    }
    free(w->views);
    free(w->dviews);
    free(w->after);
    free(w);
}

/* Reads one window. Returns NULL only when out of memory; a window with st != OK carries an
 * error; end is set when the sampler had no batch left. */
static window *
read_window(zb_loader *ld)
{
    window *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    size_t P = ld->opts.prefetch_factor, cap = ld->max_batch;
    uint64_t *ids = malloc((P * cap + 1) * sizeof *ids);
    size_t *sizes = malloc((P + 1) * sizeof *sizes);
    w->after = calloc(P + 1, sizeof *w->after);
    w->views = calloc(P + 1, sizeof *w->views);
    if (ld->placement == ZB_PLACE_DEVICE) w->dviews = calloc(P + 1, sizeof *w->dviews);
    if (!ids || !sizes || !w->after || !w->views ||
        (ld->placement == ZB_PLACE_DEVICE && !w->dviews)) {
        w->st = zb__err(ZB_E_NOMEM, "loader: out of memory for a window");
        goto out;
    }
    size_t total = 0;
    /* Drawing is serial (one sampler) and fixes the window's place in the output; reading is
     * not: two workers overlap one window's planning with the other's decoding. */
    pthread_mutex_lock(&ld->sample_mu);
    w->seq = ld->next_draw++;
    while (w->nbatches < P) {
        size_t n = 0;
        w->st = zb_sampler_next(ld->sampler, ids + total, cap, &n);
        if (w->st != ZB_OK) break;
        if (n == 0) {
            /* the epoch ended; if it did with the window before, this one opens the next (a
             * window never spans two epochs, so the consumer sees the boundary between
             * windows) */
            if (w->nbatches || w->epoch_start || ld->epochs_left == 0) break;
            zb_sampler_state ss;
            zb_sampler_get_state(ld->sampler, &ss);
            w->st =
                zb_sampler_set_epoch(ld->sampler, ld->opts.same_epoch ? ss.epoch : ss.epoch + 1);
            if (w->st != ZB_OK) break;
            if (ld->epochs_left != SIZE_MAX) ld->epochs_left--;
            w->epoch_start = true;
            continue;
        }
        sizes[w->nbatches] = n;
        zb_sampler_get_state(ld->sampler, &w->after[w->nbatches]);
        w->nbatches++;
        total += n;
    }
    pthread_mutex_unlock(&ld->sample_mu);
    if (w->st != ZB_OK) goto out;
    if (w->nbatches == 0) {
        w->end = true;
        goto out;
    }
    /* sizes become the batches' sizes less any samples skipped as invalid; a device loader's
     * windows live in its page-locked pool */
    w->st = zb__dataset_read_window(ld->ds, zb__devq_pool(ld->devq), ids, total, sizes, w->nbatches,
                                    &w->whole);
    if (w->st != ZB_OK) goto out;
    size_t b0 = 0;
    for (size_t k = 0; k < w->nbatches; k++) {
        w->st = zb__batch_slice(w->whole, b0, b0 + sizes[k], &w->views[k]);
        if (w->st != ZB_OK) goto out;
        b0 += sizes[k];
        for (size_t t = 0; t < ld->opts.ntransforms; t++) {
            w->st = zb__transform_apply(&ld->transforms[t], w->views[k]);
            if (w->st != ZB_OK) goto out;
        }
        if (w->dviews) {
            zb_batch *v = w->views[k];
            w->views[k] = NULL;
            w->st = zb__devq_deliver(ld->devq, v, w->seq * P + k, &w->dviews[k]);
            if (w->st != ZB_OK) goto out;
        }
    }
    /* the views hold the window's buffers now */
    zb_batch_free(w->whole);
    w->whole = NULL;
out:
    if (w->st != ZB_OK) {
        snprintf(w->msg, sizeof w->msg, "%s", zb_last_error());
        for (size_t k = 0; k < w->nbatches; k++) {
            zb_batch_free(w->views[k]);
            w->views[k] = NULL;
            if (w->dviews) {
                zb_device_batch_release(w->dviews[k]);
                w->dviews[k] = NULL;
            }
        }
        zb_batch_free(w->whole);
        w->whole = NULL;
        w->nbatches = 0;
    }
    free(ids);
    free(sizes);
    return w;
}

static void *
worker_main(void *arg)
{
    zb_loader *ld = arg;
    for (;;) {
        pthread_mutex_lock(&ld->mu);
        while (!ld->stop && !ld->ended && ld->live >= ld->opts.depth)
            pthread_cond_wait(&ld->cv_room, &ld->mu);
        if (ld->stop || ld->ended) {
            pthread_mutex_unlock(&ld->mu);
            return NULL;
        }
        ld->live++;
        pthread_mutex_unlock(&ld->mu);

        window *w = read_window(ld);
        if (!w) {
            /* no memory even for the window: hand the consumer the loader's own error window
             * (it takes it whatever its place: an error ends the epoch) */
            pthread_mutex_lock(&ld->sample_mu);
            w = &ld->oom;
            w->seq = ld->next_draw++;
            pthread_mutex_unlock(&ld->sample_mu);
            w->st = ZB_E_NOMEM;
            snprintf(w->msg, sizeof w->msg, "loader: out of memory for a window");
        }
        bool last = w->end || w->st != ZB_OK;
        pthread_mutex_lock(&ld->mu);
        /* queued in seq order */
        window **pp = &ld->head;
        while (*pp && (*pp)->seq < w->seq) pp = &(*pp)->qnext;
        w->qnext = *pp;
        *pp = w;
        if (!w->qnext) ld->tail = w;
        if (last) {
            ld->ended = true;
            pthread_cond_broadcast(&ld->cv_room);
        }
        pthread_cond_broadcast(&ld->cv_ready);
        pthread_mutex_unlock(&ld->mu);
        if (last) return NULL;
    }
}

zb_status
zb_loader_open(zb_dataset *ds, zb_sampler *sampler, const zb_loader_opts *opts, zb_loader **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_loader_open: null out");
    *out = NULL;
    if (!ds || !sampler) return zb__err(ZB_E_INVALID, "zb_loader_open: null dataset or sampler");
    zb_loader_opts o = ZB_LOADER_OPTS_DEFAULT;
    if (opts) o = *opts;
    if (o.prefetch_factor == 0 || o.depth == 0)
        return zb__err(ZB_E_INVALID, "zb_loader_open: prefetch_factor and depth must be >= 1");
    zb_loader *ld = calloc(1, sizeof *ld);
    if (!ld) return zb__err(ZB_E_NOMEM, "zb_loader_open: out of memory");
    ld->ds = ds;
    ld->sampler = sampler;
    ld->opts = o;
    ld->max_batch = zb_sampler_max_batch(sampler);
    if (ld->max_batch == 0) ld->max_batch = 1;
    /* a window's id list is allocated per window: bound it before any allocation */
    if (o.prefetch_factor > ZB_LOADER_MAX_WINDOW / ld->max_batch) {
        size_t mb = ld->max_batch;
        free(ld);
        return zb__err(ZB_E_INVALID,
                       "zb_loader_open: prefetch_factor %zu x batch size %zu is "
                       "more than the %llu samples a window may hold",
                       o.prefetch_factor, mb, (unsigned long long)ZB_LOADER_MAX_WINDOW);
    }
    if (o.ntransforms) {
        ld->transforms = malloc(o.ntransforms * sizeof *ld->transforms);
        if (!ld->transforms) {
            free(ld);
            return zb__err(ZB_E_NOMEM, "zb_loader_open: out of memory");
        }
        memcpy(ld->transforms, o.transforms, o.ntransforms * sizeof *ld->transforms);
    }
    ld->opts.transforms = ld->transforms;
    ld->placement = o.placement;
    if (o.placement != ZB_PLACE_HOST) {
        zb_status st =
            o.placement == ZB_PLACE_PINNED || o.placement == ZB_PLACE_DEVICE
                ? zb__devq_open(&o, &ld->devq)
                : zb__err(ZB_E_INVALID, "zb_loader_open: unknown placement %d", (int)o.placement);
        if (st != ZB_OK && (o.require_placement || st == ZB_E_INVALID)) {
            free(ld->transforms);
            free(ld);
            return st;
        }
        if (st != ZB_OK) {
            /* the documented fallback: host memory, and the reason kept for the caller */
            ld->placement = ZB_PLACE_HOST;
            ld->fallback = strdup(zb_last_error());
        }
    }
    ld->epochs_left = o.more_epochs;
    zb_sampler_get_state(sampler, &ld->state);
    pthread_mutex_init(&ld->mu, NULL);
    pthread_mutex_init(&ld->sample_mu, NULL);
    pthread_cond_init(&ld->cv_ready, NULL);
    pthread_cond_init(&ld->cv_room, NULL);
    int want = o.depth >= 2 ? MAX_WORKERS : 1;
    for (int i = 0; i < want; i++) {
        if (pthread_create(&ld->workers[i], NULL, worker_main, ld) != 0) {
            zb_loader_close(ld);
            return zb__err(ZB_E_IO, "zb_loader_open: cannot start a worker thread");
        }
        ld->nworkers++;
    }
    *out = ld;
    return ZB_OK;
}

/* The next batch in order: *view (host loaders) or *dview (DEVICE), both NULL at an end. */
static zb_status
take_next(zb_loader *ld, zb_batch **view, zb_device_batch **dview)
{
    if (ld->finished) return ZB_OK;
    for (;;) {
        window *w = ld->cur;
        if (w && w->epoch_start) {
            /* the end of the epoch before this window */
            w->epoch_start = false;
            return ZB_OK;
        }
        if (w && (w->st != ZB_OK || w->end)) {
            zb_status st = w->st;
            if (st != ZB_OK) zb__err(st, "%s", w->msg);
            ld->cur = NULL;
            window_free(ld, w);
            ld->finished = true;
            return st;
        }
        if (w && w->next < w->nbatches) {
            *view = w->views[w->next];
            w->views[w->next] = NULL;
            if (w->dviews) {
                *dview = w->dviews[w->next];
                w->dviews[w->next] = NULL;
            }
            ld->state = w->after[w->next++];
            return ZB_OK;
        }
        if (w) {
            ld->cur = NULL;
            window_free(ld, w);
        }
        pthread_mutex_lock(&ld->mu);
        /* the next window in draw order; an error window ends the epoch wherever it stands */
        while (!ld->head || (ld->head->seq != ld->next_take && ld->head->st == ZB_OK))
            pthread_cond_wait(&ld->cv_ready, &ld->mu);
        w = ld->head;
        ld->next_take = w->seq + 1;
        ld->head = w->qnext;
        if (!ld->head) ld->tail = NULL;
        ld->live--;
        pthread_cond_signal(&ld->cv_room);
        pthread_mutex_unlock(&ld->mu);
        ld->cur = w;
    }
}

zb_status
zb_loader_next(zb_loader *ld, zb_batch **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_loader_next: null out");
    *out = NULL;
    if (!ld) return zb__err(ZB_E_INVALID, "zb_loader_next: null loader");
    if (ld->placement == ZB_PLACE_DEVICE)
        return zb__err(ZB_E_INVALID, "zb_loader_next: this loader delivers batches to the "
                                     "device: take them with zb_loader_next_device");
    zb_device_batch *unused = NULL;
    return take_next(ld, out, &unused);
}

zb_status
zb_loader_next_device(zb_loader *ld, zb_device_batch **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_loader_next_device: null out");
    *out = NULL;
    if (!ld) return zb__err(ZB_E_INVALID, "zb_loader_next_device: null loader");
    zb__devq_poll(ld->devq);
    zb_batch *view = NULL;
    ZB_TRY(take_next(ld, &view, out));
    if (*out || !view) return ZB_OK;                 /* a device batch, or the end of an epoch */
    return zb__devq_deliver(ld->devq, view, 0, out); /* host placements: no copies */
}

zb_placement
zb_loader_placement(const zb_loader *ld, const char **why)
{
    if (why) *why = ld ? ld->fallback : NULL;
    return ld ? ld->placement : ZB_PLACE_HOST;
}

void
zb_loader_device_stats(const zb_loader *ld, zb_device_stats *stats)
{
    if (!stats) return;
    zb__devq_stats(ld ? ld->devq : NULL, stats);
}

void
zb_loader_state(const zb_loader *ld, zb_sampler_state *state)
{
    if (ld && state) *state = ld->state;
}

void
zb_loader_close(zb_loader *ld)
{
    if (!ld) return;
    pthread_mutex_lock(&ld->mu);
    ld->stop = true;
    pthread_cond_broadcast(&ld->cv_room);
    pthread_mutex_unlock(&ld->mu);
    for (int i = 0; i < ld->nworkers; i++) pthread_join(ld->workers[i], NULL);
    window_free(ld, ld->cur);
    window *w = ld->head;
    while (w) {
        window *n = w->qnext;
        window_free(ld, w);
        w = n;
    }
    /* batches still held by the consumer keep their window's buffers alive on their own (and
     * device batches the device stage) */
    zb__devq_unref(ld->devq);
    free(ld->fallback);
    free(ld->transforms);
    pthread_cond_destroy(&ld->cv_ready);
    pthread_cond_destroy(&ld->cv_room);
    pthread_mutex_destroy(&ld->mu);
    pthread_mutex_destroy(&ld->sample_mu);
    free(ld);
}
