/* The store handle (internal view). */
#ifndef ZB_STORE_STORE_H
#define ZB_STORE_STORE_H

#include "zbatch.h"

struct zb_store {
    const zb_store_methods *m;
    void *self;
};

#endif
