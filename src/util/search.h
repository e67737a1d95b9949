/* Binary search over ascending offsets: the one search the samplers and the dataset layer use
 * to find which block, window, child or mask block holds a position. */
#ifndef ZB_UTIL_SEARCH_H
#define ZB_UTIL_SEARCH_H

#include <stddef.h>
#include <stdint.h>

/* The largest i < n with a[i] <= x, for a ascending (ties: the last) and a[0] <= x; 0 when
 * n <= 1. With a the starts of n consecutive blocks, the block holding x. */
static inline size_t
zb__last_le(const uint64_t *a, size_t n, uint64_t x)
{
    size_t lo = 0, hi = n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (a[mid] <= x)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

#endif
