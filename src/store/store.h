/* The store handle (internal view). */
#ifndef ZB_STORE_STORE_H
#define ZB_STORE_STORE_H

#include "zbatch.h"

struct zb_store {
    const zb_store_methods *m;
    void *self;
    const char *name;  /* zb_store_name: set by a backend that has one (borrowed from self) */
    char fallback[24]; /* "SCHEME://" for the others */
};

#endif
