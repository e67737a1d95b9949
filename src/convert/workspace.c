/* Workspaces of the conversion's tasks (convert_int.h, cv_ws): buffers that outlive a task, so
 * the next task on the same handle writes into memory it already touched. A fresh buffer costs
 * a page fault per 4 KiB on first use, and a scatter task freeing and re-allocating its slices
 * spent much of a conversion's system time faulting on a VM where faults are slow
 * (docs/PERFORMANCE.md, "Figures behind the code's decisions"). Workspaces are kept on the
 * handle and freed with it. */
#include <stdlib.h>
#include <string.h>

#include "convert/convert_int.h"
#include "util/status.h"

zb_status
cv_ws_take(zb_convert *cv, cv_ws **out)
{
    pthread_mutex_lock(&cv->lock);
    cv_ws *ws = cv->ws_free;
    if (ws) cv->ws_free = ws->next;
    pthread_mutex_unlock(&cv->lock);
    if (!ws && !(ws = calloc(1, sizeof *ws))) return zb__err(ZB_E_NOMEM, "a task's workspace");
    ws->next = NULL;
    if (!ws->ctx) {
        zb_status st = zb_ctx_new(&ws->ctx);
        if (st != ZB_OK) {
            cv_ws_give(cv, ws);
            return st;
        }
    }
    *out = ws;
    return ZB_OK;
}

void
cv_ws_give(zb_convert *cv, cv_ws *ws)
{
    if (!ws) return;
    pthread_mutex_lock(&cv->lock);
    ws->next = cv->ws_free;
    cv->ws_free = ws;
    pthread_mutex_unlock(&cv->lock);
}

zb_status
cv_ws_grow(cv_ws *ws, size_t slot, size_t bytes, void **out)
{
    if (bytes > ws->cap[slot] || !ws->slot[slot]) {
        size_t cap = ws->cap[slot] ? ws->cap[slot] : 4096;
        while (cap < bytes) cap = cap / 2 * 3 + 4096; /* x1.5: less slack than doubling */
        void *p = realloc(ws->slot[slot], cap);
        if (!p) return zb__err(ZB_E_NOMEM, "a task's workspace: %zu bytes", cap);
        ws->slot[slot] = p;
        ws->cap[slot] = cap;
    }
    *out = ws->slot[slot];
    return ZB_OK;
}

zb_status
cv_ws_blocks(cv_ws *ws, size_t n_mats, size_t n_cols)
{
    if (n_mats > ws->n_mats) {
        zb__csr_block *m = realloc(ws->mats, n_mats * sizeof *m);
        if (!m) return zb__err(ZB_E_NOMEM, "a task's workspace");
        memset(m + ws->n_mats, 0, (n_mats - ws->n_mats) * sizeof *m);
        ws->mats = m;
        ws->n_mats = n_mats;
    }
    if (n_cols > ws->n_cols) {
        zb__col_block *c = realloc(ws->cols, n_cols * sizeof *c);
        if (!c) return zb__err(ZB_E_NOMEM, "a task's workspace");
        memset(c + ws->n_cols, 0, (n_cols - ws->n_cols) * sizeof *c);
        ws->cols = c;
        ws->n_cols = n_cols;
    }
    return ZB_OK;
}

void
cv_ws_free_all(zb_convert *cv)
{
    cv_ws *ws = cv->ws_free;
    while (ws) {
        cv_ws *next = ws->next;
        for (size_t i = 0; i < CV_WS_SLOTS; i++) free(ws->slot[i]);
        for (size_t j = 0; j < ws->n_mats; j++) zb__csr_block_free(&ws->mats[j]);
        for (size_t c = 0; c < ws->n_cols; c++) zb__col_block_free(&ws->cols[c]);
        free(ws->mats);
        free(ws->cols);
        zb_ctx_free(ws->ctx);
        zb__buf_free(&ws->piece);
        zb__buf_free(&ws->blob);
        free(ws);
        ws = next;
    }
    cv->ws_free = NULL;
}
