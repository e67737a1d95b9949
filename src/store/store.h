/* The store handle (internal view). */
#ifndef ZB_STORE_STORE_H
#define ZB_STORE_STORE_H

#include <stdbool.h>

#include "zbatch.h"

struct zb_store {
    const zb_store_methods *m;
    void *self;
    const char *name;  /* zb_store_name: set by a backend that has one (borrowed from self) */
    char fallback[24]; /* "SCHEME://" for the others */
};

/* Whether the store reads whole lists of ranges itself (a remote backend: get_ranges). */
static inline bool
zb__store_lists_ranges(const zb_store *s)
{
    return s->m->get_ranges != NULL;
}

#endif
